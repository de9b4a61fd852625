"""The provider stand-ins declare exactly the committed provider schemas (tests/provider_schema),
as terraform receives them over the plugin protocol: every block's nesting mode and item bounds,
every attribute's type and its required/optional/computed flags."""

from __future__ import annotations

import json

from tests.world.provider.google_provider import Google
from tests.world.provider.random_provider import Random
from tests.world.provider.schema import FILES, NESTING, SCHEMAS
from tests.test_terraform import TF


def _flags(spec: dict) -> tuple:
    return (bool(spec.get("required")), bool(spec.get("optional")), bool(spec.get("computed")),
            bool(spec.get("sensitive")))


def differences(block_json: dict, block_pb, path: str = "") -> list[str]:
    """Where the protobuf block terraform receives differs from the committed JSON block."""
    found = []
    attributes = {a.name: a for a in block_pb.attributes}
    for name, spec in block_json.get("attributes", {}).items():
        got = attributes.pop(name, None)
        if got is None:
            found.append(f"{path}{name}: missing")
            continue
        if json.loads(got.type) != spec["type"]:
            found.append(f"{path}{name}: type {got.type.decode()} != {spec['type']}")
        if (got.required, got.optional, got.computed, got.sensitive) != _flags(spec):
            found.append(f"{path}{name}: required/optional/computed/sensitive "
                         f"{(got.required, got.optional, got.computed, got.sensitive)} != {_flags(spec)}")
    found += [f"{path}{name}: not in the provider's schema" for name in attributes]
    nested = {b.type_name: b for b in block_pb.block_types}
    for name, spec in block_json.get("block_types", {}).items():
        got = nested.pop(name, None)
        if got is None:
            found.append(f"{path}{name}: block missing")
            continue
        if got.nesting != NESTING[spec["nesting_mode"]]:
            found.append(f"{path}{name}: nesting {got.nesting} != {spec['nesting_mode']}")
        if spec["nesting_mode"] in ("list", "set") and (got.min_items, got.max_items) != (
                spec.get("min_items", 0), spec.get("max_items", 0)):
            found.append(f"{path}{name}: items {(got.min_items, got.max_items)}")
        found += differences(spec["block"], got.block, f"{path}{name}.")
    found += [f"{path}{name}: block not in the provider's schema" for name in nested]
    return found


def test_every_resource_of_the_module_has_a_stand_in_with_the_provider_schema():
    used = set()
    for path in TF.glob("*.tf"):
        used |= {word.split('"')[1] for word in path.read_text().split("resource ")[1:] if word.startswith('"')}
    for provider in (Google(), Random()):
        committed = json.loads((SCHEMAS / FILES[provider.name]).read_text())
        document = committed["provider_schemas"][provider.full_name()]["resource_schemas"]
        served = {provider.get_model_prefix() + klass.get_name(): klass for klass in provider.get_resources()}
        assert set(served) == {name for name in used if name.startswith(provider.get_model_prefix())}
        for type_name, klass in served.items():
            assert differences(document[type_name]["block"], klass.get_schema().to_pb().block) == [], type_name


def test_the_comparison_sees_a_lost_flag_and_a_wrong_nesting_mode():
    block = {"attributes": {"nat_ip": {"computed": True, "optional": True, "type": "string"}},
             "block_types": {"access_config": {"nesting_mode": "list", "block": {}}}}
    from tests.world.provider.schema import block_to_pb

    wrong = json.loads(json.dumps(block))
    wrong["attributes"]["nat_ip"].pop("computed")
    wrong["block_types"]["access_config"]["nesting_mode"] = "set"
    assert differences(block, block_to_pb(block)) == []
    assert [d.split(":")[0] for d in differences(block, block_to_pb(wrong))] == ["nat_ip", "access_config"]
