"""Pass 1d: multi-head latent attention (DeepSeek-V2/V3) as transformers' ``DeepseekV3Attention`` exports it
(issue 43): low-rank projections whose outputs are split (``kv_a_proj_with_mqa`` into the latent and the rope
part, ``q_b_proj`` per head into nope and rope, ``kv_b_proj`` per head into nope keys and values), and scores of
the concatenated heads.

* A ``Split`` along the last dim of ``MatMul(a, W)`` (optionally through the ``Reshape`` into heads
  ``[.., H, P]`` and the ``[B, S, H, P] -> [B, H, S, P]`` Transpose) becomes one MatMul per part with that part's
  columns of ``W`` (per head: ``W[:, h * P + lo : h * P + hi]``): every output element is the same dot product,
  and each part streams as its own projection (a Split of a head's columns has no STeP operator).
* ``MatMul(Concat(q_nope, q_rope), Transpose(Concat(k_nope, k_rope)))`` becomes ``MatMul(q_nope, k_nope^T) +
  MatMul(q_rope, k_rope^T)`` (the same sum over ``nope + rope``, in two parts), so the rope key, one per token
  Expanded over the heads, is never concatenated to the nope keys.

The parts are recorded in :attr:`stepsim.frontend.ir.Model.patterns`.
"""

from __future__ import annotations

import numpy as np

from stepsim.base.errors import FrontendError
from stepsim.frontend.ir import Model, Node


def raise_mla(model: Model) -> Model:
    """``model`` with the rewrites of the module docstring."""
    nodes = []
    producers, readers, outputs = model.producer(), model.consumers(), set(model.outputs)
    drop, ropes = set(), set()
    rewrites = {"Split": _split_projection, "MatMul": _split_scores}
    for node in model.nodes:
        rewrite = rewrites.get(node.op_type)
        new = rewrite(model, node, producers, readers, outputs) if rewrite is not None else None
        if new is not None:  # (the nodes it replaces, the nodes that replace them, the rope width they show)
            chain, parts, rope = new
            drop.update(chain)
            nodes = [n for n in nodes if n.name not in chain] + parts
            if rope is not None:
                ropes.add(rope)
            continue
        nodes.append(node)
    model.nodes = [n for n in nodes if n.name not in drop]
    _name_latent_splits(model, ropes)
    return model


def _name_latent_splits(model: Model, ropes: set) -> None:
    """Name the Split of ``kv_a_proj_with_mqa``'s output into the latent and the rope part (lowered as a Split of
    stripes): a two-part Split of a weight MatMul whose second part's width is in ``ropes``, the rope widths the
    rewrites showed (the scores' rope part; the last part of a per-head split, as the absorbed form, which pairs no
    heads' scores, shows it)."""
    producers = model.producer()
    for n in model.nodes:
        mm = producers.get(n.inputs[0]) if n.op_type == "Split" else None
        sizes = model.consts.get(n.inputs[1]) if mm is not None and len(n.inputs) > 1 and n.inputs[1] else None
        if mm is None or mm.op_type != "MatMul" or sizes is None or sizes.size != 2 or int(sizes[1]) not in ropes:
            continue
        model.patterns[n.name] = f"latent / rope split of {mm.name!r}: latent {int(sizes[0])} + rope {int(sizes[1])}"


def _single(readers, outputs, v):
    return v not in outputs and len(readers.get(v, [])) == 1


