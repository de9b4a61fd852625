"""Google's discovery documents as the world's contract: every REST stand-in checks each request
it gets, and each answer it gives, against the document of the API it plays.

The documents are the JSON files google-api-python-client ships (hash-pinned in
requirements/test.lock) in googleapiclient/discovery_cache/documents/; they are read as JSON,
nothing of the package is imported (../shared/notes/google-descriptions.md). A document is parsed
once per process (compute.v1.json is 5 MB, about 0.1 s).

A request is Google's to refuse when (each answer in Google's words, sources below):
- no method of the document has its verb and path: 404 "Method not found." (what Google's front
  end answers for a path it does not route);
- a path parameter breaks its `pattern`: Compute's 400 "Invalid value for field 'instance':
  'instance-'. Must be a match of regex '...'" (googleapis/... rapid7/insightconnect-plugins#751
  quotes it for instances.start); elsewhere the path routes nowhere (404);
- a query parameter is neither the method's nor one of Google's system parameters: 400 "Invalid
  JSON payload received. Unknown name \\"x\\": Cannot bind query parameter. Field 'x' could not be
  found in request message." (the front end's text, quoted verbatim in many clients' tests);
- a body field is not in the request schema, at any depth: 400 "Invalid JSON payload received.
  Unknown name \\"x\\" at 'service_account': Cannot find field." with a google.rpc.BadRequest
  fieldViolation per field (e.g. google-marketing-solutions/dv360-api-appsscript-samples#7,
  decolua/9router#1876 for the root-level form without "at");
- a value has the wrong JSON type or is not one of its enum's values: 400 "Invalid value at
  'instance.data_api_access' (type.googleapis.com/....Instance.DataApiAccess), \\"ALLOW_DATA_API\\""
  and "Invalid value at '...' (TYPE_STRING), 0" (google-gemini/gemini-cli#4415). Compute's enums
  are strings in its protos, so Compute itself refuses a bad one: "Invalid value for field
  'resource.scheduling.onHostMaintenance': 'MIGRATE'. ..." (its `Invalid value for field` form,
  aerospike-community/aerolab#503, hashicorp/boundary#5400);
- a POST/PUT/PATCH Compute method gets no body: "Required field 'resource' not specified"
  (googleapis/google-api-python-client#608); a required query parameter is missing: the same form.
Compute names the request body 'resource' in its errors ("Invalid value for field
'resource.labels'"), so its field paths start there.

Accepted as Google accepts them: the system parameters of the document's `parameters` and the
ones every Google front end takes (alt, $alt, prettyPrint, fields, key, quotaUser, userIp,
callback, access_token, oauth_token, upload_protocol, uploadType, $.xgafv, and their `$` forms);
`$alt=json;enum-encoding=int`, which the google-cloud clients' REST transports send, and the
integer enums (the value's index in the proto enum) they then send and read; int64 values as
JSON strings or numbers (proto3's JSON mapping, https://protobuf.dev/programming-guides/json/);
null for an unset field.

An answer is the world's to get right: a 2xx JSON answer must match the method's response schema
(no field the schema lacks, enum values from the enum, int64 as a string, types as described). A
world that answers otherwise has invented something; `violation()` records it, and the test that
saw it fails (tests/conftest.py, at teardown), whatever the product made of the answer. Requests
that break the contract are recorded too: a product that sends one has a defect even where it
tolerates Google's 400.
"""

from __future__ import annotations

import importlib.util
import json
import re
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

# Google's system parameters: what every API's front end accepts beside the method's own
# (https://cloud.google.com/apis/docs/system-parameters), in their plain and `$` forms.
SYSTEM_PARAMETERS = {"alt", "fields", "key", "quotaUser", "userIp", "prettyPrint", "callback", "access_token",
                     "oauth_token", "upload_protocol", "uploadType", "$.xgafv", "trace", "$trace",
                     "requiredFields", "$alt", "$fields", "$prettyPrint", "$callback", "$key", "$quotaUser"}
