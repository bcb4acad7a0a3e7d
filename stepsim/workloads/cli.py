"""``stepsim metrics`` (and, with the engine, ``stepsim run``): build a workload from CLI flags.

The flags are shared by every workload command; defaults reproduce the paper's experiments (spec §5).
"""

from __future__ import annotations

import argparse
import json
from importlib import resources

from stepsim.errors import ConfigError
from stepsim.workloads.base import Workload

WORKLOADS = ("moe", "swiglu", "attention")
BUNDLED_TRACES = {"mixtral-8x7b": "synthetic_routing_mixtral_b64.arrow",
                  "qwen3-30b-a3b": "synthetic_routing_qwen_b64.arrow",
                  "attention": "synthetic_kv_b16.arrow"}


def bundled_trace(key: str) -> str:
    """Path of a synthetic trace shipped with stepsim (used when ``--trace`` is not given)."""
    path = resources.files("stepsim") / "data" / BUNDLED_TRACES[key]
    if not path.is_file():
        raise ConfigError(f"no bundled trace for {key!r}; pass --trace PATH")
    return str(path)


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    """The flags every workload command shares."""
    p.add_argument("workload", choices=WORKLOADS, help="which layer to build")
    p.add_argument("--model", default="mixtral-8x7b", help="mixtral-8x7b | qwen3-30b-a3b | custom")
    for flag in ("--hidden", "--intermediate", "--experts", "--top-k"):
        p.add_argument(flag, type=int, help="custom MoE model dimension")
    p.add_argument("--trace", help="routing trace (MoE) or KV-length batch (attention); default: bundled synthetic")
    p.add_argument("--iteration", type=int, help="routing traces with several batches: iteration to use")
    p.add_argument("--layer", type=int, help="routing traces with several batches: layer to use")
    p.add_argument("--batch-id", type=int, help="decode-batch traces with several batches: batch to use")
    p.add_argument("--tiling", choices=("static", "dynamic"), default="static", help="MoE token tiling")
    p.add_argument("--tile-n", type=int, help="MoE: tokens per tile (static); SwiGLU: F tile")
    p.add_argument("--tile-f", type=int, help="MoE: F columns per weight tile")
    p.add_argument("--tile-m", type=int, default=16, help="SwiGLU: batch rows per tile")
    p.add_argument("--regions", type=int, help="MoE configuration time-multiplexing: parallel expert regions")
    p.add_argument("--strategy", choices=("coarse", "interleave", "dynamic"), default="dynamic",
                   help="attention parallelization")
    p.add_argument("--compute-bw", type=int, help="FLOPs/cycle of every compute node")
    p.add_argument("--channel-depth", type=int, help="default FIFO depth (elements)")
    p.add_argument("--hardware", help="hardware preset name or TOML file")
    p.add_argument("--convention", choices=("published", "paper"), default="published",
                   help="on-chip accounting: published (artifact) or paper (double-buffered, FIFOs)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def build_workload(args) -> Workload:
    """Build the workload the flags describe."""
    kw = {}
    if args.compute_bw is not None:
        kw["compute_bw"] = args.compute_bw
    if args.channel_depth is not None:
        kw["channel_depth"] = args.channel_depth
    if args.workload == "moe":
        from stepsim.workloads.models import moe_model
        from stepsim.workloads.moe import build_moe
        from stepsim.workloads.traces import load_routing

        model = moe_model(args.model, hidden=args.hidden, intermediate=args.intermediate, experts=args.experts,
                          top_k=args.top_k)
        trace = args.trace or bundled_trace(args.model)
        routing = load_routing(trace, model.experts, iteration=args.iteration, layer=args.layer)
        return build_moe(model, routing, tiling=args.tiling, tile_n=args.tile_n, tile_f=args.tile_f,
                         regions=args.regions, **kw)
    if args.workload == "swiglu":
        from stepsim.workloads.swiglu import build_swiglu

        return build_swiglu(tile_m=args.tile_m, tile_n=args.tile_n or 16, **kw)
    from stepsim.workloads.attention import build_attention
    from stepsim.workloads.traces import load_kv_lengths

    kv = load_kv_lengths(args.trace or bundled_trace("attention"), args.batch_id)
    channel_depth = kw.pop("channel_depth", None)  # build_attention fixes the experiment's depth; override after
    workload = build_attention(kv, args.strategy, **kw)
    if channel_depth is not None:
        workload.channel_depth = channel_depth
    return workload


def _metrics(args) -> int:
    workload = build_workload(args)
    values = workload.metrics(args.convention)
    row = {"workload": workload.name, **workload.params, **values}
    if args.json:
        print(json.dumps(row, sort_keys=False))
    else:
        width = max(len(k) for k in row)
        for key, value in row.items():
            print(f"{key:<{width}}  {value:,}" if isinstance(value, int) and not isinstance(value, bool)
                  else f"{key:<{width}}  {value}")
    return 0


def _run(args) -> int:
    from stepsim.hardware import Hardware
    from stepsim.simulate import simulate

    workload = build_workload(args)
    hardware = None
    if args.hardware:
        hardware = Hardware.from_toml(args.hardware) if args.hardware.endswith(".toml") else args.hardware
    result = simulate(workload, hardware)
    metrics = workload.metrics(args.convention)
    row = {"workload": workload.name, **workload.params, "cycles": result.cycles,
           "off_chip_bytes": result.off_chip_bytes, "off_chip_bytes_symbolic": metrics["off_chip_bytes"],
           "on_chip_bytes": metrics["on_chip_bytes"], "on_chip_bytes_active": metrics["on_chip_bytes_active"],
           "flops": metrics["flops"], "events": result.events, "sim_wall_s": result.sim_wall_s,
           "compile_s": result.compile_s}
    if args.json:
        print(json.dumps(row))
    else:
        width = max(len(k) for k in row)
        for key, value in row.items():
            print(f"{key:<{width}}  {value}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("run", help="simulate a workload on the compiled engine (timing mode)",
                              description="Simulate a workload on a trace and print cycles and traffic.")
    add_workload_arguments(p)
    p.set_defaults(handler=_run)
    p = subparsers.add_parser("metrics", help="symbolic off-chip / on-chip / FLOP totals of a workload on a trace",
                              description="Print the symbolic metrics of a workload with a trace's values.")
    add_workload_arguments(p)
    p.set_defaults(handler=_metrics)
