"""``stepsim sweep`` end to end through ``stepsim.cli.main``: summary, exit status, resume, errors."""

from __future__ import annotations

import re

from sweep_helpers import files_under

from stepsim.batch import expand, load_sweep
from stepsim.batch.rows import read_sweep
from stepsim.cli import main

# Mixtral-8x7B on the bundled synthetic B=64 routing trace, symbolic metrics (fast: no simulation)
MOE_SWEEP = """
workload = "moe"
out = "results"
partition_by = ["workload", "tiling"]
report = ["off_chip_bytes", "on_chip_bytes", "flops"]
[[axes]]
tiling = ["static"]
tile_n = [16, 32]
[[axes]]
tiling = ["dynamic"]
"""
# cells as `stepsim run` prints them (bytes and FLOP with decimal prefixes; the exact integers are in the files)
MOE_TABLE = """\
#  tiling   tile_n  status  off_chip_bytes  on_chip_bytes      flops
0  static       16  ok             4.23 GB        18.9 MB  158 GFLOP
1  static       32  ok             2.82 GB        25.2 MB  210 GFLOP
2  dynamic       -  ok             2.82 GB        18.9 MB  105 GFLOP"""


def summary_without_wall_time(text: str) -> str:
    return re.sub(r"wall time  \d+\.\d s", "wall time  <t> s", text)


def test_cli_sweep_runs_writes_a_hive_dataset_prints_a_summary_and_resumes(sweep_file, capsys):
    path = sweep_file(MOE_SWEEP)
    tasks = expand(load_sweep(path))
    assert main(["sweep", str(path), "--jobs", "2", "--no-progress"]) == 0
    out = path.parent / "results"
    assert summary_without_wall_time(capsys.readouterr().out) == f"""\
sweep {path} -> {out}
  tasks      3: 3 run, 0 skipped (result file already there), 0 not run
  failed     0 (0 in this run)
  wall time  <t> s (local, 2 workers)

{MOE_TABLE}
"""
    assert files_under(out, "**/*.parquet") == sorted([  # sorted by path: the keys are hashes of the configs
        f"workload=moe/tiling=dynamic/part-{tasks[2].key}.parquet",
        f"workload=moe/tiling=static/part-{tasks[0].key}.parquet",
        f"workload=moe/tiling=static/part-{tasks[1].key}.parquet",
    ])
    table = read_sweep(out)
    assert sorted(zip(table["tiling"].to_pylist(), table["tile_n"].to_pylist(), table["status"].to_pylist())) == [
        ("dynamic", None, "ok"), ("static", 16, "ok"), ("static", 32, "ok")]

    # second run: everything is there already; no worker is started
    assert main(["sweep", str(path), "--no-progress"]) == 0
    assert summary_without_wall_time(capsys.readouterr().out) == f"""\
sweep {path} -> {out}
  tasks      3: 0 run, 3 skipped (result file already there), 0 not run
  failed     0 (0 in this run)
  wall time  <t> s

{MOE_TABLE}
"""


def test_cli_exit_status_is_1_when_tasks_failed_and_2_with_fail_fast(sweep_file, tmp_path, capsys):
    path = sweep_file('workload = "swiglu"\n[axes]\ntile_n = [16, 24]\n')
    other = tmp_path / "elsewhere"
    assert main(["sweep", str(path), "--out", str(other), "--jobs", "1", "--no-progress"]) == 1
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0] == f"sweep {path} -> {other}"
    assert lines[2] == "  failed     1 (1 in this run)"
    assert lines[4] == "  failed task 1 (tile_n=24): ConfigError: tile_n must be a positive divisor of 512, got 24"
    assert lines[-3:] == ["#  tile_n  status  off_chip_bytes  on_chip_bytes      flops",
                          "0      16  ok             8.45 MB         100 kB  117 MFLOP",
                          "1      24  failed               -              -          -"]
    assert len(files_under(other, "**/part-*.parquet")) == 2

    fail_fast = tmp_path / "fail-fast"
    assert main(["sweep", str(path), "--out", str(fail_fast), "--jobs", "1", "--fail-fast", "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines()[-1] == (
        "stepsim: error: stopped at the first failed task (--fail-fast): task 1 (tile_n=24): ConfigError: "
        "tile_n must be a positive divisor of 512, got 24")
    assert "  tasks      2: 2 run, 0 skipped (result file already there), 0 not run" in captured.out.splitlines()


def test_cli_reports_sweep_file_errors_without_a_traceback(sweep_file, capsys):
    path = sweep_file('workload = "swiglu"\n[axes]\ntile_nn = [16]\n')
    assert main(["sweep", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"stepsim: error: {path}: unknown key 'tile_nn' in [axes] (did you mean 'tile_n'?); ")
    assert "Traceback" not in err

    good = sweep_file('workload = "swiglu"\n', "good.toml")
    assert main(["sweep", str(good), "--no-progress"]) == 2
    assert capsys.readouterr().err == (f"stepsim: error: {good}: no output folder; set out = \"...\" in the sweep "
                                       f"file or pass --out\n")
    assert main(["sweep", str(good), "--executor", "local", "--address", "tcp://127.0.0.1:1"]) == 2
    assert capsys.readouterr().err == "stepsim: error: --address is only for --executor dask\n"
