"""The house rules of the package: imports flow one way, and a wheel holds every subpackage.

Layers, top to bottom: tfcluster.cli (the tasks; tasks.py re-exports them for `invoke`) → tfcluster.commands → tfcluster.launch and tfcluster.backends →
tfcluster.{state, config, errors, tfconfig, tflog, ui}. Every import counts, including the ones inside
functions (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "tfcluster"
BOTTOM = {"tfcluster.state", "tfcluster.config", "tfcluster.errors", "tfcluster.tfconfig", "tfcluster.tflog", "tfcluster.gpus",
          "tfcluster.ui",
          "tfcluster.container", "tfcluster.steptime", "tfcluster.money", "tfcluster.holds", "tfcluster.machines",
          "tfcluster.pace", "tfcluster.sources", "tfcluster.provisioning",
          "tfcluster.ports", "tfcluster.nccl"}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_from(node: ast.ImportFrom, path: Path) -> str:
    """The absolute module a ``from ... import`` in ``path`` names (relative imports resolved)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
    return base


def imports_of(path: Path, runtime_only: bool = False) -> set[str]:
    """Every module a file imports, resolved to absolute names (relative imports included);
    with ``runtime_only``, not those under ``if TYPE_CHECKING:`` (annotations only)."""
    found = set()
    tree = ast.parse(path.read_text())
    if runtime_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
                node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = imported_from(node, path)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(path): imports_of(path) for path in PACKAGE.rglob("*.py")}
    modules["tasks"] = imports_of(REPO / "tasks.py")
    known = set(modules)
    # Keep only imports of our own modules ("from pkg import name" may name a function, not a module).
    return {name: {target for target in targets if target in known} for name, targets in modules.items()}


def within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def violations(edges: dict[str, set[str]]) -> list[str]:
    found = []
    for source, targets in edges.items():
        for target in targets:
            if within(target, "tasks"):
                found.append(f"{source} imports tasks (only invoke loads tasks.py)")
            if within(target, "tfcluster.commands") and not (within(source, "tfcluster.commands")
                                                             or source in ("tasks", "tfcluster.cli")):
                found.append(f"{source} imports {target} (only the tasks, tfcluster/cli.py, may use the commands)")
            if source == "tfcluster.launch" and within(target, "tfcluster.backends") and target != "tfcluster.backends.base":
                found.append(f"tfcluster.launch imports the concrete backend {target} (it may use backends.base only)")
            if within(source, "tfcluster.backends") and within(target, "tfcluster.launch"):
                found.append(f"{source} imports {target} (backends sit beside the launcher, not above it)")
            if source in BOTTOM and target not in BOTTOM:
                found.append(f"{source} imports {target} (the bottom layer imports only itself)")
    return sorted(found)


def test_imports_flow_one_way():
    assert violations(graph()) == []


def mutual_imports(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} <-> {b}" for a, targets in edges.items() for b in targets
                  if a < b and a in edges.get(b, set()))


def test_no_two_modules_import_each_other():
    """A cycle makes import order matter and hides which module holds the concern."""
    runtime = {module_name(path): imports_of(path, runtime_only=True) for path in PACKAGE.rglob("*.py")
               if path.name != "__init__.py"}
    edges = {name: {target for target in targets if target in runtime} for name, targets in runtime.items()}
    assert mutual_imports(edges) == []
    assert mutual_imports({"x.a": {"x.b"}, "x.b": {"x.a"}}) == ["x.a <-> x.b"]


def test_layer_check_catches_a_backend_importing_the_commands():
    edges = graph()
    edges["tfcluster.backends.ssh.backend"] = edges["tfcluster.backends.ssh.backend"] | {"tfcluster.commands.runs"}
    edges["tfcluster.launch"] = edges["tfcluster.launch"] | {"tfcluster.backends.local"}
    edges["tfcluster.state"] = edges["tfcluster.state"] | {"tfcluster.launch"}
    assert violations(edges) == [
        "tfcluster.backends.ssh.backend imports tfcluster.commands.runs (only the tasks, tfcluster/cli.py, may use the commands)",
        "tfcluster.launch imports the concrete backend tfcluster.backends.local (it may use backends.base only)",
        "tfcluster.state imports tfcluster.launch (the bottom layer imports only itself)",
    ]


def test_no_module_is_a_junk_drawer():
    """A module holds one concern: none grows past about 400 lines. So for what runs on the
    machines too: the bundled trainer and the watchdog package."""
    modules = [*PACKAGE.rglob("*.py"), *(REPO / "trainer").rglob("*.py"), *(REPO / "startup").rglob("*.py"),
               REPO / "tasks.py"]
    large = {str(p.relative_to(REPO)): n for p in modules if (n := len(p.read_text().splitlines())) > 420}
    assert large == {}


def test_every_package_says_what_it_holds():
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and "import" in doc, f"{init.relative_to(REPO)} must say what it holds and may import"


