"""Google Cloud: Terraform provisions the VMs, bucket, firewall and service account; the
ssh backend then runs the job on them.

The control plane sits behind two narrow seams, both replaceable in tests:
- ``Terraform``: the terraform binary (``TFCLUSTER_TERRAFORM`` may name another one);
- ``ComputeApi``: google-cloud-compute over REST (``TFCLUSTER_COMPUTE_ENDPOINT`` may point
  it at an ``http://`` server that speaks the same REST shapes).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tfcluster.backends.ssh import SshBackend, in_parallel
from tfcluster.errors import ClusterError, ConfigError, HostErrors, TfClusterError
from tfcluster.state import ClusterState, HostRecord

MODULE_DIR = Path(__file__).resolve().parent.parent.parent / "terraform"
STARTUP_DIR = MODULE_DIR.parent / "startup"
PRICES = Path(__file__).resolve().parent.parent / "prices.json"
GPU_TYPES = {"t4": "nvidia-tesla-t4", "v100": "nvidia-tesla-v100"}
GPU_QUOTA = {"nvidia-tesla-t4": "NVIDIA_T4_GPUS", "nvidia-tesla-v100": "NVIDIA_V100_GPUS"}
VM_PYTHON = "/opt/tfcluster/venv/bin/python"
LABEL = "tfcluster-cluster"


class TerraformError(TfClusterError):
    """terraform failed; keeps its stderr, shows the first error line."""

    def __init__(self, action: str, stderr: str):
        self.stderr = stderr
        lines = [line.strip(" │╷╵") for line in stderr.splitlines()]
        errors = [line for line in lines if line.startswith("Error:")]
        summary = errors[0] if errors else next((line for line in reversed(lines) if line), "no output")
        super().__init__(f"terraform {action} failed: {summary} (full output in the cluster's terraform.log); "
                         "fix it and re-run the same command: it resumes, or `invoke down` removes what exists")


class Terraform:
    """The terraform CLI on one working directory: argument lists, -chdir, -input=false."""

    def __init__(self, workdir: Path, binary: str | None = None):
        self.workdir = workdir
        self.binary = binary or os.environ.get("TFCLUSTER_TERRAFORM") or shutil.which("terraform")
        if not self.binary or not os.access(self.binary, os.X_OK):
            raise ConfigError("terraform is not installed; install Terraform >= 1.5 "
                              "(https://developer.hashicorp.com/terraform/install) or set TFCLUSTER_TERRAFORM")

    def run(self, action: str, *args: str) -> str:
        argv = [self.binary, f"-chdir={self.workdir}", action, *args]
        env = {**os.environ, "CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1"}
        result = subprocess.run(argv, capture_output=True, text=True, env=env)
        with open(self.workdir / "terraform.log", "a") as log:
            log.write(f"$ {' '.join(argv)}\n{result.stdout}\n{result.stderr}\n")
        if result.returncode != 0:
            raise TerraformError(action, result.stderr)
        return result.stdout

    def prepare(self, variables: dict) -> None:
        """Copy the module into the cluster's own folder (its own state), write the tfvars, init."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        for source in MODULE_DIR.glob("*.tf"):
            shutil.copyfile(source, self.workdir / source.name)
        (self.workdir / "terraform.tfvars.json").write_text(json.dumps(variables, indent=2, sort_keys=True))
        self.run("init", "-input=false", "-no-color")

    def apply(self) -> None:
        self.run("apply", "-input=false", "-auto-approve", "-no-color")

    def destroy(self) -> None:
        self.run("destroy", "-input=false", "-auto-approve", "-no-color")

    def outputs(self) -> "TerraformOutputs":
        return TerraformOutputs.parse(json.loads(self.run("output", "-json", "-no-color") or "{}"))


@dataclass
class GcpInstance:
    # VM name, e.g. demo-0 (index 0 is the chief).
    name: str
    # Zone, e.g. us-west1-b.
    zone: str
    # Address the other workers use (TF_CONFIG).
    internal_ip: str
    # Address the laptop uses for SSH.
    external_ip: str


