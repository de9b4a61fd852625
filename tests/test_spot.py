"""Spot VMs that finish: Compute operations that really run (PENDING -> RUNNING -> DONE, polled
through zoneOperations), a zone without capacity, and preemption as Google does it, end to end
with real TensorFlow workers on the namespace hosts and gs:// on the emulator."""

from __future__ import annotations

import pytest

from tests.fake_compute import stop_instance
from tests.test_gcp_backend import api_for, fake_compute  # noqa: F401 - fixture
from tfcluster.backends.gcp.cloud.errors import NoCapacity, translated


def _vm(server, name: str, status: str = "TERMINATED") -> None:
    server.state.instances[name] = {"zone": "us-west1-b", "labels": {}, "status": "RUNNING", "guest": {},
                                    "internal_ip": "10.128.0.9", "spot": True}
    if status == "TERMINATED":
        stop_instance(server.state, name)


def _operation_gets(server) -> list[str]:
    return [r["path"] for r in server.state.requests if r["method"] == "GET" and "/operations/" in r["path"]]


def test_start_returns_only_when_its_operation_is_done(fake_compute):  # noqa: F811
    api = api_for(fake_compute)
    _vm(fake_compute, "s-0")
    fake_compute.state.next_external_ip["s-0"] = "34.1.2.99"
    api.start("us-west1-b", "s-0")
    # The client polled zoneOperations.get until DONE; only then is the VM running, with a new address.
    polled = _operation_gets(fake_compute)
    assert polled and all("/zones/us-west1-b/operations/operation-" in path for path in polled)
    instance = api.get_instance("us-west1-b", "s-0")
    assert instance.status == "RUNNING"
    assert instance.network_interfaces[0].access_configs[0].nat_i_p == "34.1.2.99"
    done = [entry["json"] for entry in fake_compute.state.operations.values() if entry["json"]["operationType"] == "start"]
    assert [op["status"] for op in done] == ["DONE"]


def test_stop_returns_when_the_vm_is_terminated_and_a_start_gives_a_new_address(fake_compute):  # noqa: F811
    api = api_for(fake_compute)
    _vm(fake_compute, "s-4", status="RUNNING")
    fake_compute.state.instances["s-4"]["external_ip"] = "34.1.2.3"
    halted = []
    fake_compute.state.on_stop = halted.append
    api.stop("us-west1-b", "s-4")
    assert api.get_instance("us-west1-b", "s-4").status == "TERMINATED" and halted == ["s-4"]
    api.stop("us-west1-b", "s-4")  # Stopping a stopped VM changes nothing.
    assert halted == ["s-4"]
    fake_compute.state.next_external_ip["s-4"] = "34.1.2.4"
    api.start("us-west1-b", "s-4")
    instance = api.get_instance("us-west1-b", "s-4")
    assert instance.status == "RUNNING" and instance.network_interfaces[0].access_configs[0].nat_i_p == "34.1.2.4"


def test_a_zone_without_capacity_is_one_line_and_the_vm_stays_stopped(fake_compute):  # noqa: F811
    api = api_for(fake_compute)
    _vm(fake_compute, "s-1")
    fake_compute.state.no_capacity_starts = 1
    with pytest.raises(NoCapacity) as error, translated("demo-project", "up"):
        api.start("us-west1-b", "s-1")
    assert str(error.value) == (
        "zone us-west1-b has no capacity for s-1 right now (ZONE_RESOURCE_POOL_EXHAUSTED, not a quota); "
        "try again later, or `invoke down` and `invoke up --zone` another zone")
    assert api.get_instance("us-west1-b", "s-1").status == "TERMINATED"
    assert _operation_gets(fake_compute), "the error came from the operation, polled to DONE"
    api.start("us-west1-b", "s-1")  # Capacity again: it starts.
    assert api.get_instance("us-west1-b", "s-1").status == "RUNNING"


