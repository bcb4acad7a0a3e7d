"""The decoder layer's reference and inputs (kind ``decoder``): its attention heads and its FFN, each as the
attention and MoE kinds compute them."""

from __future__ import annotations

import numpy as np

from stepsim.workloads.attention import reference as attention_ref
from stepsim.workloads.base import Workload
from stepsim.workloads.moe import reference as moe_ref
from stepsim.workloads.numerics import (
    as_f32,
    ffn_rows,
    seeded_normal,
    take_input,
    workload_trace,
)


def _decoder_parts(w: Workload):
    """The attention (one per simulated KV head) and MoE views of a decoder workload, as the references of those
    kinds read them: ``(attention proxy, moe proxy or None)``."""
    from types import SimpleNamespace

    p = w.params
    attention = SimpleNamespace(name="attention", graph=w.graph, trace={"kv_lengths": workload_trace(w, "kv_lengths")},
                                params=dict(batch=p["batch"], query_per_kv_head=p["query_per_kv_head"],
                                            head_dim=p["head_dim"], max_n=p["max_n"], strategy=p["strategy"],
                                            regions=p["attention_regions"], softmax=p["softmax"], tile_n=32))
    moe = None
    if "experts" in p:
        moe = SimpleNamespace(name="moe", graph=w.graph, trace={"routing": workload_trace(w, "routing")},
                              params=dict(batch=p["batch"], hidden=p["hidden"], intermediate=p["intermediate"],
                                          top_k=p["top_k"], experts=p["experts"], regions=p["ffn_regions"],
                                          shared_intermediate=p["shared_intermediate"],
                                          **({"tp": p["tp"]} if p.get("tp") is not None else {})))
    return attention, moe


def inputs(w: Workload, seed: int) -> dict:
    """Each head's attention inputs as the attention workload draws them (head h from seed ``seed + 7919 h``), the
    output projection, the token activations, and the FFN's weights as the MoE workload draws them (dense: the
    ``shared_*`` FFN)."""
    p = w.params
    attention, moe = _decoder_parts(w)
    arrays = {}
    for h in range(p["kv_heads"]):
        arrays.update({f"h{h}_{k}": v for k, v in attention_ref.inputs(attention, seed + 7919 * h).items()})
        for j in range(p["query_per_kv_head"]):
            arrays[f"wo_h{h}_q{j}"] = seeded_normal(seed, "wo", (p["head_dim"], p["hidden"]),
                                              (p["heads"] * p["head_dim"]) ** -0.5, h, j, bf16=True)
    if moe is not None:
        arrays.update(moe_ref.inputs(moe, seed))
    else:
        d, f = p["hidden"], p["dense_intermediate"]
        dense = dict(shared_gate=seeded_normal(seed, "shared_gate", (d, f), d ** -0.5, bf16=True),
                     shared_up=seeded_normal(seed, "shared_up", (d, f), d ** -0.5, bf16=True),
                     shared_down=seeded_normal(seed, "shared_down", (f, d), f ** -0.5, bf16=True))
        tp = p.get("tp")
        if tp is not None:  # chip c: columns c F/N.. of gate / up, those rows of down (decoder/parallel.py)
            dense = {f"{name}.{c}": (a[c * f // tp:(c + 1) * f // tp] if name == "shared_down"
                                     else a[:, c * f // tp:(c + 1) * f // tp])
                     for name, a in dense.items() for c in range(tp)}
        arrays.update(dense)
    arrays["x"] = seeded_normal(seed, "x", (p["batch"], p["hidden"]), 1.0, bf16=True)
    return arrays


def outputs(workload: Workload, inputs: dict) -> dict:
    """``y = h + ffn(h)`` with ``h = x + sum over query heads (attn @ W_o)``, and every head's KV caches after
    the append. Each head's attention output stays fp32 (the graph streams it on); each query head's product
    is rounded to fp32, as the graph's Matmul tiles, and their sum is taken in float64 (rounded once)."""
    who, p = "workload_reference", workload.params
    attention, moe = _decoder_parts(workload)
    b, q, hd = p["batch"], p["query_per_kv_head"], p["head_dim"]
    outputs, o = {}, np.zeros((b, p["hidden"]))
    for h in range(p["kv_heads"]):
        prefix = f"h{h}_"
        res = attention_ref.outputs(attention, {k[len(prefix):]: v for k, v in inputs.items() if k.startswith(prefix)})
        outputs[f"{prefix}k_cache"], outputs[f"{prefix}v_cache"] = res["k_cache"], res["v_cache"]
        out = res["out"].astype(np.float64).reshape(b, q, hd)
        for j in range(q):
            o += as_f32(out[:, j, :] @ as_f32(take_input(inputs, f"wo_h{h}_q{j}", who)))
    hidden = as_f32(as_f32(o) + as_f32(take_input(inputs, "x", who)))
    tp = p.get("tp")
    if moe is not None:
        res = moe_ref.outputs(moe, {**inputs, "x": hidden})
        ffn = (res["y"] if tp is None else np.concatenate([res[f"y0.{k}"] for k in range(tp)])).astype(np.float64)
    else:
        def weight(part):  # a tensor-parallel run's column shards put back together
            if tp is None:
                return as_f32(take_input(inputs, f"shared_{part}", who))
            return as_f32(np.concatenate([take_input(inputs, f"shared_{part}.{c}", who) for c in range(tp)],
                                         axis=0 if part == "down" else 1))
        ffn = ffn_rows(hidden, *(weight(part) for part in ("gate", "up", "down")))
    y = as_f32(ffn + hidden).astype(np.float32)
    if tp is None:
        outputs["y"] = y
    else:  # after the FFN's all-reduce every chip c holds rows k B/N.. of y as y<c>.<k>
        rows = y.shape[0] // tp
        outputs.update({f"y{c}.{k}": y[k * rows:(k + 1) * rows] for c in range(tp) for k in range(tp)})
    return outputs


def reduction_length(workload: Workload, name: str) -> int:
    """The attention's (scores over head_dim, sums over the rows read), the output projection's (every query
    head's head_dim), then the FFN's (D + F [+ top_k]) and the two residual adds."""
    if name.endswith(("_k_cache", "_v_cache")):
        return 0
    p = workload.params
    attention, _ = _decoder_parts(workload)
    ffn = p["hidden"] + max(p.get("intermediate", 0), p.get("shared_intermediate", 0) or 0,
                            p.get("dense_intermediate") or 0) + p.get("top_k", 0)
    return attention_ref.reduction_length(attention, "out") + p["heads"] * p["head_dim"] + ffn + 2
