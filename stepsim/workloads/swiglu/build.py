"""The single-expert SwiGLU layer of the HDL validation (README Fig. 8; docs/semantics.md §6.2, §5.6).

``y = down(silu(x @ W_gate) * (x @ W_up))`` with schedule "mn_mk": gate/up tiled by (tile_m, tile_n) with
the full D as K tile; down tiled by tile_m rows and tile_n of K, the full D as N. Everything fp32.
"""

from __future__ import annotations

from collections.abc import Mapping

from stepsim.base.errors import ArgumentError
from stepsim.graph import (
    FP32,
    Graph,
    LinearOffChipLoad,
    LinearOffChipStore,
    Map,
    MapAccum,
    Matmul,
    Mul,
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
    all-reduce (``algorithm``) after (:mod:`stepsim.workloads.swiglu.parallel`). ``layers`` > 1 stacks that many
    layers (tensors ``layer<i>.<name>``); ``pp`` splits them into that many stages on the chips of ``system``,
    ``micro_batches`` (one row tile each) streaming through (:mod:`stepsim.workloads.swiglu.pipeline`).
    """
    for key, v, total in (("tile_m", tile_m, batch), ("tile_n", tile_n, intermediate)):
        if not isinstance(v, int) or v < 1 or total % v:
            raise ArgumentError(f"{key} must be a positive divisor of {total}, got {v!r}")
    b, d, f = batch, hidden, intermediate
    parallel = {}
    if layers != 1 or pp is not None or micro_batches is not None:
        from stepsim.workloads.swiglu.pipeline import build_stack, check_pipeline

        if tp is not None:
            raise ArgumentError("--tp does not combine with --layers / --pp / --micro-batches (a stack of layers "
                                "runs on one chip or as a pipeline)")
        m = check_pipeline(layers, pp, b, tile_m, micro_batches)
        if pp is not None:
            from stepsim.workloads.chips import chips_system

            system = chips_system(pp, system, "--pp")
        elif system is not None:
            raise ArgumentError("--system applies to a stack of layers with --pp N (pipeline parallelism)")
        g, report = build_stack(layers, batch=b, hidden=d, intermediate=f, tile_m=tile_m, tile_n=tile_n,
                             par_dispatch=par_dispatch, pp=pp, system=system,
                             stage=lambda g, x, prefix: swiglu_stage(
                                 g, b, d, f, tile_m=tile_m, tile_n=tile_n, compute_bw=compute_bw,
                                 par_dispatch=par_dispatch, prefix=prefix, x=x))
        parallel = {"layers": layers, "micro_batches": m}
        if pp is not None:
            parallel.update(pp=pp, **report)
    elif tp is None:
        g = Graph(f"swiglu-m{tile_m}-n{tile_n}")
        out = swiglu_stage(g, b, d, f, tile_m=tile_m, tile_n=tile_n, compute_bw=compute_bw,
                           par_dispatch=par_dispatch)
        LinearOffChipStore(g, out, tensor_name="y", par_dispatch=par_dispatch)
    else:
        from stepsim.workloads.chips import chips_system
        from stepsim.workloads.swiglu.parallel import build_tp

        system = chips_system(tp, system, "--tp")
        g, report = build_tp(tp, system, batch=b, hidden=d, intermediate=f, tile_m=tile_m, tile_n=tile_n,
                             compute_bw=compute_bw, par_dispatch=par_dispatch, algorithm=algorithm,
                             stage=lambda g, cols, suffix: swiglu_stage(
                                 g, b, d, cols, tile_m=tile_m, tile_n=tile_n, compute_bw=compute_bw,
                                 par_dispatch=par_dispatch, suffix=suffix))
        parallel = {"tp": tp, "system": report["system"], "algorithm": algorithm,
                    "links_used": report["links_used"], "link_bytes": report["link_bytes"]}
    return Workload(
        name="swiglu", graph=g, channel_depth=channel_depth, hardware=WORKLOAD_HARDWARE["swiglu"],
        algorithmic_flops=layers * swiglu_algorithmic_flops(b, d, f),
        params=dict(batch=b, hidden=d, intermediate=f, tile_m=tile_m, tile_n=tile_n, compute_bw=compute_bw,
                    par_dispatch=par_dispatch, channel_depth=channel_depth, **parallel),
    )


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
