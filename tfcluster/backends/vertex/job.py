"""One run's attempts as Vertex AI CustomJobs (the CloudJob of tfcluster/backends/base.py).

The job's state comes from customJobs.get (at most every STATE_SECONDS); its lines from Cloud
Logging (logs.py, every POLL_SECONDS). What the states mean, from CustomJob.state's own
descriptions: QUEUED and PENDING before the replicas run (STARTING here), RUNNING, then
SUCCEEDED, FAILED, or CANCELLING and CANCELLED (STOPPED here). A FAILED job's error names the
replica that ended it, in Google's words: "The replica workerpool1-0 exited with a non-zero
status of 3. ..."; this is how the failed worker and its exit code are known.

When the job has ended, its last lines may still be on their way into Cloud Logging: the job
keeps reading until a read brings nothing new (at most FLUSH_SECONDS), so the summary sees the
chief's last events.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable

from tfcluster.backends.base import JobReport
from tfcluster.backends.vertex.api import ENDED, Jobs, Logs, VertexRefused
from tfcluster.backends.vertex.jobspec import job_id, worker_of
from tfcluster.backends.vertex.logs import JobLines, seconds

STATE_SECONDS = 2.0
FLUSH_SECONDS = 60.0
CANCEL_SECONDS = 600.0
STATES = {"JOB_STATE_QUEUED": "STARTING", "JOB_STATE_PENDING": "STARTING", "JOB_STATE_RUNNING": "RUNNING",
          "JOB_STATE_UPDATING": "RUNNING", "JOB_STATE_SUCCEEDED": "SUCCEEDED", "JOB_STATE_FAILED": "FAILED",
          "JOB_STATE_EXPIRED": "FAILED", "JOB_STATE_PARTIALLY_SUCCEEDED": "FAILED",
          "JOB_STATE_CANCELLING": "RUNNING", "JOB_STATE_CANCELLED": "STOPPED"}
REPLICA_EXIT = re.compile(r"The replica (workerpool\d+-\d+) exited with a non-zero status of (-?\d+)")
START = re.compile(r"=== tfcluster: worker-(\d+) \(.*\) starts on ")


class VertexJob:
    def __init__(self, jobs: Jobs, logs: Logs, folder: Path, body: Callable[[int], dict] | None = None,
                 record: Callable[[int, str], None] | None = None):
        # Where the workers' lines go; body(attempt) -> the CustomJob to create; record(attempt, name):
        # remember a job submitted. A job only looked at or cancelled needs neither.
        self.jobs, self.logs, self.body, self.folder, self.record = jobs, logs, body, folder, record
        self.name = ""
        self.job: dict = {}
        self.lines: JobLines | None = None
        self.starts: dict[int, int] = {}
        self.last_get = 0.0
        self.flushed = False  # The ended job's last lines were read.

    def submit(self, attempt: int) -> None:
        self.job = self.jobs.create(self.body(attempt))
        self.name = self.job["name"]
        self.record(attempt, self.name)
        self.starts, self.flushed = {}, False
        self.last_get = time.monotonic()
        created = seconds(self.job["createTime"]) if self.job.get("createTime") else time.time()
        self.lines = JobLines(self.logs, job_id(self.name), self.folder, since=created - 5)

    def attach(self, name: str, job: dict | None = None) -> "VertexJob":
        """Follow a job submitted earlier (``job``: what customJobs.get or list answered for it)."""
        self.name = name
        self.job = job or self.jobs.get(name)
        self.lines = JobLines(self.logs, job_id(name), self.folder,
                              since=seconds(self.job.get("createTime", "1970-01-01T00:00:00Z")) - 5)
        return self

    def state(self) -> str:
        if time.monotonic() - self.last_get >= STATE_SECONDS:
            self.job = self.jobs.get(self.name)
            self.last_get = time.monotonic()
        return self.job.get("state", "JOB_STATE_QUEUED")

    def look(self) -> JobReport:
        if not self.name:
            return JobReport("STOPPED", "no job", message="no Vertex AI job was submitted for it")
        return self._report(self.state(), [])

    def poll(self) -> JobReport:
        cloud = self.state()
        return self._report(cloud, self._read(cloud in ENDED))

    def _report(self, cloud: str, lines: list) -> JobReport:
        report = JobReport(STATES.get(cloud, "RUNNING"), cloud, job=self.name)
        if not lines:
            report.restarts = max(self.starts.values(), default=1) - 1
        for worker, text in lines:
            if worker is None:
                report.notes.append(text)
                continue
            if START.match(text):
                self.starts[worker] = self.starts.get(worker, 0) + 1
        report.restarts = max(self.starts.values(), default=1) - 1
        if report.state == "FAILED":
            report.message = (self.job.get("error") or {}).get("message", "") or f"the job ended {cloud}"
            found = REPLICA_EXIT.search(report.message)
            if found:
                report.failed_worker, report.exit_code = worker_of(found[1]), int(found[2])
        return report

    def _read(self, ended: bool) -> list:
        """New lines; once the job ended, every line still on its way in (until a read brings none)."""
        if self.lines is None:
            return []
        if not ended:
            return self._safe_read() if self.lines.due() else []
        if self.flushed:
            return []
        self.flushed = True
        found, deadline = self._safe_read(), time.monotonic() + FLUSH_SECONDS
        while time.monotonic() < deadline:
            time.sleep(2.0)
            fresh = self._safe_read()
            if not fresh:
                break
            found += fresh
        return found

    def _safe_read(self) -> list:
        try:
            return self.lines.read()
        except VertexRefused as refused:
            if refused.status == 429:
                return []  # Cloud Logging's 60 reads a minute: the next poll reads what this one missed.
            raise

    def cancel(self) -> None:
        if not self.name:
            return
        if not self.job:
            self.job = self.jobs.get(self.name)
        if self.job.get("state") not in ENDED:
            self.jobs.cancel(self.name)
        deadline = time.monotonic() + CANCEL_SECONDS
        while time.monotonic() < deadline:
            self.job = self.jobs.get(self.name)
            if self.job.get("state") in ENDED:
                self._read(True)  # Its last lines, into the workers' logs.
                return
            time.sleep(1.0)
        raise VertexRefused(f"the Vertex AI job {self.name} was still {self.job.get('state')} "
                            f"{CANCEL_SECONDS / 60:.0f} minutes after its cancel; look at it in the console "
                            "(Vertex AI > Training > Custom jobs) and cancel it there", 0, "", "")
