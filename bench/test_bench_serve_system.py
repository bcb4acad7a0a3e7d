"""Serving on a system (issue 32/34): ``--fidelity exact --system ring-2`` with the sharded MoE block built once per
token count and rebound per step, against building it fresh for every step (the baseline, in the same run).

* ``test_sharded_rebinding_versus_building``: 16 one-token decode steps and 4 prefill steps (112 tokens) of the
  MoE block of ``examples/qwen3-30b-a3b-4layers.json`` (128 experts, top-8) on ``ring-2``, priced fresh
  (:meth:`stepsim.serve.layers.LayerRunner.fresh_cycles`) and through the templates (``LayerRunner.cycles``).
  Asserts the cycles are identical; reports build + lowering, rebinding and engine time per piece.
* ``test_serve_system_exact_wall_times``: whole serve runs, the docs/serving.md §13 example (3 requests) and a
  16-request window, with templates and with every sharded block built fresh (``LayerRunner.cycles`` patched to
  ``fresh_cycles``, the behaviour before); asserts the two runs' steps are identical, reports both wall times.
* ``test_deepseek_v3_fast_against_exact_two_layers`` (issue 43): DeepSeek-V3 at full width with its layers cut to
  two (one dense, one MoE; the 61-layer model's exact runs take hours of layer simulations) on ``sn40l-16``,
  exact and fast on the first 20 requests of the conversation trace: fast's TTFT / TPOT means against exact and its
  held-out error.
* ``test_deepseek_v3_fast_on_16_sockets`` (issue 43's must-show): the whole DeepSeek-V3 on ``sn40l-16`` with
  96 GiB a socket (``examples/hardware_sn40l_hbm96.toml``: in bf16 it does not fit the preset's 64 GiB),
  ``--fidelity fast`` on 2,000 requests of the conversation trace: wall time (cold calibration), the load, the
  held-out error.

Nothing asserts on time.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

import stepsim
from stepsim.base.system import System
from stepsim.models.presets import resolve_model
from stepsim.serve.exact import max_kv_rows
from stepsim.serve.layers import LayerRunner, LayerSpec
from stepsim.serve.routing import SyntheticRouting
from stepsim.trace_io.requests import RequestTrace, write_requests

MODEL = Path(__file__).resolve().parents[1] / "examples" / "qwen3-30b-a3b-4layers.json"


def test_sharded_rebinding_versus_building(bench_summary):
    system = System.preset("ring-2")
    spec = LayerSpec(resolve_model(str(MODEL)), system.hardware, max_kv_rows(4096), system=system)
    routing = SyntheticRouting(128, 8, 1, seed=0)
    pieces = [routing.route(1)[:, 0, :] for _ in range(16)] + [routing.route(112)[:, 0, :] for _ in range(4)]
    fresh = LayerRunner(spec)
    fresh_cycles = [fresh.fresh_cycles("ffn", data) for data in pieces]
    bound = LayerRunner(spec)
    cycles = [bound.cycles("ffn", data) for data in pieces]
    assert cycles == fresh_cycles and (fresh.builds, bound.builds, bound.runs) == (20, 2, 20)
    n = len(pieces)
    section = "serve --system ring-2: the sharded MoE block, fresh vs template (20 pieces)"
    bench_summary(section, f"fresh: build+lower {fresh.build_s / n * 1e3:.1f} ms/piece, engine "
                           f"{fresh.engine_s / n * 1e3:.1f} ms/piece, total {fresh.build_s + fresh.engine_s:.2f} s")
    bench_summary(section, f"templates: {bound.builds} built in {bound.build_s:.2f} s, rebinding "
                           f"{bound.bind_s / n * 1e6:.0f} us/piece, engine {bound.engine_s / n * 1e3:.1f} ms/piece, "
                           f"total {bound.build_s + bound.bind_s + bound.engine_s:.2f} s; ratio "
                           f"{(fresh.build_s + fresh.engine_s) / (bound.build_s + bound.bind_s + bound.engine_s):.2f}x")


def _requests(path, arrival, prompt, output):
    n = len(arrival)
    return write_requests(RequestTrace(str(path), np.arange(n, dtype=np.int64), np.asarray(arrival, np.float64),
                                       np.asarray(prompt, np.int64), np.asarray(output, np.int64)), path)


def test_serve_system_exact_wall_times(bench_summary, tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    traces = {"§13 example (3 requests)": _requests(tmp_path / "ex.parquet", [0.0] * 3, [64, 32, 16], [4] * 3),
              "16 requests in 20 ms": _requests(tmp_path / "w16.parquet", np.sort(rng.uniform(0, 0.02, 16)),
                                                rng.integers(5, 200, 16), rng.integers(2, 16, 16))}
    section = "serve --system ring-2 --fidelity exact, examples/qwen3-30b-a3b-4layers.json"
    for name, trace in traces.items():
        walls, runs = {}, {}
        for mode in ("templates", "fresh"):  # templates first: one-time costs count against them
            with monkeypatch.context() as m:
                if mode == "fresh":  # the behaviour before: every sharded block built for its step
                    m.setattr(LayerRunner, "cycles", LayerRunner.fresh_cycles)
                t0 = time.perf_counter()
                runs[mode] = stepsim.serve(str(MODEL), trace, fidelity="exact", schedule="paper", system="ring-2")
                walls[mode] = time.perf_counter() - t0
        assert runs["fresh"].iterations.equals(runs["templates"].iterations)
        s = runs["templates"].summary
        bench_summary(section, f"{name}: {s['iterations']} steps, fresh {walls['fresh']:.2f} s, templates "
                               f"{walls['templates']:.2f} s, ratio {walls['fresh'] / walls['templates']:.2f}x")


TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure" / "AzureLLMInferenceTrace_conv.csv"
HBM96 = Path(__file__).resolve().parents[1] / "examples" / "hardware_sn40l_hbm96.toml"


def _load() -> str:
    import os

    return "load {:.1f} / {:.1f} / {:.1f}".format(*os.getloadavg())


def test_deepseek_v3_fast_against_exact_two_layers(bench_summary, tmp_path):
    import json

    from stepsim.models.presets import resolve_model

    ds = resolve_model("deepseek-v3")
    config = {"model_type": "deepseek_v3", "hidden_size": ds.hidden, "intermediate_size": ds.dense_intermediate,
              "moe_intermediate_size": ds.expert_intermediate, "n_routed_experts": ds.experts,
              "num_experts_per_tok": ds.top_k, "n_shared_experts": ds.shared_experts, "n_group": ds.n_group,
              "topk_group": ds.topk_group, "scoring_func": "sigmoid", "routed_scaling_factor": 2.5,
              "first_k_dense_replace": 1, "moe_layer_freq": 1, "num_attention_heads": ds.heads,
              "num_key_value_heads": ds.heads, "kv_lora_rank": ds.kv_lora_rank, "q_lora_rank": ds.q_lora_rank,
              "qk_rope_head_dim": ds.qk_rope_head_dim, "qk_nope_head_dim": ds.qk_nope_head_dim,
              "v_head_dim": ds.v_head_dim, "num_hidden_layers": 2, "vocab_size": 129280,
              "max_position_embeddings": 163840, "tie_word_embeddings": False}
    model = tmp_path / "deepseek-v3-2layers.json"
    model.write_text(json.dumps(config))
    runs, walls = {}, {}
    for fidelity in ("exact", "fast"):
        t0 = time.perf_counter()
        runs[fidelity] = stepsim.serve(str(model), TRACE, limit_requests=20, fidelity=fidelity, schedule="paper",
                                       system="sn40l-16", calibration_cache=tmp_path / "cache")
        walls[fidelity] = time.perf_counter() - t0
    e, f = runs["exact"].summary, runs["fast"].summary
    diff = ", ".join(f"{k[:-2]} {q} {(f[k][q] / e[k][q] - 1) * 100:+.2f} %" for k in ("ttft_s", "tpot_s")
                     for q in ("mean", "p99"))
    error = ", ".join(f"{k} {v * 100:.2f} %" for k, v in f["fidelity"]["error"].items() if k.startswith("iteration"))
    bench_summary("DeepSeek-V3 (full width, 2 layers) on sn40l-16, 20 conversation requests",
                  f"exact {e['iterations']} steps in {walls['exact']:.0f} s, fast {f['iterations']} steps in "
                  f"{walls['fast']:.0f} s (cold calibration); fast against exact: {diff}; held-out {error}; {_load()}")


def test_deepseek_v3_fast_on_16_sockets(bench_summary, tmp_path):
    t0 = time.perf_counter()
    result = stepsim.serve("deepseek-v3", TRACE, limit_requests=2000, fidelity="fast", schedule="paper",
                           system="sn40l-16", hardware=str(HBM96), calibration_cache=tmp_path / "cache")
    wall = time.perf_counter() - t0
    s = result.summary
    assert s["completed"] == 2000
    error = ", ".join(f"{k} {v * 100:.2f} %" for k, v in s["fidelity"]["error"].items() if k.startswith("iteration"))
    bench_summary("DeepSeek-V3 on sn40l-16 (96 GiB a socket), 2,000 conversation requests, --fidelity fast",
                  f"{s['iterations']} steps, wall {wall:.0f} s (cold calibration), TTFT mean {s['ttft_s']['mean']:.3f} s, "
                  f"TPOT mean {s['tpot_s']['mean'] * 1e3:.2f} ms; held-out {error}; {_load()}")
