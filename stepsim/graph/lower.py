"""Lowering: the one seam between the symbolic graph and the numba engine.

``lower(graph, hardware, bindings) -> Program`` walks the finalized graph (broadcasts inserted) in operator
order, gives every edge a FIFO channel, and calls one :class:`~stepsim.kernels.program.ProgramBuilder` method per
operator, resolving every parameter to an int. Operator order is kept because the reference simulator
registers memory operators with the HBM in graph order, which decides same-tick arbitration.

Decisions made here (and why):

* **Channel capacity** = the producer's ``channel_depth`` override, else the run's default depth (``None``
  means 1024, as step-perf's ``DEFAULT_CHAN_SIZE``); without a ``channel_depth`` argument, the hardware's
  (precedence of knob, hardware and workload depths: :mod:`stepsim.base.defaults`). Broadcasts inserted by
  :meth:`Graph.insert_broadcasts` carry the producer's ``fanout_depth``, matching the artifact's overrides
  keyed by the Broadcast's id.
* **Per-channel overrides** (``channel_depths``, e.g. from ``stepsim size-fifos``) are keyed by the channel
  names below (``<operator name>[<output index>]``, stable across builds of the same graph) and win over both;
  a name the graph does not have is an error, so depths sized for another graph are never applied silently.
* **Unconsumed outputs** get an implicit sink (a stream nobody reads would otherwise fill and deadlock),
  except Reshape's padding-flag output: step-perf has no such output, so it gets a channel only when read
  (and then the Reshape sends each element and its flag together).
* **Timing byte widths.** step-perf sizes on-chip tiles with ``f32_bytes``: 2 when the experiment stores fp32
  tensors as bf16 (``mock_bf16``), else 4. Here that width is *derived from the dtypes*: if every loaded
  tensor with an fp32 stream dtype is stored in 2 bytes, fp32 accumulator / padding tiles are 2 bytes wide in
  time, else 4. Loaded tiles are as wide as their storage dtype.
* **Zip** lowers by fusion: the Map that reads it (the graph allows exactly one reader, a Map) takes the Zip's
  two input streams as its operands (the engine has no tuple tokens).
* **FlatMap(RowStreamify)** runs on the RetileStreamify unit with ``new_dim``: the rows form a new innermost
  dim, so the last row's stop is the tile's + 1.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from stepsim.base.defaults import UNBOUNDED_CHANNEL_DEPTH, UNSET, channel_capacity, resolve_channel_depth
from stepsim.base.errors import LoweringError
from stepsim.base.hardware import Hardware
from stepsim.graph import ops_memory as M
from stepsim.graph import ops_shape as S
from stepsim.graph.dims import is_static, product
from stepsim.graph.dtypes import BF16, FP32
from stepsim.graph.graph import Graph
from stepsim.kernels.program import Program, ProgramBuilder, TensorRef

#: kept for importers: the depth ``None`` stands for (stepsim.base.defaults.UNBOUNDED_CHANNEL_DEPTH)
DEFAULT_CHANNEL_DEPTH = UNBOUNDED_CHANNEL_DEPTH


def fp32_timing_bytes(graph: Graph) -> int:
    """On-chip width (bytes) of fp32 tiles in the step-perf timing model (see module docstring)."""
    # a spill's read-back (stepsim.frontend.spill) is scratch, not a model tensor: its dtype says nothing of mock_bf16
    loads = [op for op in graph.ops if isinstance(op, (M.LinearOffChipLoad, M.RandomOffChipLoad))
             and not getattr(op, "spill", False)]
    fp32_loads = [op for op in loads if op.stream_dtype == FP32]
    if fp32_loads and all(op.tensor.dtype.bytes == 2 for op in fp32_loads):
        return 2
    return 4


class _Lowering:
    def __init__(self, graph: Graph, hardware: Hardware, channel_depth, channel_depths=None):
        self.graph = graph.finalize()
        self.channel_depths = dict(channel_depths or {})
        self.builder = ProgramBuilder(hardware)
        self.default_depth = resolve_channel_depth(channel_depth, hardware)
        self.f32_bytes = fp32_timing_bytes(graph)
        self.channel_of: dict[tuple[int, int, int], int] = {}  # (consumer id, input pos) -> channel
        self.out_channel: dict[tuple[int, int], int] = {}  # (producer id, output index) -> channel
        self.fused_zips: dict[int, S.Zip] = {}

    # --- channels -------------------------------------------------------------------------------------

    def _plan_zip_fusion(self) -> None:
        uses = self.graph.consumers()
        for op in self.graph.ops:
            if isinstance(op, S.Zip):
                (reader, _), = uses[(op.id, 0)]  # Graph.validate: exactly one reader, a Map
                self.fused_zips[reader.id] = op

    def _make_channels(self) -> None:
        uses = self.graph.consumers()
        for op in self.graph.ops:
            if isinstance(op, S.Zip):
                continue
            for idx in range(op.num_outputs):
                users = uses.get((op.id, idx), [])
                if isinstance(op, S.Reshape) and idx == 1 and not users:
                    continue
                assert len(users) <= 1, "broadcasts were inserted"
                name = f"{op.name}[{idx}]"
                ch = self.builder.add_channel(channel_capacity(op, idx, self.default_depth, self.channel_depths),
                                              name=name)
                self.channel_depths.pop(name, None)  # used: an override left over names no channel (below)
                self.out_channel[(op.id, idx)] = ch
                if users:
                    consumer, pos = users[0]
                    self.channel_of[(consumer.id, pos)] = ch
                else:
                    self.builder.sink(inp=ch, name=f"{op.name}[{idx}].implicit_sink")
        if self.channel_depths:  # every override was consumed above unless it names no channel of this graph
            unknown = sorted(self.channel_depths)
            raise LoweringError(f"channel_depths: graph {self.graph.name!r} has no channel {unknown[0]!r}"
                                f"{f' (and {len(unknown) - 1} more unknown names)' if len(unknown) > 1 else ''}")

    def inputs(self, op) -> list[int]:
        if op.id in self.fused_zips:
            zip_op = self.fused_zips[op.id]
            return [self.channel_of[(zip_op.id, 0)], self.channel_of[(zip_op.id, 1)]]
        return [self.channel_of[(op.id, pos)] for pos in range(len(op.inputs))]

    def outputs(self, op) -> list[int]:
        return [self.out_channel[(op.id, i)] for i in range(op.num_outputs) if (op.id, i) in self.out_channel]

    # --- operators ------------------------------------------------------------------------------------
    def tile_width(self, dtype) -> int:
        """Timing width in bytes of an accumulator / padding tile of scalar ``dtype``."""
        return self.f32_bytes if dtype == FP32 else dtype.bytes

    def run(self) -> Program:
        self._plan_zip_fusion()
        self._make_channels()
        for op in self.graph.ops:
            if isinstance(op, S.Zip):
                continue
            handler = getattr(self, "_" + type(op).__name__, None)
            if handler is None:
                raise LoweringError(f"{op.name}: operator {op.kind} is not executable by the engine yet")
            self.builder.chip = getattr(op, "chip", 0)  # many chips: memory operators use their chip's HBM
            handler(op, self.inputs(op), self.outputs(op))
        return self.builder.build()

    def _LinearOffChipLoad(self, op, ins, outs, resident=False):
        kw = dict(out=outs[0], tile_rows=op.tile_rows, tile_cols=op.tile_cols, elem_bytes=op.tensor.dtype.bytes,
                  view_shape=op.out_shape_tiled, par_dispatch=op.par_dispatch, name=op.name,
                  tensor=_tensor_ref(op.tensor.name, op.tensor.shape, op.tensor.dtype, op.tile_rows, op.tile_cols,
                                     op.stride))
        if resident:
            if op.has_ref:
                raise LoweringError(f"{op.name}: a resident load cannot take a reference stream")
            self.builder.offchip_load(resident=True, **kw)
        elif op.has_ref:
            self.builder.dyn_offchip_load(ref=ins[0], **kw)
        else:
            self.builder.offchip_load(**kw)

    def _ResidentLoad(self, op, ins, outs):
        self._LinearOffChipLoad(op, ins, outs, resident=True)

    def _ResidentStore(self, op, ins, outs):
        self._LinearOffChipStore(op, ins, outs, resident=True)

    def _Link(self, op, ins, outs):
        self.builder.link(ins=ins, outs=outs, bandwidth=op.bandwidth, latency=op.latency, name=op.name)

    def _LinearOffChipStore(self, op, ins, outs, resident=False):
        # traffic at the stream dtype's width (what the symbolic metric counts); timing from the tile's width
        self.builder.offchip_store(inp=ins[0], par_dispatch=op.par_dispatch, resident=resident,
                                   traffic_elem_bytes=op.inputs[0].stream.dtype.dtype.bytes, name=op.name,
                                   tensor=_tensor_ref(op.tensor_name, op.tensor_shape, op.inputs[0].stream.dtype.dtype,
                                                      op.tile_rows, op.tile_cols))

    def _RandomOffChipLoad(self, op, ins, outs):
        self.builder.random_offchip_load(raddr=ins[0], out=outs[0], tile_rows=op.tile_rows, tile_cols=op.tile_cols,
                                         elem_bytes=op.tensor.dtype.bytes, par_dispatch=op.par_dispatch, name=op.name,
                                         tensor=_tensor_ref(op.tensor.name, op.tensor.shape, op.tensor.dtype,
                                                            op.tile_rows, op.tile_cols))

    def _RandomOffChipStore(self, op, ins, outs):
        wdata, waddr = ins
        self.builder.random_offchip_store(waddr=waddr, wdata=wdata, ack=outs[0], tile_rows=op.tile_rows,
                                          tile_cols=op.tile_cols, elem_bytes=op.tensor.dtype.bytes,
                                          par_dispatch=op.par_dispatch, ack_based_on_waddr=op.ack_based_on_waddr,
                                          name=op.name, tensor=_tensor_ref(op.tensor.name, op.tensor.shape,
                                                                           op.tensor.dtype, op.tile_rows, op.tile_cols))

    def _Bufferize(self, op, ins, outs):
        shape = op.stream.dtype.shape
        elems = product(shape) if all(is_static(d) for d in shape) else DEFAULT_CHANNEL_DEPTH
        self.builder.bufferize(inp=ins[0], out=outs[0], rank=op.rank, max_buffer_elems=max(1, int(elems)),
                               name=op.name)

    def _Streamify(self, op, ins, outs):
        self.builder.streamify(inp=ins[0], out=outs[0], rank=op.rank, repeat_factors=op.repeat_factor, name=op.name)

    def _DynStreamify(self, op, ins, outs):
        self.builder.dyn_streamify(inp=ins[0], ref=ins[1], out=outs[0], repeat_rank=op.repeat_rank,
                                   bufferized_rank=op.bufferized_rank, name=op.name)

    def _Map(self, op, ins, outs):
        self.builder.map(ins=ins, out=outs[0], fn=op.fn.code, fn_param=op.fn.param, compute_bw=op.compute_bw,
                         write_back_mu=op.write_back_mu, name=op.name)

    def _init(self, op):
        init = op.init
        return dict(init_rows=init.rows, init_cols=init.cols, init_elem_bytes=self.tile_width(init.dtype),
                    rank=op.rank, compute_bw=op.compute_bw, write_back_mu=op.write_back_mu, fn=op.fn.code,
                    fn_param=op.fn.param, name=op.name)

    def _Accum(self, op, ins, outs):
        self.builder.accum(inp=ins[0], out=outs[0], **self._init(op))

    def _MapAccum(self, op, ins, outs):
        self.builder.map_accum(in1=ins[0], in2=ins[1], out=outs[0], **self._init(op))

    def _Scan(self, op, ins, outs):
        self.builder.scan(inp=ins[0], out=outs[0], **self._init(op))

    def _RetileStreamify(self, op, ins, outs):
        self.builder.row_streamify(inp=ins[0], out=outs[0], split_rows=op.split_row, filter_padding=op.filter_mask,
                                   name=op.name)

    def _FlatMap(self, op, ins, outs):  # the graph layer only builds FlatMap(RowStreamify)
        self.builder.row_streamify(inp=ins[0], out=outs[0], split_rows=True, filter_padding=op.fn.filter_padding,
                                   new_dim=True, name=op.name)

    def _Partition(self, op, ins, outs):
        self.builder.partition(data=ins[0], sel=ins[1], outs=outs, rank=op.rank, switch_cycles=op.switch_cycles,
                               write_back_mu=op.write_back_mu, name=op.name)

    _ConverterPartition = _Partition  # a layout converter's slots (stepsim.graph.ops_convert)

    def _Reassemble(self, op, ins, outs):
        self.builder.reassemble(ins=ins[:-1], sel=ins[-1], out=outs[0], rank=op.rank, switch_cycles=op.switch_cycles,
                                write_back_mu=op.write_back_mu, name=op.name)

    def _EagerMerge(self, op, ins, outs):
        data_out, sel_out = (self.out_channel[(op.id, i)] for i in (0, 1))
        self.builder.eager_merge(ins=ins, data_out=data_out, sel_out=sel_out, rank=op.rank, name=op.name)

    def _Parallelize(self, op, ins, outs):
        self.builder.parallelize(inp=ins[0], outs=outs, rank=op.rank, switch_cycles=op.switch_cycles, name=op.name)

    def _Broadcast(self, op, ins, outs):
        self.builder.broadcast(inp=ins[0], outs=outs, name=op.name)

    def _Flatten(self, op, ins, outs):
        self.builder.flatten(inp=ins[0], out=outs[0], min_rank=op.min_rank, max_rank=op.max_rank, name=op.name)

    def _Promote(self, op, ins, outs):
        self.builder.promote(inp=ins[0], out=outs[0], rank=op.rank, input_rank=op.inputs[0].stream.rank, name=op.name)

    def _Reshape(self, op, ins, outs):
        pad = op.pad
        self.builder.reshape(inp=ins[0], out=outs[0], chunk=op.chunk_size, rank=op.rank,
                             pad_rows=pad.rows if pad else 0, pad_cols=pad.cols if pad else 0,
                             pad_elem_bytes=self.tile_width(pad.dtype) if pad else 0,
                             add_outer_dim=op.add_outer_dim, write_back_mu=op.write_back_mu,
                             flags_out=self.out_channel.get((op.id, 1)), name=op.name)

    def _Expand(self, op, ins, outs):
        self.builder.expand_ref(inp=ins[0], ref=ins[1], out=outs[0], rank=op.rank, name=op.name)

    def _RepeatStatic(self, op, ins, outs):
        self.builder.repeat_static(inp=ins[0], out=outs[0], count=op.count, name=op.name)

    def _SelectorSource(self, op, ins, outs):
        self.builder.select_gen(out=outs[0], targets_ptr=op.ptr, targets_idx=op.targets, shape=op.stream.shape,
                                n_targets=op.num_targets, name=op.name)

    def _MetadataSource(self, op, ins, outs):
        self.builder.metadata_gen(out=outs[0], values=op.values.ravel(), shape=op.stream.shape, name=op.name)

    def _ExpertAddrGen(self, op, ins, outs):
        self.builder.expert_addr_gen(sel=ins[0], out=outs[0], tiles_per_target=op.tiles_per_expert, base=op.base,
                                     name=op.name)

    def _CacheReadAddrGen(self, op, ins, outs):
        self.builder.cache_read_addr_gen(idx=ins[0], seq_len=ins[1], out=outs[0], row_offset=op.row_offset,
                                         name=op.name)

    def _FilterLastTile(self, op, ins, outs):
        self.builder.filter_last_tile(seq_len=ins[0], out=outs[0], name=op.name)

    def _Sink(self, op, ins, outs):
        self.builder.sink(inp=ins[0], name=op.name)


def _tensor_ref(name, shape, dtype, tile_rows, tile_cols, strides=()) -> TensorRef | None:
    """The functional-mode view of a memory operator's tensor (leading dims folded into rows), or None when a
    dim is symbolic (timing does not need it; functional mode then reports the operator)."""
    dims = (*shape, tile_rows, tile_cols)
    if not all(is_static(d) for d in dims):
        return None
    dims = [int(d) for d in dims]
    rows = int(np.prod(dims[:len(shape) - 1]))
    return TensorRef(name, rows, dims[len(shape) - 1], dims[-2], dims[-1], bf16=dtype == BF16,
                     strides=tuple(int(x) for x in strides), shape=tuple(dims[:len(shape)]))


def lower(graph: Graph, hardware: Hardware | None = None, *, channel_depth=UNSET,
          channel_depths: Mapping[str, int] | None = None) -> Program:
    """Lower ``graph`` to an engine :class:`~stepsim.kernels.program.Program`.

    Parameters
    ----------
    graph : Graph
        The graph; broadcasts are inserted and placeholders must be connected.
    hardware : Hardware
        Timing parameters (HBM, on-chip bandwidth); default the ``step-eval`` preset.
    channel_depth : int or None, optional
        FIFO depth (elements) of every channel without an override; None means 1024. Default: the hardware's
        ``channel_depth`` (2 for ``step-eval``).
    channel_depths : mapping of channel name to int, optional
        Per-channel FIFO depths (elements) that override everything else, keyed by stable channel names
        (``"Map_12[0]"``, see :func:`stepsim.graph.channels.channel_infos`); each must be an int >= 1 and name
        a channel of ``graph`` (else :class:`~stepsim.base.errors.LoweringError`).

    Selector and metadata payloads come from the graph's sources (filled from traces by the workload
    builders), so routing in the engine follows the trace.
    """
    hardware = hardware or Hardware.preset("step-eval")
    for name, depth in (channel_depths or {}).items():
        if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 1:
            raise LoweringError(f"channel_depths[{name!r}] must be an int >= 1, got {depth!r}")
    return _Lowering(graph, hardware, channel_depth, channel_depths).run()


__all__ = ["lower", "fp32_timing_bytes"]
