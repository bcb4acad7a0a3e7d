"""A layer-list run's roofline columns (iterations.parquet's hbm_bytes, flops and utilisations) count each layer
as it is (stepsim/serve/layer_list.py, StepWork.of_layers): MLA's own weights and its latent cache, a sliding
layer's cache capped at its window, each FFN by its kind; consistent with decode_token_bytes, which counts a
heterogeneous model layer by layer (docs/serving.md §9.1). Before, a group's roofline was its engine model's: MLA's
absorbed form priced as GQA over one 576-wide KV head (q / k / v / o of 576-wide heads and a separate K and V)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

import stepsim
from stepsim.mapping.roofline import decode_token_bytes
from stepsim.models.layers import layer_groups
from stepsim.models.presets import resolve_model
from stepsim.serve.api import engine_provider, resolve_serving_hardware
from stepsim.serve.latency import IterationBatch
from stepsim.serve.layer_list import exact_layer_list, group_seed, seen_batch
from stepsim.serve.memory import attention_parameters

DATA = Path(__file__).resolve().parent / "data"
DEEPSEEK = str(DATA / "deepseek-v3-narrow-2layers.json")
OSS = str(DATA / "gpt-oss-20b-2layers.json")
SN40L = resolve_serving_hardware("sn40l")


def test_mla_layers_weights_are_its_own_projections():
    """DeepSeek-V3 narrowed (D = 2,048, 16 heads, q rank 512, latent 512 + 64, nope / v 128): q_a and its norm,
    q_b, kv_a and its norm, kv_b, o."""
    ds = resolve_model(DEEPSEEK)
    q = 2_048 * 512 + 512 + 512 * 16 * (128 + 64)
    kv = 2_048 * (512 + 64) + 512 + 512 * 16 * (128 + 128)
    assert attention_parameters(ds) == q + kv + 16 * 128 * 2_048 == 10_093_568


def test_a_deepseek_decode_step_reads_the_bytes_a_token_must_and_its_latent_cache(tmp_path):
    """One request (64 prompt tokens, 4 new), exact, paper schedules: its first decode step (one token, 64 cached)
    reads what decode_token_bytes says one token must (both layers' MLA weights, the dense FFN, 8 of 64 experts,
    the shared expert and router, the LM head and one embedding row) plus the latent cache of the 64 cached tokens
    and its own in both layers, 576 values each; its FLOPs are two per weight the token meets, the LM head's row,
    and each of the 16 heads' 2 x (512 + 64) score and 2 x 512 output FLOPs per context token seen (65) and layer."""
    ds = resolve_model(DEEPSEEK)
    trace = tmp_path / "one.parquet"
    pq.write_table(pa.table({"arrival_s": [0.0], "prompt_tokens": [64], "output_tokens": [4]}), trace)
    run = stepsim.serve(DEEPSEEK, trace, fidelity="exact", schedule="paper")
    step = run.iterations.to_pylist()[1]
    assert (step["prefill_tokens"], step["decode_tokens"]) == (0, 1)
    token_bytes = decode_token_bytes(ds, 32_000)
    expert = 3 * 2_048 * 512
    weights = 2 * attention_parameters(ds) + 3 * 2_048 * 4_096 + 8 * expert + 2_048 * 64 + 64 + expert
    weights += 32_000 * 2_048  # the router and its bias, the shared expert, the LM head
    assert token_bytes == (weights + 2_048) * 2 == 278_667_392  # + the embedding row, bf16
    latent = 2 * (512 + 64) * 2  # both layers' latent, bf16
    attention_flops = 2 * 16 * (2 * (512 + 64) + 2 * 512) * 65
    assert (step["hbm_bytes"], step["flops"]) == (token_bytes + 65 * latent, 2 * weights + attention_flops)
    assert (step["hbm_bytes"], step["flops"]) == (278_817_152, 283_189_376)
    # priced as GQA over one 576-wide KV head, the step read 399,028,736 B and did 403,513,344 FLOPs (same cycles)
    cycles = step["cycles_attention"] + step["cycles_ffn"] + step["cycles_weights"]
    assert step["duration_s"] == cycles / SN40L.clock_hz
    assert step["hbm_utilisation"] == step["hbm_bytes"] / (cycles * SN40L.hbm_peak_bytes_per_cycle)
    assert step["compute_utilisation"] == step["flops"] / (cycles * SN40L.peak_flops_per_cycle)


