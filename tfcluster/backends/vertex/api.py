"""Vertex AI's customJobs and Cloud Logging's entries.list, over REST with google-auth.

Decision: no google-cloud-aiplatform and no google-cloud-logging. The first is a very heavy
dependency for a CLI (it brings the generated types of all of Vertex AI, and BigQuery, shapely
and more with them) for four JSON calls; the second is not needed for one list call. Both speak
the same REST API this module calls with google-auth's AuthorizedSession, the session the gcp
backend's `check` and IAM calls use (tfcluster/backends/gcp/access/check.py, iam.py).

From the API references (aiplatform.v1 and logging.v2 discovery documents):
- customJobs on the region's own endpoint, https://{region}-aiplatform.googleapis.com/v1/:
  create (POST .../customJobs), get (GET {name}), list (GET .../customJobs, `filter` on
  labels.KEY, state, display_name; nextPageToken) and cancel (POST {name}:cancel, asynchronous:
  the job goes CANCELLING, then CANCELLED). A create is never retried: a second one is a second
  job that bills.
- entries.list (POST https://logging.googleapis.com/v2/entries:list): at most 1000 entries a
  page, and 60 requests a minute per project (https://cloud.google.com/logging/quotas); over it,
  429. Reads here are spaced at least a second apart, pages included, and a 429 widens the gap.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from tfcluster.backends.gcp.cloud import GoogleError, explain

TIMEOUT = 30.0
LOGGING = "https://logging.googleapis.com/v2/entries:list"
# Vertex AI's states a job no longer leaves (CustomJob.endTime is set when it enters one).
ENDED = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED",
         "JOB_STATE_PARTIALLY_SUCCEEDED")
# Statuses worth a retry for a read: a rate limit and a server's transient errors.
TRANSIENT = (429, 500, 502, 503, 504)


class VertexRefused(GoogleError):
    """A Vertex AI or Cloud Logging call was refused: the HTTP status, the error's reason and Google's words."""

    def __init__(self, line: str, status: int, reason: str, message: str):
        super().__init__(line)
        self.status, self.reason, self.message = status, reason, message


def fix_for(status: int, reason: str, message: str, project: str, region: str) -> str:
    """What to do about a refusal, in one clause."""
    quota = re.findall(r"aiplatform\.googleapis\.com/([a-z0-9_]+)", message)
    if status == 429 and "quota metrics exceed quota limits" in message and quota:
        return (f"the job needs more than the custom training quota {', '.join(quota)} allows in {region} "
                f"(Vertex AI's own quota, not Compute Engine's); request more in the console (IAM & Admin > "
                f"Quotas, service aiplatform.googleapis.com, filter {quota[0]}, region {region}), or use fewer "
                "workers, another GPU or another region (`invoke offers --backend vertex` shows both)")
    if reason == "SERVICE_DISABLED" or "has not been used in project" in message:
        service = "logging.googleapis.com" if "Logging" in message else "aiplatform.googleapis.com"
        return (f"the {service} API is not enabled in project {project}: enable it with `gcloud services enable "
                f"{service} --project {project}`, then re-run the same command")
    if status == 403 and re.search(r"Permission '([a-z]+\.[a-zA-Z]+\.[a-zA-Z]+)'", message):
        permission = re.search(r"Permission '([a-z]+\.[a-zA-Z]+\.[a-zA-Z]+)'", message)[1]
        return (f"your account lacks {permission} in project {project}; ask a project owner for "
                "roles/aiplatform.user and roles/iam.serviceAccountUser on the cluster's jobs account "
                "(`invoke check --backend vertex` lists what is missing), then re-run the same command")
    return explain(message, project, reason, status=status) or f"Google answered {status} {reason}: {message[:200]}"


@dataclass
class Rest:
    """JSON over HTTPS with the operator's credentials (requests honours REQUESTS_CA_BUNDLE)."""

    project: str
    region: str
    credentials: object = None
    session: object = field(default=None, repr=False)

    def __post_init__(self):
        from google.auth.transport.requests import AuthorizedSession

        if self.credentials is None:
            from tfcluster.backends.gcp.cloud import default_credentials

            self.credentials = default_credentials()
        self.session = AuthorizedSession(self.credentials)

    def call(self, what: str, method: str, url: str, retries: int = 0, **kwargs) -> dict:
        """The answer's JSON; VertexRefused (one line: ``what``, then the fix) on an error.
        ``retries``: how often a transient refusal (a rate limit, a 5xx) is tried again, with backoff."""
        import requests

        for attempt in range(retries + 1):
            try:
                response = self.session.request(method, url, timeout=TIMEOUT, **kwargs)
            except requests.RequestException as error:
                if attempt < retries:
                    time.sleep(min(30.0, 2.0 ** attempt))
                    continue
                raise VertexRefused(f"{what}: cannot reach Google ({type(error).__name__}); check the network and "
                                    "re-run the same command", 0, "", str(error)) from None
            payload = response.json() if response.content else {}
            if response.status_code < 400:
                return payload
            if response.status_code in TRANSIENT and attempt < retries:
                time.sleep(min(30.0, 2.0 ** attempt))
                continue
            error = payload.get("error") if isinstance(payload, dict) else None
            error = error if isinstance(error, dict) else {"message": str(payload)[:200]}
            details = [d.get("reason") for d in error.get("details", []) if isinstance(d, dict) and d.get("reason")]
            reason = (details or [error.get("status") or ""])[0]
            message = error.get("message", "")
            raise VertexRefused(f"{what}: {fix_for(response.status_code, reason, message, self.project, self.region)}",
                                response.status_code, reason, message)
        raise AssertionError("unreachable")


