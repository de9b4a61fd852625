"""A Cloud Logging stand-in behind logging.googleapis.com: entries.list, as the product reads a
Vertex AI job's logs, fed by the replicas of the Vertex AI stand-in (tests/world/vertex.py).

Every request and answer goes through Google's discovery document, logging.v2.json
(tests/world/discovery.py): POST /v2/entries:list with a ListLogEntriesRequest body answers a
ListLogEntriesResponse. Modelled, with sources:
- **Paging** (ListLogEntriesRequest.pageSize, the document's own words): "Default is 50";
  "If the value is negative, the request is rejected"; the presence of nextPageToken "indicates
  that more results might be available", and its value is passed back as pageToken with the
  other parameters identical. The largest page is 1000 (https://cloud.google.com/logging/docs/reference/v2/rest/v2/entries/list).
- **Order**: orderBy "timestamp asc" (the default) or "timestamp desc", the only permitted values;
  "Entries with equal timestamps are returned in order of their insert_id values".
- **Filters**, the Logging query language (https://cloud.google.com/logging/docs/view/logging-query-language):
  comparisons FIELD OP VALUE with =, !=, <, <=, >, >=, : (has) and =~ (regular expression),
  joined by AND, OR, NOT and parentheses, adjacent comparisons meaning AND; timestamps compare as
  times, severities by rank. A filter the language cannot parse is a 400 INVALID_ARGUMENT (the
  API's status for a bad argument; the message's wording is not published, so it is this
  stand-in's).
- **Rate limit**: "Number of entries.list requests: 60 per minute, per Google Cloud project"
  (https://cloud.google.com/logging/quotas; its older form read "1 per second, per project").
  Over it the API answers 429 RESOURCE_EXHAUSTED and publishes no Retry-After header (the
  quotas page names none).
- **Ingestion delay**: an entry becomes readable a little after it is written (receiveTimestamp),
  not in timestamp order across sources: a reader that asks only for timestamps after the last
  one it saw loses lines. ``ingest_delays`` holds each log's delay in seconds.
- A request without a bearer token is 401 UNAUTHENTICATED; with the API disabled in the
  project, 403 SERVICE_DISABLED (tests/world/project_apis.py's switch).

What a Vertex AI job writes here, from Google's own tools and public transcripts: resource
{"type": "ml_job", "labels": {"job_id": the job's number, "project_id", "task_name": "service" or
"workerpool0-0", ...}} (gcloud's googlecloudsdk/command_lib/ai/log_util.py filters on exactly
resource.type="ml_job", resource.labels.job_id and resource.labels.task_name, and reads
jsonPayload.message, else textPayload); jsonPayload {"message", "attrs": {"tag": task}, "levelname"};
a container's stdout at severity INFO and its stderr at ERROR (transcripts of `gcloud ai
custom-jobs stream-logs`).
"""

from __future__ import annotations

import datetime
import json
import re
import threading
import time
from dataclasses import dataclass, field

from tests.world import compute_auth, discovery
from tests.world.http import JsonServer

LOGGING_NAMES = ("logging.googleapis.com",)
SEVERITIES = ["DEFAULT", "DEBUG", "INFO", "NOTICE", "WARNING", "ERROR", "CRITICAL", "ALERT", "EMERGENCY"]
READS_PER_MINUTE = 60
LARGEST_PAGE = 1000


def rfc3339(at: float) -> str:
    """A LogEntry timestamp: RFC 3339 UTC with nanoseconds' room (google-datetime)."""
    moment = datetime.datetime.fromtimestamp(at, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond:06d}000Z"


def parse_time(text: str) -> float:
    """Seconds since the epoch of an RFC 3339 time (any fraction length, Z or an offset)."""
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text)
    if match is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    base = datetime.datetime.fromisoformat(match[1] + ("+00:00" if match[3] == "Z" else match[3]))
    return base.timestamp() + float("0." + (match[2] or "0"))


@dataclass
class Written:
    """One entry as stored: the LogEntry and when it becomes readable."""

    entry: dict
    at: float  # Its timestamp, seconds.
    readable_at: float