INT64 = {"int64", "uint64"}
# The proto package of each API, for the enum type its ESF errors name.
PROTO_PACKAGES = {"compute": "google.cloud.compute.v1", "storage": "google.storage.v1",
                  "iam": "google.iam.admin.v1", "iamcredentials": "google.iam.credentials.v1",
                  "artifactregistry": "google.devtools.artifactregistry.v1", "cloudbilling": "google.cloud.billing.v1",
                  "serviceusage": "google.api.serviceusage.v1", "orgpolicy": "google.cloud.orgpolicy.v2"}

_lock = threading.Lock()
VIOLATIONS: list[str] = []


def violation(text: str) -> None:
    """Record a break of Google's description; the running test fails on it at teardown."""
    with _lock:
        VIOLATIONS.append(text)


def take_violations() -> list[str]:
    """The violations recorded so far, forgotten once read."""
    with _lock:
        found = list(VIOLATIONS)
        VIOLATIONS.clear()
    return found


def documents_dir() -> Path:
    spec = importlib.util.find_spec("googleapiclient")  # Locates the package without importing it.
    return Path(list(spec.submodule_search_locations)[0]) / "discovery_cache" / "documents"


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


@dataclass
class Route:
    regex: re.Pattern
    method: dict
    names: list[str]  # The path parameters, in the order of the regex's groups.
    literal: int  # Characters of the path that are not placeholders: more is more specific.


@dataclass
class Call:
    """A request the document routes: the method, its parameters, and what the client asked."""
    api: "Api"
    method: dict
    path_params: dict
    query: dict
    body: object = None

    @property
    def id(self) -> str:
        return self.method["id"]

    @property
    def scopes(self) -> list[str]:
        """The OAuth scopes any one of which lets a token make this call (the method's `scopes`)."""
        return list(self.method.get("scopes", []))

    @property
    def int_enums(self) -> bool:
        """The client asked for enums as numbers (`$alt=json;enum-encoding=int`)."""
        return any("enum-encoding=int" in value for key in ("$alt", "alt") for value in self.query.get(key, []))


@dataclass
class Problem:
    path: list  # Field names (str) and list indexes (int) from the body's root.
    kind: str  # "unknown", "enum", "type", "int64"
    value: object = None
    detail: str = ""


