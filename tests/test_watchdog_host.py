"""The real watchdog process on a network-namespace host with real sshd, and its delete
action against a fake metadata server and the fake Compute API."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import paramiko
import pytest

from tests.conftest import REPO, wait_for
from tests.fake_metadata import FakeMetadataServer
from tests.hostlab import HostLab, available

# The package, run as the VM runs it: python3 <folder>/tfcluster_watchdog.
WATCHDOG = REPO / "startup" / "tfcluster_watchdog"
IDLE_SECONDS = 3.0
POLL = 1.0
SCHEDULING_SLACK = 3.0  # A 2-core CI machine under load delays a 1 s sleep by seconds.
# The watchdog in a PID namespace of its own: its jobs probe must not see the training processes
# of other tests running on this machine (they would keep it busy).
OWN_PIDS = ["unshare", "--pid", "--fork", "--mount-proc"]


class RunningWatchdog:
    def __init__(self, argv: list[str], state_dir: Path, env: dict | None = None):
        self.state_dir = state_dir
        self.log = state_dir / "watchdog.log"
        state_dir.mkdir(parents=True, exist_ok=True)
        self.started = time.time()
        self.process = subprocess.Popen(argv, stdout=open(self.log, "w"), stderr=subprocess.STDOUT,
                                        env={**os.environ, **(env or {})}, start_new_session=True)

    def status(self) -> dict | None:
        try:
            return json.loads((self.state_dir / "status.json").read_text())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)


@pytest.fixture
def lab(tmp_path):
    reason = available()
    if reason:
        pytest.skip(f"test hosts: {reason}")
    # A PID namespace of its own, as a VM has: the watchdog's probes must not see the training
    # processes and SSH sessions of the tests that run beside this one.
    lab = HostLab(tmp_path / "lab", 1, tag="tw", own_pids=True)
    yield lab
    lab.teardown()


@pytest.fixture
def start_watchdog(lab, tmp_path):
    started = []

    def start(idle_minutes: float = IDLE_SECONDS / 60, probes: str = "jobs_and_ssh") -> RunningWatchdog:
        config = tmp_path / "watchdog.json"
        config.write_text(json.dumps({"idle_minutes": idle_minutes, "action": "stop", "probes": probes}))
        acted = tmp_path / "acted.log"
        dog = RunningWatchdog(
            lab.hosts[0].inside(sys.executable, str(WATCHDOG), "--config", str(config),
             "--state-dir", str(tmp_path / "state"), "--poll-seconds", str(POLL),
             "--action-command", f"echo \"$TFCLUSTER_IDLE_ACTION $(date +%s.%N)\" >> {acted}"),
            tmp_path / "state")
        dog.acted = acted
        dog.config = config
        started.append(dog)
        return dog

    yield start
    for dog in started:
        dog.stop()


def acted_times(dog) -> list[float]:
    return [float(line.split()[1]) for line in dog.acted.read_text().splitlines()] if dog.acted.exists() else []


def logged_idle_seconds(dog) -> list[float]:
    return [float(m) for m in re.findall(r"idle for ([0-9.]+)s", dog.log.read_text())]


def test_acts_within_idle_plus_one_poll(start_watchdog):
    # A tfcluster job of this machine that is not on the host (another test's, beside this one)
    # is not the host's: it must not hold the watchdog off.
    elsewhere = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                 env={**os.environ, "TFCLUSTER_RUN_ID": "another-tests-run"})
    try:
        dog = start_watchdog()
        wait_for(lambda: acted_times(dog), 30, what="the idle action")
    finally:
        elsewhere.kill()
        elsewhere.wait(timeout=10)
    first_idle = logged_idle_seconds(dog)[0]
    # Never early; late by at most one poll, plus a few seconds for a loaded machine's scheduling.
    assert IDLE_SECONDS <= first_idle <= IDLE_SECONDS + POLL + SCHEDULING_SLACK
    assert dog.acted.read_text().startswith("stop ")
    assert "action stop; probes" in dog.log.read_text()


def test_open_ssh_session_holds_it_off(start_watchdog, lab):
    host = lab.hosts[0]
    client = paramiko.SSHClient()
    key = paramiko.PKey.from_type_string(*[host.host_key_public.split()[0],
                                           __import__("base64").b64decode(host.host_key_public.split()[1])])
    client.get_host_keys().add(host.address, key.get_name(), key)
    client.connect(host.address, username="root", key_filename=str(lab.client_key), look_for_keys=False,
                   allow_agent=False, timeout=10)
    shell = client.invoke_shell()  # A pty: an interactive session.
    try:
        dog = start_watchdog()
        wait_for(lambda: (dog.status() or {}).get("readings", {}).get("ssh") is True, 30, what="ssh seen busy")
        opened_at = time.time()
        # Held off across more than idle + two polls: every status since says busy, no action.
        wait_for(lambda: (dog.status() or {}).get("updated_at", 0) > opened_at + IDLE_SECONDS + 2 * POLL,
                 30, what="polls past the idle time")
        assert acted_times(dog) == [] and dog.status()["busy"] is True
    finally:
        shell.close()
        client.close()
    closed_at = time.time()
    wait_for(lambda: acted_times(dog), 30, what="the action after the session closed")
    assert acted_times(dog)[0] >= closed_at + IDLE_SECONDS - POLL


def test_training_process_holds_it_off_until_it_ends(start_watchdog, lab, tmp_path):
    dog = start_watchdog(probes="jobs")
    job = subprocess.Popen(lab.hosts[0].inside(sys.executable, "-c", "import time; time.sleep(6)"),
                           env={**os.environ, "TFCLUSTER_RUN_ID": "test-run"})
    try:
        wait_for(lambda: (dog.status() or {}).get("readings", {}).get("jobs") is True, 30, what="job seen busy")
        assert acted_times(dog) == []
        job.wait(timeout=30)
        ended_at = time.time()
    finally:
        job.kill()
    wait_for(lambda: acted_times(dog), 30, what="the action after the job ended")
    assert acted_times(dog)[0] >= ended_at + IDLE_SECONDS - POLL
    assert logged_idle_seconds(dog)[0] >= IDLE_SECONDS


def test_settings_change_applies_without_restart(start_watchdog):
    dog = start_watchdog(idle_minutes=0)  # Disabled.
    wait_for(lambda: (dog.status() or {}).get("idle_seconds", 0) > IDLE_SECONDS + POLL, 30, what="idle past limit")
    assert acted_times(dog) == []
    dog.config.write_text(json.dumps({"idle_minutes": IDLE_SECONDS / 60, "action": "stop"}))
    wait_for(lambda: acted_times(dog), 30, what="the action once enabled")


def test_delete_action_calls_the_compute_api_with_the_metadata_token(tmp_path, world):
    compute = world.compute  # Behind compute.googleapis.com: the watchdog reaches it by name.
    # The VM's token is its service account, allowed to delete its own instance by the binding
    # terraform/iam.tf puts on it (a custom role with compute.instances.delete).
    member, role = "serviceAccount:demo-vm@demo-project.iam.gserviceaccount.com", "projects/demo-project/roles/w"
    compute.state.tokens["ya29.fake-token-123"] = member
    compute.state.custom_roles[role] = {"compute.instances.delete"}
    compute.state.instances["demo-0"] = {"zone": "us-west1-b", "labels": {}, "status": "RUNNING", "guest": {},
                                         "iam_bindings": [{"role": role, "members": [member]}]}
    metadata = FakeMetadataServer({
        "instance/service-accounts/default/token": json.dumps(
            {"access_token": "ya29.fake-token-123", "expires_in": 3599, "token_type": "Bearer"}),
        "project/project-id": "demo-project",
        "instance/zone": "projects/123456789/zones/us-west1-b",
        "instance/name": "demo-0",
        "instance/attributes/tfcluster-idle-minutes": str(IDLE_SECONDS / 60),
        "instance/attributes/tfcluster-idle-action": "delete",
        "instance/attributes/tfcluster-idle-probes": "jobs",
    })
    dog = RunningWatchdog([*OWN_PIDS, *world.prefix(), sys.executable, str(WATCHDOG), "--gce", "--state-dir",
                           str(tmp_path / "state"), "--poll-seconds", str(POLL)], tmp_path / "state",
                          env={"GCE_METADATA_HOST": metadata.host, "SSL_CERT_FILE": str(world.ca)})
    try:
        deletes = lambda: [r for r in compute.state.requests if r["method"] == "DELETE"]  # noqa: E731
        wait_for(deletes, 30, what="the DELETE call")
        request = deletes()[0]
        assert request["path"] == "/compute/v1/projects/demo-project/zones/us-west1-b/instances/demo-0"
        assert request["authorization"] == "Bearer ya29.fake-token-123"
        status = metadata.status()  # Published for `invoke status` as a guest attribute.
        assert status["action"] == "delete" and status["probes"] == ["jobs"]
        # The watchdog waits on the delete's operation and logs it done: poll, do not race it.
        wait_for(lambda: re.search(r"DELETE demo-project/us-west1-b/demo-0: operation operation-\S+ done",
                                   dog.log.read_text()), 30, what="the logged delete operation, done")
        assert "demo-0" not in compute.state.instances
    finally:
        dog.stop()
        metadata.close()


STALLING_JOB = """
import json, sys, time
for step in range(1, 1000):
    if time.time() > float(sys.argv[1]):
        break
    print("TFCLUSTER_EVENT " + json.dumps({"event": "progress", "step": step, "time": time.time()}), flush=True)
    time.sleep(0.1)  # 20 x 0.1 s < the 3 s floor: the floor is the limit.
