"""GcpBackend: Terraform provisions the VMs, bucket, firewall and service account; the ssh
backend then runs the job on them with the cluster's own key and host keys pinned from guest
attributes."""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path
from typing import Callable

from tfcluster import gpu_health
from tfcluster.backends.base import Finding, Preemption, VmRow
from tfcluster.backends.gcp.access import check as prerequisites
from tfcluster.backends.gcp.access import oslogin
from tfcluster.backends.gcp.access.address import detect_operator_cidr
from tfcluster.backends.gcp.access.cluster_key import generate_cluster_key
from tfcluster.backends.gcp.cloud.compute import ComputeApi, gpu_type, pinned_host_key, wait_ready
from tfcluster.backends.gcp.cloud.errors import translated
from tfcluster.backends.gcp.cloud.registry import adopt_kept_repository
from tfcluster.backends.gcp.cloud.terraform import MODULE_DIR, Terraform
from tfcluster.backends.gcp.leftovers import (prove_gone, remove_after_destroy, remove_before_destroy,
                                              remove_unrecorded)
from tfcluster.backends.gcp.prices.quoter import Quoter
from tfcluster.backends.gcp.spend import budget, ledger_events
from tfcluster.backends.gcp.vms import docker_login, vm_control, vm_status
from tfcluster.backends.gcp.vms.teardown import bucket_rule, destroy_keeping_results
from tfcluster.backends.gcp.zones import capacity, failover, placement
from tfcluster.backends.gcp.zones.ladder import Ladder
from tfcluster.backends.gcp.zones.restart import ZoneFull, bring_back, bring_back_waiting, new_nonce
from tfcluster.backends.group import in_parallel
from tfcluster.backends.ssh import SshBackend
from tfcluster.errors import ClusterError, ConfigError
from tfcluster.provisioning import AUTO, FLEX_START, Choice
from tfcluster.state import ClusterState, HostRecord
from tfcluster.tfconfig import topology_order

STARTUP_DIR = MODULE_DIR.parent / "startup"
VM_PYTHON = "/opt/tfcluster/venv/bin/python"


