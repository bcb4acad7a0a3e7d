"""Write a whole scaled-down GPT-2- or Llama-shaped model as ONNX, spelled as PyTorch's exporter spells it (README,
"Your own model (ONNX)"); needs ``pip install 'stepsim[onnx]'``.

    python examples/onnx_models.py gpt2 gpt2.onnx [--layers 2 --batch 2 --seq 8 --hidden 64 --heads 4 ...]

Both run a forward pass over ``seq`` tokens (token ids in, logits out; a causal mask), or with ``--past N`` one
decode step at position N against per-layer KV caches (``l<i>.attn.past_k`` / ``past_v`` in, ``present_k`` /
``present_v`` out, a Concat along the sequence):

* GPT-2: token + position embeddings (Gather), per layer LayerNormalization -> the fused q / k / v projection
  (``c_attn``: MatMul + bias to 3 x hidden, Split) -> heads
  (Reshape, Transpose) -> softmax(q k^T / sqrt(hd) + mask) v -> merge heads -> output MatMul + bias -> residual ->
  LayerNormalization -> MatMul + bias -> tanh-GELU as Mul / Pow / Tanh / Add -> MatMul + bias -> residual; a final
  LayerNormalization and the tied LM head (MatMul by the transposed token embedding).
* Qwen3-MoE: the Llama shape with a Mixture-of-Experts FFN in every layer (router softmax, top-k gates
  renormalized, every expert's SwiGLU weighted by its gate, summed: the dense spelling); the routing is a trace.
* Llama: token embedding, per layer RMSNorm as Pow -> ReduceMean -> Add -> Sqrt -> Reciprocal -> Mul -> q / k / v
  MatMuls -> heads -> RoPE (q cos + rotate_half(q) sin, rotate_half as Slice / Neg / Concat) -> causal attention
  -> output MatMul -> residual -> RMSNorm -> gate / up MatMuls -> SiLU as Sigmoid x Mul -> down MatMul ->
  residual; a final RMSNorm and the LM head. (Multi-head attention: grouped-query heads are not lowered yet.)

Node names start with ``l<layer>.`` (``embed.``, ``head.`` outside the layers), so ``stepsim.frontend.layers``
reports per layer. Weights are seeded random (std 1/sqrt(fan-in)).
"""

import argparse
import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.init = [], {}
        self.inputs, self.outputs = [], []  # (name, shape): KV caches in and out

    def w(self, name, shape, std=None):
        std = shape[0] ** -0.5 if std is None else std
        self.init[name] = (self.rng.standard_normal(shape) * std).astype(np.float32)
        return name

    def const(self, name, value, dtype=np.float32):
        self.init[name] = np.asarray(value, dtype)
        return name

    def op(self, op, ins, out, name=None, **attrs):
        self.nodes.append(helper.make_node(op, ins, [out], name=name or out, **attrs))
        return out

    def model(self, name, ids_shape, out_shape, inputs=(), outputs=()):
        """The model: ``input_ids`` and ``inputs`` (name, shape) in, ``logits`` and ``outputs`` out (fp32)."""
        ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ids_shape)
        ins = [helper.make_tensor_value_info(k, TensorProto.FLOAT, s) for k, s in inputs]
        outs = [helper.make_tensor_value_info(k, TensorProto.FLOAT, s) for k, s in (("logits", out_shape), *outputs)]
        graph = helper.make_graph(self.nodes, name, [ids, *ins], outs,
                                  [numpy_helper.from_array(v, k) for k, v in self.init.items()])
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        m.ir_version = 10
        onnx.checker.check_model(m)
        return m


