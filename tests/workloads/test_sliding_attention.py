"""The sliding-window / full decode attention kind with attention sinks (gpt-oss): the graph equals gpt-oss's
formula on the keys in position order, and a sliding layer's decode bytes stop growing once the context passes
the window."""

from __future__ import annotations

import numpy as np
import pytest

from stepsim.base.errors import ArgumentError, ConfigError
from stepsim.simulation.simulate import simulate
from stepsim.workloads.config import workload_from_config
from stepsim.workloads.numerics import seeded_normal
from stepsim.workloads.reference import check_outputs, make_inputs
from stepsim.workloads.sliding_attention.build import build_sliding_attention, sliding_flops
from stepsim.workloads.sliding_attention.reference import sink_attention

LENGTHS = [5, 40, 17, 100]
DIMS = dict(head_dim=16, query_per_kv_head=4, tile_n=16)


@pytest.mark.parametrize("window, sinks, cycles", [(32, True, 481), (32, False, 473), (None, True, 685)])
def test_graph_equals_gpt_oss_formula_in_position_order(window, sinks, cycles):
    w = build_sliding_attention(LENGTHS, window=window, sinks=sinks, **DIMS)
    seed = 1
    r = simulate(w, functional=True, inputs=make_inputs(w, seed=seed))
    assert r.cycles == cycles
    checks = check_outputs(w, r.inputs, r.outputs)
    assert checks["out"].passed and checks["out"].error < 0.004
    out = np.asarray(r.outputs["out"], np.float64)
    q = np.asarray(r.inputs["q"], np.float64)
    sink_logits = seeded_normal(seed, "sinks", (4,), 1.0, bf16=True).astype(np.float64) if sinks else None
    for b, length in enumerate(LENGTHS):  # keys and values by position, the window's last positions attended
        keys, values = (seeded_normal(seed, name, (length + 1, 16), std, b, bf16=True).astype(np.float64)
                        for name, std in (("k_cache", 16 ** -0.25), ("v_cache", 1.0)))
        first = 0 if window is None else max(0, length + 1 - window)
        want = sink_attention(q[4 * b:4 * b + 4], keys[first:], values[first:], sink_logits)
        error = np.abs(out[4 * b:4 * b + 4] - want).max()
        assert error < 0.01 * np.abs(want).max()
        if sinks:  # the graph has the sinks: without them it would be several times further off
            without = sink_attention(q[4 * b:4 * b + 4], keys[first:], values[first:])
            assert np.abs(out[4 * b:4 * b + 4] - without).max() > 3 * error


def _attention_bytes(length: int, window: int | None) -> int:
    return build_sliding_attention([length], window=window, sinks=True, head_dim=64, query_per_kv_head=8,
                                   tile_n=32).metrics()["off_chip_bytes"]


