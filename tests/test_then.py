"""`train --then down`: the cluster goes away when the run ends, succeeded or failed, and run.json
says so; `--then stop` on machines that are not tfcluster's to halt, and anything else, are one
error line. `--then stop` on VMs: tests/test_spot.py."""

from __future__ import annotations

import pytest

from tests.conftest import wait_for
from tfcluster.backends.local import processes_with_env

SCRIPT = """
import os, sys
print("worker", os.environ["TFCLUSTER_WORKER_INDEX"], "done", flush=True)
sys.exit(int(os.environ.get("EXIT_CODE", "0")))
"""


@pytest.mark.parametrize("exit_code", [0, 3], ids=["succeeded", "failed"])
def test_then_down_removes_the_cluster_when_the_run_ends(cli, tmp_path, exit_code):
    script = tmp_path / "quick.py"
    script.write_text(SCRIPT)
    cli.env["EXIT_CODE"] = str(exit_code)
    assert cli.run("up", "--workers", "2").returncode == 0
    cluster_id = cli.cluster()["cluster_id"]
    result = cli.run("train", "--script", str(script), "--then", "down", timeout=120)
    assert result.returncode == (0 if exit_code == 0 else 1), result.stdout[-3000:] + result.stderr[-2000:]
    outcome = "succeeded" if exit_code == 0 else "failed"
    assert f"--then down: run default-" in result.stdout and f" {outcome}; removing cluster 'default'" in result.stdout
    assert "Cluster default is down: verified that no worker process is left" in result.stdout
    assert cli.cluster() is None
    wait_for(lambda: not processes_with_env(f"TFCLUSTER_CLUSTER_ID={cluster_id}"), 10, what="no process left")
    _, run = cli.latest_run()
    assert run["outcome"] == outcome and run["summary"]["then"] == "down"
    if exit_code:
        assert result.stderr.strip().splitlines()[-1].startswith("error: run default-")
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args, message", [
    (["--then", "delete"], "error: --then must be stop or down (got 'delete')"),
    (["--resume", "default-1", "--then", "down"], "error: --then goes with a new run, not with --resume"),
], ids=["delete", "resume"])
def test_then_names_what_it_accepts(cli, args, message):
    result = cli.run("train", *args)
    assert result.returncode != 0 and result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith(message), result.stderr


def test_then_stop_is_refused_where_the_machines_are_not_tfclusters_to_halt(cli, tmp_path):
    assert cli.run("up", "--workers", "1").returncode == 0
    result = cli.run("train", "--then", "stop")
    assert result.returncode != 0 and result.stderr.strip().splitlines() == [
        "error: --then stop halts cloud VMs, and the local backend's machines are not tfcluster's to halt; use "
        "--then down to remove the cluster when the run ends"], result.stderr
    assert cli.runs() == []  # Nothing started.


def test_budget_is_refused_where_there_are_no_prices_and_names_a_bad_amount(cli):
    """`train --budget` needs the backend's prices: the local backend has none (docs/cost-guards.md#budgets)."""
    assert cli.run("up", "--workers", "1").returncode == 0
    for args, message in [(["--budget", "5"], "error: --budget needs the cluster's prices, and the local backend "
                           "has none (tfcluster does not bill its machines by the hour); drop --budget, or cap the "
                           "time with --stall-minutes"),
                          (["--budget", "five"], "error: --budget must be an amount of US dollars such as 25 or 7.50, "
                           "0 for none (got 'five')")]:
        result = cli.run("train", *args)
        assert result.returncode == 2 and result.stderr.strip().splitlines() == [message], result.stderr
    assert cli.runs() == []  # Nothing started.
