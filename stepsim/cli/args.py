"""The flags every command that takes a workload shares, and their translation into a run config.

Flags map one-to-one onto the config keys of :mod:`stepsim.workloads.config` (``--tile-n`` is ``tile_n``),
which owns the validation and the building; this module only translates ``argparse`` namespaces. Defaults
reproduce the paper's experiments (spec §5). Used by ``run``, ``metrics``, ``size-fifos`` and ``optimize``.
"""

from __future__ import annotations

import argparse

from stepsim.base.errors import ConfigError
from stepsim.workloads.base import Workload
from stepsim.workloads.config import (
    BUNDLED_TRACES,
    KNOBS,
    WORKLOADS,
    bundled_trace,
    workload_from_config,
)

__all__ = ["BUNDLED_TRACES", "WORKLOADS", "add_fifo_depths_argument", "add_workload_arguments", "build_workload",
           "bundled_trace", "config_from_args"]


def add_jobs_argument(p: argparse.ArgumentParser, what: str, *, dask: bool = False) -> None:
    """``--jobs N`` / ``-j N`` as every command that runs simulations in parallel takes it: ``what`` runs on N
    worker processes, by default one per CPU available (``stepsim.batch.executors.default_jobs``). Checked
    (an int >= 1) before any work by :func:`jobs_from_args`."""
    p.add_argument("--jobs", "-j", type=int, metavar="N",
                   help=f"{what} on N worker processes, N >= 1 (default: one per CPU available)"
                        + ("; local executor and local Dask cluster" if dask else ""))


def jobs_from_args(args: argparse.Namespace) -> int:
    """``--jobs`` checked (ConfigError for N < 1, naming the default), or the CPUs available when left out."""
    from stepsim.batch.executors import check_jobs, default_jobs

    return default_jobs() if args.jobs is None else check_jobs(args.jobs)


def model_help(default: str | None = "mixtral-8x7b") -> str:
    """``--model``'s help: every preset with its aliases (as ``stepsim models list``), config files, custom."""
    from stepsim.models.presets import PRESETS

    def one(name, m):
        notes = (["default"] if name == default else []) + ([f"alias {', '.join(m.aliases)}"] if m.aliases else [])
        return f"{name} ({'; '.join(notes)})" if notes else name

    names = ", ".join(one(name, m) for name, m in sorted(PRESETS.items()))
    return f"a preset: {names}; or a Hugging Face config.json path (stepsim models list shows their dimensions)"


