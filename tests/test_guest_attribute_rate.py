"""Readiness stays within Google's guest-attribute budget: about 10 queries per minute per VM,
above which Google may drop attributes being written
(https://cloud.google.com/compute/docs/metadata/manage-guest-attributes). The real client asks the
Compute stand-in; only the clock is simulated, so a 5-minute boot takes no time."""

from __future__ import annotations

import types

from tests.test_gcp_backend import api_for, fake_compute  # noqa: F401 - fixture
from tfcluster.backends import gcp
from tfcluster.backends.gcp.cloud import compute


def test_readiness_asks_each_vm_at_most_ten_times_a_minute(fake_compute, monkeypatch):  # noqa: F811
    now = [0.0]
    monkeypatch.setattr(compute, "time", types.SimpleNamespace(sleep=lambda s: now.__setitem__(0, now[0] + s),
                                                               monotonic=lambda: now[0]))
    names = ["r-0", "r-1", "r-2"]
    for name in names:
        fake_compute.state.instances[name] = {"zone": "us-west1-b", "labels": {}, "status": "RUNNING",
                                              "guest": {"tfcluster/ready": "n:starting"}}
    api = api_for(fake_compute)
    asked: list[tuple[float, str]] = []
    real = api.guest_attributes

    def guest_attributes(zone, instance, query_path):
        asked.append((now[0], instance))
        if now[0] >= 300:  # The boot script finishes five minutes in.
            fake_compute.state.instances[instance]["guest"]["tfcluster/ready"] = "n:ok"
        return real(zone, instance, query_path)

    monkeypatch.setattr(api, "guest_attributes", guest_attributes)
    gcp.wait_ready(api, "us-west1-b", names, timeout=900, clock=lambda: now[0], nonce="n")
    for name in names:
        times = [at for at, instance in asked if instance == name]
        assert len(times) >= 40, "readiness stopped asking"
        busiest = max(sum(1 for at in times if start <= at < start + 60) for start in times)
        assert busiest <= 10, f"{name} was asked {busiest} times in one minute"