class Jobs(Rest):
    """customJobs in the cluster's region."""

    @property
    def parent(self) -> str:
        return f"https://{self.region}-aiplatform.googleapis.com/v1/projects/{self.project}/locations/{self.region}"

    def url(self, name: str) -> str:
        return f"https://{self.region}-aiplatform.googleapis.com/v1/{name}"

    def create(self, body: dict) -> dict:
        return self.call("submitting the Vertex AI job", "POST", f"{self.parent}/customJobs", json=body)

    def get(self, name: str) -> dict:
        return self.call("reading the Vertex AI job", "GET", self.url(name), retries=5)

    def cancel(self, name: str) -> None:
        """Ask for the cancel; a job that already ended (400 FAILED_PRECONDITION) has nothing to cancel."""
        try:
            self.call("cancelling the Vertex AI job", "POST", f"{self.url(name)}:cancel", retries=3, json={})
        except VertexRefused as refused:
            if refused.status != 400 or refused.reason not in ("FAILED_PRECONDITION", ""):
                raise

    def list(self, filter_text: str) -> list[dict]:
        found, token = [], ""
        while True:
            params = {"filter": filter_text, "pageSize": 100, **({"pageToken": token} if token else {})}
            page = self.call("listing the Vertex AI jobs", "GET", f"{self.parent}/customJobs", retries=5,
                             params=params)
            found += page.get("customJobs", [])
            token = page.get("nextPageToken", "")
            if not token:
                return found


class Logs(Rest):
    """entries.list, spaced to stay under Cloud Logging's 60 reads a minute."""

    gap: float = 1.0  # Seconds between two reads; a 429 doubles it (at most a minute).
    last_read: float = 0.0
    throttled: int = 0

    def read(self, filter_text: str) -> list[dict]:
        """Every entry the filter matches, oldest first, all pages. A 429 raises VertexRefused after
        widening the gap (the caller polls again later)."""
        found, token = [], ""
        while True:
            wait = self.last_read + self.gap - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            self.last_read = time.monotonic()
            body = {"resourceNames": [f"projects/{self.project}"], "filter": filter_text, "orderBy": "timestamp asc",
                    "pageSize": 1000, **({"pageToken": token} if token else {})}
            try:
                page = self.call("reading the job's logs from Cloud Logging", "POST", LOGGING, json=body)
            except VertexRefused as refused:
                if refused.status == 429:
                    self.throttled += 1
                    self.gap = min(60.0, self.gap * 2)
                raise
            found += page.get("entries", [])
            token = page.get("nextPageToken", "")
            if not token:
                return found