def test_a_full_zone_and_no_other_is_one_error_and_up_never_moves(fake_compute, tmp_path):  # noqa: F811
    # A preempted VM that cannot start within capacity_tries, and tfcluster.zones lists no other zone:
    # the cluster cannot move (failover.move_or_fail), so one error, nothing removed, the VM stopped.
    import dataclasses

    from tfcluster import config
    from tfcluster.backends import get_backend
    from tfcluster.errors import ClusterError
    from tfcluster.state import ClusterState, HostRecord, StateStore

    _vm(fake_compute, "default-1")
    fake_compute.state.start_seconds, fake_compute.state.no_capacity_starts = 0.2, 99
    workdir = tmp_path / "gcp" / "default"  # What `up` left: the module's variables (restart.py writes the deadline).
    workdir.mkdir(parents=True)
    (workdir / "terraform.tfvars.json").write_text(json.dumps({"zone": "us-west1-b", "budget_run_seconds": 0}))
    settings = config.load({"backend": "gcp", "project": "demo-project", "state_dir": str(tmp_path),
                            "capacity_wait_seconds": 1, "capacity_tries": 2}, zone="us-west1-b")
    cluster = ClusterState(name="default", backend="gcp", project="demo-project", zone="us-west1-b", bucket="b",
                           hosts=[HostRecord(name="worker-1", address="10.128.0.9", tf_port=1, instance="default-1")])
    said = []
    with pytest.raises(ClusterError) as error:
        get_backend("gcp", StateStore(settings), announce=said.append).restart_preempted(cluster, settings)
    assert str(error.value) == (
        "zone us-west1-b has no capacity for default-1 after 2 starts (ZONE_RESOURCE_POOL_EXHAUSTED); default-1 "
        "stays stopped and its disk bills until `invoke down` (or `invoke up` later starts them again); list more "
        "zones in tfcluster.zones to have the cluster move instead")
    assert said == ["starting 1 stopped VM(s): default-1; the hypervisor deadline (12 h, STOP) is set again first",
                    "zone us-west1-b has no capacity for default-1 right now (ZONE_RESOURCE_POOL_EXHAUSTED); trying "
                    "again in 1 s (start 2 of 2)",
                    "starting 1 stopped VM(s): default-1; the hypervisor deadline (12 h, STOP) is set again first"]
    assert fake_compute.state.instances["default-1"]["status"] == "TERMINATED" and cluster.zone == "us-west1-b"
    # `up` on the stopped cluster (Backend.refresh): one start, one line, no wait and no move even
    # with another zone listed: its disks may hold what the user put there (docs/google-cloud.md).
    settings = dataclasses.replace(settings, zones=("us-west1-b", "us-west1-a"))
    with pytest.raises(NoCapacity, match=r"^zone us-west1-b has no capacity for default-1 right now "
                                         r"\(ZONE_RESOURCE_POOL_EXHAUSTED, not a quota\); try again later"):
        get_backend("gcp", StateStore(settings), announce=said.append).refresh(cluster, settings)
    assert fake_compute.state.instances["default-1"]["status"] == "TERMINATED" and cluster.zone == "us-west1-b"
    assert not [r for r in fake_compute.state.requests if r["method"] == "DELETE"]


def test_preemption_is_listed_in_zone_operations(fake_compute):  # noqa: F811
    import time

    from tests.fake_compute import preempt_instance

    api = api_for(fake_compute)
    _vm(fake_compute, "s-2", status="RUNNING")
    _vm(fake_compute, "s-3", status="RUNNING")
    before = time.time() - 1
    assert api.preempted_at("us-west1-b", ["s-2", "s-3"]) == {}
    preempt_instance(fake_compute.state, "s-2")
    found = api.preempted_at("us-west1-b", ["s-2", "s-3"], since=before)
    assert list(found) == ["s-2"] and found["s-2"] >= before
    assert api.get_instance("us-west1-b", "s-2").status == "TERMINATED"
    assert api.preempted_at("us-west1-b", ["s-2"], since=time.time() + 60) == {}  # An older preemption.


# ---------------------------------------------------------------- preemption end to end

import contextlib  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

