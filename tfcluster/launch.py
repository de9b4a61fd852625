"""Launch, follow and stop a multi-worker run on any backend's WorkerHosts.

Each worker runs a small shell wrapper written into the run folder on its host.
The wrapper exports the worker's TF_CONFIG and environment (so nothing depends on
sshd's AcceptEnv), starts the program with output appended to the worker's log,
records its PID, waits, and writes the exit code. The wrapper is started in its own
session, so the job outlives the launcher; the status files are the truth that
`status`, `logs --follow` and `stop` read from a new shell.
"""

from __future__ import annotations

import shlex
import signal
from concurrent.futures import ThreadPoolExecutor
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from tfcluster import collective, container, stall, tfconfig
from tfcluster.backends.base import WorkerHost
from tfcluster.errors import HostUnreachable
from tfcluster.progress import Progress  # noqa: F401 (launch.Progress: the commands' name for a run's progress)
from trainer import events

POLL_SECONDS = 0.5

# Worker states derived from the status files.
STARTING, RUNNING, SUCCEEDED, FAILED, LOST = "starting", "running", "succeeded", "failed", "lost"
FINISHED = (SUCCEEDED, FAILED, LOST)


@dataclass
class WorkerPlan:
    # 0-based worker index; 0 is the chief.
    index: int
    # The host this worker runs on.
    host: WorkerHost
    # TF_CONFIG JSON for this worker.
    tf_config: str
    # argv of the program (interpreter first).
    argv: list[str]
    # Environment exported by the wrapper, TF_CONFIG included.
    env: dict[str, str]
    # Run folder on the host.
    run_root: str
    # For processes that are not a TF_CONFIG task (tune's oracle and tuners): the name used
    # for files and the console ("" = the host's) and the role shown beside it ("" = the task).
    label: str = ""
    role: str = ""
    # Folder the program starts in ("" = run_root).
    workdir: str = ""
    # Set when the program runs inside a container image (`train --image`).
    container: container.ContainerSpec | None = None

    @property
    def name(self) -> str:
        return self.label or self.host.record.name

    @property
    def task(self) -> str:
        if self.role:
            return self.role
        task_type, task_index = tfconfig.task_of(self.index)
        return f"{task_type}:{task_index}"

    @property
    def log_path(self) -> str:
        return f"{self.run_root}/{self.name}.log"

    def path(self, attempt: int, suffix: str) -> str:
        """Per-attempt status file: .sh, .pid (program), .pgid (wrapper group), .exit, .env (image)."""
        return f"{self.run_root}/{self.name}.attempt{attempt}.{suffix}"

    def container_name(self, attempt: int) -> str:
        return container.container_name(self.env["TFCLUSTER_RUN_ID"], self.index, attempt)


def build_plans(hosts: list[WorkerHost], run_id: str, argv: list[str],
                env: dict[str, str], image: container.ContainerSpec | None = None) -> list[WorkerPlan]:
    """One plan per host; ``env`` is shared, TF_CONFIG and worker ids are added per worker."""
    endpoints = [host.record.endpoint for host in hosts]
    plans = []
    for index, (host, tf_config) in enumerate(zip(hosts, tfconfig.render_all(endpoints))):
        run_root = host.run_root(run_id)
        worker_env = {
            **{key: value.replace("{run_root}", run_root) for key, value in env.items()},
            "TF_CONFIG": tf_config,
            "TFCLUSTER_RUN_ID": run_id,
            "TFCLUSTER_WORKER_INDEX": str(index),
            "PYTHONUNBUFFERED": "1",
        }
        spec = None if image is None else container.ContainerSpec(
            image.image, [m.replace("{remote_root}", host.record.remote_root) for m in image.mounts])
        plans.append(WorkerPlan(index=index, host=host, tf_config=tf_config,
                                argv=[arg.replace("{run_root}", run_root) for arg in argv],
                                env=worker_env, run_root=run_root, container=spec))
    return plans


# The environment's output folders (Vertex AI's names, which scripts written for it read).
OUTPUT_FOLDERS = ("AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR")


def render_wrapper(plan: WorkerPlan, attempt: int, workdir: str) -> str:
    """The shell wrapper for one worker attempt. Every value is shell-quoted."""
    q = shlex.quote
    exports = "\n".join(f"export {key}={q(value)}" for key, value in sorted(plan.env.items()))
    exit_file = plan.path(attempt, "exit")
    start = f"""{shlex.join(plan.argv)} >> {q(plan.log_path)} 2>&1 </dev/null &
echo $! > {q(plan.path(attempt, "pid"))}
wait $!"""
    if plan.container is not None:
        labels = {container.LABEL_CLUSTER: plan.env.get("TFCLUSTER_CLUSTER_ID", ""),
                  container.LABEL_RUN: plan.env["TFCLUSTER_RUN_ID"], container.LABEL_WORKER: plan.name}
        start = container.wrapper_start(plan.container, plan.container_name(attempt), labels,
                                        plan.path(attempt, "env"), workdir, plan.run_root, plan.argv,
                                        plan.log_path, plan.path(attempt, "pid"))
    # Vertex AI's folders exist before the program starts, as they do there (a script saves into
    # AIP_MODEL_DIR without creating it); a gs:// one needs no folder.
    folders = sorted({value for key, value in plan.env.items() if key in OUTPUT_FOLDERS and "://" not in value})
    made = f"mkdir -p {' '.join(q(folder) for folder in folders)}\n" if folders else ""
    return f"""#!/bin/sh
# tfcluster: {plan.name} ({plan.task}), attempt {attempt}. Written by the launcher.
cd {q(workdir)} || exit 97
{exports}
{made}echo $$ > {q(plan.path(attempt, "pgid"))}
{collective.GPU_PROBE}echo "=== tfcluster: {plan.name} ({plan.task}) attempt {attempt} on $(hostname)$gpu_note ===" >> {q(plan.log_path)}
{start}
echo $? > {q(exit_file + ".tmp")} && mv {q(exit_file + ".tmp")} {q(exit_file)}
"""


