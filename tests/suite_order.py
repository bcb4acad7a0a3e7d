"""The order the suite's test files are handed to the workers: longest first (``./run.sh test``).

``pytest -n auto --dist loadfile`` gives each worker one test file at a time, in the order of the collection
(with ``--no-loadscope-reorder``; without it xdist sorts the files by their number of tests, which puts the files of
one or two long tests, the optimizer's B=1024 searches and the plan's command line, last). A worker that takes a
long file at the end runs alone while the other has nothing left: on 2 cores a 58 s file there costs up to 58 s
of the wall time. Handing the files out longest first (the LPT rule) leaves only short files for the end.

The seconds of each file are in :data:`TABLE` (``<seconds> <path>`` lines: a run's test times summed per file).
A file not in it (new since the table was made) goes first, in collection order: it may be long. Only the order
of whole files changes; the tests of a file keep theirs (tests/test_readme.py runs its commands in order).
Refresh the table from a full run's JUnit XML (``./run.sh test --junitxml=junit.xml``)::

    python tests/suite_order.py junit.xml

:func:`replay` plays a run's test times through xdist's rule for each order (``python tests/suite_order.py
--replay junit.xml``: when each worker would end, in xdist's order, in collection order and longest first).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

#: seconds per test file of one full run (``<seconds> <path relative to the repository>``, longest first)
TABLE = Path(__file__).with_name("file_seconds.txt")


def read_table(path: Path = TABLE) -> dict[str, float]:
    """``{test file: seconds}`` of ``path`` (``#`` lines are comments); a ValueError naming a bad line."""
    seconds = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        value, _, name = line.strip().partition(" ")
        try:
            seconds[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"{path}:{number}: not '<seconds> <test file>': {line!r}") from None
    return seconds


def file_order(files: list[str], seconds: dict[str, float]) -> list[str]:
    """``files`` (in collection order) as the workers should take them: those without seconds first, in their
    order, then the others longest first (equal seconds: collection order)."""
    unknown = [f for f in files if f not in seconds]
    known = sorted((f for f in files if f in seconds), key=lambda f: -seconds[f])  # sorted is stable
    return unknown + known


def order_items(items: list, seconds: dict[str, float]) -> list:
    """The test items grouped by file in :func:`file_order`'s order, each file's tests in their own order."""
    by_file: dict[str, list] = defaultdict(list)
    for item in items:
        by_file[item.nodeid.partition("::")[0]].append(item)
    return [item for name in file_order(list(by_file), seconds) for item in by_file[name]]


def table_from_junit(junit: Path) -> str:
    """The text of :data:`TABLE` from a JUnit XML report: each file's test times (setup, call and teardown)
    summed, longest first."""
    import xml.etree.ElementTree as ET

    root = ET.parse(junit).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    seconds: dict[str, float] = defaultdict(float)
    for case in root.iter("testcase"):
        module = case.get("classname", "").split(".")
        if module[0] != "tests":
            continue
        # a test in a class has the class as the last part of its classname: keep the module's parts only
        parts = module[:next((i for i, p in enumerate(module) if p[:1].isupper()), len(module))]
        seconds["/".join(parts) + ".py"] += float(case.get("time", 0))
    lines = [f"{s:.1f} {name}" for name, s in sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))]
    header = (f"# seconds per test file (test times summed) of the run of {suite.get('timestamp', '?')[:16]} "
              f"({suite.get('tests', '?')} tests): the order of ./run.sh test's files (tests/suite_order.py)")
    return "\n".join([header, *lines]) + "\n"


def replay(files: list[tuple[str, list[float]]], workers: int = 2) -> list[float]:
    """When each of ``workers`` ends, handed the test files ``files`` (``(name, [seconds of each test])``, in
    the order the controller hands them out) by xdist's ``loadfile`` rule: one file each at the start, then the
    next file to a worker when a test of it ends and at most 2 of its tests are left (so a worker may hold the
    next file while it still runs the last tests of one). Seconds from the start."""
    import heapq

    queue = list(reversed(files))
    pending = [[] for _ in range(workers)]  # each worker's tests to run, in order
    ends = [0.0] * workers
    events = []  # (time the running test ends, worker)
    for w in range(workers):
        if queue:
            pending[w].extend(queue.pop()[1])
            heapq.heappush(events, (pending[w][0], w))
    while events:
        now, w = heapq.heappop(events)
        pending[w].pop(0)
        ends[w] = now
        if queue and len(pending[w]) <= 2:
            pending[w].extend(queue.pop()[1])
        if pending[w]:
            heapq.heappush(events, (now + pending[w][0], w))
    return ends


def _junit_files(junit: Path) -> list[tuple[str, list[float]]]:
    """``(file, [test seconds])`` of a JUnit XML report, the files in pytest's collection order (their paths'
    parts sorted), each file's tests in the report's order."""
    import xml.etree.ElementTree as ET

    files: dict[str, list[float]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        if module[0] == "tests":  # as table_from_junit (the suite's tests have no classes)
            files.setdefault("/".join(module) + ".py", []).append(float(case.get("time", 0)))
    return sorted(files.items(), key=lambda f: f[0].split("/"))


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--replay":
        files = _junit_files(Path(argv[1]))
        seconds = {name: sum(times) for name, times in files}
        orders = {"xdist (most tests first)": sorted(files, key=lambda f: -len(f[1])), "collection": files,
                  "longest first": [(name, dict(files)[name]) for name in file_order([f for f, _ in files], seconds)]}
        print(f"{len(files)} files, {sum(seconds.values()):.1f} test-seconds on 2 workers")
        for label, order in orders.items():
            print(f"{label}: the workers end at " + ", ".join(f"{end:.1f}" for end in replay(order)) + " s")
        return 0
    if len(argv) != 1:
        print("usage: python tests/suite_order.py [--replay] JUNIT.xml  (rewrites tests/file_seconds.txt; "
              "--replay: prints when the workers end in each order)", file=sys.stderr)
        return 2
    TABLE.write_text(table_from_junit(Path(argv[0])))
    print(f"wrote {TABLE} ({len(read_table())} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
