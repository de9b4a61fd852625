"""Stopping VMs on a run's behalf: `train --then stop|down` (each VM's watchdog armed to halt it at
the run's end; all stopped at once by the launcher) and host maintenance (each VM asked whether it
is announced; the announced ones stopped, to be started away from it).

Calls the Compute API through ComputeApi and the VMs through their WorkerHost; the caller wraps
Google's errors (errors.translated).
"""

from __future__ import annotations

import json

from tfcluster.backends.group import in_parallel
from tfcluster.state import ClusterState

# The metadata key the VM watchdog reads for `train --then stop|down` (startup/tfcluster_watchdog/settings.py then_stop).
THEN_STOP_KEY = "tfcluster-then-stop"
# The metadata key the VM watchdog reads for the run's --stall-minutes (startup/tfcluster_watchdog/settings.py stall_minutes).
STALL_KEY = "tfcluster-stall-minutes"
# The metadata key the VM watchdog reads for the run's budget end time (startup/tfcluster_watchdog/settings.py budget_end).
BUDGET_END_KEY = "tfcluster-budget-end"
# What a VM's metadata server says of host maintenance ahead of it ("NONE" when nothing is announced).
MAINTENANCE_EVENT_URL = "http://metadata.google.internal/computeMetadata/v1/instance/maintenance-event"


def arm_then_stop(api, cluster: ClusterState, run_id: str, last_attempt: int) -> None:
    """Each VM's watchdog reads tfcluster-then-stop on its next poll (setMetadata works on a running
    VM) and halts the VM once the run's end is recorded in its folder there."""
    in_parallel(cluster.hosts, lambda record: api.set_metadata(cluster.zone, record.instance, {
        THEN_STOP_KEY: json.dumps({"run": run_id, "folder": f"{record.remote_root}/runs/{run_id}",
                                   "last_attempt": last_attempt}, sort_keys=True)}),
                lambda record: record.name, "arming --then")


def set_stall_minutes(api, cluster: ClusterState, stall_minutes: float | None) -> None:
    """The run's --stall-minutes for each VM's watchdog (STALL_KEY; "" keeps its default rule).
    Written at every run, so one run's limit never outlives it."""
    _set_on_every_vm(api, cluster, STALL_KEY, "" if stall_minutes is None else f"{stall_minutes:g}",
                     "setting the stall limit")


def set_budget_end(api, cluster: ClusterState, end: float | None) -> None:
    """`train --budget`: the Unix time each VM's watchdog halts its VM (BUDGET_END_KEY; "" for none).
    Written at every run, and cleared when the launcher ends it, so one run's end never outlives it."""
    _set_on_every_vm(api, cluster, BUDGET_END_KEY, "" if end is None else f"{end:.0f}", "setting the budget end time")


def _set_on_every_vm(api, cluster: ClusterState, key: str, value: str, doing: str) -> None:
    """One metadata value on every VM at once (setMetadata works on running VMs); one error names every VM that failed."""
    in_parallel(cluster.hosts, lambda record: api.set_metadata(cluster.zone, record.instance, {key: value}),
                lambda record: record.name, doing)


def stop_all(api, cluster: ClusterState) -> list[str]:
    """Clear tfcluster-then-stop (a VM started later must not halt for this run), then stop every
    running VM; returns the names stopped, once each is TERMINATED."""
    running = [record for record in cluster.hosts
               if (vm := api.instance_or_none(cluster.zone, record.instance)) is not None and vm.status == "RUNNING"]

    def stop(record) -> None:
        api.set_metadata(cluster.zone, record.instance, {THEN_STOP_KEY: ""})
        api.stop(cluster.zone, record.instance)

    in_parallel(running, stop, lambda record: record.name, "stopping the VMs")
    return [record.instance for record in running]


def maintenance_notices(hosts) -> dict[int, str]:
    """Each VM's own metadata server, asked over SSH: instance/maintenance-event reads
    TERMINATE_ON_HOST_MAINTENANCE from the notice (60 minutes ahead on GPU VMs) until the VM is
    terminated (https://cloud.google.com/compute/docs/metadata/getting-live-migration-notice).
    A VM that cannot be asked counts as announcing nothing: the failure is then reported as it is."""
    def ask(host) -> str | None:
        try:
            asked = host.run_command(["curl", "-fsS", "-m", "5", "-H", "Metadata-Flavor: Google",
                                      MAINTENANCE_EVENT_URL], timeout=20)
        except Exception:  # noqa: BLE001 - unreachable or refused: no notice known
            return None
        event = asked.stdout.strip()
        return event if asked.code == 0 and event.startswith("TERMINATE") else None

    events = in_parallel(list(hosts), ask, lambda host: host.record.name, "asking for maintenance notices")
    return {index: event for index, event in enumerate(events) if event}


def stop_some(api, cluster: ClusterState, workers: list[int]) -> None:
    """Stop the workers' VMs. Started again, Compute places them on a host away from the announced
    maintenance (onHostMaintenance TERMINATE "terminate[s] and (optionally) restart[s] the instance
    away from the maintenance activity", Scheduling reference); done now, an attempt is not cut by
    the termination up to an hour later."""
    for index in workers:
        api.stop(cluster.zone, cluster.hosts[index].instance)
