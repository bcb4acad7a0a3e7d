"""Wall time of ``stepsim optimize moe --max-chips 8`` over tensor x expert parallelism, Qwen3-30B-A3B's bundled
B=64 trace (``--jobs 2``).

The space (a ``--space`` file written from :func:`stepsim.optimize.chips.parallel_grids`, the generator of the
default space): static tiling, tile_n 32, tile_f 32 or 64, on one chip and on every ``(tp, ep)`` with
``tp x ep <= 8`` (ep 2 / 4 / 8 in the three placements, tp 2 / 4 / 8 where the tile splits: tp 8 only with
tile_f 32): 43 candidates, each a full-size layer. Reported: wall time, counts, the front. Asserted
(deterministic): the counts, the front, the fastest cycles per chip count, every simulated point at least its
lower bound, and tp / ep read back from the Parquet file.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from stepsim.optimize.chips import parallel_grids

#: the front: (cycles, chips, tp, ep, placement), tile_f 32 on every point (deterministic). Since branches epcost
#: (``--ep`` alone) and epdyn (``--tp x --ep``) load-balanced minimizes the no-regions cost model: ep 8 load-balanced
#: (109,923) is the fastest on 8 chips, ep 4 load-balanced (211,984) joins the front, and load-balanced keeps
#: contiguous on tp 2 x ep 2 and on ep 2 (the same point twice)
FRONT = [(109_923, 8, 1, 8, "load-balanced"), (208_013, 4, 2, 2, "contiguous"), (208_013, 4, 2, 2, "load-balanced"),
         (211_984, 4, 1, 4, "load-balanced"), (405_318, 2, 2, 1, None), (407_412, 2, 1, 2, "contiguous"),
         (407_412, 2, 1, 2, "load-balanced"), (798_186, 1, 1, 1, None)]
FASTEST = {"1": 798_186, "2": 405_318, "4": 208_013, "8": 109_923}


def space_toml() -> str:
    """The space as ``[[axes]]`` tables (module docstring)."""
    grids = parallel_grids([{"tiling": ("static",), "tile_n": (32,), "tile_f": (32, 64)}], 8, axes=("tp", "ep"),
                           experts=128, widths=(768,), batch=64)
    return "\n".join("[[axes]]\n" + "".join(f"{k} = {json.dumps(list(v))}\n" for k, v in g.items()) for g in grids)


def test_optimize_moe_over_tp_and_ep_wall_time(benchmark, bench_summary, json_command_once, tmp_path):
    space = tmp_path / "space.toml"
    space.write_text(space_toml())
    out = tmp_path / "opt"
    argv = ["optimize", "moe", "--model", "qwen3-30b-a3b", "--max-chips", "8", "--space", str(space), "--jobs", "2",
            "--out", str(out), "--json", "--no-progress"]
    report, wall = json_command_once(argv)
    counts = (report["candidates"], report["pruned_symbolically"], report["simulations"])
    assert counts == (43, 4, 39)
    assert [(p["cycles"], p["chips"], p["tp"], p["ep"], p["config"].get("placement")) for p in report["pareto"]] \
        == FRONT
    assert {p["config"]["tile_f"] for p in report["pareto"]} == {32}
    assert {n: p["cycles"] for n, p in report["per_chips"].items()} == FASTEST
    rows = pq.read_table(out / "candidates.parquet").to_pylist()
    assert all(r["lower_bound"] <= r["cycles"] for r in rows if r["status"] == "simulated")
    assert sorted((r["tp"] or 1) * (r["ep"] or 1) for r in rows) == sorted(r["chips"] for r in rows)
    benchmark.extra_info.update(wall_s=wall, candidates=counts[0], simulations=counts[2])
    bench_summary("stepsim optimize moe --max-chips 8 --jobs 2 (Qwen3 B=64, tp x ep, 43 candidates)",
                  f"{wall:6.1f} s  {counts[0]} candidates, {counts[2]} simulations; fastest per chip count "
                  + ", ".join(f"{n}: {c:,}" for n, c in FASTEST.items()))
