"""A stalled attempt as the console shows it: the worker that holds the others, every worker's stack
(dumped on SIGUSR1 into its log, tfcluster/stall.py), and the record run.json keeps."""

from __future__ import annotations

from tfcluster import stall, ui
from tfcluster.commands.common import console


# How each place reads beside a worker's stack (tfcluster/stall.py place).
WHERE = {stall.OWN_CODE: "is in its own code", stall.IN_TENSORFLOW: "waits inside TensorFlow (the collective, for its peers)",
         stall.IN_INPUT: "waits for its input data (tf.data)"}


def report(found: stall.Stall, plans, attempt: int) -> dict:
    """Have every worker dump its Python stacks into its log, name the worker that holds the others
    (``found.worker`` becomes it: tfcluster/stall.py holder), show each stack labelled by where it is,
    and return the record for run.json."""
    with console.status("Stalled: dumping every worker's Python stack into its log (SIGUSR1)..."):
        dumps = stall.request_dumps(plans, attempt)
    found.worker, why = stall.holder(found, dumps)
    hung = plans[found.worker]
    phase = "" if found.started else " before the first step (the start-up limit)"
    console.print(f"[bold red]⏸ Stalled{phase}: no worker made progress for {found.quiet_seconds:.0f} s "
                  f"(limit {found.limit_seconds:.0f} s). {hung.name} ({hung.task} on {hung.host.record.endpoint}) "
                  f"holds the others: {why}.[/]", soft_wrap=True)
    for plan in sorted(plans, key=lambda p: p.index != found.worker):
        dump = dumps.get(plan.index)
        if dump is None:
            console.print(ui.prefixed(plan.index, plan.name, "(no stack dump: its Python did not answer SIGUSR1)"),
                          soft_wrap=True)
            continue
        held = plan.index == found.worker
        where = WHERE[stall.place(dump)]
        if held and found.waits_for_input is not None:
            where = f"waits for its input data (step {found.waits_for_input})"
        console.print(ui.prefixed(plan.index, plan.name, f"main thread {where}, innermost first:"), soft_wrap=True)
        for frame in dump.main[: 6 if held else 3]:
            console.print(ui.prefixed(plan.index, plan.name, "  " + frame), soft_wrap=True)
        if held:
            console.print(ui.prefixed(plan.index, plan.name, f"blocking frame: {dump.blocking_frame}"),
                          style="bold", soft_wrap=True)
    console.print("[red]Stopping every worker (stalled)...[/]")
    return {"worker": hung.name, "attempt": attempt, "quiet_seconds": round(found.quiet_seconds, 1),
            "limit_seconds": round(found.limit_seconds, 1), "started": found.started,
            "waits_for_input": found.waits_for_input,
            "places": {plans[index].name: stall.place(dump) for index, dump in sorted(dumps.items()) if dump},
            "frame": dumps[found.worker].blocking_frame if dumps.get(found.worker) else None}
