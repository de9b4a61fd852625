"""The provider stand-ins declare exactly the committed provider schemas (tests/provider_schema),
as terraform receives them over the plugin protocol: every block's nesting mode and item bounds,
every attribute's type and its required/optional/computed flags."""

from __future__ import annotations

import base64
import json

import subprocess

from tests.conftest import REPO
from tests.test_terraform import TF
from tests.world.provider.mirror import provider_python

SCHEMAS = REPO / "tests" / "provider_schema"
FILES = {"registry.terraform.io/hashicorp/google": "google-7.46.1.json",
         "registry.terraform.io/hashicorp/random": "random-3.9.1.json"}
NESTING = {"single": "SINGLE", "list": "LIST", "set": "SET", "map": "MAP", "group": "GROUP"}


def served_schemas() -> dict:
    """What the stand-ins send terraform, from their own interpreter (where `tf` is installed)."""
    script = f"import sys; sys.path.insert(0, {str(REPO)!r}); from tests.world.provider.schema import dump; dump()"
    result = subprocess.run([provider_python(), "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _flags(spec: dict) -> tuple:
    return tuple(bool(spec.get(flag)) for flag in ("required", "optional", "computed", "sensitive"))


def differences(block_json: dict, block_pb: dict, path: str = "") -> list[str]:
    """Where the block terraform receives (protobuf, as a dict) differs from the committed JSON block."""
    found = []
    attributes = {a["name"]: a for a in block_pb.get("attributes", [])}
    for name, spec in block_json.get("attributes", {}).items():
        got = attributes.pop(name, None)
        if got is None:
            found.append(f"{path}{name}: missing")
            continue
        if json.loads(base64.b64decode(got["type"])) != spec["type"]:
            found.append(f"{path}{name}: type differs")
        if _flags(got) != _flags(spec):
            found.append(f"{path}{name}: required/optional/computed/sensitive {_flags(got)} != {_flags(spec)}")
    found += [f"{path}{name}: not in the provider's schema" for name in attributes]
    nested = {b["type_name"]: b for b in block_pb.get("block_types", [])}
    for name, spec in block_json.get("block_types", {}).items():
        got = nested.pop(name, None)
        if got is None:
            found.append(f"{path}{name}: block missing")
            continue
        if got["nesting"] != NESTING[spec["nesting_mode"]]:
            found.append(f"{path}{name}: nesting {got['nesting']} != {spec['nesting_mode']}")
        if spec["nesting_mode"] in ("list", "set") and (int(got.get("min_items", 0)), int(got.get("max_items", 0))) != (
                spec.get("min_items", 0), spec.get("max_items", 0)):
            found.append(f"{path}{name}: item bounds differ")
        found += differences(spec["block"], got["block"], f"{path}{name}.")
    found += [f"{path}{name}: block not in the provider's schema" for name in nested]
    return found


def test_every_resource_of_the_module_has_a_stand_in_with_the_provider_schema():
    used = set()
    for path in TF.glob("*.tf"):
        used |= {word.split('"')[1] for word in path.read_text().split("resource ")[1:] if word.startswith('"')}
    served = served_schemas()
    assert set(served) == used
    committed = {}
    for source, name in FILES.items():
        committed.update(json.loads((SCHEMAS / name).read_text())["provider_schemas"][source]["resource_schemas"])
    for type_name, schema in served.items():
        assert differences(committed[type_name]["block"], schema["block"]) == [], type_name


def test_the_comparison_sees_a_lost_flag_and_a_wrong_nesting_mode():
    block = {"attributes": {"nat_ip": {"computed": True, "optional": True, "type": "string"}},
             "block_types": {"access_config": {"nesting_mode": "list", "block": {}}}}
    encoded = base64.b64encode(b'"string"').decode()
    right = {"attributes": [{"name": "nat_ip", "type": encoded, "optional": True, "computed": True}],
             "block_types": [{"type_name": "access_config", "nesting": "LIST", "block": {}}]}
    wrong = {"attributes": [{"name": "nat_ip", "type": encoded, "optional": True}],
             "block_types": [{"type_name": "access_config", "nesting": "SET", "block": {}}]}
    assert differences(block, right) == []
    assert [d.split(":")[0] for d in differences(block, wrong)] == ["nat_ip", "access_config"]
