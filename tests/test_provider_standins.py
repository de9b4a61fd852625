"""The provider stand-ins declare exactly the committed provider schemas (tests/provider_schema),
as terraform receives them over the plugin protocol: every block's nesting mode and item bounds,
every attribute's type and its required/optional/computed flags."""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
from pathlib import Path

from tests.conftest import REPO
from tests.provider_schema.check import BLOCK_OPTIONS, META_ARGUMENTS, fields, is_block, load_schemas
from tests.test_terraform import TF, parse
from tests.test_terraform_agreement import product_variables
from tests.world.provider import mirror, planning
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


# ---------------------------------------------------------------- every argument reaches Google

# Arguments terraform/ sets that the provider keeps in the state and sends to no API at create,
# each with the provider source that says so.
STATE_ONLY = {
    # resource_storage_bucket.go: read only by resourceStorageBucketDelete (objects first).
    ("google_storage_bucket", ("force_destroy",)),
}


def set_paths(body: dict, block: dict, prefix: tuple = ()) -> list[tuple]:
    """Every argument and block a resource's configuration sets, as paths of names (blocks
    generated by `dynamic` included), from the .tf text parsed against the provider schema."""
    found = []
    for key, value in fields(body).items():
        if not prefix and key in META_ARGUMENTS:
            continue
        if key == "dynamic":
            for entry in value:
                for name, dynamic in fields(entry).items():
                    found.append(prefix + (name,))
                    for content in dynamic.get("content", []):
                        found += set_paths(content, block["block_types"][name]["block"], prefix + (name,))
        elif key in block.get("block_types", {}) and is_block(value):
            found.append(prefix + (key,))
            for item in value:
                found += set_paths(item, block["block_types"][key]["block"], prefix + (key,))
        elif key in block.get("attributes", {}):
            found.append(prefix + (key,))
    return sorted(set(found))


def configured(module: Path) -> dict[str, list[tuple]]:
    """Resource address (type.name) -> the paths its configuration sets, for every google resource."""
    schemas = load_schemas()
    out = {}
    for path in sorted(module.glob("*.tf")):
        for entry in parse(path.name, module, BLOCK_OPTIONS).get("resource", []):
            for type_name, instances in fields(entry).items():
                if not type_name.startswith("google_"):
                    continue
                for name, body in fields(instances).items():
                    block = schemas["google"]["resource_schemas"][type_name]["block"]
                    out[f"{type_name}.{name}"] = set_paths(body, block)
    return out


def placeholder(kind, name: str):
    """A value of type ``kind`` for what terraform knows only after apply (ids, emails, names)."""
    if isinstance(kind, list):
        return [f"known-after-apply-{name}"] if kind[0] in ("list", "set") else {}
    return {"number": 7, "bool": True}.get(kind, f"known-after-apply-{name}")


def from_resources(expressions: dict, prefix: tuple = ()) -> set[tuple]:
    """The argument paths whose expression reads another resource (`show -json` configuration:
    {"references": [...]}, blocks as lists of such maps)."""
    found = set()
    for name, expression in expressions.items():
        if isinstance(expression, list):
            for item in expression:
                found |= from_resources(item, prefix + (name,))
        elif any(ref.startswith(("google_", "random_")) for ref in expression.get("references", [])):
            found.add(prefix + (name,))
    return found


def fill_unknown(value: dict, unknown: dict, block: dict, paths: set[tuple], prefix: tuple = ()) -> dict:
    """A block's planned values with the arguments that read another resource (``paths``),
    which terraform knows only after apply (after_unknown), filled in; what the provider itself
    computes stays unset, as the SDK reads it during a create."""
    out = dict(value or {})
    for name, flag in (unknown or {}).items():
        if name in block.get("attributes", {}) and flag is True and prefix + (name,) in paths:
            out[name] = placeholder(block["attributes"][name]["type"], name)
        elif name in block.get("block_types", {}) and isinstance(flag, list):
            inner = block["block_types"][name]["block"]
            out[name] = [fill_unknown(item, mark, inner, paths, prefix + (name,))
                         for item, mark in zip(out.get(name) or [], flag)]
    return out


def mutants(value, kind) -> list:
    """Other values an argument could have: a bool flipped, a number + 1, a string changed, a
    collection with one more element; for a block, none of it."""
    if kind == "bool":
        return [not value] if value is not None else [True, False]
    if kind == "number":
        return [(value or 0) + 1]
    if kind == "string":
        return [(value or "") + "x"]
    if isinstance(kind, list) and kind[0] in ("list", "set"):
        return [list(value or []) + ["x"]]
    if isinstance(kind, list) and kind[0] == "map":
        return [{**(value or {}), "x": "y"}]
    raise AssertionError(f"no mutation for type {kind}")


def present(planned: dict, path: tuple, block: dict) -> bool:
    """Whether the blocks holding ``path`` (and the block at ``path``) exist in ``planned``: a
    `dynamic` block may not."""
    for name in path:
        if name not in block.get("block_types", {}):
            return True
        items = planned.get(name) or []
        if not items:
            return False
        planned, block = items[0], block["block_types"][name]["block"]
    return True