@dataclass
class Api:
    name: str  # e.g. "compute.v1"
    doc: dict
    routes: dict = field(default_factory=dict)  # verb -> [Route], most specific first.

    @property
    def service(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def compute(self) -> bool:
        return self.service == "compute"

    @property
    def schemas(self) -> dict:
        return self.doc.get("schemas", {})

    def __post_init__(self):
        base = "/" + self.doc.get("servicePath", "").lstrip("/") if self.doc.get("servicePath") else \
            self.doc.get("basePath", "/")
        for method in _methods(self.doc.get("resources", {})):
            paths = [base.rstrip("/") + "/" + method["path"]]
            for protocol in (method.get("mediaUpload") or {}).get("protocols", {}).values():
                paths.append(protocol["path"])
            for path in paths:
                names, pattern, literal, position = [], "", 0, 0
                for match in re.finditer(r"\{(\+?)([^}]+)\}", path):
                    text = path[position:match.start()]
                    pattern += re.escape(text)
                    literal += len(text)
                    pattern += "(.+)" if match[1] else "([^/]+)"
                    names.append(match[2])
                    position = match.end()
                pattern += re.escape(path[position:])
                literal += len(path) - position
                self.routes.setdefault(method["httpMethod"], []).append(
                    Route(re.compile(pattern), method, names, literal))
        for routes in self.routes.values():
            routes.sort(key=lambda route: -route.literal)

    # -- Requests ---------------------------------------------------------------------------

    def resolve(self, verb: str, path: str, query: dict, body) -> tuple[Call | None, tuple[int, dict] | None]:
        """(the call, None) for a request Google would take, or (None or the call, Google's refusal)."""
        from urllib.parse import unquote

        refused = None
        for route in self.routes.get(verb, []):
            match = route.regex.fullmatch(path)
            if match is None:
                continue
            params = dict(zip(route.names, (unquote(group) for group in match.groups())))
            bad = self._bad_path_parameter(route.method, params)
            if bad is None:
                call = Call(self, route.method, params, query, body)
                return call, self._check_call(call, verb)
            refused = refused or bad
        if refused is not None and self.compute:
            violation(f"{self.name}: {verb} {path}: {refused[1]['error']['message']}")
            return None, refused
        violation(f"{self.name}: no method for {verb} {path}")
        return None, (404, {"error": {"code": 404, "message": "Method not found.", "status": "NOT_FOUND"}})

    def _bad_path_parameter(self, method: dict, params: dict) -> tuple[int, dict] | None:
        for name, value in params.items():
            pattern = (method.get("parameters", {}).get(name) or {}).get("pattern")
            if pattern and not re.fullmatch(pattern.removeprefix("^").removesuffix("$"), value):
                return self._compute_invalid(f"Invalid value for field '{name}': '{value}'. Must be a match of "
                                             f"regex '{pattern}'", name)
        return None

    def _check_call(self, call: Call, verb: str) -> tuple[int, dict] | None:
        method, messages, fields = call.method, [], []
        parameters = method.get("parameters", {})
        for key, values in call.query.items():
            spec = parameters.get(key)
            if key in SYSTEM_PARAMETERS or key in self.doc.get("parameters", {}):
                system = self.doc.get("parameters", {})
                spec = system.get(key) or system.get(key.removeprefix("$"))
                if key.lstrip("$") == "alt":
                    bad = [v for v in values if v.split(";")[0] not in ("json", "media", "proto", "sse")]
                    if bad:
                        messages.append(self._enum_text([key], bad[0], method))
                        fields.append(key)
                    continue
                if spec is None:
                    continue
            elif spec is None or spec.get("location") != "query":
                messages.append(f"Invalid JSON payload received. Unknown name \"{key}\": Cannot bind query parameter. "
                                f"Field '{key}' could not be found in request message.")
                fields.append(key)
                continue
            for value in values:
                problem = _query_problem(spec, value)
                if problem:
                    detail = "" if problem == "enum" else _type_name(spec)
                    messages.append(self._problem_text(Problem([key], problem, value, detail), method, query=True))
                    fields.append(key)
        for name, spec in parameters.items():
            if spec.get("required") and spec.get("location") == "query" and name not in call.query:
                messages.append(f"Required field '{name}' not specified")
                fields.append(name)
        request = method.get("request")
        body = call.body
        if request and body is None and verb in ("POST", "PUT", "PATCH") and self.compute:
            messages.append("Required field 'resource' not specified")
            fields.append("resource")
        elif request and body is not None:
            problems: list[Problem] = []
            _walk(self, request, body, [], problems, request_side=True, int_enums=True)
            for problem in problems:
                messages.append(self._problem_text(problem, method))
                fields.append(self._path_text(problem.path, method))
        elif not request and isinstance(body, dict) and body:
            for key in body:
                messages.append(f"Invalid JSON payload received. Unknown name \"{key}\": Cannot find field.")
                fields.append("")
        if not messages:
            return None
        violation(f"{self.name}: {method['id']}: " + "; ".join(messages))
        return self._bad_request(messages, fields)

    def _root(self, method: dict) -> str:
        """The name Google gives the request body in a field path: Compute's 'resource'; for the
        others the body's message field (snake_case of its schema), none when the whole request
        message is the body (a *Request schema)."""
        if self.compute:
            return "resource"
        ref = (method.get("request") or {}).get("$ref", "")
        return "" if ref.endswith("Request") else _snake(ref)

    def _path_text(self, path: list, method: dict, camel: bool = False) -> str:
        text = self._root(method)
        for part in path:
            if isinstance(part, int):
                text += f"[{part}]"
            else:
                text += ("." if text else "") + (part if camel else _snake(part))
        return text

    def _problem_text(self, problem: Problem, method: dict, query: bool = False) -> str:
        where = ".".join(str(p) for p in problem.path) if query else self._path_text(problem.path, method)
        if problem.kind == "unknown":
            parent = self._path_text(problem.path[:-1], method)
            return (f"Invalid JSON payload received. Unknown name \"{problem.path[-1]}\""
                    + (f" at '{parent}'" if parent else "") + ": Cannot find field.")
        if problem.kind == "enum":
            return self._enum_text(problem.path if query else None, problem.value, method, problem)
        return f"Invalid value at '{where}' ({problem.detail}), {json.dumps(problem.value)}"

    def _enum_text(self, query_path, value, method: dict, problem: Problem | None = None) -> str:
        if self.compute:
            where = ".".join(map(str, query_path)) if query_path else \
                self._path_text(problem.path, method, camel=True)
            return f"Invalid value for field '{where}': '{value}'."
        where = ".".join(map(str, query_path)) if query_path else self._path_text(problem.path, method)
        enum_type = f"type.googleapis.com/{PROTO_PACKAGES.get(self.service, self.service)}." + \
            (problem.detail if problem else "")
        return f"Invalid value at '{where}' ({enum_type}), {json.dumps(value)}"

    def _compute_invalid(self, message: str, where: str) -> tuple[int, dict]:
        return 400, {"error": {"code": 400, "message": message,
                               "errors": [{"message": message, "domain": "global", "reason": "invalid"}]}}

    def _bad_request(self, messages: list[str], fields: list[str]) -> tuple[int, dict]:
        message = "\n".join(messages)
        error = {"code": 400, "message": message, "status": "INVALID_ARGUMENT",
                 "details": [{"@type": "type.googleapis.com/google.rpc.BadRequest", "fieldViolations": [
                     {**({"field": f} if f else {}), "description": m} for f, m in zip(fields, messages)]}]}
        if self.compute or self.service == "storage":  # Their JSON errors also carry the v1 errors[] list.
            error["errors"] = [{"message": m, "domain": "global", "reason": "invalid"} for m in messages]
        return 400, {"error": error}

    # -- Responses --------------------------------------------------------------------------

    def check_response(self, call: Call, code: int, payload) -> list[str]:
        """Record (and return) where a 2xx answer leaves the method's response schema."""
        response = call.method.get("response")
        if not 200 <= code < 300 or response is None or payload is None:
            return []
        problems: list[Problem] = []
        _walk(self, response, payload, [], problems, request_side=False, int_enums=call.int_enums)
        found = []
        for problem in problems:
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in problem.path).lstrip(".") or "(root)"
            found.append(f"{self.name} ({self.doc.get('revision', '?')}): the world's {call.id} answer has "
                         f"'{where}' = {json.dumps(problem.value)[:80]}: {problem.detail}")
        for text in found:
            violation(text)
        return found


