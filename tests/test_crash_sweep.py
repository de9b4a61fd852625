"""The fault sweep: a command killed at any moment leaves nothing billing, and the next command finishes the job.

For each command (gcp: `up`, `train`, `train --detach`, `stop`, `down`), the world first counts the requests
one clean run of it sends (tests/world/discovery.py KillSwitch). Then, for each sampled point k, the command
runs again in its own session and its whole process group (the CLI, terraform, the provider plugins, ssh,
uploads) gets SIGKILL right after the world received its k-th request (a command that asks the world
nothing, gcp `stop`, at seeded moments instead; a named point, right after the first request so named).
The same command runs again, then `invoke down`; each must exit 0, or 2 with one `error:` line and no
traceback. Then the world must hold nothing of the cluster that `down` promises to remove: instances,
disks, addresses, firewall rules, networks, service accounts, the custom role, the registry and the bucket
(empty here, so not kept). A leaked point names what leaked and where the kill landed.

`up then down` is the user who gives up after the kill: `up` killed, then `down` at once, no re-run.

The points are sampled, seeded (seed 46). CI runs on gcp `up` killed right after Cloud Storage made the bucket
(NAMED) then `down`, and one chain: the same kill, `up`, then `train --detach` killed at a seeded request,
`train --detach`, `down`. The full sweep is `TFCLUSTER_SWEEP_POINTS=20 python -m pytest -n 0 -s
tests/test_crash_sweep.py`, any seed reproduces with TFCLUSTER_SWEEP_SEED=N, and single points with
TFCLUSTER_SWEEP_AT=up:36,train--detach:5 (a failure prints that line). Every point of one backend shares
one world and one set of machines.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field

import pytest

from tests.conftest import REPO
from tests.hostlab import HostLab
from tests.test_gcp_backend import make_gcp_cli, needs_hosts
from tests.test_ssh_backend import lab, ssh_cli  # noqa: F401 - the ssh sweep's hosts and CLI
from tests.world import discovery

CLUSTER = "sweep"
SEED = int(os.environ.get("TFCLUSTER_SWEEP_SEED") or 46)
# Points per command in the full sweep (20 or more); CI (0) runs one chain of two points instead (below).
POINTS = int(os.environ.get("TFCLUSTER_SWEEP_POINTS") or 0)
# The gcp commands a full sweep (TFCLUSTER_SWEEP_POINTS) runs ("up,train--detach"; all when unset): two
# processes, each with its own world and lab network (TFCLUSTER_TESTLAB_NET), sweep halves side by side.
ONLY = {name for name in os.environ.get("TFCLUSTER_SWEEP_COMMANDS", "").split(",") if name}


@dataclass
class Tally:
    command: str
    tried: int = 0
    converged: int = 0
    # (the kill point, the request after which the group died, what the world still held) of each leaked point.
    leaked: list = field(default_factory=list)
    # (the kill point, the request, what failed) of each point whose re-run or `down` broke the one-line rule.
    broken: list = field(default_factory=list)
    # Points tried whose command ended before its kill point (a run that sent fewer requests than counted).
    missed: int = 0

    def line(self, backend: str) -> str:
        missed = f", {self.missed} of them ended before their kill point" if self.missed else ""
        return (f"sweep {backend} {self.command}: points tried {self.tried} / converged {self.converged} / "
                f"leaked {len(self.leaked)} (seed {SEED}{missed})")


def held_by_world(world, cli) -> list[str]:
    """What the world still holds of cluster CLUSTER, by the names terraform/ gives it."""
    state = world.compute.state
    found = [f"instance {name}" for name in state.instances if name.startswith(f"{CLUSTER}-")]
    for kind in ("networks", "firewalls", "subnetworks"):
        found += [f"{kind[:-1]} {name}" for name in state.resources.get(kind, {}) if name.startswith(f"{CLUSTER}-")]
    for kind in ("disks", "addresses"):
        found += [f"{kind[:-1]} {name}" for name in state.others.get(kind, set()) if name.startswith(f"{CLUSTER}-")]
    found += [f"service account {email}" for email in state.service_accounts if email.startswith(f"{CLUSTER}-")]
    found += [f"custom role {name}" for name in state.custom_roles
              if f"tfclusterWatchdog_{CLUSTER}_" in name and name not in state.deleted_roles]
    found += [f"registry {name}" for name in world.artifacts.state.repositories if f"/{CLUSTER}-" in name]
    with urllib.request.urlopen(f"{world.storage_url}/storage/v1/b?project=demo-project", timeout=30) as answer:
        found += [f"bucket {item['name']}" for item in json.load(answer).get("items", [])
                  if f"-{CLUSTER}-" in item["name"]]
    return found


def forget_everything(world, cli) -> None:
    """After a leaked point: the world and the state folder as before it, so the next point starts clean."""
    state = world.compute.state
    with state.lock:
        for name in [n for n in state.instances if n.startswith(f"{CLUSTER}-")]:
            state.instances.pop(name)
        for kind in ("networks", "firewalls", "subnetworks"):
            for name in [n for n in state.resources.get(kind, {}) if n.startswith(f"{CLUSTER}-")]:
                state.resources[kind].pop(name)
        for kind in ("disks", "addresses"):
            state.others[kind] = {n for n in state.others.get(kind, set()) if not n.startswith(f"{CLUSTER}-")}
        for email in [e for e in state.service_accounts if e.startswith(f"{CLUSTER}-")]:
            state.service_accounts.pop(email)
    with urllib.request.urlopen(f"{world.storage_url}/storage/v1/b?project=demo-project", timeout=30) as answer:
        for item in json.load(answer).get("items", []):
            if f"-{CLUSTER}-" in item["name"]:
                urllib.request.urlopen(urllib.request.Request(f"{world.storage_url}/storage/v1/b/{item['name']}",
                                                              method="DELETE"), timeout=30)
    for path in (cli.state_dir / "clusters" / f"{CLUSTER}.json", cli.state_dir / "gcp" / CLUSTER):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def run_killed(cli, args: tuple[str, ...], after: int | str | None, timeout: float = 600) -> tuple[int, str]:
    """``args`` in its own session; SIGKILL to the whole group right after the world's ``after``-th request
    (None: never). Returns its exit code (-9 when killed) and the request after which it died, with what
    the group was running then ("... while running python -m tfcluster, terraform apply")."""
    switch = discovery.KILL_SWITCH
    switch.arm(after)
    process = subprocess.Popen(cli.argv(*args), cwd=REPO, env=cli.env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    switch.target(process.pid)  # `unshare ... exec` keeps the pid: the group is the CLI's.
    try:
        _, said = process.communicate(timeout=timeout)
        code = process.returncode
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 9)
            process.wait()
        seen = switch.disarm()
    if not switch.killed_after:  # It ended before its (after+1)-th request: no kill landed; the line says so.
        return code, f"not killed: it ended with exit {code} after {len(seen)} requests" + (f": {last_line(said)}"
                                                                                            if code else "")
    return code, switch.killed_after + running(switch.killed_during)


def running(commands: list[str]) -> str:
    return f" while running {', '.join(commands)}" if commands else ""


def last_line(text: str) -> str:
    """A failed command's last line on stderr: its one `error:` line, when it keeps the rule."""
    return (text.strip().splitlines() or [""])[-1]


