"""`train --budget`'s projection (tfcluster/commands/budget.py RunBudget), fed the chief's events as
the launcher feeds them: over the budget after 20 steps, a run with step backups stops right after its
next backup; one without stops at once, its last backup kept. The end-to-end refusal is in
tests/test_gcp_backend.py (test_idle_control_status_and_restart_of_stopped_vms)."""

from __future__ import annotations

import re

from tfcluster.commands.budget import RunBudget


def progress(step: int) -> dict:
    return {"event": "progress", "step": step, "total": 300, "time": 1000.0 + step}  # One second a step.


def backup(step: int) -> dict:
    return {"event": "backup", "epoch": 1, "batch": step - 1}


def over_budget() -> RunBudget:
    # $3.60/h is $0.001 a second: 300 steps of a second cost $0.30, over the $0.10 budget.
    return RunBudget("r-1", usd=0.10, rate=3.60, started=1000.0)


def test_a_run_with_step_backups_stops_right_after_its_next_backup():
    budget = over_budget()
    for step in range(1, 22):
        budget.observe(progress(step), now=1000.0 + step)
        if step % 5 == 0:
            budget.observe(backup(step), now=1000.0 + step)
    # Projected at step 21: over, but the run goes on to its next backup.
    assert budget.checked and budget.refusal is None and "after its next backup" in budget.waiting
    for step in range(22, 25):
        budget.observe(progress(step), now=1000.0 + step)
    assert budget.refusal is None
    budget.observe(backup(25), now=1025.0)
    assert budget.refusal.startswith("run r-1 projected at $0.30 at step 21 ") and budget.waiting is None
    assert "the run is stopped after its next backup: `invoke train --resume r-1` continues it" in budget.refusal


def test_a_run_without_step_backups_stops_at_once_keeping_its_last():
    budget = over_budget()
    for step in range(1, 22):
        budget.observe(progress(step), now=1000.0 + step)
    assert budget.waiting is None
    assert "the run is stopped and its last backup kept" in budget.refusal
    # 21 steps done, $0.079 left buys 79 more at a second each (floored: one less when the float falls short).
    assert re.search(r"the largest run that fits is (99|100) steps;", budget.refusal), budget.refusal