def test_wheel_holds_every_subpackage(tmp_path):
    """A normal install must not miss a subpackage that an editable install would hide."""
    # Build from a copy: an in-tree build/ folder left by an earlier build would hide a missing package.
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__",
                                                                 "tests", "bench"))
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                             "-q", "-w", str(tmp_path), str(source)], capture_output=True, text=True)
    if result.returncode != 0 and "No module named" in result.stderr:
        pytest.skip(f"cannot build a wheel here: {result.stderr.strip().splitlines()[-1]}")
    assert result.returncode == 0, result.stderr
    wheel = next(tmp_path.glob("tfcluster-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = {str(init.parent.relative_to(REPO)) for init in [*PACKAGE.rglob("__init__.py"),
                                                                *(REPO / "trainer").rglob("__init__.py")]}
    missing = sorted(p for p in packages if f"{p}/__init__.py" not in names)
    assert missing == [] and "tfcluster/prices.json" in names
    # The installed command (`tfcluster ...` from any folder) is in the wheel's entry points.
    entry_points = next(name for name in names if name.endswith(".dist-info/entry_points.txt"))
    assert "tfcluster = tfcluster.program:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


# ---------------------------------------------------------------- no circle, type-only imports included

def written_imports(path: Path, known: set[str]) -> set[str]:
    """The modules a file names in its import statements, every one counted (inside functions and under
    ``if TYPE_CHECKING:`` too): ``from pkg import sub`` is an import of the submodule ``pkg.sub`` only, not
    of ``pkg``'s __init__ (Python needs no more of a package being imported than its path), while
    ``from pkg import name`` of a name that is not a module is an import of ``pkg``'s __init__."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = imported_from(node, path)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return found & known


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def product_edges() -> dict[str, set[str]]:
    paths = list(PACKAGE.rglob("*.py"))
    known = {module_name(path) for path in paths}
    return {module_name(path): written_imports(path, known) for path in paths}


def test_no_import_circle_between_product_files():
    """No chain of imports leads from a product file back to itself, however long, and whether the
    import runs or only annotates (``if TYPE_CHECKING:``): a circle hides which module holds the concern.
    Seen failing with the old backends/base.py <-> backends/docker.py (docker imported base.WorkerHost
    for its type hints)."""
    assert circles(product_edges()) == []
    planted = {"x.a": {"x.b"}, "x.b": {"x.c"}, "x.c": {"x.a"}, "x.d": {"x.a"}}
    assert circles(planted) == [["x.a", "x.b", "x.c"]]


# ---------------------------------------------------------------- the gcp backend's rooms

GCP = "tfcluster.backends.gcp"
# Each room of backends/gcp/ and the rooms it may import, lowest first (its __init__.py says why).
GCP_ROOMS = {
    "cloud": set(),
    "quotas": {"cloud"},
    "prices": {"cloud"},
    "zones": {"cloud", "quotas", "prices"},
    "vms": {"cloud", "prices", "zones"},
    "spend": {"cloud", "prices", "zones", "vms"},
    "access": {"cloud", "quotas", "prices", "zones"},
    # What a killed command made but terraform never recorded: asks Compute, IAM and Storage, books time.
    "leftovers": {"cloud", "quotas", "prices", "zones", "vms", "spend", "access"},
}
# What a room may use of the other backends (backend.py, at the top, composes the rest: ssh too).
GCP_ROOM_BACKENDS = {"tfcluster.backends.base", "tfcluster.backends.host", "tfcluster.backends.group",
                     "tfcluster.backends.docker"}
GCP_TOP_ENTRIES = 10  # __init__.py, backend.py and the eight rooms: "about 8".


def room_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[3] if module.startswith(GCP + ".") and len(parts) > 3 and parts[3] in GCP_ROOMS else None


def room_violations(edges: dict[str, set[str]]) -> list[str]:
    found = []
    for source, targets in edges.items():
        room = room_of(source)
        if room is None:
            continue
        for target in targets:
            other = room_of(target)
            if within(target, GCP) and other is None:
                found.append(f"{source} imports {target} (a room never imports the backend that composes it)")
            elif other is not None and other != room and other not in GCP_ROOMS[room]:
                found.append(f"{source} imports {target} (room {room} may import {sorted(GCP_ROOMS[room]) or 'no room'})")
            elif within(target, "tfcluster.backends") and not within(target, GCP) and target not in GCP_ROOM_BACKENDS:
                found.append(f"{source} imports {target} (a room uses only {sorted(GCP_ROOM_BACKENDS)})")
    return sorted(found)


def test_the_gcp_rooms_import_down_only():
    assert room_violations(product_edges()) == []
    planted = {f"{GCP}.quotas.quota": {f"{GCP}.zones.reservations"}, f"{GCP}.cloud.compute": {f"{GCP}.backend"},
               f"{GCP}.zones.capacity": {"tfcluster.backends.ssh.backend", f"{GCP}.quotas.quota"}}
    assert room_violations(planted) == [
        f"{GCP}.cloud.compute imports {GCP}.backend (a room never imports the backend that composes it)",
        f"{GCP}.quotas.quota imports {GCP}.zones.reservations (room quotas may import ['cloud'])",
        f"{GCP}.zones.capacity imports tfcluster.backends.ssh.backend (a room uses only "
        f"{sorted(GCP_ROOM_BACKENDS)})",
    ]


def test_backends_gcp_top_holds_the_backend_and_its_rooms():
    top = PACKAGE / "backends" / "gcp"
    entries = sorted(p.name for p in top.iterdir() if p.name != "__pycache__")
    assert entries == sorted(["__init__.py", "backend.py", *GCP_ROOMS]), (
        "backends/gcp/ holds __init__.py, backend.py and its rooms: put a new module in the room of its concern "
        "(or declare a new room in GCP_ROOMS with what it may import)")
    assert len(entries) <= GCP_TOP_ENTRIES


def exported(package: str) -> set[str]:
    init = REPO / Path(*package.split(".")) / "__init__.py"
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def outside_uses(path: Path) -> list[str]:
    """What a file outside backends/gcp/ imports of it that is not a room's (or the package's) export."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if within(a.name, GCP)]
        elif isinstance(node, ast.ImportFrom) and node.module and within(node.module, GCP):
            rooms = {GCP, *(f"{GCP}.{room}" for room in GCP_ROOMS)}
            if node.module not in rooms:
                found.append(f"from {node.module} import ... (a room's module; import what the room exports)")
            else:
                found += [f"from {node.module} import {a.name} (not in its __all__)" for a in node.names
                          if a.name not in exported(node.module)]
    return found


