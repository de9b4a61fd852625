"""Check a Terraform module against provider schemas in `terraform providers schema -json` shape.

What `terraform validate` would check with the real provider, done statically: resource and data
source types exist; every argument exists and is settable (not computed-only); required arguments
and required blocks are present; blocks are written as blocks and arguments as arguments (also
inside `dynamic "x"`); every `google_x.name.attr` reference (and `for v in google_x.name : v.attr`)
names a declared resource and an attribute or block its type has. The schemas are extracted from
the provider's CDK bindings by tests/provider_schema/extract.py (source recorded in each JSON).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from hcl2 import SerializationOptions

from tests.test_terraform import parse

SCHEMAS = Path(__file__).resolve().parent
# explicit_blocks marks blocks (`x { }`) apart from object-valued arguments (`x = [{ }]`).
BLOCK_OPTIONS = SerializationOptions(strip_string_quotes=True, explicit_blocks=True, with_comments=False)
# Terraform's own meta-arguments of resource and data blocks (developer.hashicorp.com/terraform/language/meta-arguments).
META_ARGUMENTS = {"count", "for_each", "depends_on", "provider", "lifecycle", "provisioner", "connection"}
DYNAMIC_KEYS = {"for_each", "iterator", "labels", "content"}
# A traversal after a resource address: `.attr`, `[index]`, `[*]`.
STEPS = r"((?:\.[A-Za-z0-9_*]+|\[[^\[\]]*\])*)"
FOR_ALIAS = re.compile(r"\bfor\s+(\w+)(?:\s*,\s*(\w+))?\s+in\s+(data\.)?([a-z][a-z0-9]*_[a-z0-9_]+)\.([\w-]+)\s*:")


@dataclass(frozen=True)
class Finding:
    """One schema violation, located like terraform's own diagnostics."""
    file: str  # .tf file name inside the module
    address: str  # resource/data/provider/output/locals address the problem is in
    path: str  # argument path inside it (blocks joined with dots), or the reference text
    message: str  # what is wrong

    def __str__(self) -> str:
        return f"{self.file}: {self.address}: {self.path}: {self.message}"


def load_schemas(directory: Path = SCHEMAS) -> dict[str, dict]:
    """Provider short name (google, random) -> its schema, with `source` from the file."""
    found = {}
    for path in sorted(directory.glob("*.json")):
        document = json.loads(path.read_text())
        for address, schema in document["provider_schemas"].items():
            found[address.rsplit("/", 1)[1]] = {**schema, "source": document["source"], "file": path.name}
    return found


def is_block(value) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(item, dict) and item.get("__is_block__") for item in value)


def fields(value: dict) -> dict:
    return {key: item for key, item in value.items() if not key.startswith("__")}