def _attention(b: _Builder, p: str, x: str, batch, seq, hidden, heads, bias: bool, rope=None, past=0,
               kv_heads=None, fused_qkv=False) -> str:
    """Multi-head attention of ``x``; with ``past`` > 0 a decode step (``seq`` 1) against a KV cache of ``past``
    tokens: inputs ``<p>.past_k`` / ``<p>.past_v`` and outputs ``<p>.present_k`` / ``<p>.present_v`` (Concat along
    the sequence), no mask. ``kv_heads`` < ``heads``: grouped-query attention, the key / value heads repeated as
    transformers' ``repeat_kv`` exports it (Unsqueeze, Expand, Reshape). ``fused_qkv``: one projection to
    ``3 x hidden`` split into q, k, v (GPT-2's ``c_attn`` and ``Split``)."""
    hd = hidden // heads
    kv_heads = kv_heads or heads
    b.const("shape_heads", [batch, seq, heads, hd], np.int64)
    b.const("shape_merged", [batch, seq, hidden], np.int64)
    b.const("scale", math.sqrt(hd))
    if not past:
        b.const("mask", np.triu(np.full((seq, seq), -1e9, np.float32), 1).reshape(1, 1, seq, seq))
    if kv_heads != heads:
        b.const("shape_kv_heads", [batch, seq, kv_heads, hd], np.int64)
        b.const("kv_axis", [2], np.int64)
        b.const("shape_rep", [batch, kv_heads, heads // kv_heads, past + seq, hd], np.int64)
        b.const("shape_q_heads", [batch, heads, past + seq, hd], np.int64)
    qkv = {}
    if fused_qkv:
        fused = b.op("Add", [b.op("MatMul", [x, b.w(f"{p}.c_attn_w", (hidden, 3 * hidden))], f"{p}.c_attn0"),
                             b.w(f"{p}.c_attn_b", (3 * hidden,), 0.1)], f"{p}.c_attn")
        b.nodes.append(helper.make_node("Split", [fused, b.const(f"{p}.split", [hidden] * 3, np.int64)],
                                        [f"{p}.{t}b" for t in "qkv"], name=f"{p}.split", axis=-1))
    for t in "qkv":
        width = hidden if t == "q" else kv_heads * hd
        if fused_qkv:
            y = f"{p}.{t}b"
        else:
            y = b.op("MatMul", [x, b.w(f"{p}.w_{t}", (hidden, width))], f"{p}.{t}0")
            if bias:
                y = b.op("Add", [y, b.w(f"{p}.b_{t}", (width,), 0.1)], f"{p}.{t}b")
        y = b.op("Reshape", [y, "shape_heads" if t == "q" or kv_heads == heads else "shape_kv_heads"], f"{p}.{t}1")
        y = b.op("Transpose", [y], f"{p}.{t}2", perm=[0, 2, 1, 3])
        if rope is not None and t in "qk":
            y = rope(y, f"{p}.{t}")
        if past and t in "kv":
            b.inputs.append((f"{p}.past_{t}", [batch, kv_heads, past, hd]))
            b.outputs.append((f"{p}.present_{t}", [batch, kv_heads, past + seq, hd]))
            y = b.op("Concat", [f"{p}.past_{t}", y], f"{p}.present_{t}", axis=2)
        if t in "kv" and kv_heads != heads:  # repeat_kv
            y = b.op("Unsqueeze", [y, "kv_axis"], f"{p}.{t}_u")
            y = b.op("Expand", [y, "shape_rep"], f"{p}.{t}_rep")
            y = b.op("Reshape", [y, "shape_q_heads"], f"{p}.{t}_heads")
        qkv[t] = y
    kt = b.op("Transpose", [qkv["k"]], f"{p}.kt", perm=[0, 1, 3, 2])
    s = b.op("Div", [b.op("MatMul", [qkv["q"], kt], f"{p}.scores"), "scale"], f"{p}.scaled")
    prob = b.op("Softmax", [s if past else b.op("Add", [s, "mask"], f"{p}.masked")], f"{p}.probs", axis=-1)
    o = b.op("Transpose", [b.op("MatMul", [prob, qkv["v"]], f"{p}.ctx")], f"{p}.ctx_t", perm=[0, 2, 1, 3])
    o = b.op("MatMul", [b.op("Reshape", [o, "shape_merged"], f"{p}.merged"), b.w(f"{p}.w_o", (hidden, hidden))],
             f"{p}.o")
    if bias:
        o = b.op("Add", [o, b.w(f"{p}.b_o", (hidden,), 0.1)], f"{p}.ob")
    return o


def _rope_tables(b: _Builder, seq, hd, past):
    """RoPE's cos / sin at positions ``past .. past + seq`` and the Slice bounds of rotate_half."""
    inv = 1.0 / (10000 ** (np.arange(0, hd, 2) / hd))
    ang = np.outer(np.arange(past, past + seq), inv)
    ang = np.concatenate([ang, ang], axis=-1).reshape(1, 1, seq, hd)
    b.const("cos", np.cos(ang))
    b.const("sin", np.sin(ang))
    b.const("axes", [-1], np.int64)
    b.const("half_start", [hd // 2], np.int64)
    b.const("half_end", [hd], np.int64)
    b.const("zero", [0], np.int64)

    def rope(y, p):
        """``y cos + rotate_half(y) sin``, rotate_half as Slice / Neg / Concat (as exported)."""
        hi = b.op("Slice", [y, "half_start", "half_end", "axes"], f"{p}.hi")
        lo = b.op("Slice", [y, "zero", "half_start", "axes"], f"{p}.lo")
        rot = b.op("Concat", [b.op("Neg", [hi], f"{p}.neg"), lo], f"{p}.rot", axis=-1)
        return b.op("Add", [b.op("Mul", [y, "cos"], f"{p}.cos"), b.op("Mul", [rot, "sin"], f"{p}.sin")], f"{p}.rope")

    return rope


def gpt2_model(layers=2, batch=2, seq=8, hidden=64, heads=4, intermediate=256, vocab=128, seed=0, past=0):
    """The GPT-2-shaped model; ``past`` > 0: one decode step (``seq`` 1) at position ``past`` against KV caches."""
    b = _Builder(seed)
    seq = 1 if past else seq
    wte = b.w("wte", (vocab, hidden), 0.5)
    pos = b.op("Gather", [b.w("wpe", (past + seq, hidden), 0.1),
                          b.const("positions", np.arange(past, past + seq), np.int64)], "embed.pos", axis=0)
    x = b.op("Add", [b.op("Gather", [wte, "input_ids"], "embed.tok", axis=0), pos], "embed.sum")
    for c, v in {"half": 0.5, "one": 1.0, "three": 3.0, "k_gelu": 0.044715, "s2pi": math.sqrt(2 / math.pi)}.items():
        b.const(c, v)
    for i in range(layers):
        p = f"l{i}"
        h = b.op("LayerNormalization", [x, b.const(f"{p}.ln1_g", np.ones(hidden)), b.w(f"{p}.ln1_b", (hidden,), 0.1)],
                 f"{p}.ln1", axis=-1, epsilon=1e-5)
        x = b.op("Add", [x, _attention(b, f"{p}.attn", h, batch, seq, hidden, heads, bias=True, past=past,
                                       fused_qkv=True)], f"{p}.res1")
        h = b.op("LayerNormalization", [x, b.const(f"{p}.ln2_g", np.ones(hidden)), b.w(f"{p}.ln2_b", (hidden,), 0.1)],
                 f"{p}.ln2", axis=-1, epsilon=1e-5)
        a = b.op("Add", [b.op("MatMul", [h, b.w(f"{p}.w_fc", (hidden, intermediate))], f"{p}.fc0"),
                         b.w(f"{p}.b_fc", (intermediate,), 0.1)], f"{p}.fc")
        inner = b.op("Add", [a, b.op("Mul", [b.op("Pow", [a, "three"], f"{p}.a3"), "k_gelu"], f"{p}.ka3")],
                     f"{p}.inner")
        t = b.op("Add", [b.op("Tanh", [b.op("Mul", [inner, "s2pi"], f"{p}.z")], f"{p}.t"), "one"], f"{p}.t1")
        g = b.op("Mul", [b.op("Mul", [a, "half"], f"{p}.ha"), t], f"{p}.gelu")
        m = b.op("Add", [b.op("MatMul", [g, b.w(f"{p}.w_proj", (intermediate, hidden))], f"{p}.proj0"),
                         b.w(f"{p}.b_proj", (hidden,), 0.1)], f"{p}.proj")
        x = b.op("Add", [x, m], f"{p}.res2")
    h = b.op("LayerNormalization", [x, b.const("head.ln_g", np.ones(hidden)), b.w("head.ln_b", (hidden,), 0.1)],
             "head.ln", axis=-1, epsilon=1e-5)
    b.op("MatMul", [h, b.op("Transpose", [wte], "head.wte_t", perm=[1, 0])], "logits", name="head.lm")
    return b.model("gpt2", [batch, seq], [batch, seq, vocab], b.inputs, b.outputs)


def llama_model(layers=2, batch=2, seq=8, hidden=64, heads=4, intermediate=128, vocab=128, seed=0, past=0,
                kv_heads=None):
    """The Llama-shaped model; ``past`` > 0: one decode step (``seq`` 1) at position ``past`` against KV caches."""
    b = _Builder(seed)
    seq = 1 if past else seq
    rope = _rope_tables(b, seq, hidden // heads, past)
    for c, v in {"two": 2.0, "eps": 1e-6}.items():
        b.const(c, v)

    def rmsnorm(x, p):
        ms = b.op("ReduceMean", [b.op("Pow", [x, "two"], f"{p}.sq"), "axes"], f"{p}.ms", keepdims=1)
        inv_rms = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [ms, "eps"], f"{p}.mse")], f"{p}.rms")], f"{p}.inv")
        return b.op("Mul", [b.op("Mul", [x, inv_rms], f"{p}.xn"), b.const(f"{p}.w", np.ones(hidden))], f"{p}.out")

    x = b.op("Gather", [b.w("embed", (vocab, hidden), 0.5), "input_ids"], "embed.tok", axis=0)
    for i in range(layers):
        p = f"l{i}"
        h = rmsnorm(x, f"{p}.norm1")
        x = b.op("Add", [x, _attention(b, f"{p}.attn", h, batch, seq, hidden, heads, bias=False, rope=rope,
                                       past=past, kv_heads=kv_heads)], f"{p}.res1")
        h = rmsnorm(x, f"{p}.norm2")
        gate = b.op("MatMul", [h, b.w(f"{p}.w_gate", (hidden, intermediate))], f"{p}.gate")
        up = b.op("MatMul", [h, b.w(f"{p}.w_up", (hidden, intermediate))], f"{p}.up")
        silu = b.op("Mul", [gate, b.op("Sigmoid", [gate], f"{p}.sg")], f"{p}.silu")
        down = b.op("MatMul", [b.op("Mul", [silu, up], f"{p}.z"), b.w(f"{p}.w_down", (intermediate, hidden))],
                    f"{p}.down")
        x = b.op("Add", [x, down], f"{p}.res2")
    b.op("MatMul", [rmsnorm(x, "head.norm"), b.w("head.w", (hidden, vocab))], "logits", name="head.lm")
    return b.model("llama", [batch, seq], [batch, seq, vocab], b.inputs, b.outputs)


