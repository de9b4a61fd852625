"""A Vertex AI job's lines, read from Cloud Logging as they arrive, into one local log per worker.

What Vertex AI writes there, from gcloud's own reader (googlecloudsdk/command_lib/ai/log_util.py):
resource.type="ml_job", resource.labels.job_id (the job's number), resource.labels.task_name
("workerpool0-0", "workerpool1-3", or "service" for Vertex AI's own lines); the text is
jsonPayload.message, else textPayload. A container's stdout comes at INFO and its stderr at ERROR.

An entry becomes readable a few seconds after it is written, and not in timestamp order across
replicas. So each read asks from a minute before the newest timestamp seen (OVERLAP) and drops the
entries already seen by insertId; asking only for what is newer would lose a slow replica's lines.
Reads go through api.Logs, which keeps Cloud Logging's 60 reads a minute (at least a second
between pages, twice as long after a 429): one read (one page when the job is quiet) every
POLL_SECONDS is 30 a minute, half the quota, leaving the rest to `status` from another shell.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, field
from pathlib import Path

from tfcluster.backends.vertex.jobspec import worker_of

POLL_SECONDS = 2.0
OVERLAP = 60.0


def seconds(stamp: str) -> float:
    """An RFC 3339 timestamp (nanoseconds, Z) in seconds since the epoch."""
    head, _, fraction = stamp.rstrip("Z").partition(".")
    moment = datetime.datetime.fromisoformat(head).replace(tzinfo=datetime.timezone.utc)
    return moment.timestamp() + float("0." + (fraction or "0"))


def rfc3339(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def text_of(entry: dict) -> str:
    payload = entry.get("jsonPayload")
    if isinstance(payload, dict) and "message" in payload:
        return str(payload["message"])
    return str(entry.get("textPayload", ""))


@dataclass
class JobLines:
    """The lines of one job, mirrored into ``folder``/worker-I.log (and vertex-job.log for the service's)."""

    logs: object  # api.Logs
    job_id: str
    folder: Path
    since: float  # Seconds: nothing of this job is older.
    newest: float = 0.0
    seen: dict = field(default_factory=dict)  # insertId -> its timestamp (seconds).
    last_read: float = 0.0

    def due(self) -> bool:
        return time.monotonic() - self.last_read >= POLL_SECONDS

    def read(self) -> list[tuple[int | None, str]]:
        """New lines since the last read: (worker index, or None for the service's own), oldest first.
        Each is also appended to its local log."""
        self.last_read = time.monotonic()
        start = max(self.since, self.newest - OVERLAP)
        entries = self.logs.read(f'resource.type="ml_job" AND resource.labels.job_id="{self.job_id}" '
                                 f'AND timestamp>="{rfc3339(start)}"')
        fresh = []
        for entry in entries:
            key = entry.get("insertId") or f"{entry.get('timestamp')}/{text_of(entry)}"
            if key in self.seen:
                continue
            at = seconds(entry["timestamp"]) if entry.get("timestamp") else time.time()
            self.seen[key] = at
            task = (entry.get("resource", {}).get("labels") or {}).get("task_name", "")
            fresh.append((at, key, worker_of(task), text_of(entry)))
        fresh.sort(key=lambda item: (item[0], item[1]))
        if fresh:
            self.newest = max(self.newest, fresh[-1][0])
        self.seen = {key: at for key, at in self.seen.items() if at >= self.newest - 2 * OVERLAP}
        lines = [(worker, text) for _, _, worker, text in fresh]
        self._mirror(lines)
        return lines

    def _mirror(self, lines: list[tuple[int | None, str]]) -> None:
        by_file: dict[str, list[str]] = {}
        for worker, text in lines:
            by_file.setdefault("vertex-job.log" if worker is None else f"worker-{worker}.log", []).append(text)
        self.folder.mkdir(parents=True, exist_ok=True)
        for name, texts in by_file.items():
            with open(self.folder / name, "a") as handle:
                handle.write("".join(f"{text}\n" for text in texts))
