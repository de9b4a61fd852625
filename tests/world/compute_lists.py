"""Compute's lists as Google serves them: pages and filters (served by tests/fake_compute.py and
tests/world/compute_resources.py).

- Pages: "maxResults: The maximum number of results per page ... If the number of available
  results is larger than maxResults, Compute Engine returns a nextPageToken that can be used to
  get the next page of results in subsequent list requests. Acceptable values are 0 to 500,
  inclusive. (Default: 500)" (compute.v1.json, every list method). A server may return fewer than
  asked (https://google.aip.dev/158): the world's ``page_limit`` is that cap, lowered by tests that
  must see a client read every page. A page token the server did not make is 400 invalid.
- Filters (the `filter` parameter's description in compute.v1.json): AIP-160 comparisons
  `field op value` with `=`, `!=`, `>`, `<`, `<=`, `>=`, `:` (has; `labels.owner:*`), nested fields
  (`scheduling.automaticRestart = false`, `labels.key = value`), parenthesised expressions joined
  by AND (the default) or OR; or the regular-expression form `field eq|ne literal`, whose literal
  must match the whole field; "these two types of filter expressions cannot be mixed in one
  request". A field the listed resource does not have, or anything that does not parse, is 400
  "Invalid value for field 'filter': '...'. Invalid list filter expression." (reason invalid:
  googleapis/nodejs-compute#48, googleapis/google-cloud-go#11318, prometheus/prometheus#5499).
"""

from __future__ import annotations

import fnmatch
import re

from tests.world import discovery

TOKEN = re.compile(r'\s*(?:(?P<paren>[()])|(?P<string>"(?:[^"\\]|\\.)*"|\'[^\']*\')'
                   r'|(?P<op><=|>=|!=|=|<|>|:)|(?P<word>[^\s()=!<>:"\']+))')


class FilterError(ValueError):
    pass


def refusal(expression: str) -> tuple[int, dict]:
    message = f"Invalid value for field 'filter': '{expression}'. Invalid list filter expression."
    return 400, {"error": {"code": 400, "message": message,
                           "errors": [{"message": message, "domain": "global", "reason": "invalid"}]}}


def _tokens(expression: str) -> list[tuple[str, str]]:
    found, position = [], 0
    while position < len(expression):
        if not expression[position:].strip():
            break
        match = TOKEN.match(expression, position)
        if match is None:
            raise FilterError(expression)
        kind = match.lastgroup
        found.append((kind, match[kind]))
        position = match.end()
    return found


def parse(expression: str, schema: str) -> list:
    """The filter as a tree: ("and"|"or", [parts]) and ("cmp", field path, op, value); FilterError
    when it does not parse, mixes the two forms, or names a field ``schema`` lacks."""
    tokens = _tokens(expression)
    position = 0

    def comparison():
        nonlocal position
        if position + 3 > len(tokens):
            raise FilterError(expression)
        (kind, field), (op_kind, op), (value_kind, value) = tokens[position:position + 3]
        if kind != "word" or value_kind not in ("word", "string"):
            raise FilterError(expression)
        if op_kind == "op":
            form = "aip160"
        elif op_kind == "word" and op in ("eq", "ne"):
            form = "regex"
        else:
            raise FilterError(expression)
        position += 3
        if value_kind == "string":
            value = value[1:-1]
        path = field.split(".")
        _check_field(schema, path, expression)
        return ("cmp", path, op, value, form)

    def expression_list():
        nonlocal position
        parts, joiner = [], "and"
        while position < len(tokens):
            kind, text = tokens[position]
            if kind == "paren" and text == ")":
                break
            if kind == "word" and text in ("AND", "OR"):
                if not parts:
                    raise FilterError(expression)
                joiner = "or" if text == "OR" else joiner
                position += 1
                continue
            if kind == "paren":
                position += 1
                parts.append(expression_list())
                if position >= len(tokens) or tokens[position] != ("paren", ")"):
                    raise FilterError(expression)
                position += 1
            else:
                parts.append(comparison())
        if not parts:
            raise FilterError(expression)
        return (joiner, parts)

    tree = expression_list()
    if position != len(tokens):
        raise FilterError(expression)
    forms = {node[4] for node in _comparisons(tree)}
    if len(forms) > 1:
        raise FilterError(expression)  # "cannot be mixed in one request".
    if forms == {"regex"} and tree != ("and", [tree[1][0]]) and (
            any(t == ("word", "AND") or t == ("word", "OR") for t in tokens)
            or any(part[0] == "cmp" for part in tree[1])):
        raise FilterError(expression)  # One bare expression, or parenthesised ones side by side.
    return tree