def one_line_or_ok(result: subprocess.CompletedProcess) -> str | None:
    """None when ``result`` keeps the rule (exit 0, or 2 with one `error:` line); else what broke it."""
    output = result.stdout + result.stderr
    if "Traceback" in output:
        return f"a traceback: {output[-1500:]}"
    if result.returncode == 0:
        return None
    lines = result.stderr.strip().splitlines()
    if result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "):
        return None
    return f"exit {result.returncode}: {result.stderr.strip()[-1500:]}"


def requests_of(cli, args: tuple[str, ...]) -> tuple[int, float]:
    """How many requests the world receives during one clean run of ``args``, and its seconds."""
    switch = discovery.KILL_SWITCH
    switch.arm(None)
    began = time.monotonic()
    result = cli.run(*args, timeout=600)
    seen = switch.disarm()
    assert result.returncode == 0, result.stdout + result.stderr
    return len(seen), time.monotonic() - began


# "up:36,down:60,train--detach:5": exactly these points (a leaked point's line names its k), instead of a sample.
AT = [item.split(":") for item in os.environ.get("TFCLUSTER_SWEEP_AT", "").split(",") if item]


# Points named by the request they follow, tried in CI and in the full sweep: `up` killed right after Cloud
# Storage made the bucket, before terraform recorded it (the gcp sweep's one leak: an orphan bucket the next
# `up` and `down` must find by its label).
NAMED = {"up": ["POST /storage/v1/b"], "up then down": ["POST /storage/v1/b"]}
# Commands a user gives up on after the kill: no re-run, `down` straight away (a killed `up`'s half-made
# cluster torn down as it is, whatever the kill left in terraform's folder and the project).
GIVE_UP = {"up then down"}


