"""Operators of multi-chip graphs: links between chips and tensors resident in a chip's on-chip memory.

* :class:`Link` is one directed physical link shared by several transfers: input k leaves on output k
  (the engine's Link unit, :mod:`stepsim.kernels.units_link`: first come first served, ``ceil(bytes / B)``
  cycles on the wire, then ``latency`` cycles). Its metric :meth:`Link.link_bytes` is the bytes it carries.
* An operator's ``chip`` attribute (0 when absent) places it on a chip: the lowering puts its unit there, and a
  memory operator then uses that chip's HBM (each chip has its own, :mod:`stepsim.kernels.hbm`).
* :class:`ResidentLoad` / :class:`ResidentStore` read / write a tensor held in one chip's on-chip memory (a
  collective's input and output): no HBM, no off-chip bytes; the load's tiles carry read_from_mu, so the
  operator that reads them pays the PMU bandwidth.

Graphs build links through :class:`stepsim.graph.network.Network`, which routes transfers over a
:class:`~stepsim.base.system.System` and creates one Link per physical link used.
"""

from __future__ import annotations

from stepsim.base.errors import ArgumentError, DTypeError
from stepsim.graph.dims import dim_sum, is_static, product
from stepsim.graph.dtypes import FP32, BufferRef, DynTile, Tile
from stepsim.graph.graph import Op
from stepsim.graph.ops_memory import LinearOffChipLoad, LinearOffChipStore


class Link(Op):
    """A directed link between two chips carrying ``len(inputs)`` transfers (output k is input k, delivered).

    Parameters
    ----------
    graph : Graph
    inputs : list of streams
        One per transfer; buffer references cannot cross chips.
    bandwidth : int
        Bytes per cycle (>= 1).
    latency : int
        Cycles (>= 1) from an element's last byte leaving to its arrival at the receiving operator.
    src, dst : int
        The nodes the link joins (chips, or switches after the chips), for reports.
    """

    kind = "Link"

    def __init__(self, graph, inputs, *, bandwidth: int, latency: int, src: int = 0, dst: int = 1,
                 name: str | None = None):
        streams = self._begin(graph, list(inputs), name)
        if not streams:
            raise self._error(ArgumentError, "needs at least one transfer")
        for what, value in (("bandwidth", bandwidth), ("latency", latency)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise self._error(ArgumentError, f"{what} must be an int >= 1, got {value!r}")
        for s in streams:
            if isinstance(s.dtype, BufferRef):
                raise self._error(DTypeError, f"a buffer reference cannot cross chips, got {s}")
        self.bandwidth, self.latency, self.src, self.dst = bandwidth, latency, src, dst
        self.chip = src if src >= 0 else 0  # the sending end
        self._finish(list(streams))

    def link_bytes(self, fp32_bytes: int = 4, canonical: bool = True):
        """Bytes the link carries (sum over its transfers of elements x element bytes; symbolic if shapes are).

        ``fp32_bytes`` is the width an fp32 tile is timed at (:func:`stepsim.graph.lower.fp32_timing_bytes`: 2
        when the graph's fp32 streams are loaded from bf16 tensors), which is what the engine's link carries.
        ``canonical=False``: the same sum left as sympy built it, not put in canonical form (``Add`` and ``Mul`` with
        ``evaluate=False``; ``.doit()`` gives the canonical one), for a caller that substitutes every symbol at once
        (:meth:`stepsim.graph.network.Network.link_bytes`): canonicalizing a 16-chip all-to-all Link's sum of up
        to 576 transfers and distributing its bytes over them was 4.9 of a 16-chip expert-parallel bucket
        search's 30 s (cProfile), for a sum that is an integer a moment later.
        """
        def element_bytes(dtype):
            if isinstance(dtype, (Tile, DynTile)) and dtype.dtype == FP32:
                return product((dtype.rows, dtype.cols, fp32_bytes))
            return dtype.size_in_bytes()

        # The streams of one element type summed first, then times its bytes: an all-to-all Link of 16 chips
        # carries up to 576 transfers of one tile type, each as long as its own symbol (the tokens one region
        # sends another), and multiplying each by the tile's bytes took 0.27 of the 0.62 s the Links of a 16-chip
        # layer's graph spent here. sympy distributes the factor: the same expression, term for term.
        elements: dict = {}
        for s in self.outputs:
            elements.setdefault(s.dtype, []).append(product(s.shape))  # dtypes hash by value
        sizes = {dtype: element_bytes(dtype) for dtype in elements}
        if canonical or all(map(is_static, [*sizes.values(), *(n for ns in elements.values() for n in ns)])):
            return dim_sum(dim_sum(lengths) * sizes[dtype] for dtype, lengths in elements.items())
        import sympy as sp  # here, not at the top: a command that builds no graph does not import sympy

        return sp.Add(*(sp.Mul(sp.Add(*lengths, evaluate=False), sizes[dtype], evaluate=False)
                        for dtype, lengths in elements.items()), evaluate=False)


class ResidentLoad(LinearOffChipLoad):
    """A :class:`LinearOffChipLoad` of a tensor already in the chip's on-chip memory: 0 off-chip bytes, no HBM."""

    kind = "ResidentLoad"
    is_memory = False

    def off_chip_bytes(self):
        return 0

    def off_chip_bytes_factors(self):
        return (0,)


class ResidentStore(LinearOffChipStore):
    """A :class:`LinearOffChipStore` into the chip's on-chip memory: 0 off-chip bytes, no HBM."""

    kind = "ResidentStore"
    is_memory = False

    def __init__(self, graph, inp, *, tensor_name: str = "output", name: str | None = None):
        super().__init__(graph, inp, tensor_name=tensor_name, name=name)
        if not isinstance(self.inputs[0].stream.dtype, Tile):
            raise self._error(DTypeError, "input must be a tile stream")

    def off_chip_bytes(self):
        return 0

    def off_chip_bytes_factors(self):
        return (0,)
