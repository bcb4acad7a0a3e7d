"""The order ``./run.sh test`` hands the test files to its workers (tests/suite_order.py): longest first, files
without seconds before them, each file's tests in their own order; the table it reads is today's files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from suite_order import TABLE, file_order, main, order_items, read_table, replay, table_from_junit

REPO = Path(__file__).resolve().parents[1]

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest"
tests="5" time="9.0" timestamp="2026-11-26T01:13:23.686590+00:00">
<testcase classname="tests.serve.test_a" name="test_one" time="1.25" />
<testcase classname="tests.serve.test_a" name="test_two[x]" time="2.5" />
<testcase classname="tests.test_b" name="test_three" time="5.0" />
<testcase classname="tests.workloads.collective.test_c" name="test_four" time="0.05" />
<testcase classname="other.test_d" name="test_five" time="7.0" />
</testsuite></testsuites>"""


def test_files_go_longest_first_after_the_files_without_seconds():
    seconds = {"a.py": 3.0, "b.py": 10.0, "c.py": 3.0, "d.py": 0.5}
    assert file_order(["a.py", "new1.py", "b.py", "c.py", "new2.py", "d.py"], seconds) == \
        ["new1.py", "new2.py", "b.py", "a.py", "c.py", "d.py"]


def test_items_are_grouped_by_file_and_keep_their_order_in_it():
    items = [SimpleNamespace(nodeid=n) for n in ("t/x.py::a", "t/y.py::b[1]", "t/x.py::c", "t/y.py::b[2]",
                                                  "t/z.py::d")]
    ordered = order_items(items, {"t/x.py": 1.0, "t/y.py": 2.0})
    assert [i.nodeid for i in ordered] == ["t/z.py::d", "t/y.py::b[1]", "t/y.py::b[2]", "t/x.py::a", "t/x.py::c"]


def test_the_table_is_made_from_a_junit_report_and_read_back(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    text = table_from_junit(junit)
    assert text.splitlines() == [
        "# seconds per test file (test times summed) of the run of 2026-11-26T01:13 (5 tests): the order of "
        "./run.sh test's files (tests/suite_order.py)",
        "5.0 tests/test_b.py", "3.8 tests/serve/test_a.py", "0.1 tests/workloads/collective/test_c.py"]
    table = tmp_path / "seconds.txt"
    table.write_text(text)
    assert read_table(table) == {"tests/test_b.py": 5.0, "tests/serve/test_a.py": 3.8,
                                 "tests/workloads/collective/test_c.py": 0.1}
    table.write_text(text + "12s tests/x.py\n")
    with pytest.raises(ValueError, match=r"^.*seconds\.txt:5: not '<seconds> <test file>': '12s tests/x\.py'$"):
        read_table(table)


def test_the_command_rewrites_the_table(tmp_path):
    """``python tests/suite_order.py JUNIT`` on a copy of the module (the repository's table stays as it is)."""
    (tmp_path / "suite_order.py").write_text((REPO / "tests" / "suite_order.py").read_text())
    (tmp_path / "junit.xml").write_text(JUNIT)
    done = subprocess.run([sys.executable, "suite_order.py", "junit.xml"], cwd=tmp_path, capture_output=True,
                          text=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"wrote {tmp_path / 'file_seconds.txt'} (3 files)\n",
                                                           "")
    assert (tmp_path / "file_seconds.txt").read_text() == table_from_junit(tmp_path / "junit.xml")


def test_the_repositorys_table_names_only_test_files_that_exist():
    """A renamed or removed test file leaves a stale line: refresh the table (suite_order's docstring)."""
    table = read_table(TABLE)
    assert len(table) > 200
    assert [name for name in table if not (REPO / name).is_file()] == []
    assert all(name.startswith("tests/") and Path(name).name.startswith("test_") for name in table)


def test_a_long_single_test_last_keeps_one_worker_busy_alone():
    """xdist's order (most tests first) hands out the 6 s file last: at 1 s the worker with 1 test of Z left
    takes it and ends at 8 s, the other at 4 s. Longest first, both end at 6 s (Y's 4 s then Z's 2 s beside X)."""
    files = {"x.py": [6.0], "y.py": [1.0] * 4, "z.py": [1.0, 1.0]}
    most_tests_first = sorted(files.items(), key=lambda f: -len(f[1]))
    assert [f for f, _ in most_tests_first] == ["y.py", "z.py", "x.py"]
    assert replay(most_tests_first) == [4.0, 8.0]
    order = file_order(list(files), {f: sum(t) for f, t in files.items()})
    assert order == ["x.py", "y.py", "z.py"]
    assert replay([(f, files[f]) for f in order]) == [6.0, 6.0]


def test_the_replay_command_prints_when_the_workers_end(tmp_path, capsys):
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    assert main(["--replay", str(junit)]) == 0
    # files in collection order: serve/test_a (3.75 s, 2 tests), test_b (5 s), workloads/collective/test_c
    assert capsys.readouterr().out.splitlines() == [
        "3 files, 8.8 test-seconds on 2 workers",
        "xdist (most tests first): the workers end at 3.8, 5.0 s",
        "collection: the workers end at 3.8, 5.0 s",
        "longest first: the workers end at 5.0, 3.8 s"]
    assert main([]) == 2
    assert capsys.readouterr().err.startswith("usage: python tests/suite_order.py [--replay] JUNIT.xml")
