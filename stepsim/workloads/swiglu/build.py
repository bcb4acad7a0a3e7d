"""The single-expert SwiGLU layer of the HDL validation (README Fig. 8; docs/semantics.md §6.2, §5.6).

``y = down(silu(x @ W_gate) * (x @ W_up))`` with schedule "mn_mk": gate/up tiled by (tile_m, tile_n) with
the full D as K tile; down tiled by tile_m rows and tile_n of K, the full D as N. Everything fp32.
"""

from __future__ import annotations

from collections.abc import Mapping

from stepsim.base.errors import ArgumentError
from stepsim.graph import (
    FP32,
    Flatten,
    Graph,
    LinearOffChipLoad,
    LinearOffChipStore,
    Map,
    MapAccum,
    Matmul,
    Mul,
    Promote,
    RepeatStatic,
    Reshape,
    Silu,
    Tensor,
    Zero,
)
from stepsim.workloads.base import Workload
from stepsim.workloads.kinds import WORKLOAD_CHANNEL_DEPTH, WORKLOAD_HARDWARE

#: §5.6: every compute node runs at 4096 FLOPs/cycle; loads dispatch 4 requests per cycle
HDL_COMPUTE_BW = 4096
HDL_PAR_DISPATCH = 4


def swiglu_algorithmic_flops(batch: int, hidden: int, intermediate: int) -> int:
    """The validation script's FLOPs ``2*B*D*F*3 + B*F + 8*B*D*F`` (SiLU term multiplied by D, sic)."""
    return 2 * batch * hidden * intermediate * 3 + batch * intermediate + 8 * batch * hidden * intermediate


def build_swiglu(*, tile_m: int = 16, tile_n: int = 16, batch: int = 64, hidden: int = 256, intermediate: int = 512,
                 compute_bw: int = HDL_COMPUTE_BW, par_dispatch: int = HDL_PAR_DISPATCH,
                 channel_depth: int | None = WORKLOAD_CHANNEL_DEPTH["swiglu"], tp: int | None = None,
                 system=None, algorithm: str = "ring", layers: int = 1, pp: int | None = None,
                 micro_batches: int | None = None) -> Workload:
    """Build the SwiGLU validation layer (B=64, D=256, F=512 by default; fp32; HDL hardware preset).

    ``tile_m`` tiles the batch (rows of x), ``tile_n`` tiles F for gate/up and K of the down projection.
    ``tp`` splits F's columns over that many chips of ``system`` (default: fully connected chips), an
    all-reduce (``algorithm``) after (:func:`_tp`). ``layers`` > 1 stacks that many layers (tensors
    ``layer<i>.<name>``); ``pp`` splits them into that many stages on the chips of ``system``, ``micro_batches``
    (one row tile each) streaming through (:func:`_stack`).
    """
    for key, v, total in (("tile_m", tile_m, batch), ("tile_n", tile_n, intermediate)):
        if not isinstance(v, int) or v < 1 or total % v:
            raise ArgumentError(f"{key} must be a positive divisor of {total}, got {v!r}")
    b, d, f = batch, hidden, intermediate
    stage = dict(tile_m=tile_m, tile_n=tile_n, compute_bw=compute_bw, par_dispatch=par_dispatch)
    if layers != 1 or pp is not None or micro_batches is not None:
        if tp is not None:
            raise ArgumentError("--tp does not combine with --layers / --pp / --micro-batches (a stack of layers "
                                "runs on one chip or as a pipeline)")
        g, parallel = _stack(layers, pp, system, micro_batches, b, d, f, stage)
    elif tp is None:
        g, parallel = Graph(f"swiglu-m{tile_m}-n{tile_n}"), {}
        LinearOffChipStore(g, swiglu_stage(g, b, d, f, **stage), tensor_name="y", par_dispatch=par_dispatch)
    else:
        g, parallel = _tp(tp, system, algorithm, b, d, f, stage)
    return Workload(
        name="swiglu", graph=g, channel_depth=channel_depth, hardware=WORKLOAD_HARDWARE["swiglu"],
        algorithmic_flops=layers * swiglu_algorithmic_flops(b, d, f),
        params=dict(batch=b, hidden=d, intermediate=f, tile_m=tile_m, tile_n=tile_n, compute_bw=compute_bw,
                    par_dispatch=par_dispatch, channel_depth=channel_depth, **parallel),
    )