@dataclass
class TerraformOutputs:
    # VMs in worker order.
    instances: list[GcpInstance]
    # Cluster bucket name.
    bucket: str
    # The VMs' service account email.
    service_account: str
    # Labels on every VM.
    labels: dict[str, str]

    @classmethod
    def parse(cls, raw: dict) -> "TerraformOutputs":
        """From `terraform output -json`: {"name": {"value": ..., "type": ..., "sensitive": ...}}."""
        try:
            value = {name: item["value"] for name, item in raw.items()}
            instances = [GcpInstance(name=vm["name"], zone=vm["zone"].rsplit("/", 1)[-1],
                                     internal_ip=vm["internal_ip"], external_ip=vm["external_ip"])
                         for vm in value["instances"]]
            return cls(instances, value["bucket"], value["service_account"], dict(value.get("labels", {})))
        except (KeyError, TypeError) as error:
            raise ClusterError(f"terraform outputs are incomplete ({error}); run `invoke up` again") from None


class ComputeApi:
    """The few Compute Engine calls tfcluster makes, through google-cloud-compute (REST)."""

    def __init__(self, project: str, endpoint: str | None = None):
        from google.cloud import compute_v1

        self.project = project
        endpoint = endpoint or os.environ.get("TFCLUSTER_COMPUTE_ENDPOINT")
        options = {"api_endpoint": endpoint} if endpoint else None
        if endpoint:
            from google.auth.credentials import AnonymousCredentials

            credentials = AnonymousCredentials()
        else:
            credentials = default_credentials()
        kwargs = {"transport": "rest", "client_options": options, "credentials": credentials}
        self.compute_v1 = compute_v1
        self.accelerators = compute_v1.AcceleratorTypesClient(**kwargs)
        self.regions = compute_v1.RegionsClient(**kwargs)
        self.projects = compute_v1.ProjectsClient(**kwargs)
        self.instances = compute_v1.InstancesClient(**kwargs)

    def accelerator_types(self, zone: str) -> set[str]:
        return {item.name for item in self.accelerators.list(project=self.project, zone=zone)}

    def region_quotas(self, region: str) -> dict[str, tuple[float, float]]:
        region_info = self.regions.get(project=self.project, region=region)
        return {quota.metric: (quota.limit, quota.usage) for quota in region_info.quotas}

    def project_quotas(self) -> dict[str, tuple[float, float]]:
        project_info = self.projects.get(project=self.project)
        return {quota.metric: (quota.limit, quota.usage) for quota in project_info.quotas}

    def guest_attributes(self, zone: str, instance: str, query_path: str) -> dict[str, str] | None:
        """{key: value} under ``query_path`` (e.g. "tfcluster/"), or None when nothing is there yet."""
        from google.api_core import exceptions

        try:
            request = self.compute_v1.GetGuestAttributesInstanceRequest(
                project=self.project, zone=zone, instance=instance, query_path=query_path)
            result = self.instances.get_guest_attributes(request=request)
        except exceptions.NotFound:
            return None
        return {item.key: item.value for item in result.query_value.items}

    def get_instance(self, zone: str, name: str):
        return self.instances.get(project=self.project, zone=zone, instance=name)

    def set_metadata(self, zone: str, name: str, changes: dict[str, str]) -> None:
        """Update some metadata keys, keeping the rest; the fingerprint guards against races."""
        instance = self.get_instance(zone, name)
        items = {item.key: item.value for item in instance.metadata.items}
        items.update(changes)
        metadata = self.compute_v1.Metadata(
            fingerprint=instance.metadata.fingerprint,
            items=[self.compute_v1.Items(key=key, value=value) for key, value in sorted(items.items())])
        self.instances.set_metadata(project=self.project, zone=zone, instance=name,
                                    metadata_resource=metadata).result(timeout=120)

    def start(self, zone: str, name: str) -> None:
        self.instances.start(project=self.project, zone=zone, instance=name).result(timeout=300)

    def list_cluster(self, zone: str, cluster: str) -> list:
        request = self.compute_v1.ListInstancesRequest(project=self.project, zone=zone,
                                                       filter=f"labels.{LABEL}={cluster}")
        return list(self.instances.list(request=request))


