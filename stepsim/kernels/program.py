"""The engine's input: a :class:`Program` (flat int64 arrays) and the :class:`ProgramBuilder` that makes one.

A Program is what the lowering (``stepsim.graph`` -> here) produces and what :func:`stepsim.kernels.run`
executes. It holds no Python objects the kernels need: units (operators) are rows of ``unit_params``, channels
are rows of the channel arrays, and variable-length data (view shapes, switch cycles, metadata values, selector
target lists) lives in ``payload`` / ``sel_ptr`` / ``sel_idx``. Names are kept on the Python side only, for
error messages.

Example
-------
>>> from stepsim.kernels.program import ProgramBuilder
>>> b = ProgramBuilder()
>>> x = b.add_channel(name="x")
>>> b.offchip_load(out=x, tile_rows=64, tile_cols=64, elem_bytes=2, view_shape=(4,), name="load")
0
>>> b.sink(inp=x, name="sink")
1
>>> program = b.build()
>>> program.n_units, program.n_channels
(2, 1)

Conventions (all builder methods)
---------------------------------
* Keyword-only arguments; ``name`` (optional) labels the unit in messages; the return value is the unit id.
* Channel arguments are ids returned by :meth:`ProgramBuilder.add_channel`. A channel has exactly one
  producer and one consumer; fan-out needs an explicit :meth:`ProgramBuilder.broadcast`.
* Sizes: rows / cols in elements, ``elem_bytes`` in bytes per element, ``compute_bw`` in FLOPs/cycle,
  ``switch_cycles`` in cycles. Shapes are tuples of ints, outermost first; stop levels follow docs/semantics.md
  §1.2 (the last element of a static shape ``(D_n, ..., D_1)`` closes level ``n``).
* Function codes are :mod:`stepsim.kernels.abi` ``FN_*`` ints or their names (``"matmul"``, ``"exp"``, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from stepsim.base.errors import LoweringError
from stepsim.base.hardware import Hardware
from stepsim.kernels import abi

# element kinds of a channel (for port typing); ANY = pass-through, resolved by propagation
_TILE, _SCALAR, _SELECTOR, _BUFFER = "tile", "scalar", "selector", "buffer"
_DATA = frozenset({_TILE, _SCALAR})
_ALL = frozenset({_TILE, _SCALAR, _SELECTOR, _BUFFER})
#: what routing operators move: data, and selectors too (the dynamic attention routes EagerMerge choices)
_ROUTED = frozenset({_TILE, _SCALAR, _SELECTOR})

#: functional mode keeps one stride per view dim in a fixed-size table (stepsim.kernels.values.N_STRIDES)
_MAX_VIEW_DIMS = 8

_FN_BY_NAME = {name: code for code, name in abi.FUNCTION_NAMES.items()}
_FN_BY_NAME.update({"rowwise_sum": abi.FN_ROWSUM, "rowwise_max": abi.FN_ROWMAX, "row_wise_append": abi.FN_ROW_APPEND,
                    "dyn_matmul": abi.FN_MATMUL})


def function_code(fn: int | str, *, unit: str = "?") -> int:
    """Resolve a function given as an ``abi.FN_*`` code or a name (case-insensitive)."""
    if isinstance(fn, str):
        code = _FN_BY_NAME.get(fn.lower())
        if code is None:
            raise LoweringError(f"{unit}: unknown function {fn!r}; known: {', '.join(sorted(_FN_BY_NAME))}")
        return code
    code = int(fn)
    if code not in abi.FUNCTION_NAMES:
        raise LoweringError(f"{unit}: unknown function code {fn!r}")
    return code


@dataclass(frozen=True)
class TensorRef:
    """Where a memory operator's tiles live, for functional mode (timing never reads it).

    Attributes
    ----------
    name : str
        Tensor name; memory operators naming the same tensor share its values (a KV cache is read and written).
    rows, cols : int
        The tensor as a matrix: leading dims are folded into rows (``shape[:-1]`` multiplied), cols = ``shape[-1]``.
    tile_rows, tile_cols : int
        The tile grid: tile t is at tile-row ``t // (cols / tile_cols)``, tile-col ``t % (cols / tile_cols)``
        (the row-major tiled tensor of docs/semantics.md §2.1; random addresses are such tile indices).
    bf16 : bool
        Stored as bf16: values are rounded to bf16 on load and on store.
    strides : tuple of int
        Loads only: tile stride per view dim (the tile read by view index vector i is ``sum i_k * strides_k``);
        empty means row-major over the view (stride 1 on the innermost dim, as a contiguous read).
    shape : tuple of int
        The tensor's own shape (functional outputs are returned in it); empty means ``(rows, cols)``.
    """

    name: str
    rows: int
    cols: int
    tile_rows: int
    tile_cols: int
    bf16: bool = False
    strides: tuple = ()
    shape: tuple = ()

    def __post_init__(self):
        if min(self.rows, self.cols, self.tile_rows, self.tile_cols) < 1 or self.rows % self.tile_rows \
                or self.cols % self.tile_cols:
            raise LoweringError(f"tensor {self.name!r}: tile {self.tile_rows}x{self.tile_cols} must divide its "
                                f"{self.rows}x{self.cols} matrix")

    @property
    def n_tiles(self) -> int:
        """Tiles in the tensor."""
        return (self.rows // self.tile_rows) * (self.cols // self.tile_cols)


@dataclass(frozen=True, eq=False)
class Program:
    """A checked, flat engine program (read-only numpy arrays).

    Attributes
    ----------
    unit_params : int64 array (n_units, abi.N_UP)
        Per unit: opcode, port ranges, HBM priority and opcode parameters (``abi.UP_*`` / ``abi.PA_*``).
    in_ptr, in_ch, out_ptr, out_ch : int64 arrays
        CSR port lists: inputs of unit u are ``in_ch[in_ptr[u]:in_ptr[u+1]]`` in port order (likewise outputs).
    ch_capacity, ch_latency, ch_credit_latency : int64 arrays (n_channels,)
        FIFO capacity (elements), send latency and credit-return latency (cycles).
    ch_producer, ch_consumer : int64 arrays (n_channels,)
        Unit ids of the two endpoints.
    payload : int64 array
        Variable-length parameters (view shapes, switch cycles, metadata values, repeat factors).
    sel_ptr, sel_idx : int64 arrays
        Selector CSR shared by all SelectGens: element e selects ``sel_idx[sel_ptr[e]:sel_ptr[e+1]]``.
    hw : int64 array (abi.N_HW,)
        Hardware vector (``abi.HW_*``).
    mem_order : int64 array
        Memory units in HBM arbitration order (readers in builder order, then writers); each chip's HBM serves
        its own memory units (``unit_params[:, abi.UP_CHIP]``, set from :attr:`ProgramBuilder.chip`) in this order.
    arena_rows : int
        Rows of the Bufferize token arena.
    unit_names, channel_names : tuple of str
        Labels for messages.
    hardware : Hardware
        The hardware the program was built for.
    unit_tensors : tuple of (TensorRef or None)
        Per unit, the tensor a memory operator reads or writes (functional mode); None elsewhere.
    """

    unit_params: np.ndarray
    in_ptr: np.ndarray
    in_ch: np.ndarray
    out_ptr: np.ndarray
    out_ch: np.ndarray
    ch_capacity: np.ndarray
    ch_latency: np.ndarray
    ch_credit_latency: np.ndarray
    ch_producer: np.ndarray
    ch_consumer: np.ndarray
    payload: np.ndarray
    sel_ptr: np.ndarray
    sel_idx: np.ndarray
    hw: np.ndarray
    mem_order: np.ndarray
    arena_rows: int
    unit_names: tuple[str, ...]
    channel_names: tuple[str, ...]
    hardware: Hardware = field(default_factory=Hardware)
    unit_tensors: tuple = ()

    @property
    def n_units(self) -> int:
        """Number of units (operators)."""
        return int(self.unit_params.shape[0])

    @property
    def n_channels(self) -> int:
        """Number of channels."""
        return int(self.ch_capacity.shape[0])

    def opcode(self, unit: int) -> int:
        """The ``abi.OP_*`` opcode of a unit."""
        return int(self.unit_params[unit, abi.UP_OPCODE])

    def opcode_name(self, unit: int) -> str:
        """Operator class name of a unit (``"Map"``, ``"OffChipLoad"``, ...)."""
        return abi.OPCODE_NAMES[self.opcode(unit)]

    def inputs(self, unit: int) -> list[int]:
        """Input channel ids of a unit, in port order."""
        return [int(c) for c in self.in_ch[self.in_ptr[unit]:self.in_ptr[unit + 1]]]

    def outputs(self, unit: int) -> list[int]:
        """Output channel ids of a unit, in port order."""
        return [int(c) for c in self.out_ch[self.out_ptr[unit]:self.out_ptr[unit + 1]]]

    def with_arena_scale(self, scale: int) -> Program:
        """A copy whose Bufferize arena regions are ``scale`` times larger (used after an arena overflow)."""
        params = self.unit_params.copy()
        base = 0
        for u in range(self.n_units):
            if params[u, abi.UP_OPCODE] == abi.OP_BUFFERIZE:
                size = int(params[u, abi.UP_A0 + abi.PA_ARENA_SIZE]) * scale
                params[u, abi.UP_A0 + abi.PA_ARENA_BASE] = base
                params[u, abi.UP_A0 + abi.PA_ARENA_SIZE] = size
                base += size
        params.setflags(write=False)
        import dataclasses
        return dataclasses.replace(self, unit_params=params, arena_rows=max(base, 1))


@dataclass
class _Unit:
    opcode: int
    name: str
    ins: list[int]
    outs: list[int]
    params: dict[int, int]
    in_kinds: list[frozenset]  # accepted kinds per input port
    out_kinds: list[object]  # per output port: a kind, or ("same", input_port)
    payload: list[int] = field(default_factory=list)  # appended to the program payload; offsets patched
    payload_slots: tuple[int, ...] = ()  # PA_* slots that hold offsets into this unit's payload (relative)
    tensor: TensorRef | None = None  # memory operators: the tensor (functional mode)
    chip: int = 0  # the chip the unit is on (memory operators use its HBM)


class ProgramBuilder:
    """Builds a :class:`Program` one operator at a time (see the module docstring for conventions).

    Parameters
    ----------
    hardware : Hardware, optional
        Defaults to ``Hardware.preset("step-eval")``. Supplies the default channel capacity, the HBM model and
        the on-chip bandwidth.
    """

    def __init__(self, hardware: Hardware | None = None):
        self.hardware = hardware if hardware is not None else Hardware.preset("step-eval")
        self._units: list[_Unit] = []
        self._ch_capacity: list[int] = []
        self._ch_latency: list[int] = []
        self._ch_credit: list[int] = []
        self._ch_names: list[str] = []
        self._sel_ptr: list[int] = [0]
        self._sel_idx: list[int] = []
        #: the chip the operators added next are placed on (>= 0); memory operators use that chip's HBM
        self.chip = 0

    # ------------------------------------------------------------------------------------------ channels
    def add_channel(self, capacity: int | None = None, name: str | None = None, latency: int = 1,
                    credit_latency: int = 1) -> int:
        """Add a FIFO channel and return its id.

        Parameters
        ----------
        capacity : int, optional
            Slots (elements); default ``hardware.default_channel_capacity``.
        name : str, optional
            Label for messages (default ``ch<id>``).
        latency, credit_latency : int
            Send latency and credit-return latency (cycles, >= 1).
        """
        cid = len(self._ch_capacity)
        cap = self.hardware.default_channel_capacity if capacity is None else int(capacity)
        label = name if name is not None else f"ch{cid}"
        if cap < 1:
            raise LoweringError(f"channel {label!r}: capacity must be >= 1, got {capacity!r}")
        if latency < 1 or credit_latency < 1:
            raise LoweringError(f"channel {label!r}: latency and credit_latency must be >= 1 "
                                f"(got {latency}, {credit_latency})")
        self._ch_capacity.append(cap)
        self._ch_latency.append(int(latency))
        self._ch_credit.append(int(credit_latency))
        self._ch_names.append(label)
        return cid

    # ------------------------------------------------------------------------------------------ internals
    def _add(self, opcode: int, name: str | None, ins: Sequence[int], outs: Sequence[int], params: dict[int, int],
             in_kinds: Sequence[frozenset], out_kinds: Sequence[object], payload: Sequence[int] = (),
             payload_slots: tuple[int, ...] = (), tensor: TensorRef | None = None) -> int:
        uid = len(self._units)
        label = name if name is not None else f"{abi.OPCODE_NAMES[opcode]}_{uid}"
        for c in list(ins) + list(outs):
            if not isinstance(c, (int, np.integer)) or not 0 <= int(c) < len(self._ch_capacity):
                raise LoweringError(f"{label}: {c!r} is not a channel id (add it with add_channel first)")
        if isinstance(self.chip, bool) or not isinstance(self.chip, (int, np.integer)) or self.chip < 0:
            raise LoweringError(f"{label}: ProgramBuilder.chip must be an int >= 0, got {self.chip!r}")
        self._units.append(_Unit(opcode, label, [int(c) for c in ins], [int(c) for c in outs],
                                 {k: int(v) for k, v in params.items()}, list(in_kinds), list(out_kinds),
                                 [int(v) for v in payload], payload_slots, tensor, int(self.chip)))
        return uid

    @staticmethod
    def _shape(shape, label: str, what: str) -> tuple[int, ...]:
        dims = tuple(int(d) for d in shape)
        if any(d < 1 for d in dims):
            raise LoweringError(f"{label}: {what} {tuple(shape)!r} must hold positive ints")
        return dims

    def _label(self, opcode: int, name: str | None) -> str:
        return name if name is not None else f"{abi.OPCODE_NAMES[opcode]}_{len(self._units)}"

    @staticmethod
    def _need(cond: bool, label: str, message: str) -> None:
        if not cond:
            raise LoweringError(f"{label}: {message}")

    # ------------------------------------------------------------------------------------ sources / sinks
    def select_gen(self, *, out: int, targets_ptr: Sequence[int], targets_idx: Sequence[int],
                   shape: Sequence[int] | None = None, n_targets: int, name: str | None = None) -> int:
        """Selector source: element i selects ``targets_idx[targets_ptr[i]:targets_ptr[i+1]]`` of ``n_targets``.

        Targets are kept in ascending order per element (the order Partition routes and Reassemble breaks
        ties in). Any number of targets works (the selector token references the shared CSR).

        Element i is stamped ``now + 1`` and the clock advances by 1 per element. Stop levels come from the
        static stream ``shape`` (default ``(1, n_elements)``, the artifact's SelectGen shape), capped at its
        rank ``len(shape) - 1``: the outermost dim's end is the channel's close, not a stop.
        """
        label = self._label(abi.OP_SELECT_GEN, name)
        ptr = np.asarray(targets_ptr, dtype=np.int64)
        idx = np.asarray(targets_idx, dtype=np.int64)
        self._need(ptr.ndim == 1 and len(ptr) >= 1 and ptr[0] == 0 and np.all(np.diff(ptr) >= 0)
                   and ptr[-1] == len(idx), label, "targets_ptr must be a CSR pointer array starting at 0 and "
                   "ending at len(targets_idx)")
        n = len(ptr) - 1
        self._need(n_targets >= 1, label, f"n_targets must be >= 1, got {n_targets}")
        self._need(bool(np.all((idx >= 0) & (idx < n_targets))), label,
                   f"every target must be in [0, {n_targets}); got min {idx.min() if len(idx) else 0}, "
                   f"max {idx.max() if len(idx) else 0}")
        dims = self._shape(shape if shape is not None else (1, n), label, "shape")
        self._need(int(np.prod(dims)) == n, label, f"shape {dims} holds {int(np.prod(dims))} elements but "
                   f"targets_ptr describes {n}")
        levels = dims[1:]  # stop levels close the inner dims only (capped at the stream rank)
        e0 = len(self._sel_ptr) - 1
        base = len(self._sel_idx)
        for i in range(n):  # targets of one element in ascending order (the routing order of step-perf)
            self._sel_idx.extend(sorted(int(t) for t in idx[ptr[i]:ptr[i + 1]]))
        self._sel_ptr.extend(int(p) + base for p in ptr[1:])
        return self._add(abi.OP_SELECT_GEN, name, [], [out],
                         {abi.PA_SHAPE_LEN: len(levels), abi.PA_N_ELEMS: n, abi.PA_VALUES_OFF: e0,
                          abi.PA_N_TARGETS: n_targets},
                         [], [_SELECTOR], payload=levels, payload_slots=(abi.PA_SHAPE_OFF,))

    def metadata_gen(self, *, out: int, values: Sequence[int], shape: Sequence[int] | None = None,
                     name: str | None = None) -> int:
        """u64 scalar source: element i (value ``values[i]``) is requested at stamp i (arrivals 1, 1, 2, ...).

        Stop levels come from the stream ``shape`` (default ``(1, len(values))``), capped at its rank.
        """
        label = self._label(abi.OP_METADATA_GEN, name)
        vals = [int(v) for v in np.asarray(values).reshape(-1)]
        dims = self._shape(shape if shape is not None else (1, len(vals)), label, "shape")
        self._need(int(np.prod(dims)) == len(vals), label, f"shape {dims} does not match {len(vals)} values")
        levels = list(dims[1:])  # the outermost dim's end is the channel's close, not a stop
        off_values = len(levels)
        return self._add(abi.OP_METADATA_GEN, name, [], [out],
                         {abi.PA_SHAPE_LEN: len(levels), abi.PA_N_ELEMS: len(vals), abi.PA_VALUES_OFF: off_values},
                         [], [_SCALAR], payload=levels + vals,
                         payload_slots=(abi.PA_SHAPE_OFF, abi.PA_VALUES_OFF))

    def sink(self, *, inp: int, name: str | None = None) -> int:
        """Consumer: dequeue each element, then +1 cycle (final clock = last arrival + 1)."""
        return self._add(abi.OP_SINK, name, [inp], [], {}, [_ALL], [])

    # ------------------------------------------------------------------------------------------ memory
    def _mem_params(self, label, tile_rows, tile_cols, elem_bytes, par_dispatch):
        self._need(tile_rows >= 1 and tile_cols >= 1 and elem_bytes >= 1, label,
                   f"tile {tile_rows}x{tile_cols} with {elem_bytes} B/elem must be positive")
        self._need(par_dispatch >= 1, label, f"par_dispatch must be >= 1, got {par_dispatch}")
        return {abi.PA_TILE_ROWS: tile_rows, abi.PA_TILE_COLS: tile_cols, abi.PA_ELEM_BYTES: elem_bytes,
                abi.PA_PAR_DISPATCH: par_dispatch}

    def _check_tensor(self, label, tensor, tile_rows, tile_cols, view_dims=None):
        """Functional-mode tensor of a memory op: its tile grid must be the op's tile; strides fit the view."""
        if tensor is None:
            return None
        self._need(isinstance(tensor, TensorRef), label, f"tensor must be a TensorRef, got {tensor!r}")
        if tile_rows is not None:
            self._need((tensor.tile_rows, tensor.tile_cols) == (tile_rows, tile_cols), label,
                       f"tensor {tensor.name!r} is tiled {tensor.tile_rows}x{tensor.tile_cols}, the op reads "
                       f"{tile_rows}x{tile_cols} tiles")
        if view_dims is not None:
            self._need(len(view_dims) <= _MAX_VIEW_DIMS, label,
                       f"a load with a tensor (functional mode) supports views of at most {_MAX_VIEW_DIMS} dims, "
                       f"got {len(view_dims)}")
            self._need(not tensor.strides or len(tensor.strides) == len(view_dims), label,
                       f"tensor {tensor.name!r} has {len(tensor.strides)} strides for a {len(view_dims)}-dim view")
        return tensor

    def offchip_load(self, *, out: int, tile_rows: int, tile_cols: int, elem_bytes: int,
                     view_shape: Sequence[int], par_dispatch: int = 1, tensor: TensorRef | None = None,
                     name: str | None = None, resident: bool = False) -> int:
        """Load ``prod(view_shape)`` tiles in view order; a tile's stop level is the number of view dims it closes.

        Each tile costs ``n_req = tile_rows * ceil(tile_cols * elem_bytes / addr_offset)`` HBM requests issued
        ``par_dispatch`` per cycle; tiles of one op never overlap. Output tiles have read_from_mu set.
        ``tensor`` says where the values come from in functional mode. ``resident``: the tensor is already in
        on-chip memory (a collective's input): no HBM requests, no off-chip bytes, 0 own cycles per tile.
        """
        label = self._label(abi.OP_OFFCHIP_LOAD, name)
        params = self._mem_params(label, tile_rows, tile_cols, elem_bytes, par_dispatch)
        params[abi.PA_RESIDENT] = int(bool(resident))
        dims = self._shape(view_shape, label, "view_shape")
        self._need(len(dims) >= 1, label, "view_shape must have at least one dim")
        params.update({abi.PA_VIEW_LEN: len(dims), abi.PA_N_TILES: int(np.prod(dims))})
        return self._add(abi.OP_OFFCHIP_LOAD, name, [], [out], params, [], [_TILE], payload=dims,
                         payload_slots=(abi.PA_VIEW_OFF,),
                         tensor=self._check_tensor(label, tensor, tile_rows, tile_cols, dims))

    def dyn_offchip_load(self, *, ref: int, out: int, tile_rows: int, tile_cols: int, elem_bytes: int,
                         view_shape: Sequence[int], par_dispatch: int = 1, tensor: TensorRef | None = None,
                         name: str | None = None) -> int:
        """Per ``ref`` element: load the whole view; the closing tile gets ``ref stop + len(view_shape)``."""
        label = self._label(abi.OP_DYN_OFFCHIP_LOAD, name)
        params = self._mem_params(label, tile_rows, tile_cols, elem_bytes, par_dispatch)
        dims = self._shape(view_shape, label, "view_shape")
        self._need(len(dims) >= 1, label, "view_shape must have at least one dim")
        params.update({abi.PA_VIEW_LEN: len(dims), abi.PA_N_TILES: int(np.prod(dims))})
        return self._add(abi.OP_DYN_OFFCHIP_LOAD, name, [ref], [out], params, [_ALL], [_TILE], payload=dims,
                         payload_slots=(abi.PA_VIEW_OFF,),
                         tensor=self._check_tensor(label, tensor, tile_rows, tile_cols, dims))

    def random_offchip_load(self, *, raddr: int, out: int, tile_rows: int, tile_cols: int, elem_bytes: int,
                            par_dispatch: int = 1, tensor: TensorRef | None = None, name: str | None = None) -> int:
        """Per u64 address element: load one tile (the address is its tile index in ``tensor``), emitted with
        the address element's stop level."""
        label = self._label(abi.OP_RANDOM_OFFCHIP_LOAD, name)
        params = self._mem_params(label, tile_rows, tile_cols, elem_bytes, par_dispatch)
        return self._add(abi.OP_RANDOM_OFFCHIP_LOAD, name, [raddr], [out], params, [_DATA], [_TILE],
                         tensor=self._check_tensor(label, tensor, tile_rows, tile_cols))

    def offchip_store(self, *, inp: int, par_dispatch: int = 1, traffic_elem_bytes: int = 0,
                      tensor: TensorRef | None = None, name: str | None = None, resident: bool = False) -> int:
        """Store each input tile; ``n_req`` comes from the tile's own rows / cols / bytes (a sink).

        ``traffic_elem_bytes`` > 0 counts the stored traffic at that width per element instead of the tile's
        (step-perf's mock_bf16 times fp32 stores at 2 B/elem, but the tensor in memory is 4 B/elem).
        In functional mode, input tile i is written as tile i of ``tensor``. ``resident``: the tensor stays in
        on-chip memory (a collective's output): each tile is dequeued at its arrival, no HBM, no off-chip bytes.
        """
        label = self._label(abi.OP_OFFCHIP_STORE, name)
        self._need(par_dispatch >= 1, label, f"par_dispatch must be >= 1, got {par_dispatch}")
        self._need(traffic_elem_bytes >= 0, label, f"traffic_elem_bytes must be >= 0, got {traffic_elem_bytes}")
        return self._add(abi.OP_OFFCHIP_STORE, name, [inp], [],
                         {abi.PA_PAR_DISPATCH: par_dispatch, abi.PA_ELEM_BYTES: traffic_elem_bytes,
                          abi.PA_RESIDENT: int(bool(resident))}, [_DATA], [],
                         tensor=self._check_tensor(label, tensor, None, None))

    def random_offchip_store(self, *, waddr: int, wdata: int, ack: int, tile_rows: int, tile_cols: int,
                             elem_bytes: int, par_dispatch: int = 1, ack_based_on_waddr: bool = True,
                             tensor: TensorRef | None = None, name: str | None = None) -> int:
        """Per (waddr, wdata) pair: store one tile, then emit a bool ack (stop level from waddr or wdata)."""
        label = self._label(abi.OP_RANDOM_OFFCHIP_STORE, name)
        params = self._mem_params(label, tile_rows, tile_cols, elem_bytes, par_dispatch)
        params[abi.PA_ACK_ON_WADDR] = int(bool(ack_based_on_waddr))
        return self._add(abi.OP_RANDOM_OFFCHIP_STORE, name, [waddr, wdata], [ack], params, [_DATA, _DATA],
                         [_SCALAR], tensor=self._check_tensor(label, tensor, tile_rows, tile_cols))

    # ------------------------------------------------------------------------------------------ buffers
    def bufferize(self, *, inp: int, out: int, rank: int, max_buffer_elems: int = 1024,
                  name: str | None = None) -> int:
        """Collect the inner ``rank`` dims into an on-chip buffer; emit one buffer reference per group.

        +1 cycle per element except the closing one. ``max_buffer_elems`` sizes the arena region (it grows
        automatically on overflow).
        """
        label = self._label(abi.OP_BUFFERIZE, name)
        self._need(rank >= 1, label, f"rank must be >= 1, got {rank}")
        self._need(max_buffer_elems >= 1, label, "max_buffer_elems must be >= 1")
        return self._add(abi.OP_BUFFERIZE, name, [inp], [out],
                         {abi.PA_RANK: rank, abi.PA_ARENA_SIZE: max_buffer_elems}, [_DATA], [_BUFFER])

    def streamify(self, *, inp: int, out: int, rank: int, repeat_factors: Sequence[int] = (),
                  name: str | None = None) -> int:
        """Replay each buffer ``prod(repeat_factors)`` times at 1 element/cycle (output ``in + repeat + buffer``).

        ``rank`` is the buffered rank b of the incoming buffers.
        """
        label = self._label(abi.OP_STREAMIFY, name)
        reps = self._shape(repeat_factors, label, "repeat_factors")
        self._need(rank >= 1, label, f"rank must be >= 1, got {rank}")
        return self._add(abi.OP_STREAMIFY, name, [inp], [out],
                         {abi.PA_REPEAT_LEN: len(reps), abi.PA_REPEAT_PROD: int(np.prod(reps)) if reps else 1,
                          abi.PA_RANK: rank},
                         [frozenset({_BUFFER})], [_TILE], payload=reps, payload_slots=(abi.PA_REPEAT_OFF,))

    def dyn_streamify(self, *, inp: int, ref: int, out: int, repeat_rank: int, bufferized_rank: int,
                      name: str | None = None) -> int:
        """Replay each buffer once per ``ref`` element until a ref stop >= ``repeat_rank + 1``."""
        label = self._label(abi.OP_DYN_STREAMIFY, name)
        self._need(repeat_rank >= 0 and bufferized_rank >= 1, label,
                   f"need repeat_rank >= 0 and bufferized_rank >= 1, got {repeat_rank}, {bufferized_rank}")
        return self._add(abi.OP_DYN_STREAMIFY, name, [inp, ref], [out],
                         {abi.PA_REPEAT_RANK: repeat_rank, abi.PA_BUF_RANK: bufferized_rank},
                         [frozenset({_BUFFER}), _ALL], [_TILE])

    # ------------------------------------------------------------------------------------------ compute
    def _compute_params(self, label, fn, fn_param, compute_bw, write_back_mu, *, accum: bool):
        code = function_code(fn, unit=label)
        if accum:
            self._need(code in abi.ACCUM_FUNCTIONS, label,
                       f"function {abi.FUNCTION_NAMES[code]!r} cannot be used as an accumulator")
        self._need(compute_bw >= 0, label, f"compute_bw must be >= 0, got {compute_bw}")
        self._need(code not in abi.FLOP_FUNCTIONS or compute_bw > 0, label,
                   f"function {abi.FUNCTION_NAMES[code]!r} is FLOP-based and needs compute_bw > 0 "
                   "(step-perf's div_ceil panics on 0)")
        return {abi.PA_FN: code, abi.PA_FN_PARAM: int(fn_param), abi.PA_COMPUTE_BW: int(compute_bw),
                abi.PA_WRITE_BACK: int(bool(write_back_mu))}

    def map(self, *, ins: Sequence[int], out: int, fn: int | str, fn_param: int = 0, compute_bw: int = 1024,
            write_back_mu: bool = False, name: str | None = None) -> int:
        """UnaryMap (1 input) or BinaryMap (2 inputs): ``now += max(sum L(in), F, W(out))``, ENQ, then DEQ."""
        label = self._label(abi.OP_MAP, name)
        ins = [int(c) for c in ([ins] if isinstance(ins, (int, np.integer)) else ins)]
        params = self._compute_params(label, fn, fn_param, compute_bw, write_back_mu, accum=False)
        code = params[abi.PA_FN]
        self._need(len(ins) in (1, 2), label, f"needs 1 or 2 inputs, got {len(ins)}")
        self._need(code not in (abi.FN_RETILE_ROW, abi.FN_RETILE_COL, abi.FN_SIGNAL_REQ_ALL_READ,
                                abi.FN_ONLINE_SOFTMAX), label, f"{abi.FUNCTION_NAMES[code]!r} is an accumulator function")
        binary = code in abi.BINARY_FUNCTIONS
        self._need(binary == (len(ins) == 2), label,
                   f"function {abi.FUNCTION_NAMES[code]!r} takes {2 if binary else 1} input(s), got {len(ins)}")
        out_kind = _SCALAR if code == abi.FN_CACHE_WRITE_ADDR else _TILE
        return self._add(abi.OP_MAP, name, ins, [out], params, [_DATA] * len(ins), [out_kind])

    def _init_params(self, label, init_rows, init_cols, init_elem_bytes, rank):
        self._need(init_rows >= 0 and init_cols >= 0 and init_elem_bytes >= 0, label,
                   "init tile dims must be >= 0")
        self._need(rank >= 0, label, f"rank must be >= 0, got {rank}")
        return {abi.PA_INIT_ROWS: init_rows, abi.PA_INIT_COLS: init_cols, abi.PA_INIT_BYTES: init_elem_bytes,
                abi.PA_RANK: rank}

    def accum(self, *, inp: int, out: int, fn: int | str, init_rows: int, init_cols: int, init_elem_bytes: int,
              rank: int, compute_bw: int = 1024, write_back_mu: bool = False, fn_param: int = 0,
              name: str | None = None) -> int:
        """Reduce the inner ``rank`` dims; store cost only on the closing element, sized by the init tile."""
        label = self._label(abi.OP_ACCUM, name)
        params = self._compute_params(label, fn, fn_param, compute_bw, write_back_mu, accum=True)
        params.update(self._init_params(label, init_rows, init_cols, init_elem_bytes, rank))
        self._need(rank >= 1, label, f"rank must be >= 1, got {rank}")
        out_kind = _SCALAR if params[abi.PA_FN] == abi.FN_SIGNAL_REQ_ALL_READ else _TILE
        return self._add(abi.OP_ACCUM, name, [inp], [out], params, [_DATA], [out_kind])

    def map_accum(self, *, in1: int, in2: int, out: int, fn: int | str, init_rows: int, init_cols: int,
                  init_elem_bytes: int, rank: int, compute_bw: int = 1024, write_back_mu: bool = False,
                  fn_param: int = 0, name: str | None = None) -> int:
        """BinaryMapAccum: two lock-stepped inputs, loads summed, reduce over ``rank``; DEQ both, then ENQ."""
        label = self._label(abi.OP_MAP_ACCUM, name)
        params = self._compute_params(label, fn, fn_param, compute_bw, write_back_mu, accum=False)
        self._need(params[abi.PA_FN] in abi.MAP_ACCUM_FUNCTIONS, label,
                   f"{abi.FUNCTION_NAMES[params[abi.PA_FN]]!r} is not a MapAccum function")
        params.update(self._init_params(label, init_rows, init_cols, init_elem_bytes, rank))
        self._need(rank >= 1, label, f"rank must be >= 1, got {rank}")
        return self._add(abi.OP_MAP_ACCUM, name, [in1, in2], [out], params, [_DATA, _DATA], [_TILE])

    def scan(self, *, inp: int, out: int, fn: int | str, init_rows: int, init_cols: int, init_elem_bytes: int,
             rank: int, compute_bw: int = 1024, write_back_mu: bool = False, fn_param: int = 0,
             name: str | None = None) -> int:
        """Scan (@5fbd7223): ``now += max(L, F, W(out))`` per element, one output per input, reset at stop >= rank."""
        label = self._label(abi.OP_SCAN, name)
        params = self._compute_params(label, fn, fn_param, compute_bw, write_back_mu, accum=True)
        params.update(self._init_params(label, init_rows, init_cols, init_elem_bytes, rank))
        return self._add(abi.OP_SCAN, name, [inp], [out], params, [_DATA], [_TILE])

    # ------------------------------------------------------------------------------------------ routing
    def _switch(self, label, switch_cycles, n):
        sw = [int(s) for s in (switch_cycles if switch_cycles is not None else [1] * n)]
        self._need(len(sw) == n, label, f"switch_cycles has {len(sw)} entries for {n} ports")
        self._need(all(s >= 0 for s in sw), label, "switch_cycles must be >= 0")
        return sw

    def partition(self, *, data: int, sel: int, outs: Sequence[int], rank: int,
                  switch_cycles: Sequence[int] | None = None, write_back_mu: bool = False,
                  name: str | None = None) -> int:
        """FlatPartition: route each rank-``rank`` chunk of ``data`` to every output its selector names."""
        label = self._label(abi.OP_PARTITION, name)
        outs = [int(c) for c in outs]
        self._need(len(outs) >= 1 and rank >= 0, label, "needs >= 1 output and rank >= 0")
        sw = self._switch(label, switch_cycles, len(outs))
        return self._add(abi.OP_PARTITION, name, [data, sel], outs,
                         {abi.PA_RANK: rank, abi.PA_WRITE_BACK: int(bool(write_back_mu))},
                         [_ROUTED, frozenset({_SELECTOR})], [("same", 0)] * len(outs), payload=sw,
                         payload_slots=(abi.PA_SWITCH_OFF,))

    def reassemble(self, *, ins: Sequence[int], sel: int, out: int, rank: int,
                   switch_cycles: Sequence[int] | None = None, write_back_mu: bool = False,
                   name: str | None = None) -> int:
        """FlatReassemble: per selector, wait for every selected input, then drain them by head stamp."""
        label = self._label(abi.OP_REASSEMBLE, name)
        ins = [int(c) for c in ins]
        self._need(len(ins) >= 1 and rank >= 0, label, "needs >= 1 input and rank >= 0")
        sw = self._switch(label, switch_cycles, len(ins))
        return self._add(abi.OP_REASSEMBLE, name, ins + [sel], [out],
                         {abi.PA_RANK: rank, abi.PA_WRITE_BACK: int(bool(write_back_mu))},
                         [_ROUTED] * len(ins) + [frozenset({_SELECTOR})], [("same", 0)], payload=sw,
                         payload_slots=(abi.PA_SWITCH_OFF,))

    def eager_merge(self, *, ins: Sequence[int], data_out: int, sel_out: int, rank: int,
                    name: str | None = None) -> int:
        """EagerMerge: forward whole rank-``rank`` groups in arrival order; emit a one-hot selector per group."""
        label = self._label(abi.OP_EAGER_MERGE, name)
        ins = [int(c) for c in ins]
        self._need(len(ins) >= 1 and rank >= 0, label, "needs >= 1 input and rank >= 0")
        return self._add(abi.OP_EAGER_MERGE, name, ins, [data_out, sel_out], {abi.PA_RANK: rank},
                         [_ALL] * len(ins), [("same", 0), _SELECTOR])

    def parallelize(self, *, inp: int, outs: Sequence[int], rank: int,
                    switch_cycles: Sequence[int] | None = None, name: str | None = None) -> int:
        """Deal rank-``rank`` groups round-robin to ``outs``; stamps delayed by ``switch_cycles[lane]``."""
        label = self._label(abi.OP_PARALLELIZE, name)
        outs = [int(c) for c in outs]
        self._need(len(outs) >= 1 and rank >= 0, label, "needs >= 1 output and rank >= 0")
        sw = self._switch(label, switch_cycles, len(outs))
        return self._add(abi.OP_PARALLELIZE, name, [inp], outs, {abi.PA_RANK: rank}, [_ALL],
                         [("same", 0)] * len(outs), payload=sw, payload_slots=(abi.PA_SWITCH_OFF,))

    def broadcast(self, *, inp: int, outs: Sequence[int], name: str | None = None) -> int:
        """Copy every element to all ``outs`` (waits until every target has a free slot)."""
        outs = [int(c) for c in outs]
        self._need(len(outs) >= 1, self._label(abi.OP_BROADCAST, name), "needs >= 1 output")
        return self._add(abi.OP_BROADCAST, name, [inp], outs, {}, [_ALL], [("same", 0)] * len(outs))

    def link(self, *, ins: Sequence[int], outs: Sequence[int], bandwidth: int, latency: int,
             name: str | None = None) -> int:
        """A link between two chips shared by ``len(ins)`` transfers: transfer k enters on ``ins[k]`` and leaves on
        ``outs[k]`` (:mod:`stepsim.kernels.units_link`).

        Parameters
        ----------
        ins, outs : sequences of channel ids
            One input and one output per transfer (same length, >= 1). Buffer references cannot cross chips.
        bandwidth : int
            Bytes per cycle (>= 1): an element of b bytes occupies the link ``ceil(b / bandwidth)`` cycles.
        latency : int
            Cycles (>= 1) from an element's last byte leaving to its arrival at the receiving unit.

        Example
        -------
        >>> b = ProgramBuilder()
        >>> a, z = b.add_channel(), b.add_channel()
        >>> b.link(ins=[a], outs=[z], bandwidth=64, latency=100, name="chip0->chip1")
        0
        """
        label = self._label(abi.OP_LINK, name)
        ins = [int(c) for c in ins]
        outs = [int(c) for c in outs]
        self._need(len(ins) >= 1 and len(ins) == len(outs), label,
                   f"needs one output per input (>= 1), got {len(ins)} inputs and {len(outs)} outputs")
        for what, value in (("bandwidth", bandwidth), ("latency", latency)):
            self._need(isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 1 <= value <= 2**31 - 1,
                       label, f"{what} must be an int in 1..2147483647, got {value!r}")
        return self._add(abi.OP_LINK, name, ins, outs, {abi.PA_LINK_BW: int(bandwidth), abi.PA_LINK_LAT: int(latency)},
                         [_ROUTED] * len(ins), [("same", k) for k in range(len(outs))])

    # ------------------------------------------------------------------------------------------ shape
    def flatten(self, *, inp: int, out: int, min_rank: int, max_rank: int, name: str | None = None) -> int:
        """Merge dims ``min_rank..max_rank``: L <= min kept, min < L <= max -> min, L > max -> L - (max - min)."""
        label = self._label(abi.OP_FLATTEN, name)
        self._need(0 <= min_rank <= max_rank, label, f"need 0 <= min_rank <= max_rank, got {min_rank}, {max_rank}")
        return self._add(abi.OP_FLATTEN, name, [inp], [out], {abi.PA_MIN_RANK: min_rank, abi.PA_MAX_RANK: max_rank},
                         [_ALL], [("same", 0)])

    def promote(self, *, inp: int, out: int, rank: int, input_rank: int | None = None,
                name: str | None = None) -> int:
        """Insert a size-1 dim at ``rank``: stops L >= rank become L + 1.

        If ``input_rank`` is given and ``rank == input_rank + 1`` (the new dim is outermost), the last element
        of the stream also gets ``input_rank + 1``; each element then waits for the next (or the close).
        """
        label = self._label(abi.OP_PROMOTE, name)
        self._need(rank >= 0, label, f"rank must be >= 0, got {rank}")
        outer = int(input_rank is not None and rank == input_rank + 1)
        return self._add(abi.OP_PROMOTE, name, [inp], [out], {abi.PA_RANK: rank, abi.PA_PROMOTE_OUTER: outer},
                         [_ALL], [("same", 0)])

    def reshape(self, *, inp: int, out: int, chunk: int, rank: int, pad_rows: int = 0, pad_cols: int = 0,
                pad_elem_bytes: int = 0, add_outer_dim: bool = False, write_back_mu: bool = False,
                flags_out: int | None = None, name: str | None = None) -> int:
        """Split the dim at ``rank`` into (ceil(D/chunk), chunk); pad a partial last chunk (rank 0 only).

        ``pad_elem_bytes = 0`` means no padding. Pad tiles carry the pad flag and read_from_mu =
        ``write_back_mu``. ``add_outer_dim`` (rank-0 inputs) makes chunk-closing elements wait for the next
        element or the close. ``flags_out`` (optional) receives the padding-flag stream: one 1-byte Bool scalar
        per output element with the element's stop, value 1 on a pad tile, sent together with the element.
        """
        label = self._label(abi.OP_RESHAPE, name)
        self._need(chunk >= 1 and rank >= 0, label, f"need chunk >= 1 and rank >= 0, got {chunk}, {rank}")
        self._need(pad_elem_bytes == 0 or rank == 0, label, "padding is only allowed when reshaping rank 0")
        self._need(not add_outer_dim or rank == 0, label, "add_outer_dim is only allowed for rank-0 inputs")
        self._need(min(pad_rows, pad_cols, pad_elem_bytes) >= 0, label, "pad tile dims must be >= 0")
        outs, kinds = ([out], [("same", 0)]) if flags_out is None else ([out, flags_out], [("same", 0), _SCALAR])
        return self._add(abi.OP_RESHAPE, name, [inp], outs,
                         {abi.PA_CHUNK: chunk, abi.PA_RANK: rank, abi.PA_PAD_ROWS: pad_rows,
                          abi.PA_PAD_COLS: pad_cols, abi.PA_PAD_BYTES: pad_elem_bytes,
                          abi.PA_ADD_OUTER: int(bool(add_outer_dim)), abi.PA_RESHAPE_WB: int(bool(write_back_mu))},
                         [_ALL], kinds)

    def expand_ref(self, *, inp: int, ref: int, out: int, rank: int, name: str | None = None) -> int:
        """Repeat each input element once per ``ref`` element of its group (group end: ref stop >= ``rank``)."""
        self._need(rank >= 0, self._label(abi.OP_EXPAND_REF, name), f"rank must be >= 0, got {rank}")
        return self._add(abi.OP_EXPAND_REF, name, [inp, ref], [out], {abi.PA_RANK: rank}, [_ALL, _ALL],
                         [("same", 0)])

    def repeat_static(self, *, inp: int, out: int, count: int, name: str | None = None) -> int:
        """Emit each element ``count`` times (requested stamps t .. t+count-1), then +count cycles."""
        self._need(count >= 1, self._label(abi.OP_REPEAT_STATIC, name), f"count must be >= 1, got {count}")
        return self._add(abi.OP_REPEAT_STATIC, name, [inp], [out], {abi.PA_COUNT: count}, [_ALL], [("same", 0)])

    def row_streamify(self, *, inp: int, out: int, split_rows: bool = True, filter_padding: bool = False,
                      new_dim: bool = False, name: str | None = None) -> int:
        """Burst a tile's rows (1xC) or columns (Rx1); with ``filter_padding`` only its valid rows.

        ``new_dim=False`` (RetileStreamify): the pieces join the innermost dim, the last keeps the tile's stop.
        ``new_dim=True`` (FlatMap(RowStreamify)): they form a new innermost dim, the last gets the tile's stop
        + 1 (a tile whose rows are all filtered emits nothing, so its stop is lost; avoid filtering then).
        """
        return self._add(abi.OP_ROW_STREAMIFY, name, [inp], [out],
                         {abi.PA_SPLIT_ROWS: int(bool(split_rows)), abi.PA_FILTER: int(bool(filter_padding)),
                          abi.PA_NEW_DIM: int(bool(new_dim))},
                         [frozenset({_TILE})], [_TILE])

    def expert_addr_gen(self, *, sel: int, out: int, tiles_per_target: int, base: int = 0,
                        name: str | None = None) -> int:
        """Per selector: burst ``tiles_per_target`` u64 addresses ``base + e*T + j`` for each selected e."""
        self._need(tiles_per_target >= 1, self._label(abi.OP_EXPERT_ADDR_GEN, name),
                   f"tiles_per_target must be >= 1, got {tiles_per_target}")
        return self._add(abi.OP_EXPERT_ADDR_GEN, name, [sel], [out],
                         {abi.PA_TILES_PER_TARGET: tiles_per_target, abi.PA_BASE: base},
                         [frozenset({_SELECTOR})], [_SCALAR])

    def cache_read_addr_gen(self, *, idx: int, seq_len: int, out: int, row_offset: int,
                            name: str | None = None) -> int:
        """Per (idx i, seq_len n): n u64 addresses ``i*row_offset + j`` requested at ``now + j``."""
        return self._add(abi.OP_CACHE_READ_ADDR_GEN, name, [idx, seq_len], [out], {abi.PA_ROW_OFFSET: row_offset},
                         [_DATA, _DATA], [_SCALAR])

    def filter_last_tile(self, *, seq_len: int, out: int, name: str | None = None) -> int:
        """Per seq_len n: burst n two-target selectors: target 1 for the first n-1, target 0 for the last."""
        return self._add(abi.OP_FILTER_LAST_TILE, name, [seq_len], [out], {}, [_DATA], [_SELECTOR])

    # ------------------------------------------------------------------------------------------ build
    def build(self) -> Program:
        """Validate and freeze the program.

        Raises
        ------
        LoweringError
            A channel without exactly one producer and one consumer, a port fed the wrong element kind,
            or an out-of-range parameter; the message names the unit and channel.
        """
        n_ch = len(self._ch_capacity)
        producer = [-1] * n_ch
        consumer = [-1] * n_ch
        for uid, unit in enumerate(self._units):
            for c in unit.outs:
                if producer[c] != -1:
                    raise LoweringError(f"channel {self._ch_names[c]!r} has two producers: "
                                        f"{self._units[producer[c]].name!r} and {unit.name!r}")
                producer[c] = uid
            for c in unit.ins:
                if consumer[c] != -1:
                    raise LoweringError(f"channel {self._ch_names[c]!r} has two consumers: "
                                        f"{self._units[consumer[c]].name!r} and {unit.name!r} "
                                        "(use broadcast for fan-out)")
                consumer[c] = uid
        for c in range(n_ch):
            if producer[c] == -1 or consumer[c] == -1:
                missing = "producer" if producer[c] == -1 else "consumer"
                other = consumer[c] if producer[c] == -1 else producer[c]
                who = f" (its other end is {self._units[other].name!r})" if other != -1 else ""
                raise LoweringError(f"channel {self._ch_names[c]!r} has no {missing}{who}")
        self._check_kinds(producer)

        # payload, params, ports
        payload: list[int] = []
        n_units = len(self._units)
        params = np.zeros((n_units, abi.N_UP), dtype=np.int64)
        in_ptr = np.zeros(n_units + 1, dtype=np.int64)
        out_ptr = np.zeros(n_units + 1, dtype=np.int64)
        in_ch: list[int] = []
        out_ch: list[int] = []
        # resident loads / stores (on-chip tensors) never talk to the HBM: no arbitration rank
        readers = [u for u, x in enumerate(self._units)
                   if x.opcode in abi.MEMORY_READ_OPS and not x.params.get(abi.PA_RESIDENT, 0)]
        writers = [u for u, x in enumerate(self._units)
                   if x.opcode in abi.MEMORY_WRITE_OPS and not x.params.get(abi.PA_RESIDENT, 0)]
        mem_order = readers + writers
        # each chip's HBM ranks its own memory operators: readers, then writers, in builder order
        priority = {}
        served: dict[int, int] = {}
        for u in mem_order:
            chip = self._units[u].chip
            priority[u] = served.get(chip, 0)
            served[chip] = priority[u] + 1
        arena = 0
        for uid, unit in enumerate(self._units):
            row = params[uid]
            row[abi.UP_OPCODE] = unit.opcode
            row[abi.UP_IN_START] = len(in_ch)
            row[abi.UP_N_IN] = len(unit.ins)
            row[abi.UP_OUT_START] = len(out_ch)
            row[abi.UP_N_OUT] = len(unit.outs)
            row[abi.UP_MEM_PRIORITY] = priority.get(uid, -1)
            row[abi.UP_CHIP] = unit.chip
            in_ch.extend(unit.ins)
            out_ch.extend(unit.outs)
            in_ptr[uid + 1] = len(in_ch)
            out_ptr[uid + 1] = len(out_ch)
            for slot, value in unit.params.items():
                row[abi.UP_A0 + slot] = value
            base = len(payload)
            payload.extend(unit.payload)
            for slot in unit.payload_slots:
                row[abi.UP_A0 + slot] += base
            if unit.opcode == abi.OP_BUFFERIZE:
                size = unit.params[abi.PA_ARENA_SIZE] * (min(self._ch_capacity[unit.outs[0]], 64) + 2)
                row[abi.UP_A0 + abi.PA_ARENA_BASE] = arena
                row[abi.UP_A0 + abi.PA_ARENA_SIZE] = size
                arena += size

        hw = np.zeros(abi.N_HW, dtype=np.int64)
        h = self.hardware
        hw[abi.HW_ADDR_OFFSET] = h.addr_offset
        hw[abi.HW_HBM_CHANNELS] = h.hbm_channels
        hw[abi.HW_HBM_LATENCY] = h.hbm_latency
        hw[abi.HW_HBM_INIT_INTERVAL] = h.hbm_init_interval
        hw[abi.HW_HBM_START_UP] = h.hbm_start_up
        hw[abi.HW_PMU_BW] = h.pmu_bw

        def frozen(values) -> np.ndarray:
            arr = np.ascontiguousarray(np.asarray(values, dtype=np.int64))
            arr.setflags(write=False)
            return arr

        params.setflags(write=False)
        return Program(
            unit_params=params, in_ptr=frozen(in_ptr), in_ch=frozen(in_ch), out_ptr=frozen(out_ptr),
            out_ch=frozen(out_ch), ch_capacity=frozen(self._ch_capacity), ch_latency=frozen(self._ch_latency),
            ch_credit_latency=frozen(self._ch_credit), ch_producer=frozen(producer), ch_consumer=frozen(consumer),
            payload=frozen(payload if payload else [0]), sel_ptr=frozen(self._sel_ptr),
            sel_idx=frozen(self._sel_idx if self._sel_idx else [0]), hw=frozen(hw),
            mem_order=frozen(mem_order if mem_order else []), arena_rows=max(arena, 1),
            unit_names=tuple(u.name for u in self._units), channel_names=tuple(self._ch_names),
            hardware=self.hardware, unit_tensors=tuple(u.tensor for u in self._units))

    def _check_kinds(self, producer: list[int]) -> None:
        """Propagate element kinds along channels and check every input port accepts what it is fed."""
        n_ch = len(self._ch_capacity)
        kind: list[str | None] = [None] * n_ch
        changed = True
        while changed:
            changed = False
            for unit in self._units:
                for port, c in enumerate(unit.outs):
                    spec = unit.out_kinds[port]
                    k = kind[unit.ins[spec[1]]] if isinstance(spec, tuple) else spec
                    if k is not None and kind[c] is None:
                        kind[c] = k
                        changed = True
        for unit in self._units:
            for port, c in enumerate(unit.ins):
                k = kind[c]
                if k is not None and k not in unit.in_kinds[port]:
                    raise LoweringError(
                        f"{unit.name} ({abi.OPCODE_NAMES[unit.opcode]}): input port {port} (channel "
                        f"{self._ch_names[c]!r}, from {self._units[producer[c]].name!r}) carries {k} elements; "
                        f"expected {' or '.join(sorted(unit.in_kinds[port]))}")
