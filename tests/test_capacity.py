"""Capacity (issue 40): the world's Flex-start requests, reservations and run-duration ends
(tests/world/capacity.py), met with the real google-cloud-compute client; then the product's
provisioning models, the capacity ladder and reservations (tfcluster/backends/gcp/zones/capacity.py,
reservations.py, tfcluster/provisioning.py)."""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, wait_for
from tests.world import facts
from tests.world.capacity import Reservation, end_run

ZONE = "us-central1-a"
IMAGE = "projects/deeplearning-platform-release/global/images/common-cu129-ubuntu-2204-nvidia-580-v20261115"


def _client():
    from google.cloud import compute_v1

    from tfcluster.backends.gcp.cloud.compute import default_credentials

    return compute_v1, compute_v1.InstancesClient(transport="rest", credentials=default_credentials())


def _body(name: str, machine: str = "a3-highgpu-1g", model: str = "FLEX_START", wait: int = 0, **extra) -> dict:
    """An insert body as a client would send it (the provider's shape, tests/world/provider/instance_body.py)."""
    body = {"name": name, "machineType": f"projects/demo-project/zones/{ZONE}/machineTypes/{machine}",
            "disks": [{"boot": True, "autoDelete": True, "initializeParams": {
                "sourceImage": IMAGE, "diskSizeGb": "100",
                "diskType": f"projects/demo-project/zones/{ZONE}/diskTypes/pd-balanced"}}],
            "networkInterfaces": [{"nicType": "GVNIC"} if machine.startswith("a3-") else {}],
            "scheduling": {"provisioningModel": model, "onHostMaintenance": "TERMINATE", "automaticRestart": False,
                           "instanceTerminationAction": "DELETE", "maxRunDuration": {"seconds": "3600"}},
            **extra}
    if wait:
        body["params"] = {"requestValidForDuration": {"seconds": str(wait)}}
    return body


def _insert(body: dict):
    """instances.insert through the real client: its operation (an ExtendedOperation)."""
    compute_v1, instances = _client()
    return instances.insert(project="demo-project", zone=ZONE,
                            instance_resource=compute_v1.Instance.from_json(json.dumps(body)))


def _grant_h100_quota(state) -> None:
    state.accelerators[ZONE] = ["nvidia-h100-80gb", "nvidia-tesla-t4"]
    state.region_quotas["us-central1"] = {"PREEMPTIBLE_NVIDIA_H100_GPUS": (8.0, 0.0), "NVIDIA_T4_GPUS": (8.0, 0.0),
                                          "NVIDIA_A100_GPUS": (8.0, 0.0), "A2_CPUS": (96.0, 0.0), "CPUS": (96.0, 0.0)}
    state.project_quotas["CPUS_ALL_REGIONS"] = (512.0, 0.0)
    state.project_quotas["GPUS_ALL_REGIONS"] = (16.0, 0.0)
    state.family_quotas["CPUS-PER-VM-FAMILY-per-project-region"] = [({"vm_family": "A3"}, 416)]
    state.family_quotas["GPUS-PER-GPU-FAMILY-per-project-region"] = [({"gpu_family": "NVIDIA_H100"}, 8)]


def test_the_world_holds_a_flex_start_request_pending_then_grants_or_expires_it(world):
    state = world.compute.state
    _grant_h100_quota(state)
    compute_v1, instances = _client()
    # Refused at the call: an N1 (not accelerator-optimized), a run duration under 10 minutes.
    from google.api_core import exceptions

    with pytest.raises(exceptions.BadRequest, match="Machine type n1-standard-8 does not support the Flex-start"):
        _insert(_body("n1", machine="n1-standard-8"))
    short = _body("short")
    short["scheduling"]["maxRunDuration"] = {"seconds": "300"}
    with pytest.raises(exceptions.BadRequest, match="need a run duration between 10 minutes and 7 days"):
        _insert(short)

    # Capacity comes in 1.5 s; a request that may wait 90 s is PENDING until then, its operation running.
    state.capacity.flex_from[ZONE] = time.monotonic() + 1.5
    operation = _insert(_body("waits", wait=90))
    vm = instances.get(project="demo-project", zone=ZONE, instance="waits")
    assert vm.status == "PENDING" and vm.scheduling.provisioning_model == "FLEX_START"
    assert not operation.done()
    operation.result(timeout=20)
    assert instances.get(project="demo-project", zone=ZONE, instance="waits").status == "RUNNING"

    # No wait time: only capacity that is there now; none is, so the insert fails and nothing is made.
    state.capacity.room[(ZONE, "FLEX_START")] = 0
    operation = _insert(_body("now"))
    with pytest.raises(exceptions.GoogleAPICallError, match="does not have enough resources available"):
        operation.result(timeout=20)
    assert "now" not in state.instances

    # A waiting request whose wait ends without capacity fails, and Compute deletes the VM.
    operation = _insert(_body("expires", wait=7200))
    assert state.instances["expires"]["status"] == "PENDING"
    name, (op, _) = "expires", state.capacity.pending["expires"]
    state.capacity.pending[name] = (op, time.monotonic())  # Two hours pass.
    with pytest.raises(exceptions.GoogleAPICallError, match="does not have enough resources available"):
        operation.result(timeout=20)
    assert "expires" not in state.instances

    # The user deletes a waiting request: it ends, and nothing is left.
    operation = _insert(_body("cancelled", wait=600))
    instances.delete(project="demo-project", zone=ZONE, instance="cancelled").result(timeout=20)
    with pytest.raises(exceptions.GoogleAPICallError):
        operation.result(timeout=20)
    assert "cancelled" not in state.instances

    # Flex-start VMs take the preemptible quota: with none left, the insert is refused as over quota.
    state.region_quotas["us-central1"]["PREEMPTIBLE_NVIDIA_H100_GPUS"] = (1.0, 1.0)
    with pytest.raises(exceptions.Forbidden, match="Quota 'PREEMPTIBLE_NVIDIA_H100_GPUS' exceeded"):
        _insert(_body("no-quota"))