def default_credentials():
    """Application Default Credentials, or a ConfigError that says how to get them."""
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    except DefaultCredentialsError:
        raise ConfigError("no Google Cloud credentials; run `gcloud auth application-default login` "
                          "(or set GOOGLE_APPLICATION_CREDENTIALS to a key file)") from None
    return credentials


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def gpu_type(name: str) -> str:
    full = GPU_TYPES.get(name.lower(), name.lower())
    if full not in GPU_QUOTA:
        raise ConfigError(f"gpu must be one of t4, v100 (got {name!r})")
    return full


def preflight_quota(api: ComputeApi, zone: str, gpu: str, gpu_count: int, workers: int, spot: bool) -> None:
    """The zone offers the GPU, and the regional and global GPU quotas cover the cluster."""
    if gpu_count == 0:
        return
    offered = api.accelerator_types(zone)
    if gpu not in offered:
        raise ConfigError(f"zone {zone} does not offer {gpu} (it has: {', '.join(sorted(offered)) or 'no GPUs'}); "
                          f"pick a zone from `gcloud compute accelerator-types list --filter=name={gpu}`")
    needed = gpu_count * workers
    metric = ("PREEMPTIBLE_" if spot else "") + GPU_QUOTA[gpu]
    region = region_of(zone)
    limit, usage = api.region_quotas(region).get(metric, (0.0, 0.0))
    if limit - usage < needed:
        raise ConfigError(f"quota {metric} in {region} has {limit - usage:g} GPUs free (limit {limit:g}, used "
                          f"{usage:g}); the cluster needs {needed}. Request more in the console: IAM & Admin > "
                          f"Quotas, filter {metric}, region {region}")
    limit, usage = api.project_quotas().get("GPUS_ALL_REGIONS", (0.0, 0.0))
    if limit - usage < needed:
        raise ConfigError(f"quota GPUS_ALL_REGIONS has {limit - usage:g} GPUs free (limit {limit:g}); the "
                          f"cluster needs {needed}. Request more in the console: IAM & Admin > Quotas, "
                          "filter GPUS_ALL_REGIONS")


