"""Each mapped kind, a module of its own: its search space, the representative data the mapper decides on, a bound
from its knobs alone and its builder (docs/mapping.md).

* :mod:`~stepsim.mapping.kinds.ffn`: the MoE block (a dense FFN is one expert every token goes to);
* :mod:`~stepsim.mapping.kinds.decode`: the GQA decode attention of one KV head;
* :mod:`~stepsim.mapping.kinds.prefill`: the causal prefill attention of every KV head;
* :mod:`~stepsim.mapping.kinds.common`: what they share (the KV tile, the placeholder ``compute_bw``, a model's
  layer dimensions).

A kind's cached schedules are keyed by the sources that decide that kind alone
(:func:`stepsim.mapping.mapper.source_files`): the shared search (the mapper, the units, this registry and
``common``), the kind's module and the builders it names (its ``BUILDERS``), so a change to one kind's module or
builder stales only that kind's schedules.
"""

from stepsim.mapping.kinds import decode, ffn, prefill
from stepsim.mapping.kinds.common import KV_TILE, PLACEHOLDER_BW, layer_dims

#: the kinds the mapper searches (:mod:`stepsim.mapping.mapper`), each its module; the projection kind has its own
#: search and key (:mod:`stepsim.mapping.projection`)
KINDS = {"ffn": ffn, "decode": decode, "prefill": prefill}

__all__ = ["KINDS", "KV_TILE", "PLACEHOLDER_BW", "layer_dims"]
