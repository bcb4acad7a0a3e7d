"""Multi-head latent attention's decode in DeepSeek's absorbed form (issue 43), as ``torch.onnx`` exports
DeepSeek-V3's ``model.py`` (``attn_impl="absorb"``): every product an ``Einsum`` (``q_nope`` through ``W_UK``
into the latent space, scores against the latent cache plus the rope scores, the softmax-weighted latent rows
through ``W_UV``), the query's head view split into nope / rope parts without a Transpose, RoPE on the head view,
the new token's latent and rope key appended to the caches (``Concat``). The front end lowers each Einsum as a
batched MatMul (stepsim.frontend.einsum), matches onnx's reference evaluator and DeepSeek's formula in NumPy
(absorbed and expanded), reads the latent cache once, and refuses what it cannot stream in one line."""

import sys
from pathlib import Path

import numpy as np
import pytest

from stepsim.base.errors import FrontendError
from stepsim.frontend import from_onnx
from stepsim.frontend.check import check_outputs
from stepsim.simulation.simulate import simulate
from stepsim.workloads.mla_attention.reference import mla_absorbed, mla_expanded, wkv_b
from stepsim.workloads.reference import max_rel_error

sys.path.insert(0, str(Path(__file__).parent))
from ort_check import model, rand  # noqa: E402
from test_mla import node, rms, rope  # noqa: E402  (the expanded form's exported spellings)

B, T, H, KL, NOPE, ROPE, V, D = 2, 8, 4, 16, 8, 4, 8, 32


def absorbed_attention() -> list:
    """DeepSeek's ``attn_impl="absorb"`` attention from ``q_nope`` / ``q_pe`` ``[B, 1, H, *]`` and the caches
    ``kv_cache`` / ``pe_cache`` ``[B, T, *]`` to ``y`` (o_proj), each product an Einsum as torch.onnx writes it."""
    return [node("Einsum", ["q_nope", "w_uk"], "q_lat", equation="bshd,hdc->bshc"),
            node("Einsum", ["q_lat", "kv_cache"], "s_lat", equation="bshc,btc->bsht"),
            node("Einsum", ["q_pe", "pe_cache"], "s_pe", equation="bshr,btr->bsht"),
            node("Add", ["s_lat", "s_pe"], "s"), node("Mul", ["s", "scale"], "z"), node("Softmax", ["z"], "p", axis=-1),
            node("Einsum", ["p", "kv_cache"], "o_lat", equation="bsht,btc->bshc"),
            node("Einsum", ["o_lat", "w_uv"], "o", equation="bshc,hdc->bshd"),
            node("Reshape", ["o", "merged"], "o2"), node("MatMul", ["o2", "wo"], "y")]


def core(s=1):
    """The attention alone: the query parts and both caches are graph inputs; ``y`` = o_proj of the output.
    ``s`` query tokens a request (2: DeepSeek-V3's multi-token prediction verifying a drafted token; no causal
    mask between them here, the caches being the context both see)."""
    wkvb = rand((H * (NOPE + V), KL), 4, KL ** -0.5).reshape(H, NOPE + V, KL)
    init = {"w_uk": wkvb[:, :NOPE], "w_uv": wkvb[:, NOPE:], "wo": rand((H * V, D), 5, (H * V) ** -0.5),
            "scale": np.array((NOPE + ROPE) ** -0.5, np.float32), "merged": np.array([B, s, H * V], np.int64)}
    nodes = absorbed_attention()
    return model(nodes, {"q_nope": [B, s, H, NOPE], "q_pe": [B, s, H, ROPE], "kv_cache": [B, T, KL],
                         "pe_cache": [B, T, ROPE]}, {"y": [B, s, D]}, init, name="mla_absorbed")


QL = 16
QD = NOPE + ROPE


