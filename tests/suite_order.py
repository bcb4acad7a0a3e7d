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


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/suite_order.py JUNIT.xml  (rewrites tests/file_seconds.txt)")
    TABLE.write_text(table_from_junit(Path(sys.argv[1])))
    print(f"wrote {TABLE} ({len(read_table())} files)")