def add_workload_arguments(p: argparse.ArgumentParser, kinds: tuple[str, ...] | None = None) -> None:
    """The flags every workload command shares (unset flags are None; config.py applies the defaults).
    ``kinds``: the workload kinds the command takes, when not every kind and no user program (its help lists
    only those; the command refuses the others in one line)."""
    p.add_argument("workload", type=_workload_argument, metavar="WORKLOAD",
                   help=" | ".join(kinds) if kinds is not None else
                   " | ".join(WORKLOADS[:-1]) + " | path/to/file.py:function (a function returning a stepsim Graph "
                   "or Workload) | path/to/model.onnx (lowered by stepsim.frontend.from_onnx)")
    p.add_argument("--model", help=f"MoE and decoder: {model_help(None)}; or custom (MoE: with --hidden, "
                                   f"--intermediate, --experts, --top-k); default: mixtral-8x7b (MoE), "
                                   f"qwen3-30b-a3b (decoder)")
    for flag in ("--hidden", "--intermediate", "--experts", "--top-k"):
        p.add_argument(flag, type=int, help="custom MoE model dimension (default: none; required with --model custom)")
    p.add_argument("--trace", help="routing trace (MoE, and an .onnx model's MoE blocks) or KV-length batch "
                                   "(attention); default: bundled synthetic (an .onnx model: its routers' choice)")
    p.add_argument("--routing", help="decoder: routing trace of the MoE block (expert ids per token; default: none, "
                                     "required for a model with routed experts)")
    p.add_argument("--kv-lengths", help="decoder: KV-cache lengths of the decode batch (a KV trace; default: none, "
                                        "required)")
    p.add_argument("--kv-heads", type=int, help="decoder: KV heads simulated (default: all of the model's)")
    p.add_argument("--one-head", action="store_true",
                   help="decoder: simulate one KV head, as the paper's attention runs (same as --kv-heads 1)")
    p.add_argument("--iteration", type=int, help="routing traces with several batches: iteration to use (default 0)")
    p.add_argument("--layer", type=int, help="routing traces with several batches: layer to use (default 0; an .onnx "
                                             "model with several MoE blocks reads layer i for its i-th block)")
    p.add_argument("--batch-id", type=int, help="decode-batch traces with several batches: batch to use (default 0)")
    p.add_argument("--tiling", choices=("static", "dynamic"), help="MoE token tiling (default: static)")
    p.add_argument("--tile-n", type=int, help="MoE: tokens per tile (static, default 32); SwiGLU: F tile (16); "
                                              "prefill_attention: rows per query / KV tile (32)")
    p.add_argument("--tile-f", type=int, help="MoE: F columns per weight tile (default 64; 48 with --regions)")
    p.add_argument("--tile-m", type=int, help="SwiGLU: batch rows per tile (default 16); prefill_attention: "
                                              "prompt-chunk tokens per request (128)")
    p.add_argument("--regions", type=int, help="MoE configuration time-multiplexing: parallel expert regions (default: "
                                                  "none, one region per expert); attention: parallel regions (default 4)")
    p.add_argument("--strategy", choices=("coarse", "interleave", "dynamic"),
                   help="attention parallelization (default: dynamic)")
    p.add_argument("--softmax", choices=("plain", "stable"),
                   help="attention softmax: plain (the artifact's exp-sum form, default) or stable (running max, "
                        "1/sqrt(head_dim); the default with --functional)")
    p.add_argument("--op", choices=("all-reduce", "reduce-scatter", "all-gather", "all-to-all"),
                   help="collective: which one (default all-reduce)")
    p.add_argument("--bytes", type=int, metavar="S",
                   help="collective: the whole vector in bytes (each chip's input; an all-gather's output), a "
                        "multiple of 4 x chips (default 1048576)")
    p.add_argument("--algorithm", choices=("ring", "ring-chunked", "direct"),
                   help="collective: ring (default; each chunk streamed in tiles of a quarter of a PMU, reduced as "
                        "they arrive), ring-chunked (whole chunks, the exact closed forms of docs/system.md) or direct; "
                        "SwiGLU / MoE / decoder with --tp (its all-reduces): ring (default) or direct")
    p.add_argument("--system", metavar="FILE|PRESET",
                   help="collective, MoE with --ep or --tp, SwiGLU / decoder with --tp, SwiGLU / MoE / decoder with --pp: the chips and links, a system TOML file or preset "
                        "(docs/system.md; collective default ring-4, --ep default N fully connected chips)")
    p.add_argument("--ep", type=int, metavar="N",
                   help="MoE: expert parallelism, the experts placed on N chips, tokens sent to them over links "
                        "(a MoE or decoder stack of --layers: each --pp stage's layers over its own N chips; default: "
                        "one chip)")
    p.add_argument("--tp", type=int, metavar="N",
                   help="SwiGLU, MoE, decoder (default: one chip): tensor parallelism, F's columns (every expert's) split over N chips, an "
                        "all-reduce after (--algorithm ring, the default, or direct); the decoder also splits its KV "
                        "heads, an all-reduce after the output projection; a MoE stack of --layers: each --pp stage's layers "
                        "over its own N chips")
    p.add_argument("--layers", type=int, metavar="L",
                   help="SwiGLU, MoE, decoder: a stack of L layers, each consuming the previous one's output (default 1; "
                        "MoE / decoder: layer i routed by the trace's layer --layer + i, or a one-batch trace reused "
                        "by every layer; decoder: q / k / v computed from the layer's input)")
    p.add_argument("--pp", type=int, metavar="N",
                   help="SwiGLU, MoE, decoder with --layers L: pipeline parallelism, the layers split into N stages on N chips "
                        "(--system, required), the stage boundary a link (default: one stage)")
    p.add_argument("--micro-batches", type=int, metavar="M",
                   help="SwiGLU with --layers: M micro-batches of B / M rows stream through the stages (one row "
                        "tile each: --tile-m must be B / M; default B / --tile-m); MoE / decoder: each expert's tiles "
                        "(and the decoder's projection tiles) are packed per micro-batch of B / M tokens, static or "
                        "dynamic tiling (default 1); MoE / decoder with --ep E: each chip's shard split into M")
    p.add_argument("--placement", choices=("contiguous", "round-robin", "load-balanced"),
                   help="MoE with --ep: how experts are placed on chips (default contiguous; load-balanced "
                        "from the routing trace)")
    p.add_argument("--no-fuse", action="store_true", default=None,
                   help="an .onnx model: spill every edge between two nodes to off-chip memory (no fusion)")
    p.add_argument("--spill", metavar="NAME[,NAME...]",
                   help="an .onnx model: spill these edges (a value: all its edges; VALUE->CONSUMER: one), as the "
                        "report names them (default: none, the fusion policy decides)")
    p.add_argument("--compute-bw", type=int,
                   help="FLOPs/cycle of every compute node (default: the paper's per experiment: MoE static 4096, "
                        "dynamic 6400, with --regions 1024; attention 2048; SwiGLU 4096)")
    p.add_argument("--channel-depth", type=int,
                   help="default FIFO depth in elements (default: the workload's, 2; attention, prefill_attention and SwiGLU 1)")
    p.add_argument("--hardware", help="hardware preset name or TOML file (default: the workload's experiment)")
    p.add_argument("--convention", choices=("published", "paper"),
                   help="on-chip accounting: published (artifact, default) or paper (double-buffered, FIFOs)")
    p.add_argument("--json", action="store_true", help="print the record as one JSON object (exact numbers)")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="print every column (params, provenance, phase timings) and exact byte counts")