def test_the_world_consumes_reservations_by_its_matching_rule(world):
    from google.api_core import exceptions

    state = world.compute.state
    _grant_h100_quota(state)
    compute_v1, instances = _client()
    reservations = compute_v1.ReservationsClient(transport="rest", credentials=instances._transport._credentials)
    state.capacity.reservations = {
        (ZONE, "a100-named"): Reservation("a100-named", ZONE, "a2-highgpu-2g", 1, specific_required=True),
        (ZONE, "t4-open"): Reservation("t4-open", ZONE, "n1-standard-8", 2, (("nvidia-tesla-t4", 1),)),
        (ZONE, "t4-named"): Reservation("t4-named", ZONE, "n1-standard-8", 1, (("nvidia-tesla-t4", 1),),
                                        specific_required=True)}
    # reservations.get / list / aggregatedList, as the client reads them.
    got = reservations.get(project="demo-project", zone=ZONE, reservation="t4-open")
    assert (got.specific_reservation.count, got.specific_reservation.in_use_count) == (2, 0)
    assert got.specific_reservation.instance_properties.guest_accelerators[0].accelerator_type == "nvidia-tesla-t4"
    assert sorted(r.name for r in reservations.list(project="demo-project", zone=ZONE)) == [
        "a100-named", "t4-named", "t4-open"]
    assert {zone: len(scoped.reservations) for zone, scoped in reservations.aggregated_list(
        request=compute_v1.AggregatedListReservationsRequest(project="demo-project"))} == {f"zones/{ZONE}": 3}
    with pytest.raises(exceptions.NotFound):
        reservations.get(project="demo-project", zone=ZONE, reservation="nope")

    t4 = {"guestAccelerators": [{"acceleratorType": f"projects/demo-project/zones/{ZONE}/acceleratorTypes/"
                                                    "nvidia-tesla-t4", "acceleratorCount": 1}]}
    standard = {"provisioningModel": "STANDARD", "onHostMaintenance": "TERMINATE"}
    # ANY_RESERVATION (no affinity sent) takes the open one; a Spot VM never does.
    operation = _insert(_body("any-0", machine="n1-standard-8", model="STANDARD", **t4, scheduling=standard))
    operation.result(timeout=20)
    consumed = instances.get(project="demo-project", zone=ZONE, instance="any-0").resource_status
    assert consumed.reservation_consumption_info.consumed_reservation.endswith("/reservations/t4-open")
    operation = _insert(_body("spot-0", machine="n1-standard-8", model="SPOT", **t4))
    operation.result(timeout=20)
    assert "reservation" not in state.instances["spot-0"]
    # By name: the named reservation, when it matches and has room.
    named = {"consumeReservationType": "SPECIFIC_RESERVATION", "key": "compute.googleapis.com/reservation-name",
             "values": ["t4-named"]}
    operation = _insert(_body("named-0", machine="n1-standard-8", model="STANDARD", reservationAffinity=named,
                                 scheduling=standard, **t4))
    operation.result(timeout=20)
    assert state.instances["named-0"]["reservation"] == (ZONE, "t4-named")
    assert reservations.get(project="demo-project", zone=ZONE, reservation="t4-named").specific_reservation \
        .in_use_count == 1
    # Refused by name: full, a mismatch, one consumed automatically, one that is not there, a Spot VM.
    for name, reservation, machine, extra, model, words in [
        ("full", "t4-named", "n1-standard-8", t4, "STANDARD", "has no available resources: 1 of 1 in use"),
        ("mismatch", "a100-named", "a2-highgpu-1g", {}, "STANDARD", "it holds a2-highgpu-2g, not a2-highgpu-1g"),
        ("open", "t4-open", "n1-standard-8", t4, "STANDARD", "can not be targeted as specificReservationRequired is "
                                                             "not set"),
        ("missing", "nope", "n1-standard-8", t4, "STANDARD", "Could not find the given reservation"),
        ("spot", "t4-named", "n1-standard-8", t4, "SPOT", "must use ReservationAffinity of NO_RESERVATION")]:
        affinity = dict(named, values=[reservation])
        with pytest.raises(exceptions.BadRequest, match=words):
            _insert(_body(name, machine=machine, model=model, reservationAffinity=affinity,
                          scheduling=dict(standard, provisioningModel=model), **extra))
    # A stopped VM gives its place back; a deleted one too.
    instances.stop(project="demo-project", zone=ZONE, instance="named-0").result(timeout=20)
    assert state.capacity.reservations[(ZONE, "t4-named")].in_use == set()
    instances.delete(project="demo-project", zone=ZONE, instance="any-0").result(timeout=20)
    assert state.capacity.reservations[(ZONE, "t4-open")].in_use == set()


def test_the_world_ends_a_run_duration_by_its_termination_action(world):
    state = world.compute.state
    _grant_h100_quota(state)
    for name, action in (("stops", "STOP"), ("goes", "DELETE")):
        body = _body(name, model="SPOT")
        body["scheduling"]["instanceTerminationAction"] = action
        operation = _insert(body)
        operation.result(timeout=20)
    end_run(state, "stops")
    assert state.instances["stops"]["status"] == "TERMINATED"
    end_run(state, "goes")
    assert "goes" not in state.instances
    # The world's clock does it too when asked to, once started + maxRunDuration has passed.
    state.capacity.end_runs = True
    operation = _insert(_body("clock", model="SPOT"))
    operation.result(timeout=20)
    state.instances["clock"]["max_run_seconds"] = 1
    instances = _client()[1]
    wait_for(lambda: "clock" not in [vm.name for vm in instances.list(project="demo-project", zone=ZONE)], 10,
             what="the run duration's end")


# ---------------------------------------------------------------- the product, in the gcp world

from tests.test_gcp_backend import fake_compute, gcp_cli, needs_hosts  # noqa: E402,F401

WEST = "us-west1-b"  # gcp_cli's zone.


def _a100_world(state) -> None:
    """A project with A100 quota (on-demand and Spot) in us-west1, for 2 x a2-highgpu-1g."""
    state.accelerators[WEST] = ["nvidia-tesla-a100"]
    state.region_quotas["us-west1"].update({"NVIDIA_A100_GPUS": (4.0, 0.0), "PREEMPTIBLE_NVIDIA_A100_GPUS": (4.0, 0.0),
                                            "A2_CPUS": (48.0, 0.0)})
    state.project_quotas.update({"CPUS_ALL_REGIONS": (96.0, 0.0), "GPUS_ALL_REGIONS": (16.0, 0.0)})


def _in_process(cli, monkeypatch, said: list, **values):
    """The gcp backend in this process, on ``cli``'s state folder and terraform (what a launcher does)."""
    from tfcluster import config
    from tfcluster.backends import get_backend
    from tfcluster.state import StateStore

    import shlex

    # terraform as the CLI runs it: in the world's names (its own /etc/hosts), through TFCLUSTER_TERRAFORM.
    wrapper = cli.state_dir.parent / "terraform-in-world"
    wrapper.write_text(f"#!/bin/sh\nexec {shlex.join(cli.prefix)} {shlex.quote(cli.env['TFCLUSTER_TERRAFORM'])} "
                       '"$@"\n')
    wrapper.chmod(0o755)
    for key in ("TF_CLI_CONFIG_FILE", "CHECKPOINT_DISABLE"):
        monkeypatch.setenv(key, cli.env[key])
    monkeypatch.setenv("TFCLUSTER_TERRAFORM", str(wrapper))
    settings = config.load({"backend": "gcp", "project": "demo-project", "state_dir": str(cli.state_dir),
                            "workers": 2, "ready_timeout_seconds": 20, **values}, zone=WEST)
    store = StateStore(settings)
    return settings, store, get_backend("gcp", store, announce=said.append)


