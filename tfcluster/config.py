"""The one typed configuration object, read through invoke's config system.

Precedence (lowest first): the defaults below, the project's ``invoke.yaml``
(key ``tfcluster``), ``INVOKE_TFCLUSTER_*`` environment variables, then flags.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

import tfcluster.gpus as gpu_table
import tfcluster.machines as machines
import tfcluster.provisioning as provisioning
import tfcluster.sources as sources
from tfcluster.machines import GCP_CLUSTER_NAME  # noqa: F401 (terraform's validation agrees with it)
from tfcluster.sources import flag_hint, take_environment, user_state_dir  # noqa: F401 (the settings' own)
from tfcluster.errors import ConfigError
from tfcluster.money import parse_usd
from tfcluster.ports import parse_range

BACKENDS = ("local", "ssh", "gcp", "vertex")
IDLE_ACTIONS = ("stop", "delete")
TERMINATION_ACTIONS = ("STOP", "DELETE")
# Which Keras `tf.keras` means for a --script: "2" is tf_keras (TF_USE_LEGACY_KERAS=1), "3" is Keras 3.
# Named by major version, as TensorFlow's release notes do ("to keep Keras 2, install tf_keras").
KERAS_VERSIONS = ("2", "3")
ZONE = re.compile(r"[a-z]+-[a-z]+[0-9]+-[a-z]")
CLUSTER_NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")


@dataclass(frozen=True)
class Settings:
    # Cluster name; its state lives in <state_dir>/clusters/<cluster>.json.
    cluster: str = "default"
    # Where machines come from: "local" runs worker processes on this machine.
    backend: str = "local"
    # Workers `up` creates; `train --workers` may use fewer.
    workers: int = 3
    # Local folder for cluster state, run records, logs and fetched results; empty is the per-user
    # state folder (user_state_dir), the same from any folder. A project's own folder is set here.
    state_dir: str = ""
    # Interpreter that runs the workers; empty means the one running invoke.
    python: str = ""
    # TFRecord folder for the bundled trainer; empty means the built-in synthetic set.
    data_dir: str = ""
    # What tf.keras is for a --script: "2" (tf_keras; Keras 3's fit fails under multi-worker
    # MirroredStrategy, keras-team/keras#20585) or "3" (Keras 3, for custom loops with strategy.run).
    keras: str = "2"
    # Restarts after a failed attempt; each resumes from the last checkpoint.
    retries: int = 0
    # Seconds a stopping worker gets between SIGTERM and SIGKILL.
    stop_grace_seconds: float = 5.0
    # ssh backend: comma-separated host or host:sshport, one worker per entry.
    hosts: str = ""
    # ssh backend: login user and private key file.
    ssh_user: str = "root"
    ssh_key: str = "~/.ssh/id_ed25519"
    # ssh backend: known_hosts file that vouches for the hosts' keys at `up`.
    known_hosts: str = "~/.ssh/known_hosts"
    # ssh backend: pin keys of hosts missing from known_hosts (fingerprints are printed).
    trust_new_hosts: bool = False
    # ssh backend: TensorFlow gRPC port on every host.
    tf_port: int = 23456
    # ssh/gcp: `tune`'s oracle port on the chief's machine (local clusters take a free one).
    oracle_port: int = 23457
    # local: ports the workers and `tune`'s oracle may use, "FIRST-LAST"; empty: any free one.
    local_ports: str = ""
    # ssh backend: folder (relative to the login's home, or absolute) for runs, code and data.
    remote_dir: str = ".tfcluster-remote"
    # gcp: project ID and zone (the zone must offer the GPU).
    project: str = ""
    zone: str = ""
    # vertex: the region the jobs run in (e.g. us-central1); empty is the zone's region.
    region: str = ""
    # gcp: zones a new cluster's `up` may use, in order (after `zone`, when set): when one has no
    # capacity or no quota for the VMs, `up` removes what it made there and tries the next.
    zones: tuple = ()
    # gcp: GPU (t4, v100, l4, a100, a100-80gb or h100; tfcluster/gpus.py) and GPUs per VM.
    gpu: str = "t4"
    gpu_count: int = 1
    # gcp: machine type; empty picks one: n1-standard-8 for T4 and V100, else the family's type
    # with gpu_count GPUs (l4 -> g2-standard-8, a100 -> a2-highgpu-1g, ...).
    machine_type: str = ""
    # gcp: boot disk size in GB and type (pd-balanced, pd-ssd or pd-standard; A3 and G2 take no pd-standard).
    boot_disk_gb: int = 100
    boot_disk_type: str = "pd-balanced"
    # gcp: the VMs' NIC type (VIRTIO_NET or GVNIC); empty is the family's need (GVNIC on A3), else Google's default.
    nic_type: str = ""
    # gcp: SPOT VMs (cheaper, may be stopped by Google; training resumes from the checkpoint).
    spot: bool = False
    # gcp: the VMs' provisioning model, standard, spot (= `spot`) or flex-start (Dynamic Workload
    # Scheduler: waits for capacity, runs at most 7 days, discounted); tfcluster/provisioning.py.
    provisioning: str = "standard"
    # gcp: the reservation on-demand VMs consume: any (an open matching one, Compute's default), none, or a name.
    reservation: str = "any"
    # gcp: "auto" tries, per zone, a matching reservation, Spot (with --spot), on-demand, then Flex-start.
    capacity: str = ""
    # gcp: how long `up` waits for Flex-start capacity, in minutes (--capacity-wait; 0 asks once per zone).
    capacity_wait_minutes: float = 30.0
    # gcp: the only source allowed to SSH in; empty means this machine's public IP /32.
    operator_cidr: str = ""
    # gcp: login created on the VMs for the cluster's own key.
    gcp_ssh_user: str = "tfcluster"
    # gcp: how the operator logs in to the VMs: oslogin (the key in the operator's OS Login profile),
    # metadata (the key in instance metadata) or auto (OS Login where the project requires it);
    # tfcluster/backends/gcp/access/oslogin.py.
    ssh_identity: str = "auto"
    # Idle watchdog: minutes idle before acting (0 = off) and the action (stop or delete).
    idle_minutes: int = 30
    idle_action: str = "stop"
    # gcp: minutes the boot script's work counts as activity for the watchdog, at most (a slow
    # first boot is not stopped; a hung one does not bill for ever).
    boot_grace_minutes: int = 45
    # gcp: hypervisor deadline (hours after each start) and what it does (STOP or DELETE).
    max_run_hours: int = 12
    # gcp: the cluster's cap in USD (`up --budget`; the deadline of tfcluster/backends/gcp/spend/budget.py); 0 = none.
    budget: float = 0.0
    termination_action: str = "STOP"
    # gcp: let `down` delete a bucket that still holds objects.
    bucket_force_destroy: bool = False
    # gcp: an opt-in lifecycle rule deleting the bucket's live objects after this many days;
    # 0 keeps them until the user deletes them (old versions always go a day after replacement).
    bucket_retention_days: int = 0
    # gcp: a COLLOCATED placement policy for multi-VM GPU clusters of a series that supports it
    # (tfcluster/backends/gcp/zones/placement.py); false leaves the VMs anywhere in the zone.
    compact_placement: bool = True
    # gcp: where the bucket lives (a region such as us-west1, or a multi-region such as US);
    # empty is the VMs' region, where reads from the VMs cost nothing.
    bucket_location: str = ""
    # gcp: how long `up` waits for every VM's readiness attribute.
    ready_timeout_seconds: float = 1200.0
    # gcp: restarting a preempted Spot VM in a zone without capacity: the first wait (doubling
    # each try, at most 5 minutes) and how many starts to try before giving up.
    capacity_wait_seconds: int = 30
    capacity_tries: int = 8
    # ssh: install the idle watchdog on the hosts at `up` (set by `up --idle-minutes N`).
    install_watchdog: bool = False
    # Container image the workers run in (`train --image`); empty runs `python` on the hosts.
    image: str = ""
    # gcp: the VMs' boot image, projects/P/global/images/NAME or .../images/family/FAMILY; empty is
    # the Deep Learning VM CUDA family (tfcluster/backends/gcp/access/check.py). `up` writes the exact image.
    boot_image: str = ""
    # Registry `invoke image build` pushes to (HOST[:PORT]/PATH); gcp: the cluster's Artifact Registry.
    registry: str = ""

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir).expanduser().resolve() if self.state_dir else user_state_dir()


DEFAULTS: dict[str, Any] = dataclasses.asdict(Settings())
# invoke adapts an INVOKE_TFCLUSTER_* variable to its default's type and cannot make a list of
# one: a str default lets `zones` come as "a,b,c" from the variable and as a list from invoke.yaml.
DEFAULTS["zones"] = ""
# Upper bounds terraform/variables.tf validates (a cluster of VMs, a boot disk in GB).
MAX_WORKERS = 64
MAX_BOOT_DISK_GB = 2000


def _where(key: str) -> str:
    """Where ``key`` is set: a setting in three places, a task's own flag (`logs --worker`,
    `tensorboard --port`) only on the command line."""
    return flag_hint(key) if key in DEFAULTS else f"--{key.replace('_', '-')} (a flag of this task, not a setting)"


def parse_int(key: str, value: Any, minimum: int) -> int:
    """An int >= minimum from a flag, YAML or env value, or a ConfigError naming the key."""
    if isinstance(value, bool):
        raise ConfigError(f"{key} must be a whole number >= {minimum} (got {value!r}); "
                          f"set it in {_where(key)}")
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ConfigError(f"{key} must be a whole number >= {minimum} (got {value!r}); "
                          f"set it in {_where(key)}") from None
    if number < minimum:
        raise ConfigError(f"{key} must be >= {minimum} (got {number}); set it in {_where(key)}")
    return number


# Docker's reference grammar, simplified: [registry[:port]/]path[:tag][@digest], lowercase path.
IMAGE_REFERENCE = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)*"
                             r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$")


def parse_image(key: str, value: Any) -> str:
    """An image reference such as trainer:1 or us-docker.pkg.dev/P/REPO/trainer:1 ("" = none)."""
    image = str(value or "").strip()
    if image and not IMAGE_REFERENCE.match(image):
        raise ConfigError(f"{key} must be an image reference such as trainer:1 or "
                          f"us-docker.pkg.dev/PROJECT/REPO/trainer:1 (got {value!r})")
    return image


BOOT_IMAGE = re.compile(r"projects/[a-z0-9-]+/global/images/(family/)?[a-z0-9-]+")


def parse_boot_image(value: Any) -> str:
    """A Compute Engine image or image family path ("" = the default family)."""
    image = str(value or "").strip()
    if image and not BOOT_IMAGE.fullmatch(image):
        raise ConfigError("boot_image must be projects/PROJECT/global/images/NAME or "
                          f"projects/PROJECT/global/images/family/FAMILY (got {value!r})")
    return image


def parse_zones(zone: Any, zones: Any) -> list[str]:
    """``zone`` first, then ``zones`` (a list, or comma-separated from a variable), each once."""
    listed = zones.split(",") if isinstance(zones, str) else list(zones or ())
    if str(zone or "").strip() == "auto" and not any(str(item).strip() for item in listed):
        return ["auto"]  # --zone auto, alone: resolved by the gcp backend (failover.with_auto_zones).
    found = []
    for item in [zone or "", *listed]:
        name = str(item).strip()
        if not name or name in found:
            continue
        if not ZONE.fullmatch(name):  # The module's own validation (terraform/variables.tf zone).
            raise ConfigError(f"a zone must be a name such as us-west1-b, or auto alone in --zone or tfcluster.zone "
                              f"(got {name!r}); fix --zone, tfcluster.zone or tfcluster.zones (a list) in invoke.yaml")
        found.append(name)
    return found


def parse_bool(key: str, value: Any) -> bool:
    """A bool from a flag, YAML or an env var string."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off", ""):
        return False
    raise ConfigError(f"{key} must be true or false (got {value!r})")