def _methods(resources: dict):
    for resource in resources.values():
        yield from resource.get("methods", {}).values()
        yield from _methods(resource.get("resources", {}))


def _query_problem(spec: dict, value: str) -> str | None:
    kind, fmt = spec.get("type"), spec.get("format")
    if "enum" in spec:
        return None if value in spec["enum"] or (value.isdigit() and int(value) < len(spec["enum"])) else "enum"
    if kind == "integer" or fmt in INT64:
        return None if re.fullmatch(r"-?\d+", value) else "type"
    if kind == "boolean":
        return None if value.lower() in ("true", "false", "1", "0") else "type"
    return None


def _type_name(spec: dict) -> str:
    """The proto scalar type Google's front end names in a type error (TYPE_UINT32, ...)."""
    fmt = spec.get("format")
    if fmt in ("int32", "uint32", "int64", "uint64", "float", "double"):
        return f"TYPE_{fmt.upper()}"
    return SCALARS.get(spec.get("type"), SCALARS["string"])[0]


def _walk(api: Api, schema: dict, value, path: list, problems: list[Problem], request_side: bool,
          int_enums: bool, owner: str = "") -> None:
    """Append to ``problems`` where ``value`` leaves ``schema`` (a discovery schema or {"$ref"})."""
    if "$ref" in schema:
        owner = schema["$ref"]
        schema = api.schemas.get(owner, {})
    if value is None:
        return  # JSON null: the field is unset.
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        if not isinstance(value, dict):
            problems.append(Problem(path, "type", value, "TYPE_MESSAGE" if request_side else
                                    f"{owner or 'object'} must be a JSON object"))
            return
        properties, extra = schema.get("properties", {}), schema.get("additionalProperties")
        for key, item in value.items():
            if key in properties:
                _walk(api, properties[key], item, path + [key], problems, request_side, int_enums, owner)
            elif extra is not None:
                _walk(api, extra, item, path + [key], problems, request_side, int_enums, owner)
            else:
                problems.append(Problem(path + [key], "unknown", item,
                                        f"{owner or 'this object'} has no field '{key}'"))
        return
    if kind == "array":
        if not isinstance(value, list):
            problems.append(Problem(path, "type", value, "TYPE_MESSAGE" if request_side else "must be a JSON array"))
            return
        for index, item in enumerate(value):
            _walk(api, schema.get("items", {}), item, path + [index], problems, request_side, int_enums, owner)
        return
    fmt = schema.get("format")
    if "enum" in schema:
        values = schema["enum"]
        name = path[-1] if path and isinstance(path[-1], str) else (path[-2] if len(path) > 1 else "")
        enum_type = f"{owner}.{str(name)[:1].upper()}{str(name)[1:]}"
        if isinstance(value, str) and value in values:
            return
        if isinstance(value, int) and not isinstance(value, bool) and int_enums and 0 <= value < len(values):
            return
        problems.append(Problem(path, "enum", value, enum_type if request_side else
                                f"not one of {owner}.{name}'s {len(values)} values" + (
                                    "" if len(values) > 12 else f" {values}")))
        return
    scalar = "int64" if kind == "string" and fmt in INT64 else kind
    if scalar in SCALARS and not _scalar_ok(scalar, value, request_side):
        request_text, response_text = SCALARS[scalar]
        problems.append(Problem(path, "type", value, request_text if request_side else response_text.format(fmt=fmt)))