def _moe_ffn(b: _Builder, p: str, h: str, hidden, experts, k, intermediate) -> str:
    """A Qwen3-MoE-style block written densely: router softmax, top-k gates renormalized, every expert's SwiGLU
    weighted by its gate (zero for the tokens not routed to it), summed."""
    b.const("axes", [-1], np.int64)
    b.const(f"{p}.k", [k], np.int64)
    probs = b.op("Softmax", [b.op("MatMul", [h, b.w(f"{p}.router", (hidden, experts))], f"{p}.logits")],
                 f"{p}.probs", axis=-1)
    b.nodes.append(helper.make_node("TopK", [probs, f"{p}.k"], [f"{p}.topv", f"{p}.topi"], name=f"{p}.topk",
                                    axis=-1))
    norm = b.op("Div", [f"{p}.topv", b.op("ReduceSum", [f"{p}.topv", "axes"], f"{p}.topsum", keepdims=1)],
                f"{p}.gates")
    acc = None
    for e in range(experts):
        q = f"{p}.e{e}"
        hit = b.op("Cast", [b.op("Equal", [f"{p}.topi", b.const(f"{q}.id", e, np.int64)], f"{q}.eq")], f"{q}.hit",
                   to=TensorProto.FLOAT)
        w = b.op("ReduceSum", [b.op("Mul", [norm, hit], f"{q}.wk"), "axes"], f"{q}.w", keepdims=1)
        gate = b.op("MatMul", [h, b.w(f"{q}.w_gate", (hidden, intermediate))], f"{q}.gate")
        silu = b.op("Mul", [gate, b.op("Sigmoid", [gate], f"{q}.sg")], f"{q}.silu")
        up = b.op("MatMul", [h, b.w(f"{q}.w_up", (hidden, intermediate))], f"{q}.up")
        down = b.op("MatMul", [b.op("Mul", [silu, up], f"{q}.z"), b.w(f"{q}.w_down", (intermediate, hidden))],
                    f"{q}.down")
        out = b.op("Mul", [down, w], f"{q}.out")
        acc = out if acc is None else b.op("Add", [acc, out], f"{q}.acc")
    return acc


