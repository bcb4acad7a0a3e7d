"""What `stepsim run` / `metrics` / `demo` print for a person (units, rounding, concise unless --verbose), and
`run --out NAME.parquet` writing Parquet files rather than a folder of that name."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from stepsim.base.display import format_bytes, format_seconds, format_value
from stepsim.cli import main
from stepsim.results.records import CHANNEL_SCHEMA, SCHEMA, UNIT_SCHEMA


@pytest.mark.parametrize(("n", "text"), [(0, "0 B"), (999, "999 B"), (1000, "1.00 kB"), (100_352, "100 kB"),
                                         (999_499, "999 kB"), (999_999, "1.00 MB"), (8_454_144, "8.45 MB"),
                                         (25_206_786, "25.2 MB"), (2_820_145_408, "2.82 GB"),
                                         (4_000_000_000_000, "4.00 TB")])
def test_bytes_read_as_kb_mb_gb(n, text):
    assert format_bytes(n) == text


@pytest.mark.parametrize(("s", "text"), [(0.000394, "394 us"), (0.0009996, "1.00 ms"), (0.0123, "12.3 ms"),
                                         (0.80176, "802 ms"), (0.99996, "1.00 s"), (1.2051, "1.21 s"),
                                         (45.67, "45.7 s"), (1234.5, "1,234 s")])
def test_times_are_rounded_to_three_digits(s, text):
    assert format_seconds(s) == text


def test_values_carry_their_units():
    assert format_value(33_288, "cycles") == "33,288 cycles"
    assert format_value(117_473_280, "FLOP") == "117 MFLOP"
    assert format_value(117_473_280, "FLOP", exact=True) == "117 MFLOP (117,473,280 FLOP)"
    assert format_value(8_454_144, "bytes", exact=True) == "8.45 MB (8,454,144 B)"
    assert format_value(0.17231434751261715, "ratio") == "17.23 %"
    assert (format_value(0.0, "ratio"), format_value(6.1e-07, "ratio"), format_value(0.001, "ratio")) == (
        "0.00 %", "6.1e-07", "0.10 %")
    assert format_value(20_480, "FLOP/cycle") == "20,480 FLOP/cycle"
    assert format_value(2003, "count") == "2,003"
    assert format_value(None, "bytes") == "-"
    assert format_value("swiglu", None) == "swiglu"


def _lines(out: str) -> dict[str, str]:
    return dict(line.split(None, 1) for line in out.splitlines())


def test_run_prints_a_concise_view_with_units_and_json_keeps_exact_numbers(capsys):
    assert main(["run", "swiglu"]) == 0
    view = _lines(capsys.readouterr().out)
    assert "params" not in view and "stepsim_version" not in view and "compile_s" not in view
    assert (view["cycles"], view["off_chip_bytes"], view["on_chip_bytes"]) == ("33,288 cycles", "8.45 MB", "100 kB")
    assert (view["flops"], view["compute_utilization"], view["off_chip_bw_utilization"]) == (
        "117 MFLOP", "17.23 %", "99.21 %")
    assert view["total_s"].endswith((" us", " ms", " s"))
    assert main(["run", "swiglu", "--verbose"]) == 0
    verbose = _lines(capsys.readouterr().out)
    assert verbose["params"].startswith('{"batch":64,')
    assert verbose["off_chip_bytes"] == "8.45 MB (8,454,144 B)"
    assert set(view) < set(verbose)
    assert main(["run", "swiglu", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["cycles"], row["off_chip_bytes"], row["on_chip_bytes"]) == (33_288, 8_454_144, 100_352)


def test_run_out_parquet_file_writes_the_record_and_its_tables_beside_it(tmp_path, capsys):
    out = tmp_path / "sub" / "x.parquet"
    assert main(["run", "swiglu", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()[-3:]
    units, channels = tmp_path / "sub" / "x_units.parquet", tmp_path / "sub" / "x_channels.parquet"
    assert printed == [f"wrote run: {out}", f"wrote units: {units}", f"wrote channels: {channels}"]
    assert out.is_file() and sorted(p.name for p in out.parent.iterdir()) == [
        "x.parquet", "x_channels.parquet", "x_units.parquet"]
    row = pq.read_table(out)
    assert row.schema.equals(SCHEMA) and row.column("cycles").to_pylist() == [33_288]
    assert b"stepsim.config_hash" in row.schema.metadata
    assert pq.read_table(units).schema.equals(UNIT_SCHEMA)
    assert pq.read_table(channels).schema.equals(CHANNEL_SCHEMA)
    # metrics runs have no tables: the row alone; an existing folder named *.parquet is still a folder
    assert main(["metrics", "swiglu", "--out", str(tmp_path / "m.parquet")]) == 0
    assert pq.read_table(tmp_path / "m.parquet").column("mode").to_pylist() == ["metrics"]
    assert not (tmp_path / "m_units.parquet").exists()
    (tmp_path / "d.parquet").mkdir()
    assert main(["metrics", "swiglu", "--out", str(tmp_path / "d.parquet")]) == 0
    assert [p.name.startswith("part-") for p in (tmp_path / "d.parquet").iterdir()] == [True]


def test_demo_table_cells_carry_units(tmp_path, capsys):
    assert main(["demo", "--metrics-only", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[5].split() == ["static", "8", "6.70", "GB", "15.8", "MB", "15.8", "MB", "125", "GFLOP"]
    assert lines[9].split() == ["dynamic", "-", "2.82", "GB", "18.9", "MB", "18.9", "MB", "105", "GFLOP"]


def test_trace_inspect_names_the_units(capsys):
    from stepsim.workloads.config import bundled_trace

    assert main(["trace", "inspect", str(bundled_trace("attention"))]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[3:6] == ["batches: 1  batch size: 16 requests",
                          "kv lengths (tokens): min 131  max 4140  mean 971.31  stdev 1035.36",
                          "kv tiles (tiles of 32 tokens): sum 494  max 130 per request"]
    assert main(["trace", "inspect", str(bundled_trace("mixtral-8x7b"))]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[5:7] == ["expert counts: 12 13 17 22 7 24 22 11 (tokens per expert)",
                          "assignments: 128 (token, expert) pairs  max per expert: 24 tokens  idle experts: 0"]


def test_reproduce_tables_show_units_and_bytes_as_mb_gb():
    import pyarrow as pa

    from stepsim.reproduce.tables import field, format_rows

    schema = pa.schema([field("tiling", pa.string()), field("cycles", pa.int64(), "cycles"),
                        field("off_chip_bytes", pa.int64(), "bytes"), field("overhead_pct", pa.float64(), "%")])
    table = pa.Table.from_pylist([{"tiling": "static", "cycles": 12_345, "off_chip_bytes": 2_820_145_408,
                                   "overhead_pct": 1.234},
                                  {"tiling": "dynamic", "cycles": None, "off_chip_bytes": 512, "overhead_pct": 0.0}],
                                 schema=schema)
    assert format_rows(table, [("tiling", None), ("cycles", "{:,}"), ("off_chip_bytes", "{:,}"),
                               ("overhead_pct", "{:.2f}")]) == [
        " tiling    cycles  off_chip_bytes  overhead_pct",
        "         [cycles]                           [%]",
        "-------  --------  --------------  ------------",
        " static    12,345         2.82 GB          1.23",
        "dynamic         -           512 B          0.00"]


def test_a_cold_kernel_cache_is_announced_once_before_simulating_commands(monkeypatch, capsys, tmp_path):
    import stepsim.kernels.jit as jit

    notice = "stepsim: compiling the simulation kernels once, about a minute (`stepsim cache warm` does it ahead)\n"
    monkeypatch.setattr(jit, "kernels_cached", lambda *kind: False)
    assert main(["run", "swiglu", "--json"]) == 0
    assert capsys.readouterr().err == notice
    assert main(["metrics", "swiglu", "--json"]) == 0  # no engine, no notice
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(jit, "kernels_cached", lambda *kind: True)
    assert main(["run", "swiglu", "--json"]) == 0
    assert capsys.readouterr().err == ""


def test_a_command_refused_for_its_input_says_only_its_error_on_a_cold_cache(monkeypatch, capsys, tmp_path):
    """The notice is said just before the first engine work, not when the command starts: a bad input is one
    line whatever the state of numba's cache (a sweep refuses its tasks before its workers load the kernels)."""
    import stepsim.kernels.jit as jit

    monkeypatch.setattr(jit, "kernels_cached", lambda *kind: False)
    assert main(["run", "swiglu", "--tile-f", "-1"]) == 2
    assert capsys.readouterr().err.splitlines() == ["stepsim: error: --tile-f must be an int >= 1, got -1"]
    sweep = tmp_path / "s.toml"
    sweep.write_text('workload = "swiglu"\n[grid]\ntile_f = [16, -1]\n')
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1


