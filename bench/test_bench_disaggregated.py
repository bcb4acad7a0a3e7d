"""Issue 42's disaggregated serving at full size: the whole Azure conversation trace (19,366 requests),
Qwen3-30B-A3B (48 layers), ``--disaggregate 1:1`` on ``sn40l-16``, ``--iteration-latency 0.02``, the decode pool
replayed by the compiled loop (:func:`stepsim.serve.replay_compiled.compiled_decode_pool`) and by the Python
reference (:func:`stepsim.serve.disaggregated._decode_pool_reference`) side by side in one run, each through
``serve_disaggregated(..., out=DIR)``. Gate: every file both write is byte for byte the same (``summary.json`` but
for its ``wall_s``). Numbers: bench/README.md, "Disaggregated serving".
"""

from __future__ import annotations

import json
import os
import time

import stepsim.serve.disaggregated as disaggregated
import stepsim.serve.replay_compiled as replay_compiled
from stepsim.serve.disaggregated_serve import serve_disaggregated

SECTION = "disaggregated: the whole conversation trace, Qwen3-30B-A3B, 1:1 on sn40l-16, --iteration-latency 0.02"


def _serve(trace, out) -> tuple[float, dict]:
    t0 = time.perf_counter()
    result = serve_disaggregated("qwen3-30b-a3b", trace, disaggregate="1:1", system="sn40l-16",
                                 iteration_latency=0.02, out=out)
    return time.perf_counter() - t0, result.summary


def test_decode_pool_side_by_side(shared_traces, bench_summary, benchmark, monkeypatch, tmp_path):
    trace = shared_traces / "azure" / "AzureLLMInferenceTrace_conv.csv"
    replay_compiled.warm()  # load (or compile) the kernel outside the timings
    with monkeypatch.context() as m:
        m.setattr(replay_compiled, "compiled_decode_pool", lambda *a, **k: None)
        old_s, old = _serve(trace, tmp_path / "old")
    runs = []
    benchmark.pedantic(lambda: runs.append(_serve(trace, tmp_path / "new")), rounds=1, iterations=1)
    new_s, new = runs[-1]
    names = sorted(p.name for p in (tmp_path / "old").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "new").iterdir())
    for name in names:
        a, b = ((tmp_path / d / name).read_bytes() for d in ("old", "new"))
        if name == "summary.json":
            a, b = ({k: v for k, v in json.loads(x).items() if k != "wall_s"} for x in (a, b))
        assert a == b, name
    assert new["completed"] == 19366 and disaggregated is not None
    load = os.getloadavg()[0]
    x = new["disaggregated"]["kv_transfer"]
    bench_summary(SECTION, f"serve {new_s:.1f} s compiled decode pool vs {old_s:.1f} s Python "
                           f"({old_s / new_s:.1f}x); {new['iterations']:,} steps; {x['bytes'] / 1e9:,.0f} GB of KV "
                           f"in {x['seconds']:.1f} s of link time; TTFT p99 {new['ttft_s']['p99'] * 1e3:.1f} ms; "
                           f"files identical; load {load:.1f}")