from tests.conftest import events_of, wait_for  # noqa: E402
from tests.fake_compute import preempt_instance  # noqa: E402
from tests.fake_metadata import FakeMetadataServer  # noqa: E402
from tests.hostlab import BRIDGE, SUBNET, HostLab, available  # noqa: E402
from tests.test_gcp_backend import bucket_of, make_gcp_cli  # noqa: E402
from tests.world.machines import AccountMetadata  # noqa: E402
from tests.world.names import STORAGE_NAMES  # noqa: E402
from tfcluster.ledger import Ledger  # noqa: E402

needs_hosts = pytest.mark.skipif(available() is not None, reason=f"test hosts: {available()}")
# Each VM's metadata server (a VM sees only its own); the new external address a start gives.
METADATA = [f"{SUBNET}.{3 + i}" for i in range(3)]
NEW_IP = [f"{SUBNET}.{60 + i}" for i in range(3)]
# The external address a VM made anew gets (the cluster moved to another zone, failover.move_or_fail).
MOVED_IP = [f"{SUBNET}.{80 + i}" for i in range(3)]
# Tiny epochs, backed up every EVERY steps (the trainer reports progress every STEPS // 10 steps).
STEPS, EVERY = 20, 5
# What the metadata server says when nothing is announced, and when Google preempts the VM
# (https://cloud.google.com/compute/docs/instances/create-use-preemptible#detecting_if_an_instance_was_preempted:
# instance/preempted turns TRUE; https://cloud.google.com/compute/docs/instances/spot: the
# preemption notice is an ACPI soft-off, and instance/maintenance-event reads
# TERMINATE_ON_HOST_MAINTENANCE, which TensorFlow's save_before_preemption watches).
CALM = {"instance/maintenance-event": "NONE", "instance/preempted": "FALSE"}
PREEMPTED = {"instance/maintenance-event": "TERMINATE_ON_HOST_MAINTENANCE", "instance/preempted": "TRUE"}


class SpotWorld:
    """The lab hosts as Spot VMs: Google preempts one (notice, TERMINATED and a preempted
    operation, every process lost) and a start boots it again with a new external address."""

    def __init__(self, lab: HostLab, compute, metadata: list[FakeMetadataServer]):
        self.lab, self.compute, self.metadata = lab, compute, metadata
        self.machines = compute.state.on_insert  # LabMachines: addresses, ssh-keys, host keys published.
        compute.state.on_start = self.boot
        compute.state.on_stop = self.halt
        compute.state.on_insert = self.insert
        compute.state.on_delete = self.delete

    def delete(self, name: str) -> None:
        """instances.delete completed: the machine goes, and its boot disk (autoDelete) with what
        tfcluster put there (https://cloud.google.com/compute/docs/instances/deleting-instance)."""
        index = int(name.rsplit("-", 1)[1])
        self.halt(name)
        shutil.rmtree(self.lab.home(index) / ".tfcluster-remote", ignore_errors=True)

    def insert(self, name: str, record: dict) -> None:
        """instances.insert completed: a VM made where none runs now (the cluster moved zones) boots
        on its host, with a new external address; the first `up` finds the hosts running."""
        self.machines(name, record)
        index = int(name.rsplit("-", 1)[1])
        if self.lab.hosts[index].sshd.poll() is None:
            return
        record["external_ip"] = MOVED_IP[index]
        self.boot(name, MOVED_IP[index])
        self.metadata[index].values["instance/zone"] = f"projects/1/zones/{record['zone']}"

    def halt(self, name: str) -> None:
        """Compute's stop completed: the machine shuts down, every process and sshd with it."""
        host = self.lab.hosts[int(name.rsplit("-", 1)[1])]
        self.lab.kill_processes(host, keep_sshd=False)
        host.sshd.wait(timeout=10)

    def announce_maintenance(self, index: int) -> None:
        """Google announces host maintenance for VM ``index`` (its metadata server's
        instance/maintenance-event), ahead of terminating it."""
        self.metadata[index].values["instance/maintenance-event"] = "TERMINATE_ON_HOST_MAINTENANCE"

    def preempt(self, index: int) -> None:
        self.metadata[index].values.update(PREEMPTED)
        preempt_instance(self.compute.state, f"default-{index}")
        host = self.lab.hosts[index]
        self.lab.kill_processes(host, keep_sshd=False)  # The VM loses every process.
        host.sshd.wait(timeout=10)

    def boot(self, name: str, external_ip: str) -> None:
        """The fake Compute's start completed: the machine boots (sshd up, on its new address)."""
        index = int(name.rsplit("-", 1)[1])
        host = self.lab.hosts[index]
        if host.sshd.poll() is None:
            return  # Still running: nothing halted it.
        subprocess.run(["ip", "-n", host.netns, "addr", "add", f"{external_ip}/24", "dev", "eth0"],
                       capture_output=True)
        self.lab.start_sshd(host)
        self.lab._wait_for_port(host)
        self.metadata[index].values.update(CALM)

    def python_processes(self) -> list[str]:
        found = []
        for host in self.lab.hosts:
            for pid in host.pids():
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                if "trainer.task" in cmdline:
                    found.append(f"{host.hostname}: {cmdline[:80]}")
        return found