def _read_int(host: WorkerHost, path: str) -> int | None:
    raw = host.read_file(path)
    if raw is None:
        return None
    try:
        return int(raw.decode().strip())
    except ValueError:
        return None


@dataclass
class WorkerStatus:
    # One of STARTING, RUNNING, SUCCEEDED, FAILED, LOST.
    state: str
    # PID of the program on its host, once recorded.
    pid: int | None = None
    # Exit code from the wrapper; 128+N means killed by signal N.
    exit_code: int | None = None
    # Why the state is LOST, when known (e.g. the host stopped answering).
    detail: str | None = None

    def describe(self) -> str:
        if self.detail:
            return self.detail
        if self.state == FAILED and self.exit_code is not None and self.exit_code > 128:
            try:
                name = signal.Signals(self.exit_code - 128).name
            except ValueError:
                name = f"signal {self.exit_code - 128}"
            return f"was killed by {name} (exit {self.exit_code})"
        if self.state == FAILED:
            return f"exited with code {self.exit_code}"
        if self.state == LOST:
            return "disappeared without an exit code (killed with its wrapper, or its host rebooted)"
        return self.state


def worker_status(plan: WorkerPlan, attempt: int) -> WorkerStatus:
    """The worker's state from its status files; LOST (with the reason) if its host is unreachable."""
    try:
        return _worker_status(plan, attempt)
    except HostUnreachable as error:
        return WorkerStatus(LOST, detail=f"is unreachable: {error.detail}")


def _worker_status(plan: WorkerPlan, attempt: int) -> WorkerStatus:
    files = plan.host.job_status(plan.path(attempt, "pid"), plan.path(attempt, "pgid"),
                                 plan.path(attempt, "exit"))
    if files.exit_code is not None:
        return WorkerStatus(SUCCEEDED if files.exit_code == 0 else FAILED, files.pid, files.exit_code)
    if files.pid is None:
        if files.pgid is not None and not files.group_alive:
            return WorkerStatus(LOST)
        return WorkerStatus(STARTING)
    if files.pid_alive or files.group_alive:
        # A live group without the program: the wrapper is writing the exit code right now.
        return WorkerStatus(RUNNING, files.pid)
    # Both gone: the wrapper may have written the exit code since we looked.
    exit_code = _read_int(plan.host, plan.path(attempt, "exit"))
    if exit_code is not None:
        return WorkerStatus(SUCCEEDED if exit_code == 0 else FAILED, files.pid, exit_code)
    return WorkerStatus(LOST, files.pid)


def start_attempt(plans: list[WorkerPlan], attempt: int) -> None:
    """Write every wrapper first, then start them all, each step on all hosts at once."""
    def write(plan: WorkerPlan) -> None:
        if plan.container is not None:  # Owner-only: the environment may hold secrets.
            plan.host.write_file(plan.path(attempt, "env"), container.env_file(plan.env), 0o600)
        script = render_wrapper(plan, attempt, plan.workdir or plan.run_root).encode()
        plan.host.write_file(plan.path(attempt, "sh"), script, 0o700)

    def start(plan: WorkerPlan) -> None:
        plan.host.start_detached(plan.path(attempt, "sh"))

    for step in (write, start):
        with ThreadPoolExecutor(max_workers=min(32, len(plans))) as pool:
            list(pool.map(step, plans))  # list() re-raises the first error.


def stop_attempt(plans: list[WorkerPlan], attempt: int, grace_seconds: float) -> None:
    """SIGTERM every program, wait up to the grace, then SIGKILL every wrapper group,
    and return only when no process of the attempt is left."""
    ids = []
    for plan in plans:
        try:
            pid = _read_int(plan.host, plan.path(attempt, "pid"))
            pgid = _read_int(plan.host, plan.path(attempt, "pgid"))
            if pid is not None:
                plan.host.signal(pid, signal.SIGTERM)
            ids.append((plan, pid, pgid))
        except HostUnreachable:
            pass  # Nothing to do from here; its job dies with its peers (collectives abort).

    def running(plan, pid, pgid, group: bool) -> bool:
        try:
            return (group and pgid is not None and plan.host.alive(pgid, group=True)) or (
                pid is not None and plan.host.alive(pid))
        except HostUnreachable:
            return False

    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline and any(running(p, pid, g, False) for p, pid, g in ids):
        time.sleep(0.1)
    for plan, pid, pgid in ids:
        try:
            if pgid is not None:
                plan.host.signal(pgid, signal.SIGKILL, group=True)
            if pid is not None:
                plan.host.signal(pid, signal.SIGKILL)
        except HostUnreachable:
            pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(running(p, pid, g, True) for p, pid, g in ids):
        time.sleep(0.1)
    remove_containers([plan for plan in plans if plan.container is not None], attempt)