class GcpBackend(SshBackend):
    """Terraform-provisioned GPU VMs reached with the cluster's own SSH key and pinned host keys.

    It is the ssh backend (docs/design.md says why it inherits it) plus the provisioning, and holds its
    collaborators: ``prices`` (the Quote of a cluster's VMs), ``spend`` (the ledger kept from what Compute
    shows), ``budget`` (--budget as the VMs' deadline) and ``ladder`` (climbing the capacity ladder)."""

    name = "gcp"
    hosts_outlive_cluster = False  # `terraform destroy` removes the VMs with whatever they hold.
    can_halt_machines = True  # Compute stops them; each watchdog halts its own VM for --then.
    can_replace_machines = True  # A VM whose GPUs fail the check is deleted and re-created (replace_machines).

    def __init__(self, store, announce: Callable[[str], None] = print):
        super().__init__(store, announce)
        self.prices = Quoter(store)
        self.spend = ledger_events.SpendTracker(self._api, self.workdir, self.prices.quote)
        self.budget = budget.Budget(store, self.spend, self.prices.quote, self._api, self.workdir, announce)
        self.ladder = Ladder(store, self.spend, announce, self.name)

    def workdir(self, cluster_name: str) -> Path:
        return self._store.root / "gcp" / cluster_name

    def replicas_per_machine(self, settings) -> int:
        """MultiWorkerMirroredStrategy makes a replica of every GPU of the VM."""
        return max(1, settings.gpu_count)

    def variables(self, settings, public_key: str, operator_cidr: str) -> dict:
        return {
            "project": settings.project, "zone": settings.zone, "cluster_name": settings.cluster,
            "workers": settings.workers, "machine_type": settings.machine_type,
            "gpu_type": gpu_type(settings.gpu), "gpu_count": settings.gpu_count,
            **capacity.model_variables(Choice(settings.provisioning, settings.reservation)),
            "operator_cidr": operator_cidr, "tf_port": settings.tf_port,
            "oracle_port": settings.oracle_port, "ssh_user": settings.gcp_ssh_user,
            "ssh_public_key": public_key, "idle_minutes": settings.idle_minutes,
            "idle_action": settings.idle_action, "boot_grace_minutes": settings.boot_grace_minutes,
            "max_run_hours": settings.max_run_hours, "bucket_retention_days": settings.bucket_retention_days,
            "budget_run_seconds": 0,  # Set by _create from --budget and the prices (budget.py).
            "ssh_identity": "metadata",  # Set by _create to what check chose (access/oslogin.py).
            # Both fixed for good at the first `up` by failover.pin_locations (a zone failover never moves them).
            "bucket_location": settings.bucket_location, "registry_location": "",
            "termination_action": settings.termination_action, "boot_disk_gb": settings.boot_disk_gb,
            "boot_disk_type": settings.boot_disk_type, "nic_type": settings.nic_type,
            "bucket_force_destroy": settings.bucket_force_destroy, "boot_nonce": new_nonce(),
            "compact_placement": placement.for_settings(settings).compact,  # Google's rules: placement.py.
            # Docker on the VMs when the workers run in an image (startup.sh, step 2a).
            "docker": bool(settings.image),
            "vertex": False,  # The VMs are the cluster (the vertex backend sets it, with workers = 0).
            "startup_script": str(STARTUP_DIR / "startup.sh"),
            "watchdog_source": str(STARTUP_DIR / "tfcluster_watchdog"),
        }

    def check(self, settings) -> list[Finding]:
        _require_place(settings)
        return prerequisites.run(failover.with_auto_zones(settings, self._announce)).findings  # The first zone.

    def up(self, settings, existing):
        if existing is not None:
            return existing
        _require_place(settings)
        settings = failover.with_auto_zones(settings, self._announce)
        gpu = gpu_type(settings.gpu)
        terraform = Terraform(self.workdir(settings.cluster), project=settings.project,  # Fails early if missing.
                              announce=self._announce)
        api = ComputeApi(settings.project)  # Fails early without credentials.
        # Before anything is created: the same lines as `invoke check`, and a stop on any ✗.
        report = prerequisites.run(settings, failover.made_before(api, terraform, settings.cluster))
        for line in [finding.line() for finding in report.findings] + report.dropped:
            self._announce(line)
        blocking = prerequisites.blocking(report, terraform)
        if blocking:
            raise ConfigError(blocking[0].detail if len(blocking) == 1 else
                              f"{len(blocking)} prerequisites fail ({', '.join(f.subject for f in blocking)}); "
                              "each ✗ line above names its fix")
        with translated(settings.project, "up"):  # The zones whose offer and quota hold, in order.
            return self._create(failover.keep_zones(settings, report.zones), terraform, api, gpu, report.image,
                                report.identity)

    def _create(self, settings, terraform: Terraform, api: ComputeApi, gpu: str, image: str,
                identity: oslogin.Identity):
        zones = list(settings.zones) or [settings.zone]
        others = f" (else {', '.join(zones[1:])}, in turn)" if zones[1:] else ""
        self._announce(
            f"plan: {settings.workers} x {settings.machine_type} + {settings.gpu_count} x {gpu}"
            f"{capacity.plan_words(settings)} in {settings.zone}{others}, bucket, VPC, firewall, service account")
        self._announce(placement.for_settings(settings, placement.dense_under_any(settings, api)).line)
        self._announce(identity.plan_words())
        prices = self.prices.quote(settings, settings.project, settings.zone, settings.workers, settings.spot)
        for line in prices.lines():
            self._announce(line)
        rate = budget.budget_rate(prices, self._announce) if settings.budget else prices.in_use.total
        run_seconds = capacity.run_seconds(settings, budget.max_run_seconds(settings.budget, settings.max_run_hours,
                                                                             rate, 0.0))
        self._announce(
            f"safety: idle watchdog {settings.idle_action}s a VM after {settings.idle_minutes} idle minutes"
            f"{' (off)' if not settings.idle_minutes else ''}; hypervisor deadline {settings.termination_action} "
            f"after {budget.describe(settings.budget, run_seconds, settings.max_run_hours)}; `invoke down` destroys everything")
        self._announce(bucket_rule(settings.bucket_retention_days))
        if not self.confirm(f"Create {settings.workers} VM(s) in {settings.zone}, about "
                            f"${prices.in_use.total:.2f} an hour while they run?"):
            raise ClusterError("up cancelled: nothing was created (`invoke up --yes` creates it without asking)")
        operator = settings.operator_cidr or detect_operator_cidr()
        key_file = self.workdir(settings.cluster) / "id_ed25519"
        public_key = generate_cluster_key(key_file, f"tfcluster-{settings.cluster}")
        # OS Login: the key into the operator's profile before any VM boots (oslogin.py).
        ssh_user = (oslogin.import_key(self.workdir(settings.cluster), settings.project, public_key,
                                       settings.max_run_hours) if identity.os_login else settings.gcp_ssh_user)

        began = time.time()  # The cluster's creation: its spend counts from here (commands/spend.py).

        def record(zone: str) -> None:
            # Recorded before anything is created in a zone: a failed apply can be resumed by `up`
            # or removed by `down`, never forgotten while it bills.
            self._store.save_cluster(ClusterState(name=settings.cluster, backend=self.name, hosts=[],
                                                  status="provisioning", project=settings.project,
                                                  zone=zone, ssh_key=str(key_file), created_at=began))

        record(zones[0])
        variables = {**self.variables(settings, public_key, operator), "image": image,
                     "budget_run_seconds": run_seconds if settings.budget else 0, "ssh_identity": identity.mode}
        # Resuming a failed `up`: VMs it already made keep the nonce they booted with (the
        # metadata key is in ignore_changes), so the resumed apply and its readiness keep it too,
        # and the image they booted (a family's newest may have moved on since).
        tfvars = terraform.workdir / "terraform.tfvars.json"
        previous = terraform.variables() if tfvars.exists() else {}
        variables["boot_nonce"] = previous.get("boot_nonce") or variables["boot_nonce"]
        variables["image"] = previous.get("image") or image
        variables["budget_run_seconds"] = budget.kept_run_seconds(previous, variables["budget_run_seconds"])
        failover.pin_locations(variables, previous, settings.bucket_location)
        terraform.prepare(variables)
        if previous:  # Resuming: what a killed apply made but never recorded goes, and is made again.
            remove_unrecorded(api, settings.project, previous.get("zone") or zones[0], settings.cluster,
                              terraform.workdir, self._announce)
        adopt_kept_repository(terraform, settings.project, variables["registry_location"], settings.cluster,
                              self._announce)
        if settings.capacity == AUTO or settings.provisioning == FLEX_START:  # The ladder, the Flex-start wait.
            zone = self.ladder.make(settings, terraform, api, variables, record, began, str(key_file))
        else:
            zone = failover.apply_in_zones(terraform, api, variables, zones, settings.cluster, self._announce, record)
        outputs = terraform.outputs()
        names = [vm.name for vm in outputs.instances]
        wait_ready(api, zone, names, settings.ready_timeout_seconds, nonce=variables["boot_nonce"])
        keys = in_parallel(outputs.instances, lambda vm: pinned_host_key(api, zone, vm.name),
                           lambda vm: vm.name, "reading host keys")
        # Neighbours in TF_CONFIG are neighbours on the network where Compute says where the VMs are.
        order = topology_order(in_parallel(outputs.instances, lambda vm: placement.topology(api, zone, vm.name),
                                           lambda vm: vm.name, "reading placements"))
        records = [HostRecord(name=f"worker-{i}", address=vm.internal_ip, ssh_address=vm.external_ip,
                              tf_port=settings.tf_port, host_key=key, instance=vm.name)
                   for i, (vm, key) in enumerate([(outputs.instances[j], keys[j]) for j in order])]
        cluster = ClusterState(name=settings.cluster, backend=self.name, hosts=records,
                               ssh_user=ssh_user, ssh_key=str(key_file),
                               python=settings.python or VM_PYTHON, project=settings.project,
                               zone=zone, bucket=outputs.bucket, registry=outputs.registry, created_at=began)
        self._resolve_roots(cluster, settings.remote_dir)
        self.preflight(cluster, self.hosts(cluster), need_tensorflow=True, image=settings.image)
        return cluster

    def gpu_expectation(self, cluster) -> tuple[int | None, tuple[str, ...]]:
        """What `up` applied: gpu_count GPUs of gpu_type on every VM (terraform.tfvars.json)."""
        tfvars = self.workdir(cluster.name) / "terraform.tfvars.json"
        return gpu_health.applied_expectation(json.loads(tfvars.read_text()) if tfvars.exists() else {})

    def preflight(self, cluster, hosts, need_tensorflow: bool, image: str = "") -> None:
        if image:
            self._require_docker(cluster, image)
            docker_login.log_in(hosts, image)  # A pull from the cluster's registry needs it.
        super().preflight(cluster, hosts, need_tensorflow, image=image)

    def pre_pull(self, cluster, image: str) -> list[str]:
        self._require_docker(cluster, image)
        docker_login.log_in(self.hosts(cluster), image)
        return super().pre_pull(cluster, image)

    def _require_docker(self, cluster, image: str) -> None:
        """Docker is on the VMs only when `up` made them for an image (variable `docker`,
        startup.sh step 2a); on others `docker` is simply missing, which no VM-side fix mends."""
        tfvars = self.workdir(cluster.name) / "terraform.tfvars.json"
        if tfvars.exists() and not json.loads(tfvars.read_text()).get("docker"):
            raise ConfigError(f"cluster {cluster.name} was created without Docker; run invoke down, then "
                              f"invoke up --image {image} (the bucket and registry are kept)")

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

    def leftover_containers(self, cluster) -> dict[str, list[str]]:
        """As leftover_processes: the containers go with the VMs, and teardown proves those are gone."""
        return {}

    def remove_containers(self, cluster) -> None:
        """See leftover_containers."""

    def _api(self, cluster) -> ComputeApi:
        return ComputeApi(cluster.project)

    def set_idle(self, cluster, idle_minutes: int, action: str) -> None:
        """Change the watchdog settings in every VM's metadata; each reads them on its next poll."""
        with translated(cluster.project, "idle"):
            api = self._api(cluster)
            changes = {"tfcluster-idle-minutes": str(idle_minutes), "tfcluster-idle-action": action}
            present = [r.instance for r in cluster.hosts if api.instance_or_none(cluster.zone, r.instance) is not None]
            gone = [r.instance for r in cluster.hosts if r.instance not in present]
            if gone:
                self._announce(f"skipped deleted VM(s) {', '.join(gone)}: `invoke up` re-creates them")
            in_parallel(present, lambda name: api.set_metadata(cluster.zone, name, changes), str,
                        "changing the idle watchdog")

    def set_stall_minutes(self, cluster, stall_minutes: float | None) -> None:
        """tfcluster-stall-minutes in every VM's metadata ("" for the default rule); each watchdog
        reads it on its next poll (startup/tfcluster_watchdog/gce.py Gce.settings)."""
        with translated(cluster.project, "train"):
            vm_control.set_stall_minutes(self._api(cluster), cluster, stall_minutes)

    def watchdog_status(self, cluster) -> dict[str, dict | None]:
        with translated(cluster.project, "status"):
            api = self._api(cluster)

            def read(record) -> dict | None:
                raw = (api.guest_attributes(cluster.zone, record.instance, "tfcluster/") or {}).get("watchdog")
                return json.loads(raw) if raw else None

            return dict(zip([r.name for r in cluster.hosts],
                            in_parallel(cluster.hosts, read, lambda r: r.instance, "reading watchdog status")))

    def hypervisor_deadlines(self, cluster) -> dict[str, float | None]:
        with translated(cluster.project, "status"):
            return vm_status.deadlines(self._api(cluster), cluster)

    def refresh(self, cluster, settings) -> None:
        """`up` on an existing cluster: bring back VMs the watchdog, the deadline or Google stopped,
        suspended or deleted (restart.py), then restore the configured idle settings."""
        api = self._api(cluster)
        terraform = Terraform(self.workdir(cluster.name), project=cluster.project)
        with translated(cluster.project, "up"):
            oslogin.renew_key(self.workdir(cluster.name), settings.max_run_hours)  # The new deadline's.
            back = bring_back(cluster, api, terraform, self.budget.max_run_seconds(cluster, settings, terraform),
                              settings.termination_action, settings.ready_timeout_seconds, self._announce)
            if back:
                self._connections.clear()  # New addresses and keys: connect afresh.
            self.set_idle(cluster, settings.idle_minutes, settings.idle_action)

    def replace_machines(self, cluster, settings, workers: list[str]) -> None:
        """Delete the workers' VMs (GPUs that failed the host check), then bring them back as `up` brings
        back a deleted VM (refresh: a targeted apply, new addresses and host keys pinned)."""
        by_name = {record.name: record.instance for record in cluster.hosts}
        with translated(cluster.project, "re-creating VMs whose GPUs failed the check"):
            api = self._api(cluster)
            in_parallel([by_name[worker] for worker in workers], lambda name: api.delete(cluster.zone, name), str,
                        "deleting VMs")
        self.refresh(cluster, settings)
        self._connections.clear()

    def preemptions(self, cluster, since: float) -> list[Preemption]:
        """Workers whose VM Google preempted since ``since``: a compute.instances.preempted
        operation for it, and the instance not running now (a preempted Spot VM stops)."""
        with translated(cluster.project, "checking for preemptions"):
            api = self._api(cluster)
            by_instance = {record.instance: record for record in cluster.hosts}
            when = api.preempted_at(cluster.zone, list(by_instance), since)
            found = []
            for name, at in sorted(when.items()):
                vm = api.instance_or_none(cluster.zone, name)
                if vm is None or vm.status != "RUNNING":
                    record = by_instance[name]
                    found.append(Preemption(worker=record.name, instance=name, address=record.address, at=at))
            return found

    def restart_preempted(self, cluster, settings) -> None:
        """Start the preempted VMs through the `up` path (restart.py: deadline set again, new
        addresses read, host keys pinned from guest attributes; deleted ones re-created), waiting
        with backoff while the zone has no capacity."""
        api = self._api(cluster)
        terraform = Terraform(self.workdir(cluster.name), project=cluster.project)
        with translated(cluster.project, "restarting preempted VMs"):
            oslogin.renew_key(self.workdir(cluster.name), settings.max_run_hours)
            try:
                bring_back_waiting(cluster, api, terraform, self.budget.max_run_seconds(cluster, settings, terraform),
                                   settings.termination_action, settings.ready_timeout_seconds, self._announce,
                                   settings.capacity_wait_seconds, settings.capacity_tries)
            except ZoneFull as full:  # --capacity auto: the rest of the ladder; else the next zone, if any.
                if settings.capacity == AUTO:
                    self.ladder.recover(cluster, api, terraform, full, settings)
                else:
                    failover.move_or_fail(cluster, api, terraform, full, settings, self._announce,
                                          self._store.save_cluster)
            finally:
                self._connections.clear()  # New addresses and keys: connect afresh.

    def arm_then_stop(self, cluster, run_id: str, last_attempt: int) -> None:
        with translated(cluster.project, "arming --then"):
            vm_control.arm_then_stop(self._api(cluster), cluster, run_id, last_attempt)

    def stop_machines(self, cluster) -> list[str]:
        with translated(cluster.project, "stopping the VMs"):
            try:
                return vm_control.stop_all(self._api(cluster), cluster)
            finally:
                self._connections.clear()

    def maintenance_notices(self, cluster, hosts) -> dict[int, str]:
        return vm_control.maintenance_notices(hosts)

    def restart_for_maintenance(self, cluster, settings, workers: list[int]) -> None:
        """Stop the announced VMs, then start them through the restart path (vm_control.py says why)."""
        with translated(cluster.project, "stopping the VMs announced for host maintenance"):
            vm_control.stop_some(self._api(cluster), cluster, workers)
        self.restart_preempted(cluster, settings)

    def stop_watchdog(self, cluster) -> None:
        """The VMs go away with `terraform destroy`."""

    def vm_rows(self, cluster, settings) -> list[VmRow]:
        with translated(cluster.project, "status"):
            return vm_status.rows(cluster, settings, self.prices, self.workdir(cluster.name), self._announce)

    # ------------------------------------------------------------ money: what the collaborators answer

    def spend_sync(self, cluster, settings, book, own: str = "", run: str = "") -> list[str]:
        return self.spend.sync(cluster, settings, book, own, run)

    def hourly_rate(self, cluster, settings) -> float | None:
        return self.budget.hourly_rate(cluster, settings)

    def set_budget_end(self, cluster, end: float | None) -> None:
        self.budget.set_end(cluster, end)

    def teardown(self, cluster, keep: bool, delete_bucket: bool = False) -> None:
        """Destroy everything that bills by the hour, then prove it through the Compute API.
        The bucket (results) and the registry (images) are kept when they hold something (and
        named, with size and cost) unless `--delete-bucket` or bucket_force_destroy says otherwise."""
        terraform = Terraform(self.workdir(cluster.name), project=cluster.project, announce=self._announce)
        api = self._api(cluster)
        with translated(cluster.project, "down"):
            kept = destroy_keeping_results(cluster, terraform, delete_bucket, self._announce, clear_network=partial(
                remove_before_destroy, api, cluster, terraform.workdir, self._announce))
            remove_after_destroy(api, cluster, terraform.workdir, self._announce, kept.bucket)
            oslogin.forget_key(self.workdir(cluster.name), self._announce)
            prove_gone(api, cluster, self._announce)
        for line in kept.lines:
            self._announce(line)


def _require_place(settings) -> None:
    if not settings.project or not settings.zone:
        raise ConfigError("the gcp backend needs --project and --zone (a zone such as us-west1-b, or auto) (or "
                          "tfcluster.project / tfcluster.zone in invoke.yaml)")
