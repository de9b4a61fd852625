"""What the price lookup costs `up` (a catalog read) and `status` (the day's cache), side by side.

    TFCLUSTER_TESTLAB_NET=N python bench/bench_prices.py [--rounds 3] [--skus 5000,30000]

Against the Catalog stand-in of the test world (tests/world/billing.py) over HTTPS through the real
google-cloud-billing client, with the SKU list padded to each size by look-alike SKUs and the ones
tfcluster needs last (the worst case: every page is read and parsed). Each round alternates which
goes first. The network is loopback: a real catalog adds its round trips on top (one per page).
Needs root (the world binds 127.77.N.x:443).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.world.billing import compute_skus, sku  # noqa: E402
from tests.world.names import GoogleWorld  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skus", default="5000,30000")
    options = parser.parse_args()
    from tfcluster.backends.gcp.prices import cost

    root = Path(tempfile.mkdtemp(prefix="bench-prices-"))
    world = GoogleWorld(root / "world")
    os.environ.update(world.env())
    catalog = world.billing.catalog
    catalog.disabled_projects.clear()
    args = ("demo-project", "us-west1-b", "n1-standard-8", "nvidia-tesla-t4", 1, 100, 3, False)
    print("| SKUs in the list | catalog read (`up`, median) | cached (`status`, median) | ratio |")
    print("|---|---|---|---|")
    with world.resolving():
        for size in (int(n) for n in options.skus.split(",")):
            needed = compute_skus()
            catalog.skus = [sku(f"F-{i}", f"E2 Instance Core running in Region {i % 40}", "CPU", "OnDemand",
                                ["us-west1", "us-east1"], 0.02) for i in range(size - len(needed))] + needed
            cold, warm = [], []
            for round_ in range(options.rounds):
                cache = root / f"cache-{size}-{round_}"
                order = ("cold", "warm") if round_ % 2 == 0 else ("warm", "cold")
                for kind in order:
                    if kind == "warm" and not (cache / "prices-us-west1.json").exists():
                        cost.quote(*args, cache_dir=cache)  # Fill the cache outside the timing.
                    target = cache if kind == "warm" else root / f"cold-{size}-{round_}"
                    started = time.perf_counter()
                    result = cost.quote(*args, cache_dir=target)
                    (cold if kind == "cold" else warm).append(time.perf_counter() - started)
                    assert result.source.startswith("Cloud Billing Catalog"), result.source
            c, w = statistics.median(cold), statistics.median(warm)
            print(f"| {size} | {c:.2f} s | {w * 1000:.1f} ms | {c / w:.0f}x |")
    world.close()


if __name__ == "__main__":
    main()