def qwen3_moe_model(layers=2, batch=2, seq=8, hidden=64, heads=4, intermediate=64, vocab=128, seed=0, past=0,
                    experts=8, top_k=2, kv_heads=None):
    """The Llama-shaped model with a Qwen3-MoE-style FFN (``experts``, top-``top_k``, renormalized gates) in
    every layer; the routing is a trace at lowering (``from_onnx(..., routing={"l<i>.moe.topk": ids})``)."""
    b = _Builder(seed)
    seq = 1 if past else seq
    rope = _rope_tables(b, seq, hidden // heads, past)
    for c, v in {"two": 2.0, "eps": 1e-6}.items():
        b.const(c, v)

    def rmsnorm(x, p):
        ms = b.op("ReduceMean", [b.op("Pow", [x, "two"], f"{p}.sq"), "axes"], f"{p}.ms", keepdims=1)
        inv_rms = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [ms, "eps"], f"{p}.mse")], f"{p}.rms")], f"{p}.inv")
        return b.op("Mul", [b.op("Mul", [x, inv_rms], f"{p}.xn"), b.const(f"{p}.w", np.ones(hidden))], f"{p}.out")

    x = b.op("Gather", [b.w("embed", (vocab, hidden), 0.5), "input_ids"], "embed.tok", axis=0)
    for i in range(layers):
        p = f"l{i}"
        x = b.op("Add", [x, _attention(b, f"{p}.attn", rmsnorm(x, f"{p}.norm1"), batch, seq, hidden, heads,
                                       bias=False, rope=rope, past=past, kv_heads=kv_heads)], f"{p}.res1")
        x = b.op("Add", [x, _moe_ffn(b, f"{p}.moe", rmsnorm(x, f"{p}.norm2"), hidden, experts, top_k,
                                     intermediate)], f"{p}.res2")
    b.op("MatMul", [rmsnorm(x, "head.norm"), b.w("head.w", (hidden, vocab))], "logits", name="head.lm")
    return b.model("qwen3_moe", [batch, seq], [batch, seq, vocab], b.inputs, b.outputs)


