"""A stalled attempt as the console shows it: the worker that holds the others, every worker's stack
(dumped on SIGUSR1 into its log, tfcluster/stall.py), and the record run.json keeps."""

from __future__ import annotations

from tfcluster import stall, ui
from tfcluster.commands.common import console


def report(found: stall.Stall, plans, attempt: int) -> dict:
    """Name the worker behind, have every worker dump its Python stacks into its log, and show where
    the one behind blocks and where the others wait; the record for run.json."""
    hung = plans[found.worker]
    phase = "" if found.started else " before the first step (the start-up limit)"
    why = (f"its step {found.waits_for_input} waits for its input data (a read that does not return?)"
           if found.waits_for_input is not None else "its last progress is the oldest"
           + (f" (step {found.steps[found.worker]})" if found.steps.get(found.worker, -1) >= 0 else ""))
    console.print(f"[bold red]⏸ Stalled{phase}: no worker made progress for {found.quiet_seconds:.0f} s "
                  f"(limit {found.limit_seconds:.0f} s). {hung.name} ({hung.task} on {hung.host.record.endpoint}) "
                  f"is the one behind: {why}.[/]", soft_wrap=True)
    with console.status("Dumping every worker's Python stack into its log (SIGUSR1)..."):
        dumps = stall.request_dumps(plans, attempt)
    for plan in sorted(plans, key=lambda p: p.index != found.worker):
        dump = dumps.get(plan.index)
        if dump is None:
            console.print(ui.prefixed(plan.index, plan.name, "(no stack dump: its Python did not answer SIGUSR1)"),
                          soft_wrap=True)
            continue
        where = "blocks here" if plan.index == found.worker else "waits here (inside the collective, for its peers)"
        console.print(ui.prefixed(plan.index, plan.name, f"main thread {where}, innermost first:"), soft_wrap=True)
        for frame in dump.main[: 6 if plan.index == found.worker else 3]:
            console.print(ui.prefixed(plan.index, plan.name, "  " + frame), soft_wrap=True)
        if plan.index == found.worker:
            console.print(ui.prefixed(plan.index, plan.name, f"blocking frame: {dump.blocking_frame}"),
                          style="bold", soft_wrap=True)
    console.print("[red]Stopping every worker (stalled)...[/]")
    return {"worker": hung.name, "attempt": attempt, "quiet_seconds": round(found.quiet_seconds, 1),
            "limit_seconds": round(found.limit_seconds, 1), "started": found.started,
            "waits_for_input": found.waits_for_input,
            "frame": dumps[found.worker].blocking_frame if dumps.get(found.worker) else None}