@contextlib.contextmanager
def spot_cli_in(tmp_path: Path, world, synthetic_data: Path, workers: int = 3):
    """The CLI on ``workers`` Spot "VMs" (namespace hosts, each with its own metadata server) in
    ``world``; ``cli.spot`` is the SpotWorld. Shared by the tests (2 VMs: a chief and a worker
    to preempt are all a preemption needs) and bench/bench_spot.py (3)."""
    storage_address = f"{SUBNET}.2"
    etc = {"hosts": "", "ssl": world.trust_store(tmp_path / "ssl")}
    lab = HostLab(tmp_path / "lab", workers, tag="ts", listen_all=True, etc=etc, vm_login=True)
    servers = []
    try:
        for address in [storage_address, *METADATA]:
            subprocess.run(["ip", "addr", "add", f"{address}/24", "dev", BRIDGE], check=True)
        world.storage_proxy.listen(storage_address, 443, world.tls_context)
        world.storage_proxy.listen(storage_address, 80, None)
        for index, host in enumerate(lab.hosts):
            # Its service account and token: those of the instance it plays, as Compute holds it.
            servers.append(AccountMetadata({
                "project/project-id": "demo-project", "instance/zone": "projects/1/zones/us-west1-b",
                "instance/name": f"default-{index}", **CALM},
                lambda client, name=f"default-{index}": world.compute.state.instances.get(name),
                bind=(METADATA[index], 80)))
            # Each VM reaches its own metadata server: its hosts file, written in place (ip netns
            # exec bind-mounts this very file over /etc/hosts).
            with open(f"/etc/netns/{host.netns}/hosts", "w") as hosts:
                hosts.write(f"127.0.0.1 localhost\n{storage_address} {' '.join(STORAGE_NAMES)}\n"
                            f"{METADATA[index]} metadata.google.internal\n")
        cli = make_gcp_cli(tmp_path, world, lab, synthetic_data)
        cli.env.update({"INVOKE_TFCLUSTER_SPOT": "true", "INVOKE_TFCLUSTER_CAPACITY_WAIT_SECONDS": "1",
                        "INVOKE_TFCLUSTER_CAPACITY_TRIES": "5"})
        for index in range(workers):
            world.compute.state.next_external_ip[f"default-{index}"] = NEW_IP[index]
        cli.spot = SpotWorld(lab, world.compute, servers)
        yield cli
        if cli.cluster() is not None:
            cli.run("down", "--delete-bucket", timeout=180)
    finally:
        for server in servers:
            server.close()
        lab.teardown()


@pytest.fixture
def spot(tmp_path, world, synthetic_data):
    with spot_cli_in(tmp_path, world, synthetic_data, workers=2) as cli:
        yield cli


def _remote_log(lab: HostLab, run_id: str, worker: int) -> Path:
    """The worker's log on its VM: the product's remote folder in the `tfcluster` login's home."""
    return (lab.home(worker) / ".tfcluster-remote" / "default" / "runs" / run_id / f"worker-{worker}"
            / f"worker-{worker}.log")