def points(command: str, total: int, seconds: float) -> list[int | float | str]:
    """The sampled kill points of ``command``, spread over its whole span: right after requests of its
    ``total``, and seeded moments in its ``seconds`` (a clean run's) for the rest of the POINTS (gcp `stop`
    asks the world nothing: all moments; `train` asks fewer than 20 requests, and its moments fall inside
    the SSH uploads and starts, between requests); then its named points (TFCLUSTER_SWEEP_AT: exactly
    those given, a number, a moment in seconds "2.5", or a request's "VERB path" start)."""
    if AT:
        return [int(k) if k.isdigit() else float(k) if re.fullmatch(r"\d+\.\d+", k) else k
                for name, k in AT if name == command.replace(" ", "")]
    rng = random.Random(f"{SEED}-{command}")
    requests = sorted(rng.sample(range(1, total), min(POINTS, total - 1))) if total > 1 else []
    moments = sorted(round(rng.uniform(0.05, 0.95) * seconds, 2) for _ in range(POINTS - len(requests)))
    return requests + moments + NAMED.get(command, [])


def ledger_problems(cli, made: list[tuple[str, float]], since: float) -> list[str]:
    """The cost ledger against the VMs the world made since ``since`` (name, when): each one's start is there
    (no VM-second lost), and no start is there twice (none counted twice)."""
    from tfcluster.ledger import START, Ledger

    starts = [(e.instance, e.at) for e in Ledger(cli.state_dir, CLUSTER).events() if e.kind == START and e.at >= since - 5]
    problems = [f"the ledger has no start of {name}, made at {at:.0f}" for name, at in made if since <= at
                and not any(n == name and abs(a - at) < 5 for n, a in starts)]
    doubles = {(n, round(a)) for n, a in starts if sum(n == m and abs(a - b) < 1 for m, b in starts) > 1}
    return problems + [f"the ledger counts the start of {name} at {at} twice" for name, at in sorted(doubles)]


def sweep_one(cli, world, tally: Tally, args: tuple[str, ...], k: int | str | float, before=None) -> None:
    """Point ``k`` of ``args``: ``before()`` makes the cluster it needs; kill; the same command; `down`; look."""
    sweep_chain(cli, world, [(tally, args, k, before)])


def sweep_chain(cli, world, steps: list[tuple[Tally, tuple[str, ...], int | str | float, object]]) -> None:
    """Points one after the other on one cluster (CI's sample: `up` killed, `up`; then `train --detach`
    killed, `train --detach`), each its command killed at its point and run again, then one `down` and
    one look: a leak or a broken line counts against every point of the chain."""
    since, ran, where, problems_later = time.time(), [], [], []
    for tally, args, k, before in steps:
        if before is not None:
            before()
        if isinstance(k, float):  # A seeded moment, in seconds (between requests, or with none at all).
            during = killed_in_time(cli, args, k)
            point = f"{k} s in"
            killed_after = "seeded moment" + running(during) if during is not None else \
                f"not killed: it ended before {k} s"
            tally.missed += during is None
        else:
            _, killed_after = run_killed(cli, args, k)
            point = f"right after request {k}"
            tally.missed += killed_after.startswith("not killed")
        tally.tried += 1
        if tally.command not in GIVE_UP:
            ran.append((" ".join(args), cli.run(*args, timeout=600)))
            if ran[-1][1].returncode:  # Within the rule if one `error:` line; said on the point's line all the same.
                killed_after += f"; the re-run said: {last_line(ran[-1][1].stderr)}"
                # The world did not change since: the same command again must now finish the job, or the
                # one line named a fix that fixes nothing (a dead end, never a converged point).
                again = cli.run(*args, timeout=600)
                if again.returncode:
                    problems_later.append(f"`{' '.join(args)}` failed twice after the kill, the second time with: "
                                          f"{last_line(again.stderr)}")
        where.append((tally, point, killed_after))
    down = cli.run("down", timeout=600)
    problems = [f"`{what}` after the kill: {problem}" for what, result in ran + [("down", down)]
                for problem in [one_line_or_ok(result)] if problem] + problems_later
    problems += ledger_problems(cli, cli.made, since)
    left = held_by_world(world, cli)
    clean = not left and cli.cluster(CLUSTER) is None
    if not clean:
        said = [line.strip() for _, result in ran + [("down", down)]
                for line in (result.stdout + result.stderr).splitlines()
                if "bucket" in line or "removing" in line or "state" in line]
        ending = [line.strip() for line in (down.stdout + down.stderr).strip().splitlines()[-3:]]
        said += [f"`down` exited {down.returncode}, its last lines: {' | '.join(ending)}"]
        for tally, point, killed_after in where:
            tally.leaked.append((point, killed_after, (left or ["the cluster's record"]) + said[-5:]))
        forget_everything(world, cli)
    for tally, point, killed_after in where:
        tally.broken += [(point, killed_after, problem) for problem in problems]
        tally.converged += clean
        # A line per point as it ends: a full sweep runs for an hour, and a stopped one still says how far it got.
        print(f"sweep point {tally.command} killed {point} ({killed_after}): "
              f"{'converged' if clean and not problems else 'LEAKED' if not clean else 'BROKEN'} "
              f"[{time.time() - since:.0f} s]", flush=True)


