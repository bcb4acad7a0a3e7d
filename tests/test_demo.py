"""The README's main job: ``stepsim demo`` prints a table and writes Parquet (+ provenance) and a PNG."""

import pyarrow.parquet as pq

from stepsim.cli import main


def test_demo_writes_results_with_provenance_and_a_plot(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["tiling", "tile_n", "off_chip_bytes", "on_chip_bytes", "flops"]
    table = pq.read_table(tmp_path / "results.parquet")
    assert table.column("tiling").to_pylist() == ["static"] * 4 + ["dynamic"]
    assert table.column("tile_n").to_pylist() == [8, 16, 32, 64, None]
    meta = table.schema.metadata
    assert {b"stepsim.version", b"stepsim.config", b"stepsim.config_hash", b"stepsim.trace_hash"} <= set(meta)
    assert table.schema.field("off_chip_bytes").metadata == {b"unit": b"bytes"}
    assert (tmp_path / "moe_tiling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(tmp_path.glob("*.tmp*")) == []
