"""What every resource stand-in shares: its generated schema, and plans that pass the proposal on."""

from __future__ import annotations

from tests.world.provider.instance_body import effective_labels
from tests.world.provider.schema import JsonSchema, resource_block
from tf.types import Unknown


def labels_plan(planned: dict, prior: dict | None) -> dict:
    """terraform_labels and effective_labels as the provider plans them for a resource with
    labels (tpgresource/labels.go SetLabelsDiff, in every labelled resource's CustomizeDiff):
    the attribution label at creation, kept after; effective_labels also keeps what Google
    added, less what terraform_labels dropped."""
    labels = planned.get("labels")
    if labels is Unknown:
        return {"terraform_labels": Unknown, "effective_labels": Unknown}
    prior_effective = dict((prior or {}).get("effective_labels") or {})
    terraform_labels = effective_labels(labels, prior_effective, creating=prior is None)
    dropped = set((prior or {}).get("terraform_labels") or {}) - set(terraform_labels)
    return {"terraform_labels": terraform_labels,
            "effective_labels": {**{k: v for k, v in prior_effective.items() if k not in dropped}, **terraform_labels}}


def labels_read(state: dict, found: dict) -> dict:
    """Labels as the provider reads them back (tpgresource/labels.go SetLabels): labels and
    terraform_labels only the keys they held, effective_labels all of the resource's."""
    def held(name):
        return None if state.get(name) is None else {k: found.get(k) for k in state[name]}
    return {"labels": held("labels"), "terraform_labels": held("terraform_labels"), "effective_labels": dict(found)}


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

    def create_request(self, planned: dict) -> tuple[str, str, dict | None]:
        """(method, URL, body) of the call that creates the resource, built from ``planned``
        alone; tests/test_provider_standins.py checks that every argument terraform/ sets
        changes it. None for a resource that calls no API."""
        return None

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