@pytest.fixture
def sweep_cli(tmp_path, world, synthetic_data):
    lab = HostLab(tmp_path / "lab", 2, tag="ts", listen_all=True, vm_login=True)
    cli = make_gcp_cli(tmp_path, world, lab, synthetic_data)
    cli.env["INVOKE_TFCLUSTER_CLUSTER"] = CLUSTER
    cli.made = []  # (name, when) of each VM the world made: what the cost ledger must hold.
    booting = world.compute.state.on_insert

    def on_insert(name, record):
        cli.made.append((name, time.time()))
        return booting(name, record)

    world.compute.state.on_insert = on_insert
    yield cli
    if cli.cluster(CLUSTER) is not None:
        cli.run("down", timeout=300)
    lab.teardown()


def report(tallies: list[Tally], backend: str) -> None:
    lines = [tally.line(backend) for tally in tallies]
    print("\n" + "\n".join(lines))
    failures = []
    for tally in tallies:
        for k, after, left in tally.leaked:
            failures.append(f"{tally.command}: killed {k} ({after}): the world still holds {', '.join(left)}")
        for k, after, problem in tally.broken:
            failures.append(f"{tally.command}: killed {k} ({after}): {problem}")
    sample = f"TFCLUSTER_SWEEP_POINTS={POINTS} " if POINTS else ""
    at = ",".join(f"{tally.command.replace(' ', '')}:{k.removeprefix('right after request ')}" for tally in tallies
                  for k, _, _ in tally.leaked + tally.broken if k.startswith("right after request"))
    assert not failures, ("\n".join(lines) + "\n" + "\n".join(failures) + f"\nreproduce: TFCLUSTER_SWEEP_SEED={SEED} "
                          f"{sample}python -m pytest -n 0 -s tests/test_crash_sweep.py -k {backend}"
                          + (f"\none point alone: TFCLUSTER_SWEEP_AT={at} python -m pytest -n 0 -s "
                             f"tests/test_crash_sweep.py -k {backend}" if at else ""))


# Requests the world received during one clean run of each command on a 2-VM cluster, and its seconds, when
# the sweep was last measured (the full sweep measures them anew): CI and TFCLUSTER_SWEEP_AT use these.
MEASURED = {"up": (100, 25.0), "up then down": (100, 25.0), "train": (21, 12.0), "train --detach": (19, 8.0),
            "stop": (0, 2.0), "down": (109, 20.0)}
# What the workers run: a short attached run, and the detached run that `stop` and `down` end.
SHORT_GCP_RUN = "import os, time\nprint('worker', os.environ['TFCLUSTER_WORKER_INDEX'], 'up', flush=True)\ntime.sleep(2)\n"
LONG_GCP_RUN = "import time\ntime.sleep(600)\n"


def gcp_commands(cli) -> dict[str, tuple[tuple[str, ...], object]]:
    """Each swept command: its arguments, and what must be there before it (None, or a callable)."""
    short, long = cli.state_dir.parent / "sweep_short.py", cli.state_dir.parent / "sweep_long.py"
    short.write_text(SHORT_GCP_RUN)
    long.write_text(LONG_GCP_RUN)

    def cluster_up():
        if (cli.cluster(CLUSTER) or {}).get("status") != "up":
            made = cli.run("up", timeout=600)
            assert made.returncode == 0, made.stdout + made.stderr

    def a_detached_run():
        cluster_up()
        cli.run("stop", timeout=300)  # An earlier point's short detached run may still be ending.
        started = cli.run("train", "--detach", "--script", str(long), timeout=300)
        assert started.returncode == 0, started.stdout + started.stderr

    return {"up": (("up",), None),
            "up then down": (("up",), None),
            "train": (("train", "--script", str(short)), cluster_up),
            "train --detach": (("train", "--detach", "--script", str(short)), cluster_up),
            "stop": (("stop",), a_detached_run),
            "down": (("down",), cluster_up)}