def _numba_index(path, *variants):
    """A cache index as numba writes it (its version, then (stamp, {(signature, codegen): file})), listing the event
    loop's specializations ``variants`` as (functional, timeline)."""
    import pickle

    from numba import types

    array = types.int64[:]
    overloads = {((types.int64,) + (types.none if not f else types.float32[:, :],) + (array if f else types.none,)
                  + (array if t else types.none,), ("magic",)): f"engine.event_loop-12.py311.{i}.nbc"
                 for i, (f, t) in enumerate(variants, 1)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps("0.68.1") + pickle.dumps((b"stamp", overloads)))


def test_kernels_cached_looks_for_each_kind_of_run_in_numbas_cache(monkeypatch, tmp_path):
    """Timing, functional and timeline runs are separate specializations of the event loop: the notice is due for
    the first of each kind (a first `--functional` run or `report` compiled for 45 s in silence)."""
    import stepsim.kernels.jit as jit

    monkeypatch.setattr(jit, "_HERE", tmp_path / "src")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    assert not jit.kernels_cached()
    _numba_index(tmp_path / "cache" / "x" / "engine.event_loop-12.py311.nbi", (False, False))
    assert jit.kernels_cached() and not jit.kernels_cached(functional=True)
    assert not jit.kernels_cached(timeline=True)
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    assert not jit.kernels_cached()
    index = tmp_path / "src" / "__pycache__" / "engine.event_loop-12.py311.nbi"
    _numba_index(index, (False, False), (True, False), (False, True))
    assert [jit.kernels_cached(f, t) for f, t in ((False, False), (True, False), (False, True), (True, True))] == [
        True, True, True, False]
    index.write_bytes(b"")  # unreadable: numba compiles again
    assert not jit.kernels_cached()


