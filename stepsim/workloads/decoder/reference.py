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
                                          **({"tp": p["tp"]} if p.get("tp") is not None else {}),
                                          **({"region_experts": p["region_experts"]} if "region_experts" in p
                                             else {})))
    return attention, moe


def _stack_inputs(w: Workload, seed: int) -> dict:
    """A decoder stack's tensors (decoder/build.py, _stack): ``x``; per layer i and KV head h its KV caches (the
    attention workload's draw, from seed ``seed + 7919 h + 104729 i``), the q / k / v projections
    ``layer<i>.wq_h<h>_q<j>``, ``layer<i>.wk_h<h>``, ``layer<i>.wv_h<h>`` ([D, head_dim]; q and k scaled by
    ``head_dim ** -0.25`` more, so q.k stays near 1 as in the attention's own draw) and ``layer<i>.wo_h<h>_q<j>``;
    the FFN's tensors as the MoE stack draws them (dense: ``layer<i>.shared_*``)."""
    p = w.params
    attention, _ = _decoder_parts(w)
    d, hd, q = p["hidden"], p["head_dim"], p["query_per_kv_head"]
    arrays = {"x": seeded_normal(seed, "x", (p["batch"], d), 1.0, bf16=True)}
    for i in range(p["layers"]):
        for h in range(p["kv_heads"]):
            drawn = attention_ref.inputs(attention, seed + 7919 * h + 104729 * i)
            arrays.update({f"layer{i}.h{h}_{name}": drawn[name] for name in ("k_cache", "v_cache")})
            arrays[f"layer{i}.wk_h{h}"] = seeded_normal(seed, f"layer{i}.wk", (d, hd), d ** -0.5 * hd ** -0.25, h,
                                                        bf16=True)
            arrays[f"layer{i}.wv_h{h}"] = seeded_normal(seed, f"layer{i}.wv", (d, hd), d ** -0.5, h, bf16=True)
            for j in range(q):
                arrays[f"layer{i}.wq_h{h}_q{j}"] = seeded_normal(seed, f"layer{i}.wq", (d, hd),
                                                                 d ** -0.5 * hd ** -0.25, h, j, bf16=True)
                arrays[f"layer{i}.wo_h{h}_q{j}"] = seeded_normal(seed, f"layer{i}.wo", (hd, d),
                                                                 (p["heads"] * hd) ** -0.5, h, j, bf16=True)
        if "experts" not in p:
            f = p["dense_intermediate"]
            for part, shape in (("gate", (d, f)), ("up", (d, f)), ("down", (f, d))):
                arrays[f"layer{i}.shared_{part}"] = seeded_normal(seed, f"layer{i}.shared_{part}", shape,
                                                                  shape[0] ** -0.5, bf16=True)
    if "experts" in p:
        moe = dict(batch=p["batch"], hidden=d, intermediate=p["intermediate"], top_k=p["top_k"],
                   experts=p["experts"], shared_intermediate=p["shared_intermediate"], layers=p["layers"])
        arrays.update({k: v for k, v in moe_ref.stack_inputs(moe, seed).items() if k != "x"})
    tp = p.get("tp")
    if tp is not None:  # --tp (workloads/sharding.py): chip t holds columns t F/T.. of gate / up, those rows of down
        for name in [n for n in arrays if n.endswith(("_gate", "_up", "_down"))]:
            whole = arrays.pop(name)
            n = whole.shape[0 if name.endswith("_down") else 1] // tp
            arrays.update({f"{name}.{t}": whole[t * n:(t + 1) * n] if name.endswith("_down")
                           else whole[:, t * n:(t + 1) * n] for t in range(tp)})
    if "shard_bounds" in p:  # --ep: chip c holds its shard's rows of x and of every layer's routing weights
        bounds = p["shard_bounds"]
        for name in _stack_sharded(p):
            whole = arrays.pop(name)
            arrays.update({f"{name}.{c}": whole[lo:hi] for c, (lo, hi) in enumerate(zip(bounds, bounds[1:]))})
    return arrays


def _stack_sharded(p) -> list[str]:
    """The tensors an expert-parallel stack (decoder/many_chips.py's expert_parallel_decoder) holds as shards ``<name>.<c>``."""
    return ["x"] + [f"layer{i}.routing_weights" for i in range(p["layers"])]