def test_a_sliding_layers_bytes_stop_at_its_window():
    """gpt-oss (2 layers: sliding 128, full; 8 KV heads of 64, biases and sinks), one decode step of 4 requests of
    3,000 cached tokens, 5 experts touched: the sliding group reads 127 cached tokens and the new one a request,
    the full group all 3,001; each its attention (with biases and sinks), router (with bias) and experts."""
    model = resolve_model(OSS)
    latency = exact_layer_list(model, lambda sub, g: engine_provider(
        sub, OSS, SN40L, None, seed=group_seed(0, g), max_model_len=4096, vocab=201_088, jobs=None, schedule="paper"))
    batch = IterationBatch([3_000] * 4, [1] * 4, 0, 4)
    got = [g.inner.step_work(seen_batch(kind, batch), 5, 10_000)["hbm_bytes"] for kind, _, g in latency.groups]
    latency.close()
    assert [kind.describe() for kind, _ in layer_groups(model)] == ["sliding 128 + sinks + moe", "full + sinks + moe"]
    kv = 2 * 8 * 64 * 2  # K and V a token, bf16
    attention = 2 * 2_880 * 64 * 64 + 2 * 2_880 * 8 * 64 + 64 * 64 + 2 * 8 * 64 + 2_880 + 64  # q o k v, biases, sinks
    expert = 3 * 2_880 * 2_880 + 2 * 2_880 + 2_880  # gate, up, down and their biases
    once = (attention + 2_880 * 32 + 32) * 2  # the router and its bias
    head = 201_088 * 2_880 * 2
    assert got == [once + 5 * expert * 2 + 4 * 128 * kv + head + 4 * 2_880 * 2,
                   once + 5 * expert * 2 + 4 * 3_001 * kv]


def test_a_layer_lists_step_takes_its_groups_steps_hidden_cycles_subtracted():
    """A mapped group's cycles hold ``hidden`` (weights streamed ahead: subtracted) and ``floor`` (what its roofline
    floor added): the layer list's step is the sum of its groups' steps, ``attention + ffn + weights - hidden +
    floor`` each (before, every value was added: 2 x hidden too many cycles a group)."""
    from types import SimpleNamespace

    from stepsim.base.hardware import PRESETS
    from stepsim.serve.latency import IterationCost
    from stepsim.serve.layer_list import LayerListLatency

    hw = PRESETS["sn40l"]

    class Group:
        mode, error, hardware = "exact", None, hw
        roofline = SimpleNamespace(utilisation=lambda hbm, flops, cycles: (hbm / cycles, flops / cycles))

        def __init__(self, cycles):
            self.cycles = cycles

        def __call__(self, batch):
            c = self.cycles
            total = c["attention"] + c["ffn"] + c["weights"] - c.get("hidden", 0) + c.get("floor", 0)
            return IterationCost(total / hw.clock_hz, dict(c), {"hbm_bytes": 600, "flops": 60})

    kinds = layer_groups(resolve_model("gpt-oss-20b"))
    mapped = {"attention": 1000, "ffn": 5000, "weights": 3000, "hidden": 2500, "floor": 0}
    floored = {"attention": 100, "ffn": 200, "weights": 300, "hidden": 400, "floor": 50}
    provider = LayerListLatency(resolve_model("gpt-oss-20b"),
                                [(kind, indices, Group(c)) for (kind, indices), c in zip(kinds, (mapped, floored))])
    cost = provider(IterationBatch([10], [1], 0, 1))
    assert cost.cycles == {"attention": 1100, "ffn": 5200, "weights": 3300, "hidden": 2900, "floor": 50}
    assert cost.seconds == (6500 + 250) / hw.clock_hz
    assert (cost.work["hbm_bytes"], cost.work["hbm_utilisation"]) == (1200, 1200 / 6750)