def remove_containers(plans: list[WorkerPlan], attempt: int) -> None:
    """`docker rm --force` each worker's container by name, also when its wrapper died before
    writing the PID; `docker rm` returns once the container is gone."""
    def remove(plan: WorkerPlan) -> None:
        try:
            plan.host.run_command(container.remove_argv([plan.container_name(attempt)]))
        except HostUnreachable:
            pass  # Its collectives abort with its peers; `down` checks the host again.

    if plans:
        with ThreadPoolExecutor(max_workers=min(32, len(plans))) as pool:
            list(pool.map(remove, plans))


class LogFollower:
    """Reads each worker's log incrementally and yields complete lines."""

    def __init__(self, plans: list[WorkerPlan], from_end: bool = False):
        """``from_end`` skips what the logs hold already (earlier attempts)."""
        self._plans = plans
        self._offsets = {plan.index: plan.host.file_size(plan.log_path) if from_end else 0
                         for plan in plans}
        self._partial = {plan.index: b"" for plan in plans}

    def poll(self, flush: bool = False) -> Iterator[tuple[WorkerPlan, str]]:
        for plan in self._plans:
            try:
                chunk = plan.host.read_file(plan.log_path, self._offsets[plan.index])
            except HostUnreachable:
                continue  # worker_status reports the host; the log resumes if it comes back.
            if chunk:
                self._offsets[plan.index] += len(chunk)
                self._partial[plan.index] += chunk
            *lines, rest = self._partial[plan.index].split(b"\n")
            self._partial[plan.index] = rest
            if flush and rest:
                lines.append(rest)
                self._partial[plan.index] = b""
            for line in lines:
                yield plan, line.decode(errors="replace").rstrip("\r")


@dataclass
class AttemptResult:
    # True when every worker exited 0.
    ok: bool
    # (plan, status) of the workers that failed, first failure first.
    failures: list[tuple[WorkerPlan, WorkerStatus]]
    # True when the user asked to stop (Ctrl-C) before the attempt ended.
    interrupted: bool = False
    # Set when the attempt made no progress for longer than the stall limit (workers still live).
    stall: stall.Stall | None = None


def follow_attempt(plans: list[WorkerPlan], attempt: int, follower: LogFollower,
                   on_line: Callable[[WorkerPlan, str], None],
                   on_event: Callable[[WorkerPlan, dict], None],
                   on_tick: Callable[[list[WorkerStatus]], None] | None = None,
                   should_stop: Callable[[], bool] = lambda: False,
                   watch: stall.StallWatch | None = None,
                   look: Callable[[], list[WorkerStatus]] | None = None) -> AttemptResult:
    """Stream logs until every worker finished, or one failed (returns at once: fail fast),
    or ``should_stop()`` turns true (checked every tick), or ``watch`` sees a stall. ``look()``: the
    workers' states (default: their status files; a cloud job's runner answers from the job)."""

    def drain(flush: bool = False) -> None:
        for plan, line in follower.poll(flush):
            event = events.parse(line)
            if event is not None:
                on_event(plan, event)
                if watch is not None:
                    watch.event(plan.index, event)
            else:
                on_line(plan, line)
                if watch is not None:
                    watch.line(plan.index, line)

    while True:
        if should_stop():
            drain(flush=True)
            return AttemptResult(ok=False, failures=[], interrupted=True)
        drain()
        statuses = look() if look is not None else [worker_status(plan, attempt) for plan in plans]
        if on_tick:
            on_tick(statuses)
        failures = [(plan, status) for plan, status in zip(plans, statuses)
                    if status.state in (FAILED, LOST)]
        if failures or all(status.state == SUCCEEDED for status in statuses):
            drain(flush=True)
            return AttemptResult(ok=not failures, failures=failures)
        # After fail-fast: a stopped worker (SIGSTOP, a lost VM) makes its peers fail, not stall.
        found = watch.check() if watch is not None else None
        if found is not None:
            return AttemptResult(ok=False, failures=[], stall=found)
        time.sleep(POLL_SECONDS)


def log_tail(plan: WorkerPlan, lines: int = 15) -> list[str]:
    try:
        raw = plan.host.read_file(plan.log_path) or b""
    except HostUnreachable as error:
        return [f"(log unavailable: {error})"]
    text = [line for line in raw.decode(errors="replace").splitlines() if events.PREFIX not in line]
    return text[-lines:]