def _stack_outputs(workload: Workload, inputs: dict) -> dict:
    """Layer by layer: q, k, v = the layer's input rows times the projections (each rounded to fp32, as the
    graph's Matmul tiles), the attention of every KV head (its caches after the append), the output projection
    and residual, the FFN and residual; a layer's output enters the next in fp32."""
    who, p = "workload_reference", workload.params
    attention, _ = _decoder_parts(workload)
    b, q, hd, d = p["batch"], p["query_per_kv_head"], p["head_dim"], p["hidden"]
    routing = workload_trace(workload, "routing") if "experts" in p else None
    bounds = p.get("shard_bounds")
    if bounds is not None:  # --ep: the chips' shards put back together
        inputs = {**inputs, **{name: np.concatenate([take_input(inputs, f"{name}.{c}", who)
                                                     for c in range(len(bounds) - 1)]) for name in _stack_sharded(p)}}
    tp = p.get("tp")
    if tp is not None:  # --tp: the chips' column (down: row) blocks put back together
        split = {n.rsplit(".", 1)[0] for n in inputs if n.endswith(tuple(f"_{part}.0" for part in ("gate", "up",
                                                                                                     "down")))}
        inputs = {**inputs, **{name: np.concatenate([take_input(inputs, f"{name}.{t}", who) for t in range(tp)],
                                                    axis=0 if name.endswith("_down") else 1) for name in split}}
    outputs, y = {}, as_f32(take_input(inputs, "x", who)).astype(np.float64)
    for i in range(p["layers"]):
        pre = f"layer{i}."

        def project(name, rows=y, pre=pre):
            return as_f32(rows @ as_f32(take_input(inputs, pre + name, who)))

        o = np.zeros((b, d))
        for h in range(p["kv_heads"]):
            qs = np.stack([project(f"wq_h{h}_q{j}") for j in range(q)], axis=1).reshape(b * q, hd)
            res = attention_ref.outputs(attention, {
                "q": qs, "k": project(f"wk_h{h}"), "v": project(f"wv_h{h}"),
                "k_cache": take_input(inputs, f"{pre}h{h}_k_cache", who),
                "v_cache": take_input(inputs, f"{pre}h{h}_v_cache", who)})
            outputs[f"{pre}h{h}_k_cache"], outputs[f"{pre}h{h}_v_cache"] = res["k_cache"], res["v_cache"]
            out = res["out"].astype(np.float64).reshape(b, q, hd)
            for j in range(q):
                o += as_f32(out[:, j, :] @ as_f32(take_input(inputs, f"{pre}wo_h{h}_q{j}", who)))
        hidden = as_f32(as_f32(o) + as_f32(y))
        if routing is not None:
            stacks = [np.stack([take_input(inputs, f"{pre}expert{e:03d}_{part}", who) for e in range(p["experts"])])
                      for part in ("gate", "up", "down")]
            shared = ([take_input(inputs, f"{pre}shared_{part}", who) for part in ("gate", "up", "down")]
                      if p.get("shared_intermediate") else None)
            ffn = moe_ref.moe_reference(hidden, routing[i], take_input(inputs, f"{pre}routing_weights", who),
                                        *stacks, shared=shared).astype(np.float64)
        else:
            ffn = ffn_rows(hidden, *(as_f32(take_input(inputs, f"{pre}shared_{part}", who))
                                     for part in ("gate", "up", "down")))
        y = as_f32(ffn + hidden).astype(np.float64)
    if bounds is not None:  # chip c of the last stage stores its shard's rows as y.<c>
        outputs.update({f"y.{c}": y[lo:hi].astype(np.float32) for c, (lo, hi) in enumerate(zip(bounds, bounds[1:]))})
    elif tp is not None:  # after the last all-reduce chip t of the last stage holds every chunk k as y<t>.<k>
        rows = y.shape[0] // tp
        outputs.update({f"y{t}.{k}": y[k * rows:(k + 1) * rows].astype(np.float32) for t in range(tp)
                        for k in range(tp)})
    else:
        outputs["y"] = y.astype(np.float32)
    return outputs


