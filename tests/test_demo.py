"""The README's main job: ``stepsim demo`` prints a table and writes Parquet (+ provenance) and a PNG."""

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from stepsim.cli import main
from stepsim.demo.moe_tiling import demo_configs
from stepsim.results.records import SCHEMA
from stepsim.workloads.config import normalize_config

ACCOUNTING = ("on_chip_bytes: published accounting (every expert allocated); on_chip_bytes_active: minus the "
              "experts that received no token (the figure, like `stepsim reproduce dynamic_tiling`, draws static "
              "tiles published and dynamic tiling active)")


def test_demo_metrics_only_writes_results_with_provenance_and_a_plot(tmp_path, capsys):
    assert main(["demo", "--metrics-only", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "MoE layer mixtral-8x7b, the bundled synthetic routing trace synthetic_routing_mixtral_b64.arrow, static "
        "tiles 8, 16, 32, 64 and dynamic tiling (symbolic metrics only)",
        ACCOUNTING,
        "",
        " tiling  tile_n  off_chip_bytes  on_chip_bytes  on_chip_bytes_active      flops",
        "-------  ------  --------------  -------------  --------------------  ---------",
        " static       8         6.70 GB        15.8 MB               15.8 MB  125 GFLOP",
        " static      16         4.23 GB        18.9 MB               18.9 MB  158 GFLOP",
        " static      32         2.82 GB        25.2 MB               25.2 MB  210 GFLOP",
        " static      64         2.82 GB        37.8 MB               37.8 MB  421 GFLOP",
        "dynamic       -         2.82 GB        18.9 MB               18.9 MB  105 GFLOP",
        "",
        f"wrote {tmp_path / 'results.parquet'}",
        f"wrote {tmp_path / 'moe_tiling.png'}"]
    table = pq.read_table(tmp_path / "results.parquet")
    assert table.column("tiling").to_pylist() == ["static"] * 4 + ["dynamic"]
    assert table.column("tile_n").to_pylist() == [8, 16, 32, 64, None]
    meta = table.schema.metadata
    assert {b"stepsim.version", b"stepsim.config", b"stepsim.config_hash", b"stepsim.trace_hash"} <= set(meta)
    assert table.schema.field("off_chip_bytes").metadata == {b"unit": b"bytes"}
    assert table.schema.equals(SCHEMA)  # one record row per configuration
    assert table.column("mode").to_pylist() == ["metrics"] * 5
    assert table.column("cycles").null_count == 5
    assert table.column("off_chip_bytes").to_pylist()[2:] == [2_820_145_408] * 3
    assert (tmp_path / "moe_tiling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(tmp_path.glob("*.tmp*")) == []


def test_demo_takes_a_config_file_and_a_trace(tmp_path, capsys):
    """The README: `demo --model` takes what every --model takes, a preset's own config.json among them (its
    bundled trace is used); a model without a bundled trace needs --trace, and says so before any work."""
    from stepsim.workloads.config import bundled_trace

    preset_file = str(Path(bundled_trace("qwen3-30b-a3b")).parent / "models" / "qwen3-30b-a3b.json")
    assert main(["demo", "--metrics-only", "--model", preset_file, "--out", str(tmp_path / "q")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"MoE layer {preset_file}, the bundled synthetic routing trace synthetic_routing_qwen_b64.arrow"
                        ", static tiles 8, 16, 32, 64 and dynamic tiling (symbolic metrics only)")
    assert lines[9] == "dynamic       -          756 MB         113 MB               75.5 MB  11.3 GFLOP"
    by_file = pq.read_table(tmp_path / "q" / "results.parquet")
    assert main(["demo", "--metrics-only", "--model", "qwen", "--out", str(tmp_path / "p")]) == 0
    capsys.readouterr()
    by_name = pq.read_table(tmp_path / "p" / "results.parquet")
    for column in ("off_chip_bytes", "on_chip_bytes", "on_chip_bytes_active", "flops"):
        assert by_file.column(column).to_pylist() == by_name.column(column).to_pylist()
    assert main(["demo", "--metrics-only", "--model", "deepseek", "--out", str(tmp_path / "d")]) == 2
    assert capsys.readouterr().err == ("stepsim: error: demo --model deepseek-moe-16b: no bundled routing trace for "
                                       "this model; give one with --trace PATH (stepsim trace synth routing writes "
                                       "one)\n")
    assert not (tmp_path / "d").exists()
    trace = tmp_path / "r.arrow"
    assert main(["trace", "synth", "routing", "--model", "deepseek", "--tokens", "64", "--seed", "1",
                 "--out", str(trace)]) == 0
    capsys.readouterr()
    assert main(["demo", "--metrics-only", "--model", "deepseek", "--trace", str(trace),
                 "--out", str(tmp_path / "d")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("MoE layer deepseek-moe-16b, routing trace r.arrow, static tiles 8, 16, 32, 64 and dynamic "
                        "tiling (symbolic metrics only)")
    assert pq.read_table(tmp_path / "d" / "results.parquet").column("trace").to_pylist() == [str(trace)] * 5


def test_demo_configs_are_valid_record_configs():
    configs = demo_configs("qwen3-30b-a3b", with_cycles=True)
    assert [normalize_config(c)["tile_n"] for c in configs] == [8, 16, 32, 64, None]
    assert {normalize_config(c)["mode"] for c in configs} == {"simulate"}


@pytest.mark.slow
def test_demo_simulates_by_default_with_cycles_and_measured_traffic(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path)]) == 0
    header = capsys.readouterr().out.splitlines()[3].split()
    assert header == ["tiling", "tile_n", "cycles", "off_chip_bytes", "on_chip_bytes", "on_chip_bytes_active",
                      "flops"]
    table = pq.read_table(tmp_path / "results.parquet")
    assert table.column("mode").to_pylist() == ["simulate"] * 5
    cycles = table.column("cycles").to_pylist()
    assert all(isinstance(c, int) and c > 0 for c in cycles)
    # the engine moves exactly the bytes the symbolic model counts, and never beats the HBM peak
    assert table.column("off_chip_bytes_measured").to_pylist() == table.column("off_chip_bytes_symbolic").to_pylist()
    assert all(0 < u <= 1 for u in table.column("off_chip_bw_utilization").to_pylist())
