"""`invoke check` on Google Cloud: before anything bills, one line per prerequisite.

✓ it holds; ✗ it definitely fails, with the fix; ? the check itself could not be made (its API is
off or reading is refused), with what to ask for. `up` runs the same checks first and stops on ✗.
The rules live in prerequisites.py; this module asks Google:
- credentials: google.auth.default, then who they are (a key's service account, or tokeninfo);
- APIs: Service Usage services.batchGet
  (https://cloud.google.com/service-usage/docs/reference/rest/v1/services/batchGet);
- permissions: Resource Manager projects.testIamPermissions, which answers the subset the caller
  holds (https://cloud.google.com/resource-manager/reference/rest/v1/projects/testIamPermissions);
- organisation constraints, the managed compute.managed.* among them: Org Policy v2
  projects.policies.getEffectivePolicy
  (https://cloud.google.com/resource-manager/docs/reference/orgpolicy/rest/v2/projects.policies/getEffectivePolicy),
  else the legacy ones through Resource Manager v1 projects.getEffectiveOrgPolicy;
- quota: every quota the cluster takes, per zone of `zones` (quota.py); the boot image: images.getFromFamily / images.get
  (https://cloud.google.com/compute/docs/reference/rest/v1/images), whose `deprecated.state` is
  DEPRECATED (still boots), OBSOLETE or DELETED (refused);
- live prices: the Cloud Billing Catalog's services.list (pricing.py);
- terraform: `terraform version -json` against versions.tf's required_version;
- the operator's address, looked up without any proxy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

from tfcluster.backends.base import Finding
from tfcluster.backends.gcp.access import oslogin
from tfcluster.backends.gcp.access import prerequisites as rules
from tfcluster.backends.gcp.zones import reservations
from tfcluster.backends.gcp.access.address import detect_operator_cidr
from tfcluster.backends.gcp.quotas.quota import Zones
from tfcluster.backends.gcp.cloud.terraform import MODULE_DIR
from tfcluster.errors import ConfigError
from tfcluster.provisioning import preemptible_quota

DEFAULT_FAMILY = "projects/deeplearning-platform-release/global/images/family/common-cu129-ubuntu-2204-nvidia-580"
IMAGE_PATH = re.compile(r"projects/(?P<project>[a-z0-9-]+)/global/images/(?:family/(?P<family>[a-z0-9-]+)|(?P<name>[a-z0-9-]+))")
TIMEOUT = 20.0


@dataclass
class Report:
    """What check found, and the exact boot image `up` writes into the cluster's tfvars."""

    findings: list[Finding]
    image: str | None  # projects/P/global/images/NAME, or None when it could not be resolved.
    # The zones `up` may try, in order: each one's offer and quota hold or cannot be told.
    zones: list[str] = field(default_factory=list)
    # One line for each zone dropped before anything is made (its offer or quota falls short).
    dropped: list[str] = field(default_factory=list)
    # How the operator logs in to the VMs (oslogin.py): --ssh-identity, or what auto chose.
    identity: oslogin.Identity = oslogin.Identity("metadata", "not checked")

    @property
    def failed(self) -> list[Finding]:
        return [finding for finding in self.findings if finding.holds is False]


def blocking(report: Report, terraform) -> list[Finding]:
    """What stops `up` before terraform runs: every ✗, else a boot image that could not be resolved (?)
    unless a resumed `up` keeps the one its VMs booted (terraform would refuse `"image": null`). With
    a ✗ already, the image's ? is most likely its consequence (the Compute API off) and is not repeated."""
    found = list(report.failed)
    tfvars = terraform.workdir / "terraform.tfvars.json"
    if not found and report.image is None and not (tfvars.exists() and terraform.variables().get("image")):
        image = next((f for f in report.findings if f.subject == "boot image"), None)
        why = image.detail if image is not None else "it was not checked without credentials"
        found.append(Finding("boot image", False, f"`up` needs the exact boot image and could not resolve it ({why}); "
                                                  "fix that, or pass --boot-image projects/P/global/images/NAME"))
    return found


