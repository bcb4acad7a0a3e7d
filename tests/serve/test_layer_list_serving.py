"""Serving heterogeneous models layer group by layer group (issue 43, stepsim/serve/layer_list.py): gpt-oss's
sliding and full layers, Llama 4's chunked dense and global MoE layers, DeepSeek-V3's MLA with a dense first layer,
each at --fidelity exact and fast (the fast model's error against exact measured and pinned), on small test configs
(tests/serve/data: 2 layers; DeepSeek-V3 narrowed to D = 2,048 and 64 experts, its latent 512 + 64 kept) and a
6-request trace, so each model's pair of runs takes well under a minute."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import stepsim
from stepsim.base.errors import ConfigError
from stepsim.models.layers import LayerKind
from stepsim.models.presets import resolve_model
from stepsim.serve.api import engine_provider, resolve_serving_hardware
from stepsim.serve.latency import IterationBatch
from stepsim.serve.layer_list import exact_layer_list, group_model, group_seed, seen_batch

DATA = Path(__file__).resolve().parent / "data"
OSS = str(DATA / "gpt-oss-20b-2layers.json")
MAVERICK = str(DATA / "llama-4-maverick-2layers.json")
DEEPSEEK = str(DATA / "deepseek-v3-narrow-2layers.json")


def _trace(tmp_path) -> Path:
    path = tmp_path / "requests.csv"
    rows = [(300, 12), (150, 10), (40, 8), (600, 6), (90, 14), (200, 9)]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:46.{6805900 + 100000 * i:07d},{p},{o}\n" for i, (p, o) in enumerate(rows)))
    return path


def test_a_layer_sees_its_window_its_chunk_or_everything():
    batch = IterationBatch([100, 127, 128, 8191, 8192, 20_000], [1, 1, 1, 1, 1, 30], 30, 5)
    sliding = seen_batch(LayerKind("sliding", 128, True, "moe", False), batch)
    assert sliding.context_tokens == [100, 127, 127, 127, 127, 127]  # 127 cached + the new token: the window
    chunked = seen_batch(LayerKind("chunked", 8192, False, "dense", False), batch)
    assert chunked.context_tokens == [100, 127, 128, 8191, 0, 20_000 - 2 * 8192]  # the tokens of its own chunk
    assert seen_batch(LayerKind("mla", None, False, "moe", True), batch) is batch
    assert (chunked.new_tokens, chunked.prefill_tokens, chunked.decode_tokens) == ([1] * 5 + [30], 30, 5)


def test_each_group_runs_as_one_homogeneous_model():
    ds = resolve_model("deepseek-v3")
    mla_moe = group_model(ds, LayerKind("mla", None, False, "moe", True), 58)
    # absorbed MLA: one latent "KV head" of 512 + 64 read by all 128 query heads
    assert (mla_moe.layers, mla_moe.heads, mla_moe.kv_heads, mla_moe.head_dim, mla_moe.is_mla) == (58, 128, 1, 576,
                                                                                                     False)
    assert (mla_moe.experts, mla_moe.top_k, mla_moe.shared_intermediate, mla_moe.unmodelled()) == (256, 8, 2048, [])
    dense = group_model(ds, LayerKind("mla", None, False, "dense", False), 3)
    assert (dense.is_moe, dense.dense_intermediate, dense.layers) == (False, 18432, 3)
    oss = group_model(resolve_model("gpt-oss-20b"), LayerKind("sliding", 128, True, "moe", False), 12)
    assert (oss.layer_types, oss.sliding_window, oss.attention_sinks, oss.kv_heads, oss.head_dim) == ((), None, False,
                                                                                                      8, 64)
    assert [group_seed(0, g) for g in range(3)] == [0, 1_000_003, 2_000_006]


def test_a_sliding_layers_decode_stops_growing_at_the_window():
    """gpt-oss (2 layers: sliding 128, full), one decode step of 4 requests, exact: the sliding group's attention
    cycles are the same at 300 and 3,000 cached tokens, the full group's grow."""
    model = resolve_model(OSS)
    hw = resolve_serving_hardware("sn40l")
    latency = exact_layer_list(model, lambda sub, g: engine_provider(
        sub, OSS, hw, None, seed=group_seed(0, g), max_model_len=4096, vocab=201088, jobs=None, schedule="paper"))
    cycles = {}
    for context in (300, 3000):
        batch = IterationBatch([context] * 4, [1] * 4, 0, 4)
        cycles[context] = [g.inner(seen_batch(kind, batch)).cycles["attention"] for kind, _, g in latency.groups]
    latency.close()
    sliding, full = zip(cycles[300], cycles[3000])
    assert sliding[0] == sliding[1] and full[1] > 5 * full[0]
    assert cycles == MEASURED_ATTENTION


