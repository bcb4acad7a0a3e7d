"""Off-chip memory operators: linear and random loads and stores (docs/semantics.md §2.1).

Byte widths come from dtypes, never from a global flag: a :class:`Tensor` has a *storage* dtype (what sits in
HBM and crosses the off-chip interface; e.g. bf16 weights) while the tiles a load puts on its stream carry a
*stream* dtype (e.g. fp32 for compute). Loads and random stores move ``storage`` bytes and buffer one tile of
storage bytes on chip; a linear store writes its input stream's dtype. This reproduces the artifact's
``mock_bf16`` accounting (2-byte loads, 4-byte accumulators and stores) from the types alone.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import numpy as np

from stepsim.base.errors import ArgumentError, DTypeError, LayoutError, ShapeError
from stepsim.graph.dims import fmt_shape, is_static, normalize, product
from stepsim.graph.dtypes import BOOL, FP32, SCALARS, UINT64, ScalarType, Tile, is_tile, size_factors
from stepsim.graph.graph import PUBLISHED, OnChipFromTerms, Op
from stepsim.graph.layout import Layout
from stepsim.graph.stream import Stream


@dataclass(frozen=True)
class Tensor:
    """A tensor in off-chip memory.

    Parameters
    ----------
    name : str
        Name used in results and functional-mode outputs.
    shape : tuple of int
        Untiled shape in elements (at least 2-D, positive). Integer-valued floats (``64.0``) are accepted;
        any other non-integer raises ArgumentError.
    dtype : ScalarType or str
        Storage type in HBM (bytes per element on the off-chip interface); a name such as ``"bf16"`` is
        accepted (:data:`stepsim.graph.dtypes.SCALARS`).
    data : numpy.ndarray, optional
        Values for functional simulation (later); not used for timing.
    """

    name: str
    shape: tuple
    dtype: ScalarType = FP32
    data: np.ndarray | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        try:
            raw = tuple(self.shape)
        except TypeError:
            raise ArgumentError(f"tensor {self.name!r}: shape must be a sequence of ints, got {self.shape!r}") from None
        shape = tuple(_tensor_dim(self.name, raw, i) for i in range(len(raw)))
        if len(shape) < 2 or any(d < 1 for d in shape):
            raise ArgumentError(f"tensor {self.name!r}: shape must be at least 2-D with positive dims, got {shape}")
        object.__setattr__(self, "shape", shape)
        if isinstance(self.dtype, str) and self.dtype in SCALARS:
            object.__setattr__(self, "dtype", SCALARS[self.dtype])
        if not isinstance(self.dtype, ScalarType):
            raise ArgumentError(f"tensor {self.name!r}: dtype must be one of {', '.join(SCALARS)} (a ScalarType such "
                                f"as stepsim.graph.BF16, or its name), got {self.dtype!r}")

    def tiled_shape(self, tile_rows: int, tile_cols: int, who: str) -> tuple:
        rows, cols = self.shape[-2:]
        if rows % tile_rows or cols % tile_cols:
            raise ShapeError(
                f"{who}: tile ({tile_rows}, {tile_cols}) does not divide tensor {self.name!r} of shape "
                f"{list(self.shape)} (last two dims must be multiples of the tile)"
            )
        return self.shape[:-2] + (rows // tile_rows, cols // tile_cols)


def _tensor_dim(name: str, shape: tuple, i: int) -> int:
    """``shape[i]`` as an int: integers and integer-valued floats (``64.0``) pass, ``64.7`` or ``True`` do not
    (``int()`` would silently truncate them)."""
    d = shape[i]
    if not isinstance(d, bool):
        if hasattr(d, "__index__"):  # int, numpy integer, sympy Integer
            return int(d)
        if isinstance(d, numbers.Real) and float(d).is_integer():  # float, numpy floating, sympy Float
            return int(d)
    raise ArgumentError(f"tensor {name!r}: dim {i} of shape {shape} is {d!r}, not an integer")


def _check_tile(op: Op, tile) -> tuple[int, int]:
    if not (isinstance(tile, tuple) and len(tile) == 2 and all(isinstance(v, int) and v >= 1 for v in tile)):
        raise op._error(ArgumentError, f"tile must be a (rows, cols) pair of positive ints, got {tile!r}")
    return tile


def _check_par_dispatch(op: Op, par_dispatch) -> int:
    if not isinstance(par_dispatch, int) or par_dispatch < 1:
        raise op._error(ArgumentError, f"par_dispatch must be a positive int, got {par_dispatch!r}")
    return par_dispatch


def _check_address_stream(op: Op, s: Stream, what: str) -> None:
    if not (isinstance(s.dtype, Tile) and s.dtype.dtype == UINT64 and s.dtype.shape == (1, 1)):
        raise op._error(DTypeError, f"{what} must carry Tile[uint64](1, 1) addresses, got {s}")


class _MemoryOp(Op):
    is_memory = True

    def tile_bytes(self) -> int:
        """Bytes of one tile in off-chip storage."""
        return self.tile_rows * self.tile_cols * self.tensor.dtype.bytes

    def off_chip_bytes_factors(self):
        """One tile per element of the output stream (a store overrides it with its input's elements)."""
        return (*self.stream.shape, self.tile_bytes())

    def off_chip_bytes(self):
        return product(self.off_chip_bytes_factors())


class LinearOffChipLoad(_MemoryOp):
    """Affine tiled read of ``tensor`` (the paper's LinearOffChipLoad; the artifact's OffChipLoad).

    For every index vector ``i`` over ``out_shape_tiled``, tile ``sum_k i_k * stride_k`` of the row-major
    tiled tensor is read; stride 0 re-reads (broadcasts). Without ``ref`` the output is
    ``(1,) + out_shape_tiled``; with a reference stream the whole read repeats once per reference element
    and the output is ``ref.shape + out_shape_tiled`` (the artifact's DynOffChipLoad).

    Off-chip bytes ``N(out) * tile_bytes``; on-chip one tile (published) or two (double-buffered).
    """

    kind = "LinearOffChipLoad"

    def __init__(self, graph, tensor: Tensor, tile, out_shape_tiled, stride, *, ref=None,
                 stream_dtype: ScalarType | None = None, par_dispatch: int = 1, name: str | None = None):
        ins = self._begin(graph, [] if ref is None else [ref], name)
        self.tensor = tensor
        self.tile_rows, self.tile_cols = _check_tile(self, tile)
        self.tensor_shape_tiled = tensor.tiled_shape(self.tile_rows, self.tile_cols, self.name)
        out_shape_tiled = tuple(out_shape_tiled)
        stride = tuple(stride)
        if not out_shape_tiled or not all(isinstance(d, int) and d >= 1 for d in out_shape_tiled):
            raise self._error(ArgumentError, f"out_shape_tiled must be positive ints, got {out_shape_tiled}")
        if len(stride) != len(out_shape_tiled) or not all(isinstance(s, int) and s >= 0 for s in stride):
            raise self._error(
                ArgumentError,
                f"stride {stride} must have one non-negative int per out_shape_tiled dim {out_shape_tiled}",
            )
        last = sum((d - 1) * s for d, s in zip(out_shape_tiled, stride))
        n_tiles = product(self.tensor_shape_tiled)
        if last >= n_tiles:
            raise self._error(
                ShapeError,
                f"strided view out_shape_tiled={out_shape_tiled} stride={stride} reaches tile {last}, but tensor "
                f"{tensor.name!r} has only {n_tiles} tiles (tiled shape {list(self.tensor_shape_tiled)})",
            )
        self.out_shape_tiled = out_shape_tiled
        self.stride = stride
        self.par_dispatch = _check_par_dispatch(self, par_dispatch)
        self.stream_dtype = stream_dtype or tensor.dtype
        outer = (1,) if ref is None else ins[0].shape
        self._finish([Stream(Tile(self.stream_dtype, self.tile_rows, self.tile_cols), outer + out_shape_tiled,
                             None if ref is not None else self._view_layout())])

    def _view_layout(self):
        """The layout of the view read (:meth:`stepsim.graph.layout.Layout.from_tile_view`), None when the tensor's
        shape is symbolic or a stride does not step along one tile-grid dimension."""
        shape = self.tensor.shape
        if not all(isinstance(d, int) for d in shape):
            return None
        try:
            return Layout.from_tile_view(shape, (self.tile_rows, self.tile_cols), self.out_shape_tiled, self.stride,
                                         self.stream_dtype.bytes)
        except LayoutError:
            return None

    @property
    def has_ref(self) -> bool:
        return bool(self.inputs)

    def on_chip_bytes(self, convention=PUBLISHED):
        return self.tile_bytes() * (2 if convention.mode == 2 else 1)


class LinearOffChipStore(OnChipFromTerms, _MemoryOp):
    """Store a tile stream linearly into a tensor (a sink; the artifact's OffChipStore).

    Off-chip bytes ``N(in) * |in dtype|`` (the *stream* dtype: fp32 tiles cost 4 B each element even when
    loads are bf16, as in the artifact); on-chip one input element (two when double-buffered).
    """

    kind = "LinearOffChipStore"

    def __init__(self, graph, inp, *, tensor_name: str = "output", par_dispatch: int = 1, name: str | None = None):
        (s,) = self._begin(graph, [inp], name)
        if not is_tile(s.dtype):
            raise self._error(DTypeError, f"input must be a tile stream, got {s}")
        self.tensor_name = tensor_name
        self.par_dispatch = _check_par_dispatch(self, par_dispatch)
        self.tile_rows, self.tile_cols = s.dtype.rows, s.dtype.cols
        tiled = s.shape[1:] or s.shape  # a rank-0 stream (N,) writes N tiles
        if len(tiled) == 1:
            self.tensor_shape = (normalize(tiled[0] * s.dtype.rows), s.dtype.cols)
        else:
            self.tensor_shape = tuple(tiled[:-2]) + (
                normalize(tiled[-2] * s.dtype.rows), normalize(tiled[-1] * s.dtype.cols))
        self._finish([])

    def off_chip_bytes_factors(self):
        s = self.inputs[0].stream
        return (*s.shape, s.dtype.size_in_bytes())

    def on_chip_bytes_terms(self, convention=PUBLISHED):
        """One input element (size factors), twice when double-buffered (mode 2)."""
        return ((*size_factors(self.inputs[0].stream.dtype), 2 if convention.mode == 2 else 1),)


class RandomOffChipLoad(_MemoryOp):
    """Read one tile per address element of ``raddr`` (u64 tile indices into the tiled tensor).

    Output has raddr's shape. Off-chip ``N(out) * tile_bytes``; on-chip one tile (two double-buffered).
    """

    kind = "RandomOffChipLoad"

    def __init__(self, graph, raddr, tensor: Tensor, tile, *, stream_dtype: ScalarType | None = None,
                 base_addr_byte: int = 0, par_dispatch: int = 1, name: str | None = None):
        (a,) = self._begin(graph, [raddr], name)
        _check_address_stream(self, a, "raddr")
        self.tensor = tensor
        self.tile_rows, self.tile_cols = _check_tile(self, tile)
        self.tensor_shape_tiled = tensor.tiled_shape(self.tile_rows, self.tile_cols, self.name)
        self.par_dispatch = _check_par_dispatch(self, par_dispatch)
        self.base_addr_byte = int(base_addr_byte)
        self.stream_dtype = stream_dtype or tensor.dtype
        self._finish([Stream(Tile(self.stream_dtype, self.tile_rows, self.tile_cols), a.shape)])

    def on_chip_bytes(self, convention=PUBLISHED):
        return self.tile_bytes() * (2 if convention.mode == 2 else 1)


class RandomOffChipStore(_MemoryOp):
    """Write each ``wdata`` tile to the tile address given by ``waddr``; emits a Bool ack stream.

    The ack stream has ``waddr``'s shape (``ack_based_on_waddr``, default) or ``wdata``'s. Off-chip
    ``N(ack) * tile_bytes`` (storage dtype); on-chip ``buffer_depth`` tiles (x2 double-buffered).
    ``buffer_depth`` is a metric only; give the feeding FIFO that depth with ``channel_depth`` /
    ``fanout_depth`` on its producer to model it in time. (The artifact tries this with a ``config_dict``
    override on a hand-made Broadcast, which step-perf ignores because the Broadcast is built before the
    store; docs/timing_model.md §2.)
    """

    kind = "RandomOffChipStore"

    def __init__(self, graph, wdata, waddr, tensor: Tensor, tile, *, base_addr_byte: int = 0,
                 par_dispatch: int = 1, buffer_depth: int = 1, ack_based_on_waddr: bool = True,
                 name: str | None = None):
        d, a = self._begin(graph, [wdata, waddr], name)
        if not is_tile(d.dtype):
            raise self._error(DTypeError, f"wdata must be a tile stream, got {d}")
        _check_address_stream(self, a, "waddr")
        self.tensor = tensor
        self.tile_rows, self.tile_cols = _check_tile(self, tile)
        self.tensor_shape_tiled = tensor.tiled_shape(self.tile_rows, self.tile_cols, self.name)
        if is_static(d.dtype.rows) and is_static(d.dtype.cols) and (d.dtype.rows, d.dtype.cols) != (
                self.tile_rows, self.tile_cols):
            raise self._error(ShapeError, f"wdata tiles {d.dtype} do not match the store tile {tile}")
        if not isinstance(buffer_depth, int) or buffer_depth < 1:
            raise self._error(ArgumentError, f"buffer_depth must be a positive int, got {buffer_depth!r}")
        self.base_addr_byte = int(base_addr_byte)
        self.par_dispatch = _check_par_dispatch(self, par_dispatch)
        self.buffer_depth = buffer_depth
        self.ack_based_on_waddr = bool(ack_based_on_waddr)
        self._finish([Stream(BOOL, a.shape if ack_based_on_waddr else d.shape)])

    def on_chip_bytes(self, convention=PUBLISHED):
        return self.tile_bytes() * self.buffer_depth * (2 if convention.mode == 2 else 1)


def describe_view(op: LinearOffChipLoad) -> str:
    return f"{op.tensor.name} tiles {fmt_shape(op.out_shape_tiled)} stride {op.stride}"