@needs_hosts
def test_gcp_commands_killed_anywhere_leave_nothing(sweep_cli, world):
    """up (then up again, or given up on: `down` at once), train (attached and --detach), stop and down on
    gcp, each killed right after sampled requests or at seeded moments."""
    cli = sweep_cli
    commands = {name: spec for name, spec in gcp_commands(cli).items()
                if not (POINTS and ONLY) or name.replace(" ", "") in ONLY}
    assert commands, f"TFCLUSTER_SWEEP_COMMANDS={','.join(sorted(ONLY))} names no command of {list(gcp_commands(cli))}"
    if POINTS:  # The full sweep: each command's span counted on this world first.
        spans = {}
        for name, (args, before) in commands.items():
            if before is not None:
                before()
            same = [spans[other] for other, (other_args, _) in commands.items()
                    if other in spans and other_args == args]
            spans[name] = same[0] if same else requests_of(cli, args)  # "up then down" kills the span of `up`.
        if cli.cluster(CLUSTER) is not None:
            assert cli.run("down", timeout=600).returncode == 0
        assert held_by_world(world, cli) == []  # The clean runs themselves leave nothing.
        print(f"\nrequests of a clean run: {spans}")
    else:
        spans = MEASURED
    tallies = {name: Tally(name) for name in commands}
    if not (POINTS or AT):  # CI: `up` killed after the bucket's insert and given up on (`down` at once); then the
        # same kill with `up` run again, and a seeded `train --detach` point on the cluster it made.
        sweep_one(cli, world, tallies["up then down"], ("up",), NAMED["up then down"][0])
        [k] = random.Random(f"{SEED}-train --detach").sample(range(1, spans["train --detach"][0]), 1)
        sweep_chain(cli, world, [(tallies["up"], ("up",), NAMED["up"][0], None),
                                 (tallies["train --detach"], commands["train --detach"][0], k, None)])
    else:
        for name, (args, before) in commands.items():
            for k in points(name, *spans[name]):
                sweep_one(cli, world, tallies[name], args, k, before=before)
    report(list(tallies.values()), "gcp")


# ---------------------------------------------------------------- local: kill points in time

LOCAL_POINTS = int(os.environ.get("TFCLUSTER_SWEEP_LOCAL_POINTS") or (3 if POINTS else 1))
SHORT_RUN = """
import os, time
print("worker", os.environ["TFCLUSTER_WORKER_INDEX"], "up", flush=True)
time.sleep(float(os.environ.get("SLEEP", "2")))
"""


def local_leftovers(cli, cluster_id: str) -> list[str]:
    from tfcluster.backends.local import processes_with_env

    left = [f"process {pid} ({line[:80]})" for pid, line in processes_with_env(f"TFCLUSTER_CLUSTER_ID={cluster_id}")]
    return left + (["the cluster's record"] if cli.cluster() is not None else [])


