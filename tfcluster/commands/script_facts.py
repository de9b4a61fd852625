"""What a user's script sets that its summary needs, read from its code: the global batch and the
learning rate. A script reports neither (the bundled trainer's strategy event does), and it runs
unchanged, so the launcher reads them where TensorFlow's tutorial writes them down:

- the global batch: ``.batch(X)`` on its dataset, or ``fit(..., batch_size=X)`` with arrays;
- the learning rate: ``SGD(learning_rate=X)`` (any ``tf.keras`` optimizer), or a named optimizer
  (``optimizer="adam"``) at Keras's default rate.

``X`` is evaluated only from what is known before the run: numbers, names assigned once, ``* + - //``,
``args.<flag>`` from the script's argparse defaults and the arguments after ``--``, the worker count
(``sum(len(t) for t in tf_config["cluster"].values())``; the tutorial's ``len(...['worker'])``, one
short), ``strategy.num_replicas_in_sync`` and ``tfcluster.replica_count()``. Anything else (a value
read from a file, a schedule object) is not guessed: the figure stays n/a and says why.

May import: nothing of tfcluster (the script's text in, numbers out).
"""

from __future__ import annotations

import ast
import operator

# Keras's default learning rate of each optimizer a script may name by string (keras.optimizers.get):
# tf_keras/src/optimizers/{sgd,adam,...}.py, `learning_rate=` default of each __init__.
DEFAULT_RATES = {"sgd": 0.01, "adam": 0.001, "adamw": 0.001, "rmsprop": 0.001, "adagrad": 0.001,
                 "adadelta": 0.001, "adamax": 0.001, "nadam": 0.001, "ftrl": 0.001}
_OPERATORS = {ast.Mult: operator.mul, ast.Add: operator.add, ast.Sub: operator.sub, ast.FloorDiv: operator.floordiv,
              ast.Div: operator.truediv}


class _Reader:
    def __init__(self, tree: ast.AST, script_args: list[str], workers: int, replicas: int):
        self.nodes = list(ast.walk(tree))
        self.workers, self.replicas = workers, replicas
        assigned: dict[str, list[ast.AST]] = {}
        for node in self.nodes:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                assigned.setdefault(node.targets[0].id, []).append(node.value)
        self.names = {name: values[0] for name, values in assigned.items() if len(values) == 1}
        self.flags = self._flags(script_args)

    def _flags(self, script_args: list[str]) -> dict[str, object]:
        """argparse's dest -> value: each add_argument's default, then the script's own arguments."""
        flags: dict[str, object] = {}
        for node in self.nodes:
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument"):
                continue
            options = [arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
            longs = [option for option in options if option.startswith("--")] or options[:1]
            keywords = {keyword.arg: keyword.value for keyword in node.keywords}
            if not longs:
                continue
            dest = keywords["dest"].value if isinstance(keywords.get("dest"), ast.Constant) else \
                longs[0].lstrip("-").replace("-", "_")
            cast = keywords.get("type")
            cast = {"int": int, "float": float}.get(cast.id) if isinstance(cast, ast.Name) else None
            default = keywords.get("default")
            if isinstance(default, ast.Constant):
                flags[dest] = default.value
            for index, word in enumerate(script_args):
                text = None
                for option in options:
                    if word == option and index + 1 < len(script_args):
                        text = script_args[index + 1]
                    elif word.startswith(option + "="):
                        text = word.split("=", 1)[1]
                if text is not None:
                    try:
                        flags[dest] = (cast or _number)(text)
                    except ValueError:
                        flags[dest] = text
        return flags

    def value(self, node: ast.AST, depth: int = 0):
        """The number ``node`` stands for, or None when it is not known before the run."""
        if depth > 20:
            return None
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.Name):
            bound = self.names.get(node.id)
            return self.value(bound, depth + 1) if bound is not None else None
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = self.value(node.left, depth + 1), self.value(node.right, depth + 1)
            if left is None or right is None or (right == 0 and isinstance(node.op, (ast.Div, ast.FloorDiv))):
                return None
            return _OPERATORS[type(node.op)](left, right)
        if isinstance(node, ast.Attribute):
            if node.attr == "num_replicas_in_sync":
                return self.replicas
            found = self.flags.get(node.attr)
            return found if type(found) in (int, float) else None
        if isinstance(node, ast.Call):
            return self._call(node)
        return None

    def _call(self, node: ast.Call):
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name == "replica_count":
            return self.replicas
        if name in ("int", "float") and node.args:
            return self.value(node.args[0])
        inner = node.args[0] if node.args else None
        if name == "len" and isinstance(inner, ast.Subscript) and _key(inner.slice) == "worker":
            return self.workers - 1  # The tutorial's count: TF_CONFIG names the chief apart.
        if name == "sum" and isinstance(inner, ast.GeneratorExp) and "'cluster'" in ast.unparse(inner).replace('"', "'"):
            return self.workers  # Every task of TF_CONFIG's cluster, the chief included.
        return None

    def global_batch(self) -> int | None:
        for node in self.nodes:
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "fit":
                sized = [keyword.value for keyword in node.keywords if keyword.arg == "batch_size"]
                if sized and isinstance(found := self.value(sized[0]), int) and found > 0:
                    return found
        for node in self.nodes:
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "batch"
                    and node.args and isinstance(found := self.value(node.args[0]), int) and found > 0):
                return found
        return None

    def learning_rate(self) -> dict | None:
        for node in self.nodes:
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name.lower() in DEFAULT_RATES:
                given = [keyword.value for keyword in node.keywords if keyword.arg in ("learning_rate", "lr")]
                given = given or node.args[:1]
                if not given:
                    return _rate(DEFAULT_RATES[name.lower()], f"{name}'s default, read from the script's code")
                found = self.value(given[0])
                if found is None:
                    return {"text": f"n/a: the script's {name}(learning_rate={ast.unparse(given[0])}) is known only "
                                    "as it runs"}
                return _rate(found, f"the script's {name}(learning_rate={ast.unparse(given[0])}), read from its code")
            named = [keyword.value for keyword in node.keywords if keyword.arg == "optimizer"]
            if named and isinstance(named[0], ast.Constant) and str(named[0].value).lower() in DEFAULT_RATES:
                rate = DEFAULT_RATES[str(named[0].value).lower()]
                return _rate(rate, f"Keras's default for optimizer={named[0].value!r}, read from the script's code")
        return None


def _rate(value: float, where: str) -> dict:
    return {"value": value, "text": f"{value:g} ({where})"}


def _key(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _number(text: str):
    try:
        return int(text)
    except ValueError:
        return float(text)


def read(text: str, script_args: list[str], workers: int, replicas: int) -> dict:
    """{"global_batch": images per step or None, "learning_rate": {"value", "text"} or None} of a
    script run with ``script_args`` on ``workers`` workers of ``replicas`` replicas in sync."""
    try:
        reader = _Reader(ast.parse(text), list(script_args), workers, replicas)
    except (SyntaxError, ValueError, RecursionError):
        return {"global_batch": None, "learning_rate": None}
    return {"global_batch": reader.global_batch(), "learning_rate": reader.learning_rate()}
