"""What the mapped kinds share: the KV tile, the ``compute_bw`` a candidate is built with before its units are
assigned, the powers of two their spaces step through, and the dimensions each kind takes of a model."""

from __future__ import annotations

from stepsim.models.presets import MoEModel

#: KV rows per tile of the decode and prefill attention (the serving layers' :data:`stepsim.serve.layers.KV_TILE`)
KV_TILE = 32
#: the compute_bw a candidate is built with before its units are assigned (any positive value: it is replaced)
PLACEHOLDER_BW = 1


def powers_of_two(limit: int) -> list[int]:
    """``1, 2, 4, ...`` up to ``limit`` (none when ``limit`` < 1)."""
    out, p = [], 1
    while p <= limit:
        out.append(p)
        p *= 2
    return out


def layer_dims(kind: str, model):
    """The dimensions the mapper takes for ``kind`` of a :class:`~stepsim.models.presets.ModelConfig`: the MoE
    block (a dense FFN as one expert every token goes to) or ``{"head_dim", "query_per_kv_head"}`` (``prefill``:
    and ``kv_heads``)."""
    if kind == "ffn":
        if model.is_moe:
            return model.moe
        return MoEModel(model.name, hidden=model.hidden, intermediate=model.dense_intermediate, experts=1, top_k=1)
    attention = model.attention
    if kind == "prefill":
        return {"head_dim": attention.head_dim, "query_per_kv_head": attention.query_per_kv_head,
                "kv_heads": model.kv_heads}
    return {"head_dim": attention.head_dim, "query_per_kv_head": attention.query_per_kv_head}
