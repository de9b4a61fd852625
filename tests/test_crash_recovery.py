"""What a killed terraform leaves in a cluster's folder (tfcluster/backends/gcp/cloud/terraform_remains.py): the lock info
of a process that is gone, a state cut short with the one before it in terraform.tfstate.backup, and a
terraform of the cluster that still runs (never mended under it). The project's side (resources made but
never recorded) is swept in tests/test_crash_sweep.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tfcluster.backends.gcp.cloud.terraform_remains import mend_folder, state_names
from tfcluster.errors import ClusterError

WHOLE = {"version": 4, "terraform_version": "1.11.4", "serial": 7, "lineage": "x", "outputs": {},
         "resources": [{"mode": "managed", "type": "google_compute_instance", "name": "worker",
                        "instances": [{"attributes": {"name": "sweep-0", "self_link": "https://x/instances/sweep-0"}}]},
                       {"mode": "managed", "type": "google_service_account", "name": "vm",
                        "instances": [{"attributes": {"email": "sweep-vm-0@p.iam.gserviceaccount.com"}}]}]}


def test_a_stale_lock_and_a_cut_state_are_mended_and_a_running_terraform_is_left_alone(tmp_path):
    folder = tmp_path / "sweep"
    folder.mkdir()
    text = json.dumps(WHOLE, indent=2)
    (folder / "terraform.tfstate.backup").write_text(text)
    (folder / "terraform.tfstate").write_text(text[: len(text) // 2])  # Killed mid-write.
    (folder / ".terraform.tfstate.lock.info").write_text('{"ID": "x", "Operation": "OperationTypeApply"}')

    # A terraform of the cluster still runs: nothing is touched, and the line names it.
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"-chdir={folder}", "apply"])
    deadline = time.monotonic() + 30  # Until the child has exec'd: before that its cmdline is the parent's.
    while f"-chdir={folder}".encode() not in Path(f"/proc/{running.pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline, "the stand-in terraform never started"
        time.sleep(0.01)
    try:
        with pytest.raises(ClusterError, match=rf"^terraform \(pid {running.pid}\) still works on cluster 'sweep'; "
                                               rf"wait for it to end, or end it \(kill {running.pid}\), then run this "
                                               "again$"):
            mend_folder(folder, "sweep")
        assert (folder / ".terraform.tfstate.lock.info").exists()
    finally:
        running.kill()
        running.wait()

    lines = mend_folder(folder, "sweep")
    assert lines == [
        "removed the lock info a killed terraform left (.terraform.tfstate.lock.info); no terraform of 'sweep' runs",
        "terraform's state was cut short by a kill (kept as terraform.tfstate.cut); took the one before it, "
        "terraform.tfstate.backup; resources made since are found by the cluster's labels"]
    assert json.loads((folder / "terraform.tfstate").read_text()) == WHOLE
    assert (folder / "terraform.tfstate.cut").read_text() == text[: len(text) // 2]
    assert not (folder / ".terraform.tfstate.lock.info").exists()
    assert mend_folder(folder, "sweep") == []  # Whole now: nothing more to mend.
    assert {"sweep-0", "sweep-vm-0@p.iam.gserviceaccount.com"} <= state_names(folder)

    # An empty state file (cut before its first byte) with no backup: set aside, and said so.
    assert not (folder / "terraform.tfstate.backup").exists()  # It became the state.
    (folder / "terraform.tfstate").write_text("")
    assert mend_folder(folder, "sweep") == [
        "terraform's state was cut short by a kill (kept as terraform.tfstate.cut) and has no backup; the cluster's "
        "resources are found by its labels"]
    assert not (folder / "terraform.tfstate").exists() and state_names(folder) == set()
