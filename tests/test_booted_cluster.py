"""The gcp backend end to end on VMs that boot (tests/world/booted.py): real terraform through the
provider stand-ins creates the instances, each becomes a systemd machine that runs the
startup-script terraform read from startup/startup.sh, and the product works on them with its
own defaults (/opt/tfcluster/venv, ~/.tfcluster-remote). Nothing is overridden but the world around it.
The project enforces compute.requireOsLogin, so `auto` picks OS Login: `check` holds, `up` imports the
cluster's key into the operator's login profile, the VMs' sshd asks OS Login (tests/world/oslogin_guest.py)
and the login is the profile's username; the sshd's refusals (a metadata key with OS Login on, an
expired key, no role, an external account without its role, OS Login off) are tried on the booted VMs,
and `down` leaves no key in the profile.

One cluster of 2 VMs lives through one ordered scenario (each step needs the one before):
up -> train on gs:// -> pull -> a run with --budget, the laptop gone: each VM halts itself at the
budget's end time -> up again (restart) -> train again with --then stop (a worker killed and resumed,
the laptop gone: each VM halts itself at the run's end) -> up -> a run hangs and the laptop goes: the
VMs delete themselves once it is past its stall limit and idle -> down.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import Cli, events_of, wait_for
from tests.fake_operations import advance
from tests.hostlab import available
from tests.imagelab import ensure_dockerd
from tests.world.booted import BRIDGE, EXTERNAL, BootedMachines
from tests.world.compute_auth import account_of
from tests.world.names import token_for
from tests.world.provider import mirror

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("debootstrap") is None or available() is not None,
                                reason="needs root, debootstrap, Docker and network namespaces (.ci/run installs them)")
TF_VERSION = "2.21.0"
SCRIPTS = Path(__file__).parent / "scripts"
# Run on a VM: instances.delete of the instance named by argv[1], as the watchdog makes it
# (startup/tfcluster_watchdog/gce.py), with the token this VM's metadata server hands it; prints its account's
# e-mail and Compute's answer.
DELETE_AS_THIS_VM = """
import json, sys, urllib.error, urllib.request
account = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/"
def metadata(key):
    request = urllib.request.Request(account + key, headers={"Metadata-Flavor": "Google"})
    return urllib.request.urlopen(request, timeout=10).read().decode()
print("EMAIL", metadata("email"))
token = json.loads(metadata("token"))["access_token"]
request = urllib.request.Request("https://compute.googleapis.com/compute/v1/projects/demo-project/zones/"
                                 "us-west1-b/instances/" + sys.argv[1], method="DELETE",
                                 headers={"Authorization": "Bearer " + token})
try:
    print("STATUS", urllib.request.urlopen(request, timeout=30).status)
except urllib.error.HTTPError as error:
    print("STATUS", error.code, json.loads(error.read())["error"]["message"])
"""


@pytest.fixture
def booted(tmp_path, world, synthetic_data):
    reason = ensure_dockerd()
    if reason:
        pytest.skip(reason)
    machines = BootedMachines(world, tmp_path / "booted")
    cli = Cli(tmp_path / "state", synthetic_data)
    cli.env.update(mirror.build(tmp_path / "providers"))
    cli.env.update({"INVOKE_TFCLUSTER_BACKEND": "gcp", "INVOKE_TFCLUSTER_PROJECT": world.compute.state.project,
                    "INVOKE_TFCLUSTER_ZONE": "us-west1-b", "INVOKE_TFCLUSTER_WORKERS": "2",
                    # No GPU here: CPU VMs (the startup script then installs tensorflow without [and-cuda]).
                    "INVOKE_TFCLUSTER_GPU_COUNT": "0"})
    cli.enter(world)
    cli.machines = machines
    # An organisation that enforces OS Login (tests/world/oslogin.py: Compute then refuses enable-oslogin=false).
    world.project_apis.apis.policies["compute.requireOsLogin"] = [{"enforce": True}]
    try:
        yield cli
    finally:
        try:
            if cli.cluster() is not None:
                cli.run("down", "--delete-bucket", timeout=300)
        finally:
            machines.close()


def instances(world) -> dict:
    with world.compute.state.lock:
        return {name: dict(record) for name, record in world.compute.state.instances.items()}


def cluster_resources(world) -> dict[str, list[str]]:
    """What Compute and IAM hold whose name starts like the cluster "default"'s."""
    state = world.compute.state
    with state.lock:
        found = {"instances": sorted(state.instances),
                 "service accounts": sorted(e for e in state.service_accounts if e.startswith("default-")),
                 "custom roles": sorted(r for r in state.custom_roles if "_default_" in r)}
        for kind, names in state.others.items():
            found[kind] = sorted(n for n in names if n.startswith("default-") and n != "default-web-ip")
    return {kind: names for kind, names in found.items() if names}