def killed_in_time(cli, args: tuple[str, ...], after: float) -> list[str] | None:
    """``args`` in its own session, its whole group SIGKILLed ``after`` seconds in (the kill point, drawn
    from the seeded sample; never a synchronisation). Returns what the group ran then (None: it had ended
    before, and nothing was killed)."""
    process = subprocess.Popen(cli.argv(*args), cwd=REPO, env=cli.env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        process.wait(timeout=after)
        return None
    except subprocess.TimeoutExpired:
        during = discovery.group_commands(process.pid)
        os.killpg(process.pid, 9)
        process.wait()
        return during


# Seconds each command takes here, about (CI's span; a full sweep measures a clean run instead).
# Measured by the full sweep of 2026-11-28 (a clean run each, the machine busy with other sweeps).
SPANS = {"local": {"up": 1.0, "train": 3.6, "train --detach": 0.7, "stop": 1.2, "down": 1.1},
         "ssh": {"up": 16.0, "train": 21.0, "train --detach": 15.6, "stop": 2.4, "down": 3.3, "down (no run)": 2.4}}


def time_sweep(cli, backend: str, script, up: tuple[str, ...], commands: list[str], remote=None) -> list[Tally]:
    """Kill each of ``commands`` at seeded moments of its span, the same command again, `down`: nothing left."""
    table = {
        "up": (up, None),
        "train": (("train", "--script", str(script)), "up"),
        "train --detach": (("train", "--detach", "--script", str(script)), "up"),
        "stop": (("stop",), "a detached run"),
        "down": (("down",), "a detached run"),
        "down (no run)": (("down",), "up"),
    }
    def prepare(needs: str | None) -> None:
        if needs is not None:
            made = cli.run(*up, timeout=300)
            assert made.returncode == 0, made.stdout + made.stderr
        if needs == "a detached run":
            detached = subprocess.run(cli.argv("train", "--detach", "--script", str(script)), cwd=REPO,
                                      env={**cli.env, "SLEEP": "600"}, capture_output=True, text=True, timeout=300)
            assert detached.returncode == 0, detached.stdout + detached.stderr

    def seconds_of(args: tuple[str, ...], needs: str | None) -> float:
        """One clean run's seconds (the full sweep): the span its moments are drawn from, so they land
        while it runs (fixed guesses put most of local's after its end); then `down`, as before a point."""
        prepare(needs)
        began = time.monotonic()
        result = cli.run(*args, timeout=300)
        took = time.monotonic() - began
        assert result.returncode == 0, result.stdout + result.stderr
        assert cli.run("down", timeout=300).returncode == 0
        return took

    tallies = []
    for name in commands:
        args, needs = table[name]
        tally, rng = Tally(name), random.Random(f"{SEED}-{backend}-{name}")
        span = seconds_of(args, needs) if POINTS else SPANS[backend][name]
        print(f"sweep {backend} {name}: moments drawn from {span:.2f} s", flush=True)
        for _ in range(LOCAL_POINTS):
            prepare(needs)
            cluster_id = (cli.cluster() or {}).get("cluster_id", "")
            at = round(rng.uniform(0.05, 0.95) * span, 2)
            during = killed_in_time(cli, args, at)
            moment = "seeded" + running(during) if during is not None else "not killed: it had ended"
            tally.missed += during is None
            tally.tried += 1
            cluster_id = cluster_id or (cli.cluster() or {}).get("cluster_id", "")
            for what in (args, ("down",)):
                problem = one_line_or_ok(cli.run(*what, timeout=300))
                if problem:
                    tally.broken.append((f"{at} s in", moment, f"`{' '.join(what)}` after the kill: {problem}"))
            left = local_leftovers(cli, cluster_id) if cluster_id else (["the cluster's record"] if cli.cluster() else [])
            if remote is not None and (remote / "default").exists() and any((remote / "default").iterdir()):
                left.append(f"the hosts' folder {remote / 'default'}")
            if left:
                tally.leaked.append((f"{at} s in", moment, left))
                cli.run("down", "--force")
            else:
                tally.converged += 1
            print(f"sweep point {backend} {name} killed {at} s in ({moment}): {'LEAKED' if left else 'converged'}",
                  flush=True)
        tallies.append(tally)
    return tallies


def test_local_commands_killed_anywhere_leave_nothing(cli, tmp_path):
    """up, train (attached and --detach), stop and down on the embedded local cluster: killed at seeded moments
    over each one's span (the local backend sends the world nothing to count), then the same command, then
    `down`: no process of the cluster is left, nor its record."""
    script = tmp_path / "short.py"
    script.write_text(SHORT_RUN)
    report(time_sweep(cli, "local", script, ("up", "--workers", "2"), list(SPANS["local"])), "local")


@needs_hosts
def test_ssh_train_and_down_killed_anywhere_leave_nothing(ssh_cli, tmp_path):
    """On own hosts (OpenSSH in network namespaces): `train` killed while it stages, syncs or starts, and
    in the full sweep every command (`down` killed while it ends the workers and removes the hosts' folders);
    then the same command and `down`: no process of the cluster on any host, no folder of it there."""
    script = tmp_path / "short.py"
    script.write_text(SHORT_RUN)
    commands = list(SPANS["ssh"]) if POINTS else ["down (no run)"]  # CI: the cheapest point (a train preflights TF).
    report(time_sweep(ssh_cli, "ssh", script, ("up",), commands, remote=ssh_cli.remote), "ssh")
