"""Every `error:` line a user can see, as a template, read from the code (no import, no run).

tasks.py prints a TfClusterError as `error: <message>`; the messages are the string arguments of
the calls that build one (`raise ConfigError("...")`, `return GoogleError(f"...")`, an error
class's own `super().__init__(f"...")`), a Keras Tuner process's `fail("...")`, the fixes `gcp/errors.py`'s `explain()` returns for
Google's errors, and the boot script's `fail "..."` lines, which `invoke up` shows beside the VM's
name. A value filled in at run time (an f-string field, a shell `$VAR` or `$(...)`) is `…`.
docs/troubleshooting.md lists each template; tests/test_docs.py checks that it does.

    python -m tests.docs_messages            every template, with where it is raised
    python -m tests.docs_messages --missing  those docs/troubleshooting.md lacks, as lines to paste
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TROUBLESHOOTING = REPO / "docs" / "troubleshooting.md"
# The user-facing error classes (tfcluster/errors.py and their subclasses) and invoke's Exit.
ERROR_CLASSES = {"TfClusterError", "ConfigError", "ClusterError", "TrainingFailed", "HostUnreachable",
                 "HostErrors", "GoogleError", "NoCapacity", "TerraformError", "Exit"}
# Functions whose returned strings are shown as the message (the fix for a Google error).
MESSAGE_FUNCTIONS = {("tfcluster/backends/gcp/cloud/errors.py", "explain")}
# Calls whose message reaches the user as the command's `error:` line from elsewhere: a tuner's or
# the oracle's `fail("...")` becomes the `tune` run's ConfigError (tfcluster/commands/tune_loop.py).
MESSAGE_CALLS = {("trainer/tune_hooks.py", "fail")}
GAP = "…"
# Classes that wrap one argument in text of their own (tfcluster/errors.py): prefix, suffix, which argument.
WRAPPED = {"HostErrors": ("", f" failed on {GAP} host(s): {GAP}", 0),
           "HostUnreachable": (f"{GAP} is unreachable: ", "", 1)}


@dataclass(frozen=True)
class Message:
    template: str  # the message, a run-time value as GAP, whitespace collapsed
    where: str     # path:line of the code that builds it


def _template(node: ast.AST) -> str | None:
    """The text of a string literal, an f-string (fields as GAP) or a concatenation of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else GAP for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left), _template(node.right)
        return None if left is None and right is None else (left or GAP) + (right or GAP)
    if isinstance(node, ast.IfExp):  # "a" if x else "b": both are messages; keep the first
        return _template(node.body)
    return None


def _name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _clean(text: str) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    return re.sub(rf"(?:{GAP}\s*)+{GAP}", GAP, text).removeprefix("error: ")


def python_messages(path: Path) -> list[Message]:
    relative = path.relative_to(REPO).as_posix()
    tree = ast.parse(path.read_text())
    found = []

    def add(node: ast.AST, line: int) -> None:
        text = _template(node)
        if text is not None and text.strip(GAP + " :;,.") and _clean(text) != GAP:
            found.append(Message(_clean(text), f"{relative}:{line}"))

    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any(getattr(b, "id", "") in ERROR_CLASSES for b in node.bases):
            for inner in ast.walk(node):  # super().__init__(f"...") in an error class
                if isinstance(inner, ast.Call) and _name(inner) == "__init__":
                    for arg in inner.args:
                        add(arg, inner.lineno)
        elif isinstance(node, ast.Call) and _name(node) in WRAPPED:
            prefix, suffix, index = WRAPPED[_name(node)]
            if len(node.args) > index and (text := _template(node.args[index])) is not None:
                found.append(Message(_clean(prefix + text + suffix), f"{relative}:{node.lineno}"))
        elif isinstance(node, ast.Call) and (_name(node) in ERROR_CLASSES or (relative, _name(node)) in MESSAGE_CALLS):
            for arg in node.args:
                add(arg, node.lineno)
        elif isinstance(node, ast.FunctionDef) and (relative, node.name) in MESSAGE_FUNCTIONS:
            for inner in ast.walk(node):
                if isinstance(inner, ast.Return) and inner.value is not None:
                    add(inner.value, inner.lineno)
    return found


def boot_script_messages(path: Path) -> list[Message]:
    """`fail "..."` in a shell script: `$(...)`, `${...}` and `$VAR` are filled in at boot."""
    relative = path.relative_to(REPO).as_posix()
    found = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for match in re.finditer(r'\bfail "((?:\$\((?:[^()]|\([^()]*\))*\)|[^"\\]|\\.)*)"', line):
            text = re.sub(r"\$\((?:[^()]|\([^()]*\))*\)|\$\{[^}]*\}|\$[A-Za-z_][A-Za-z_0-9]*", GAP, match[1])
            found.append(Message(_clean(text), f"{relative}:{number}"))
    return found


def messages() -> list[Message]:
    """Every template, in file order, each once (the first place that builds it)."""
    sources = [REPO / "tasks.py", *sorted((REPO / "tfcluster").rglob("*.py")),
               *(REPO / path for path in sorted({path for path, _ in MESSAGE_CALLS}))]
    found = [m for path in sources for m in python_messages(path)]
    found += [m for path in sorted((REPO / "startup").glob("*.sh")) for m in boot_script_messages(path)]
    unique: dict[str, Message] = {}
    for message in found:
        unique.setdefault(message.template, message)
    return list(unique.values())


def documented_text(markdown: str) -> str:
    """The page's text with whitespace collapsed, where a template is looked for."""
    return re.sub(r"\s+", " ", markdown)


def missing(markdown: str, found: list[Message]) -> list[Message]:
    text = documented_text(markdown)
    return [m for m in found if m.template not in text]


def main(argv: list[str]) -> int:
    found = messages()
    if "--missing" in argv:
        lacking = missing(TROUBLESHOOTING.read_text(), found)
        for message in lacking:
            print(f"{message.where}\n    {message.template}")
        return 1 if lacking else 0
    for message in found:
        print(f"{message.where}\t{message.template}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