def block(present=False):
    """The whole decode block from the new token ``x``: q_a -> RMSNorm -> q_b as a head view split into nope /
    rope, kv_a split into the latent (RMSNormed) and the rope key, RoPE (rotate_half) on both rope parts, the
    caches grown by the new token (``present`` also outputs them), then the absorbed attention and o_proj."""
    wkvb = rand((H * (NOPE + V), KL), 4, KL ** -0.5).reshape(H, NOPE + V, KL)
    init = {"wqa": rand((D, QL), 1, D ** -0.5), "wqb": rand((QL, H * QD), 2, QL ** -0.5),
            "wkva": rand((D, KL + ROPE), 3, D ** -0.5), "gq": rand((QL,), 6, 0.1) + 1, "gkv": rand((KL,), 7, 0.1) + 1,
            "w_uk": wkvb[:, :NOPE], "w_uv": wkvb[:, NOPE:], "wo": rand((H * V, D), 5, (H * V) ** -0.5),
            "two": np.array(2, np.float32), "eps": np.array(1e-6, np.float32), "last": np.array([-1], np.int64),
            "qheads": np.array([B, 1, H, QD], np.int64), "split_q": np.array([NOPE, ROPE], np.int64),
            "split_kv": np.array([KL, ROPE], np.int64),
            "h0": np.array([0], np.int64), "h1": np.array([ROPE // 2], np.int64), "h2": np.array([ROPE], np.int64),
            "scale": np.array((NOPE + ROPE) ** -0.5, np.float32), "merged": np.array([B, 1, H * V], np.int64)}
    pos = T - 1
    ang = pos * (10000.0 ** (-np.arange(ROPE // 2) / (ROPE // 2)))
    for f, name in ((np.cos, "cos"), (np.sin, "sin")):
        v = f(np.concatenate([ang, ang])).astype(np.float32)
        init[name + "4"], init[name + "3"] = v.reshape(1, 1, 1, ROPE), v.reshape(1, 1, ROPE)
    nodes = [node("MatMul", ["x", "wqa"], "q_a")] + rms("q_a", "gq", "q_an")
    nodes += [node("MatMul", ["q_an", "wqb"], "q"), node("Reshape", ["q", "qheads"], "q4"),
              node("Split", ["q4", "split_q"], ["q_nope", "q_rot"], axis=-1),
              node("MatMul", ["x", "wkva"], "ckv"), node("Split", ["ckv", "split_kv"], ["k_lat", "k_rot"], axis=-1)]
    nodes += rms("k_lat", "gkv", "k_latn") + rope("q_rot", "q_pe", "cos4", "sin4")
    nodes += rope("k_rot", "k_pe", "cos3", "sin3")
    nodes += [node("Concat", ["past_kv", "k_latn"], "kv_cache", axis=1),
              node("Concat", ["past_pe", "k_pe"], "pe_cache", axis=1)]
    nodes += absorbed_attention()
    outs = {"y": [B, 1, D]}
    if present:
        outs.update(kv_cache=[B, T, KL], pe_cache=[B, T, ROPE])
    return model(nodes, {"x": [B, 1, D], "past_kv": [B, T - 1, KL], "past_pe": [B, T - 1, ROPE]}, outs, init,
                 name="mla_absorbed_block")



PATTERNS = {"q_lat": "einsum 'bshd,hdc->bshc' as a batched MatMul: 4 x [2 x 8] @ [8 x 16]",
            "s_lat": "einsum 'bshc,btc->bsht' as a batched MatMul: 2 x [4 x 16] @ [16 x 8]",
            "s_pe": "einsum 'bshr,btr->bsht' as a batched MatMul: 2 x [4 x 4] @ [4 x 8]",
            "o_lat": "einsum 'bsht,btc->bshc' as a batched MatMul: 2 x [4 x 8] @ [8 x 16]",
            "o": "einsum 'bshc,hdc->bshd' as a batched MatMul: 4 x [2 x 16] @ [16 x 8]"}


def _matmul_flops(w) -> dict:
    values = w.op_values()
    flops = {}
    for op in w.graph:
        if isinstance(op.group, tuple) and op.group[1].endswith(".matmul"):
            flops[op.group[1]] = flops.get(op.group[1], 0) + int(values[op.name].flops)
    return flops


def test_absorbed_attention_equals_deepseeks_formula_and_reads_the_latent_cache_once():
    m = core()
    w = from_onnx(m, tiling={"tile_m": 1})
    assert w.params["patterns"] == PATTERNS
    r = simulate(w, functional=True, seed=3)
    (c,) = check_outputs(w, r.inputs, r.outputs).values()  # onnx.reference.ReferenceEvaluator
    assert c.passed
    # DeepSeek's formula per request, absorbed and expanded (stepsim.workloads.mla_attention.reference)
    init = {t.name: np.frombuffer(t.raw_data, np.float32).reshape(t.dims) for t in m.graph.initializer
            if t.data_type == 1 and t.dims}
    weights = wkv_b(init["w_uk"], init["w_uv"])
    x = {k: r.inputs[k].reshape(shape) for k, shape in (("q_nope", (B, 1, H, NOPE)), ("q_pe", (B, 1, H, ROPE)),
                                                         ("kv_cache", (B, T, KL)), ("pe_cache", (B, T, ROPE)))}
    for form in (mla_absorbed, mla_expanded):
        want = np.stack([form(x["q_nope"][b, 0], x["q_pe"][b, 0], x["kv_cache"][b], x["pe_cache"][b], weights, V)
                         .reshape(-1) @ init["wo"] for b in range(B)])
        assert max_rel_error(r.outputs["y"].reshape(B, D), want) <= c.tolerance
    # each Einsum's MatMul does its equation's 2 G M K N FLOPs
    assert _matmul_flops(w) == {"q_lat.matmul": 2 * H * B * NOPE * KL, "s_lat.matmul": 2 * B * H * KL * T,
                                "s_pe.matmul": 2 * B * H * ROPE * T, "o_lat.matmul": 2 * B * H * T * KL,
                                "o.matmul": 2 * H * B * KL * V}
    # off-chip bytes: the latent cache read once for both of its products (scores and p @ kv); the per-head
    # weights W_UK and W_UV once (held on chip while the B requests' rows of a head stream), o_proj once per row
    # block (tile_m 1: B of them), as every 2-D weight of the front end
    f = 4
    cache = B * T * (KL + ROPE) * f
    queries = B * H * (NOPE + ROPE) * f
    weights_read = (H * NOPE * KL + H * V * KL + B * H * V * D) * f
    assert w.metrics()["off_chip_bytes"] == cache + queries + weights_read + B * D * f == 14_208
    assert simulate(w).cycles == 518


@pytest.mark.parametrize("present, cycles, off_chip", [(False, 736, 30_112), (True, 737, 31_392)])


def test_the_whole_absorbed_decode_block_matches_onnx(present, cycles, off_chip):
    w = from_onnx(block(present), tiling={"tile_m": 1})
    assert w.params["patterns"] == {
        **PATTERNS, "q_nope": "split projection 'q' (K 16): parts [8, 4] per head of 4 (one MatMul each)",
        "k_lat": "latent / rope split of 'ckv': latent 16 + rope 4"}
    r = simulate(w, functional=True, seed=5)
    checks = check_outputs(w, r.inputs, r.outputs)
    assert sorted(checks) == sorted(["y"] + (["kv_cache", "pe_cache"] if present else []))
    assert all(c.passed for c in checks.values())
    # the present caches are the past ones with the new token's row appended
    if present:
        assert np.array_equal(r.outputs["kv_cache"].reshape(B, T, KL)[:, :T - 1],
                              r.inputs["past_kv"].reshape(B, T - 1, KL))
    # RoPE's cos / sin row is read once for the query's 4 heads (4 fp32 elements), the past latent cache once
    values = w.op_values()
    loads = {op.tensor.name: int(values[op.name].off_chip_bytes) for op in w.graph
             if getattr(op, "tensor", None) is not None and op.tensor.name in ("cos4", "sin4", "past_kv")}
    assert loads == {"cos4": ROPE * 4, "sin4": ROPE * 4, "past_kv": B * (T - 1) * KL * 4}
    assert (simulate(w).cycles, w.metrics()["off_chip_bytes"]) == (cycles, off_chip)


def _einsum(equation, a_shape, b_shape, out_shape):
    return model([node("Einsum", ["a", "b"], "y", equation=equation)], {"a": a_shape, "b": b_shape},
                 {"y": out_shape}, name="einsum")


@pytest.mark.parametrize("equation, shapes, why", [
    ("bij,bjk->bi", ([2, 4, 8], [2, 8, 3], [2, 4]),
     "an index summed within one operand (not in the other operand or the output)"),
    ("...ij,...jk->...ik", ([2, 4, 8], [2, 8, 3], [2, 4, 3]),
     "supported is an equation of two operands with an explicit output (A,B->Y), no ellipsis"),
    ("i,j->ij", ([4], [3], [4, 3]), "no index is contracted (an outer product), which is not a MatMul"),
    ("bii,bij->bj", ([2, 4, 4], [2, 4, 3], [2, 3]),
     "an index repeated within one term, or an output index in neither operand"),
    ("bij,bj->bi", ([2, 4, 8], [2, 8], [2, 4]),
     "the right operand 'bj' keeps no index of its own (a matrix-vector product); supported: a free index on the "
     "right (a matrix product)"),
    ("bij,bjk", ([2, 4, 8], [2, 8, 3], [4, 3]),
     "supported is an equation of two operands with an explicit output (A,B->Y), no ellipsis"),
    ("bji,bjk->bik", ([2, 8, 4], [2, 8, 3], [2, 4, 3]),
     "the left operand 'bji' is not (batch)(free)(contracted) nor (free)(batch)(contracted) in that order: batch "
     "b, free i, contracted j"),
    ("bij,bjk->bki", ([2, 4, 8], [2, 8, 3], [2, 3, 4]),
     "output 'bki' is not (batch)(free left)(free right) nor (free left)(batch)(free right) in that order"),
])


def test_an_einsum_that_does_not_stream_is_one_line(equation, shapes, why):
    with pytest.raises(FrontendError) as err:
        from_onnx(_einsum(equation, *shapes), tiling={"tile_m": 1})
    assert str(err.value) == f"node 'y' (Einsum): equation {equation!r}: {why}"


def test_the_absorbed_block_streams_at_tile_m_1_only():
    with pytest.raises(FrontendError) as err:
        from_onnx(core(), tiling={"tile_m": 2})
    assert str(err.value) == "tile_m 2 does not divide the 1 rows of 'o2'"


def test_a_plain_batched_einsum_equals_its_matmul():
    """``bij,bjk->bik`` (no reordering) is exactly the MatMul of the same operands: same cycles and bytes."""
    via_einsum = from_onnx(_einsum("bij,bjk->bik", [2, 4, 8], [2, 8, 3], [2, 4, 3]), tiling={"tile_m": 2})
    via_matmul = from_onnx(model([node("MatMul", ["a", "b"], "y")], {"a": [2, 4, 8], "b": [2, 8, 3]},
                                 {"y": [2, 4, 3]}, name="matmul"), tiling={"tile_m": 2})
    assert simulate(via_einsum).cycles == simulate(via_matmul).cycles
    assert via_einsum.metrics()["off_chip_bytes"] == via_matmul.metrics()["off_chip_bytes"]
    r = simulate(via_einsum, functional=True, seed=2)
    assert all(c.passed for c in check_outputs(via_einsum, r.inputs, r.outputs).values())


def _grouped(a_shape, w):
    return model([node("MatMul", ["a", "w"], "y")], {"a": a_shape}, {"y": [*a_shape[:-1], w.shape[-1]]},
                 {"w": w}, name="grouped")


def test_a_matmul_by_one_weight_per_group_reads_each_groups_weight_and_checks():
    """``[G, M, K] @ [G, K, N]`` with the right operand an initializer: group g's row blocks read weight g, loaded
    once and held on chip (double-buffered) while they stream; the values onnx's."""
    w = from_onnx(_grouped([3, 4, 8], rand((3, 8, 5), 1)), tiling={"tile_m": 2})
    r = simulate(w, functional=True, seed=4)
    assert all(c.passed for c in check_outputs(w, r.inputs, r.outputs).values())
    assert w.metrics()["off_chip_bytes"] == (3 * 4 * 8 + 3 * 8 * 5 + 3 * 4 * 5) * 4
    held = [op for op in w.graph if op.kind == "Bufferize"]
    assert len(held) == 1 and held[0].on_chip_bytes() == 2 * 8 * 5 * 4 + 8 * 5 * 4


def test_a_weight_broadcast_over_groups_is_one_line():
    """``[2, 4, 8] @ [1, 8, 5]``: ONNX broadcasts the weight over the groups; the front end takes one weight per
    group or a 2-D weight, and says so."""
    with pytest.raises(FrontendError) as err:
        from_onnx(_grouped([2, 4, 8], rand((1, 8, 5), 1)), tiling={"tile_m": 1})
    assert str(err.value) == (
        "node 'y' (MatMul): supported is an activation times a 2-D initializer (weights), times a 3-D initializer "
        "of one weight per group of its leading dims, or times another activation")


def test_a_head_view_read_as_rows_needs_tile_m_1():
    """The query's rope part as a head view (a per-head split of q_b, stripes of one token's head each) becomes
    the rows of ``bshr,btr->bsht``'s left operand only at tile_m 1, where a stripe is a row; at 2 that is one
    line."""
    init = {"wqb": rand((QL, H * QD), 2), "qheads": np.array([B, 2, H, QD], np.int64),
            "split_q": np.array([NOPE, ROPE], np.int64)}
    nodes = [node("MatMul", ["x", "wqb"], "q"), node("Reshape", ["q", "qheads"], "q4"),
             node("Split", ["q4", "split_q"], ["q_nope", "q_rot"], axis=-1),
             node("Einsum", ["q_rot", "pe_cache"], "s_pe", equation="bshr,btr->bsht")]
    m = model(nodes, {"x": [B, 2, QL], "pe_cache": [B, T, ROPE]}, {"s_pe": [B, 2, H, T], "q_nope": [B, 2, H, NOPE]},
              init, name="s_pe")
    with pytest.raises(FrontendError) as err:
        from_onnx(m, tiling={"tile_m": 2})
    assert str(err.value) == ("node 's_pe.left' (Reshape): [2, 2, 4, 4] -> [2, 8, 4] reads a head view's heads as "
                              "rows, which streams at tile_m 1 (got 2)")
    w = from_onnx(m, tiling={"tile_m": 1})
    r = simulate(w, functional=True, seed=6)
    assert all(c.passed for c in check_outputs(w, r.inputs, r.outputs).values())


@pytest.mark.parametrize("equation, a_shape, b_shape, out_shape, weight, cycles", [
    ("ij,jk->ik", [4, 8], [8, 3], [4, 3], "b", 130),  # a weight
    ("ij,jk->ik", [4, 8], [8, 3], [4, 3], None, 239),  # two activations
    ("ij,kj->ik", [4, 8], [3, 8], [4, 3], None, 144),  # the right one read transposed
    ("dc,bsd->bsc", [8, 5], [2, 4, 8], [2, 4, 5], "a", 237),  # the weight first: operands swapped
    ("bsd,ed->bse", [2, 4, 8], [6, 8], [2, 4, 6], "b", 237),  # nn.Linear's x W^T
    ("bhqd,bhkd->bhqk", [2, 2, 4, 8], [2, 2, 6, 8], [2, 2, 4, 6], None, 546),  # attention scores
    ("bj,bij->bi", [2, 8], [2, 4, 8], [2, 4], None, 180),  # no free index on the left
])
def test_an_einsum_that_is_a_matrix_product_matches_onnx(equation, a_shape, b_shape, out_shape, weight, cycles):
    inputs = {k: s for k, s in (("a", a_shape), ("b", b_shape)) if k != weight}
    init = {weight: rand(a_shape if weight == "a" else b_shape, 1)} if weight else {}
    w = from_onnx(model([node("Einsum", ["a", "b"], "y", equation=equation)], inputs, {"y": out_shape}, init,
                        name="einsum"), tiling={"tile_m": 1})
    r = simulate(w, functional=True, seed=7)
    assert all(c.passed for c in check_outputs(w, r.inputs, r.outputs).values())
    assert simulate(w).cycles == cycles


def test_two_query_tokens_a_request_lower_alike():
    """Two tokens a request (multi-token prediction's verification step): the per-head products take ``B S`` rows
    a head and the result's ``[B, 2, H, v]`` rows are the head view o_proj's head merge reads."""
    w = from_onnx(core(s=2), tiling={"tile_m": 1})
    r = simulate(w, functional=True, seed=8)
    assert all(c.passed for c in check_outputs(w, r.inputs, r.outputs).values())
    assert _matmul_flops(w)["q_lat.matmul"] == 2 * H * (B * 2) * NOPE * KL
