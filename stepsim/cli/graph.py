"""``stepsim graph show WORKLOAD|MODEL.onnx [--layouts]``: the streams of a workload's STeP graph, one line per
edge: its producer, its consumer and its stream type; with ``--layouts`` also the layout of the tensor tiles it
carries (``Stream.layout``, :mod:`stepsim.graph.layout`; ``-`` where no operator's shape rule knows it)."""

from __future__ import annotations

from stepsim.cli.args import add_workload_arguments, config_from_args
from stepsim.workloads.config import COMMAND_LINE


def edges(graph) -> list[tuple[str, str, object]]:
    """``(producer, consumer, stream)`` of every edge in operator order (a stream no operator reads: consumer
    ``-``); a producer with several outputs is named ``op[i]``."""
    readers = graph.consumers()
    out = []
    for op in graph:
        for i, stream in enumerate(op.outputs):
            name = op.name if op.num_outputs == 1 else f"{op.name}[{i}]"
            consumers = readers.get((op.id, i), [])
            out += [(name, c.name, stream) for c, _ in consumers] or [(name, "-", stream)]
    return out


def show(graph, layouts: bool) -> str:
    """The table :func:`edges` describes, columns aligned; the layout column with ``layouts``."""
    rows = [("producer", "consumer", "stream") + (("layout",) if layouts else ())]
    rows += [(p, c, str(s)) + ((str(s.layout) if s.layout is not None else "-",) if layouts else ())
             for p, c, s in edges(graph)]
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]) - 1)]
    return "\n".join("  ".join([*(cell.ljust(w) for cell, w in zip(r, widths)), r[-1]]) for r in rows)


def _show(args) -> int:
    from stepsim.results.records import build_workload

    workload = build_workload(config_from_args(args), source=COMMAND_LINE)
    g = workload.graph
    print(f"graph {g.name}: {len(g.ops)} operators, {len(edges(g))} edges")
    print(show(g, args.layouts))
    return 0


def register(subparsers) -> None:
    """Add ``stepsim graph show``."""
    graph = subparsers.add_parser("graph", help="show a workload's STeP graph: its streams and their layouts",
                                  description="A workload's STeP graph (as stepsim run builds it).")
    graph.set_defaults(handler=lambda args: (graph.print_help(), 1)[1])
    sub = graph.add_subparsers(dest="graph_command", metavar="SUBCOMMAND")
    p = sub.add_parser("show", help="every stream: its producer, its consumer, its type (and layout)",
                       description=__doc__.split("\n\n")[0])
    add_workload_arguments(p)
    p.add_argument("--layouts", action="store_true",
                   help="also print each stream's layout (tensor, element tile, loops dim:trips x step)")
    p.set_defaults(handler=_show)
