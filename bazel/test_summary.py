#!/usr/bin/env python3
"""Counts test cases from Bazel's JUnit XML results and prints `N passed, N failed[, N skipped]`.

Usage: test_summary.py TESTLOGS_DIR LABEL...  (the test targets of the run). A sharded target
has one result file per shard (shard_I_of_N/test.xml); a target or shard without a result file
(it did not build, or it crashed before writing one) counts as one failed test.
Exits 1 when anything failed.
"""
import os
import sys
import xml.etree.ElementTree as ET


def result_files(testlogs, label):
    """The result files of LABEL: its test.xml, or one per shard of a sharded target."""
    package, _, name = label.lstrip("/").partition(":")
    target = os.path.join(testlogs, package, name)
    shards = sorted(d for d in os.listdir(target) if d.startswith("shard_")) \
        if os.path.isdir(target) else []
    if not shards:
        return [os.path.join(target, "test.xml")]
    return [os.path.join(target, shard, "test.xml") for shard in shards]


def count(path):
    passed = failed = skipped = 0
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.find("skipped") is not None or case.get("result") == "skipped" or \
                case.get("status") == "notrun":
            skipped += 1
        else:
            passed += 1
    # A test binary that failed without a failing test case (crash, leak, exit code).
    if failed == 0 and any(int(s.get("failures", "0")) + int(s.get("errors", "0")) > 0
                           for s in root.iter("testsuite")):
        failed = 1
    return passed, failed, skipped


def main():
    testlogs, labels = sys.argv[1], sys.argv[2:]
    totals = [0, 0, 0]
    for label in labels:
        for path in result_files(testlogs, label):
            if not os.path.exists(path):
                print(f"no result for {label}", path.split(os.sep)[-2] if "shard_" in path else "",
                      file=sys.stderr)
                totals[1] += 1
                continue
            for i, n in enumerate(count(path)):
                totals[i] += n
    line = f"{totals[0]} passed, {totals[1]} failed"
    if totals[2]:
        line += f", {totals[2]} skipped"
    print(line)
    return 1 if totals[1] else 0


if __name__ == "__main__":
    sys.exit(main())