class Refused(Exception):
    """A Google API answered an error: its status, reason and message."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message

    def why(self) -> str:
        if self.reason == "SERVICE_DISABLED" or "has not been used in project" in self.message:
            return "its API is off"
        if not self.status:
            return self.message[:200]
        return f"{self.status} {self.reason}: {self.message}"[:200]


class Google:
    """JSON over HTTPS with the operator's credentials (requests honours REQUESTS_CA_BUNDLE)."""

    def __init__(self, credentials):
        from google.auth.transport.requests import AuthorizedSession

        self.session = AuthorizedSession(credentials)

    def call(self, method: str, url: str, **kwargs) -> dict:
        """The JSON answer; Refused for an error answer, a transport failure (status 0) or an answer
        that is not JSON, so that no check ends in a traceback."""
        from google.auth.exceptions import TransportError
        from requests import RequestException

        try:
            response = self.session.request(method, url, timeout=TIMEOUT, **kwargs)
        except (RequestException, TransportError, OSError) as error:
            raise Refused(0, "unreachable", f"cannot reach {url.split('/')[2]}: {type(error).__name__}") from None
        try:
            payload = response.json() if response.content else {}
        except ValueError:
            raise Refused(response.status_code, "not JSON", f"{url.split('/')[2]} answered {response.status_code} "
                                                            f"with what is not JSON") from None
        if response.status_code >= 400:
            error = payload.get("error") if isinstance(payload, dict) else None
            error = error if isinstance(error, dict) else {"message": str(payload)}
            details = [d.get("reason") for d in error.get("details", []) if isinstance(d, dict) and d.get("reason")]
            reason = (details or [error.get("status") or ""])[0]
            raise Refused(response.status_code, reason, error.get("message", ""))
        return payload


def credentials_finding() -> tuple[Finding, object | None]:
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError, RefreshError, TransportError
    from google.auth.transport.requests import Request

    try:
        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    except DefaultCredentialsError:
        return Finding("credentials", False, "none found: run `gcloud auth application-default login` (or set "
                                             "GOOGLE_APPLICATION_CREDENTIALS to a key file)"), None
    email = getattr(credentials, "service_account_email", None)
    try:
        credentials.refresh(Request())
    except RefreshError as error:
        # google-auth raises it with (message, the token endpoint's answer): the message is enough.
        message = error.args[0] if error.args and isinstance(error.args[0], str) else str(error)
        return Finding("credentials", False, f"Google refused your credentials ({message[:120]}); run "
                                             "`gcloud auth application-default login` again"), None
    except TransportError as error:
        return Finding("credentials", None, f"cannot reach Google's sign-in ({error})"), None
    if email and email != "default":
        return Finding("credentials", True, f"service account {email} (key file)"), credentials
    try:
        info = Google(credentials).call("GET", "https://oauth2.googleapis.com/tokeninfo",
                                        params={"access_token": credentials.token})
        who = info.get("email") or "an account without an e-mail scope"
    except Refused:
        who = "a user account whose e-mail Google does not tell"
    return Finding("credentials", True, f"{who} (application default credentials)"), credentials


def services_finding(google: Google, project: str, services=rules.SERVICES) -> Finding:
    """``services``: the APIs to look at (the gcp backend's; the vertex backend gives its own)."""
    url = f"https://serviceusage.googleapis.com/v1/projects/{project}/services:batchGet"
    try:
        answer = google.call("GET", url, params={"names": [f"projects/{project}/services/{s}" for s in services]})
    except Refused as error:
        return Finding("APIs", None, f"cannot read them ({error.why()}); ask for roles/serviceusage.serviceUsageViewer")
    off = sorted(s["name"].rsplit("/", 1)[-1] for s in answer.get("services", []) if s.get("state") != "ENABLED")
    if off:
        return Finding("APIs", False, f"{'the API' if len(off) == 1 else 'the APIs'} {', '.join(off)} "
                                      f"{'is' if len(off) == 1 else 'are'} off in project {project}: run "
                                      f"`gcloud services enable {' '.join(off)} --project {project}`")
    return Finding("APIs", True, f"{len(services)} enabled ({', '.join(services)})")


