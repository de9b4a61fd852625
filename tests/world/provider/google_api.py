"""The provider's HTTP calls to Google: its own credentials, Google's host names, its error text.

Credentials as the real provider finds them: Application Default Credentials
(GOOGLE_APPLICATION_CREDENTIALS), exchanged for an access token at oauth2.googleapis.com.
Errors read as the provider prints them: googleapi's `Error <code>: <message>, <reason>`
(google.golang.org/api/googleapi/googleapi.go, Error.Error()), and for a failed operation the
operation's error messages (provider source: tpgresource ComputeOperationError.Error() ->
writeOperationError, which writes each error's message, not its code).
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from functools import lru_cache

from tests.world.provider.servicer import ProviderFailure

COMPUTE = "https://compute.googleapis.com/compute/v1"
STORAGE = "https://storage.googleapis.com/storage/v1"
ARTIFACTS = "https://artifactregistry.googleapis.com/v1"
IAM = "https://iam.googleapis.com/v1"


@lru_cache(maxsize=1)
def _credentials():
    import google.auth

    credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    return credentials


def token() -> str:
    import google.auth.transport.requests

    credentials = _credentials()
    if not credentials.valid:
        credentials.refresh(google.auth.transport.requests.Request())
    return credentials.token


class GoogleApiError(Exception):
    def __init__(self, status: int, message: str, reason: str):
        super().__init__(f"googleapi: Error {status}: {message}" + (f", {reason}" if reason else ""))
        self.status, self.reason = status, reason


def call(method: str, url: str, body: dict | None = None) -> dict:
    """One JSON API call with the provider's token; GoogleApiError on a refusal."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={
        "Authorization": f"Bearer {token()}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60, context=ssl.create_default_context()) as response:
            raw = response.read()
    except urllib.error.HTTPError as error:
        text = error.read().decode(errors="replace")
        try:
            detail = json.loads(text).get("error", {})
        except ValueError:
            detail = {"message": text}
        reasons = [item.get("reason", "") for item in detail.get("errors", []) if isinstance(item, dict)]
        raise GoogleApiError(error.code, detail.get("message", text), reasons[0] if reasons else "") from None
    return json.loads(raw) if raw.strip() else {}


def not_found(error: GoogleApiError) -> bool:
    """The provider's HandleNotFoundError: a 404 on read means the resource is gone."""
    return error.status == 404


def found_at(url: str, what: str) -> bool:
    """GET ``url``: False on a 404 (the provider's HandleNotFoundError: gone, so terraform plans it
    anew); any other refusal fails as "Error reading <what>: ..."."""
    try:
        call("GET", url)
    except GoogleApiError as error:
        if not_found(error):
            return False
        raise fail(f"reading {what}", error) from None
    return True


def delete_at(url: str, what: str) -> dict | None:
    """DELETE ``url`` and return its answer (an operation, for some APIs); None when it was gone
    already (a 404), as the provider's deletes treat it; other refusals fail."""
    try:
        return call("DELETE", url)
    except GoogleApiError as error:
        if not_found(error):
            return None
        raise fail(f"deleting {what}", error) from None


def fail(action: str, error: GoogleApiError) -> ProviderFailure:
    """`Error creating Network: googleapi: Error 409: ..., alreadyExists`, as the provider words it."""
    return ProviderFailure(f"Error {action}: {error}")


def wait_compute(operation: dict, project: str, what: str, timeout: float = 300) -> None:
    """Poll a Compute operation until DONE (the provider's ComputeOperationWaitTime); a failed one
    raises with its errors' messages (writeOperationError)."""
    deadline = time.monotonic() + timeout
    while operation.get("status") != "DONE":
        if time.monotonic() > deadline:
            raise ProviderFailure(f"Error waiting for {what}: timeout while waiting for state to become 'DONE'")
        time.sleep(0.2)
        where = operation.get("zone") or operation.get("region")
        scope = f"zones/{where.rsplit('/', 1)[1]}" if operation.get("zone") else (
            f"regions/{where.rsplit('/', 1)[1]}" if where else "global")
        operation = call("GET", f"{COMPUTE}/projects/{project}/{scope}/operations/{operation['name']}")
    errors = (operation.get("error") or {}).get("errors") or []
    if errors:
        raise ProviderFailure(f"Error waiting for {what}: " + "\n".join(e.get("message", "") for e in errors))