def load(config: Mapping[str, Any] | None = None, **overrides: Any) -> Settings:
    """Settings from invoke's merged ``tfcluster`` config plus flag overrides (None = unset: the
    default; a YAML key with no value is unset too)."""
    if config is not None and not isinstance(config, Mapping):
        raise ConfigError(f"tfcluster in invoke.yaml must be a mapping of settings, such as `workers: 3` on its own "
                          f"indented line (got {config!r})")
    known = {f.name for f in fields(Settings)}
    merged = dict(DEFAULTS)
    for key, value in dict(config or {}).items():
        if key not in known:
            raise ConfigError(f"unknown setting tfcluster.{key}; valid keys: {', '.join(sorted(known))}")
        if value is not None:
            merged[key] = value
    merged.update({key: value for key, value in overrides.items() if value is not None})
    sources.check_kinds(merged, {item.name: item.default for item in fields(Settings)})
    return validate(merged)


def parse_port(key: str, value: Any) -> int:
    """A TCP port from a flag: 1-65535."""
    port = parse_int(key, value, 1)
    if port > 65535:
        raise ConfigError(f"{key} must be a port between 1 and 65535 (got {port})")
    return port


def validate(values: Mapping[str, Any]) -> Settings:
    backend = str(values["backend"]).strip().lower()
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)} (got {values['backend']!r})")
    cluster = str(values["cluster"])
    if not CLUSTER_NAME.match(cluster):
        raise ConfigError(f"cluster must be lowercase letters, digits and dashes, starting with a "
                          f"letter, at most 31 characters (got {cluster!r})")
    try:
        grace = float(values["stop_grace_seconds"])
    except (TypeError, ValueError):
        grace = -1.0
    if not 0 < grace <= 300:
        raise ConfigError(f"stop_grace_seconds must be a number in (0, 300] (got {values['stop_grace_seconds']!r})")
    # Unprivileged ports only, as terraform/variables.tf validates them: a worker runs as a user.
    tf_port = parse_int("tf_port", values["tf_port"], 1024)
    if tf_port > 65535:
        raise ConfigError(f"tf_port must be between 1024 and 65535 (got {tf_port})")
    oracle_port = parse_int("oracle_port", values["oracle_port"], 1024)
    if oracle_port > 65535 or oracle_port == tf_port:
        raise ConfigError(f"oracle_port must be between 1024 and 65535 and differ from tf_port {tf_port} "
                          f"(got {oracle_port})")
    # The module's limits (terraform/variables.tf), for every backend: one range to learn.
    workers = parse_int("workers", values["workers"], 1)
    if workers > MAX_WORKERS:
        raise ConfigError(f"workers must be between 1 and {MAX_WORKERS} (got {workers})")
    boot_disk_gb = parse_int("boot_disk_gb", values["boot_disk_gb"], 50)
    if boot_disk_gb > MAX_BOOT_DISK_GB:
        raise ConfigError(f"boot_disk_gb must be between 50 and {MAX_BOOT_DISK_GB} (got {boot_disk_gb})")
    idle_action = str(values["idle_action"]).lower()
    if idle_action not in IDLE_ACTIONS:
        raise ConfigError(f"idle_action must be one of {', '.join(IDLE_ACTIONS)} (got {values['idle_action']!r})")
    termination = str(values["termination_action"]).upper()
    if termination not in TERMINATION_ACTIONS:
        raise ConfigError(f"termination_action must be one of {', '.join(TERMINATION_ACTIONS)} "
                          f"(got {values['termination_action']!r})")
    idle_minutes = parse_int("idle_minutes", values["idle_minutes"], 0)
    if idle_minutes > 1440:
        raise ConfigError(f"idle_minutes must be between 0 (off) and 1440 (got {idle_minutes})")
    boot_grace_minutes = parse_int("boot_grace_minutes", values["boot_grace_minutes"], 1)
    if boot_grace_minutes > 1440:
        raise ConfigError(f"boot_grace_minutes must be between 1 and 1440 (got {boot_grace_minutes})")
    max_run_hours = parse_int("max_run_hours", values["max_run_hours"], 1)
    if max_run_hours > 168:
        raise ConfigError(f"max_run_hours must be between 1 and 168 (got {max_run_hours})")
    bucket_location = str(values["bucket_location"] or "").strip()
    if bucket_location and not re.fullmatch(r"[A-Za-z0-9-]+", bucket_location):
        # The module's own validation (terraform/variables.tf bucket_location).
        raise ConfigError(f"bucket_location must be a Cloud Storage location such as US or us-west1 (got {bucket_location!r})")
    bucket_retention_days = parse_int("bucket_retention_days", values["bucket_retention_days"], 0)
    if bucket_retention_days > 3650:
        raise ConfigError(f"bucket_retention_days must be between 0 (keep objects) and 3650 (got {bucket_retention_days})")
    spot = parse_bool("spot", values["spot"])
    model = gpu_table.gpu(str(values["gpu"]))
    if model is None:
        raise ConfigError(f"gpu must be one of {', '.join(gpu_table.GPUS)} (got {values['gpu']!r})")
    gpu = model.name
    gpu_count = parse_int("gpu_count", values["gpu_count"], 0)
    machine_type = str(values["machine_type"] or "").strip()
    boot_disk_type = str(values["boot_disk_type"] or "").strip()
    nic_type = str(values["nic_type"] or "").strip().upper()
    chosen = provisioning.parse(values, machine_type or "", model.name, spot)
    if backend in ("gcp", "vertex"):
        machines.check_gcp_name(cluster)
        machine_type = machines.pick_machine_type(model, gpu_count, machine_type, provisioning.spot_only_allowed(
            chosen["provisioning"], chosen["capacity"], chosen["spot"]))
        chosen = provisioning.parse(values, machine_type, model.name, spot)
        machines.check_family(machine_type, boot_disk_type, nic_type)
    elif not machine_type:
        machine_type = "n1-standard-8"
    operator_cidr = str(values["operator_cidr"] or "")
    if operator_cidr.endswith("/0"):
        raise ConfigError("operator_cidr must not open SSH to the world (got a /0); use your IP as A.B.C.D/32")
    try:
        ready_timeout = float(values["ready_timeout_seconds"])
    except (TypeError, ValueError):
        ready_timeout = 0.0
    if ready_timeout <= 0:
        raise ConfigError(f"ready_timeout_seconds must be a positive number (got {values['ready_timeout_seconds']!r})")
    ssh_identity = str(values["ssh_identity"] or "auto").strip().lower()
    if ssh_identity not in ("auto", "oslogin", "metadata"):
        raise ConfigError(f"ssh_identity must be oslogin, metadata or auto (got {values['ssh_identity']!r}); "
                          f"set it in {flag_hint('ssh_identity')}")
    keras = str(values["keras"]).strip()
    if keras not in KERAS_VERSIONS:
        raise ConfigError(f"keras must be one of {', '.join(KERAS_VERSIONS)} (got {values['keras']!r}); "
                          f"set it in {flag_hint('keras')}")
    zones = parse_zones(values["zone"], values["zones"])
    region = str(values["region"] or "").strip()
    if region and not re.fullmatch(r"[a-z]+-[a-z]+[0-9]+", region):
        raise ConfigError(f"region must be a Google Cloud region such as us-central1 (got {region!r})")
    return Settings(
        keras=keras,
        project=str(values["project"] or ""),
        zone=zones[0] if zones else "",
        zones=tuple(zones),
        region=region,
        gpu=gpu,
        gpu_count=gpu_count,
        machine_type=machine_type,
        boot_disk_gb=boot_disk_gb,
        boot_disk_type=boot_disk_type,
        nic_type=nic_type,
        **chosen,
        operator_cidr=operator_cidr,
        gcp_ssh_user=str(values["gcp_ssh_user"] or "tfcluster"),
        ssh_identity=ssh_identity,
        idle_minutes=idle_minutes,
        idle_action=idle_action,
        boot_grace_minutes=boot_grace_minutes,
        max_run_hours=max_run_hours, budget=parse_usd("budget", values["budget"]),
        termination_action=termination,
        bucket_force_destroy=parse_bool("bucket_force_destroy", values["bucket_force_destroy"]),
        compact_placement=parse_bool("compact_placement", values["compact_placement"]),
        bucket_retention_days=bucket_retention_days,
        bucket_location=bucket_location,
        ready_timeout_seconds=ready_timeout,
        capacity_wait_seconds=parse_int("capacity_wait_seconds", values["capacity_wait_seconds"], 1),
        capacity_tries=parse_int("capacity_tries", values["capacity_tries"], 1),
        install_watchdog=parse_bool("install_watchdog", values["install_watchdog"]),
        image=parse_image("image", values["image"]),
        boot_image=parse_boot_image(values["boot_image"]),
        registry=str(values["registry"] or "").strip().rstrip("/"),
        hosts=str(values["hosts"] or ""),
        ssh_user=str(values["ssh_user"] or ""),
        ssh_key=str(values["ssh_key"] or ""),
        known_hosts=str(values["known_hosts"] or ""),
        trust_new_hosts=parse_bool("trust_new_hosts", values["trust_new_hosts"]),
        tf_port=tf_port,
        oracle_port=oracle_port,
        local_ports=parse_range("local_ports", values["local_ports"], flag_hint("local_ports")),
        remote_dir=str(values["remote_dir"] or ".tfcluster-remote"),
        cluster=cluster,
        backend=backend,
        workers=workers,
        state_dir=str(values["state_dir"]),
        python=str(values["python"] or ""),
        data_dir=str(values["data_dir"] or ""),
        retries=parse_int("retries", values["retries"], 0),
        stop_grace_seconds=grace,
    )