def permissions_finding(google: Google, project: str, permissions=rules.PERMISSIONS) -> Finding:
    """``permissions``: permission -> (the role that holds it, the commands that use it)."""
    url = f"https://cloudresourcemanager.googleapis.com/v1/projects/{project}:testIamPermissions"
    try:
        answer = google.call("POST", url, json={"permissions": sorted(permissions)})
    except Refused as error:
        return Finding("permissions", None, f"cannot test them ({error.why()})")
    missing = sorted(set(permissions) - set(answer.get("permissions", [])))
    if not missing:
        return Finding("permissions", True, f"all {len(permissions)} that up, train, down and image build use")
    roles = sorted({permissions[p][0] for p in missing})
    listed = "; ".join(f"{p} ({permissions[p][1]})" for p in missing)
    return Finding("permissions", False, f"your account lacks {listed} in project {project}; ask a project owner "
                                         f"for {', '.join(roles)}")


def constraint_findings(google: Google, target: rules.Target) -> list[Finding]:
    """Org Policy v2's effective policies, the managed constraints among them; when v2 cannot be read,
    the legacy constraints through Resource Manager v1 projects.getEffectiveOrgPolicy (an API `check`
    requires already) and one ? for the managed ones, which v1 cannot express."""
    findings = []
    for constraint in rules.CONSTRAINTS:
        url = (f"https://orgpolicy.googleapis.com/v2/projects/{target.project}/policies/"
               f"{constraint.name}:getEffectivePolicy")
        try:
            policy = google.call("GET", url)
        except Refused as error:
            return _v1_constraint_findings(google, target, error)
        findings.append(_judged(constraint, (policy.get("spec") or {}).get("rules", []), target))
    return findings


def _judged(constraint, found: list[dict], target: rules.Target) -> Finding:
    holds, detail = rules.judge(constraint, found, target)
    if holds is False:
        detail += f"; ask your organisation's admin to exempt project {target.project}"
    return Finding(f"constraints/{constraint.name}", holds, detail)


def _v1_constraint_findings(google: Google, target: rules.Target, v2: Refused) -> list[Finding]:
    """https://cloud.google.com/resource-manager/reference/rest/v1/projects/getEffectiveOrgPolicy."""
    url = f"https://cloudresourcemanager.googleapis.com/v1/projects/{target.project}:getEffectiveOrgPolicy"
    findings = []
    for constraint in [c for c in rules.CONSTRAINTS if not c.managed]:
        try:
            policy = google.call("POST", url, json={"constraint": f"constraints/{constraint.name}"})
        except Refused as error:
            return [Finding("organisation policies", None, f"cannot read them (Org Policy v2: {v2.why()}; Resource "
                            f"Manager v1: {error.why()}); enable orgpolicy.googleapis.com or ask for "
                            "roles/orgpolicy.policyViewer, else ask your admin about "
                            + ", ".join(c.name for c in rules.CONSTRAINTS))]
        findings.append(_judged(constraint, rules.v1_rules(policy), target))
    managed = [c.name for c in rules.CONSTRAINTS if c.managed]
    findings.append(Finding("managed constraints", None, f"cannot read {', '.join(managed)} (Org Policy v2: "
                            f"{v2.why()}; Resource Manager v1 cannot express them): enable orgpolicy.googleapis.com "
                            "(`gcloud services enable orgpolicy.googleapis.com`) or ask for roles/orgpolicy.policyViewer"))
    return findings