@dataclass
class LoggingState:
    project: str
    # Every entry written, in write order.
    written: list = field(default_factory=list)
    # logName -> seconds an entry of that log takes to become readable (default: none).
    ingest_delays: dict = field(default_factory=dict)
    # Times of the entries.list requests of the last minute, per project (the rate limit).
    reads: dict = field(default_factory=dict)
    # Every entries.list body, for the tests to read.
    requests: list = field(default_factory=list)
    # Requests refused with 429, counted.
    throttled: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    sequence: int = 0

    def write(self, log_id: str, resource: dict, message: str, severity: str = "INFO", at: float | None = None) -> None:
        """What an agent's entries.write would store: one entry of ``log_id`` in the project."""
        at = time.time() if at is None else at
        log_name = f"projects/{self.project}/logs/{log_id}"
        with self.lock:
            self.sequence += 1
            entry = {"insertId": f"{self.sequence:012d}", "logName": log_name, "resource": resource,
                     "severity": severity, "timestamp": rfc3339(at),
                     "jsonPayload": {"message": message, "attrs": {"tag": resource["labels"].get("task_name", "")},
                                     "levelname": severity}}
            readable = at + float(self.ingest_delays.get(log_id, 0.0))
            entry["receiveTimestamp"] = rfc3339(readable)
            self.written.append(Written(entry, at, readable))

    def entries(self, **labels) -> list[dict]:
        """Entries whose resource labels include ``labels`` (for tests), in write order."""
        with self.lock:
            return [w.entry for w in self.written
                    if all(w.entry["resource"]["labels"].get(k) == v for k, v in labels.items())]


# -- The Logging query language, the part a reader of job logs uses -----------------------------

TOKEN = re.compile(r'\s*(?:(?P<string>"(?:[^"\\]|\\.)*")|(?P<op>=~|!~|!=|<=|>=|=|<|>|:)|(?P<lp>\()|(?P<rp>\))|'
                   r'(?P<word>[A-Za-z_][\w.\-/]*(?:\."[^"]*"[\w.\-/]*)*|[\w.\-:+]+))')


class FilterError(ValueError):
    pass


def _tokens(text: str) -> list[tuple[str, str]]:
    found, position = [], 0
    while position < len(text):
        if text[position:].strip() == "":
            break
        match = TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise FilterError(f"syntax error at column {position + 1}, near {text[position:position + 10]!r}")
        kind = match.lastgroup
        value = match[kind]
        if kind == "string":
            value = json.loads(value)
        found.append((kind, value))
        position = match.end()
    return found


def parse_filter(text: str):
    """A predicate over LogEntry dicts, or FilterError."""
    tokens = _tokens(text)
    position = 0

    def peek():
        return tokens[position] if position < len(tokens) else (None, None)

    def take():
        nonlocal position
        position += 1
        return tokens[position - 1]

    def expression():
        left = conjunction()
        while peek() == ("word", "OR"):
            take()
            right, first = conjunction(), left
            left = (lambda a, b: lambda e: a(e) or b(e))(first, right)
        return left

    def conjunction():
        left = unary()
        while peek()[0] is not None and peek() not in (("word", "OR"), ("rp", ")")):
            if peek() == ("word", "AND"):
                take()
            right, first = unary(), left
            left = (lambda a, b: lambda e: a(e) and b(e))(first, right)
        return left

    def unary():
        if peek() == ("word", "NOT"):
            take()
            inner = unary()
            return lambda e: not inner(e)
        if peek()[0] == "lp":
            take()
            inner = expression()
            if take()[0] != "rp":
                raise FilterError("unbalanced parentheses")
            return inner
        return comparison()

    def comparison():
        kind, name = take() if peek()[0] is not None else (None, None)
        if kind != "word" or name in ("AND", "OR", "NOT"):
            raise FilterError(f"expected a field, got {name!r}")
        if peek()[0] != "op":
            raise FilterError(f"expected a comparison after {name!r}")
        _, op = take()
        if peek()[0] not in ("string", "word"):
            raise FilterError(f"expected a value after {name} {op}")
        _, value = take()
        return _compare(name, op, value)

    predicate = expression()
    if position != len(tokens):
        raise FilterError(f"unexpected {tokens[position][1]!r}")
    return predicate