def _stack(layers: int, pp, system, micro_batches, b: int, d: int, f: int, stage: dict) -> tuple:
    """``--layers L [--pp P] [--micro-batches M]``: layer i reads ``layer<i>.w_gate`` ... ; layer 0 loads ``x``, a
    later one consumes the previous layer's row tiles (each repeated once per F tile, a RepeatStatic), the last
    stores ``y``; no residual. A micro-batch is one row tile of ``B / M`` rows (``--tile-m`` must be ``B / M``),
    the stream's outer dimension, so stage s + 1 works on micro-batch m while stage s works on m + 1 (one graph,
    not a copy per micro-batch). ``--pp P`` places the layers by the sharding pass's
    :func:`~stepsim.workloads.sharding.pipeline`. Returns the graph and the record's parallel params."""
    from stepsim.workloads.chips import check_stack
    from stepsim.workloads.sharding import pipeline

    tile_m, n_tiles = stage["tile_m"], f // stage["tile_n"]
    m = check_stack(layers, pp, b, micro_batches, "rows")
    if m is not None and b // m != tile_m:
        raise ArgumentError(f"--micro-batches {m}: a micro-batch is one row tile of {b} / {m} = {b // m} rows; "
                            f"--tile-m must be {b // m}, got {tile_m}")
    g = Graph(f"swiglu-l{layers}" + (f"-pp{pp}" if pp else "") + f"-m{tile_m}-n{stage['tile_n']}")

    def layer(i, out):  # (1, B/tile_m, 1) row tiles -> (B/tile_m, F/tile_n, 1): each row tile once per F tile
        x = None if out is None else Promote(g, RepeatStatic(g, Flatten(g, out, 0, 1), n_tiles), 0)
        return swiglu_stage(g, b, d, f, **stage, prefix=f"layer{i}.", x=x)

    report = pipeline(g, system, layers, pp, layer, lambda out: LinearOffChipStore(
        g, out, tensor_name="y", par_dispatch=stage["par_dispatch"]), bindings={}, what="layers")
    return g, {"layers": layers, "micro_batches": b // tile_m if m is None else m, **report}


def _tp(tp, system, algorithm: str, b: int, d: int, f: int, stage: dict) -> tuple:
    """``--tp T``: chip c computes the layer on its ``F / T`` columns (Megatron's column-parallel gate / up and
    row-parallel down: tensors ``w_gate.<c>``, ``w_up.<c>``, ``w_down.<c>``, ``x`` replicated); its row tiles, a
    partial sum of y, are all-reduced by the sharding pass's :func:`~stepsim.workloads.sharding.tp_layers` and
    chip c stores the reduced chunk k (row tiles ``k B/(tile_m T) ..``) as ``y<c>.<k>``. Returns the graph and the
    record's parallel params."""
    from stepsim.workloads.chips import chips_system
    from stepsim.workloads.sharding import check_chips, check_columns, tensor_parallel

    tile_m, tile_n = stage["tile_m"], stage["tile_n"]
    g, system = Graph(f"swiglu-tp{tp}-m{tile_m}-n{tile_n}"), chips_system(tp, system, "--tp")
    check_chips("--tp", tp)
    check_columns(tp, {"intermediate": f}, tile_n, "--tile-n")
    if (b // tile_m) % tp:
        raise ArgumentError(f"--tp {tp}: the all-reduce cuts y's {b // tile_m} row tiles (--tile-m {tile_m}) "
                            f"into {tp} chunks; their number must be a multiple of {tp}")
    return g, tensor_parallel(g, system, 1, tp=tp, pp=None, algorithm=algorithm, batch=b // tile_m,
                              compute_bw=stage["compute_bw"], bindings={}, stack=False,
                              store_kw={"par_dispatch": stage["par_dispatch"]}, blocks=lambda i: [
        ("allreduce", lambda t, rows: Flatten(g, swiglu_stage(g, b, d, f // tp, **stage, suffix=f".{t}"), 0, 1),
         False)])


def swiglu_stage(g, b: int, d: int, f: int, *, tile_m: int, tile_n: int, compute_bw: int, par_dispatch: int,
                 suffix: str = "", prefix: str = "", x=None):
    """The layer's operators up to its output tiles ``(tile_m, d)``, one per ``tile_m`` rows of x (stream shape
    ``(1, b / tile_m, 1)``), reading tensors ``x`` and ``<prefix>w_gate<suffix>``, ``<prefix>w_up<suffix>``
    ([d, f]), ``<prefix>w_down<suffix>`` ([f, d]); ``f`` is the columns this stage computes (all of F, or a chip's
    share). ``x`` given (a stream of shape ``(1, b / tile_m, f / tile_n, 1)``, the row tiles once per F tile):
    the layer consumes it instead of loading tensor ``x``."""
    m_tiles, n_tiles = b // tile_m, f // tile_n
    bw = dict(compute_bw=compute_bw)
    if x is None:
        x = LinearOffChipLoad(g, Tensor("x", (b, d), FP32), (tile_m, d), (m_tiles, n_tiles, 1), (1, 0, 1),
                              par_dispatch=par_dispatch)
    w_gate, w_up = (LinearOffChipLoad(g, Tensor(prefix + name + suffix, (d, f), FP32), (d, tile_n), (m_tiles, n_tiles, 1),
                                      (0, 1, n_tiles), par_dispatch=par_dispatch) for name in ("w_gate", "w_up"))
    gate = MapAccum(g, x, w_gate, Matmul(), Zero(tile_m, tile_n), 1, **bw)
    up = MapAccum(g, x, w_up, Matmul(), Zero(tile_m, tile_n), 1, **bw)
    hidden_act = Map(g, [up, Map(g, gate, Silu(), **bw)], Mul(), **bw)
    # Linear(down): N equals the tile's N, so the input is re-chunked instead of buffered (§6.2)
    rows = Reshape(g, hidden_act, 1, 1)
    w_down = LinearOffChipLoad(g, Tensor(prefix + "w_down" + suffix, (f, d), FP32), (tile_n, d), (m_tiles, 1, n_tiles),
                               (0, 1, 1), par_dispatch=par_dispatch)
    return MapAccum(g, rows, w_down, Matmul(), Zero(tile_m, d), 1, write_back_mu=True, **bw)


def from_config(cfg: Mapping) -> Workload:
    """The swiglu workload of a normalized run config (:func:`stepsim.workloads.config.normalize_config`)."""
    from stepsim.workloads.config import bandwidth_kwargs

    parallel = {}
    stack = {k: cfg[k] for k in ("layers", "pp", "micro_batches") if cfg.get(k) is not None}
    if stack:
        from stepsim.base.system import System

        if cfg.get("tp") is not None:
            raise ArgumentError("--tp does not combine with --layers / --pp / --micro-batches (a stack of layers "
                                "runs on one chip or as a pipeline)")
        if cfg.get("pp") is None and cfg.get("system") is not None:
            raise ArgumentError("--system applies to a stack of layers with --pp N (pipeline parallelism)")
        if cfg.get("algorithm") is not None:
            raise ArgumentError("--algorithm applies to the SwiGLU layer with --tp N (its all-reduce), not to "
                                "--layers / --pp")
        if cfg.get("system") is not None and cfg.get("hardware") is not None:
            raise ArgumentError("--hardware does not apply with --system: the system file names the chips' hardware")
        if cfg.get("pp") is not None:
            if cfg.get("system") is None:
                raise ArgumentError(f"--pp {cfg['pp']} needs --system FILE|PRESET (the chips and links the stages "
                                    f"run on)")
            stack["system"] = System.load(cfg["system"]) if cfg.get("system") is not None else None
        return build_swiglu(tile_m=cfg["tile_m"], tile_n=cfg["tile_n"], **bandwidth_kwargs(cfg), **stack)
    if cfg.get("tp") is not None:
        from stepsim.base.system import System

        if cfg.get("system") is not None and cfg.get("hardware") is not None:
            raise ArgumentError("--hardware does not apply with --system: the system file names the chips' hardware")
        parallel = dict(tp=cfg["tp"], algorithm=cfg.get("algorithm") or "ring",
                        system=System.load(cfg["system"]) if cfg.get("system") is not None else None)
    elif cfg.get("system") is not None or cfg.get("algorithm") is not None:
        raise ArgumentError("--system and --algorithm apply to the SwiGLU layer with --tp N (tensor parallelism)")
    return build_swiglu(tile_m=cfg["tile_m"], tile_n=cfg["tile_n"], **bandwidth_kwargs(cfg), **parallel)