def image_finding(google: Google, wanted: str, gpu: str) -> tuple[Finding, str | None]:
    """The boot image, resolved to an exact one: a family's newest, or the user's own."""
    match = IMAGE_PATH.fullmatch(wanted)
    base = f"https://compute.googleapis.com/compute/v1/projects/{match['project']}/global/images/"
    try:
        image = google.call("GET", base + (f"family/{match['family']}" if match["family"] else match["name"]))
    except Refused as error:
        if error.status == 404:
            return Finding("boot image", False, f"{wanted} does not exist: pick one from `gcloud compute images list "
                                                f"--project {match['project']} --no-standard-images`"), None
        return Finding("boot image", None, f"cannot read {wanted} ({error.why()})"), None
    exact = f"projects/{match['project']}/global/images/{image['name']}"
    state = (image.get("deprecated") or {}).get("state", "ACTIVE")
    if state in ("OBSOLETE", "DELETED"):
        return Finding("boot image", False, f"{exact} is {state}: pick a current one, e.g. --boot-image "
                                            f"{DEFAULT_FAMILY}"), None
    branch = rules.DRIVER_BRANCH.search(image.get("family") or image["name"])
    fits = rules.driver_fits(gpu, int(branch[1])) if branch else None
    if fits:
        return Finding("boot image", False, f"{exact} has NVIDIA driver branch {branch[1]}, and {fits}: use "
                                            f"--boot-image {DEFAULT_FAMILY}"), None
    note = (f"; warning: DEPRECATED, replaced by {image['deprecated'].get('replacement', '?').rsplit('/', 1)[-1]}"
            if state == "DEPRECATED" else "")
    return Finding("boot image", True, f"{exact}" + (f" (newest of {match['family']})" if match["family"] else "")
                   + note), exact


