"""Dispatch time of the ssh backend on 1, 2, 4 and 8 real sshd hosts (network namespaces).

    sudo python bench/bench_ssh.py   # needs root, openssh-server and iproute2, like the tests

Two logins: root, whose ~/.bashrc here runs `pyenv init` (120 ms per SSH session, the
kind of rc file real hosts have too), and a throwaway user with a plain /bin/sh and no rc
files, as on a minimal image. All eight "hosts" share this machine's 2 cores, so any
per-host CPU (sshd, the login shell, tar) is 4x oversubscribed at 8 hosts; the plain
login shows how much of t(8) is that.

Dispatch = connect (fresh connections, pinned keys) + sync code and data + start every
worker, until every worker has recorded its PID. The workers run a tiny script, so
TensorFlow start-up is not in the number. Then the same dispatch again with unchanged
code and data, where the content hash must skip the upload.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.hostlab import HostLab, available  # noqa: E402
from tfcluster import launch  # noqa: E402
from tfcluster.backends.base import Payload  # noqa: E402
from tfcluster.backends.ssh import SshBackend  # noqa: E402
from tfcluster.state import ClusterState, HostRecord  # noqa: E402

SCRIPT = "import time; time.sleep(30)\n"
CORES = os.cpu_count() or 1


def machine_cpu_seconds() -> float:
    """CPU time used by the whole machine so far (every process, both sides of SSH)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, idle, iowait, irq, softirq = (int(x) for x in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def dispatch(lab: HostLab, count: int, tmp: Path, data_dir: Path, run_id: str, user: str = "root",
             python: str = sys.executable, remote: Path | None = None) -> tuple[float, int, float]:
    # A folder per host: like separate machines, each must receive its own copy.
    remote = remote or tmp / "remote"
    records = [HostRecord(name=f"worker-{i}", address=h.address, tf_port=23456, host_key=h.host_key_public,
                          remote_root=str(remote / f"h{i}" / "bench"))
               for i, h in enumerate(lab.hosts[:count])]
    cluster = ClusterState(name="bench", backend="ssh", hosts=records, ssh_user=user,
                           ssh_key=str(lab.client_key), python=python)
    backend = SshBackend(store=None, announce=lambda text: None)
    script = tmp / "job.py"
    script.write_text(SCRIPT)
    payload = Payload(python=python, script=script, project=None, data_dir=data_dir, args=[])
    cpu_before = machine_cpu_seconds()
    started = time.perf_counter()
    hosts = backend.hosts(cluster)
    staged = backend.stage(cluster, hosts, run_id, payload)
    plans = launch.build_plans(hosts, run_id, staged.argv, staged.env)
    launch.start_attempt(plans, 1)
    while not all(launch.worker_status(plan, 1).state != launch.STARTING for plan in plans):
        time.sleep(0.01)
    elapsed = time.perf_counter() - started
    cpu = machine_cpu_seconds() - cpu_before
    launch.stop_attempt(plans, 1, 2)
    backend.close()
    return elapsed, sum(staged.uploaded.values()), cpu


PLAIN_USER = "tfcbench"


def make_plain_user(tmp: Path) -> Path:
    """A throwaway login with /bin/sh and an empty home; returns its home.

    Password "*": no password works, but the account is not "locked", which sshd refuses.
    """
    home = tmp / "plainhome"
    subprocess.run(["useradd", "--password", "*", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/sh", PLAIN_USER],
                   check=True, capture_output=True)
    home.mkdir()
    shutil.chown(home, PLAIN_USER, PLAIN_USER)
    return home


def measure(lab, tmp, data_dir, label, **login) -> list[tuple[int, float, float]]:
    rows = []
    remote = login.get("remote") or tmp / "remote"
    for count in (1, 2, 4, 8):
        cold, warm, cpu = [], [], []
        for round_ in range(3):
            shutil.rmtree(remote, ignore_errors=True)  # Cold: nothing on the hosts yet.
            if login.get("user", "root") != "root":
                remote.mkdir(parents=True)
                shutil.chown(remote, login["user"], login["user"])
            seconds, uploads, cpu_seconds = dispatch(lab, count, tmp, data_dir, f"cold{count}-{round_}", **login)
            cold.append(seconds)
            cpu.append(cpu_seconds)
            seconds, reuploads, _ = dispatch(lab, count, tmp, data_dir, f"warm{count}-{round_}", **login)
            warm.append(seconds)
            assert uploads == count and reuploads == 0, (uploads, reuploads)
        rows.append((count, statistics.median(cold), statistics.median(warm), statistics.median(cpu)))
        print(f"  {label}, {count} host(s): cold {rows[-1][1]:.3f}s (machine CPU {rows[-1][3]:.2f}s)  "
              f"unchanged {rows[-1][2]:.3f}s", flush=True)
    return rows


def main() -> None:
    reason = available()
    if reason:
        raise SystemExit(f"bench_ssh: {reason}")
    tmp = Path(tempfile.mkdtemp(prefix="tfcluster-bench-ssh-"))
    tmp.chmod(0o755)  # The plain user must read the shared authorized_keys and job script.
    data_dir = tmp / "shapes"
    subprocess.run([sys.executable, "-m", "trainer.create_tfrecords", "--synthetic", "--out", str(data_dir)],
                   cwd=REPO, check=True, capture_output=True)
    for path in data_dir.rglob("*"):
        path.chmod(0o644)
    lab = HostLab(tmp / "lab", 8, tag="tb")
    (tmp / "lab").chmod(0o755)
    lab.authorized_keys.chmod(0o644)
    results = {}
    plain_user = False
    try:
        results["root (pyenv .bashrc)"] = measure(lab, tmp, data_dir, "root")
        home = make_plain_user(tmp)
        plain_user = True
        results["plain /bin/sh user"] = measure(lab, tmp, data_dir, "plain", user=PLAIN_USER,
                                                python="/usr/bin/python3", remote=home / "remote")
    finally:
        lab.teardown()
        if plain_user:
            subprocess.run(["userdel", PLAIN_USER], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(f"| login | hosts | dispatch, code + data uploaded | t(n)/t(1) | machine CPU during it | "
          f"CPU / {CORES} cores (floor on this machine) | re-dispatch, unchanged (upload skipped) |")
    print("|---|---|---|---|---|---|---|")
    for label, rows in results.items():
        base = rows[0][1]
        for count, cold, warm, cpu in rows:
            print(f"| {label} | {count} | {cold:.2f} s | {cold / base:.2f} | {cpu:.2f} s | {cpu / CORES:.2f} s "
                  f"| {warm:.2f} s |")
    for label, rows in results.items():
        print(f"{label}: t(8)/t(1) = {rows[-1][1] / rows[0][1]:.2f} (target <= 1.5)")


if __name__ == "__main__":
    main()