class ModuleChecker:
    """Collects findings for every .tf file of one module directory."""

    def __init__(self, directory: Path, schemas: dict[str, dict]):
        self.schemas = schemas
        self.files = {path.name: parse(path.name, directory, BLOCK_OPTIONS) for path in sorted(directory.glob("*.tf"))}
        self.declared: dict[tuple[str, str, str], dict] = {}  # (resource|data, type, name) -> type schema or {}
        self.findings: list[Finding] = []

    def type_schema(self, kind: str, type_name: str) -> tuple[dict | None, str | None]:
        provider = self.schemas.get(type_name.split("_", 1)[0])
        if provider is None:
            return None, f"no schema for the provider of {type_name}: add it with tests/provider_schema/extract.py"
        table = "resource_schemas" if kind == "resource" else "data_source_schemas"
        spec = provider[table].get(type_name)
        if spec is None:
            return None, (f"{provider['file']} (hashicorp/{type_name.split('_', 1)[0]} {provider['version']}) "
                          f"has no {kind} type {type_name}")
        return spec["block"], None

    def run(self) -> list[Finding]:
        for file, document in self.files.items():
            for kind in ("resource", "data"):
                for entry in document.get(kind, []):
                    for type_name, instances in fields(entry).items():
                        for name, body in fields(instances).items():
                            address = f"{'data.' if kind == 'data' else ''}{type_name}.{name}"
                            block, problem = self.type_schema(kind, type_name)
                            self.declared[(kind, type_name, name)] = block or {}
                            if problem:
                                self.findings.append(Finding(file, address, type_name, problem))
                            else:
                                self.body(file, address, body, block, "", top=True)
            for entry in document.get("provider", []):
                for name, body in fields(entry).items():
                    provider = self.schemas.get(name)
                    if provider is not None:
                        self.body(file, f"provider.{name}", {k: v for k, v in body.items() if k != "alias"},
                                  provider["provider"]["block"], "", top=False)
        for file, document in self.files.items():
            self.references(file, document)
        return self.findings

    def body(self, file: str, address: str, body: dict, block: dict, path: str, top: bool) -> None:
        attributes, block_types = block.get("attributes", {}), block.get("block_types", {})
        present = set()
        for key, value in fields(body).items():
            where = f"{path}{key}"
            report = lambda message: self.findings.append(Finding(file, address, where, message))  # noqa: E731
            if top and key in META_ARGUMENTS:
                if key == "lifecycle" and is_block(value):
                    self.ignore_changes(file, address, value, block)
                continue
            if key == "dynamic":
                for entry in value:
                    for name, dynamic in fields(entry).items():
                        present.add(name)
                        self.dynamic(file, address, f"{path}dynamic.{name}", name, dynamic, block)
                continue
            if key in attributes:
                present.add(key)
                spec = attributes[key]
                if is_block(value):
                    report(f"{key} is an argument, not a block: write `{key} = ...`")
                elif not (spec.get("required") or spec.get("optional")):
                    report("computed-only attribute: it cannot be set")
            elif key in block_types:
                present.add(key)
                nested = block_types[key]
                if not is_block(value):
                    report(f"{key} is a block, not an argument: write `{key} {{ ... }}`")
                    continue
                if len(value) > nested.get("max_items", len(value)):
                    report(f"at most {nested['max_items']} {key} block(s) allowed, found {len(value)}")
                for item in value:
                    self.body(file, address, item, nested["block"], f"{where}.", top=False)
            else:
                report(f"unsupported {'block' if is_block(value) else 'argument'}")
        for name, spec in attributes.items():
            if spec.get("required") and name not in present:
                self.findings.append(Finding(file, address, f"{path}{name}", "missing required argument"))
        for name, spec in block_types.items():
            if spec.get("min_items", 0) > 0 and name not in present:
                self.findings.append(Finding(file, address, f"{path}{name}",
                                             f"missing required block (at least {spec['min_items']})"))

    def dynamic(self, file: str, address: str, where: str, name: str, dynamic: dict, block: dict) -> None:
        report = lambda message: self.findings.append(Finding(file, address, where, message))  # noqa: E731
        for key in set(fields(dynamic)) - DYNAMIC_KEYS:
            report(f"unsupported argument {key} in a dynamic block")
        if name in block.get("attributes", {}):
            report(f"{name} is an argument, not a block: `dynamic` generates blocks only")
        elif name not in block.get("block_types", {}):
            report(f"unsupported block type {name}")
        else:
            for content in dynamic.get("content", []):
                self.body(file, address, content, block["block_types"][name]["block"], f"{where}.", top=False)

    def ignore_changes(self, file: str, address: str, lifecycle: list, block: dict) -> None:
        for item in lifecycle:
            names = item.get("ignore_changes", [])
            for name in names if isinstance(names, list) else []:
                first = re.split(r"[.\[]", name.strip("${}"))[0]
                if first not in block.get("attributes", {}) and first not in block.get("block_types", {}):
                    self.findings.append(Finding(file, address, "lifecycle.ignore_changes",
                                                 f"{name}: no such attribute"))

    def references(self, file: str, document: dict) -> None:
        """Check the expressions of every block of one file, each under its own address."""
        for section, entries in fields(document).items():
            for entry in entries if isinstance(entries, list) else [entries]:
                if section in ("resource", "data"):
                    for type_name, instances in fields(entry).items():
                        for name, body in fields(instances).items():
                            prefix = "data." if section == "data" else ""
                            self.strings(file, f"{prefix}{type_name}.{name}", body)
                elif section in ("output", "provider", "variable", "module"):
                    for name, body in fields(entry).items():
                        self.strings(file, f"{section}.{name}", body)
                else:
                    self.strings(file, section, entry)

    def strings(self, file: str, address: str, value) -> None:
        if isinstance(value, dict):
            for item in fields(value).values():
                self.strings(file, address, item)
        elif isinstance(value, list):
            for item in value:
                self.strings(file, address, item)
        elif isinstance(value, str) and "${" in value:
            self.expression(file, address, value)

    def expression(self, file: str, address: str, text: str) -> None:
        prefixes = "|".join(sorted(self.schemas))
        for data, type_name, name, steps in re.findall(
                rf"(?<![\w.])(data\.)?((?:{prefixes})_[a-z0-9_]+)\.([\w-]+){STEPS}", text):
            self.reference(file, address, f"{data}{type_name}.{name}{steps}", data, type_name, name, steps,
                           instance_steps=True)
        for value_alias, second, data, type_name, name in [m.groups() for m in FOR_ALIAS.finditer(text)]:
            alias = second or value_alias
            for steps in re.findall(rf"(?<![\w.]){alias}{STEPS}", text):
                if steps:
                    self.reference(file, address, f"{alias}{steps} (for {alias} in {type_name}.{name})",
                                   data, type_name, name, steps, instance_steps=False)

    def reference(self, file: str, address: str, text: str, data: str, type_name: str, name: str,
                  steps: str, instance_steps: bool) -> None:
        report = lambda message: self.findings.append(Finding(file, address, text, message))  # noqa: E731
        kind = "data" if data else "resource"
        if (kind, type_name, name) not in self.declared:
            report(f"reference to undeclared {kind} {type_name}.{name}")
            return
        node: object = {"block": self.declared[(kind, type_name, name)]}
        parts = re.findall(r"\.([A-Za-z0-9_*]+)|\[([^\[\]]*)\]", steps)
        if instance_steps:  # `[count.index]`, `["key"]`, `[*]` pick instances of the resource itself
            while parts and parts[0][0] == "":
                parts.pop(0)
        for attribute, index in parts:
            if index or attribute == "*" or not node:
                continue  # an element of a list, set or object/block collection: same schema
            node = self.step(node, attribute)
            if node is None:
                report(f"{type_name} has no attribute {attribute}")
                return

    @staticmethod
    def step(node, attribute: str):
        """The schema of `node.attribute`: a block, an object type, or {} where no deeper check applies."""
        if isinstance(node, dict) and "block" in node:
            block = node["block"]
            if attribute in block.get("block_types", {}):
                return block["block_types"][attribute]
            if attribute in block.get("attributes", {}):
                kind = block["attributes"][attribute]["type"]
                while isinstance(kind, list) and kind[0] in ("list", "set"):
                    kind = kind[1]
                return {"object": kind[1]} if isinstance(kind, list) and kind[0] == "object" else {}
            return None
        if isinstance(node, dict) and "object" in node:
            if attribute not in node["object"]:
                return None
            kind = node["object"][attribute]
            while isinstance(kind, list) and kind[0] in ("list", "set"):
                kind = kind[1]
            return {"object": kind[1]} if isinstance(kind, list) and kind[0] == "object" else {}
        return {}
