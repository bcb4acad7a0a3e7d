"""``stepsim compare`` as a CI gate: it cannot be switched off by a bad threshold, a baseline configuration the
candidate lacks fails it (unless allowed), a text metric is one line, units of different graphs are not diffed by
their generated names, and every refusal says why (a failed row, a changed trace)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stepsim.cli import main
from stepsim.insight.compare import load_records

E = "stepsim: error: "
SWEEP = """
workload = "swiglu"
mode = "simulate"
[fixed]
hardware = "step-hdl"
[axes]
tile_m = [16, 32]
tile_n = [16, 32]
"""
# the records store the values a run used (compute_bw, channel_depth), so the labels name them too
LABEL = "workload=swiglu tile_n={n} tile_m={m} compute_bw=4096 channel_depth=1 hardware=step-hdl convention=published"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gate")
    spec = folder / "sweep.toml"
    spec.write_text(SWEEP)
    assert main(["sweep", str(spec), "--out", str(folder / "base"), "--no-progress"]) == 0
    return folder / "base"


def _rows(base) -> list[dict]:
    rows, _ = load_records(base)
    return sorted(rows, key=lambda r: (r["tile_m"], r["tile_n"]))


def _candidate(tmp_path, rows: list[dict]):
    path = tmp_path / "cand.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _compare(capsys, *argv) -> tuple[int, list[str], list[str]]:
    status = main(["compare", *map(str, argv)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return status, captured.out.splitlines(), captured.err.splitlines()


@pytest.mark.parametrize("flags, last", [
    (["--threshold", "nan"], E + "--threshold must be a finite ratio >= 0 (0.01 = 1 %), got nan"),
    (["--threshold", "inf"], E + "--threshold must be a finite ratio >= 0 (0.01 = 1 %), got inf"),
    (["--metric", "model"], E + "--metric model: not a numeric column (a string column of the records); compare "
                                "cycles, bytes, FLOPs or utilizations"),
    (["--metric", "check_passed"], E + "--metric check_passed: not a numeric column (a bool column of the records); "
                                       "compare cycles, bytes, FLOPs or utilizations"),
    (["--metric", "status"], E + "--metric status: not a numeric column (the baseline holds 'ok'); compare cycles, "
                                 "bytes, FLOPs or utilizations"),
], ids=["nan", "inf", "model", "bool", "status"])
def test_a_gate_that_would_not_gate_is_refused(base, capsys, flags, last):
    status, out, err = _compare(capsys, base, base, *flags)
    assert (status, out, err[-1]) == (2, [], last)


def test_missing_configurations_fail_the_gate_unless_allowed(base, tmp_path, capsys):
    cand = _candidate(tmp_path, _rows(base)[:1])  # one of four configurations
    status, out, _ = _compare(capsys, base, cand, "--metric", "cycles")
    assert status == 1
    assert out[-4:] == [  # sorted by configuration
        f"missing in the candidate: {LABEL.format(n=16, m=32)}: closest candidate record differs in tile_m 32 -> 16",
        f"missing in the candidate: {LABEL.format(n=32, m=16)}: closest candidate record differs in tile_n 32 -> 16",
        f"missing in the candidate: {LABEL.format(n=32, m=32)}: closest candidate record differs in tile_n 32 -> 16, "
        f"tile_m 32 -> 16",
        "3 of 4 baseline configuration(s) missing in the candidate (pass --allow-missing to accept)"]
    status, out, _ = _compare(capsys, base, cand, "--metric", "cycles", "--allow-missing")
    assert (status, out[-1]) == (0, "3 of 4 baseline configuration(s) missing in the candidate (allowed by "
                                    "--allow-missing)")
    # new configurations in the candidate are no failure
    status, out, _ = _compare(capsys, cand, base, "--metric", "cycles")
    assert (status, out[-2:]) == (0, ["only in the candidate: 3 record(s)", "no metric worse by more than 1 %"])


def test_a_failed_candidate_row_is_missing_with_its_error(base, tmp_path, capsys):
    rows = _rows(base)
    rows[1].update(status="failed", error_type="DeadlockError", error_message="deadlock: no unit can make progress\n"
                   "cycle 1: ...", cycles=None)
    status, out, _ = _compare(capsys, base, _candidate(tmp_path, rows), "--metric", "cycles", "--json")
    doc = json.loads(out[0])
    assert status == 1 and doc["regressed"] and doc["worse"] == []
    assert doc["missing"] == [{"config": LABEL.format(n=32, m=16),
                               "reason": "failed in the candidate (DeadlockError: deadlock: no unit can make "
                                         "progress)"}]


@pytest.mark.parametrize("value, reason", [(float("nan"), "NaN"), (None, "missing")])
def test_a_candidate_record_with_an_unusable_metric_fails_the_gate(base, tmp_path, capsys, value, reason):
    rows = _rows(base)  # * a NaN utilization compared false with the threshold and passed (exit 0)
    rows[2]["compute_utilization"] = value
    status, out, _ = _compare(capsys, base, _candidate(tmp_path, rows), "--metric", "compute_utilization")
    assert (status, out[-1]) == (1, f"candidate metric compute_utilization is {reason} in {LABEL.format(n=16, m=32)}")
    was = f"{100 * _rows(base)[2]['compute_utilization']:.2f} %"  # the baseline's value, as compare prints it
    assert [line for line in out if "INVALID" in line] == [
        f"  compute_utilization      {was:>16} ->                -  -  INVALID ({reason})"]
    status, out, _ = _compare(capsys, base, _candidate(tmp_path, rows), "--metric", "compute_utilization", "--json")
    doc = json.loads(out[0])  # strict JSON: the value reads as null beside its reason
    assert doc["invalid"] == [{"config": LABEL.format(n=16, m=32), "metric": "compute_utilization",
                               "reason": reason}] and doc["regressed"]


def test_a_configuration_twice_in_the_baseline_is_a_duplicate(base, tmp_path, capsys):
    rows = _rows(base)
    twice = tmp_path / "twice.parquet"
    pq.write_table(pa.Table.from_pylist([*rows, rows[0]]), twice)
    status, out, _ = _compare(capsys, twice, base, "--metric", "cycles")
    # * was "missing in the candidate" and "1 of 5 baseline configuration(s) missing", exit 1
    assert (status, out[-2:]) == (0, [f"duplicate in the baseline: {LABEL.format(n=16, m=16)} (recorded more than "
                                      "once)", "no metric worse by more than 1 %"])
    status, out, _ = _compare(capsys, base, twice, "--metric", "cycles")  # a candidate's second record is listed
    assert (status, out[-2:]) == (0, [f"duplicate in the candidate: {LABEL.format(n=16, m=16)} (recorded more than "
                                      "once)", "no metric worse by more than 1 %"])


def test_no_match_says_the_trace_changed(base, tmp_path, capsys):
    rows = _rows(base)
    for r in rows:
        r["trace_sha256"] = "ab" * 32
    cand = _candidate(tmp_path, rows)
    status, out, err = _compare(capsys, base, cand)
    assert (status, out) == (2, [])
    assert err[-1] == (E + f"no record of {cand} matches a configuration of {base} (4 vs 4 records; "
                           f"{LABEL.format(n=16, m=16)}: closest candidate record differs in trace None -> "
                           f"abababababab)")


def test_no_match_says_every_candidate_row_failed(base, tmp_path, capsys):
    rows = _rows(base)
    for r in rows:
        r.update(status="failed", error_type="SimulationError", error_message="engine stopped")
    cand = _candidate(tmp_path, rows)
    status, _, err = _compare(capsys, base, cand)
    assert (status, err[-1]) == (2, E + f"no record of {cand} matches a configuration of {base} (4 vs 0 records; "
                                        f"{LABEL.format(n=16, m=16)}: failed in the candidate (SimulationError: "
                                        f"engine stopped))")


def test_units_of_different_graphs_are_not_diffed_by_name(tmp_path, capsys):
    assert main(["run", "swiglu", "--out", str(tmp_path / "a")]) == 0
    assert main(["run", "examples/user_graph.py:silu_rows", "--out", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    status, out, _ = _compare(capsys, tmp_path / "a", tmp_path / "b", "--metric", "cycles")
    assert status == 0
    assert out[-2:] == ["  units not compared: the graphs differ (12 vs 3 units), so equal names are not the same "
                        "units", "no metric worse by more than 1 %"]
    assert not any(line.startswith("  unit ") for line in out)


GROUPED_PROGRAMS = '''
from stepsim.graph import FP32, Graph, LinearOffChipLoad, LinearOffChipStore, Map, Silu, Tensor


def _expert(g, e, maps, compute_bw):
    x = LinearOffChipLoad(g, Tensor(f"x{e}", (64, 256), FP32), tile=(16, 256), out_shape_tiled=(4, 1),
                          stride=(1, 0))
    ops = [x]
    for _ in range(maps):
        ops.append(Map(g, ops[-1], Silu(), compute_bw=compute_bw))
    ops.append(LinearOffChipStore(g, ops[-1], tensor_name=f"y{e}"))
    for op in ops:
        op.group = ("expert", e)


def base():
    g = Graph("grouped")
    _expert(g, 0, maps=1, compute_bw=1024)
    _expert(g, 1, maps=2, compute_bw=1024)
    return g


def candidate():  # expert 0 gains a Map (every later unit is renamed); expert 1 computes at 1/16 of the rate
    g = Graph("grouped")
    _expert(g, 0, maps=2, compute_bw=1024)
    _expert(g, 1, maps=2, compute_bw=64)
    return g
'''


def test_units_of_groups_with_the_same_operators_pair_by_label(tmp_path, capsys):
    programs = tmp_path / "grouped.py"
    programs.write_text(GROUPED_PROGRAMS)
    for name in ("base", "candidate"):
        assert main(["run", f"{programs}:{name}", "--out", str(tmp_path / name)]) == 0
    capsys.readouterr()
    units = pq.read_table(next((tmp_path / "candidate").rglob("_units-*.parquet"))).to_pylist()
    assert [(u["name"], u["group"], u["label"]) for u in units] == [
        ("LinearOffChipLoad_0", "expert 0", "expert 0/LinearOffChipLoad#0"), ("Map_1", "expert 0", "expert 0/Map#0"),
        ("Map_2", "expert 0", "expert 0/Map#1"), ("LinearOffChipStore_3", "expert 0", "expert 0/LinearOffChipStore#0"),
        ("LinearOffChipLoad_4", "expert 1", "expert 1/LinearOffChipLoad#0"), ("Map_5", "expert 1", "expert 1/Map#0"),
        ("Map_6", "expert 1", "expert 1/Map#1"), ("LinearOffChipStore_7", "expert 1", "expert 1/LinearOffChipStore#0")]
    status, out, _ = _compare(capsys, tmp_path / "base", tmp_path / "candidate", "--metric", "cycles", "--json")
    pair = json.loads("\n".join(out))["pairs"][0]
    assert pair["units_note"] == ("units paired by label in the 1 group(s) with the same operators on both sides; "
                                  "not compared: expert 0")
    # expert 1's units are Map_4.. in the baseline and Map_5.. in the candidate: paired by label, not by name
    assert pair["units"] == [
        {"unit": "expert 1/Map#1", "kind": "Map", "baseline_busy_cycles": 128, "candidate_busy_cycles": 2048,
         "change_cycles": 1920},
        {"unit": "expert 1/Map#0", "kind": "Map", "baseline_busy_cycles": 1024, "candidate_busy_cycles": 2048,
         "change_cycles": 1024}]
