"""Every registered workload kind is complete (stepsim.workloads.kinds): knobs, defaults, a builder, CLI flags,
experiment defaults, and functional inputs plus a reference that pass the check on a small instance."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stepsim.cli import main
from stepsim.results.records import SCHEMA
from stepsim.simulation.simulate import simulate
from stepsim.workloads.config import APPLIES_TO, KNOBS, WORKLOAD_DEFAULTS, WORKLOADS, workload_from_config
from stepsim.workloads.kinds import COMMON_KNOBS, KINDS, WORKLOAD_CHANNEL_DEPTH, WORKLOAD_HARDWARE
from stepsim.workloads.reference import check_outputs, make_inputs

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "user_graph.py"


def _small(kind: str, tmp_path: Path) -> dict:
    """A small instance of each kind (seconds to simulate functionally)."""
    if kind == "moe":
        routing = np.random.default_rng(0).integers(0, 8, size=(16, 1))
        np.savez(tmp_path / "routing.npz", data=routing)
        return {"model": "custom", "hidden": 32, "intermediate": 64, "experts": 8, "top_k": 1,
                "trace": str(tmp_path / "routing.npz"), "tile_n": 8}
    if kind == "attention":
        np.save(tmp_path / "kv.npy", np.array([5, 40, 17, 64]))
        return {"trace": str(tmp_path / "kv.npy"), "strategy": "interleave"}
    if kind == "collective":
        return {"op": "all-reduce", "bytes": 4 * 4 * 32, "system": "ring-4"}
    if kind == "prefill_attention":  # chunks of 20 tokens after 0..44 cached ones, 16-row tiles
        np.save(tmp_path / "kv.npy", np.array([5, 40, 17, 64]))
        return {"trace": str(tmp_path / "kv.npy"), "tile_m": 20, "tile_n": 16}
    if kind == "program":
        return {"program": f"{EXAMPLE}:small_moe_with_shared_expert"}
    if kind in ("mla_attention", "mla_prefill", "sliding_attention"):  # scaled-down DeepSeek-V3 / gpt-oss attention
        mla = {"model_type": "deepseek_v3", "kv_lora_rank": 32, "q_lora_rank": 48, "qk_nope_head_dim": 16,
               "qk_rope_head_dim": 8, "v_head_dim": 16}
        gpt_oss = {"model_type": "gpt_oss", "head_dim": 16, "sliding_window": 32,
                   "layer_types": ["sliding_attention", "full_attention"]}
        (tmp_path / "config.json").write_text(json.dumps({
            "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1,
            "num_hidden_layers": 2, **(gpt_oss if kind == "sliding_attention" else mla)}))
        np.save(tmp_path / "kv.npy", np.array([5, 40, 17, 64]))
        prefill = {"tile_m": 20} if kind == "mla_prefill" else {}  # chunks of 20 tokens after 0..44 cached ones
        return {"model": str(tmp_path / "config.json"), "trace": str(tmp_path / "kv.npy"), "tile_n": 16, **prefill}
    if kind == "decoder":  # a Qwen3-like layer with small dims, from a Hugging Face config.json
        (tmp_path / "config.json").write_text(json.dumps({
            "model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
            "num_experts": 8, "num_experts_per_tok": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
            "head_dim": 16, "num_hidden_layers": 2}))
        np.savez(tmp_path / "routing.npz", data=np.stack([np.random.default_rng(e).choice(8, 2, replace=False)
                                                          for e in range(8)]))
        np.save(tmp_path / "kv.npy", np.array([5, 40, 17, 64, 3, 33, 100, 31]))
        return {"model": str(tmp_path / "config.json"), "routing": str(tmp_path / "routing.npz"),
                "kv_lengths": str(tmp_path / "kv.npy"), "tile_f": 16}
    return {"tile_m": 32, "tile_n": 64}


def test_the_config_tables_come_from_the_registry():
    assert WORKLOADS == tuple(KINDS) == ("moe", "swiglu", "attention", "prefill_attention", "mla_attention",
                                         "mla_prefill", "sliding_attention", "decoder", "collective", "program")
    assert WORKLOAD_DEFAULTS == {name: dict(k.defaults) for name, k in KINDS.items()}
    for knob in KNOBS:
        if knob == "workload" or knob in COMMON_KNOBS:
            assert knob not in APPLIES_TO
        else:
            assert APPLIES_TO[knob] == tuple(name for name, k in KINDS.items() if knob in k.knobs), knob
    assert {f.name for f in SCHEMA} >= set(KNOBS)
    # every knob is taken by some kind (or by all): none is left over from a removed kind
    assert set(KNOBS) == {"workload", *COMMON_KNOBS, *(knob for k in KINDS.values() for knob in k.knobs)}


def test_parallel_axes_are_declared_knobs():
    """What ``stepsim optimize --max-chips`` searches per kind (WorkloadKind.parallel): each a knob of the kind."""
    from stepsim.workloads.kind import PARALLEL_AXES

    assert {name: k.parallel for name, k in KINDS.items() if k.parallel} == {
        "moe": ("tp", "ep", "pp"), "swiglu": ("tp", "pp"), "decoder": ("tp", "ep", "pp")}
    for k in KINDS.values():
        assert set(k.parallel) <= set(PARALLEL_AXES) and set(k.parallel) <= set(k.knobs), k.name


@pytest.mark.parametrize("name", list(KINDS))
def test_every_kind_is_complete(name, tmp_path, capsys):
    k = KINDS[name]
    assert set(k.knobs) <= set(KNOBS) and set(k.defaults) <= set(k.knobs)
    assert name in WORKLOAD_CHANNEL_DEPTH and name in WORKLOAD_HARDWARE
    assert callable(k.function("build"))
    # every knob has its flag on `stepsim run` (a user program's knob is the positional itself)
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    usage = capsys.readouterr().out
    assert all(f"--{knob.replace('_', '-')}" in usage for knob in set(k.knobs) - {"program"})
    # inputs, reference and tolerance come together; a kind without them (a user program) checks as the kind
    # of the workload it returns
    own = [k.inputs, k.reference, k.reduction_length]
    assert all(own) or not any(own)
    w = workload_from_config({"workload": name, **_small(name, tmp_path)})
    r = simulate(w, functional=True, inputs=make_inputs(w, seed=1))
    checks = check_outputs(w, r.inputs, r.outputs)
    assert checks and all(c.passed for c in checks.values()), checks
    assert (w.name == name) == all(own)