@needs_hosts
def test_a_reservation_by_name_and_a_spot_cluster_back_on_it_when_spot_stays_full(gcp_cli, monkeypatch):
    """`check` judges a named reservation (a mismatch is a ✗); `up --capacity auto --spot` skips a reservation
    without room for every VM and lands on Spot; preempted while Spot stays full, the cluster comes back by
    the rest of the ladder: the reservation, now with room, consumed by name; `status` says so per VM."""
    from tests.fake_operations import preempt_instance

    state = gcp_cli.compute.state
    _a100_world(state)
    state.capacity.reservations = {
        (WEST, "a100-wrong"): Reservation("a100-wrong", WEST, "a2-highgpu-2g", 2, specific_required=True),
        (WEST, "a100-right"): Reservation("a100-right", WEST, "a2-highgpu-1g", 1, specific_required=True)}
    checked = gcp_cli.run("check", "--gpu", "a100", "--reservation", "a100-wrong", timeout=120)
    assert checked.returncode != 0
    assert ("✗ reservation a100-wrong: it holds a2-highgpu-2g, the cluster's VMs are a2-highgpu-1g: a VM consumes "
            "only a reservation it matches exactly") in checked.stdout, checked.stdout + checked.stderr
    state.capacity.room[(WEST, "SPOT")] = 2
    # Where Compute puts them (tests/world/placement.py): default-1 on the first sub-block, default-0 on the second.
    state.placement_slots = {"default-0": ("b1", "s2", "h9"), "default-1": ("b1", "s1", "h3")}

    up = gcp_cli.run("up", "--gpu", "a100", "--capacity", "auto", "--spot", timeout=240)
    assert up.returncode == 0, up.stdout + up.stderr
    # A2 on Spot, 2 VMs: a compact placement policy, and TF_CONFIG in the order of the hosts Compute reports.
    assert "placement: compact (COLLOCATED), 2 A2 VMs placed close together" in up.stdout, up.stdout
    policy = state.resources["resourcePolicies"]["default-placement"]
    assert policy["groupPlacementPolicy"] == {"collocation": "COLLOCATED"}
    assert all(vm["body"]["resourcePolicies"][0].endswith("/regions/us-west1/resourcePolicies/default-placement")
               for vm in state.instances.values())
    assert [host["instance"] for host in gcp_cli.cluster()["hosts"]] == ["default-1", "default-0"]
    placed = gcp_cli.run("status", timeout=120)
    assert "placement: 2 VMs on 1 block, 2 sub-blocks" in placed.stdout, placed.stdout + placed.stderr
    assert ("plan: 2 x a2-highgpu-1g + 1 x nvidia-tesla-a100 (capacity auto, per zone: a matching reservation, then "
            "Spot, then on-demand, then Flex-start (waiting up to 30 min)) in us-west1-b") in up.stdout
    steps = [line[2:] for line in up.stdout.splitlines() if line.startswith("! zone ")]
    assert steps == ["zone us-west1-b, reservation: no matching reservation with room (a100-right has 1 of 1 free, "
                     "the cluster needs 2); skipped",
                     "zone us-west1-b, Spot: the cluster's VMs are created here"], up.stdout
    assert {vm["body"]["scheduling"]["provisioningModel"] for vm in state.instances.values()} == {"SPOT"}

    # Preempted; Spot stays full; the reservation has room for both now.
    preempt_instance(state, "default-1")
    state.capacity.room[(WEST, "SPOT")] = 0
    state.capacity.reservations[(WEST, "a100-right")].count = 2
    said: list = []
    settings, store, backend = _in_process(gcp_cli, monkeypatch, said, gpu="a100", capacity="auto", spot=True,
                                           capacity_wait_seconds=1, capacity_tries=2)
    cluster = store.load_cluster()
    backend.restart_preempted(cluster, settings)
    store.save_cluster(cluster)
    assert said[-2:] == [
        "zone us-west1-b, reservation a100-right (2 of 2 free): the cluster's VMs are created here",
        "back: the cluster's 2 VM(s) run on-demand on reservation a100-right in us-west1-b now (new addresses and "
        "host keys)"], said
    assert any(line.startswith("zone us-west1-b: Spot stays full for default-1 after 2 starts") for line in said)
    assert {name: (vm["body"]["scheduling"]["provisioningModel"], vm.get("reservation"))
            for name, vm in state.instances.items()} == {
        "default-0": ("STANDARD", (WEST, "a100-right")), "default-1": ("STANDARD", (WEST, "a100-right"))}
    assert state.instances["default-0"]["body"]["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION", "key": "compute.googleapis.com/reservation-name",
        "values": ["a100-right"]}

    # On the reservation by name, the VMs take its placement: the cluster's policy is gone with their move.
    assert not state.resources.get("resourcePolicies") and not any(
        vm["body"].get("resourcePolicies") for vm in state.instances.values())
    status = gcp_cli.run("status", timeout=120)
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout.count("on-demand, reservation a100-right") == 2, status.stdout
    assert "default-0, default-1 run on a reservation: no cost beyond it" in status.stdout


def _h100_world(state) -> None:
    """A project with preemptible H100 quota (what Flex-start VMs take) in us-west1, for 2 x a3-highgpu-1g."""
    state.accelerators[WEST] = ["nvidia-h100-80gb"]
    state.region_quotas["us-west1"].update({"PREEMPTIBLE_NVIDIA_H100_GPUS": (8.0, 0.0)})
    state.project_quotas.update({"CPUS_ALL_REGIONS": (512.0, 0.0), "GPUS_ALL_REGIONS": (16.0, 0.0)})
    state.family_quotas["CPUS-PER-VM-FAMILY-per-project-region"] = [({"vm_family": "A3"}, 416)]


def _steps(output: str) -> list[str]:
    return [line[2:] for line in output.splitlines() if line.startswith(("! zone ", "! waiting"))]