def _split_projection(model: Model, split: Node, producers, readers, outputs):
    x = split.inputs[0]
    shape = model.shapes[x]
    rank = len(shape)
    if split.attrs.get("axis", 0) % rank != rank - 1:
        return None
    sizes = (model.consts.get(split.inputs[1]) if len(split.inputs) > 1 and split.inputs[1] else None)
    if sizes is None:
        return None
    sizes = [int(s) for s in sizes.reshape(-1)]
    chain, v = [], x
    trans = producers.get(v)
    if trans is not None and trans.op_type == "Transpose" and _single(readers, outputs, v):
        perm = list(trans.attrs.get("perm", []))
        if rank != 4 or perm != [0, 2, 1, 3]:
            return None
        chain.append(trans)
        v = trans.inputs[0]
    elif rank == 4 and trans is not None and trans.op_type == "Reshape":
        trans = None  # the head view [B, S, H, P] split as it is (DeepSeek's absorbed decode: q.view(..).split)
    else:
        return None  # a Split of a whole projection's stripes (GPT-2's c_attn) lowers as it is
    resh = producers.get(v)
    if rank == 4:
        if resh is None or resh.op_type != "Reshape" or not _single(readers, outputs, v):
            return None
        chain.append(resh)
        v = resh.inputs[0]
    mm = producers.get(v)
    if mm is None or mm.op_type != "MatMul" or not model.is_const(mm.inputs[1]) or not _single(readers, outputs, v):
        return None
    chain.append(mm)
    w = model.consts[mm.inputs[1]]
    heads = 1 if rank != 4 else shape[1] if trans is not None else shape[2]
    p = shape[-1]
    if w.ndim != 2 or w.shape[1] != heads * p:
        return None
    out_shape = model.shapes[mm.outputs[0]]
    parts, lo = [], 0
    for i, (size, y) in enumerate(zip(sizes, split.outputs)):
        wi = w.reshape(w.shape[0], heads, p)[:, :, lo:lo + size].reshape(w.shape[0], heads * size)
        lo += size
        name = f"{split.name}.part{i}"
        model.add_const(f"{name}.w", np.ascontiguousarray(wi), like=mm.inputs[1])  # the weight's part's columns
        proj = y if rank != 4 else f"{name}.proj"
        model.shapes[proj] = tuple(out_shape[:-1]) + (heads * size,)
        parts.append(Node(f"{name}.matmul", "MatMul", [mm.inputs[0], f"{name}.w"], [proj]))
        if rank == 4:
            four = model.shapes[resh.outputs[0]][:-1] + (size,)
            model.add_const(f"{name}.shape", np.array(four, np.int64))
            heads_view = y if trans is None else f"{name}.heads"
            model.shapes[heads_view] = four
            parts.append(Node(f"{name}.reshape", "Reshape", [proj, f"{name}.shape"], [heads_view]))
            if trans is not None:
                parts.append(Node(f"{name}.transpose", "Transpose", [heads_view], [y], {"perm": [0, 2, 1, 3]}))
    what = f"per head of {heads}" if rank == 4 else "of one projection"
    model.patterns[split.name] = (f"split projection {mm.name!r} (K {w.shape[0]}): parts {sizes} {what} (one "
                                  f"MatMul each)")
    return {n.name for n in chain} | {split.name}, parts, sizes[-1] if rank == 4 else None


def _split_scores(model: Model, mm: Node, producers, readers, outputs):
    q, kt = mm.inputs
    qc, tr = producers.get(q), producers.get(kt)
    if qc is None or tr is None or qc.op_type != "Concat" or tr.op_type != "Transpose" or len(qc.inputs) != 2:
        return None
    rank = len(model.shapes[q])
    kc = producers.get(tr.inputs[0])
    perm = list(tr.attrs.get("perm", []))
    if kc is None or kc.op_type != "Concat" or len(kc.inputs) != 2 or perm != list(range(rank - 2)) + [rank - 1, rank - 2]:
        return None
    if any(c.attrs.get("axis", 0) % rank != rank - 1 for c in (qc, kc)) or not all(
            _single(readers, outputs, v) for v in (q, kt, tr.inputs[0])):
        return None
    widths, kwidths = ([model.shapes[v][-1] for v in c.inputs] for c in (qc, kc))
    if widths != kwidths:
        raise FrontendError(f"{mm.describe()}: the query's parts {widths} ({qc.name!r}) and the key's {kwidths} "
                            f"({kc.name!r}) must pair up (nope with nope, rope with rope)")
    parts, partial = [], []
    for i, (a, k) in enumerate(zip(qc.inputs, kc.inputs)):
        t, s = f"{mm.name}.part{i}.kt", f"{mm.name}.part{i}"
        model.shapes[t] = tuple(model.shapes[k][:-2]) + (model.shapes[k][-1], model.shapes[k][-2])
        model.shapes[s] = model.shapes[mm.outputs[0]]
        parts += [Node(f"{t}", "Transpose", [k], [t], {"perm": perm}), Node(s, "MatMul", [a, t], [s])]
        partial.append(s)
    parts.append(Node(mm.name, "Add", partial, list(mm.outputs)))
    model.patterns[mm.name] = f"split rope / nope heads: {' + '.join(map(str, widths))} per head (one MatMul each)"
    # the Add keeps the MatMul's name (its output and pattern)
    return {qc.name, tr.name, kc.name}, parts, widths[-1]