def _comparisons(tree):
    if tree[0] == "cmp":
        yield tree
    else:
        for part in tree[1]:
            yield from _comparisons(part)


def _check_field(schema: str, path: list[str], expression: str) -> None:
    api = discovery.api("compute.v1")
    node = api.schemas.get(schema, {})
    for name in path:
        if "$ref" in node:
            node = api.schemas.get(node["$ref"], {})
        if "properties" in node and name in node["properties"]:
            node = node["properties"][name]
        elif "additionalProperties" in node:  # A map's key (labels.KEY).
            node = node["additionalProperties"]
        else:
            raise FilterError(expression)


def _value(item: dict, path: list[str]):
    for name in path:
        if not isinstance(item, dict) or name not in item:
            return None
        item = item[name]
    return item


def _matches(tree, item: dict) -> bool:
    if tree[0] == "and":
        return all(_matches(part, item) for part in tree[1])
    if tree[0] == "or":
        return any(_matches(part, item) for part in tree[1])
    _, path, op, wanted, form = tree
    value = _value(item, path)
    text = "" if value is None else (str(value).lower() if isinstance(value, bool) else str(value))
    if form == "regex":
        found = re.fullmatch(wanted, text) is not None
        return found if op == "eq" else not found
    if op == ":":
        return value is not None if wanted == "*" else wanted in text
    if op in ("=", "!="):
        equal = value is not None and fnmatch.fnmatchcase(text, wanted)
        return equal if op == "=" else not equal
    try:
        left, right = float(text), float(wanted)
    except ValueError:
        left, right = text, wanted
    return value is not None and {"<": left < right, ">": left > right, "<=": left <= right, ">=": left >= right}[op]


def select(items: list[dict], query: dict, schema: str) -> list[dict]:
    """The items a list's `filter` keeps (all without one); FilterError for Google's 400."""
    expression = (query.get("filter") or [""])[0]
    if not expression.strip():
        return items
    tree = parse(expression, schema)
    return [item for item in items if _matches(tree, item)]


def page(state, items: list, query: dict, key: str = "items") -> dict:
    """One page of ``items`` by maxResults / pageToken, with nextPageToken while more remain."""
    size = int((query.get("maxResults") or ["500"])[0] or 500) or 500
    size = min(size, 500, getattr(state, "page_limit", 500))
    token = (query.get("pageToken") or [""])[0]
    if token and not re.fullmatch(r"p\d+", token):
        raise FilterError(token)
    start = int(token[1:]) if token else 0
    found = {key: items[start:start + size]}
    if start + size < len(items):
        found["nextPageToken"] = f"p{start + size}"
    return found


def listed(state, items: list[dict], query: dict, schema: str, answer: dict, key: str = "items") -> tuple[int, dict]:
    """A list's answer: ``answer`` (kind, id, ...) with the filtered page of ``items``."""
    try:
        kept = select(items, query, schema)
    except FilterError:
        return refusal((query.get("filter") or [""])[0])
    try:
        return 200, {**answer, **page(state, kept, query, key)}
    except FilterError as error:
        message = f"Invalid value for field 'pageToken': '{error}'."
        return 400, {"error": {"code": 400, "message": message,
                               "errors": [{"message": message, "domain": "global", "reason": "invalid"}]}}