def test_others_use_only_what_the_gcp_rooms_export():
    """Vertex AI, the commands and the rest of tfcluster use a room through its __init__'s __all__."""
    gcp = PACKAGE / "backends" / "gcp"
    found = {str(path.relative_to(REPO)): uses for path in PACKAGE.rglob("*.py")
             if gcp not in path.parents and (uses := outside_uses(path))}
    assert found == {}



# ---------------------------------------------------------------- no mixins

def product_classes() -> dict[str, tuple[ast.ClassDef, str]]:
    classes = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, (node, module_name(path)))
    return classes


def base_names(node: ast.ClassDef) -> list[str]:
    return [base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "") for base in node.bases]


def defined_names(node: ast.ClassDef) -> set[str]:
    """What a class itself defines: methods, class attributes and fields, and every ``self.x = ...``."""
    names = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(item.name)
        elif isinstance(item, ast.Assign):
            names.update(t.id for t in item.targets if isinstance(t, ast.Name))
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
    for sub in ast.walk(node):
        targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target] if isinstance(
            sub, (ast.AnnAssign, ast.AugAssign)) else []
        while any(isinstance(t, (ast.Tuple, ast.List)) for t in targets):  # self.a, self.b = a, b
            targets = [e for t in targets for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])]
        names.update(t.attr for t in targets if isinstance(t, ast.Attribute) and getattr(t.value, "id", "") == "self")
    return names


def mixins(classes: dict[str, tuple[ast.ClassDef, str]]) -> list[str]:
    """Product classes that hold another concern's code by inheritance: a class with two or more product
    bases, or one whose methods use ``self.x`` that neither it nor any of its bases defines (it reaches
    into the class it is mixed into)."""
    found = []

    def everything(name: str) -> set[str] | None:
        """What a class and its bases define; None when a base is not ours (it may define anything)."""
        node = classes[name][0]
        names = defined_names(node)
        for base in base_names(node):
            if base in classes:
                inherited = everything(base)
                if inherited is None:
                    return None
                names |= inherited
            elif base not in ("object", "Protocol"):
                return None
        return names

    for name, (node, module) in sorted(classes.items()):
        product_bases = [base for base in base_names(node) if base in classes]
        if len(product_bases) > 1:
            found.append(f"{module}.{name} inherits {', '.join(product_bases)}: hold the others as collaborators")
            continue
        known = everything(name)
        if known is None:
            continue
        used = {sub.attr for sub in ast.walk(node) if isinstance(sub, ast.Attribute)
                and getattr(sub.value, "id", "") == "self" and not sub.attr.startswith("__")}
        missing = sorted(used - known)
        if missing:
            found.append(f"{module}.{name} uses self.{', self.'.join(missing)}, which neither it nor its bases define "
                         "(a mixin: give it what it needs)")
    return found


def test_no_class_holds_another_concerns_code_by_inheritance():
    """No mixins (DEVELOPERS.md): a concern is a named collaborator the class holds. Seen failing with the
    old GcpBackend(ledger_events.GcpSpend, budget.GcpBudget, SshBackend)."""
    assert mixins(product_classes()) == []
    planted = ast.parse("class Base:\n    def run(self):\n        self.x = 1\n"
                        "class Budget:\n    def rate(self):\n        return self._quote()\n"
                        "class Both(Budget, Base):\n    pass\n"
                        "class Fine(Base):\n    def go(self):\n        return self.run(), self.x\n")
    classes = {node.name: (node, "m") for node in planted.body}
    assert mixins(classes) == ["m.Both inherits Budget, Base: hold the others as collaborators",
                               "m.Budget uses self._quote, which neither it nor its bases define "
                               "(a mixin: give it what it needs)"]
