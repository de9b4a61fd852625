"""Run one action on many hosts at once; one error names every host that failed (fabric's group)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

from tfcluster.errors import HostErrors, HostUnreachable

T = TypeVar("T")


def in_parallel(items: list[T], action: Callable[[T], object], label: Callable[[T], str],
                what: str) -> list[object]:
    """Run ``action`` on every item at once; one HostErrors naming every failed host."""
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(items))) as pool:
        futures = [pool.submit(action, item) for item in items]
    results, failures = [], {}
    for item, future in zip(items, futures):
        try:
            results.append(future.result())
        except HostErrors as error:
            failures.update(error.failures)
            results.append(None)
        except HostUnreachable as error:
            failures[label(item)] = f"unreachable ({error.detail})"
            results.append(None)
        except Exception as error:  # noqa: BLE001 - reported per host, never swallowed
            reason = str(error) or type(error).__name__
            prefix = f"{label(item)}: "
            failures[label(item)] = reason[len(prefix):] if reason.startswith(prefix) else reason
            results.append(None)
    if failures:
        raise HostErrors(what, failures)
    return results
