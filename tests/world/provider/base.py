"""What every resource stand-in shares: its generated schema, and plans that pass the proposal on."""

from __future__ import annotations

from tests.world.provider.schema import JsonSchema, resource_block


class Resource:
    # The provider that serves it ("google" or "random") and the full resource type name.
    provider_name = "google"
    type_name = ""
    # Attributes whose change replaces the resource: top-level names, or (block, attribute)
    # pairs; each resource cites the provider source that marks them ForceNew.
    forces_new: tuple = ()

    def __init__(self, provider):
        self.provider = provider

    @classmethod
    def get_name(cls) -> str:
        return cls.type_name.split("_", 1)[1]

    @classmethod
    def block(cls) -> dict:
        return resource_block(cls.provider_name, cls.type_name)

    @classmethod
    def get_schema(cls) -> JsonSchema:
        return JsonSchema({"version": 0, "block": cls.block()})

    def validate(self, diags, type_name, config) -> None:
        pass

    def plan_create(self, planned: dict) -> dict:
        return planned

    def plan_update(self, prior: dict, proposed: dict, replacing: bool) -> dict:
        return proposed

    def read(self, state: dict) -> dict | None:
        return state

    def update(self, prior: dict, planned: dict) -> dict:
        return planned

    def import_(self, import_id: str) -> dict:
        from tests.world.provider.servicer import ProviderFailure

        raise ProviderFailure(f"{self.type_name} does not support import in the stand-in")


class Provider:
    """What `tf`'s runner asks of a provider; subclasses name the resources."""

    name = ""
    resources: list = []

    def __init__(self):
        self.config: dict = {}

    def get_model_prefix(self) -> str:
        return f"{self.name}_"

    def full_name(self) -> str:
        return f"registry.terraform.io/hashicorp/{self.name}"

    def get_provider_schema(self, diags) -> JsonSchema:
        from tests.world.provider.schema import provider_json

        return JsonSchema(provider_json(self.name)["provider"])

    def validate_config(self, diags, config) -> None:
        pass

    def configure_provider(self, diags, config) -> None:
        self.config = dict(config or {})

    def get_data_sources(self) -> list:
        return []

    def get_resources(self) -> list:
        return self.resources

    def get_functions(self) -> list:
        return []

    def new_resource(self, klass):
        return klass(self)

    def new_data_source(self, klass):
        return klass(self)
