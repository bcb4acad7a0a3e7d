"""Wall time of ``stepsim optimize moe --max-chips 8`` on Qwen3-30B-A3B's bundled B=64 trace (``--jobs 2``).

The space (a ``--space`` file): static tiling, tile_n 32, tile_f 64 on one chip, and with expert parallelism on
2, 4 and 8 chips (the divisors of 128 up to the budget) in each of the three placements: 10 candidates, each a
full-size layer. Reported: wall time, counts, the fastest point per chip count. Asserted (deterministic): the
counts, the fastest cycles per chip count (docs/system.md's table: 800,809 on one chip, contiguous 409,441 on 2
(load-balanced keeps it), load-balanced 215,489 on 4 and 112,683 on 8 (the no-regions cost model since branch
epcost; before it 232,754 on 4, by tiles since branch lbplace, round-robin 232,868 before that, and contiguous
133,578 on 8), every simulated point at least its lower bound, and the
candidates' and front's ``chips`` read back from the Parquet files. Since epcost 2 of the 10 are pruned by their
bounds (8 simulations, 10 before): contiguous and round-robin on 8 chips (bounds 123,926 and 133,142 cycles, above
load-balanced's 112,683).
"""

from __future__ import annotations

import pyarrow.parquet as pq

SPACE = """
[[axes]]
tiling = ["static"]
tile_n = [32]
tile_f = [64]

[[axes]]
tiling = ["static"]
tile_n = [32]
tile_f = [64]
ep = [2, 4, 8]
placement = ["contiguous", "round-robin", "load-balanced"]
"""
#: fastest cycles per chip count (deterministic)
FASTEST = {"1": 800_809, "2": 409_441, "4": 215_489, "8": 112_683}


def test_optimize_moe_over_chips_wall_time(benchmark, bench_summary, json_command_once, tmp_path):
    space = tmp_path / "space.toml"
    space.write_text(SPACE)
    out = tmp_path / "opt"
    argv = ["optimize", "moe", "--model", "qwen3-30b-a3b", "--max-chips", "8", "--space", str(space), "--jobs", "2",
            "--out", str(out), "--json", "--no-progress"]
    report, wall = json_command_once(argv)
    counts = (report["candidates"], report["pruned_symbolically"], report["simulations"])
    assert counts == (10, 2, 8)
    assert {n: p["cycles"] for n, p in report["per_chips"].items()} == FASTEST
    rows = pq.read_table(out / "candidates.parquet").to_pylist()
    assert sorted(r["chips"] for r in rows) == [1, 2, 2, 2, 4, 4, 4, 8, 8, 8]
    assert all(r["lower_bound"] <= r["cycles"] for r in rows if r["status"] == "simulated")
    # on 2 chips load-balanced keeps contiguous: two points of the same objectives, both on the front
    assert pq.read_table(out / "pareto.parquet").column("chips").to_pylist() == [8, 4, 2, 2, 1]
    benchmark.extra_info.update(wall_s=wall, candidates=counts[0], simulations=counts[2])
    bench_summary("stepsim optimize moe --max-chips 8 --jobs 2 (Qwen3 B=64, 10 candidates)",
                  f"{wall:6.1f} s  {counts[0]} candidates, {counts[2]} simulations; fastest per chip count "
                  + ", ".join(f"{n}: {c:,}" for n, c in FASTEST.items()))
