"""Every fast provider floors its step at its roofline (:meth:`stepsim.serve.fast.FastLatency._floored`): the
paper-schedule provider on one chip, on a system's chips (:class:`~stepsim.serve.system_fast.SystemFastLatency`,
the roofline's peaks the chips' side by side), a dense model's mapped tensor-parallel shards
(:class:`~stepsim.serve.system_fast.MappedSystemFastLatency`) and each group of a layer list
(:mod:`stepsim.serve.layer_list`); one chip's mapped layers in tests/serve/test_replay_mapped.py. Coefficients of zeros price every
piece at its 1-cycle minimum, far below any roofline, so each step costs exactly its roofline and ``floor`` holds
what was added; the compiled replay (:mod:`stepsim.serve.replay_compiled`) floors its steps as the provider does,
bit for bit. DeepSeek-V3's stored 16-socket calibration, which priced lone short prefills at up to 1.80x their roofline,
is tested in tests/serve/test_deepseek_v3_16_sockets.py."""

from __future__ import annotations

import numpy as np
import pytest
from test_replay_compiled import _model, _random_run, assert_same_result

from stepsim.base.hardware import PRESETS
from stepsim.base.system import System
from stepsim.models.layers import layer_groups
from stepsim.models.presets import resolve_model
from stepsim.serve.fast import FastLatency, MetricForm
from stepsim.serve.kv_cache import kv_capacity
from stepsim.serve.latency import IterationBatch
from stepsim.serve.layer_list import LayerListLatency, count_weights_once, group_model
from stepsim.serve.replay import replay_reference
from stepsim.serve.replay_compiled import compiled_replay
from stepsim.serve.routing import SyntheticRouting
from stepsim.serve.scheduler import Scheduler, SchedulerConfig
from stepsim.serve.system_fast import SystemFastLatency

SN40L = PRESETS["sn40l"]
#: a step of 8 decodes over 3,000 cached tokens each and a 64-token prefill chunk
STEP = IterationBatch([3_000] * 8 + [0], [1] * 8 + [64], 64, 8)


def _forms(shared: bool = False) -> dict:
    """Metric forms of the right widths (their values only fill the bound columns, which zero coefficients
    ignore)."""
    return {k: MetricForm((1.0,) * w, (1.0,) * w) for k, w in (("decode", 4), ("prefill", 4),
                                                                ("ffn", 6 if shared else 5))}


def _zeros(provider) -> dict:
    """Coefficients of zeros of ``provider``'s widths: every piece priced at 1 cycle (``predict``'s minimum)."""
    decode, prefill = provider.attention_regressors(STEP)
    ffn = provider.ffn_rows(4)[0].shape[1]
    return {"decode": [0.0] * len(decode), "prefill": [0.0] * len(prefill), "ffn": [0.0] * ffn,
            "ffn_prefill": [0.0] * ffn}


def _fast(model, system=None, seed: int = 3, shared: bool = False):
    routing = SyntheticRouting(model.experts, model.top_k, model.layers, seed=seed) if model.is_moe else None
    if system is None:
        provider = FastLatency(model, SN40L, routing, max_model_len=4096, vocab=1000, forms=_forms(shared))
    else:
        provider = SystemFastLatency(model, system, routing, max_model_len=4096, vocab=1000, forms=_forms(shared))
    provider.theta = _zeros(provider)
    return provider


def _floored_exactly(provider, cost) -> int:
    """The step's roofline in cycles, checked to be what ``cost`` took, ``floor`` what was added."""
    bound = provider.roofline.bound_cycles(cost.work["hbm_bytes"], cost.work["flops"])
    priced = sum(v for k, v in cost.cycles.items() if k not in ("floor", "hidden")) - cost.cycles.get("hidden", 0)
    assert cost.cycles["floor"] == bound - priced > 0
    assert cost.seconds == bound / provider.hardware.clock_hz
    return bound