def on_vm(machines, name: str, path: str) -> str:
    return machines.exec(name, "cat", path).stdout


def ssh_refused_from(address: str, target: str) -> bool:
    """A TCP connection to target:22 from another address of the laptop's network gets nowhere."""
    subprocess.run(["ip", "addr", "add", f"{address}/24", "dev", BRIDGE], check=True)
    try:
        with socket.socket() as probe:
            probe.bind((address, 0))
            probe.settimeout(3)
            try:
                probe.connect((target, 22))
            except OSError:
                return True
            return False
    finally:
        subprocess.run(["ip", "addr", "del", f"{address}/24", "dev", BRIDGE], check=True)


def ssh_logs_in(cluster: dict, user: str, address: str) -> subprocess.CompletedProcess:
    """A login with the cluster's own key, as `user`, by the VM's sshd alone (no product code)."""
    return subprocess.run(["ssh", "-i", cluster["ssh_key"], "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                           "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o",
                           "ConnectTimeout=10", "-o", "LogLevel=ERROR", f"{user}@{address}", "true"],
                          capture_output=True, text=True, timeout=60)


def os_login_refusals(world, machines, cluster: dict) -> None:
    """Each login OS Login refuses, tried against VM 0's sshd, and the login it lets in."""
    user, state = cluster["ssh_user"], world.oslogin.state
    address = cluster["hosts"][0]["ssh_address"]
    [key] = state.profiles[state.operator_email]["keys"].values()
    assert ssh_logs_in(cluster, user, address).returncode == 0
    # A metadata key, as the guest agent writes it from ssh-keys: ignored while OS Login is on.
    machines.exec("default-0", "useradd", "-m", "metadatauser")
    machines.exec("default-0", "sh", "-c", "mkdir -p ~metadatauser/.ssh && cp /dev/stdin ~metadatauser/.ssh/"
                  f"authorized_keys <<EOF\n{key['key']}\nEOF\nchown -R metadatauser ~metadatauser/.ssh")
    assert ssh_logs_in(cluster, "metadatauser", address).returncode == 255
    expires = key["expirationTimeUsec"]
    key["expirationTimeUsec"] = str(int((time.time() - 1) * 1e6))  # The key of a run long gone.
    assert ssh_logs_in(cluster, user, address).returncode == 255
    key["expirationTimeUsec"] = expires
    missing = world.compute.state.missing_permissions
    missing |= {"compute.instances.osLogin", "compute.instances.osAdminLogin"}  # No OS Login role.
    assert ssh_logs_in(cluster, user, address).returncode == 255
    missing.clear()
    state.external.add(state.operator_email)  # An account from outside the organisation...
    missing.add("compute.oslogin.updateExternalUser")  # ...without roles/compute.osLoginExternalUser.
    assert ssh_logs_in(cluster, user, address).returncode == 255
    missing.clear()
    state.external.clear()
    record = world.compute.state.instances["default-0"]["metadata"]
    record["enable-oslogin"] = "false"  # OS Login off: the profile's key no longer logs in, the metadata one does.
    assert ssh_logs_in(cluster, user, address).returncode == 255
    assert ssh_logs_in(cluster, "metadatauser", address).returncode == 0
    record["enable-oslogin"] = "TRUE"
    machines.exec("default-0", "userdel", "-r", "metadatauser")
    assert ssh_logs_in(cluster, user, address).returncode == 0