#: the --force flag's help, one meaning on every command that simulates (run, sweep, optimize, reproduce)
FORCE_HELP = ("simulate even when a run's estimated engine events are over the limit (10^9, about 17 minutes at "
              "10^6 events/s; the paper's largest layers need under 10^6); a run needing more memory than is "
              "available is refused anyway")


def add_force_argument(p: argparse.ArgumentParser) -> None:
    """``--force``: run simulations the run-size estimate refuses (:mod:`stepsim.kernels.run_size`)."""
    p.add_argument("--force", action="store_true", help=FORCE_HELP)


def add_schedule_argument(p: argparse.ArgumentParser) -> None:
    """``--schedule auto|paper|FILE`` of ``run`` and ``metrics`` (:mod:`stepsim.mapping.runs`, docs/mapping.md §6)."""
    p.add_argument("--schedule", metavar="auto|paper|FILE",
                   help="moe and attention: paper (the STeP paper's evaluation schedule), auto (the whole-chip "
                        "schedule the mapper chooses for the run's shape and hardware) or a schedule FILE written "
                        "by stepsim map --out; default auto on serving hardware (sn40l), else paper")


def add_fifo_depths_argument(p: argparse.ArgumentParser) -> None:
    """``--fifo-depths FILE``: per-channel FIFO depths written by ``stepsim size-fifos`` (config key
    ``fifo_depths``); a file made for another graph is refused."""
    p.add_argument("--fifo-depths", metavar="FILE",
                   help="per-channel FIFO depths from stepsim size-fifos (overrides --channel-depth per channel; "
                        "default: none)")


def _workload_argument(value: str) -> str:
    """A workload kind, or a user program ``path/to/file.py:function`` (argparse type of the positional)."""
    from stepsim.workloads.program.build import is_program_spec

    if value in WORKLOADS[:-1] or is_program_spec(value) or value.endswith(".onnx"):
        return value
    raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from {', '.join(WORKLOADS[:-1])}, "
                                     f"path/to/file.py:function or path/to/model.onnx)")


def config_from_args(args: argparse.Namespace) -> dict:
    """The config mapping of the knobs set on the command line (unset flags are left out); a user program's
    ``file.py:function`` becomes ``{"workload": "program", "program": "file.py:function"}``."""
    if getattr(args, "one_head", False):  # its own flag, so that a conflict is said, not settled by flag order
        if args.kv_heads not in (None, 1):
            raise ConfigError(f"--one-head and --kv-heads {args.kv_heads} conflict: --one-head simulates 1 KV head; "
                              f"give one of them")
        args.kv_heads = 1
    config = {key: getattr(args, key) for key in KNOBS if getattr(args, key, None) is not None}
    if config["workload"] not in WORKLOADS:
        config["program"] = config["workload"]
        config["workload"] = "program"
    return config


def build_workload(args: argparse.Namespace) -> Workload:
    """Build the workload the flags describe (see :func:`stepsim.workloads.config.workload_from_config`)."""
    return workload_from_config(config_from_args(args))
