"""The README's main job: ``stepsim demo`` prints a table and writes Parquet (+ provenance) and a PNG."""

import pyarrow.parquet as pq
import pytest

from stepsim.cli import main
from stepsim.demo.moe_tiling import demo_configs
from stepsim.results.records import SCHEMA
from stepsim.workloads.config import normalize_config


def test_demo_metrics_only_writes_results_with_provenance_and_a_plot(tmp_path, capsys):
    assert main(["demo", "--metrics-only", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["tiling", "tile_n", "off_chip_bytes", "on_chip_bytes", "flops"]
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


def test_demo_configs_are_valid_record_configs():
    configs = demo_configs("qwen3-30b-a3b", with_cycles=True)
    assert [normalize_config(c)["tile_n"] for c in configs] == [8, 16, 32, 64, None]
    assert {normalize_config(c)["mode"] for c in configs} == {"simulate"}


@pytest.mark.slow
def test_demo_simulates_by_default_with_cycles_and_measured_traffic(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path)]) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header == ["tiling", "tile_n", "cycles", "off_chip_bytes", "on_chip_bytes", "flops"]
    table = pq.read_table(tmp_path / "results.parquet")
    assert table.column("mode").to_pylist() == ["simulate"] * 5
    cycles = table.column("cycles").to_pylist()
    assert all(isinstance(c, int) and c > 0 for c in cycles)
    # the engine moves exactly the bytes the symbolic model counts, and never beats the HBM peak
    assert table.column("off_chip_bytes_measured").to_pylist() == table.column("off_chip_bytes_symbolic").to_pylist()
    assert all(0 < u <= 1 for u in table.column("off_chip_bw_utilization").to_pylist())