def terraform_finding() -> Finding:
    required = re.search(r'required_version\s*=\s*">=\s*([0-9.]+)', (MODULE_DIR / "versions.tf").read_text())[1]
    binary = os.environ.get("TFCLUSTER_TERRAFORM") or shutil.which("terraform")
    if not binary or not os.access(binary, os.X_OK):
        return Finding("terraform", False, f"not installed: install Terraform >= {required} "
                                           "(https://developer.hashicorp.com/terraform/install)")
    try:
        out = subprocess.run([binary, "version", "-json"], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "CHECKPOINT_DISABLE": "1"}).stdout
        version = json.loads(out)["terraform_version"]
    except (OSError, subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
        return Finding("terraform", None, f"{binary} did not say its version; the module needs >= {required}")

    def numbers(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", text)[:3])

    if numbers(version) < numbers(required):
        return Finding("terraform", False, f"{version} is older than the module's required_version >= {required}: "
                                           "upgrade it (https://developer.hashicorp.com/terraform/install)")
    return Finding("terraform", True, f"{version} (the module needs >= {required})")


def address_finding(operator_cidr: str) -> Finding:
    if operator_cidr:
        return Finding("your address", True, f"{operator_cidr} (given); SSH is opened to it alone")
    try:
        return Finding("your address", True, f"{detect_operator_cidr()}; SSH is opened to it alone")
    except ConfigError as error:
        return Finding("your address", False, str(error))


def quota_finding(settings, gpu: str, zones: list[str], made: dict | None = None) -> tuple[Finding, Zones | None]:
    """Every quota the cluster takes, judged zone by zone (quota.py); the zones that can take it."""
    from google.api_core import exceptions

    from tfcluster.backends.gcp.cloud.compute import ComputeApi
    from tfcluster.backends.gcp.quotas.quota_source import QuotaSource, judge_zones

    hours = settings.max_run_hours if settings.termination_action == "DELETE" else None
    try:
        api = ComputeApi(settings.project)
        judged = judge_zones(QuotaSource(api, settings.project), zones, gpu, settings.gpu_count, settings.workers,
                             preemptible_quota(settings), hours, settings.machine_type, settings.boot_disk_gb,
                             settings.boot_disk_type, made)
    except exceptions.GoogleAPICallError as error:
        return Finding("quota", None, f"cannot read it ({getattr(error, 'reason', None) or error.code}: "
                                      f"{(error.message or '')[:160]})"), None
    except (OSError, ValueError) as error:  # Transport or an answer that is not JSON: a ?, never a traceback.
        return Finding("quota", None, f"cannot read it ({type(error).__name__}: {str(error)[:160]})"), None
    needed = (f"{settings.workers} x {settings.machine_type}"
              + (f" with {settings.gpu_count} x {gpu}" if settings.gpu_count else ""))
    return Finding("quota", judged.holds, judged.detail(needed)), judged


def prices_finding(project: str) -> Finding:
    """Whether live prices can be read: the Cloud Billing Catalog needs cloudbilling.googleapis.com,
    which most projects have off (https://cloud.google.com/billing/docs/how-to/get-pricing-information-api)."""
    from tfcluster.backends.gcp.prices.pricing import catalog_problem

    problem = catalog_problem(project)
    if not problem:
        return Finding("live prices", True, "the Cloud Billing Catalog answers: estimates and --budget use the cluster's "
                                            "region's prices of the day")
    return Finding("live prices", None, f"the Cloud Billing Catalog cannot be read ({problem}); estimates use "
                                        "tfcluster's dated table of us-central1 list prices, and a --budget holds Spot "
                                        "to the on-demand rate and refuses regions outside the US ones the table covers: `gcloud services enable "
                                        f"cloudbilling.googleapis.com --project {project}`")


def takes_family_quota(settings, gpu: str) -> bool:
    """Whether the cluster takes a quota only Cloud Quotas and Monitoring report (quota.py)."""
    from tfcluster.backends.gcp.quotas.quota import cluster_needs

    needs = cluster_needs(settings.machine_type, gpu, settings.gpu_count, settings.workers)
    return any(not need.quota.metric for need in needs)


def run(settings, made: dict | None = None) -> Report:
    """Every check, in the order a user fixes them. ``made``: zone -> VMs of this cluster already
    there (a resumed `up`)."""
    from tfcluster.backends.gcp.cloud.compute import gpu_type

    gpu = gpu_type(settings.gpu)
    findings = [terraform_finding()]
    credentials_line, credentials = credentials_finding()
    findings.append(credentials_line)
    image = None
    wanted = settings.boot_image or DEFAULT_FAMILY
    names = [f"{settings.cluster}-{index}" for index in range(settings.workers)]
    zones = list(settings.zones) or [settings.zone]
    target = rules.Target(settings.project, zones[0], names, IMAGE_PATH.fullmatch(wanted)["project"])
    judged = None
    if credentials is None:
        findings.append(Finding("Google Cloud", None, "not checked without credentials: APIs, permissions, "
                                                      "organisation policies, quota, boot image"))
    else:
        google = Google(credentials)
        apis = services_finding(google, settings.project, rules.services_for(takes_family_quota(settings, gpu)))
        findings += [apis, permissions_finding(google, settings.project), *constraint_findings(google, target)]
        from tfcluster.backends.gcp.access.iam import service_account_email

        identity, lines = oslogin.findings(credentials, settings, [
            service_account_email(settings.project, settings.cluster, index) for index in range(settings.workers)])
        findings = oslogin.reconciled(findings, identity) + lines
        quota_line, judged = quota_finding(settings, gpu, zones, made)
        findings += [quota_line, prices_finding(settings.project)]
        if settings.reservation not in ("any", "none"):  # --reservation NAME (reservations.py).
            findings.append(reservations.check_finding(settings, gpu, zones))
        image_line, image = image_finding(google, wanted, gpu)
        findings.append(image_line)
    findings.append(address_finding(settings.operator_cidr))
    usable = judged.usable if judged is not None else zones
    return Report(findings, image, usable, [f"zone {zone} dropped: {why}" for zone, why in
                                            (judged.dropped if judged is not None and judged.usable else [])],
                  identity if credentials is not None else oslogin.Identity("metadata", "not checked"))
