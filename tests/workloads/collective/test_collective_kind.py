"""`stepsim run collective`: the workload kind on the command line (exact cycles, functional check, per-link bytes,
busy cycles and occupancy in the unit table, one-line errors, the system file in the run identity)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from stepsim.cli import main
from stepsim.results.records import run_identity


def _status(argv) -> int:
    """The exit status of the command (argparse errors exit, stepsim's own errors return 2)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_run_collective_prints_the_exact_cycles(capsys):
    """ring-4 (alpha 500, B 64): S = 4096 B, chunks of 1024 B take 16 cycles; adds 2 x 16 = 32 (PMU 64 B/cycle):
    2 * 3 * (500 + 16) + 3 * 32 + 1."""
    row = _json(capsys, ["run", "collective", "--op", "all-reduce", "--bytes", "4096", "--system", "ring-4",
                         "--algorithm", "ring-chunked", "--json"])
    params = json.loads(row["params"])
    assert row["cycles"] == params["closed_form_cycles"] == 2 * 3 * 516 + 3 * 32 + 1 == 3193
    assert (row["workload"], row["op"], row["bytes"], row["algorithm"], row["system"]) == (
        "collective", "all-reduce", 4096, "ring-chunked", "ring-4")
    assert params["link_bytes"] == {f"chip{i}->chip{(i + 1) % 4}": 6 * 1024 for i in range(4)}
    assert row["off_chip_bytes"] == 0 and row["hardware_name"] == "step-eval"


def test_the_default_ring_streams_its_chunks_in_tiles(capsys):
    """The default algorithm: 1 MiB on ring-4, 256 KiB chunks in two 128 KiB tiles (tau = rho = 2048 cycles on a
    link and to read from on-chip memory). The send stage takes rho; a reduce-scatter step starts a tile's hop and add
    after the one before (500 + 2048 + 2048 = 4596, more than its 2 x 2048 on the wire; the last one also feeds the
    store, + 1); an all-gather step starts when the one before has left the link (4096); the last step's 4096 on
    the wire, its latency and the store's edge: 2048 + 2 x 4596 + 4597 + 2 x 4096 + 4096 + 500 + 1, equal to the
    closed-form estimate (ring-chunked: 6 x (500 + 4096) + 3 x 8192 + 1 = 52,153)."""
    row = _json(capsys, ["run", "collective", "--functional", "--check", "--json"])
    params = json.loads(row["params"])
    assert (row["op"], row["bytes"], row["algorithm"], row["system"], params["tiles_per_chunk"]) == (
        "all-reduce", 1 << 20, "ring", "ring-4", 2)
    assert row["cycles"] == params["closed_form_cycles"] == 2048 + 2 * 4596 + 4597 + 3 * 4096 + 500 + 1 == 28_626
    assert row["check_passed"] is True


def test_a_system_file_with_its_own_hardware_and_a_functional_check(tmp_path, capsys):
    (tmp_path / "hw.toml").write_text('preset = "step-hdl"\n')
    (tmp_path / "sys.toml").write_text('chips = 3\nhardware = "hw.toml"\ntopology = "switch"\nlink_bandwidth = 32\n'
                                       'link_latency = 40\n')
    row = _json(capsys, ["run", "collective", "--op", "all-gather", "--algorithm", "direct", "--bytes", "1536",
                         "--system", str(tmp_path / "sys.toml"), "--functional", "--check", "--json"])
    # 512 B chunks, 16 cycles per link; each up-link sends its chunk twice: 2 * 40 + 3 * 16
    assert row["cycles"] == 2 * 40 + 3 * 16 == 128
    assert row["hardware_name"] == "step-hdl" and row["check_passed"] is True


def test_the_unit_table_has_each_links_bytes_busy_cycles_and_occupancy(tmp_path, capsys):
    out = tmp_path / "run.parquet"
    row = _json(capsys, ["run", "collective", "--op", "reduce-scatter", "--bytes", "8192", "--system", "ring-2",
                         "--out", str(out), "--json"])
    units = pq.read_table(tmp_path / "run_units.parquet").to_pylist()
    links = [u for u in units if u["kind"] == "Link"]
    assert [(u["name"], u["bytes"], u["busy_cycles"], u["fires"]) for u in links] == [
        ("chip0->chip1", 4096, 64, 1), ("chip1->chip0", 4096, 64, 1)]
    assert all(u["utilization"] == 64 / row["cycles"] for u in links)
    assert all(u["bytes"] is None for u in units if u["kind"] != "Link")


@pytest.mark.parametrize("argv, line", [
    (["--bytes", "100"], "stepsim: error: --bytes 100 must be a multiple of 16 (4 chunks of fp32 elements); e.g. 96"),
    (["--op", "all-to-all"], "stepsim: error: all-to-all is direct only (each chunk routed straight to its chip): "
                             "use --algorithm direct"),
    (["--hardware", "step-hdl"], "stepsim: error: --hardware does not apply to workload 'collective': the system "
                                 "file names the chips' hardware"),
    (["--system", "ring-3"], "stepsim: error: unknown system preset 'ring-3'; known presets: fully-connected-8, "
                             "ring-2, ring-4, ring-8, sn40l-16, sn40l-8, switch-8, torus-4x4"),
    (["--tile-n", "4"], "stepsim: error: --tile-n does not apply to workload 'collective' (it applies to: moe, "
                        "swiglu, prefill_attention, mla_attention, mla_prefill, sliding_attention, decoder)"),
])
def test_bad_collective_runs_are_one_line(capsys, argv, line):
    assert _status(["run", "collective", *argv]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [line]


def test_a_bad_system_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('chips = 3\ntopology = "custom"\nlink_bandwidth = 8\nlink_latency = 4\n[[link]]\nsrc = 0\ndst = 7\n')
    assert _status(["run", "collective", "--system", str(bad)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"stepsim: error: {bad} link 0: dst = 7 names no chip (chips are 0..2)"]


def test_the_run_id_follows_the_system_files_content(tmp_path):
    path = tmp_path / "sys.toml"
    path.write_text('chips = 2\ntopology = "ring"\nlink_bandwidth = 8\nlink_latency = 4\n')
    config = {"workload": "collective", "system": str(path), "bytes": 64}
    first = run_identity(config)[0]
    path.write_text('chips = 2\ntopology = "ring"\nlink_bandwidth = 8\nlink_latency = 5\n')
    assert run_identity(config)[0] != first
    assert run_identity({**config, "system": "ring-2"})[0] != first
