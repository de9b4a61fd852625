"""The metadata server (settings, token, guest attributes) and the Compute API (the VM deleting
itself, waited on through its zone operation)."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Callable

from tfcluster_watchdog.settings import Settings, parse_settings

# A delete's zone operation is read every few seconds; a VM delete takes well under a minute, so a
# machine still here after this long was not deleted.
DELETE_POLL_SECONDS = 2.0
DELETE_WAIT_SECONDS = 600.0


class Gce:
    """The metadata server (GCE_METADATA_HOST, as Google's own libraries read it) and the Compute API."""

    COMPUTE_API = "https://compute.googleapis.com"

    def __init__(self, metadata_host: str | None = None):
        self.metadata = f"http://{metadata_host or os.environ.get('GCE_METADATA_HOST', 'metadata.google.internal')}"

    def get(self, path: str, timeout: float = 5) -> str:
        request = urllib.request.Request(f"{self.metadata}/computeMetadata/v1/{path}",
                                         headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read().decode()

    def attribute(self, name: str) -> str | None:
        try:
            return self.get(f"instance/attributes/{name}")
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise

    def put_guest_attribute(self, key: str, value: str) -> None:
        request = urllib.request.Request(f"{self.metadata}/computeMetadata/v1/instance/guest-attributes/{key}",
                                         data=value.encode(), method="PUT", headers={"Metadata-Flavor": "Google"})
        urllib.request.urlopen(request, timeout=5).close()

    def settings(self) -> Settings:
        return parse_settings({
            "idle_minutes": self.attribute("tfcluster-idle-minutes"),
            "action": self.attribute("tfcluster-idle-action"),
            "probes": self.attribute("tfcluster-idle-probes"),
            "gpu_threshold": self.attribute("tfcluster-gpu-threshold"),
            "boot_grace_minutes": self.attribute("tfcluster-boot-grace-minutes"),
            "stall_minutes": self.attribute("tfcluster-stall-minutes"),
            "then_stop": self.attribute("tfcluster-then-stop"),
            "budget_end": self.attribute("tfcluster-budget-end"),
        })

    def token(self) -> str:
        """The VM's own service account's access token (the metadata server refreshes it)."""
        return json.loads(self.get("instance/service-accounts/default/token"))["access_token"]

    def delete_self(self, log: Callable[[str], None], wait_seconds: float = DELETE_WAIT_SECONDS,
                    clock: Callable[[], float] = time.monotonic) -> str:
        """DELETE this instance via the Compute API with the VM's own service account, then wait
        on its zone operation: Compute accepts the request and may still fail it, ending the
        operation DONE with `error` (https://cloud.google.com/compute/docs/reference/rest/v1/zoneOperations/get;
        google-api-core's ExtendedOperation raises from it). DeleteFailed says why, so the machine
        halts instead of billing on. Where the operation cannot be read (no
        compute.zoneOperations.get), the machine waits to be deleted: still here after
        ``wait_seconds``, the delete did not happen."""
        project = self.get("project/project-id")
        zone = self.get("instance/zone").rsplit("/", 1)[-1]
        name = self.get("instance/name")
        base = f"{self.COMPUTE_API}/compute/v1/projects/{project}/zones/{zone}"
        request = urllib.request.Request(f"{base}/instances/{name}", method="DELETE",
                                         headers={"Authorization": f"Bearer {self.token()}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            operation = json.loads(response.read().decode() or "{}")
        what = f"DELETE {project}/{zone}/{name}: operation {operation.get('name', '?')}"
        log(f"{what}; waiting for it")
        deadline, unreadable = clock() + wait_seconds, ""
        while operation.get("status") != "DONE":
            if clock() > deadline:
                raise DeleteFailed(f"{what} not done after {wait_seconds:g}s" + (f" ({unreadable})" if unreadable else ""))
            time.sleep(DELETE_POLL_SECONDS)
            if unreadable:
                continue  # Deleting this machine ends this process; until the deadline, wait for it.
            reading = urllib.request.Request(f"{base}/operations/{operation.get('name', '')}",
                                             headers={"Authorization": f"Bearer {self.token()}"})
            try:
                with urllib.request.urlopen(reading, timeout=30) as response:
                    operation = json.loads(response.read().decode() or "{}")
            except urllib.error.HTTPError as error:
                unreadable = f"its operation cannot be read: {error.code}: {google_message(error)}"
                log(f"{what}: {unreadable}; waiting for the machine to go")
        errors = (operation.get("error") or {}).get("errors") or []
        if errors:
            raise DeleteFailed(f"{what} failed: " + "; ".join(
                f"{e.get('code', '?')}: {e.get('message', '')}" for e in errors))
        return f"{what} done"


class DeleteFailed(Exception):
    """Compute took the delete but did not carry it out."""


def google_message(error: urllib.error.HTTPError) -> str:
    """The message of Google's JSON error body (https://cloud.google.com/apis/design/errors), else the reason."""
    try:
        return str(json.loads(error.read().decode())["error"]["message"])[:200]
    except Exception:  # noqa: BLE001 - any body at all
        return str(error.reason)
