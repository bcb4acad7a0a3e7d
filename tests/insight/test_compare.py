"""``stepsim compare``: identical runs pass, a slower configuration fails naming the metric, sweeps match by
configuration."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from stepsim.cli import main
from stepsim.insight.compare import compare, load_records

SWEEP = """
workload = "swiglu"
mode = "simulate"
[fixed]
hardware = "step-hdl"
[axes]
tile_m = [16, 32]
tile_n = [16, 32]
"""


def _run(capsys, out, *flags):
    assert main(["run", "swiglu", "--hardware", "step-hdl", "--out", str(out), *flags]) == 0
    capsys.readouterr()


def test_identical_runs_exit_0(tmp_path, capsys):
    _run(capsys, tmp_path / "a", "--tile-m", "32", "--tile-n", "32")
    _run(capsys, tmp_path / "b", "--tile-m", "32", "--tile-n", "32")
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "  cycles                             17,096 ->           17,096  +0.00 %"
    assert out[-1] == "no metric worse by more than 1 %"


def test_a_slower_configuration_exits_1_and_names_the_metric(tmp_path, capsys):
    _run(capsys, tmp_path / "fast", "--tile-m", "32", "--tile-n", "32")
    _run(capsys, tmp_path / "slow", "--tile-m", "16", "--tile-n", "16")
    assert main(["compare", str(tmp_path / "fast"), str(tmp_path / "slow"), "--metric", "cycles"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("workload=swiglu tile_n=32 tile_m=32 compute_bw=4096 channel_depth=1 hardware=step-hdl "
                      "convention=published  (differs: tile_n 32 -> 16, tile_m 32 -> 16)")
    assert out[1] == "  cycles                             17,096 ->           33,288  +94.71 %  WORSE"
    assert out[-1] == "worse by more than 1 %: cycles"
    # the other way round is an improvement; a utilization that fell is worse (higher is better there)
    assert main(["compare", str(tmp_path / "slow"), str(tmp_path / "fast"), "--metric", "cycles"]) == 0
    capsys.readouterr()
    res = compare(tmp_path / "fast", tmp_path / "slow", metrics=["cycles", "compute_utilization"], threshold=0.4)
    assert res["worse"] == ["cycles", "compute_utilization"]  # utilization fell 48.6 %
    change = res["pairs"][0]["changes"][0]
    assert (change["baseline"], change["candidate"]) == (17_096, 33_288)
    assert change["change"] == (33_288 - 17_096) / 17_096
    # single runs: per-unit busy changes, largest first
    assert res["pairs"][0]["units"][0] == {"unit": "LinearOffChipLoad_0", "kind": "LinearOffChipLoad",
                                           "baseline_busy_cycles": 16_304, "candidate_busy_cycles": 32_880,
                                           "change_cycles": 16_576}
    res = compare(tmp_path / "fast", tmp_path / "slow", metrics=["cycles"], threshold=1.0)
    assert res["worse"] == [] and not res["regressed"]  # +94.7 % is within a 100 % threshold


def test_markdown_and_json(tmp_path, capsys):
    _run(capsys, tmp_path / "a", "--tile-m", "32", "--tile-n", "32")
    _run(capsys, tmp_path / "b", "--tile-m", "32", "--tile-n", "16")
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--markdown", "--metric", "cycles"]) == 1
    md = capsys.readouterr().out.splitlines()
    assert md[0] == "| configuration | metric | baseline | candidate | change | |"
    assert md[2] == ("| workload=swiglu tile_n=32 tile_m=32 compute_bw=4096 channel_depth=1 hardware=step-hdl "
                     "convention=published | cycles | 17,096 | "
                     "21,222 | +24.13 % | :x: worse |")
    assert md[6] == "| LinearOffChipLoad_0 | 16,304 | 20,745 | +4,441 |"
    assert md[-1] == "**worse by more than 1 %: cycles**"
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["regressed"] is True and "cycles" in doc["worse"]


def test_sweep_folders_and_parquet_files_match_by_configuration(tmp_path, capsys):
    spec = tmp_path / "sweep.toml"
    spec.write_text(SWEEP)
    assert main(["sweep", str(spec), "--out", str(tmp_path / "base")]) == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "base"), str(tmp_path / "base"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["pairs"]) == 4 and doc["worse"] == []
    # a Parquet file of records where one configuration got 10 % slower
    rows, _ = load_records(tmp_path / "base")  # hive folder values included
    rows.sort(key=lambda r: (r["tile_m"], r["tile_n"]))
    rows[0]["cycles"] = int(rows[0]["cycles"] * 1.1)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "cand.parquet")
    assert main(["compare", str(tmp_path / "base"), str(tmp_path / "cand.parquet"), "--metric", "cycles"]) == 1
    out = capsys.readouterr().out
    assert out.count("WORSE") == 1 and out.splitlines()[-1] == "worse by more than 1 %: cycles"


def test_errors_exit_2(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "nope"), str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"stepsim: error: {tmp_path / 'nope'}: no such file or folder\n"
    _run(capsys, tmp_path / "a", "--tile-m", "32")
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "a"), "--metric", "speed"]) == 2
    assert capsys.readouterr().err == "stepsim: error: --metric speed: not a column of the baseline's records\n"
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "a"), "--threshold", "-1"]) == 2
    assert "--threshold must be a finite ratio >= 0" in capsys.readouterr().err
    (tmp_path / "bad.parquet").write_text("not parquet")
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "bad.parquet")]) == 2
    assert capsys.readouterr().err.startswith(f"stepsim: error: {tmp_path / 'bad.parquet'}: not a Parquet file")


def test_ratios_read_as_in_run(tmp_path, capsys):
    """compare writes a utilization as `stepsim run` does (17.23 %), counts exactly (33,288)."""
    _run(capsys, tmp_path / "a", "--tile-m", "16", "--tile-n", "16")
    _run(capsys, tmp_path / "b", "--tile-m", "16", "--tile-n", "32")
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:6] == [
        "  cycles                             33,288 ->           29,399  -11.68 %",
        "  off_chip_bytes                  8,454,144 ->        7,405,568  -12.40 %",
        "  on_chip_bytes                     100,352 ->          151,552  +51.02 %  WORSE",
        "  compute_utilization               17.23 % ->          19.51 %  +13.23 %",
        "  off_chip_bw_utilization           99.21 % ->          98.40 %  -0.82 %"]