def test_a_booted_cluster_from_up_to_down(booted, world):
    cli, machines = booted, booted.machines
    names = ["default-0", "default-1"]

    # ---- check, in a project that enforces OS Login: auto picks it, and every check holds.
    checked = cli.run("check", timeout=300)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "✓ constraints/compute.requireOsLogin: enforced: the VMs log in through OS Login" in checked.stdout
    assert "✓ ssh identity: OS Login (constraints/compute.requireOsLogin is enforced)" in checked.stdout

    # ---- up: real terraform, machines that boot startup.sh, readiness by nonce, host keys pinned.
    project_before = cluster_resources(world)  # The project's own (the default VPC's rules).
    up = cli.run("up", timeout=1500)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:] + machines.journals()
    assert "ssh: OS Login (constraints/compute.requireOsLogin is enforced)" in up.stdout
    user = cli.cluster()["ssh_user"]
    assert user == "sa_111111111111111111111"  # The profile's POSIX username (users.getLoginProfile).
    assert {r["metadata"]["enable-oslogin"] for r in instances(world).values()} == {"TRUE"}
    os_login_refusals(world, machines, cli.cluster())
    first = instances(world)
    assert sorted(first) == names
    pinned = {host["instance"]: host for host in cli.cluster()["hosts"]}
    host_keys = {}
    for name, record in first.items():
        nonce = record["metadata"]["tfcluster-boot-nonce"]
        assert machines.metadata.history(name, "tfcluster/ready") == [f"{nonce}:starting", f"{nonce}:ok"]
        # The key the guest agent made at this instance's first boot is the one pinned for its
        # external address, where SSH goes; each VM has its own.
        host_keys[name] = on_vm(machines, name, "/etc/ssh/ssh_host_ed25519_key.pub").split()[1]
        assert pinned[name]["host_key"] == f"ssh-ed25519 {host_keys[name]}"
        assert pinned[name]["ssh_address"] == record["external_ip"] and pinned[name]["address"] == record["internal_ip"]
        assert record["external_ip"].startswith(EXTERNAL + ".") and record["internal_ip"] != record["external_ip"]
        assert machines.exec(name, "/opt/tfcluster/venv/bin/python", "-c", "import tensorflow as tf; "
                             "print(tf.__version__)").stdout.strip() == TF_VERSION
        # The image lacks python3-venv: startup.sh's fallback installed it.
        assert machines.exec(name, "dpkg-query", "-W", "-f", "${Status}", "python3-venv").stdout == "install ok installed"
        # The watchdog ran before pip asked the wheelhouse for anything.
        first_status = next(w.at for who, w in machines.metadata.named_writes
                            if who == name and w.key == "tfcluster/watchdog")
        first_pip = next(at for at, _, client in machines.wheels.requests if client == record["internal_ip"])
        assert first_status < first_pip
    assert host_keys["default-0"] != host_keys["default-1"]
    cluster = cli.cluster()

    # ---- the firewall: SSH only from the operator's address.
    assert ssh_refused_from(f"{EXTERNAL}.250", first["default-0"]["external_ip"])

    # ---- a killed watchdog comes back (systemd Restart=always).
    def watchdog_pid() -> int:
        return int(machines.exec("default-0", "systemctl", "show", "-p", "MainPID", "--value",
                                 "tfcluster-watchdog").stdout or 0)
    before = watchdog_pid()
    machines.exec("default-0", "kill", "-9", str(before))
    wait_for(lambda: watchdog_pid() not in (0, before), 60, 0.5, "a new watchdog process")

    # ---- train on gs://, replicas in sync; the pulled model loads.
    train = cli.run("train", "--", "--epochs", "2", timeout=900)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    run_dir, run = cli.latest_run()
    assert run["summary"]["replicas_in_sync"] == 2
    bucket = cluster["bucket"]
    prefix = f"runs/{run['run_id']}/"
    from tfcluster.backends.gcp.cloud import storage as gcs

    stored = [blob.name for blob in gcs.client("demo-project").list_blobs(bucket, prefix=prefix)]
    assert any(n.startswith(prefix + "model/") and n.endswith("model.keras") for n in stored), stored
    # Every object of the run but the launcher's throughput figures came from the VMs' identity.
    writers = {name: token for token, name in world.storage_proxy.object_writes if name.startswith(prefix)}
    vm_tokens = {token_for(account_of(record)) for record in first.values()}  # Each VM's own account's.
    assert {n for n, t in writers.items() if t not in vm_tokens} <= {n for n in writers if "/throughput/" in n}
    pulled = cli.run("pull", timeout=180)
    assert pulled.returncode == 0, pulled.stderr
    served = run_dir / "output" / "model"  # The SavedModel at its root (trainer/export.py).
    predict = subprocess.run([sys.executable, "-c", (
        "import tensorflow as tf; "
        f"m = tf.saved_model.load({str(served)!r}); "
        "print('PRED', m.signatures['serving_uint8'](images=tf.zeros((2, 40, 40, 3), tf.uint8))"
        "['probabilities'].shape)")], capture_output=True, text=True, timeout=180)
    assert "PRED (2, 4)" in predict.stdout, predict.stdout + predict.stderr[-2000:]

    # ---- a run's budget, and the laptop goes: the budget's end time (in each VM's metadata) arrives
    # while the run still makes progress, and each VM's watchdog halts its VM: Compute shows it TERMINATED.
    stamp = f"/opt/tfcluster/venv/.installed-tensorflow-{TF_VERSION}-tuner"
    stamp_mtime = machines.exec("default-0", "stat", "-c", "%Y", stamp).stdout
    rate = float(re.search(r"\(in use\): \$([0-9.]+)/hour", up.stdout).group(1))
    steady = cli.state_dir.parent / "steady.py"
    steady.write_text("import time\nimport tfcluster\nfor step in range(1, 100000):\n"
                      "    tfcluster.progress(step)\n    time.sleep(1)\n")
    capped = cli.popen("train", "--script", str(steady), "--budget", f"{rate * 75 / 3600:.6f}")  # 75 s.
    try:
        capped_dir = wait_for(lambda: cli.runs() and cli.runs()[-1].name != run["run_id"] and cli.runs()[-1],
                              60, what="the capped run's folder")
        capped_log = f"/home/{user}/.tfcluster-remote/default/runs/{capped_dir.name}/worker-0/worker-0.log"
        wait_for(lambda: '"progress"' in on_vm(machines, "default-0", capped_log), 120, 1, "the capped run's steps")
    finally:
        capped.kill()  # The laptop goes away; the run goes on, busy.
        capped.communicate(timeout=30)
    ends = {record["metadata"]["tfcluster-budget-end"] for record in instances(world).values()}
    end = float(next(iter(ends)))
    assert len(ends) == 1 and end > time.time(), (ends, time.time())
    wait_for(lambda: all(r["status"] == "TERMINATED" for r in instances(world).values()), 300, 2,
             "the watchdogs to halt the VMs at the run's budget end time")
    assert not any(machines.running(name) for name in names)
    for name, record in instances(world).items():  # Each halted at the end time, within a poll (startup.sh's 30 s).
        halted = datetime.fromisoformat(record["stopped"]).timestamp()
        assert end - 1 <= halted <= end + 30 + 30, (name, halted, end)
        # Its watchdog read the end time from the metadata (the status it publishes is a courtesy: the
        # state.json check after the restart below is what shows it halted for the budget).
        assert any(json.loads(value)["budget_end"] == end
                   for value in machines.metadata.history(name, "tfcluster/watchdog")), name

    # ---- up again: the same VMs start, on new external addresses, with their deadline, and
    # their host keys are published again (guest attributes did not survive the stop) and accepted.
    again = cli.run("up", timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:] + machines.journals()
    second = instances(world)
    for name, record in second.items():
        assert record["external_ip"] != first[name]["external_ip"]
        assert record["internal_ip"] == first[name]["internal_ip"]
        assert record["max_run_seconds"] == 12 * 3600
        assert record["guest"]["hostkeys/ssh-ed25519"] == host_keys[name]  # Same disk, same keys.
        host = next(h for h in cli.cluster()["hosts"] if h["instance"] == name)
        assert host["ssh_address"] == record["external_ip"] and host["host_key"] == f"ssh-ed25519 {host_keys[name]}"
        nonce = record["metadata"]["tfcluster-boot-nonce"]
        assert machines.metadata.history(name, "tfcluster/ready")[-2:] == [f"{nonce}:starting", f"{nonce}:ok"]
    # The second boot used the installed environment.
    assert machines.exec("default-0", "stat", "-c", "%Y", stamp).stdout == stamp_mtime
    # The watchdog reads its settings at every poll: back to the default before training again.
    assert cli.run("idle", "--minutes", "30", timeout=120).returncode == 0

    # ---- train again with --then stop, and a worker dies: --retries 1 resumes every worker from
    # the backup. Then the laptop goes away: each VM halts itself once the run's end is recorded on it.
    launcher = cli.popen("train", "--retries", "1", "--then", "stop", "--", "--epochs", "3")
    try:
        run_dir = wait_for(lambda: cli.runs() and cli.runs()[-1].name not in (run["run_id"], capped_dir.name)
                           and cli.runs()[-1], 60, what="the third run's folder")
        remote = f"/home/{user}/.tfcluster-remote/default/runs/{run_dir.name}"
        chief_log = f"{remote}/worker-0/worker-0.log"

        def epoch_done() -> bool:
            return any(e["event"] == "epoch_end" for e in events_of(on_vm(machines, "default-0", chief_log)))

        wait_for(epoch_done, 300, 1, "the chief's first epoch")
        pid = on_vm(machines, "default-1", f"{remote}/worker-1/worker-1.attempt1.pid").strip()
        machines.exec("default-1", "kill", "-9", pid)
        wait_for(lambda: "attempt 2 on" in on_vm(machines, "default-0", chief_log), 300, 1, "attempt 2")
    finally:
        launcher.kill()  # The laptop goes away while attempt 2 runs.
        launcher.communicate(timeout=30)
    wait_for(lambda: all(r["status"] == "TERMINATED" for r in instances(world).values()), 600, 2,
             "each VM to halt itself at the run's end (--then stop)")
    assert json.loads((run_dir / "run.json").read_text())["outcome"] is None  # No launcher saw the end.
    status = cli.run("status", timeout=300)
    assert f"Run {run_dir.name} ended while no launcher ran; each VM halted itself (--then stop)" in status.stdout, \
        status.stdout[-3000:]
    assert cli.run("up", timeout=900).returncode == 0  # Back up; the same run's end does not halt them again.
    attempt_2 = on_vm(machines, "default-0", chief_log).split("attempt 2 on", 1)[1]
    assert next(e for e in events_of(attempt_2) if e["event"] == "first_step")["epoch"] > 1  # From the backup.
    for name in names:  # Each watchdog remembers the run and the budget end it halted for (boot disk).
        state = json.loads(machines.exec(name, "cat", "/var/lib/tfcluster/state.json").stdout)
        assert state["then_done"] == run_dir.name and state["budget_done"] == end

    # ---- a run that hangs, and the laptop goes: each VM's watchdog counts the run as idle once its
    # last progress is older than --stall-minutes (handed to the VMs through their metadata), then
    # with idle_action delete each deletes its own instance with its own token, and Compute forgets
    # it: within the stall limit + the idle time + one poll. `down` then finishes without VMs.
    hung = cli.popen("train", "--script", str(SCRIPTS / "hung_at_step.py"), "--stall-minutes", "1", "--",
                     "--hang-step", "6", "--epochs", "3")
    try:
        earlier = {r.name for r in cli.runs()}
        hung_dir = wait_for(lambda: [r for r in cli.runs() if r.name not in earlier], 60, what="the hung run's folder")[0]
        hung_remote = f"/home/{user}/.tfcluster-remote/default/runs/{hung_dir.name}"
        hung_logs = {name: f"{hung_remote}/worker-{index}/worker-{index}.log" for index, name in enumerate(names)}
        wait_for(lambda: "hanging at step 6" in on_vm(machines, names[1], hung_logs[names[1]]), 300, 1,
                 "worker-1 to hang at step 6")
    finally:
        hung.kill()  # The laptop goes away; the workers stay, stalled.
        hung.communicate(timeout=30)
    assert {name: record["metadata"]["tfcluster-stall-minutes"] for name, record in instances(world).items()} == \
        {name: "1" for name in names}
    # Each VM runs as its own service account: from inside VM 0, the token its metadata server hands
    # it deletes no sibling. Compute refuses the DELETE of VM 1 (403) and VM 1 stays.
    accounts = {name: account_of(record) for name, record in first.items()}
    assert accounts == {name: f"default-vm-{i}@demo-project.iam.gserviceaccount.com" for i, name in enumerate(names)}
    sibling = machines.exec(names[0], "/opt/tfcluster/venv/bin/python", "-c", DELETE_AS_THIS_VM, names[1]).stdout
    assert sibling.splitlines() == [f"EMAIL {accounts[names[0]]}", "STATUS 403 Required 'compute.instances.delete' "
                                    f"permission for 'projects/demo-project/zones/us-west1-b/instances/{names[1]}'"], \
        sibling
    assert instances(world)[names[1]]["status"] == "RUNNING"
    tried = len(world.compute.state.requests)
    cli.env["INVOKE_TFCLUSTER_IDLE_ACTION"] = "delete"
    assert cli.run("idle", "--minutes", "1", timeout=120).returncode == 0
    idle_set = time.time()  # A watchdog cannot act on the idle minute before its metadata has it.
    last_progress = {name: max(e["time"] for e in events_of(on_vm(machines, name, log)) if e["event"] == "progress")
                     for name, log in hung_logs.items()}

    def deleted() -> bool:
        advance(world.compute.state)  # Compute's operations move on whether anyone polls or not.
        return not instances(world)

    wait_for(deleted, 400, 2, "the VMs of the stalled run to delete themselves")
    deletes = {r["path"].rsplit("/", 1)[1]: r for r in world.compute.state.requests[tried:]
               if r["method"] == "DELETE" and "/instances/" in r["path"]}
    # Each deleted itself, with its own account's token.
    assert {name: r["authorization"] for name, r in deletes.items()} == \
        {name: f"Bearer {token_for(accounts[name])}" for name in names}
    stall, idle, poll = 60, 60, 30  # --stall-minutes 1, idle 1 minute, startup.sh's watchdog poll.
    for name in names:  # Not while it made progress. The watchdog sees the stall at its first poll past the
        # limit and counts idleness from that poll (IdleTracker.observe), so it acts at the first poll an idle
        # minute later, or once the idle minute is set if that comes later: + one poll (+ the request).
        due = max(last_progress[name] + stall + poll + idle, idle_set)
        assert stall + idle - 1 <= deletes[name]["at"] - last_progress[name] and deletes[name]["at"] <= due + poll + 15, \
            (name, deletes[name]["at"] - last_progress[name], idle_set - last_progress[name])
    assert not machines.vms

    # ---- down: everything that bills goes, every VM's service account too, the bucket stays.
    assert cluster_resources(world)["service accounts"] == sorted(accounts.values())
    down = cli.run("down", timeout=600)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "verified through IAM: no service account of the cluster's VMs (default-vm-N@demo-project." \
        "iam.gserviceaccount.com) and no watchdog role is left" in down.stdout
    assert cluster_resources(world) == project_before
    assert bucket in [b.name for b in gcs.client("demo-project").list_buckets()]
    assert not machines.vms
    # ---- and the cluster's key is gone from the operator's OS Login profile.
    assert "deleted the cluster's key from your OS Login profile" in down.stdout
    assert world.oslogin.state.profiles[world.oslogin.state.operator_email]["keys"] == {}