def test_the_first_functional_run_report_and_timeline_say_they_compile(monkeypatch, capsys, tmp_path):
    import stepsim.kernels.jit as jit

    notice = "stepsim: compiling the {}simulation kernels once, about a minute (`stepsim cache warm` does it ahead)"
    asked = []

    def timing_only(functional=False, timeline=False):
        asked.append((functional, timeline))
        return not (functional or timeline)

    monkeypatch.setattr(jit, "kernels_cached", timing_only)
    assert main(["run", "swiglu", "--functional", "--json"]) == 0  # a timing run sizes the arena first: no notice
    assert capsys.readouterr().err.splitlines() == [notice.format("functional ")]
    assert asked[-1] == (True, False)
    assert main(["run", "swiglu", "--out", str(tmp_path / "run")]) == 0
    assert capsys.readouterr().err == ""
    assert main(["report", str(tmp_path / "run")]) == 0  # simulates once more, recording a timeline
    assert capsys.readouterr().err.splitlines() == [notice.format("timeline ")]
    assert main(["run", "swiglu", "--timeline", str(tmp_path / "t.json")]) == 0
    assert capsys.readouterr().err.splitlines() == [notice.format("timeline ")]


def test_a_sweep_table_reads_like_run(tmp_path, capsys):
    """The same record, the same cells: `stepsim run` and a sweep's table print 33,288 cycles, 8.45 MB, 17.23 %
    (the sweep table printed 0.1723 and 8,454,144)."""
    sweep = tmp_path / "sweep.toml"
    sweep.write_text('workload = "swiglu"\nmode = "simulate"\nreport = ["cycles", "off_chip_bytes", '
                     '"compute_utilization", "off_chip_bw_utilization"]\n[axes]\ntile_n = [16]\n')
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "out"), "--jobs", "1", "--no-progress"]) == 0
    table = capsys.readouterr().out.splitlines()[-2:]
    assert table == ["#  tile_n  status         cycles  off_chip_bytes  compute_utilization  off_chip_bw_utilization",
                     "0      16  ok      33,288 cycles         8.45 MB              17.23 %                  99.21 %"]
    assert main(["run", "swiglu"]) == 0
    view = _lines(capsys.readouterr().out)
    cells = table[1].split("  ok  ")[1].split()
    assert [" ".join(cells[0:2]), " ".join(cells[2:4]), " ".join(cells[4:6]), " ".join(cells[6:8])] == [
        view["cycles"], view["off_chip_bytes"], view["compute_utilization"], view["off_chip_bw_utilization"]]


def test_size_fifos_and_time_multiplexing_write_bytes_as_every_view_does():
    """One quantity, one form: MB / GB with three digits (format_bytes), the exact count beside it where the
    view gives one; no '91,217.785 MB' or '82,595.84 kB'."""
    from stepsim.passes.sizing import SizingResult

    result = SizingResult(**{**dict.fromkeys(SizingResult.__dataclass_fields__),
                             "graph_name": "g", "depths": {}, "trace_hashes": (), "cycles": 100, "unbounded_cycles": 100,
                             "slack": 0.01, "total_fifo_bytes": 89_079_868, "lp_fifo_bytes": 178_159_736,
                             "uniform_fifo_bytes": 89_079_868, "uniform_depth": 1,
                             "unbounded_fifo_bytes": 91_217_784_832, "simulations": 21, "uniform_simulations": 1,
                             "channels_changed": 209, "default_depth": 2, "deadlock_fix_channels": {},
                             "deadlock_fix_bytes": 0})
    assert result.text()[3:7] == [
        "FIFO bytes sized    89.1 MB (89,079,868 B)",
        "FIFO bytes LP       178 MB (178,159,736 B)",
        "FIFO bytes uniform  89.1 MB (89,079,868 B; every FIFO 1 deep, the smallest uniform depth that finishes)",
        "FIFO bytes 1024     91.2 GB (91,217,784,832 B; 1,024x the sized total)"]