def wait_ready(api: ComputeApi, zone: str, names: list[str], timeout: float,
               on_progress: Callable[[dict[str, str]], None] = lambda states: None,
               poll_seconds: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
    """Poll each VM's tfcluster/ready guest attribute until all say "ok"; name the VM otherwise."""
    states = {name: "booting" for name in names}
    deadline = clock() + timeout
    while True:
        for name in names:
            if states[name] == "ok" or states[name].startswith("error"):
                continue
            attributes = api.guest_attributes(zone, name, "tfcluster/") or {}
            states[name] = attributes.get("ready", "booting")
        on_progress(dict(states))
        errors = {name: state for name, state in states.items() if state.startswith("error")}
        if errors:
            raise HostErrors("VM start-up", errors)
        if all(state == "ok" for state in states.values()):
            return
        if clock() > deadline:
            late = {name: f"not ready after {timeout:.0f}s (last: {state}); see its serial console: "
                          f"gcloud compute instances get-serial-port-output {name} --zone {zone}"
                    for name, state in states.items() if state != "ok"}
            raise HostErrors("waiting for the VMs", late)
        time.sleep(poll_seconds)


def pinned_host_key(api: ComputeApi, zone: str, name: str) -> str:
    """The VM's SSH host key as published by its guest agent (hostkeys/), never from first contact."""
    keys = api.guest_attributes(zone, name, "hostkeys/") or {}
    for key_type in ("ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa"):
        if keys.get(key_type):
            return f"{key_type} {keys[key_type].split()[-1] if ' ' in keys[key_type] else keys[key_type]}"
    raise ClusterError(f"{name} published no SSH host key in its guest attributes (hostkeys/); "
                       "enable-guest-attributes must be TRUE and the guest agent running")


def hourly_cost(machine_type: str, gpu: str, gpu_count: int, disk_gb: int, workers: int, spot: bool) -> dict:
    """Estimated USD per hour for the cluster, from the price table in the repo."""
    prices = json.loads(PRICES.read_text())
    _, family, size = machine_type.split("-")
    vcpus = int(size)
    memory_gib = {"standard": 3.75, "highmem": 6.5, "highcpu": 0.9}[family] * vcpus
    vm = vcpus * prices["n1_vcpu_hour"] + memory_gib * prices["n1_memory_gib_hour"]
    gpus = gpu_count * prices["gpu_hour"][gpu]
    disk = disk_gb * prices["pd_balanced_gib_month"] / 730
    factor = (1 - prices["spot_discount"]) if spot else 1.0
    per_vm = (vm + gpus) * factor + disk
    return {"vm": vm * factor, "gpu": gpus * factor, "disk": disk, "per_vm": per_vm,
            "total": per_vm * workers, "source": prices["source"], "date": prices["date"]}


def detect_operator_cidr(timeout: float = 5.0) -> str:
    """This machine's public IPv4 as a /32, for the SSH firewall rule."""
    for url in ("https://checkip.amazonaws.com", "https://api.ipify.org"):
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                address = response.read().decode().strip()
            if address.count(".") == 3:
                return f"{address}/32"
        except OSError:
            continue
    raise ConfigError("cannot detect your public IP for the SSH firewall rule; set it with "
                      "--operator-cidr A.B.C.D/32 (or tfcluster.operator_cidr)")


def generate_cluster_key(path: Path, comment: str) -> str:
    """A new ed25519 key pair for this cluster only: private key 0600 at ``path``; returns the public line."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if path.exists():
        return Path(f"{path}.pub").read_text().strip()
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(private)
    line = f"{public.decode()} {comment}"
    Path(f"{path}.pub").write_text(line + "\n")
    return line


class GcpBackend(SshBackend):
    """Terraform-provisioned GPU VMs reached with the cluster's own SSH key and pinned host keys."""

    name = "gcp"

    def workdir(self, cluster_name: str) -> Path:
        return self._store.root / "gcp" / cluster_name

    def variables(self, settings, public_key: str, operator_cidr: str) -> dict:
        return {
            "project": settings.project, "zone": settings.zone, "cluster_name": settings.cluster,
            "workers": settings.workers, "machine_type": settings.machine_type,
            "gpu_type": gpu_type(settings.gpu), "gpu_count": settings.gpu_count, "spot": settings.spot,
            "operator_cidr": operator_cidr, "tf_port": settings.tf_port, "ssh_user": settings.gcp_ssh_user,
            "ssh_public_key": public_key, "idle_minutes": settings.idle_minutes,
            "idle_action": settings.idle_action, "max_run_hours": settings.max_run_hours,
            "termination_action": settings.termination_action, "boot_disk_gb": settings.boot_disk_gb,
            "bucket_force_destroy": settings.bucket_force_destroy,
            "startup_script": str(STARTUP_DIR / "startup.sh"),
            "watchdog_script": str(STARTUP_DIR / "watchdog.py"),
        }

    def up(self, settings, existing):
        if existing is not None:
            return existing
        if not settings.project or not settings.zone:
            raise ConfigError("the gcp backend needs --project and --zone (or tfcluster.project / "
                              "tfcluster.zone in invoke.yaml)")
        gpu = gpu_type(settings.gpu)
        terraform = Terraform(self.workdir(settings.cluster))  # Fails early if terraform is missing.
        api = ComputeApi(settings.project)  # Fails early without credentials.
        cost = hourly_cost(settings.machine_type, gpu, settings.gpu_count, settings.boot_disk_gb,
                           settings.workers, settings.spot)
        self._announce(
            f"plan: {settings.workers} x {settings.machine_type} + {settings.gpu_count} x {gpu}"
            f"{' (SPOT)' if settings.spot else ''} in {settings.zone}, bucket, VPC, firewall, service account; "
            f"about ${cost['total']:.2f}/hour (${cost['per_vm']:.2f} per VM: VM ${cost['vm']:.2f} + GPU "
            f"${cost['gpu']:.2f} + disk ${cost['disk']:.3f}; prices of {cost['date']})")
        self._announce(
            f"safety: idle watchdog {settings.idle_action}s a VM after {settings.idle_minutes} idle minutes"
            f"{' (off)' if not settings.idle_minutes else ''}; hypervisor deadline {settings.termination_action} "
            f"after {settings.max_run_hours} h; `invoke down` destroys everything")
        preflight_quota(api, settings.zone, gpu, settings.gpu_count, settings.workers, settings.spot)
        operator = settings.operator_cidr or detect_operator_cidr()
        key_file = self.workdir(settings.cluster) / "id_ed25519"
        public_key = generate_cluster_key(key_file, f"tfcluster-{settings.cluster}")
        # Recorded before anything is created: a failed apply can be resumed by `up` or
        # removed by `down`, never forgotten while it bills.
        self._store.save_cluster(ClusterState(name=settings.cluster, backend=self.name, hosts=[],
                                              status="provisioning", project=settings.project,
                                              zone=settings.zone, ssh_key=str(key_file)))
        terraform.prepare(self.variables(settings, public_key, operator))
        terraform.apply()
        outputs = terraform.outputs()
        names = [vm.name for vm in outputs.instances]
        wait_ready(api, settings.zone, names, settings.ready_timeout_seconds,
                   on_progress=lambda states: None, poll_seconds=min(5.0, settings.ready_timeout_seconds / 10))
        keys = in_parallel(outputs.instances, lambda vm: pinned_host_key(api, settings.zone, vm.name),
                           lambda vm: vm.name, "reading host keys")
        records = [HostRecord(name=f"worker-{i}", address=vm.internal_ip, ssh_address=vm.external_ip,
                              tf_port=settings.tf_port, host_key=key, instance=vm.name)
                   for i, (vm, key) in enumerate(zip(outputs.instances, keys))]
        cluster = ClusterState(name=settings.cluster, backend=self.name, hosts=records,
                               ssh_user=settings.gcp_ssh_user, ssh_key=str(key_file),
                               python=settings.python or VM_PYTHON, project=settings.project,
                               zone=settings.zone, bucket=outputs.bucket)
        self._resolve_roots(cluster, settings.remote_dir)
        self.preflight(cluster, self.hosts(cluster), need_tensorflow=True)
        return cluster

    def stage(self, cluster, hosts, run_id: str, payload):
        """As ssh, but model, checkpoints and TensorBoard go to the bucket, so `--retries`
        resumes from it whichever VM restarts, and results survive the VMs."""
        staged = super().stage(cluster, hosts, run_id, payload)
        base = f"gs://{cluster.bucket}/runs/{run_id}"
        staged.env.update({"AIP_MODEL_DIR": f"{base}/model", "AIP_CHECKPOINT_DIR": f"{base}/checkpoints",
                           "AIP_TENSORBOARD_LOG_DIR": f"{base}/tensorboard"})
        return staged

    def before_retry(self, hosts, run_id: str) -> None:
        """The backup is on the bucket, which every worker reads: nothing to copy."""

    def collect(self, hosts, run_id: str, local_run_dir: Path, succeeded: bool) -> str | None:
        """Logs come back over SSH; the model stays on the bucket (`invoke pull` fetches it)."""
        super().collect(hosts, run_id, local_run_dir, succeeded=False)
        return None

    def leftover_processes(self, cluster) -> list[str]:
        """Nothing to check over SSH: destroy removes the VMs, and teardown proves it."""
        return []

    def kill_leftovers(self, cluster) -> None:
        """See leftover_processes."""

    def _api(self, cluster) -> ComputeApi:
        return ComputeApi(cluster.project)

    def set_idle(self, cluster, idle_minutes: int, action: str) -> None:
        """Change the watchdog settings in every VM's metadata; each reads them on its next poll."""
        api = self._api(cluster)
        changes = {"tfcluster-idle-minutes": str(idle_minutes), "tfcluster-idle-action": action}
        in_parallel([r.instance for r in cluster.hosts], lambda name: api.set_metadata(cluster.zone, name, changes),
                    str, "changing the idle watchdog")

    def watchdog_status(self, cluster) -> dict[str, dict | None]:
        api = self._api(cluster)

        def read(record) -> dict | None:
            raw = (api.guest_attributes(cluster.zone, record.instance, "tfcluster/") or {}).get("watchdog")
            return json.loads(raw) if raw else None

        return dict(zip([r.name for r in cluster.hosts],
                        in_parallel(cluster.hosts, read, lambda r: r.instance, "reading watchdog status")))

    def hypervisor_deadlines(self, cluster) -> dict[str, float | None]:
        """When max_run_duration stops each running VM: its last start plus the duration."""
        from datetime import datetime

        api = self._api(cluster)
        deadlines = {}
        for record in cluster.hosts:
            instance = api.get_instance(cluster.zone, record.instance)
            seconds = instance.scheduling.max_run_duration.seconds
            started = instance.last_start_timestamp or instance.creation_timestamp
            deadlines[record.name] = (datetime.fromisoformat(started).timestamp() + seconds
                                      if instance.status == "RUNNING" and seconds and started else None)
        return deadlines

    def refresh(self, cluster, settings) -> None:
        """`up` on an existing cluster: start VMs the watchdog or the deadline stopped (nothing is
        re-created), wait until they are ready, and restore the configured idle settings."""
        api = self._api(cluster)
        stopped = [vm.name for vm in api.list_cluster(cluster.zone, cluster.name)
                   if vm.status in ("TERMINATED", "STOPPED", "SUSPENDED")]
        if stopped:
            self._announce(f"starting {len(stopped)} stopped VM(s): {', '.join(stopped)} (nothing is re-created)")
            in_parallel(stopped, lambda name: api.start(cluster.zone, name), str, "starting VMs")
            wait_ready(api, cluster.zone, stopped, settings.ready_timeout_seconds,
                       poll_seconds=min(5.0, settings.ready_timeout_seconds / 10))
        self.set_idle(cluster, settings.idle_minutes, settings.idle_action)

    def stop_watchdog(self, cluster) -> None:
        """The VMs go away with `terraform destroy`."""

    def vm_rows(self, cluster, settings) -> list[dict]:
        """Each VM's state, uptime and cost so far, from instances.list."""
        api = ComputeApi(cluster.project)
        cost = hourly_cost(settings.machine_type, gpu_type(settings.gpu), settings.gpu_count,
                           settings.boot_disk_gb, 1, settings.spot)
        rows = []
        for vm in api.list_cluster(cluster.zone, cluster.name):
            started = vm.last_start_timestamp or vm.creation_timestamp
            uptime = 0.0
            if vm.status == "RUNNING" and started:
                from datetime import datetime

                uptime = max(0.0, time.time() - datetime.fromisoformat(started).timestamp())
            rows.append({"name": vm.name, "status": vm.status, "uptime_seconds": uptime,
                         "cost_so_far": cost["per_vm"] * uptime / 3600})
        return rows

    def teardown(self, cluster, keep: bool) -> None:
        terraform = Terraform(self.workdir(cluster.name))
        self._announce(f"destroying the VMs, bucket {cluster.bucket} (kept if it holds objects and "
                       "bucket_force_destroy is false), firewall rules, network and service account")
        terraform.destroy()
        api = ComputeApi(cluster.project)
        remaining = [vm.name for vm in api.list_cluster(cluster.zone, cluster.name)]
        if remaining:
            raise ClusterError(f"instances still exist after destroy: {', '.join(remaining)}; delete them with "
                               f"`gcloud compute instances delete {' '.join(remaining)} --zone {cluster.zone}`")
        self._announce(f"verified with instances.list (label {LABEL}={cluster.name}): no instance is left")