@needs_hosts
def test_a_preempted_worker_comes_back_and_the_same_run_resumes(spot, world, tmp_path):
    up = spot.run("up", timeout=240)
    assert up.returncode == 0, up.stdout + up.stderr
    # The zone has no capacity for the first three starts: the launcher waits and tries again.
    world.compute.state.no_capacity_starts = 3
    launcher = spot.popen("train", "--retries", "2", "--", "--epochs", "3", "--steps-per-epoch", str(STEPS),
                          "--backup-every-steps", str(EVERY))
    try:
        run_dir = wait_for(lambda: spot.runs() and spot.runs()[-1], 60, what="the run's folder")

        def mid_epoch_2():
            log = _remote_log(spot.lab, run_dir.name, 0)
            steps = [e for e in events_of(log.read_text()) if e["event"] == "step"] if log.exists() else []
            return steps and steps[-1]["epoch"] == 2 and steps[-1]["step"] >= 8

        wait_for(mid_epoch_2, 300, interval=0.05, what="the chief in epoch 2, step 8")
        spot.spot.preempt(1)
        output, _ = launcher.communicate(timeout=600)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, output[-4000:]
    assert f"worker-1 ({SUBNET}.11) was preempted by Google at " in output
    assert "restarting it (attempt 2 of 3)" in output
    assert output.count("has no capacity for default-1 right now (ZONE_RESOURCE_POOL_EXHAUSTED); trying again") == 3
    run = json.loads((run_dir / "run.json").read_text())
    assert run["outcome"] == "succeeded" and run["attempts"] == 2
    [preemption] = run["summary"]["preemptions"]
    assert preemption["worker"] == "worker-1" and preemption["instance"] == "default-1"
    assert preemption["attempt"] == 1 and preemption["restarted_at"] >= preemption["noticed_at"]
    # The same run resumed from its gs:// step backup: at most the steps since the last one redone.
    assert run["summary"]["resumed_at"]["2"] == 2
    before, after = (run_dir / "worker-0.log").read_text().split("attempt 2 on", 1)
    reached = max(e["step"] for e in events_of(before) if e["event"] == "step" and e["epoch"] == 2)
    resumed = next(e for e in events_of(after) if e["event"] == "first_step")
    assert resumed["epoch"] == 2 and 0 <= reached - (resumed["step"] - 1) < EVERY + 2  # Steps are reported every 2.
    # The cost ledger: the preemption (Compute's operation) and the restart (ours) carry the run's id,
    # and the run's cost in the summary prices those redone steps at the chief's median step time.
    redone = (reached - (resumed["step"] - 1)) * run["summary"]["throughput"]["median_step_seconds"]
    assert run["summary"]["redone_seconds"] == pytest.approx(redone, rel=0.01)
    events = [e for e in Ledger(spot.state_dir, "default").events() if e.run == run["run_id"]]
    assert [(e.instance, e.kind, e.source) for e in events] == [
        ("default-1", "preempted", "compute operation"), ("default-1", "start", "own operation")]
    assert "of it work redone after preemptions" in output and "prices of " in output
    # The VM came back on a new external address, which the cluster record now holds.
    assert spot.cluster()["hosts"][1]["ssh_address"] == NEW_IP[1]
    assert world.compute.state.instances["default-1"]["status"] == "RUNNING"
    assert world.compute.state.instances["default-1"]["max_run_seconds"] == 12 * 3600  # Deadline kept and written again.

    # Preempted again, and the zone stays full past the limit; tfcluster.zones lists another zone:
    # the whole cluster moves there (failover.move_or_fail: its VMs removed here, made there) and
    # the same run resumes from its gs:// backup on the new VMs.
    state = world.compute.state
    state.accelerators["us-west1-a"] = ["nvidia-tesla-t4"]
    state.no_capacity_starts = 99
    state.no_capacity_zones = {"us-west1-b": "ZONE_RESOURCE_POOL_EXHAUSTED"}  # New VMs do not fit there either.
    spot.env.update({"INVOKE_TFCLUSTER_CAPACITY_TRIES": "2", "INVOKE_TFCLUSTER_ZONES": "us-west1-b,us-west1-a"})
    bucket = bucket_of(world.storage_url, spot.cluster()["bucket"])
    kept = {blob.name for blob in bucket.list_blobs(prefix=f"runs/{run_dir.name}/")}
    assert kept, "the first run's model and checkpoints are in the bucket"
    launcher = spot.popen("train", "--retries", "1", "--", "--epochs", "1", "--steps-per-epoch", str(STEPS),
                          "--backup-every-steps", str(EVERY))
    try:
        first = run_dir.name
        run_dir = wait_for(lambda: spot.runs() and spot.runs()[-1].name != first and spot.runs()[-1], 60,
                           what="the second run's folder")

        def past_step_8():
            log = _remote_log(spot.lab, run_dir.name, 0)
            return log.exists() and any(e["event"] == "step" and e["step"] >= 8 for e in events_of(log.read_text()))

        wait_for(past_step_8, 300, interval=0.05, what="the second run's chief past step 8")
        spot.spot.preempt(1)
        output, _ = launcher.communicate(timeout=600)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, output[-4000:]
    assert ("zone us-west1-b has no capacity for default-1 after 2 starts (ZONE_RESOURCE_POOL_EXHAUSTED): moving "
            "the whole cluster to us-west1-a; its 2 VM(s) in us-west1-b are removed first") in output, output[-4000:]
    assert "moved: the cluster's 2 VM(s) run in us-west1-a now (new addresses and host keys)" in output
    assert spot.runs()[-1] == run_dir  # The same run, not a new one.
    run = json.loads((run_dir / "run.json").read_text())
    assert run["run_id"] == run_dir.name and run["outcome"] == "succeeded" and run["attempts"] == 2
    [preemption] = run["summary"]["preemptions"]
    assert (preemption["worker"], preemption["moved_from"], preemption["moved_to"]) == \
        ("worker-1", "us-west1-b", "us-west1-a")
    # From its gs:// step backup (every EVERY steps), on the new VMs: not from step 1.
    assert run["summary"]["resumed_at"]["2"] == 1
    resumed = next(e for e in events_of((run_dir / "worker-0.log").read_text()) if e["event"] == "first_step")
    assert resumed["epoch"] == 1 and resumed["step"] > EVERY, resumed
    # Nothing is left in the full zone; the cluster record points at the new VMs.
    assert {name: vm["zone"] for name, vm in state.instances.items()} == {
        "default-0": "us-west1-a", "default-1": "us-west1-a"}
    deletes = [r["path"] for r in state.requests if r["method"] == "DELETE" and "/instances/" in r["path"]]
    assert sorted(path.rsplit("/zones/", 1)[1] for path in deletes) == [
        "us-west1-b/instances/default-0", "us-west1-b/instances/default-1"]
    cluster = spot.cluster()
    assert cluster["zone"] == "us-west1-a" and [h["ssh_address"] for h in cluster["hosts"]] == MOVED_IP[:2]
    # The bucket kept every object of the first run.
    assert kept <= {blob.name for blob in bucket.list_blobs(prefix=f"runs/{first}/")}


