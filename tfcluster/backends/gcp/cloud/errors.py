"""Google errors as one line that names the fix: from the client libraries, and from Terraform.

Google's error model (https://cloud.google.com/apis/design/errors): an HTTP status, a message,
and in `details` a google.rpc.ErrorInfo whose `reason` says what went wrong (SERVICE_DISABLED,
IAM_PERMISSION_DENIED, RATE_LIMIT_EXCEEDED...) with `metadata` such as the service. Compute's
older `errors[].reason` field (accessNotConfigured, quotaExceeded, rateLimitExceeded, notFound)
carries the same. google-api-core parses both into `GoogleAPICallError.reason/.metadata/.errors`
(google/api_core/exceptions.py, format_http_response_error). Terraform's google provider prints
the same JSON error text in its `Error:` lines, so the same rules read its stderr.
"""

from __future__ import annotations

import contextlib
import re
from typing import Iterator

from tfcluster.errors import TfClusterError

LOGIN = "gcloud auth application-default login"


class GoogleError(TfClusterError):
    """A Google API refused a call; the message says what to do."""


# A zone without the hardware right now ends the start's operation DONE with one of these codes in
# error.errors[] (https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-resource-availability).
# It is not a quota: waiting or another zone helps, a quota request does not.
CAPACITY_CODES = ("ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS")
# The same error's message. The google provider prints an operation error's message, not its code
# (provider source: tpgresource ComputeOperationError.Error() -> writeOperationError), so this
# text is all `terraform apply` shows of a full zone.
CAPACITY_TEXT = "does not have enough resources available to fulfill the request"


# The same page's other words for it: the _WITH_DETAILS form's message ("A VM_TYPE_AND_SIZE VM
# instance with RESOURCE_ATTACHMENT is currently unavailable in the ZONE zone. Capacity changes
# frequently, so try your request in a different zone..."), a region's pool
# (REGION_RESOURCE_POOL_EXHAUSTED, "The region '...' does not have enough resources available..."),
# and the bulk API's 503 reason insufficientCapacity
# (https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-bulk-vm-creation).
UNAVAILABLE = re.compile(r"VM instance .{0,200}is currently unavailable in the [a-z0-9-]+ zone")


# A compact placement policy Compute cannot satisfy now: "No more than 0 instances of machine type
# a3-highgpu-8g can be created with this policy." (Compute's answer as a user pasted it, dstackai/dstack#2586;
# tests/world/facts.py COMPACT_PLACEMENT_REFUSAL). No page names its code, so it is read by its message, as
# the provider prints it. Like a stock-out, another zone, model or a later try may take the cluster
# (a placement policy makes capacity harder to get: GoogleCloudPlatform/cluster-toolkit#2420).
PLACEMENT = re.compile(r"No more than \d+ instances of machine type \S+ can be created with this policy")


def zone_refusal(text: str) -> str | None:
    """Why a zone cannot take new VMs now, from a create's error text (terraform's stderr): no
    capacity (a resource availability error, any form above) or no quota (403 quotaExceeded,
    "Quota 'METRIC' exceeded", https://cloud.google.com/compute/resource-usage#gpu_quota); else None."""
    placement = PLACEMENT.search(text)
    if placement:
        return f"no room to place the VMs close together (compact placement: {placement[0]})"
    if "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS" in text or UNAVAILABLE.search(text):
        return "no capacity (ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS)"
    if "REGION_RESOURCE_POOL_EXHAUSTED" in text or ("The region '" in text and CAPACITY_TEXT in text):
        return "no capacity in its region (REGION_RESOURCE_POOL_EXHAUSTED)"
    if "ZONE_RESOURCE_POOL_EXHAUSTED" in text or CAPACITY_TEXT in text:
        return "no capacity (ZONE_RESOURCE_POOL_EXHAUSTED)"
    if "insufficientCapacity" in text or "insufficient capacity" in text.lower():
        return "no capacity (insufficientCapacity)"
    quota = re.search(r"[Qq]uota '?([A-Z][A-Z0-9_]+)'? exceeded", text)
    if quota or "quotaExceeded" in text:
        return f"no quota ({quota[1] if quota else 'quotaExceeded'})"
    return None