def mutated(planned: dict, path: tuple, block: dict) -> list[dict]:
    """``planned`` with the argument or block at ``path`` changed, one object per mutant."""
    inner_block = block
    for name in path[:-1]:
        inner_block = inner_block["block_types"][name]["block"]
    last = path[-1]

    def parent(obj: dict) -> dict:
        for name in path[:-1]:
            obj = obj[name][0]
        return obj
    if last in inner_block.get("block_types", {}):
        values = [[]]
    else:
        values = mutants(parent(planned).get(last), inner_block["attributes"][last]["type"])
    out = []
    for value in values:
        changed = copy.deepcopy(planned)
        parent(changed)[last] = value
        out.append(changed)
    return out


# Clusters planned so that every block terraform/ may write exists in one of them: an N1 with an
# attached T4 and a retention (guest_accelerator, the age lifecycle rule), an A3 with its bundled
# Local SSD (on_instance_stop_action).
PLANNED_CLUSTERS = {"n1-t4": {"gpu": "nvidia-tesla-t4", "gpu_count": 1, "bucket_retention_days": 30},
                    "a3-local-ssd": {"machine_type": "a3-highgpu-8g", "gpu": "nvidia-h100-80gb", "gpu_count": 8}}


def test_every_argument_terraform_sets_reaches_the_create_request(tmp_path):
    """For every google resource of terraform/ and every argument or block its configuration
    sets (read from the .tf files against the provider schema), changing that argument in the
    planned object changes what the stand-in sends Google to create it (method, URL or body):
    an argument the stand-in drops fails here by name. Planned for the PLANNED_CLUSTERS, so that
    every block, `dynamic` ones included, is present in one of them."""
    env = {**os.environ, **mirror.build(tmp_path / "providers")}
    schemas = load_schemas()["google"]["resource_schemas"]
    cases, baseline, index, covered = [], {}, [], set()
    for cluster, settings in PLANNED_CLUSTERS.items():
        variables = product_variables(**settings)
        shown = planning.plan(env, tmp_path / cluster, variables)
        provider = {"project": variables["project"], "zone": variables["zone"], "region": variables["zone"][:-2]}
        for address, paths in configured(TF).items():
            type_name = address.split(".")[0]
            block = schemas[type_name]["block"]
            instance = next(r["address"] for r in shown["planned_values"]["root_module"]["resources"]
                            if r["address"] in (address, f"{address}[0]"))
            [config] = [r for r in shown["configuration"]["root_module"]["resources"] if r["address"] == address]
            planned = fill_unknown(planning.planned_values(shown, instance),
                                   planning.after_unknown(shown, instance), block, from_resources(config["expressions"]))
            baseline[(cluster, address)] = len(cases)
            cases.append({"type": type_name, "planned": planned})
            for path in paths:
                if (type_name, path) in STATE_ONLY or (address, path) in covered or not present(planned, path, block):
                    continue
                covered.add((address, path))
                for variant in mutated(planned, path, block):
                    index.append((cluster, address, path, len(cases)))
                    cases.append({"type": type_name, "planned": variant})
    absent = sorted(f"{a}: {'.'.join(p)}" for a, paths in configured(TF).items() for p in paths
                    if (a, p) not in covered and (a.split(".")[0], p) not in STATE_ONLY)
    assert absent == [], "no planned cluster has these blocks; add one to PLANNED_CLUSTERS:\n" + "\n".join(absent)
    result = subprocess.run([provider_python(), "-m", "tests.world.provider.create_calls"], cwd=REPO,
                            input=json.dumps({"provider": provider, "cases": cases}), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    calls = json.loads(result.stdout)
    baselines = {key: calls[at] for key, at in baseline.items()}
    errors = {key: call["error"] for key, call in baselines.items() if isinstance(call, dict)}
    assert errors == {}, errors
    changed: dict[tuple, bool] = {}
    for cluster, address, path, at in index:
        changed[(address, path)] = changed.get((address, path), False) or calls[at] != baselines[(cluster, address)]
    dropped = sorted(f"{address}: {'.'.join(path)}" for (address, path), ok in changed.items() if not ok)
    assert dropped == [], "arguments terraform/ sets that the stand-in does not send:\n" + "\n".join(dropped)
    # Every google resource of terraform/ was checked, the instance's blocks among them.
    assert {address for address, _ in changed} == {address for _, address in baseline}
    assert set(changed) >= {("google_compute_instance.worker", ("shielded_instance_config",)),
                            ("google_compute_instance.worker", ("guest_accelerator", "count")),
                            ("google_compute_instance.worker", ("scheduling", "on_instance_stop_action")),
                            ("google_compute_instance.worker", ("scheduling", "automatic_restart"))}
    # Scopes go as the provider sends them: URLs, not gcloud's aliases.
    instance = baselines[("n1-t4", "google_compute_instance.worker")][2]
    assert instance["serviceAccounts"][0]["scopes"] == ["https://www.googleapis.com/auth/cloud-platform"]
