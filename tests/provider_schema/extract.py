"""Extract a compact Terraform provider schema from the CDK Terrain bindings on PyPI.

`terraform validate` needs the provider binary, which cannot be downloaded here. The prebuilt
CDK Terrain bindings (`cdktn-provider-google`, `cdktn-provider-random`; sources at
github.com/cdktn-io/cdktn-provider-<name>) are generated from the provider's own schema
(`terraform providers schema -json`), and their wheel ships the generated JavaScript in
`<pkg>/_jsii/*.jsii.tgz`:

- `package/package.json` names the provider and its version (`cdktn.provider`);
- `package/lib/<resource>/index.js` (plus `index-structs/*.js` for big resources) has, per
  resource class and per nested-block class, one generated comment for every schema attribute
  and block, `// <name> - computed: <b>, optional: <b>, required: <b>`, followed by the getter
  whose body tells the type (`getStringAttribute`, `getListAttribute`, `new ...List(.., wrapsSet)`);
  its `synthesizeHclAttributes()` and `<struct>ToHclTerraform()` functions say for each settable
  name whether it is a block (`isBlock`) and its nesting (`type: "list" | "set" | "struct"`);
- `package/.jsii` has every config struct with `optional` flags; it is read only for the
  provider's own nested blocks, which have no generated getter class.

The output has the shape of `terraform providers schema -json` (attributes with cty types;
`block_types` with `nesting_mode`, `min_items`, `max_items`), so the real command's output could
replace it one day. `max_items: 1` comes from the generator binding a block to a single object;
`min_items: 1` from a required block: the generator keeps no other item counts.

Regenerate (run by hand; downloads the wheel with `pip download --no-deps` into a temp dir):

    PYTHONPATH=$PWD /work/venv/bin/python -m tests.provider_schema.extract \\
        cdktn-provider-google==20.3.1 cdktn-provider-random==15.0.1

It writes tests/provider_schema/<provider>-<provider version>.json for every resource and data
source type that terraform/*.tf uses. To cover more types, add `--type google_compute_disk`
(repeatable; data sources are named as in `data "..."` blocks and looked up among both), or
`--all` for every type of the provider (google 7.46.1: 1350 resources and 465 data
sources, 6 MB: kept out of git).
cdktn-provider-google 20.x is hashicorp/google 7.x (20.3.1 is 7.46.1), 21.x is 8.x: find
another with `pip index versions cdktn-provider-google`; the version it wraps is recorded.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
TERRAFORM = HERE.parents[1] / "terraform"

FLAGS = re.compile(r"^    // ([a-z0-9_]+) - computed: (true|false), optional: (true|false), required: (true|false)\n"
                   r"((?:.*\n){1,3})", re.M)
CLASS = re.compile(r"^class (\w+) extends ([\w.]+) \{\n(.*?)^\}\n", re.M | re.S)
TO_HCL = re.compile(r"^function (\w+)ToHclTerraform\(struct\) \{\n(.*?)^\}\n", re.M | re.S)
SYNTH = re.compile(r"^    synthesizeHclAttributes\(\) \{\n(.*?)^    \}\n", re.M | re.S)
HCL_ENTRY = re.compile(r"(\w+): \{\s*value: (.*?),\s*isBlock: (true|false),\s*type: \"(\w+)\",\s*"
                       r"storageClassType: \"(\w+)\",\s*\}", re.S)
RESOURCE_TYPE = re.compile(r'static tfResourceType = "(\w+)";')
NESTED_FN = re.compile(r"(?<!cdktn\.)\b([a-z]\w*)ToHclTerraform\b")  # not cdktn's own stringToHclTerraform...
LIST_ELEMENT = re.compile(r"get\(index\) \{\s*return new (?:\w+\.)?(\w+OutputReference)\(")
GETTER_TYPES = [  # generated getter body -> cty type
    (re.compile(r"cdktn\.Fn\.tolist\(this\.getListAttribute\("), ["set", "string"]),
    (re.compile(r"this\.getListAttribute\("), ["list", "string"]),
    (re.compile(r"this\.getNumberListAttribute\("), ["list", "number"]),
    (re.compile(r"this\.getStringMapAttribute\(|new cdktn\.StringMap\("), ["map", "string"]),
    (re.compile(r"this\.getNumberMapAttribute\(|new cdktn\.NumberMap\("), ["map", "number"]),
    (re.compile(r"this\.getBooleanMapAttribute\(|new cdktn\.BooleanMap\("), ["map", "bool"]),
    (re.compile(r"new cdktn\.StringMapList\("), ["list", ["map", "string"]]),
    (re.compile(r"this\.getStringAttribute\("), "string"),
    (re.compile(r"this\.getNumberAttribute\("), "number"),
    (re.compile(r"this\.getBooleanAttribute\("), "bool"),
]
STORAGE_TYPES = {"string": "string", "number": "number", "boolean": "bool", "stringList": ["list", "string"],
                 "numberList": ["list", "number"], "stringMap": ["map", "string"], "numberMap": ["map", "number"],
                 "booleanMap": ["map", "bool"]}
NESTED_CLASS = re.compile(r"new (?:\w+\.)?(\w+?)(OutputReference|List)\(this, \"\w+\"(?:, (true|false))?\)")


@dataclass
class Bindings:
    """The generated JavaScript of one resource directory, indexed by name."""
    classes: dict[str, str] = field(default_factory=dict)  # class name -> class body
    bases: dict[str, str] = field(default_factory=dict)  # class name -> base class (cdktn.TerraformResource, ...)
    to_hcl: dict[str, str] = field(default_factory=dict)  # struct function prefix -> function body
    jsii_optional: dict[str, dict[str, bool]] = field(default_factory=dict)  # struct -> camel property -> optional

    def add(self, source: str) -> None:
        for match in CLASS.finditer(source):
            self.classes[match[1]] = match[3]
            self.bases[match[1]] = match[2]
        for match in TO_HCL.finditer(source):
            self.to_hcl[match[1]] = match[2]


def hcl_entries(body: str) -> dict[str, dict]:
    """Settable names of a struct function or synthesizeHclAttributes(): block?, nesting, nested struct."""
    entries = {}
    for name, value, is_block, kind, storage in HCL_ENTRY.findall(body):
        nested = NESTED_FN.search(value)
        entries[name] = {"block": is_block == "true", "kind": kind, "storage": storage,
                         "fn": nested[1] if nested else None,
                         "camel": (re.search(r"(?:struct\.|this\._)(\w+)", value) or [None, None])[1]}
    return entries


def attribute_type(getter: str, entry: dict | None, bindings: Bindings):
    for pattern, cty in GETTER_TYPES:
        if pattern.search(getter):
            return cty
    nested = NESTED_CLASS.search(getter)
    if nested:  # a computed (or attribute-mode) object: give its fields for references
        element = nested[1] + "OutputReference"
        fields = {name: spec["type"] for name, spec in
                  node(element, {}, bindings)["attributes"].items()} if element in bindings.classes else {}
        obj = ["object", fields]
        if nested[2] == "OutputReference":
            return obj
        return ["set" if nested[3] == "true" else "list", obj]
    if entry is not None and entry["storage"] in STORAGE_TYPES:
        return STORAGE_TYPES[entry["storage"]]
    return "dynamic"


def node(class_name: str, entries: dict[str, dict], bindings: Bindings) -> dict:
    """One schema block (resource, data source, or nested block) in `terraform providers schema -json` shape."""
    attributes, block_types = {}, {}
    for name, computed, optional, required, getter in FLAGS.findall(bindings.classes[class_name]):
        entry = entries.get(name)
        flags = {key: True for key, value in
                 (("required", required), ("optional", optional), ("computed", computed)) if value == "true"}
        if entry is not None and entry["block"]:
            block_types[name] = block(name, entry, getter, flags, bindings)
        else:
            attributes[name] = {"type": attribute_type(getter, entry, bindings), **flags}
    out = {"attributes": attributes}
    if block_types:
        out["block_types"] = block_types
    return out


def block(name: str, entry: dict, getter: str, flags: dict, bindings: Bindings) -> dict:
    nested = NESTED_CLASS.search(getter)
    nesting = {"struct": "single"}.get(entry["kind"], entry["kind"])
    if nested is None:  # provider blocks: no getter class, only the struct function and .jsii
        spec = struct_node(entry["fn"], bindings)
    else:
        element = nested[1] + "OutputReference"
        if nested[2] == "List":
            element = LIST_ELEMENT.search(bindings.classes[nested[1] + "List"])[1]
        spec = node(element, hcl_entries(bindings.to_hcl[entry["fn"]]), bindings)
    out = {"nesting_mode": nesting, "block": spec}
    if flags.get("required"):
        out["min_items"] = 1
    if nesting == "single" or (nested is not None and nested[2] == "OutputReference"):
        out["max_items"] = 1
    return out


def struct_node(fn: str, bindings: Bindings) -> dict:
    struct = fn[0].upper() + fn[1:]
    optional = bindings.jsii_optional[struct]
    attributes, block_types = {}, {}
    for name, entry in hcl_entries(bindings.to_hcl[fn]).items():
        flags = {"optional": True} if optional[entry["camel"]] else {"required": True}
        if entry["block"]:
            block_types[name] = {"nesting_mode": {"struct": "single"}.get(entry["kind"], entry["kind"]),
                                 "block": struct_node(entry["fn"], bindings)}
        else:
            attributes[name] = {"type": STORAGE_TYPES.get(entry["storage"], "dynamic"), **flags}
    return {"attributes": attributes, **({"block_types": block_types} if block_types else {})}


def used_types(directory: Path) -> set[str]:
    """Every resource and data source type that the module's .tf files declare."""
    pattern = re.compile(r'^\s*(?:resource|data)\s+"([a-z0-9_]+)"', re.M)
    return {kind for path in directory.glob("*.tf") for kind in pattern.findall(path.read_text())}


