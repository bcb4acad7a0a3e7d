"""The STeP graph-definition layer: streams, element types, dimensions, operators and symbolic metrics.

No timing and no numba here. Build a graph by constructing operators against a :class:`Graph`::

    g = Graph("example")
    x = LinearOffChipLoad(g, Tensor("x", (64, 256)), tile=(16, 256), out_shape_tiled=(4, 8, 1), stride=(1, 0, 1))
    y = Map(g, x, Silu(), compute_bw=1024)
    LinearOffChipStore(g, y)
    g.off_chip_bytes()     # sympy expression in bytes
"""

from stepsim.graph.dims import is_ragged, make_symbol
from stepsim.graph.dims import kind as dim_kind
from stepsim.graph.dtypes import (
    BF16,
    BOOL,
    FP16,
    FP32,
    INT32,
    UINT32,
    UINT64,
    BufferRef,
    DynTile,
    ScalarType,
    Selector,
    Tile,
    TupleType,
)
from stepsim.graph.functions import (
    AccumAdd,
    AccumMul,
    Add,
    CacheWriteAddr,
    Div,
    Empty,
    Exp,
    Matmul,
    Max,
    Mul,
    OnlineSoftmax,
    Pointwise,
    RetileCol,
    RetileRow,
    RowAppend,
    RowMax,
    RowStreamify,
    RowSum,
    SetOffset,
    SignalReqAllRead,
    Silu,
    SoftmaxNormalize,
    Sub,
    Zero,
)
from stepsim.graph.graph import (
    PAPER,
    PUBLISHED,
    Broadcast,
    Graph,
    OnChipConvention,
    Op,
    OutputRef,
    Placeholder,
    as_int,
)
from stepsim.graph.ops_buffer import Bufferize, DynStreamify, Streamify
from stepsim.graph.ops_chips import Link, ResidentLoad, ResidentStore
from stepsim.graph.ops_compute import (
    Accum,
    BinaryMap,
    BinaryMapAccum,
    FlatMap,
    Map,
    MapAccum,
    RetileStreamify,
    Scan,
    UnaryMap,
)
from stepsim.graph.ops_memory import (
    LinearOffChipLoad,
    LinearOffChipStore,
    RandomOffChipLoad,
    RandomOffChipStore,
    Tensor,
)
from stepsim.graph.ops_routing import EagerMerge, Parallelize, Partition, Reassemble
from stepsim.graph.ops_shape import Expand, ExpandRef, Flatten, Promote, RepeatStatic, Reshape, Zip
from stepsim.graph.ops_sources import (
    CacheReadAddrGen,
    ExpertAddrGen,
    FilterLastTile,
    MetadataGen,
    MetadataSource,
    SelectGen,
    SelectorSource,
    Sink,
)
from stepsim.graph.stream import Stream, stop_level

__all__ = [name for name in dir() if not name.startswith("_")] + ["RaggedSymbol"]


def __getattr__(name: str):
    if name == "RaggedSymbol":  # a sympy subclass, defined when first asked for (stepsim.graph.dims)
        from stepsim.graph.dims import ragged_symbol_class

        return ragged_symbol_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
