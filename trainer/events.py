"""Machine-readable progress lines the launcher parses from a worker's log.

Each event is one line: ``TFCLUSTER_EVENT {json}``. Everything else in the log is
ordinary output. User scripts may print these too; the launcher simply shows
"n/a" for whatever they do not report.
"""

import json
import sys
import time

PREFIX = "TFCLUSTER_EVENT "


def emit(event: str, **fields) -> None:
    record = {"event": event, "time": round(time.time(), 3), **fields}
    sys.stdout.write(PREFIX + json.dumps(record, sort_keys=True) + "\n")
    sys.stdout.flush()


def parse(line: str):
    """The event dict carried by ``line``, or None for an ordinary log line."""
    start = line.find(PREFIX)
    if start < 0:
        return None
    try:
        record = json.loads(line[start + len(PREFIX):])
    except ValueError:
        return None
    return record if isinstance(record, dict) and "event" in record else None
