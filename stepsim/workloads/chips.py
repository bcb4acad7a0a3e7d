"""The system a parallel layer runs on (``--ep N``, ``--tp N``, ``--pp N``): the given one, or N fully connected
chips with the preset link figures (64 bytes/cycle, 500 cycles, as docs/system.md's presets); the checks every
stack shares; tensor parallelism's partial sums cut into chunks and all-reduced (or reduce-scattered), the
collectives the sharding pass (:mod:`stepsim.workloads.sharding`) inserts."""

from __future__ import annotations

from stepsim.base.errors import ArgumentError
from stepsim.base.system import System, from_dict

#: links of the default system (fully connected): bytes/cycle and cycles, as the system presets
DEFAULT_LINK_BANDWIDTH = 64
DEFAULT_LINK_LATENCY = 500


def chips_system(chips: int, system: System | None, flag: str) -> System:
    """``system`` (its chip count must be ``chips``, else a one-line error naming ``flag``), else ``chips`` fully
    connected chips with the default links."""
    if system is None:
        name = f"fully-connected-{chips}"
        return from_dict({"name": name, "chips": chips, "topology": "fully-connected",
                          "link_bandwidth": DEFAULT_LINK_BANDWIDTH, "link_latency": DEFAULT_LINK_LATENCY},
                         source=flag, name=name)
    if system.chips != chips:
        raise ArgumentError(f"{flag} {chips} needs a system of {chips} chips; system {system.name!r} has "
                            f"{system.chips}")
    return system


def stages_system(pp: int | None, width: int, system: System | None, flag: str) -> System:
    """The system of ``pp`` stages (None: one) of ``width`` chips each (``flag``: ``--ep`` or ``--tp``): a given
    system must have ``pp x width`` chips (a one-line error naming both flags), else :func:`chips_system`."""
    if pp is not None and system is not None and system.chips != pp * width:
        raise ArgumentError(f"--pp {pp} {flag} {width} needs a system of {pp * width} chips (pp x {flag[2:]}); "
                            f"system {system.name!r} has {system.chips}")
    return chips_system((pp or 1) * width, system, flag)


def ep_system_of(cfg) -> System | None:
    """The system ``--ep N`` runs on, from a normalized run config: ``--system`` loaded; without it, when
    ``--hardware`` names other chips than the default system's, ``N`` fully connected chips of that hardware (so
    the load-balanced placement's cost model, which reads the system's hardware, sees the chips the run uses);
    else None (:func:`chips_system` builds the default). One-line ArgumentError for ``--system`` with
    ``--hardware`` (the system names the chips' hardware)."""
    import dataclasses

    if cfg.get("system") is not None and cfg.get("hardware") is not None:
        raise ArgumentError("--hardware does not apply with --system: the system file names the chips' hardware")
    if cfg.get("system") is not None:
        return System.load(cfg["system"])
    ep, name = cfg.get("ep"), cfg.get("hardware")
    if name is None or isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        return None  # a bad --ep is reported by the builder, with its own message
    from stepsim.base.hardware import Hardware

    default = chips_system(ep, None, "--ep")
    hardware = Hardware.from_toml(name) if name.endswith(".toml") else Hardware.preset(name)
    if hardware == default.hardware:
        return None
    return dataclasses.replace(default, hardware=hardware, hardware_spec=cfg["hardware"])


def check_stack(layers, pp, batch: int, micro_batches, unit: str) -> int | None:
    """The checks every stack of layers (``--layers L [--pp N] [--micro-batches M]``: swiglu, moe, decoder) shares,
    each a one-line ArgumentError: L an int >= 1; N an int >= 2 splitting the L layers into equal stages; M an int
    >= 1 splitting the batch of ``batch`` ``unit`` (rows, tokens, requests) into equal micro-batches. Returns M, or
    None when it is not given (each kind has its own default)."""
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ArgumentError(f"--layers must be an int >= 1, got {layers!r}")
    if pp is not None:
        if isinstance(pp, bool) or not isinstance(pp, int) or pp < 2:
            raise ArgumentError(f"--pp must be an int >= 2 (chips), got {pp!r}")
        if pp > layers:
            raise ArgumentError(f"--pp {pp}: more stages than the {layers} layers (--layers); a stage holds at least "
                                f"one layer")
        if layers % pp:
            raise ArgumentError(f"--pp {pp}: the {layers} layers (--layers) must split into {pp} stages of equal "
                                f"size (a multiple of {pp})")
    if micro_batches is None:
        return None
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ArgumentError(f"--micro-batches must be an int >= 1, got {micro_batches!r}")
    if batch % micro_batches:
        raise ArgumentError(f"--micro-batches {micro_batches}: the batch of {batch} {unit} must split into "
                            f"{micro_batches} equal micro-batches")
    return micro_batches


def stack_system(cfg, what: str, chip_knobs: tuple[str, ...] = ("pp",)) -> System | None:
    """The system of a stack's run config (``what``: "MoE layers", "decoder layers"): loaded with ``--pp N``, which
    needs it, or another of ``chip_knobs`` (the MoE stack's ``--ep``, which has a default system); one-line
    ArgumentErrors for ``--pp`` without ``--system``, ``--system`` without ``--pp`` and ``--system`` with
    ``--hardware`` (the system names the chips' hardware)."""
    if all(cfg.get(k) is None for k in chip_knobs) and cfg.get("system") is not None:
        raise ArgumentError(f"--system applies to a stack of {what} with --pp N (pipeline parallelism)")
    if cfg.get("system") is not None and cfg.get("hardware") is not None:
        raise ArgumentError("--hardware does not apply with --system: the system file names the chips' hardware")
    if cfg.get("pp") is None:
        return System.load(cfg["system"]) if cfg.get("system") is not None else None
    if cfg.get("system") is None:
        raise ArgumentError(f"--pp {cfg['pp']} needs --system FILE|PRESET (the chips and links the stages run on)")
    return System.load(cfg["system"])