@needs_hosts
def test_flex_start_h100s_whole_or_not_at_all_pending_cancelled_and_made_after_a_wait(gcp_cli):
    """Two Flex-start H100 VMs (a3-highgpu-1g: Spot or Flex-start only): when capacity comes for one only and
    the wait ends, neither is left, the one made is in the cost ledger, and `up` exits 2 with one line; a
    waiting `up` shows in `status` as a pending cluster and Ctrl-C ends it between two tries; then capacity
    comes while `up` waits, and the cluster is made."""
    from tfcluster.ledger import Ledger

    state = gcp_cli.compute.state
    _h100_world(state)
    gcp_cli.env.update({"INVOKE_TFCLUSTER_GPU": "h100", "INVOKE_TFCLUSTER_PROVISIONING": "flex-start",
                        "INVOKE_TFCLUSTER_CAPACITY_WAIT_SECONDS": "2"})
    state.capacity.room[(WEST, "FLEX_START")] = 1
    failed = gcp_cli.run("up", "--capacity-wait", "0.05", timeout=240)
    assert failed.returncode == 2, failed.stdout + failed.stderr
    assert failed.stderr.strip().splitlines() == [
        "error: no Flex-start capacity for 2 x a3-highgpu-1g in us-west1-b within --capacity-wait 0.05 min; no VM is "
        "left (the minutes of those made and removed are in `invoke costs`). Run `invoke up` again later, raise "
        "--capacity-wait, add zones, or allow other provisioning (--capacity auto, --spot); `invoke down` removes "
        "the bucket and network"], failed.stderr
    assert "plan: 2 x a3-highgpu-1g + 1 x nvidia-h100-80gb (Flex-start, waiting up to 0.05 min) in us-west1-b" \
        in failed.stdout
    steps = _steps(failed.stdout)
    assert steps[0] == ("zone us-west1-b, Flex-start: no capacity (ZONE_RESOURCE_POOL_EXHAUSTED); removed the 1 "
                        "VM(s) made there"), failed.stdout
    assert steps[1] == ("waiting for Flex-start capacity for 2 x a3-highgpu-1g in us-west1-b, up to 0.05 min "
                        "(--capacity-wait); Ctrl-C or `invoke down` cancels it, and no VM is left")
    assert state.instances == {} and gcp_cli.cluster()["status"] == "provisioning"
    body = next(r["body"] for r in state.requests if r["method"] == "POST" and r["path"].endswith("/instances"))
    assert body["scheduling"] == {**body["scheduling"], "provisioningModel": "FLEX_START", "automaticRestart": False,
                                  "onHostMaintenance": "TERMINATE", "preemptible": False}
    assert body["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
    # The VM that was made (either: terraform makes them side by side), then removed, is in the ledger: its
    # start and its deletion; the other was never made, so it has none.
    events = Ledger(gcp_cli.state_dir, "default").events()
    made = {e.instance for e in events if e.kind == "start"}
    assert len(made) == 1 and {(e.instance, e.kind) for e in events} >= {(made.pop(), "delete")}, events

    # No Flex-start capacity at all: `up` waits, `status` shows the cluster pending, Ctrl-C ends the wait.
    state.capacity.room.pop((WEST, "FLEX_START"))
    state.capacity.flex_from[WEST] = time.monotonic() + 3600
    waiting = gcp_cli.popen("up")
    try:
        wait_for(lambda: (gcp_cli.cluster() or {}).get("waiting"), 180, what="the waiting up's record")
        status = gcp_cli.run("status", timeout=60)
        assert ("pending: `invoke up` (pid " in status.stdout and "waits for Flex-start capacity for 2 x "
                "a3-highgpu-1g in us-west1-b since" in status.stdout and "`invoke down` cancels it" in status.stdout), \
            status.stdout + status.stderr
        # tfcluster issue 46: a second `up` of the cluster while the first waits says who holds it, in one line.
        second = gcp_cli.run("up", timeout=60)
        assert second.returncode == 2 and re.fullmatch(
            rf"error: cluster 'default' is being made by `invoke up` \(pid {waiting.pid}, since \d\d:\d\d:\d\d\), "
            r"which waits for Flex-start capacity for 2 x a3-highgpu-1g in us-west1-b; let it wait, or end it there "
            r"\(Ctrl-C\) or with `invoke down`", second.stderr.strip()), second.stdout + second.stderr
        waiting.send_signal(signal.SIGINT)
        output, _ = waiting.communicate(timeout=120)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 2 and output.strip().splitlines()[-1] == (
        "error: Ctrl-C cancelled the wait for Flex-start capacity for 2 x a3-highgpu-1g in us-west1-b: removed "
        "the 0 VM(s) made there, so none is left billing; the bucket and network stay until `invoke down`"), output
    assert state.instances == {} and not gcp_cli.cluster()["waiting"]

    # Capacity comes while `up` waits: the cluster is made after the wait.
    up = gcp_cli.popen("up")
    try:
        wait_for(lambda: (gcp_cli.cluster() or {}).get("waiting"), 180, what="the waiting up's record")
        state.capacity.flex_from[WEST] = time.monotonic()
        output, _ = up.communicate(timeout=300)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 0, output
    steps = _steps(output)
    assert steps[-1].startswith("zone us-west1-b, Flex-start: the cluster's VMs are created here, after "), steps
    assert any(step.startswith("waiting: no Flex-start capacity for 2 x a3-highgpu-1g in us-west1-b yet; next try "
                               "in 2 s") for step in steps), steps
    assert {vm["body"]["scheduling"]["provisioningModel"] for vm in state.instances.values()} == {"FLEX_START"}


# ---------------------------------------------------------------- units

@pytest.mark.parametrize("values, error", [
    ({"provisioning": "preemptible"}, "provisioning must be one of standard, spot, flex-start (got 'preemptible')"),
    ({"provisioning": "flex-start", "spot": True}, "--spot and --provisioning flex-start ask for two provisioning "
                                                   "models; keep one"),
    ({"provisioning": "flex-start", "gpu": "t4"}, "Flex-start VMs exist only for accelerator-optimized machine types "
                                                  "(A2, A3, G2: --gpu a100, a100-80gb, h100 or l4), not n1-standard-8"),
    ({"capacity": "best"}, "capacity must be auto or empty (got 'best')"),
    ({"capacity": "auto", "provisioning": "flex-start", "gpu": "l4"}, "--capacity auto picks the provisioning model "
                                                                      "per zone"),
    ({"reservation": "My_Res"}, "reservation must be any, none or a reservation's name such as my-h100s"),
    ({"reservation": "r1", "spot": True}, "reservation r1: only on-demand VMs consume reservations"),
    ({"capacity_wait_minutes": 2000}, "capacity_wait_minutes must be minutes from 0 (ask once in each zone) to 1440"),
    ({"gpu": "h100"}, "machine_type a3-highgpu-1g is offered only as Spot or Flex-start: add --spot or "
                      "--provisioning flex-start (or --capacity auto)"),
])
def test_provisioning_settings_refuse_what_google_refuses(values, error):
    from tfcluster import config
    from tfcluster.errors import ConfigError

    with pytest.raises(ConfigError) as raised:
        config.load({"backend": "gcp", "project": "p", "zone": WEST, **values})
    assert str(raised.value).startswith(error), str(raised.value)


def test_provisioning_settings_and_what_terraform_gets():
    from tfcluster import config
    from tfcluster.backends.gcp.zones.capacity import model_variables, plan_words
    from tfcluster.provisioning import Choice

    base = {"backend": "gcp", "project": "p", "zone": WEST}
    spot = config.load(base, spot=True)
    assert (spot.provisioning, spot.spot) == ("spot", True)  # --spot is --provisioning spot.
    assert config.load({**base, "provisioning": "spot"}).spot is True
    flex = config.load({**base, "gpu": "h100", "provisioning": "flex-start"})
    assert (flex.machine_type, flex.spot, plan_words(flex)) == (
        "a3-highgpu-1g", False, " (Flex-start, waiting up to 30 min)")
    assert config.load({**base, "gpu": "h100", "capacity": "auto"}).machine_type == "a3-highgpu-1g"
    assert model_variables(Choice("flex-start")) == {"spot": False, "provisioning_model": "FLEX_START",
                                                     "reservation_affinity": "NO_RESERVATION", "reservation_name": ""}
    assert model_variables(Choice("standard", "r1"))["reservation_affinity"] == "SPECIFIC_RESERVATION"
    assert model_variables(Choice("standard"))["reservation_affinity"] == "ANY_RESERVATION"
    assert model_variables(Choice("spot", "any"))["reservation_affinity"] == "NO_RESERVATION"  # Spot consumes none.
    assert plan_words(config.load(base, reservation="r1")) == " on reservation r1"


def test_the_ladder_per_zone_in_order(world):
    """--capacity auto's steps, per zone of `zones`: a matching reservation with room for every VM, Spot (with
    --spot), on-demand, Flex-start; one line for each step it leaves out."""
    from tfcluster import config
    from tfcluster.backends.gcp.zones.capacity import steps
    from tfcluster.backends.gcp.cloud.compute import ComputeApi

    state = world.compute.state
    state.capacity.reservations = {
        (WEST, "open"): Reservation("open", WEST, "a2-highgpu-1g", 4),
        ("us-west1-a", "small"): Reservation("small", "us-west1-a", "a2-highgpu-1g", 1, specific_required=True),
        ("us-west1-a", "other"): Reservation("other", "us-west1-a", "a2-highgpu-8g", 4)}
    said: list = []
    settings = config.load({"backend": "gcp", "project": "demo-project", "gpu": "a100", "workers": 2,
                            "capacity": "auto", "zones": ["us-west1-a"]}, zone=WEST, spot=True)
    ladder = steps(settings, ComputeApi("demo-project"), said.append)
    assert [step.name() for step in ladder] == [
        "zone us-west1-b, reservation open (4 of 4 free)", "zone us-west1-b, Spot", "zone us-west1-b, on-demand",
        "zone us-west1-b, Flex-start", "zone us-west1-a, Spot", "zone us-west1-a, on-demand",
        "zone us-west1-a, Flex-start"]
    assert ladder[0].choice.affinity() == ("ANY_RESERVATION", "")  # Open: consumed without naming it.
    assert said == ["zone us-west1-a, reservation: no matching reservation with room (small has 1 of 1 free, the "
                    "cluster needs 2); skipped"]
    # One H100 (Spot or Flex-start only), no --spot: Flex-start alone, and the line that says why.
    said.clear()
    h100 = config.load({"backend": "gcp", "project": "demo-project", "gpu": "h100", "capacity": "auto"}, zone=WEST)
    assert [step.name() for step in steps(h100, ComputeApi("demo-project"), said.append)] == [
        "zone us-west1-b, Flex-start"]
    assert said == ["zone us-west1-b, on-demand: a3-highgpu-1g is offered only as Spot or Flex-start; skipped"]


class StepTerraform:
    """terraform as capacity.Maker drives it: each apply refused with ``stderr`` ("": it takes the cluster);
    every call recorded in ``calls``."""

    def __init__(self, stderr: str = "", calls: list | None = None):
        self.stderr, self.calls = stderr, calls if calls is not None else []

    def set_variables(self, changes):
        self.calls.append(("set", changes["provisioning_model"]))

    def apply(self):
        from tfcluster.backends.gcp.cloud.terraform import TerraformError

        self.calls.append(("apply",))
        if self.stderr:
            raise TerraformError("apply", self.stderr)

    def run(self, *args):
        return ""  # `state list`: nothing made.


@pytest.mark.parametrize("code", facts.COMPACT_PLACEMENT_REFUSAL.alternatives)
def test_a_placement_refusal_is_a_capacity_answer_the_ladder_moves_on_from(world, code):
    """Issue 44: Compute that cannot place one more VM of a COLLOCATED policy ends its insert with
    facts.COMPACT_PLACEMENT_REFUSAL, with no code or with a stock-out's (the doubt, run both ways); the product
    reads it as a capacity answer: --capacity auto moves on to the next step, a single zone names the fix."""
    from types import SimpleNamespace

    from google.api_core import exceptions

    from tfcluster import config
    from tfcluster.backends.gcp.zones.capacity import Maker, Step, refusal
    from tfcluster.backends.gcp.cloud.errors import terraform_error_line
    from tfcluster.errors import ClusterError
    from tfcluster.provisioning import Choice

    state = world.compute.state
    _grant_h100_quota(state)
    compute_v1, instances = _client()
    policies = compute_v1.ResourcePoliciesClient(transport="rest", credentials=instances._transport._credentials)
    policy = compute_v1.ResourcePolicy(name=f"close-{len(code)}", group_placement_policy=compute_v1
                                       .ResourcePolicyGroupPlacementPolicy(collocation="COLLOCATED"))
    policies.insert(project="demo-project", region="us-central1", resource_policy_resource=policy).result(timeout=20)
    link = f"projects/demo-project/regions/us-central1/resourcePolicies/{policy.name}"
    state.capacity.placement_room[ZONE], state.capacity.placement_code = 1, code
    standard = {"provisioningModel": "STANDARD", "onHostMaintenance": "TERMINATE"}
    _insert(_body(f"near{len(code)}-0", machine="a2-highgpu-1g", model="STANDARD", scheduling=standard,
                  resourcePolicies=[link])).result(timeout=20)
    with pytest.raises(exceptions.GoogleAPICallError) as refused:
        _insert(_body(f"near{len(code)}-1", machine="a2-highgpu-1g", model="STANDARD", scheduling=standard,
                      resourcePolicies=[link])).result(timeout=20)
    message = "No more than 1 instances of machine type a2-highgpu-1g can be created with this policy."
    assert message in str(refused.value), str(refused.value)
    assert f"near{len(code)}-1" not in state.instances

    # What terraform prints of it (the operation's message, errors.py), and what the product makes of it.
    stderr = f"╷\n│ Error: Error waiting for instance to create: {message}\n╵"
    assert refusal(stderr) == f"no room to place the VMs close together (compact placement: {message[:-1]})"
    assert terraform_error_line(stderr, "p").endswith("or set compact_placement = false")
    said: list = []
    terraform = StepTerraform(stderr)
    settings = config.load({"backend": "gcp", "project": "p", "gpu": "a100", "capacity": "auto"}, zone=WEST)
    maker = Maker(terraform, SimpleNamespace(list_cluster=lambda zone, name: []), {"zone": WEST,
                  "bucket_location": "US-WEST1", "registry_location": "us-west1"}, settings, said.append,
                  record=lambda zone: None, sync=lambda zone, own: None, waiting=lambda *pending: None)
    with pytest.raises(ClusterError, match="no step could take the cluster"):
        maker.make([Step(WEST, Choice("standard")), Step("us-west1-a", Choice("standard"))])
    assert terraform.calls.count(("apply",)) == 2, terraform.calls
    assert said[0].startswith("zone us-west1-b, on-demand: no room to place the VMs close together"), said
    assert said[0].endswith("; trying zone us-west1-a, on-demand"), said


def test_the_plan_says_a_dense_reservation_under_reservation_any_brings_its_own_placement(world):
    """Issue 44: `--capacity auto --reservation any` takes a matching DENSE reservation on its reservation rung,
    whose VMs get no compact policy (RESERVATION_BOUND: its blocks place them, cluster-toolkit#3362); `up`'s
    placement line says so, naming it, and says the policy of the other rungs. Read through the world's
    reservations."""
    from tfcluster import config
    from tfcluster.backends.gcp.zones import placement
    from tfcluster.backends.gcp.cloud.compute import ComputeApi

    api = ComputeApi("demo-project")
    settings = config.load({"backend": "gcp", "project": "demo-project", "gpu": "a100", "workers": 2,
                            "capacity": "auto", "reservation": "any"}, zone=ZONE)
    lines = {}
    for kind in ("DENSE", "DEPLOYMENT_TYPE_UNSPECIFIED"):
        world.compute.state.capacity.reservations = {(ZONE, "blocks"): Reservation(
            "blocks", ZONE, settings.machine_type, 4, deployment_type=kind)}
        lines[kind] = placement.for_settings(settings, placement.dense_under_any(settings, api)).line
    assert lines["DENSE"] == (
        f"placement: the DENSE reservation blocks in {ZONE}'s own where --reservation any takes it (its blocks place "
        f"the VMs; no compact policy is added there); else compact (COLLOCATED), 2 A2 VMs placed close together; a "
        "placement policy can make them harder to get (compact_placement = false turns it off)"), lines["DENSE"]
    assert lines["DEPLOYMENT_TYPE_UNSPECIFIED"].startswith("placement: compact (COLLOCATED), 2 A2 VMs")
    exact = dataclasses.replace(settings, capacity="")  # Not the ladder: a standard VM never takes a DENSE one.
    assert placement.dense_under_any(exact, api) == ""


def test_a_wait_ends_on_ctrl_c_and_nothing_is_left(tmp_path):
    """Ctrl-C between two tries (the sleep) ends the wait: what the zone had is removed first, one line."""
    from types import SimpleNamespace

    from tfcluster import config
    from tfcluster.backends.gcp.zones.capacity import Maker, Step
    from tfcluster.errors import ClusterError
    from tfcluster.provisioning import Choice

    full = "Error: Error waiting for instance to create: The zone 'projects/p/zones/us-west1-b' does not have " \
           "enough resources available to fulfill the request.  Try a different zone, or try again later."
    calls: list = []

    Terraform = lambda: StepTerraform(full, calls)  # noqa: E731

    def interrupted(seconds):
        raise KeyboardInterrupt

    settings = config.load({"backend": "gcp", "project": "p", "gpu": "h100", "provisioning": "flex-start",
                            "capacity_wait_seconds": 1}, zone=WEST)
    said, waits = [], []
    maker = Maker(Terraform(), SimpleNamespace(list_cluster=lambda zone, name: []), {"zone": WEST,
                  "bucket_location": "US-WEST1", "registry_location": "us-west1"}, settings, said.append,
                  record=lambda zone: None, sync=lambda zone, own: calls.append(("sync", own)),
                  waiting=lambda what, until, since: waits.append(what), sleep=interrupted)
    with pytest.raises(ClusterError) as error:
        maker.make([Step(WEST, Choice("flex-start"))])
    assert str(error.value) == ("Ctrl-C cancelled the wait for Flex-start capacity for 3 x a3-highgpu-1g in "
                                "us-west1-b: removed the 0 VM(s) made there, so none is left billing; the bucket "
                                "and network stay until `invoke down`")
    assert waits == ["Flex-start capacity for 3 x a3-highgpu-1g in us-west1-b", ""]  # Pending, then not.
    # The refused try's VMs removed, then the zone's again on Ctrl-C (each with the ledger brought up to date).
    assert calls.count(("apply",)) == 1 and calls.count(("sync", "delete")) == 2, calls
    # --capacity-wait 0: one try, no wait, no pending record.
    waits.clear()
    once = Maker(Terraform(), SimpleNamespace(list_cluster=lambda zone, name: []), {"zone": WEST,
                 "bucket_location": "US-WEST1", "registry_location": "us-west1"},
                 dataclasses.replace(settings, capacity_wait_minutes=0.0), said.append, record=lambda zone: None,
                 sync=lambda zone, own: None, waiting=lambda *pending: waits.append(pending), sleep=interrupted)
    with pytest.raises(ClusterError, match=r"^no Flex-start capacity for 3 x a3-highgpu-1g in us-west1-b "
                                           r"\(--capacity-wait 0: asked once\); no VM is left"):
        once.make([Step(WEST, Choice("flex-start"))])
    assert waits == []


def test_down_ends_a_waiting_up_and_waits_for_it(tmp_path):
    """`invoke down` on a pending cluster (ClusterState.waiting): SIGTERM to the waiting `up`, which stops between
    two tries (capacity.Maker), and down goes on once it has exited; one on another machine is an error."""
    from tfcluster import config, holds
    from tfcluster.errors import ClusterError
    from tfcluster.state import StateStore

    store = StateStore(config.load({"state_dir": str(tmp_path)}))
    # A process that, like a waiting `up`, ends on SIGTERM a moment after it gets it.
    up = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                           "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.5), sys.exit(2)))\n"
                           "print('waiting', flush=True)\ntime.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert up.stdout.readline() == "waiting\n"
        started = time.monotonic()
        assert holds.end_waiting_up(store, {"pid": up.pid, "host": ""}, "`invoke down`") is True
        assert up.poll() == 2 and time.monotonic() - started >= 0.5  # It had ended before down went on.
    finally:
        up.kill()
        up.wait()
    assert holds.end_waiting_up(store, {"pid": up.pid, "host": ""}, "`invoke down`") is False  # Gone: nothing to do.
    with pytest.raises(ClusterError, match=r"^`invoke up` \(pid 4242 on other-host\) is waiting for capacity for "
                                           r"cluster 'default'; end it there \(Ctrl-C\), then run `invoke down` again"):
        holds.end_waiting_up(store, {"pid": 4242, "host": "other-host"}, "`invoke down`")


def test_each_provisioning_model_is_priced_at_its_own_rate(world, tmp_path):
    """Flex-start's rate from the catalog's own DWS Defined Duration SKUs (else the table's discount, which a
    budget does not trust); the ledger prices each spell at the model in use, and a VM on a reservation at no
    cost beyond its disk and address."""
    from tests.world.billing import FAMILY_PRICES, GPU_PRICES
    from tfcluster import ledger
    from tfcluster.backends.gcp.prices import cost
    from tfcluster.ledger import Event, Prices

    world.billing.catalog.disabled_projects.clear()
    quoted = cost.quote("demo-project", "us-central1-a", "a3-highgpu-1g", "nvidia-h100-80gb", 1, 100, 2, False,
                        tmp_path / "cache", flex_start=True)
    core, ram = FAMILY_PRICES["A3 Instance"][:2]
    assert quoted.live and not quoted.flex_table and quoted.in_use is quoted.flex
    assert quoted.flex.gpu == pytest.approx(GPU_PRICES["Nvidia H100 80GB GPU"][0] / 2)  # The world's DWS SKU.
    assert quoted.flex.vm == pytest.approx(26 * core / 2 + 234 * ram / 2)
    assert quoted.for_budget is quoted.flex and quoted.budget_note() is None
    assert [line for line in quoted.lines() if line.startswith("cost: Flex-start (in use): ")]
    # An N1 has no Flex-start at all.
    assert cost.quote("demo-project", "us-central1-a", "n1-standard-8", "nvidia-tesla-t4", 1, 100, 2, False,
                      tmp_path / "cache").flex is None
    # Without its SKUs: the table's 45% off on-demand, said in the line, and a budget held to on-demand.
    world.billing.catalog.skus = [s for s in world.billing.catalog.skus if "DWS" not in s["description"]]
    table = cost.quote("demo-project", "us-central1-a", "a3-highgpu-1g", "nvidia-h100-80gb", 1, 100, 2, False,
                       tmp_path / "other-cache", flex_start=True)
    assert table.flex_table and table.flex.gpu == pytest.approx(table.on_demand.gpu * 0.55)
    assert table.for_budget is table.on_demand and "Flex-start VMs are held to the on-demand rate" in table.budget_note()

    # The ledger: one hour on each model, at its own rate; on a reservation, the disk and address only.
    rates = {"on_demand": {"vm": 1.0, "gpu": 10.0, "disk": 0.01, "ip": 0.005, "ssd": 0.1},
             "spot": {"vm": 0.3, "gpu": 3.0, "disk": 0.01, "ip": 0.0025, "ssd": 0.1},
             "flex": {"vm": 0.5, "gpu": 5.0, "disk": 0.01, "ip": 0.005, "ssd": 0.1}}
    hour = 3600.0
    for name, extra, expected in [("flex", {"flex_in_use": True}, 5.615), ("spot", {"spot_in_use": True}, 3.4125),
                                  ("reserved", {"reservation": "r1"}, 0.015), ("standard", {}, 11.115)]:
        book = ledger.Ledger(tmp_path, name)
        book.note_prices(Prices(at=0, **rates, **{"spot_in_use": False, **extra}, gpu_count=1, workers=1,
                                date="2026-11-26", source="test", live=True))
        book.append([Event(0, "vm", "start", ledger.OWN), Event(hour, "vm", "delete", ledger.OWN)])
        figures = book.figures(now=2 * hour)
        assert figures.cost_usd == pytest.approx(expected), name
        assert figures.on_demand_usd == pytest.approx(11.115)
    assert "on reservation r1: no cost beyond it for the VMs" in ledger.Ledger(tmp_path, "reserved").figures(
        now=2 * hour).words()
    assert "Flex-start saved $5.50 against on-demand" in ledger.Ledger(tmp_path, "flex").figures(now=2 * hour).words()


def test_a_dense_reservation_takes_reservation_bound_vms_and_the_product_makes_them_so(world):
    """DENSE reservations (tests/world/facts.py, DENSE_RESERVATIONS): Compute refuses a STANDARD VM on one
    in its words; the ladder, `--reservation NAME` and `check` read deploymentType and ask for
    RESERVATION_BOUND; a refusal in those words moves the ladder on rather than aborting."""
    from google.api_core import exceptions

    from tfcluster import config
    from tfcluster.backends.gcp.zones import capacity, reservations
    from tfcluster.backends.gcp.cloud.compute import ComputeApi

    state = world.compute.state
    _grant_h100_quota(state)
    state.capacity.reservations = {(ZONE, "block"): Reservation("block", ZONE, "a3-highgpu-8g", 2, specific_required=True,
                                                                deployment_type="DENSE")}
    named = {"consumeReservationType": "SPECIFIC_RESERVATION", "key": "compute.googleapis.com/reservation-name",
             "values": ["block"]}
    scheduling = {"onHostMaintenance": "TERMINATE", "automaticRestart": False}
    with pytest.raises(exceptions.BadRequest, match="Instances consuming DENSE reservations must use "
                                                    "provisioningModel RESERVATION_BOUND"):
        _insert(_body("std-0", machine="a3-highgpu-8g", reservationAffinity=named,
                      scheduling={**scheduling, "provisioningModel": "STANDARD"}))
    _insert(_body("bound-0", machine="a3-highgpu-8g", reservationAffinity=named,
                  scheduling={**scheduling, "provisioningModel": "RESERVATION_BOUND"})).result(timeout=20)
    assert state.instances["bound-0"]["reservation"] == (ZONE, "block")

    api = ComputeApi("demo-project")
    settings = config.load({"backend": "gcp", "project": "demo-project", "gpu": "h100", "gpu_count": 8,
                            "machine_type": "a3-highgpu-8g", "workers": 1, "capacity": "auto", "reservation": "block"},
                           zone=ZONE)
    first = capacity.steps(settings, api, lambda line: None)[0]
    assert first.name() == "zone us-central1-a, reservation block (1 of 2 free)"
    assert capacity.model_variables(first.choice) == {"spot": False, "provisioning_model": "RESERVATION_BOUND",
                                                      "reservation_affinity": "SPECIFIC_RESERVATION",
                                                      "reservation_name": "block"}
    by_name = config.load({"backend": "gcp", "project": "demo-project", "gpu": "h100", "gpu_count": 8,
                           "machine_type": "a3-highgpu-8g", "workers": 1, "reservation": "block"}, zone=ZONE)
    [step] = capacity.steps(by_name, api, lambda line: None)
    assert step.choice.compute_model == "RESERVATION_BOUND"
    assert reservations.check_finding(by_name, "nvidia-h100-80gb", [ZONE]).line() == (
        "✓ reservation block: in us-central1-a, a3-highgpu-8g, 1 of 2 free; DENSE: its VMs are made "
        "RESERVATION_BOUND, as Compute requires")
    assert capacity.refusal("Error: Error creating instance: googleapi: Error 400: Instances consuming DENSE "
                            "reservations must use provisioningModel RESERVATION_BOUND, invalid")


def test_g2_flex_start_bills_on_demand_and_the_catalog_sells_no_dws_sku_for_it(world, tmp_path):
    """"For A4, A3, A2, and H4D machine types, you obtain vCPUs, memory, and any attached GPUs at a discounted
    price" (tests/world/facts.py, FLEX_START_DISCOUNT): a G2 (L4) Flex-start VM is quoted, booked and budgeted at
    on-demand, from the catalog and from the table; the world's catalog has no G2 or L4 DWS SKU."""
    from tfcluster.backends.gcp.prices import cost

    skus = [s["description"] for s in world.billing.catalog.skus]
    assert not [d for d in skus if "DWS" in d and ("G2" in d or "L4" in d)]
    assert [d for d in skus if d.startswith("DWS Defined Duration A3 Core")]
    world.billing.catalog.disabled_projects.clear()
    for cache in ("live", None):
        if cache is None:  # The table, as without the catalog.
            world.billing.catalog.disabled_projects.add("demo-project")
        quoted = cost.quote("demo-project", "us-central1-a", "g2-standard-8", "nvidia-l4", 1, 100, 2, False,
                            tmp_path / str(cache), flex_start=True)
        assert quoted.in_use.total == pytest.approx(quoted.on_demand.total), cache
        assert quoted.for_budget.total == pytest.approx(quoted.on_demand.total), cache
        assert [line for line in quoted.lines() if line.startswith("cost: Flex-start (in use)")][0].endswith(
            ", 0% less"), quoted.lines()


def test_a_quota_refusal_ends_the_flex_start_wait_naming_the_quota():
    """Waiting does not bring quota: a Flex-start try refused on quota drops the zones that share it
    (failover.after_refusal: the region's), and with none left the wait ends at once, naming it; no sleep,
    no second partial cluster."""
    from types import SimpleNamespace

    from tfcluster import config
    from tfcluster.backends.gcp.zones.capacity import Maker, Step
    from tfcluster.errors import ClusterError
    from tfcluster.provisioning import Choice

    over = ("Error: Error creating instance: googleapi: Error 403: Quota 'PREEMPTIBLE_NVIDIA_H100_GPUS' exceeded.  "
            "Limit: 0.0 in region us-west1., quotaExceeded")
    terraform = StepTerraform(over)

    def no_sleep(seconds):
        raise AssertionError(f"waited {seconds} s for quota")

    settings = config.load({"backend": "gcp", "project": "p", "gpu": "h100", "provisioning": "flex-start",
                            "capacity_wait_seconds": 1}, zone=WEST)
    said: list = []
    maker = Maker(terraform, SimpleNamespace(list_cluster=lambda zone, name: []), {"zone": WEST,
                  "bucket_location": "US-WEST1", "registry_location": "us-west1"}, settings, said.append,
                  record=lambda zone: None, sync=lambda zone, own: None, waiting=lambda *pending: None, sleep=no_sleep)
    with pytest.raises(ClusterError) as error:
        maker.make([Step(WEST, Choice("flex-start")), Step("us-west1-a", Choice("flex-start"))])
    assert str(error.value).startswith("Flex-start was refused on quota, not capacity (zone us-west1-b, Flex-start: no "
                                       "quota (PREEMPTIBLE_NVIDIA_H100_GPUS)), and waiting does not bring quota"), \
        str(error.value)
    assert terraform.calls.count(("apply",)) == 1  # us-west1-a shares us-west1's quota: not tried.
    assert "zone us-west1-a, Flex-start: skipped (skipping us-west1-a: PREEMPTIBLE_NVIDIA_H100_GPUS is us-west1's, " \
           "the same in each of its zones)" in said, said


def test_the_ledger_at_the_edges_of_capacity(world, tmp_path):
    """Item 15: each step's prices line is written before its VMs start (a Flex-start spell is not charged
    on-demand); after `down`, the last sync keeps the reservation the VMs ran on; `--reservation any` takes
    only reservations that do not require targeting, and names one that does."""
    from types import SimpleNamespace

    from tfcluster import config, ledger
    from tfcluster.backends.gcp.zones import reservations
    from tfcluster.backends.gcp.backend import GcpBackend
    from tfcluster.backends.gcp.zones.capacity import Maker, Step
    from tfcluster.provisioning import Choice
    from tfcluster.state import ClusterState, StateStore

    calls: list = []
    settings = config.load({"backend": "gcp", "project": "p", "gpu": "h100", "provisioning": "flex-start"}, zone=WEST)
    Maker(StepTerraform("", calls), SimpleNamespace(list_cluster=lambda zone, name: []), {"zone": WEST, "bucket_location": "US-WEST1",
          "registry_location": "us-west1"}, settings, lambda line: None, record=lambda zone: None,
          sync=lambda zone, own: calls.append(("sync", own)), waiting=lambda *pending: None
          ).make([Step(WEST, Choice("flex-start"))])
    assert calls[:3] == [("set", "FLEX_START"), ("sync", ""), ("apply",)], calls

    # After `down`: Compute lists no VM, and the prices line keeps the reservation.
    store = StateStore(config.load({"state_dir": str(tmp_path)}))
    backend = GcpBackend(store)
    (backend.workdir("default")).mkdir(parents=True)
    (backend.workdir("default") / "terraform.tfvars.json").write_text(json.dumps({
        "machine_type": "n1-standard-8", "gpu_type": "nvidia-tesla-t4", "gpu_count": 1, "boot_disk_gb": 100}))
    book = ledger.Ledger(store.root, "default")
    book.note_prices(ledger.Prices(at=0, on_demand={"vm": 1.0, "gpu": 1.0, "disk": 0.01, "ip": 0.005, "ssd": 0.0},
                                   spot={"vm": 0.3, "gpu": 0.3, "disk": 0.01, "ip": 0.0025, "ssd": 0.0},
                                   spot_in_use=False, gpu_count=1, workers=1, date="2026-11-28", source="t", live=True,
                                   reservation="r1"))
    cluster = ClusterState(name="default", backend="gcp", hosts=[], project="demo-project", zone=WEST)
    backend.spend_sync(cluster, config.load({"backend": "gcp", "project": "demo-project"}, zone=WEST), book)
    assert book.prices().reservation == "r1"

    # --reservation any under --capacity auto: a matching reservation that requires targeting is taken by name
    # (what whoever reserved capacity expects), and the docs say so rather than "only those that do not".
    held = [reservations.Held("mine", WEST, "a2-highgpu-1g", (), 4, 0, True, "READY")]
    assert reservations.usable(held, "any", "a2-highgpu-1g", (), 2) == ("mine", "reservation mine (4 of 4 free)", False)
    docs = " ".join((REPO / "docs" / "google-cloud.md").read_text().split())
    assert ("Under `--capacity auto`, `any` goes further: its reservation rung also takes a matching reservation "
            "that requires targeting, by naming it") in docs