def test_a_sliding_layer_reads_at_most_the_window():
    """gpt-oss dims (head_dim 64, 8 queries per KV head, window 128) with 32-row tiles: per request q, the mask
    row and the output, per batch the sink tiles, plus 2 x 64 x 2 bytes per cache row read."""
    fixed = 8 * 64 * 2 + 32 * 2 + 8 * 64 * 2 + 8 * 32 * 2 + 32 * 64 * 2  # sinks: once per batch
    lengths = [0, 31, 32, 100, 126, 127, 128, 500, 4000]
    sliding = [_attention_bytes(n, 128) for n in lengths]
    full = [_attention_bytes(n, None) for n in lengths]
    rows = [32, 32, 64, 128, 128, 128, 128, 128, 128]
    assert sliding == [fixed + 256 * n for n in rows]
    assert full == [fixed + 256 * 32 * ((n + 32) // 32) for n in lengths]  # grows with the context
    w = build_sliding_attention([4000, 7], window=128, head_dim=64, query_per_kv_head=8, tile_n=32)
    r = simulate(w)
    assert w.metrics()["off_chip_bytes"] == r.off_chip_bytes == 2 * fixed - 8 * 32 * 2 - 32 * 64 * 2 + 256 * (128 + 32) == 49792
    assert w.metrics()["flops"] == sliding_flops(4 + 1, 2, head_dim=64, query_per_kv_head=8, tile_n=32, sinks=True)


def test_gpt_oss_layers_from_the_preset(tmp_path):
    np.save(tmp_path / "kv.npy", np.array([300, 64, 1]))
    trace = str(tmp_path / "kv.npy")
    sliding = workload_from_config({"workload": "sliding_attention", "trace": trace})
    full = workload_from_config({"workload": "sliding_attention", "trace": trace, "layer": 1})
    common = dict(sinks=True, head_dim=64, query_per_kv_head=8, tile_n=32)
    assert sliding.params == dict(batch=3, window=128, cache_slots=128, kv_tiles=4 + 3 + 1, **common,
                                  compute_bw=2048, channel_depth=1, kv_cache_bytes=8 * 32 * 64 * 2 * 2)
    assert (full.params["window"], full.params["cache_slots"], full.params["kv_tiles"]) == (None, 320, 10 + 3 + 1)
    qwen = workload_from_config({"workload": "sliding_attention", "trace": trace, "model": "qwen3-30b-a3b"})
    assert (qwen.params["window"], qwen.params["sinks"], qwen.params["head_dim"]) == (None, False, 128)


def test_bad_shapes_and_models_are_one_line(tmp_path):
    with pytest.raises(ArgumentError, match=r"^window 100 is not a multiple of tile_n=32: a sliding layer's ring "
                                            r"of 100 cache rows is read in whole tiles$"):
        build_sliding_attention([5], window=100)
    with pytest.raises(ConfigError, match=r"^--layer 24: model 'gpt-oss-20b' has 24 layers \(0 \.\. 23\)$"):
        workload_from_config({"workload": "sliding_attention", "layer": 24})
    with pytest.raises(ConfigError, match=r"^model 'gpt-oss-20b' layer 0: window 128 is not a multiple of "
                                          r"tile_n=48: .*$"):
        workload_from_config({"workload": "sliding_attention", "tile_n": 48})
    with pytest.raises(ConfigError, match=r"^model 'deepseek-v3' uses multi-head latent attention; run it with the "
                                          r"mla_attention workload$"):
        workload_from_config({"workload": "sliding_attention", "model": "deepseek-v3"})


@pytest.mark.parametrize(("argv", "line"), [
    (["run", "sliding_attention", "--tile-n", "48"], "model 'gpt-oss-20b' layer 0: window 128 is not a multiple of "
     "tile_n=48: a sliding layer's ring of 128 cache rows is read in whole tiles"),
    (["metrics", "sliding_attention", "--layer", "99"], "--layer 99: model 'gpt-oss-20b' has 24 layers (0 .. 23)"),
    (["run", "sliding_attention", "--strategy", "coarse"], "--strategy does not apply to workload 'sliding_attention' "
     "(it applies to: attention, decoder)"),
    (["run", "mla_attention", "--model", "qwen"], "model 'qwen3-30b-a3b' has no multi-head latent attention (no "
     "'kv_lora_rank' in stepsim/data/models/qwen3-30b-a3b.json); the mla_attention workload needs an MLA model such "
     "as deepseek-v3"),
    (["run", "mla_attention", "--tile-n", "0"], "--tile-n must be an int >= 1, got 0"),
])
def test_the_command_line_refuses_bad_shapes_in_one_line(capsys, tmp_path, monkeypatch, argv, line):
    from stepsim.cli import main

    monkeypatch.chdir(tmp_path)
    code = main(argv)
    out, err = capsys.readouterr()
    assert (code, out, err) == (2, "", f"stepsim: error: {line}\n")
    assert list(tmp_path.iterdir()) == []
