"""Provider schemas generated from the committed `terraform providers schema -json` files, not retyped.

`tf` 1.2.0 has no list-nested blocks (its NestMode has Set and Single only), while hashicorp/google
declares most blocks as lists and terraform/outputs.tf indexes them
(`network_interface[0].access_config[0].nat_ip`). So the protobuf schema is built here straight from
the JSON, every nesting mode as the JSON says (tfplugin6.proto, Schema.NestedBlock.NestingMode).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from tf.gen import tfplugin_pb2 as pb
from tf.types import Unknown

SCHEMAS = Path(__file__).resolve().parents[2] / "provider_schema"
FILES = {"google": "google-7.46.1.json", "random": "random-3.9.1.json"}
NESTING = {"single": pb.Schema.NestedBlock.NestingMode.SINGLE, "list": pb.Schema.NestedBlock.NestingMode.LIST,
           "set": pb.Schema.NestedBlock.NestingMode.SET, "map": pb.Schema.NestedBlock.NestingMode.MAP,
           "group": pb.Schema.NestedBlock.NestingMode.GROUP}


@lru_cache(maxsize=None)
def provider_json(name: str) -> dict:
    """The provider's section of its committed schema file."""
    document = json.loads((SCHEMAS / FILES[name]).read_text())
    (schema,) = document["provider_schemas"].values()
    return schema


def resource_block(provider: str, type_name: str) -> dict:
    return provider_json(provider)["resource_schemas"][type_name]["block"]


def block_to_pb(block: dict) -> pb.Schema.Block:
    attributes = [pb.Schema.Attribute(
        name=name, type=json.dumps(spec["type"]).encode(), required=spec.get("required", False),
        optional=spec.get("optional", False), computed=spec.get("computed", False),
        sensitive=spec.get("sensitive", False)) for name, spec in sorted(block.get("attributes", {}).items())]
    # Terraform wants no item bounds on a single or group block ("MinItems and MaxItems must
    # match in NestingSingle mode"); the JSON's max_items 1 there comes from the CDK bindings.
    nested = [pb.Schema.NestedBlock(
        type_name=name, block=block_to_pb(spec["block"]), nesting=NESTING[spec["nesting_mode"]],
        min_items=0 if spec["nesting_mode"] in ("single", "group") else spec.get("min_items", 0),
        max_items=0 if spec["nesting_mode"] in ("single", "group") else spec.get("max_items", 0))
        for name, spec in sorted(block.get("block_types", {}).items())]
    return pb.Schema.Block(attributes=attributes, block_types=nested)


def schema_to_pb(schema: dict) -> pb.Schema:
    return pb.Schema(version=schema.get("version", 0), block=block_to_pb(schema["block"]))


class JsonSchema:
    """What `tf`'s servicer asks of a schema object: to_pb(), and no attributes of its own
    (the servicer in servicer.py works on whole objects)."""

    attributes: list = []
    block_types: list = []

    def __init__(self, schema: dict):
        self.schema = schema
        self.version = schema.get("version", 0)

    def to_pb(self) -> pb.Schema:
        return schema_to_pb(self.schema)


def complete(block: dict, value: dict | None) -> dict | None:
    """The object with every attribute and block of ``block`` present (null, or empty for
    list/set blocks): terraform decodes an object only with all of its attributes."""
    if value is None:
        return None
    out = {name: value.get(name) for name in block.get("attributes", {})}
    for name, spec in block.get("block_types", {}).items():
        inner, mode = spec["block"], spec["nesting_mode"]
        given = value.get(name)
        if mode in ("single", "group"):
            out[name] = complete(inner, given) if given not in (None, Unknown) else given
        elif mode == "map":
            out[name] = {k: complete(inner, v) for k, v in (given or {}).items()}
        else:
            out[name] = [complete(inner, v) for v in given] if given not in (None, Unknown) else (
                given if given is Unknown else [])
    return out


def mark_computed_unknown(block: dict, value: dict | None) -> dict | None:
    """A create plan: every computed attribute the configuration left null is unknown until
    apply, nested blocks too (tf 1.2.0 skips this for blocks, so network_ip/nat_ip could not be
    set at apply: "Provider produced inconsistent result after apply")."""
    if value is None:
        return None
    out = dict(value)
    for name, spec in block.get("attributes", {}).items():
        if spec.get("computed") and out.get(name) is None:
            out[name] = Unknown
    for name, spec in block.get("block_types", {}).items():
        inner, given = spec["block"], out.get(name)
        if isinstance(given, list):
            out[name] = [mark_computed_unknown(inner, v) for v in given]
        elif isinstance(given, dict) and spec["nesting_mode"] in ("single", "group"):
            out[name] = mark_computed_unknown(inner, given)
    return out


def resolve_unknown(value):
    """After apply nothing may stay unknown: what the API did not say becomes null."""
    if value is Unknown:
        return None
    if isinstance(value, dict):
        return {k: resolve_unknown(v) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_unknown(v) for v in value]
    return value


def keep_planned(block: dict, planned, state):
    """Terraform refuses a new value for anything the plan already knew ("Provider produced
    inconsistent result after apply"): every known planned value wins over the stand-in's."""
    if planned is None or state is None or planned is Unknown:
        return state
    out = dict(state)
    for name in block.get("attributes", {}):
        if planned.get(name) is not Unknown and name in planned:
            out[name] = planned[name]
    for name, spec in block.get("block_types", {}).items():
        given, got = planned.get(name), out.get(name)
        if isinstance(given, list) and isinstance(got, list) and len(given) == len(got):
            out[name] = [keep_planned(spec["block"], a, b) for a, b in zip(given, got)]
        elif isinstance(given, dict) and isinstance(got, dict) and spec["nesting_mode"] in ("single", "group"):
            out[name] = keep_planned(spec["block"], given, got)
        elif given is not Unknown and name in planned:
            out[name] = given
    return out


def dump() -> None:
    """Print every resource schema the stand-ins send terraform, as JSON (for
    tests/test_provider_standins.py, which runs without `tf` installed)."""
    from google.protobuf.json_format import MessageToDict

    from tests.world.provider.google_provider import Google
    from tests.world.provider.random_provider import Random

    out = {}
    for provider in (Google(), Random()):
        for klass in provider.get_resources():
            out[provider.get_model_prefix() + klass.get_name()] = MessageToDict(
                klass.get_schema().to_pb(), preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    print(json.dumps(out))
