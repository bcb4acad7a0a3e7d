"""Metrics per part of a lowered model: every operator carries the ONNX node it came from (``op.group ==
("node", name)``); a *part* is the node name's prefix before ``part_sep`` (``"l3.attn.q"`` -> ``"l3"``), so a
model whose exporter names nodes by layer gets per-layer numbers."""

from __future__ import annotations

from collections import defaultdict


def part_of(op, part_sep: str) -> str:
    """The part an operator belongs to (``"-"`` for the loads of graph inputs and the stores of outputs)."""
    if not (isinstance(op.group, tuple) and op.group[0] == "node"):
        return "-"
    return op.group[1].split(part_sep, 1)[0]


def per_part(workload, sim=None, part_sep: str = ".") -> dict:
    """``{part: {"off_chip_bytes", "on_chip_bytes", "flops", "last_cycle"}}`` (bytes, FLOPs, cycles), parts in
    graph order. ``last_cycle`` (with a timing run ``sim``) is the clock at which the part's last unit finished:
    parts overlap in a dataflow pipeline, so this is when the part is done, not how long it ran."""
    values = workload.op_values()
    clock = {}
    if sim is not None:
        clock = dict(zip(sim.unit_names, (int(c) for c in sim.unit_counters[:, 4])))
    out: dict = defaultdict(lambda: {"off_chip_bytes": 0, "on_chip_bytes": 0, "flops": 0, "last_cycle": 0})
    for op in workload.graph:
        row = out[part_of(op, part_sep)]
        v = values[op.name]
        row["off_chip_bytes"] += int(v.off_chip_bytes)
        row["on_chip_bytes"] += int(v.on_chip_bytes)
        row["flops"] += int(v.flops)
        row["last_cycle"] = max(row["last_cycle"], clock.get(op.name, 0))
    return dict(out)