@pytest.mark.parametrize("variant, system, want", [
    # one chip: 2 layers x 2 KV heads x 2 attention pieces and 2 MoE layers' FFN (a dense FFN: one piece for every
    # layer) at 1 cycle each, the weights outside the graphs exact; HBM-bound
    ("moe", None, ({"attention": 8, "ffn": 2, "weights": 600, "floor": 11_625}, 12_235, 19_574_784, 117_436_416)),
    ("dense", None, ({"attention": 8, "ffn": 2, "weights": 590, "floor": 8_675}, 9_275, 14_839_808, 172_879_872)),
    # two chips: one KV head a chip, the all-reduces in attention, the weights half a chip; the roofline's peaks
    # are both chips' (here compute-bound)
    ("moe", "ring-2", ({"attention": 6_616, "ffn": 2, "weights": 468, "floor": 2_472}, 9_558, 19_574_784,
                       117_436_416)),
])
def test_a_step_the_fit_prices_below_its_roofline_costs_its_roofline(tmp_path, variant, system, want):
    """8 decodes over 3,000 cached tokens and a 64-token prefill chunk of the small model, every piece at 1 cycle:
    the step costs its roofline, ``max(ceil(HBM bytes / peak), ceil(FLOPs / peak))`` with the chips' peaks added."""
    provider = _fast(_model(tmp_path, variant), None if system is None else System.preset(system))
    cost = provider(STEP)
    bound = _floored_exactly(provider, cost)
    assert (cost.cycles, bound, cost.work["hbm_bytes"], cost.work["flops"]) == want
    hw, chips = provider.hardware, 1 if system is None else 2
    assert bound == max(-(-cost.work["hbm_bytes"] // (hw.hbm_peak_bytes_per_cycle * chips)),
                        -(-cost.work["flops"] // (hw.peak_flops_per_cycle * chips)))
    assert max(cost.work["hbm_utilisation"], cost.work["compute_utilisation"]) <= 1.0


def _long_decodes() -> tuple:
    """8 requests of 3,000 prompt tokens arriving together, 6 outputs each (vLLM, room for all): decode steps over
    3,000 cached tokens, whose KV reads outlast a two-chip system's all-reduces."""
    config = SchedulerConfig.make("vllm", max_num_seqs=8, max_num_batched_tokens=4096, block_size=16)
    capacity = kv_capacity(8 * 3_008, 0, 1, 16)
    return (np.zeros(8), np.full(8, 3_000, dtype=np.int64), np.full(8, 6, dtype=np.int64),
            lambda: Scheduler(config, capacity, 4096), "long decodes")


@pytest.mark.parametrize("variant, system", [("moe", None), ("dense", None), ("shared", None), ("moe", "ring-2"),
                                             ("dense", "ring-2")])
def test_the_compiled_replay_floors_as_the_provider_does(tmp_path, variant, system):
    """Random runs and :func:`_long_decodes` priced by zero coefficients: every step of the compiled loop costs
    at least its roofline (exactly, on one chip; on two, a step whose all-reduces take longer keeps its cycles),
    the same tables (``cycles_floor`` among them) as the provider called step by step."""
    model = _model(tmp_path, variant)
    chips = None if system is None else System.preset(system)
    rng = np.random.default_rng(17)
    floored = []
    for arrival, prompt, output, make, settings in [_random_run(rng) for _ in range(3)] + [_long_decodes()]:
        compiled, reference = (_fast(model, chips, shared=variant == "shared") for _ in range(2))
        got = compiled_replay(arrival, prompt, output, make(), compiled)
        assert got is not None, settings
        want = replay_reference(arrival, prompt, output, make(), reference)
        assert_same_result(got, want)
        it = want.iterations
        bound = [reference.roofline.bound_cycles(int(h), int(f)) for h, f in zip(it["hbm_bytes"], it["flops"])]
        total = it["cycles_attention"] + it["cycles_ffn"] + it["cycles_weights"]
        assert (total + it["cycles_floor"]).tolist() == np.maximum(total, bound).tolist()
        floored.append(bool((it["cycles_floor"] > 0).all()) if system is None else int((it["cycles_floor"] > 0).sum()))
    assert floored == ([True] * 4 if system is None else FLOORED_ON_TWO_CHIPS[variant])


#: steps floored in each of the four runs on ring-2 (the random runs' short steps: their all-reduces outlast
#: their rooflines)
FLOORED_ON_TWO_CHIPS = {"moe": [0, 0, 0, 3], "dense": [0, 0, 0, 1]}


def test_each_layer_group_is_floored_at_its_own_roofline():
    """DeepSeek-V3 narrowed (a dense MLA layer, an MoE MLA layer with a shared expert), each group a fast
    provider of zero coefficients on one sn40l: each group's step costs its group's roofline (its layers as they
    are, :func:`~stepsim.serve.layer_list.group_work`; the LM head the first group's), the list's the sum, so its
    utilisation stays below 1."""
    from pathlib import Path

    model = resolve_model(str(Path(__file__).resolve().parent / "data" / "deepseek-v3-narrow-2layers.json"))

    def groups() -> list:  # made twice: each group's routing window advances with every step priced
        out = []
        for g, (kind, indices) in enumerate(layer_groups(model)):
            sub = group_model(model, kind, len(indices))
            routing = SyntheticRouting(sub.experts, sub.top_k, sub.layers, seed=g) if sub.is_moe else None
            provider = FastLatency(sub, SN40L, routing, max_model_len=4096, vocab=32_000, forms=_forms(sub.is_moe))
            provider.theta = _zeros(provider)
            count_weights_once(model, kind, provider, g == 0)
            out.append((kind, indices, provider))
        return out

    bounds = [_floored_exactly(p, p(STEP)) for _, _, p in groups()]
    cost = LayerListLatency(model, groups())(STEP)
    assert sum(v for k, v in cost.cycles.items()) == sum(bounds) == (cost.seconds * SN40L.clock_hz)
    assert (bounds, cost.cycles, cost.work["hbm_bytes"], cost.work["flops"]) == (
        [143_511, 269_975], {"attention": 4, "ffn": 2, "weights": 107_503, "floor": 305_977}, 661_575_808,
        13_622_780_928)
    assert cost.work["hbm_utilisation"] == 661_575_808 / (413_486 * SN40L.hbm_peak_bytes_per_cycle) == 0.9999972913230436


def test_a_mapped_shard_on_two_chips_costs_the_systems_roofline(tmp_path, monkeypatch):
    """:class:`~stepsim.serve.system_fast.MappedSystemFastLatency` (a dense model's mapped tensor-parallel shards,
    tests/serve/test_replay_mapped.py's random schedules, projections of 1 cycle) with zero coefficients: the step
    costs the roofline of both chips' peaks, the floor what it added (64 decodes over 3,000 cached tokens: their
    KV reads outlast the shards' all-reduces)."""
    from test_replay_mapped import Mapper
    from test_replay_mapped import _model as mapped_model

    import stepsim.mapping
    from stepsim.kernels.serve_mapped import PREFILL_COLUMNS
    from stepsim.serve import fast_mapped, projections
    from stepsim.serve.fast_mapped import FFN_COLUMNS
    from stepsim.serve.system_fast import MappedSystemFastLatency

    monkeypatch.setattr(projections, "projection_cost", lambda tokens, d_in, d_out, hardware: (1, 0, 0, 0))
    monkeypatch.setattr(stepsim.mapping, "schedule_for", Mapper(5, 1))  # as test_replay_mapped's ``mapped``
    monkeypatch.setattr(fast_mapped, "_MEMO", {})
    forms = {k: MetricForm((1.0,) * 4, (1.0,) * 4) for k in ("decode", "prefill")}
    theta = {"decode": [0.0] * 10, "prefill": [0.0] * PREFILL_COLUMNS, "ffn": [0.0] * FFN_COLUMNS,
             "ffn_prefill": [0.0] * FFN_COLUMNS}
    provider = MappedSystemFastLatency(mapped_model(tmp_path, "dense"), System.preset("ring-2"), None,
                                       max_model_len=4096, vocab=1000, forms=forms, theta=theta)
    cost = provider(IterationBatch([3_000] * 64, [1] * 64, 0, 64))
    bound = _floored_exactly(provider, cost)
    hw = provider.hardware
    assert bound == max(-(-cost.work["hbm_bytes"] // (hw.hbm_peak_bytes_per_cycle * 2)),
                        -(-cost.work["flops"] // (hw.peak_flops_per_cycle * 2)))
    # the all-reduces (2 a layer) in attention; 2 layers' attention and 1 FFN piece for every layer at 1 cycle; the
    # projections' weights at 1 cycle each, 4 of them hidden by streaming ahead
    assert (cost.cycles, bound, cost.work["hbm_bytes"]) == (
        {"attention": 8_106, "ffn": 2, "weights": 13, "hidden": 4, "floor": 40_320}, 48_437, 99_198_976)
    assert cost.work["hbm_utilisation"] == 1.0  # 99,198,976 B: exactly 48,437 cycles of both chips' HBM