def stack_knobs(cfg, what: str, refused: tuple[str, ...], chip_knobs: tuple[str, ...] = ("pp",)) -> dict:
    """A stack's knobs from a run config: ``layers`` (default 1), ``pp`` and ``micro_batches`` as given and, with
    ``pp`` (or another of ``chip_knobs``), the loaded ``system``; first the one-line errors every stack's config
    gets before its trace is read: a ``refused`` knob (one a stack of ``what``, e.g. "MoE layers", does not combine
    with), :func:`stack_system`'s, and ``--layers``."""
    for key in refused:
        if cfg.get(key) is not None:
            raise ArgumentError(f"--{key.replace('_', '-')} does not combine with --layers / --pp / --micro-batches "
                                f"(a stack of {what} runs each layer whole on one chip, one region per expert)")
    stack = {k: cfg[k] for k in ("layers", "pp", "micro_batches") if cfg.get(k) is not None}
    system = stack_system(cfg, what, chip_knobs)
    if system is not None:
        stack["system"] = system
    check_stack(stack.setdefault("layers", 1), None, 1, None, "")
    return stack


def on_chip(graph, chip: int, build, *args):
    """``build(*args)``, its operators (everything it adds to ``graph``) placed on ``chip``; returns its result."""
    before = len(graph.ops)
    out = build(*args)
    for op in graph.ops[before:]:
        op.chip = chip
    return out


def all_reduce_partials(graph, net, tp: int, partial_of, elems: int, *, algorithm: str, compute_bw: int,
                        prefix: str = "allreduce.") -> dict:
    """Sum every chip's partial output over ``net`` (not finished here): ``partial_of(c)`` builds chip c's
    partial, a stream of shape ``(1, elems)`` (its operators placed on chip c). The partial is cut into ``tp``
    chunks of ``elems / tp`` consecutive elements (a Partition by a static selector, whose outputs hold a whole
    chunk: a chunk waits there for its step of the ring, and a shallower FIFO blocks the chunk a neighbour waits
    for behind it, a deadlock across chips) and all-reduced by
    :func:`stepsim.workloads.collective.build.all_reduce_streams` (operator names start with ``prefix``).
    Returns ``{(c, k): stream}``, the reduced chunk k on chip c.
    """
    from stepsim.workloads.collective.build import all_reduce_streams

    chunks = _cut_partials(graph, tp, partial_of, elems)
    return all_reduce_streams(graph, net, chunks, algorithm, compute_bw=compute_bw, prefix=prefix)


def reduce_scatter_partials(graph, net, tp: int, partial_of, elems: int, *, algorithm: str, compute_bw: int,
                            prefix: str = "reducescatter.") -> dict:
    """:func:`all_reduce_partials` without its all-gather: the chunks are reduce-scattered
    (:func:`stepsim.workloads.collective.build.reduce_scatter_streams`). Returns ``{c: stream}``, the sum over
    chips of chunk c (elements ``c elems / tp ..``), on chip c."""
    from stepsim.workloads.collective.build import reduce_scatter_streams

    chunks = _cut_partials(graph, tp, partial_of, elems)
    return reduce_scatter_streams(graph, net, chunks, algorithm, compute_bw=compute_bw, prefix=prefix)


def _cut_partials(graph, tp: int, partial_of, elems: int) -> dict:
    """Every chip's partial (built on its chip) cut into ``tp`` chunks: ``{(c, k): stream}`` (see
    :func:`all_reduce_partials` for the chunks' FIFO depth)."""
    import numpy as np

    from stepsim.graph import Partition, SelectorSource

    per_chunk = elems // tp
    select = np.zeros((elems, tp), np.int8)
    select[np.arange(elems), np.arange(elems) // per_chunk] = 1
    chunks = {}

    def cut(c):
        part = Partition(graph, partial_of(c), SelectorSource(graph, select, tp), 0, tp)
        part.channel_depth = per_chunk
        for k in range(tp):
            part.assume_shape(k, (per_chunk,))
            chunks[(c, k)] = part[k]

    for c in range(tp):
        on_chip(graph, c, cut, c)
    return chunks


def cross_stage(g, rows: dict, chips: list[int], op_chip: dict) -> None:
    """A stage boundary of a tensor-parallel stack: the rows ``rows[t]`` of the last stage's chip t cross once to
    ``chips[t]`` of the next stage and fan out there (``rows[t]`` replaced; the new operators placed in
    ``op_chip``). The fan-out is a Promote after a Flatten on the new chip: a fan-out's FIFO depth is its
    producer's, and a link's would be too shallow."""
    from stepsim.graph import Flatten, Promote

    for t, chip in enumerate(chips):
        before = len(g.ops)
        rows[t] = Promote(g, Flatten(g, rows[t], 0, 1), 1)
        op_chip.update({op.id: chip for op in g.ops[before:]})