#: measured 2026-11-25: attention cycles of the sliding and the full group at 300 and 3,000 cached tokens
MEASURED_ATTENTION = {300: [4704, 8640], 3000: [4704, 63744]}


def _compare(exact, fast) -> tuple:
    """``(steps, TTFT / TPOT mean and p99 of fast against exact (%), fast's held-out error (%))``."""
    e, f = exact.summary, fast.summary
    diff = {f"{k[:-2]} {q}": round((f[k][q] / e[k][q] - 1) * 100, 2) for k in ("ttft_s", "tpot_s")
            for q in ("mean", "p99")}
    error = {k: round(v * 100, 2) for k, v in f["fidelity"]["error"].items() if k.startswith("iteration")}
    return e["iterations"], f["iterations"], diff, error


#: measured 2026-11-25 on sn40l, paper schedules, seed 0: steps exact / fast, fast against exact (%), held-out error
MEASURED = {
    # a 6-request window leaves the fast fit few samples: gpt-oss's sliding group is fitted worst. In both models'
    # fast runs a group's fit priced some steps below that group's own roofline (5 of gpt-oss's 23 steps, 4 of
    # Maverick's 15), hidden in the list's utilisation by the other group (at most 0.889 and 0.557): each group is
    # floored at its roofline since 2026-11-26 (FastLatency._floored; the held-out errors, measured on the fitted
    # pieces, unchanged). Before, gpt-oss's TTFT mean / p99 and TPOT mean / p99 against exact were +84.14 / +94.92
    # / +111.34 / +105.11 %, Maverick's -21.95 / -22.12 / +17.73 / -5.56 %
    "gpt-oss-20b-2layers.json": (29, 23, {"ttft mean": 87.5, "ttft p99": 95.21, "tpot mean": 121.38,
                                          "tpot p99": 114.14},
                                 {"iteration_p50": 77.09, "iteration_p95": 272.2, "iteration_max": 314.7}),
    "llama-4-maverick-2layers.json": (15, 15, {"ttft mean": -21.69, "ttft p99": -22.12, "tpot mean": 21.59,
                                               "tpot p99": -4.13},
                                      {"iteration_p50": 22.97, "iteration_p95": 44.31, "iteration_max": 53.44}),
    # routed through DeepSeek-V3's group limit (serve/group_synthetic.py; before it, 0.0 / 4.74 / 5.63 % held out):
    # a token's experts in 4 of the 8 groups vary a step's FFN more than the 54 steps' fit follows
    "deepseek-v3-narrow-2layers.json": (54, 54, {"ttft mean": 2.05, "ttft p99": 0.14, "tpot mean": 4.16,
                                                 "tpot p99": 13.78},
                                        {"iteration_p50": 0.0, "iteration_p95": 57.87, "iteration_max": 78.37}),
}