class NoCapacity(GoogleError):
    """The zone has no capacity for a VM right now (a resource availability error)."""

    def __init__(self, instance: str, zone: str):
        self.instance, self.zone = instance, zone
        super().__init__(f"zone {zone} has no capacity for {instance} right now (ZONE_RESOURCE_POOL_EXHAUSTED, "
                         "not a quota); try again later, or `invoke down` and `invoke up --zone` another zone")


# Over a rate limit: Compute's reason (403 rateLimitExceeded, https://cloud.google.com/compute/docs/api-rate-limits),
# the API-wide ErrorInfo reason (429 RATE_LIMIT_EXCEEDED), and an operation's error code when one
# resource gets operations too fast (RESOURCE_OPERATION_RATE_EXCEEDED,
# https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-vm-creation).
RATE_LIMIT_REASONS = ("rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED",
                      "RESOURCE_OPERATION_RATE_EXCEEDED")


def is_rate_limit(error: BaseException) -> bool:
    """Whether a google-api-core error is a rate limit, whatever its status."""
    reasons = [getattr(error, "reason", None) or ""]
    for item in getattr(error, "errors", None) or ():
        reasons.append(item.get("reason", "") or item.get("code", "") if isinstance(item, dict)
                       else getattr(item, "code", "") or "")
    return any(reason in RATE_LIMIT_REASONS for reason in reasons) or "RESOURCE_OPERATION_RATE_EXCEEDED" in str(error)


def capacity_code(error: BaseException) -> str | None:
    """The resource-availability code of an operation's error (google-api-core passes the
    operation's error.errors on as ``error.errors``), else None."""
    for item in getattr(error, "errors", None) or ():
        code = item.get("code") if isinstance(item, dict) else getattr(item, "code", "")
        if code in CAPACITY_CODES:
            return code
    found = next((code for code in CAPACITY_CODES if code in str(error)), None)
    return found or (CAPACITY_CODES[0] if CAPACITY_TEXT in str(error) else None)


def _enable(service: str, project: str) -> str:
    return f"enable it with `gcloud services enable {service} --project {project}`, then re-run the same command"


