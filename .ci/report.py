"""What a CI run's pytest phase did, from its junit report: the ten slowest tests and the parallel
efficiency (the sum of the tests' own seconds over pytest's wall-clock seconds: 1.0 is one test at
a time; with N xdist workers it is at most N).

    python3 .ci/report.py REPORT.xml                       the table and the efficiency
    python3 .ci/report.py REPORT.xml --write DURATIONS     also rewrite tests/durations.json, the
                                                           seconds tests/scheduling.py orders by

Standard library only: it runs outside the suite's venv.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def durations(report: Path) -> dict[str, float]:
    """nodeid -> seconds (setup, call and teardown together, as pytest's junit counts them)."""
    found: dict[str, float] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        # junit's classname is the module path with dots (tests.test_x) or module.Class.
        parts = classname.split(".")
        module = next((i for i in range(len(parts), 0, -1) if parts[i - 1].startswith("test_")), len(parts))
        nodeid = "/".join(parts[:module]) + ".py::" + "::".join([*parts[module:], name])
        at, bracket = nodeid.rfind("@"), nodeid.rfind("]")
        nodeid = nodeid[:at] if at > bracket else nodeid  # xdist's "@group" suffix.
        found[nodeid] = found.get(nodeid, 0.0) + float(case.get("time", 0) or 0)
    return found


def table(seconds: dict[str, float], count: int = 10) -> str:
    rows = sorted(seconds.items(), key=lambda item: -item[1])[:count]
    lines = ["| test | seconds |", "|---|---|"]
    lines += [f"| `{nodeid}` | {value:.0f} |" for nodeid, value in rows]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    report = Path(argv[0])
    seconds = durations(report)
    if "--write" in argv:
        target = Path(argv[argv.index("--write") + 1])
        kept = {nodeid: round(value, 1) for nodeid, value in sorted(seconds.items()) if value >= 1.0}
        target.write_text(json.dumps(kept, indent=1) + "\n")
        print(f"ci: wrote {len(kept)} tests' seconds to {target}")
        return 0
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    wall = float(suite.get("time"))  # pytest's own session seconds, collection included.
    total = sum(seconds.values())
    print(f"ci: the ten slowest tests of {len(seconds)}:")
    print(table(seconds))
    print(f"ci: parallel efficiency {total / wall:.2f} ({total:.0f} s of tests in {wall:.0f} s of pytest)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