@pytest.mark.parametrize("path", [OSS, MAVERICK, DEEPSEEK], ids=["gpt-oss-20b", "llama-4-maverick", "deepseek-v3"])
def test_exact_and_fast_serve_a_heterogeneous_model(path, tmp_path):
    trace = _trace(tmp_path)
    exact = stepsim.serve(path, trace, fidelity="exact", schedule="paper")
    fast = stepsim.serve(path, trace, fidelity="fast", schedule="paper", calibration_cache=tmp_path / "cache")
    groups = [(g["layers"], g["kind"]) for g in exact.summary["fidelity"]["groups"]]
    assert groups == [(g["layers"], g["kind"]) for g in fast.summary["fidelity"]["groups"]] == GROUPS[Path(path).name]
    assert exact.summary["fidelity"]["simulations"] == sum(g["simulations"] for g in exact.summary["fidelity"]["groups"])
    assert exact.summary["completed"] == fast.summary["completed"] == 6
    got = _compare(exact, fast)
    print(Path(path).name, got)
    assert got == MEASURED[Path(path).name]


GROUPS = {
    "gpt-oss-20b-2layers.json": [([0], "sliding 128 + sinks + moe"), ([1], "full + sinks + moe")],
    "llama-4-maverick-2layers.json": [([0], "chunked 8192 + dense"), ([1], "full + moe (shared)")],
    "deepseek-v3-narrow-2layers.json": [([0], "mla + dense"), ([1], "mla + moe (shared)")],
}


def test_a_routed_experts_file_is_refused_in_fast_mode_for_a_layer_list_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    np.savez("x.npz", routed_experts=np.zeros((4, 2, 4), dtype=np.int64))
    with pytest.raises(ConfigError, match=r"^--routing x.npz with --fidelity fast: model '.*gpt-oss-20b-2layers.json' "
                                          r"is served layer group by layer group, whose fast calibrations draw "
                                          r"synthetic routing only \(issue 43\); use --fidelity exact to replay the "
                                          r"file$"):
        stepsim.serve(OSS, _trace(tmp_path), fidelity="fast", routing="x.npz")


def _dump(path, experts) -> str:
    np.savez(path, routed_experts=experts)
    return str(path)


def test_exact_mode_replays_a_routed_experts_file_group_by_group(tmp_path):
    """The narrowed DeepSeek-V3 (a dense layer 0, an MoE layer 1 of 64 experts, top-8): the dump's layer axis is
    the model's layers; the MoE group replays column 1, token row after token row, and column 0 (a dense layer)
    is never read."""
    rng = np.random.default_rng(7)
    experts = np.stack([np.stack([rng.permutation(64)[:8] for _ in range(2)]) for _ in range(512)])
    assert experts.shape == (512, 2, 8)
    trace = tmp_path / "requests.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,96,4\n"
                     "2023-11-16 18:15:46.7805900,48,3\n")

    def run(name, routed):
        return stepsim.serve(DEEPSEEK, trace, fidelity="exact", schedule="paper",
                             routing=_dump(tmp_path / name, routed))

    replayed = run("a.npz", experts)
    other_dense = experts.copy()
    other_dense[:, 0, :] = np.arange(8)  # the dense layer's column: not read
    assert run("b.npz", other_dense).iterations.equals(replayed.iterations)
    skewed = experts.copy()
    skewed[:, 1, :] = np.arange(8)  # every token to experts 0-7 in the MoE layer
    ffn = [replayed.iterations["cycles_ffn"].to_pylist(), run("c.npz", skewed).iterations["cycles_ffn"].to_pylist()]
    synthetic = stepsim.serve(DEEPSEEK, trace, fidelity="exact", schedule="paper").iterations["cycles_ffn"].to_pylist()
    assert ffn == MEASURED_REPLAY
    assert synthetic != ffn[0]
    with pytest.raises(ConfigError, match=r"^--routing .*d.npz: the dump has 1 layers; the model has 2$"):
        run("d.npz", experts[:, 1:, :])  # the dump's layer axis is the model's layers: column 1 alone is refused


#: measured 2026-11-25: each step's FFN cycles replaying the dump, and with every token sent to experts 0-7 (the
#: prompts' steps read 8 experts' weights instead of up to 64; a decode step's experts each take one tile either way)
MEASURED_REPLAY = [[1223978, 323677, 323677, 323677, 876355, 323677, 323677],
                   [964916, 323677, 323677, 323677, 635573, 323677, 323677]]