MODELS = {"gpt2": gpt2_model, "llama": llama_model, "qwen3_moe": qwen3_moe_model}

def weight_bytes(a) -> int:
    """The bytes of a model's weights and constant tables (fp32), before it is built: embeddings and LM head,
    per layer the attention and the FFN (every expert's for qwen3_moe), the mask and RoPE tables."""
    hd = a.hidden // a.heads
    kv = (a.kv_heads or a.heads) * hd
    attn = a.hidden * (2 * a.hidden + 2 * kv)
    ffn = 3 * a.hidden * a.intermediate * (8 if a.model == "qwen3_moe" else 1) + (8 * a.hidden if a.model ==
                                                                                     "qwen3_moe" else 0)
    tables = a.seq * a.seq + 2 * (a.past + a.seq) * hd
    return 4 * (2 * a.vocab * a.hidden + a.layers * (attn + ffn + 8 * a.hidden) + tables)


def main(argv=None) -> None:
    from onnx_blocks import MAX_MODEL_BYTES, at_least, check_out, positive, save

    count = at_least(0)

    ap = argparse.ArgumentParser(prog="onnx_models.py", description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=sorted(MODELS))
    ap.add_argument("out", help="the .onnx file to write")
    for flag, default in (("--layers", 2), ("--batch", 2), ("--seq", 8), ("--hidden", 64), ("--heads", 4),
                          ("--intermediate", 128), ("--vocab", 128)):
        ap.add_argument(flag, type=positive, default=default, help=f"an integer >= 1 (default {default})")
    ap.add_argument("--past", type=count, default=0, help="KV-cache tokens of a decode step, >= 0 (default 0: a "
                                                          "forward pass over --seq tokens)")
    ap.add_argument("--kv-heads", type=count, default=0,
                    help="llama / qwen3_moe: key / value heads, dividing --heads (default 0: as many as --heads)")
    a = ap.parse_args(argv)
    check_out(ap, a.out)
    if a.hidden % a.heads:
        ap.error(f"--heads {a.heads} does not divide --hidden {a.hidden} (each head is hidden / heads wide)")
    if a.model != "gpt2" and (a.hidden // a.heads) % 2:
        ap.error(f"--hidden {a.hidden} / --heads {a.heads} = {a.hidden // a.heads}: RoPE rotates half of each head, "
                 f"so the head width must be even")
    if a.kv_heads and a.model == "gpt2":
        ap.error("--kv-heads applies to llama and qwen3_moe (GPT-2 has as many key / value heads as query heads)")
    if a.kv_heads and (a.kv_heads > a.heads or a.heads % a.kv_heads):
        ap.error(f"--kv-heads {a.kv_heads} must divide --heads {a.heads} (each key / value head serves heads / "
                 f"kv_heads query heads)")
    if weight_bytes(a) > MAX_MODEL_BYTES:
        ap.error(f"the weights take {weight_bytes(a):,} bytes, more than the {MAX_MODEL_BYTES:,} an ONNX file "
                 f"holds (protobuf's 2 GB limit); give smaller --vocab, --hidden, --intermediate or --layers")
    extra = {"kv_heads": a.kv_heads or None} if a.model != "gpt2" else {}
    save(MODELS[a.model](a.layers, a.batch, a.seq, a.hidden, a.heads, a.intermediate, a.vocab, past=a.past,
                         **extra), a.out)


if __name__ == "__main__":
    main()
