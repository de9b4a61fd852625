"""Fails CI when pytest skipped (or xfailed) anything: one line per test, with its reason."""

import sys
import xml.etree.ElementTree as ElementTree

report = sys.argv[1]
skipped = []
for case in ElementTree.parse(report).iter("testcase"):
    for mark in case.findall("skipped"):
        reason = (mark.get("message") or mark.text or "").strip().splitlines()[0:1]
        skipped.append(f"{case.get('classname')}::{case.get('name')}: {reason[0] if reason else ''}")
if skipped:
    for line in skipped:
        print(f"ci: skipped: {line}")
    print(f"error: {len(skipped)} test(s) skipped; CI counts a skip as a failure: install what the reason names")
    sys.exit(1)
print("ci: no test skipped")