def _field(entry: dict, name: str):
    value = entry
    for part in re.findall(r'"[^"]*"|[^.]+', name):
        part = part.strip('"')
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _compare(name: str, op: str, expected: str):
    def test(entry: dict) -> bool:
        actual = _field(entry, name)
        if actual is None:
            return op == "!="
        if name == "timestamp" or name == "receiveTimestamp":
            left, right = parse_time(actual), parse_time(expected)
        elif name == "severity":
            left, right = SEVERITIES.index(actual), SEVERITIES.index(expected.upper()) \
                if expected.upper() in SEVERITIES else -1
        else:
            left, right = str(actual), expected
        if op == "=":
            return left == right
        if op == "!=":
            return left != right
        if op == ":":
            return str(expected).lower() in str(actual).lower()
        if op == "=~":
            return re.search(expected, str(actual)) is not None
        if op == "!~":
            return re.search(expected, str(actual)) is None
        return {"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right}[op]

    if name in ("timestamp", "receiveTimestamp"):
        try:
            parse_time(expected)
        except ValueError as error:
            raise FilterError(str(error)) from None
    return test


# -- The server ----------------------------------------------------------------------------------

def _error(code: int, status: str, message: str, reason: str = "", project: str = "") -> tuple[int, dict]:
    error = {"code": code, "message": message, "status": status}
    if reason:
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
                             "domain": "googleapis.com",
                             "metadata": {"service": "logging.googleapis.com", "consumer": f"projects/{project}"}}]
    return code, {"error": error}


def list_entries(state: LoggingState, body: dict, now: float | None = None) -> tuple[int, dict]:
    now = time.time() if now is None else now
    projects = [name.split("/", 1)[1] for name in body.get("resourceNames", []) if name.startswith("projects/")]
    if not projects:
        return _error(400, "INVALID_ARGUMENT", "resource_names must name at least one resource")
    with state.lock:
        state.requests.append(body)
        recent = [t for t in state.reads.get(projects[0], []) if now - t < 60]
        if len(recent) >= READS_PER_MINUTE:
            state.reads[projects[0]] = recent
            state.throttled += 1
            return _error(429, "RESOURCE_EXHAUSTED", "Quota exceeded for quota metric 'Read requests' and limit "
                          "'Read requests per minute' of service 'logging.googleapis.com' for consumer "
                          f"'project_number:{projects[0]}'.", "RATE_LIMIT_EXCEEDED", projects[0])
        state.reads[projects[0]] = recent + [now]
        size = body.get("pageSize", 50)
        if size < 0:
            return _error(400, "INVALID_ARGUMENT", "page_size must not be negative")
        size = min(size or 50, LARGEST_PAGE)
        order = body.get("orderBy", "timestamp asc")
        if order not in ("timestamp asc", "timestamp desc"):
            return _error(400, "INVALID_ARGUMENT", f"Unsupported order_by: {order!r}; use \"timestamp asc\" or "
                          "\"timestamp desc\"")
        try:
            matches = parse_filter(body.get("filter", "")) if body.get("filter", "").strip() else (lambda e: True)
        except FilterError as error:
            return _error(400, "INVALID_ARGUMENT", f"Unparseable filter: {error}")
        found = [w for w in state.written if w.readable_at <= now
                 and w.entry["logName"].split("/")[1] in projects and matches(w.entry)]
    found.sort(key=lambda w: (w.at, w.entry["insertId"]), reverse=order == "timestamp desc")
    start = int(body.get("pageToken") or 0)
    page = [w.entry for w in found[start:start + size]]
    answer = {"entries": page} if page else {}
    if start + size < len(found):
        answer["nextPageToken"] = str(start + size)
    return 200, answer


class LoggingServer:
    """entries.list over HTTPS on ``address``:443, where logging.googleapis.com points."""

    def __init__(self, state: LoggingState, compute, project_apis, address: str, context):
        self.state, self.compute, self.project_apis = state, compute, project_apis
        self.http = JsonServer(address, context, self.handle)
        self.close = self.http.close

    def handle(self, method: str, path: str, query: dict, body, headers: dict) -> tuple[int, dict]:
        _, refused = compute_auth.principal(self.compute, headers)
        if refused:
            return _error(401, "UNAUTHENTICATED", "Request is missing required authentication credential. Expected "
                          "OAuth 2 access token.")
        if not self.project_apis.enabled("logging.googleapis.com"):
            return _error(403, "PERMISSION_DENIED", f"Cloud Logging API has not been used in project "
                          f"{self.state.project} before or it is disabled.", "SERVICE_DISABLED", self.state.project)
        return discovery.serve("logging.v2", method, path, query, body,
                               lambda call: list_entries(self.state, call.body or {}))
