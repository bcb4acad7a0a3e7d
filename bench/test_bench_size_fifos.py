"""Wall time and simulation count of ``stepsim size-fifos`` on full-size Qwen3-30B-A3B MoE layers.

* B=64: the real routing batch ``qwen_b64/032_012.npz`` (../shared/traces), static tile 32, one region per expert.
* B=1024: a synthetic skewed routing batch (Dirichlet alpha 0.3, seed 1; the case that deadlocks at the
  experiments' FIFO depth of 2, as the real B=1024 traces do), static tile 32 with one region per expert and
  with 64 time-multiplexed regions.

One round each (seconds to minutes of work). Reported: wall time of the command, simulations, cycles vs
unbounded, FIFO bytes sized / LP / uniform / 1024-deep. Asserted: the command succeeds, the sized cycles are
within the 1 % slack (deterministic), and the sized bytes are at least 100x below 1024-deep FIFOs.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from stepsim.cli import main
from stepsim.trace_io.synthetic import synthetic_routing

CASES = {"b64-static32": (64, ["--tiling", "static", "--tile-n", "32"]),
         "b1024-static32": (1024, ["--tiling", "static", "--tile-n", "32"]),
         "b1024-static32-regions64": (1024, ["--tiling", "static", "--tile-n", "32", "--regions", "64"])}


@pytest.fixture(scope="module")
def b1024_trace(tmp_path_factory):
    table = synthetic_routing(1024, 128, 8, seed=1, skew="dirichlet", alpha=0.3)
    routing = np.stack(table.column("expert_ids").to_numpy(zero_copy_only=False)).astype(np.int64)
    path = tmp_path_factory.mktemp("b1024") / "000_001.npz"
    np.savez(path, data=routing)
    return str(path)


@pytest.mark.traces
@pytest.mark.parametrize("case", list(CASES))
def test_size_fifos_wall_time(benchmark, bench_summary, shared_traces, b1024_trace, tmp_path, capsys, case):
    batch, flags = CASES[case]
    trace = str(shared_traces / "expert_routing" / "qwen_b64" / "032_012.npz") if batch == 64 else b1024_trace
    argv = ["size-fifos", "moe", "--model", "qwen3-30b-a3b", "--trace", trace, *flags,
            "--out", str(tmp_path / "depths.toml"), "--json"]
    codes = []
    t0 = time.perf_counter()
    benchmark.pedantic(lambda: codes.append(main(argv)), rounds=1, iterations=1, warmup_rounds=0)
    wall = time.perf_counter() - t0
    assert codes == [0]
    report = json.loads(capsys.readouterr().out)
    assert report["cycles"] <= int(report["unbounded_cycles"] * 1.01)
    assert report["total_fifo_bytes"] * 100 <= report["unbounded_fifo_bytes"]
    benchmark.extra_info.update(wall_s=wall, **report)
    bench_summary("stepsim size-fifos (Qwen3-30B-A3B, full size)",
                  f"{case:<26} {wall:6.1f} s  {report['simulations']:3d} sims (+{report['uniform_simulations']} "
                  f"uniform)  cycles {report['cycles']:,} vs {report['unbounded_cycles']:,}  FIFO MB: sized "
                  f"{report['total_fifo_bytes'] / 1e6:,.1f}, LP {report['lp_fifo_bytes'] / 1e6:,.1f}, uniform(d="
                  f"{report['uniform_depth']}) {report['uniform_fifo_bytes'] / 1e6:,.1f}, 1024-deep "
                  f"{report['unbounded_fifo_bytes'] / 1e6:,.0f}")