def open_package(requirement: str, scratch: Path) -> tuple[str, Path]:
    """Download the wheel and unpack its jsii tarball; returns the wheel's name and `package/`."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(scratch),
                    requirement], check=True)
    wheel = next(scratch.glob("*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        tgz = next(name for name in archive.namelist() if name.endswith(".jsii.tgz"))
        data = archive.read(tgz)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as package:
        package.extractall(scratch / "jsii", filter="data")
    return wheel.name, scratch / "jsii" / "package"


def extract(requirement: str, wanted: set[str] | None, out_dir: Path) -> Path:
    with tempfile.TemporaryDirectory() as scratch:
        wheel, package = open_package(requirement, Path(scratch))
        meta = json.loads((package / "package.json").read_text())
        provider = meta["cdktn"]["provider"]
        short = provider["name"].rsplit("/", 1)[1]
        structs = {spec["name"]: {p["name"]: bool(p.get("optional")) for p in spec["properties"]}
                   for spec in json.loads((package / ".jsii").read_text())["types"].values()
                   if spec.get("datatype") and "properties" in spec}
        schema = {"provider": None, "resource_schemas": {}, "data_source_schemas": {}}
        for directory in sorted(path for path in (package / "lib").iterdir() if path.is_dir()):
            sources = [path.read_text() for path in sorted(directory.rglob("*.js"))]
            declared = {kind for source in sources for kind in RESOURCE_TYPE.findall(source)}
            if not (directory.name == "provider" or wanted is None or declared & wanted):
                continue
            bindings = Bindings()
            for source in sources:
                bindings.add(source)
            bindings.jsii_optional = structs
            for class_name, body in bindings.classes.items():
                kind = RESOURCE_TYPE.search(body)
                synth = SYNTH.search(body)
                if kind is None or synth is None:
                    continue
                spec = {"version": 0, "block": node(class_name, hcl_entries(synth[1]), bindings)}
                base = bindings.bases[class_name]
                if base.endswith("TerraformProvider"):
                    # `alias` is Terraform's meta-argument, which the generator adds to every provider class.
                    spec["block"]["attributes"].pop("alias", None)
                    schema["provider"] = spec
                elif wanted is None or kind[1] in wanted:
                    table = "data_source_schemas" if base.endswith("TerraformDataSource") else "resource_schemas"
                    schema[table][kind[1]] = spec
    missing = (wanted or set()) - set(schema["resource_schemas"]) - set(schema["data_source_schemas"])
    if missing:
        raise SystemExit(f"error: {requirement} has no type {', '.join(sorted(missing))}")
    document = {
        "format_version": "1.0",
        "source": {
            "how": "tests/provider_schema/extract.py (see its docstring to regenerate)",
            "wheel": wheel, "package": f"{meta['name']}@{meta['version']}",
            "generated_from": "package/lib/*/index.js and package/.jsii in the wheel's _jsii/*.jsii.tgz",
            "bindings_repository": meta["repository"]["url"],
        },
        "provider_schemas": {provider["name"]: {"version": provider["version"], **schema}},
    }
    out = out_dir / f"{short}-{provider['version']}.json"
    out.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("requirements", nargs="+", help="e.g. cdktn-provider-google==20.3.1")
    parser.add_argument("--type", action="append", default=[], help="one more resource/data source type")
    parser.add_argument("--all", action="store_true", help="every type of the provider")
    parser.add_argument("--terraform", type=Path, default=TERRAFORM, help="module whose types to cover")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args(argv)
    wanted = used_types(args.terraform) | set(args.type)
    for requirement in args.requirements:
        short = re.sub(r"[=<>!~].*", "", requirement).rsplit("-", 1)[1]
        mine = None if args.all else {kind for kind in wanted if kind.split("_", 1)[0] == short}
        print(extract(requirement, mine, args.out))


if __name__ == "__main__":
    main()