print("stalled", time.time(), flush=True)
time.sleep(120)  # Alive, heartbeats and all, but no progress.
"""


def test_a_stalled_job_is_idle_after_its_stall_limit(tmp_path):
    """A live job that stops making progress: the watchdog acts within stall limit + idle + one poll
    of its last progress, and not while it makes progress. The watchdog and the job run in their own
    PID namespace, so other tfcluster jobs on this machine are not in its /proc."""
    stall = 3.0
    config = tmp_path / "watchdog.json"
    config.write_text(json.dumps({"idle_minutes": IDLE_SECONDS / 60, "action": "stop", "probes": "jobs",
                                  "stall_minutes": stall / 60}))
    (tmp_path / "job.py").write_text(STALLING_JOB)
    log, acted = tmp_path / "worker-0.log", tmp_path / "acted.log"
    progress_until = time.time() + 2 * (stall + IDLE_SECONDS)  # Longer than the limit + idle.
    inside = (f"TFCLUSTER_RUN_ID=test-run {shlex.quote(sys.executable)} {tmp_path / 'job.py'} {progress_until} "
              f"> {log} 2>&1 & exec {shlex.join([sys.executable, str(WATCHDOG), '--config', str(config), '--state-dir', str(tmp_path / 'state'), '--poll-seconds', str(POLL), '--action-command', f'echo $TFCLUSTER_IDLE_ACTION $(date +%s.%N) >> {acted}'])}")
    dog = RunningWatchdog(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", inside], tmp_path / "state")
    dog.acted = acted
    try:
        wait_for(lambda: "stalled" in (log.read_text() if log.exists() else ""), 60, what="the job to stall")
        wait_for(lambda: acted_times(dog), 30, what="the idle action")
    finally:
        dog.stop()
    last = max(e["time"] for e in (json.loads(line.split(" ", 1)[1]) for line in log.read_text().splitlines()
                                   if line.startswith("TFCLUSTER_EVENT ")))
    # Not while it made progress; then within the stall limit + idle + one poll (and a little slack).
    assert last + stall + IDLE_SECONDS - POLL <= acted_times(dog)[0] <= last + stall + IDLE_SECONDS + POLL + 1.0
    assert "no progress for" in json.dumps(dog.status()["readings"]["stalled"])


# A delete Compute accepts and then fails: the operation ends DONE with an error (the text Compute
# gives an internal failure).
INTERNAL = {"httpErrorStatusCode": 500, "httpErrorMessage": "INTERNAL SERVER ERROR", "error": {"errors": [
    {"code": "INTERNAL_ERROR", "message": "Internal error. Please try again or contact Google Support. (Code: '-42')"}]}}


@pytest.mark.parametrize("how", ["refused", "failed"])
def test_a_refused_or_failed_delete_halts_the_vm_and_says_why(tmp_path, world, how):
    """The VM's service account may not delete its instance (no binding: a role removed by hand, an
    organisation that forbids it): Compute answers 403. Or Compute takes the delete and its
    operation ends DONE with an error: the watchdog waits on it. Either way it halts the guest
    instead of leaving a GPU VM billing until the hypervisor deadline. `shutdown` is this world's
    (PATH): it records that it was asked, instead of halting the machine that runs the tests."""
    compute = world.compute
    member, role = "serviceAccount:demo-vm@demo-project.iam.gserviceaccount.com", "projects/demo-project/roles/w"
    compute.state.tokens["ya29.fake-token-123"] = member
    compute.state.custom_roles[role] = {"compute.instances.delete"}
    compute.state.instances["demo-0"] = {"zone": "us-west1-b", "labels": {}, "status": "RUNNING", "guest": {},
                                         "iam_bindings": [] if how == "refused" else [{"role": role, "members": [member]}]}
    if how == "failed":
        compute.state.failing_deletes["demo-0"] = INTERNAL
    halted = tmp_path / "halted"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "shutdown").write_text(f'#!/bin/sh\necho "$@" >> {halted}\n')
    (bin_dir / "shutdown").chmod(0o755)
    metadata = FakeMetadataServer({
        "instance/service-accounts/default/token": json.dumps(
            {"access_token": "ya29.fake-token-123", "expires_in": 3599, "token_type": "Bearer"}),
        "project/project-id": "demo-project", "instance/zone": "projects/123456789/zones/us-west1-b",
        "instance/name": "demo-0", "instance/attributes/tfcluster-idle-minutes": str(IDLE_SECONDS / 60),
        "instance/attributes/tfcluster-idle-action": "delete", "instance/attributes/tfcluster-idle-probes": "jobs",
    })
    dog = RunningWatchdog([*OWN_PIDS, *world.prefix(), sys.executable, str(WATCHDOG), "--gce", "--state-dir",
                           str(tmp_path / "state"), "--poll-seconds", str(POLL)], tmp_path / "state",
                          env={"GCE_METADATA_HOST": metadata.host, "SSL_CERT_FILE": str(world.ca),
                               "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    try:
        wait_for(lambda: halted.exists(), 30, what=f"the halt after the {how} delete")
        assert halted.read_text().split() == ["-h", "now"]
        assert compute.state.instances["demo-0"]["status"] == "RUNNING"  # Not deleted.
        refused = (metadata.status() or {}).get("refused") or ""
        if how == "refused":
            assert refused.startswith("delete refused by the Compute API (403: Required 'compute.instances.delete' "
                                      "permission for 'projects/demo-project/zones/us-west1-b/instances/demo-0'"), refused
        else:
            assert re.fullmatch(r"delete failed in the Compute API \(DELETE demo-project/us-west1-b/demo-0: operation "
                                r"operation-\S+ failed: INTERNAL_ERROR: Internal error\. Please try again or contact "
                                r"Google Support\. \(Code: '-42'\)\); halted instead", refused), refused
    finally:
        dog.stop()
        metadata.close()


def test_status_shows_a_refused_delete_beside_the_worker(capsys):
    """What `invoke status` prints from a watchdog status that carries a refusal (the guest attribute
    the test above publishes), through the Backend interface every backend implements."""
    from tfcluster.backends.base import Backend
    from tfcluster.commands.cluster import _print_watchdog
    from tfcluster.state import ClusterState, HostRecord

    class Halted(Backend):
        name = "gcp"

        def watchdog_status(self, cluster):
            return {"worker-0": {"busy": False, "idle_seconds": 40.0, "idle_minutes": 30, "action": "delete",
                                 "refused": "delete refused by the Compute API (403: Required 'compute.instances."
                                            "delete' permission); halted instead"}}

    cluster = ClusterState(name="c", backend="gcp", hosts=[HostRecord(name="worker-0", address="10.0.0.2", tf_port=23456)])
    _print_watchdog(Halted(), cluster)
    out = " ".join(capsys.readouterr().out.split())
    assert ("worker-0: the watchdog's delete refused by the Compute API (403: Required 'compute.instances.delete' "
            "permission); halted instead; its disk bills until `invoke down`") in out


def test_then_stop_halts_when_the_run_ends_here_and_only_once(start_watchdog, tmp_path):
    dog = start_watchdog(idle_minutes=30)  # Idleness alone would take half an hour.
    folder = tmp_path / "runs" / "r-7" / "worker-0"
    folder.mkdir(parents=True)
    config = {"idle_minutes": 30, "action": "stop",
              "then_stop": {"run": "r-7", "folder": str(folder.parent), "last_attempt": 2}}
    dog.config.write_text(json.dumps(config))
    (folder / "worker-0.attempt1.exit").write_text("143\n")  # A retry is still allowed: no halt.
    polled_after = time.time()
    wait_for(lambda: (dog.status() or {}).get("updated_at", 0) > polled_after + POLL, 30, what="two more polls")
    assert acted_times(dog) == []
    (folder / "worker-0.attempt2.exit").write_text("0\n")
    ended_at = time.time()
    wait_for(lambda: acted_times(dog), 30, what="the halt at the run's end")
    assert acted_times(dog)[0] <= ended_at + POLL + SCHEDULING_SLACK
    assert dog.acted.read_text().startswith("stop ")
    assert "run r-7 ended here (attempt 2 exited 0); --then stop: halting" in dog.log.read_text()
    # The VM comes back (a restart): the same run's end does not halt it again.
    dog.stop()
    again = start_watchdog(idle_minutes=30)
    again.config.write_text(json.dumps(config))
    restarted = time.time()
    wait_for(lambda: (again.status() or {}).get("updated_at", 0) > restarted + POLL, 30, what="polls after restart")
    assert len(acted_times(again)) == 1  # Only the first watchdog's halt, in the shared log.