# JSON scalar kinds: the proto type the front end names in a request's error, and what an answer
# must be (proto3's JSON mapping, https://protobuf.dev/programming-guides/json/: int64 as a string).
SCALARS = {"int64": ("TYPE_INT64", "an {fmt} is a JSON string of digits"),
           "string": ("TYPE_STRING", "must be a JSON string"), "integer": ("TYPE_INT32", "must be a JSON integer"),
           "number": ("TYPE_DOUBLE", "must be a JSON number"), "boolean": ("TYPE_BOOL", "must be true or false")}
DIGITS = re.compile(r"-?\d+")


def _scalar_ok(kind: str, value, request_side: bool) -> bool:
    """A request may carry an int64 or an integer as a number or a string of digits, and a number
    as a string; an answer says int64 as a string, the others as themselves."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    digits = isinstance(value, str) and bool(DIGITS.fullmatch(value))
    if kind == "int64":
        return digits or (request_side and number and isinstance(value, int))
    if kind == "integer":
        return (number and isinstance(value, int)) or (request_side and digits)
    if kind == "number":
        return number or (request_side and isinstance(value, str) and (
            value in ("NaN", "Infinity", "-Infinity") or bool(re.fullmatch(r"-?\d+(\.\d+)?([eE][-+]?\d+)?", value))))
    if kind == "boolean":
        return isinstance(value, bool)
    return isinstance(value, str)


@lru_cache(maxsize=None)
def api(name: str) -> Api:
    """The document ``name`` (e.g. "compute.v1"), parsed once per process."""
    with open(documents_dir() / f"{name}.json") as handle:
        return Api(name, json.load(handle))


class KillSwitch:
    """The fault sweep's hook (tests/test_crash_sweep.py), shared by every REST stand-in since each
    checks its requests here: it numbers the requests the world receives from the moment it is armed,
    and when request k+1 arrives it first SIGKILLs the armed process group, so the command dies right
    after its k-th request was answered. Request k+1 is then served as Google serves one whose sender
    is gone: what it asked for happens, and nobody hears the answer."""

    def __init__(self):
        self._lock = threading.Lock()
        self.pgid = 0
        # Kill right after the after-th request, or after the first whose "VERB path" starts so (None: never).
        self.after: int | str | None = None
        # "VERB path" of each request since arm(), in arrival order.
        self.seen: list[str] = []
        # The request after which the group was killed ("" while none was).
        self.killed_after = ""
        # What the group was running when it was killed ("terraform apply", "terraform-provider-google",
        # "ssh", "python -m tfcluster" ...): where in the command the kill landed.
        self.killed_during: list[str] = []

    def arm(self, after: int | str | None) -> None:
        """Count from now; kill the group set by ``target`` right after request ``after`` (None: count only)."""
        with self._lock:
            self.pgid, self.after, self.seen, self.killed_after, self.killed_during = 0, after, [], "", []

    def target(self, pgid: int) -> None:
        with self._lock:
            self.pgid = pgid

    def disarm(self) -> list[str]:
        with self._lock:
            self.after, self.pgid = None, 0
            return list(self.seen)

    def received(self, verb: str, path: str) -> None:
        import os
        import signal

        with self._lock:
            self.seen.append(f"{verb} {path}")
            if isinstance(self.after, str) and self.seen[-1].startswith(self.after):
                self.after = len(self.seen)  # A named point: right after the first request so named.
            elif isinstance(self.after, int) and self.pgid and len(self.seen) == self.after + 1:
                self.killed_after = self.seen[-2] if len(self.seen) > 1 else "(start)"
                self.killed_during = group_commands(self.pgid)
                try:
                    os.killpg(self.pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.after = None


def group_commands(pgid: int) -> list[str]:
    """What process group ``pgid`` runs, by /proc (proc(5): stat's fifth field is the group): each
    process as its program and, for terraform and python, its first word ("terraform apply", "python -m
    invoke"), a script as its own name ("terraform-provider-google"), sorted, without repeats."""
    import os

    found = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{entry}/stat").read()
            if int(stat.rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            argv = open(f"/proc/{entry}/cmdline", "rb").read().decode(errors="replace").split("\0")
        except (OSError, ValueError, IndexError):
            continue  # Gone meanwhile, or not a process.
        program = os.path.basename(argv[0]) if argv and argv[0] else ""
        words = [word for word in argv[1:] if word and not word.startswith("-chdir")]
        if program.startswith("python") and words[:1] == ["-m"]:
            found.add(f"python -m {words[1] if len(words) > 1 else ''}".strip())
        elif program.startswith("python") and words and not words[0].startswith("-"):
            # A script run by its shebang, as the provider stand-ins are (tests/world/provider/mirror.py).
            found.add(os.path.basename(words[0]).split("_v")[0])
        elif program == "terraform" and words:
            found.add(f"terraform {words[0]}")
        elif program:
            found.add(program.split("_v")[0])  # terraform-provider-google_v7.46.1_x5 -> terraform-provider-google
    return sorted(found)


KILL_SWITCH = KillSwitch()


def check(name: str, verb: str, path: str, query: dict, body) -> tuple[Call | None, tuple[int, dict] | None]:
    """(the call, None) when API ``name``'s document takes this request, else (call or None,
    Google's refusal); a refusal is recorded as a violation."""
    KILL_SWITCH.received(verb, path)
    return api(name).resolve(verb, path, query, body)


def serve(name: str, verb: str, path: str, query: dict, body, answer) -> tuple[int, dict]:
    """A stand-in's request under API ``name``'s contract: Google's 400 (or 404) for a request the
    document refuses, else ``answer(call)`` -> (status, payload), whose 2xx payload is checked
    against the method's response schema (a mismatch is recorded; the answer goes out as it is)."""
    call, refused = check(name, verb, path, query, body)
    if refused is not None:
        return refused
    code, payload = answer(call)
    call.api.check_response(call, code, payload)
    return code, payload
