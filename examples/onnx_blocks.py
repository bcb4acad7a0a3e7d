"""Write a small GPT-2- or Llama-shaped block as an ONNX model, spelled as PyTorch's exporter spells it (README,
"Your own model (ONNX)"); needs ``pip install 'stepsim[onnx]'``.

    python examples/onnx_blocks.py llama llama_block.onnx [--batch 2 --seq 8 --hidden 64 --intermediate 128]

The block is the normalization, the MLP and the residual (attention is not lowered yet): GPT-2 LayerNormalization
-> MatMul + bias -> tanh-GELU as Mul / Pow / Tanh / Add -> MatMul + bias -> Add; Llama RMSNorm as Pow ->
ReduceMean -> Add -> Sqrt -> Reciprocal -> Mul -> gate / up MatMuls -> SiLU as Sigmoid x Mul -> down MatMul -> Add.
Weights are seeded random (std 1/sqrt(fan-in)).
"""

import argparse
import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _node(op, ins, out, **attrs):
    return helper.make_node(op, ins, [out], name=out, **attrs)


def _weights(rng, shapes: dict) -> dict:
    return {k: (rng.standard_normal(s) * (s[0] ** -0.5 if len(s) == 2 else 0.1)).astype(np.float32)
            for k, s in shapes.items()}


def gpt2_block(batch, seq, hidden, intermediate, seed=0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    init = _weights(rng, {"w_fc": (hidden, intermediate), "b_fc": (intermediate,), "w_proj": (intermediate, hidden),
                          "b_proj": (hidden,), "ln_b": (hidden,)})
    init["ln_g"] = np.ones(hidden, np.float32)
    for k, v in {"half": 0.5, "one": 1.0, "three": 3.0, "k": 0.044715, "s2pi": math.sqrt(2 / math.pi)}.items():
        init[k] = np.array(v, np.float32)
    nodes = [_node("LayerNormalization", ["x", "ln_g", "ln_b"], "h", axis=-1, epsilon=1e-5),
             _node("MatMul", ["h", "w_fc"], "a0"), _node("Add", ["a0", "b_fc"], "a"),
             _node("Pow", ["a", "three"], "a3"), _node("Mul", ["a3", "k"], "ka3"), _node("Add", ["a", "ka3"], "inner"),
             _node("Mul", ["inner", "s2pi"], "z"), _node("Tanh", ["z"], "t"), _node("Add", ["t", "one"], "t1"),
             _node("Mul", ["a", "half"], "ha"), _node("Mul", ["ha", "t1"], "g"),
             _node("MatMul", ["g", "w_proj"], "m0"), _node("Add", ["m0", "b_proj"], "m"), _node("Add", ["x", "m"], "y")]
    return _model(nodes, init, batch, seq, hidden, "gpt2_block")


def llama_block(batch, seq, hidden, intermediate, seed=0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    init = _weights(rng, {"w_gate": (hidden, intermediate), "w_up": (hidden, intermediate),
                          "w_down": (intermediate, hidden)})
    init.update(norm_w=np.ones(hidden, np.float32), two=np.array(2.0, np.float32), eps=np.array(1e-6, np.float32),
                axes=np.array([-1], np.int64))
    nodes = [_node("Pow", ["x", "two"], "sq"), _node("ReduceMean", ["sq", "axes"], "ms", keepdims=1),
             _node("Add", ["ms", "eps"], "mse"), _node("Sqrt", ["mse"], "rms"), _node("Reciprocal", ["rms"], "inv"),
             _node("Mul", ["x", "inv"], "xn"), _node("Mul", ["xn", "norm_w"], "h"),
             _node("MatMul", ["h", "w_gate"], "gate"), _node("MatMul", ["h", "w_up"], "up"),
             _node("Sigmoid", ["gate"], "sg"), _node("Mul", ["gate", "sg"], "silu"), _node("Mul", ["silu", "up"], "z"),
             _node("MatMul", ["z", "w_down"], "down"), _node("Add", ["x", "down"], "y")]
    return _model(nodes, init, batch, seq, hidden, "llama_block")


def _model(nodes, init, batch, seq, hidden, name) -> onnx.ModelProto:
    io = [helper.make_tensor_value_info(k, TensorProto.FLOAT, [batch, seq, hidden]) for k in ("x", "y")]
    graph = helper.make_graph(nodes, name, io[:1], io[1:], [numpy_helper.from_array(v, k) for k, v in init.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


BLOCKS = {"gpt2": gpt2_block, "llama": llama_block}

#: the largest model the script writes (bytes): onnx.save keeps a model in one protobuf, which cannot exceed 2 GB
MAX_MODEL_BYTES = 2**31 - 1


def at_least(low: int):
    """argparse type: an integer of at least ``low``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value
    parse.__name__ = f"integer >= {low}"  # argparse names the type in its message
    return parse


positive = at_least(1)


def check_out(p: argparse.ArgumentParser, out: str) -> None:
    """The output file: a ``.onnx`` name (stepsim takes a model by its suffix) in a writable folder that exists or
    whose parent does (:func:`save` makes it)."""
    import os

    folder = os.path.dirname(out) or "."
    if not out.endswith(".onnx"):
        p.error(f"out {out!r}: the file name must end in .onnx (stepsim recognizes a model by its suffix)")
    # one missing level is made by save (as stepsim's --out folders: stepsim-out/ on a fresh clone)
    existing = folder if os.path.isdir(folder) else os.path.dirname(folder) or "."
    if not os.path.isdir(existing):
        p.error(f"out {out!r}: no such folder {folder!r}")
    if os.path.isdir(out) or not os.access(existing, os.W_OK):
        p.error(f"out {out!r}: " + ("is a folder" if os.path.isdir(out) else f"folder {existing!r} is not writable"))


def save(model: onnx.ModelProto, out: str) -> None:
    """Write ``model`` to ``out`` whole or not at all (a temporary file beside it, renamed)."""
    import os
    import tempfile

    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(out) or ".", suffix=".onnx.tmp")
    os.close(fd)
    try:
        onnx.save(model, tmp)
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="onnx_blocks.py", description=__doc__.splitlines()[0])
    p.add_argument("block", choices=sorted(BLOCKS))
    p.add_argument("out", help="the .onnx file to write")
    for flag, default in (("--batch", 2), ("--seq", 8), ("--hidden", 64), ("--intermediate", 128)):
        p.add_argument(flag, type=positive, default=default, help=f"an integer >= 1 (default {default})")
    a = p.parse_args(argv)
    check_out(p, a.out)
    weights = 4 * (3 * a.hidden * a.intermediate + a.intermediate + 3 * a.hidden)  # fp32; GPT-2's biases included
    if weights > MAX_MODEL_BYTES:
        p.error(f"--hidden {a.hidden} x --intermediate {a.intermediate}: the weights take {weights:,} bytes, more "
                f"than the {MAX_MODEL_BYTES:,} an ONNX file holds (protobuf's 2 GB limit)")
    save(BLOCKS[a.block](a.batch, a.seq, a.hidden, a.intermediate), a.out)


if __name__ == "__main__":
    main()
