"""Dense models on many chips (``serve --system`` with a dense model): tensor parallelism over the query and KV
heads and the FFN columns, two all-reduces a layer, each chip's shard built (and mapped) as a one-chip layer
(stepsim/serve/system.py)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import stepsim
from stepsim.base.errors import ConfigError
from stepsim.base.system import System
from stepsim.mapping.roofline import decode_token_bytes
from stepsim.models.presets import resolve_model
from stepsim.serve.exact import max_kv_rows
from stepsim.serve.fast_mapped import MappedFastLatency
from stepsim.serve.layers import LayerRunner, LayerSpec
from stepsim.serve.memory import model_memory
from stepsim.serve.projections import projection_cost
from stepsim.serve.system import allreduce_cycles, system_capacity, tp_shard

LLAMA_70B_SHAPED = {"hidden_size": 8192, "num_hidden_layers": 80, "intermediate_size": 28672,
                    "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
                    "max_position_embeddings": 131072, "model_type": "llama"}


def _requests(path, n: int):
    pq.write_table(pa.table({"arrival_s": [0.0] * n, "prompt_tokens": [64] * n, "output_tokens": [8] * n}), path)
    return path


def _config(path, **fields):
    path.write_text(json.dumps(fields))
    return str(path)


@pytest.mark.parametrize("model, chips, shard", [
    ("llama-3.1-8b", 8, (4, 1, 1792)),
    ("llama-3.1-8b", 16, (2, 1, 896)),  # more chips than KV heads: each holds one, replicated twice
    ("llama-3.1-8b", 2, (16, 4, 7168)),
])
def test_a_tensor_parallel_shard_splits_heads_and_ffn_columns(model, chips, shard):
    m = tp_shard(resolve_model(model), chips)
    assert (m.heads, m.kv_heads, m.dense_intermediate) == shard
    assert (m.hidden, m.layers, m.head_dim) == (4096, 32, 128)


def test_a_shard_that_does_not_split_evenly_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as e:
        tp_shard(resolve_model("llama-3.1-8b"), 3)
    assert str(e.value) == ("--system: tensor parallelism over 3 chips needs the query heads (32) and the FFN columns "
                            "(14336) of 'llama-3.1-8b' divisible by 3")
    odd = resolve_model(_config(tmp_path / "odd.json", hidden_size=768, num_hidden_layers=2, intermediate_size=1536,
                                num_attention_heads=24, num_key_value_heads=8, vocab_size=1000, model_type="llama"))
    with pytest.raises(ConfigError) as e:
        tp_shard(odd, 6)
    assert str(e.value) == (f"--system: 6 chips neither split nor replicate the 8 KV heads of {odd.name!r} evenly "
                            f"(tensor parallelism needs one to divide the other)")


def test_replicated_kv_heads_take_their_share_of_the_kv_cache():
    """16 chips for 8 KV heads: every chip holds one head's cache, so a token takes twice the model's KV bytes."""
    model = resolve_model("llama-3.1-8b")
    memory = model_memory(model)
    for chips, replicas in ((8, 1), (16, 2)):
        capacity, _ = system_capacity(System.preset(f"sn40l-{chips}"), model, memory, 16)
        assert capacity.kv_bytes_per_token == memory.kv_bytes_per_token * replicas == 131_072 * replicas
        left = chips * 64 * 2**30 - memory.weight_bytes
        assert capacity.num_blocks == left // (16 * 131_072 * replicas)


def test_one_request_on_8_sockets_is_the_shard_layers_and_two_all_reduces_a_layer(tmp_path):
    """Llama-3.1-8B on ``sn40l-8``, mapped: a decode step is 32 layers of the shard's mapped decode attention and FFN
    (simulated once, every chip runs the same), 64 all-reduces of one token's activations, and each chip's q/k/v and
    o projections and its eighth of the LM head on the engine, the weights streamed ahead while the HBM is idle (the
    all-reduces among that time: stepsim.serve.projections)."""
    system = System.preset("sn40l-8")
    result = stepsim.serve("llama-3.1-8b", _requests(tmp_path / "one.parquet", 1), fidelity="exact",
                           schedule="auto", system="sn40l-8", out=tmp_path / "out")
    step = result.iterations.to_pylist()[1]  # the first decode step: 64 tokens cached
    shard = tp_shard(resolve_model("llama-3.1-8b"), 8)
    runner = LayerRunner(LayerSpec(shard, system.hardware, max_kv_rows(131_072), schedule="auto"))
    decode = runner.cycles("decode", np.array([64]))
    ffn = runner.cycles("ffn", np.zeros((1, 1), dtype=np.int64))
    assert (decode, ffn) == (734, 36_252)
    allreduce = allreduce_cycles(system, 4096, 1)
    assert step["cycles_attention"] == 32 * decode + 64 * allreduce == 516_672
    assert step["cycles_ffn"] == 32 * ffn
    # the shard's projections: q/k/v (4096 x (4 + 2) x 128), o (4 x 128 x 4096), the LM head's 16,032 rows
    qkv, o, head = (projection_cost(1, d_in, d_out, system.hardware)[0]
                    for d_in, d_out in ((4096, 768), (512, 4096), (4096, 16_032)))
    embedding = -(-(-(-4096 * 2 // 8)) // 1600)  # one token's row, an eighth a chip, at 1,600 B/cycle
    assert (qkv, o, head) == (4658, 2964, 84_612)
    assert step["cycles_weights"] == 32 * (qkv + o) + head + embedding == 328_517
    assert step["cycles_hidden"] == 828_000
    total = step["cycles_attention"] + step["cycles_ffn"] + step["cycles_weights"] - step["cycles_hidden"]
    assert step["duration_s"] == total / system.hardware.clock_hz == 0.001177253
    assert result.summary["tpot_s"]["p50"] == 0.0011772529999999996  # the decode steps' mean, summed in floats
    assert result.summary["system"]["parallelism"] == "tp"
    assert result.summary["fidelity"]["schedule"] == "auto"
    # the HBM roofline of 8 sockets: the bytes a decode token must read over 8 x 1.6 TB/s (1.979 ms, 1.679x, with
    # the projections in closed form at the HBM's peak and nothing streamed ahead)
    bound_s = decode_token_bytes(resolve_model("llama-3.1-8b"), 128_256) / (8 * 1.6e12)
    assert round(result.summary["tpot_s"]["p50"] / bound_s, 3) == 1.004


@pytest.mark.parametrize("model, requests, tpot_s, ttft_s", [
    # the projections on the engine, the weights streamed ahead: TPOT 1.71 ms and 10.87 ms (2.82 and 13.66 with the
    # projections in closed form and nothing streamed ahead), TTFT 39.25 ms and 15.56 ms (38.95 and 25.91)
    ("llama-3.1-8b", 16, 0.0017053699999999977, 0.039246048),
    ("llama-70b-shaped", 1, 0.010872233999999998, 0.015562285),
])
def test_dense_models_serve_on_8_sockets_exactly(tmp_path, model, requests, tpot_s, ttft_s):
    if model == "llama-70b-shaped":
        model = _config(tmp_path / "llama-70b-shaped.json", **LLAMA_70B_SHAPED)
    result = stepsim.serve(model, _requests(tmp_path / "r.parquet", requests), fidelity="exact", schedule="auto",
                           system="sn40l-8")
    assert (result.summary["tpot_s"]["p50"], result.summary["ttft_s"]["p50"]) == (tpot_s, ttft_s)


def test_a_dense_model_serves_on_8_sockets_in_fast_mode_on_its_mapped_shards(tmp_path):
    """Fast mode on a dense model's system defaults to the mapped shards (MappedSystemFastLatency), calibrated on the
    shard's exact mapped pieces: 16 requests arriving together give exactly the exact run's TPOT and TTFT (the
    pinned numbers of test_dense_models_serve_on_8_sockets_exactly; its held-out steps priced without error).
    Before, fast mode ran the paper's schedules here: TPOT 9.59 ms against exact's 1.71 ms."""
    from stepsim.serve.system_fast import MappedSystemFastLatency

    result = stepsim.serve("llama-3.1-8b", _requests(tmp_path / "r.parquet", 16), fidelity="fast",
                           system="sn40l-8", calibration_cache=tmp_path / "cal")
    fidelity = result.summary["fidelity"]
    assert (fidelity["mode"], fidelity["schedule"], fidelity["error"]["iteration_max"]) == ("fast", "auto", 0.0)
    assert (result.summary["tpot_s"]["p50"], result.summary["ttft_s"]["p50"]) == (0.0017053699999999977, 0.039246048)
    # the shard's buckets: a decode step's 16 requests x the shard's one KV head (the model's 8 would be 128)
    assert [(row["kind"], row["bucket"], row["steps"]) for row in result.summary["layers"]] == [
        ("prefill", 1024, 1), ("decode", 16, 7), ("ffn", 16, 7), ("ffn", 1024, 1)]
    assert issubclass(MappedSystemFastLatency, MappedFastLatency)