def inputs(w: Workload, seed: int) -> dict:
    """Each head's attention inputs as the attention workload draws them (head h from seed ``seed + 7919 h``), the
    output projection, the token activations, and the FFN's weights as the MoE workload draws them (dense: the
    ``shared_*`` FFN)."""
    p = w.params
    if "layers" in p:
        return _stack_inputs(w, seed)
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
        if tp is not None:  # chip c: columns c F/N.. of gate / up, those rows of down (decoder/many_chips.py)
            dense = {f"{name}.{c}": (a[c * f // tp:(c + 1) * f // tp] if name == "shared_down"
                                     else a[:, c * f // tp:(c + 1) * f // tp])
                     for name, a in dense.items() for c in range(tp)}
        arrays.update(dense)
    arrays["x"] = seeded_normal(seed, "x", (p["batch"], p["hidden"]), 1.0, bf16=True)
    if "shard_bounds" in p:  # --ep: chip c holds its shard's rows of x and routing weights (decoder/many_chips.py)
        bounds = p["shard_bounds"]
        arrays.update({f"{name}.{c}": arrays[name][lo:hi] for name in moe_ref.SHARDED
                       for c, (lo, hi) in enumerate(zip(bounds, bounds[1:]))})
        for name in moe_ref.SHARDED:
            del arrays[name]
    return arrays


def outputs(workload: Workload, inputs: dict) -> dict:
    """``y = h + ffn(h)`` with ``h = x + sum over query heads (attn @ W_o)``, and every head's KV caches after
    the append. Each head's attention output stays fp32 (the graph streams it on); each query head's product
    is rounded to fp32, as the graph's Matmul tiles, and their sum is taken in float64 (rounded once)."""
    who, p = "workload_reference", workload.params
    if "layers" in p:
        return _stack_outputs(workload, inputs)
    attention, moe = _decoder_parts(workload)
    b, q, hd = p["batch"], p["query_per_kv_head"], p["head_dim"]
    bounds = p.get("shard_bounds")
    if bounds is not None:  # --ep: the chips' shards of x and the routing weights put back together
        inputs = {**inputs, **{name: np.concatenate([take_input(inputs, f"{name}.{c}", who)
                                                     for c in range(len(bounds) - 1)]) for name in moe_ref.SHARDED}}
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
    if bounds is not None and tp is not None:  # --tp T --ep E: chip s T + t holds chunk k of shard s's rows
        outputs.update({f"y{s * tp + t}.{k}": y[lo + k * (hi - lo) // tp:lo + (k + 1) * (hi - lo) // tp]
                        for s, (lo, hi) in enumerate(zip(bounds, bounds[1:])) for t in range(tp) for k in range(tp)})
    elif bounds is not None:  # chip c stores its shard's rows as y.<c>
        outputs.update({f"y.{c}": y[lo:hi] for c, (lo, hi) in enumerate(zip(bounds, bounds[1:]))})
    elif tp is None:
        outputs["y"] = y
    else:  # after the FFN's all-reduce every chip c holds rows k B/N.. of y as y<c>.<k>
        rows = y.shape[0] // tp
        outputs.update({f"y{c}.{k}": y[k * rows:(k + 1) * rows] for c in range(tp) for k in range(tp)})
    return outputs


def reduction_length(workload: Workload, name: str) -> int:
    """The attention's (scores over head_dim, sums over the rows read), the output projection's (every query
    head's head_dim), then the FFN's (D + F [+ top_k]) and the two residual adds."""
    p = workload.params
    if name.endswith(("_k_cache", "_v_cache")):
        return p["hidden"] if "layers" in p else 0  # a stack's new k, v: dot products over the layer's input
    attention, _ = _decoder_parts(workload)
    ffn = p["hidden"] + max(p.get("intermediate", 0), p.get("shared_intermediate", 0) or 0,
                            p.get("dense_intermediate") or 0) + p.get("top_k", 0)
    one = attention_ref.reduction_length(attention, "out") + p["heads"] * p["head_dim"] + ffn + 2
    return one if "layers" not in p else (one + p["hidden"]) * p["layers"]  # a stack: + its q, k, v projections