@needs_hosts
def test_preempted_while_no_launcher_runs_then_train_resume_brings_the_same_run_back(spot, world, tmp_path):
    up = spot.run("up", timeout=240)
    assert up.returncode == 0, up.stdout + up.stderr
    # An ordinary failure is not taken for a preemption: --retries bounds it, and it says why.
    failing = tmp_path / "fails.py"
    failing.write_text("import sys\nsys.exit(3)\n")
    failed = spot.run("train", "--script", str(failing), "--retries", "1", timeout=180)
    assert failed.returncode != 0
    assert "exited with code 3 after 2 attempt(s)" in failed.stderr and "preempted" not in failed.stdout

    launcher = spot.popen("train", "--retries", "0", "--", "--epochs", "3")
    first = spot.runs()[-1].name
    run_dir = wait_for(lambda: spot.runs() and spot.runs()[-1].name != first and spot.runs()[-1], 60,
                       what="the run's folder")

    def epoch_done():
        log = _remote_log(spot.lab, run_dir.name, 0)
        return log.exists() and any(e["event"] == "epoch_end" for e in events_of(log.read_text()))

    try:
        wait_for(epoch_done, 300, what="the chief's first epoch")
    finally:
        launcher.kill()  # The laptop goes away; the workers run on.
        launcher.communicate(timeout=30)
    spot.spot.preempt(1)
    follow = spot.run("logs", "--follow", timeout=120)
    assert f"worker-1 ({SUBNET}.11) was preempted by Google at" in follow.stdout, follow.stdout[-2000:]
    assert f"Resume the same run with: invoke train --resume {run_dir.name}" in follow.stdout
    status = spot.run("status", timeout=120)
    assert f"invoke train --resume {run_dir.name}" in status.stdout, status.stdout[-2000:]
    # Nothing restarted the VM by itself.
    assert world.compute.state.instances["default-1"]["status"] == "TERMINATED"

    resumed = spot.run("train", "--resume", run_dir.name, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr[-2000:]
    assert spot.runs()[-1].name == run_dir.name  # The same run, not a new one.
    run = json.loads((run_dir / "run.json").read_text())
    assert run["outcome"] == "succeeded" and run["attempts"] == 2
    assert run["summary"]["resumed_at"]["2"] > 1  # From its gs:// backup.
    assert [p["worker"] for p in run["summary"]["preemptions"]] == ["worker-1"]
    assert spot.cluster()["hosts"][1]["ssh_address"] == NEW_IP[1]

    # Host maintenance announced mid-run for default-1. TensorFlow's own PreemptionCheckpointHandler
    # (tests/scripts/maintenance_aware.py) sees it, has both workers save and exit 143; the run is
    # not failed for it: the announced VM is stopped and started (away from the maintenance) and
    # the same run resumes from that checkpoint, with the one retry it was given.
    world.compute.state.next_external_ip["default-1"] = f"{SUBNET}.71"
    stops_before = _operations(world, "stop")
    script = Path(__file__).parent / "scripts" / "maintenance_aware.py"
    launcher = spot.popen("train", "--script", str(script), "--retries", "1", "--", "--steps", "150")
    try:
        previous = run_dir.name
        run_dir = wait_for(lambda: spot.runs() and spot.runs()[-1].name != previous and spot.runs()[-1], 60,
                           what="the maintained run's folder")

        def past_step_20():
            log = _remote_log(spot.lab, run_dir.name, 0)
            return log.exists() and any(e["event"] == "progress" and e["step"] >= 20 for e in events_of(log.read_text()))

        wait_for(past_step_20, 300, interval=0.1, what="the maintained run past step 20")
        spot.spot.announce_maintenance(1)
        output, _ = launcher.communicate(timeout=600)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, output[-4000:]
    assert ("worker-1 (" + SUBNET + ".11): Google announced host maintenance (TERMINATE_ON_HOST_MAINTENANCE); the "
            "workers backed up and exited 143; moving its VM to another host and resuming (attempt 2 of 2)") in output
    assert output.count("Google announced host maintenance") == 1  # Only the announced VM.
    assert _operations(world, "stop") == stops_before + ["default-1"]
    assert spot.cluster()["hosts"][1]["ssh_address"] == f"{SUBNET}.71"
    run = json.loads((run_dir / "run.json").read_text())
    assert run["outcome"] == "succeeded" and run["attempts"] == 2
    [notice] = run["summary"]["maintenance"]
    assert notice["worker"] == "worker-1" and notice["event"] == "TERMINATE_ON_HOST_MAINTENANCE"
    assert notice["restarted_at"] >= notice["noticed_at"] and run["summary"]["preemptions"] == []
    # Attempt 2 restored TensorFlow's own checkpoint: it starts where attempt 1 saved, past step 20.
    before, after = (run_dir / "worker-0.log").read_text().split("attempt 2 on", 1)
    assert "starting at step 0" in before
    restored = int(after.split("starting at step ", 1)[1].split()[0])
    assert restored >= 20, after[:2000]
    assert "done at step 150, total 300" in after

    # The bundled trainer's input hangs: the data goes to the bucket (`invoke data`), the workers read
    # it with TensorFlow's own gs:// client, and mid-epoch the world stops answering worker-1's reads,
    # holding their connections open. Both workers stop at the same step (worker-0 waits for it
    # inside the all-reduce); the stall is caught by the limit and worker-1 named by its input wait.
    from trainer.synthetic import write_image_folder

    write_image_folder(tmp_path / "images", per_class=8, size=16)
    data = spot.run("data", "--src", str(tmp_path / "images"), "--out", str(tmp_path / "records"),
                    "--image-size", "16", "--shards", "4", timeout=300)
    assert data.returncode == 0, data.stdout + data.stderr
    assert spot.cluster()["data_url"].startswith("gs://")
    shipped = spot.env.pop("INVOKE_TFCLUSTER_DATA_DIR")  # No local data_dir: the cluster's bucket copy.
    proxy = world.storage_proxy
    launcher = spot.popen("train", "--stall-minutes", "1", "--", "--epochs", "2", "--steps-per-epoch", "400")
    try:
        previous = run_dir.name
        run_dir = wait_for(lambda: spot.runs() and spot.runs()[-1].name != previous and spot.runs()[-1], 60,
                           what="the input-hang run's folder")

        def chief_step_events() -> list[dict]:
            log = _remote_log(spot.lab, run_dir.name, 0)
            return [e for e in events_of(log.read_text()) if e["event"] == "step"] if log.exists() else []

        wait_for(lambda: len(chief_step_events()) >= 2, 300, interval=0.1, what="the chief past its first steps")
        proxy.hold_reads_from = {spot.lab.hosts[1].address, spot.cluster()["hosts"][1]["ssh_address"]}
        output, _ = launcher.communicate(timeout=400)
    finally:
        proxy.reads_release.set()  # Held requests end; nothing waits on them past the test.
        if launcher.poll() is None:
            launcher.kill()
    proxy.hold_reads_from = set()
    spot.env["INVOKE_TFCLUSTER_DATA_DIR"] = shipped
    assert launcher.returncode != 0 and proxy.reads_held > 0, output[-3000:]
    assert "holds the others: its step" in output and "waits for its input data" in output, output[-4000:]
    assert "worker-1 (worker:0 on" in output.split("⏸ Stalled", 1)[1].split("\n", 1)[0], output[-4000:]
    run = json.loads((run_dir / "run.json").read_text())
    [stalled] = run["summary"]["stalls"]
    assert stalled["worker"] == "worker-1" and stalled["waits_for_input"] is not None
    assert stalled["limit_seconds"] == 60 and 60 <= stalled["quiet_seconds"] <= 62, stalled
    assert spot.spot.python_processes() == []  # Every worker stopped, the one stuck in its read too.

    # --then stop with the launcher there: the run ends and every VM is stopped through Compute,
    # its --then metadata cleared first, so a later start does not halt it for this run again.
    quick = tmp_path / "quick.py"
    quick.write_text("print('quick done', flush=True)\n")
    stopped = spot.run("train", "--script", str(quick), "--then", "stop", timeout=300)
    assert stopped.returncode == 0, stopped.stdout[-3000:] + stopped.stderr[-2000:]
    assert "--then stop: 2 VM(s) stopped (default-0, default-1); their disks and the bucket bill until " \
           "`invoke down`" in stopped.stdout, stopped.stdout[-2000:]
    for name in ("default-0", "default-1"):
        instance = world.compute.state.instances[name]
        assert instance["status"] == "TERMINATED" and instance["metadata"]["tfcluster-then-stop"] == ""
    assert sorted(_operations(world, "stop")[-2:]) == ["default-0", "default-1"]
    _, run = spot.latest_run()
    assert run["outcome"] == "succeeded" and run["summary"]["then"] == "stop"


def _operations(world, kind: str) -> list[str]:
    """The instances that Compute's operations of ``kind`` targeted, oldest first."""
    with world.compute.state.lock:
        entries = sorted(world.compute.state.operations.values(), key=lambda entry: entry["json"]["insertTime"])
        return [entry["json"]["targetLink"].rsplit("/", 1)[1] for entry in entries
                if entry["json"]["operationType"] == kind]
