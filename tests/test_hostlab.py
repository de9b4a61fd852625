"""The test-host harness itself: a lab that fails half-built leaves nothing running."""

from __future__ import annotations

import pytest

from tests import hostlab

pytestmark = pytest.mark.skipif(hostlab.available() is not None, reason=hostlab.available() or "")


def test_a_lab_that_fails_while_starting_tears_down_what_it_started(tmp_path, monkeypatch):
    def never_answers(self, host, timeout=10):
        raise RuntimeError(f"sshd on {host.address} did not answer")

    monkeypatch.setattr(hostlab.HostLab, "_wait_for_port", never_answers)
    started = []
    real_add_host = hostlab.HostLab._add_host
    monkeypatch.setattr(hostlab.HostLab, "_add_host",
                        lambda self, index: started.append(real_add_host(self, index)) or started[-1])
    with pytest.raises(RuntimeError, match="did not answer"):
        hostlab.HostLab(tmp_path / "lab", 2, tag="tl")
    assert len(started) == 2
    for host in started:
        assert host.sshd.poll() is not None, f"sshd of {host.netns} still runs"
        assert hostlab.sh("ip", "netns", "pids", host.netns, check=False).returncode != 0, \
            f"namespace {host.netns} is still there"
