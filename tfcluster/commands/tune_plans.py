"""A search's processes and its trials: shared by `tune` and by status, logs and stop.

Processes: tuner I (``KERASTUNER_TUNER_ID=tunerI``) on worker I, with worker I's log, and
the oracle (``chief``) beside tuner 0 on the chief's machine, with its own log ``oracle.log``.
Trials: read from the oracle's events (trainer/tune_hooks.py), the one place that sees them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tfcluster import launch
from tfcluster.backends import WorkerHost
from tfcluster.errors import HostUnreachable
from tfcluster.state import RunRecord
from trainer import events

ORACLE = "oracle"


def tuner_id(index: int) -> str:
    return f"tuner{index}"


def build_tune_plans(hosts: list[WorkerHost], run_id: str, argv: list[str], env: dict[str, str],
                     oracle_port: int, tune_dir: str) -> list[launch.WorkerPlan]:
    """One tuner per host (index = worker index), then the oracle on hosts[0] (last index).

    No TF_CONFIG: each trial trains on one machine. ``{run_root}`` in argv, env and
    ``tune_dir`` becomes each host's run folder.
    """
    oracle_env = {"KERASTUNER_ORACLE_IP": hosts[0].record.address, "KERASTUNER_ORACLE_PORT": str(oracle_port)}
    plans = []
    for index, host in enumerate([*hosts, hosts[0]]):
        is_oracle = index == len(hosts)
        run_root = host.run_root(run_id)
        own_dir = tune_dir.replace("{run_root}", run_root)
        process_env = {
            **{key: value.replace("{run_root}", run_root) for key, value in env.items()},
            **oracle_env,
            "KERASTUNER_TUNER_ID": "chief" if is_oracle else tuner_id(index),
            "TFCLUSTER_TUNE_DIR": own_dir,
            "TFCLUSTER_RUN_ID": run_id,
            "TFCLUSTER_WORKER_INDEX": "0" if is_oracle else str(index),
            "PYTHONUNBUFFERED": "1",
        }
        if is_oracle:
            process_env["CUDA_VISIBLE_DEVICES"] = ""  # The oracle only serves: CPU only, no GPU memory.
        plans.append(launch.WorkerPlan(
            index=index, host=host, tf_config="", argv=[arg.replace("{run_root}", run_root) for arg in argv],
            env=process_env, run_root=run_root, label=ORACLE if is_oracle else "",
            role="oracle" if is_oracle else tuner_id(index),
            workdir="" if "://" in own_dir else own_dir))
    return plans


def oracle_plan(plans: list[launch.WorkerPlan]) -> launch.WorkerPlan:
    return next(plan for plan in plans if plan.label == ORACLE)


def attempt_of(run: RunRecord, plan: launch.WorkerPlan) -> int:
    return run.attempt_of.get(plan.name, max(run.attempts, 1))


@dataclass
class Trial:
    # Keras Tuner's trial id, e.g. "03".
    trial_id: str
    # Tuner that ran it last ("tuner1").
    tuner: str
    # RUNNING, COMPLETED, INVALID (to be retried), FAILED.
    status: str
    # Objective value (None until completed).
    score: float | None
    # Hyperparameter name -> value.
    hyperparameters: dict
    # Last line of Keras Tuner's error message for a failed trial.
    message: str = ""
    # Times a tuner started it (a restarted tuner gets its unfinished trial again).
    starts: int = 0


@dataclass
class TrialBook:
    """Every trial the oracle reported, and the search's settings."""

    trials: dict[str, Trial] = field(default_factory=dict)
    objective: str = "objective"
    direction: str = "max"
    max_trials: int | None = None
    # Folder (on the chief's machine) of Keras Tuner's project: oracle.json, trial_*.
    project_dir: str = ""
    # Set when a process reported a mistake that a retry cannot fix.
    error: str = ""

    def update(self, event: dict) -> Trial | None:
        """Record one event; returns the trial when it just ended."""
        kind = event.get("event")
        if kind == "tune_error":
            self.error = self.error or event.get("message", "")
        elif kind == "oracle_ready":
            self.objective = event.get("objective", self.objective)
            self.direction = event.get("direction", self.direction)
            self.max_trials = event.get("max_trials")
            self.project_dir = event.get("project_dir", "")
            ongoing = {trial_id: tuner for tuner, trial_id in (event.get("ongoing") or {}).items()}
            for known in event.get("known", []):
                self._record(known, ongoing.get(known["trial_id"], ""))
        elif kind in ("trial_start", "trial_end"):
            trial = self._record(event, event.get("tuner_id") or "")
            if kind == "trial_start":
                trial.starts += 1
                trial.status = "RUNNING"
            else:
                return trial
        return None

    def _record(self, fields: dict, tuner: str) -> Trial:
        trial = self.trials.get(fields["trial_id"]) or Trial(fields["trial_id"], tuner, "RUNNING", None, {})
        trial.tuner = tuner or trial.tuner
        trial.status = fields.get("status", trial.status)
        trial.score = fields.get("score")
        trial.hyperparameters = fields.get("hyperparameters") or trial.hyperparameters
        trial.message = fields.get("message", "")
        self.trials[trial.trial_id] = trial
        return trial

    def counts(self) -> tuple[int, int, int | None]:
        """(done, running, left); left is None without max_trials."""
        done = sum(t.status in ("COMPLETED", "FAILED") for t in self.trials.values())
        running = sum(t.status in ("RUNNING", "INVALID") for t in self.trials.values())
        left = None if not self.max_trials else max(0, self.max_trials - len(self.trials))
        return done, running, left

    def ranked(self) -> list[Trial]:
        """Completed trials best first, then the rest by id."""
        completed = sorted((t for t in self.trials.values() if t.status == "COMPLETED" and t.score is not None),
                           key=lambda t: t.score, reverse=self.direction == "max")
        rest = sorted((t for t in self.trials.values() if t not in completed), key=lambda t: t.trial_id)
        return completed + rest

    def best(self) -> Trial | None:
        ranked = self.ranked()
        return ranked[0] if ranked and ranked[0].status == "COMPLETED" else None

    def progress(self) -> str:
        done, running, left = self.counts()
        text = f"{done} done, {running} running, {'?' if left is None else left} left"
        best = self.best()
        if best is not None:
            text += f"; best {self.objective} {best.score:.4f} (trial {best.trial_id})"
        return text


def read_book(plans: list[launch.WorkerPlan]) -> TrialBook:
    """The trials so far, from the oracle's whole log (works from any shell, launcher or not)."""
    book = TrialBook()
    plan = oracle_plan(plans)
    try:
        raw = plan.host.read_file(plan.log_path) or b""
    except HostUnreachable:
        return book
    for line in raw.decode(errors="replace").splitlines():
        event = events.parse(line)
        if event is not None:
            book.update(event)
    return book