def explain(text: str, project: str, reason: str = "", service: str = "", status: int | None = None) -> str | None:
    """The fix for a Google error, from its reason, status and text; None when it is not one we know."""
    lowered = text.lower()
    if PLACEMENT.search(text):
        return ("the zone cannot place these VMs close together right now (compact placement); try again later, "
                "another zone with --zone, or set compact_placement = false")
    if reason in CAPACITY_CODES or any(code in text for code in CAPACITY_CODES) or CAPACITY_TEXT in text \
            or UNAVAILABLE.search(text):
        return ("the zone has no capacity for these VMs right now (ZONE_RESOURCE_POOL_EXHAUSTED, not a quota); "
                "try again later, or in another zone with --zone")
    if reason in ("SERVICE_DISABLED", "accessNotConfigured") or "has not been used in project" in lowered \
            or "it is disabled" in lowered:
        service = service or (re.search(r"([a-z]+\.googleapis\.com)", text) or [None, "compute.googleapis.com"])[1]
        return f"the {service} API is not enabled in project {project}: {_enable(service, project)}"
    if reason in ("quotaExceeded", "QUOTA_EXCEEDED") or re.search(r"quota '?[A-Z0-9_]+'? exceeded", text, re.I):
        metric = re.search(r"[Qq]uota '?([A-Z_0-9]+)'?", text)
        name = metric[1] if metric else "the quota in the message"
        return (f"quota {name} is exhausted in project {project}; request more in the console (IAM & Admin > "
                f"Quotas, filter {name}) or use another region, then re-run the same command")
    # Before the permission branch: Compute says a rate limit with 403 (reason rateLimitExceeded).
    if reason in RATE_LIMIT_REASONS or status == 429 or "rateLimitExceeded" in text \
            or "RESOURCE_OPERATION_RATE_EXCEEDED" in text or "rate limit exceeded" in lowered:
        return "Google is rate-limiting this project right now (retried with backoff already); wait a minute and re-run"
    if reason in ("IAM_PERMISSION_DENIED", "forbidden") or status == 403 or "permission" in lowered:
        # Compute says "Required 'compute.regions.get' permission for 'projects/P/...'"; IAM's newer
        # messages say "Permission 'x.y.z' denied on resource ...".
        permission = re.search(r"'([a-z]+\.[a-zA-Z]+\.[a-zA-Z]+)' permission", text) or \
            re.search(r"(?:permission|Permission) '?([a-z]+\.[a-zA-Z]+\.[a-zA-Z]+)'?", text)
        missing = f"the permission {permission[1]}" if permission else "a permission it needs"
        # What up, train, image build and down need (https://cloud.google.com/iam/docs/roles-permissions):
        # serviceAccountUser for iam.serviceAccounts.actAs (a VM runs as the cluster's account),
        # artifactregistry.admin for the registry and its IAM, serviceUsageConsumer for
        # serviceusage.services.use (the Cloud Billing Catalog's live prices).
        return (f"your account lacks {missing} in project {project}; ask a project owner for "
                "roles/compute.admin, roles/storage.admin, roles/iam.serviceAccountAdmin, "
                "roles/iam.serviceAccountUser, roles/iam.roleAdmin, roles/artifactregistry.admin and "
                "roles/serviceusage.serviceUsageConsumer (or roles/owner on a sandbox project), then re-run "
                "the same command")
    if "invalid_grant" in lowered or "reauth" in lowered or "token has been expired" in lowered:
        return f"your Google credentials expired; run `{LOGIN}` and re-run the same command"
    if status == 404 or reason == "notFound":
        if "zones/" in text or "zone" in lowered:
            return ("a zone in the request does not exist for this project; check --zone against "
                    "`gcloud compute zones list`")
        if "projects/" in text or "project" in lowered:
            return f"project {project} was not found or is not visible to your account; check --project"
    return None


def from_exception(error: BaseException, project: str, what: str) -> GoogleError | None:
    """A GoogleError for a google.api_core or google.auth exception, else None."""
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth

    if isinstance(error, auth.RefreshError):
        return GoogleError(f"{what}: your Google credentials expired or were revoked; run `{LOGIN}`")
    if isinstance(error, auth.DefaultCredentialsError):
        return GoogleError(f"{what}: no Google Cloud credentials; run `{LOGIN}` "
                           "(or set GOOGLE_APPLICATION_CREDENTIALS to a key file)")
    if isinstance(error, auth.GoogleAuthError):
        return GoogleError(f"{what}: Google sign-in failed ({error}); run `{LOGIN}`")
    if not isinstance(error, api.GoogleAPICallError):
        return None
    reason = error.reason or next((item.get("reason", "") for item in error.errors or () if isinstance(item, dict)), "")
    service = (error.metadata or {}).get("service", "")
    fix = explain(error.message or str(error), project, reason, service, getattr(error, "code", None))
    first = (error.message or str(error)).strip().splitlines()[0][:200]
    return GoogleError(f"{what}: {fix or f'Google answered {first}'}")


@contextlib.contextmanager
def translated(project: str, what: str) -> Iterator[None]:
    """Turn Google's exceptions inside the block into one GoogleError line."""
    try:
        yield
    except TfClusterError:
        raise
    except Exception as error:  # noqa: BLE001 - only Google's are translated; others re-raise
        mapped = from_exception(error, project, what)
        if mapped is None:
            raise
        raise mapped from None


def terraform_error_line(stderr: str, project: str) -> str | None:
    """The fix for the first Google error in Terraform's output, or None."""
    for block in re.split(r"\n\s*[│╷╵]?\s*Error: ", "\n" + stderr)[1:]:
        status = re.search(r"Error (\d{3})", block) or re.search(r"googleapi: Error (\d{3})", block)
        fix = explain(block, project, status=int(status[1]) if status else None)
        if fix:
            return fix
    return None
