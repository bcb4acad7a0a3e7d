"""``stepsim trace import | import-routed | inspect | synth``: convert, check and generate traces from the command line.

Registered by :mod:`stepsim.cli` through :func:`register`. Errors are StepsimErrors (TraceError for bad
traces, ConfigError for bad arguments), which the dispatcher prints and turns into exit status 2. Outputs are
written atomically (a temp file renamed into place).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stepsim.base.errors import ConfigError
from stepsim.base.ranges import json_text
from stepsim.trace_io.readers import FORMATS, open_trace, read_trace
from stepsim.trace_io.schemas import model_shape
from stepsim.trace_io.summary import TraceSummary
from stepsim.trace_io.synthetic import SKEWS, iter_synthetic_routing, routing_schema_for, synthetic_kv_batches
from stepsim.trace_io.writers import output_format, write_trace

#: token ids, expert ids and KV lengths are stored as int32
_INT32_MAX = 2**31 - 1


def _positive(name: str, value: int | None) -> None:
    if value is not None and value <= 0:
        raise ConfigError(f"--{name} must be a positive integer, got {value}")
    if value is not None and value > _INT32_MAX:
        raise ConfigError(f"--{name} must be at most {_INT32_MAX:,} (traces store int32 values), got {value}")


def resolve_model_arg(model: str | None, num_experts: int | None) -> tuple[str | None, int | None, int | None]:
    """``(model name to store, num_experts, top_k)`` from ``--model`` and ``--num-experts``.

    A preset or alias (``mixtral``, ``qwen``; see ``stepsim models list``) is stored as typed (trace metadata
    keeps the user's label; readers compare names through the aliases); a Hugging Face ``config.json`` gives its
    expert count and top-k (the path is the stored name). top_k is None unless a config file gave it (a
    preset's is checked by the reader).

    Raises
    ------
    ConfigError
        An unreadable or dense config file, or ``--num-experts`` disagreeing with the file.
    """
    from stepsim.models.presets import is_model_file, routing_shape

    if model is None or not is_model_file(model):
        return model, num_experts, None
    experts, top_k = routing_shape(model)
    if num_experts is not None and num_experts != experts:
        raise ConfigError(f"--num-experts {num_experts} conflicts with --model {model} ({experts} experts)")
    return model, experts, top_k


def _open(path, args: argparse.Namespace):
    """Open a trace with the --format / --num-experts / --model flags (a config file's top_k is checked)."""
    _positive("num-experts", args.num_experts)
    model, num_experts, top_k = resolve_model_arg(args.model, args.num_experts)
    labels = (getattr(args, "iteration", None), getattr(args, "layer", None))
    if any(v is not None for v in labels) and not _single_npz(path):
        flag = "--iteration" if labels[0] is not None else "--layer"
        raise ConfigError(f"{flag} labels a single routing .npz file whose name is not <iteration>_<layer>.npz; "
                          f"{path} is not one")
    stream = open_trace(path, args.format, num_experts, model, npz_labels=tuple(v or 0 for v in labels))
    if top_k is not None and stream.info.top_k != top_k:
        raise ConfigError(f"{path}: the trace has top_k = {stream.info.top_k}, but --model {args.model} says "
                          f"num_experts_per_tok = {top_k}")
    return stream


def _single_npz(path) -> bool:
    """A single ``.npz`` file whose name does not carry its (iteration, layer) labels."""
    from stepsim.trace_io.readers import _NPZ_NAME

    p = Path(path)
    return p.suffix == ".npz" and not p.is_dir() and not _NPZ_NAME.match(p.name)


def _add_npz_label_arguments(p: argparse.ArgumentParser) -> None:
    """``--iteration`` / ``--layer``: the labels of a single routing .npz file named other than
    <iteration>_<layer>.npz (default 0 / 0)."""
    for flag in ("--iteration", "--layer"):
        p.add_argument(flag, type=_non_negative_int,
                       help=f"routing .npz file not named <iteration>_<layer>.npz: its {flag[2:]} label (default 0)")


def _cmd_import(args: argparse.Namespace) -> int:
    output_format(args.out)  # fail on a bad --out before reading anything
    stream = _open(args.src, args)
    rows = write_trace(stream.batches(), args.out, schema=stream.schema)
    print(f"wrote {args.out}: {stream.info.kind} trace, {rows} rows (from {stream.format} {args.src})")
    return 0


def _cmd_import_routed(args: argparse.Namespace) -> int:
    from stepsim.trace_io.serving import import_routed_experts

    rows, batches, layers = import_routed_experts(
        args.src, args.out, key=args.key, iteration_key=args.iteration_key, iteration=args.iteration,
        num_experts=args.num_experts, model=args.model)
    print(f"wrote {args.out}: routing trace, {rows} rows, {layers} layer(s), {batches} (iteration, layer) "
          f"batch(es) (from {args.src})")
    return 0


def _fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.2f}"
    return str(x)


def _print_summary(s: dict) -> None:
    print(f"source: {s['source']}")
    print(f"kind: {s['kind']}")
    print(f"rows: {s['rows']}")
    if s["kind"] == "expert_routing":
        print(f"model: {_fmt(s['model'])}  num_experts: {s['num_experts']}  top_k: {s['top_k']}")
        print(
            f"tokens: {s['tokens']}  batch size: {_fmt(s['batch_size'])}  (iteration, layer) groups: "
            f"{s['iterations_layers']}"
        )
        print(f"expert counts: {' '.join(map(str, s['expert_counts']))} (tokens per expert)")
        print(f"assignments: {s['assignments']} (token, expert) pairs  max per expert: {s['max_count']} tokens  "
              f"idle experts: {s['idle_experts']}")
    elif s["kind"] == "requests":
        for name in ("context_tokens", "generated_tokens"):
            st = s[name]
            print(f"{name} (tokens): min {st['min']}  max {st['max']}  mean {_fmt(st['mean'])}  "
                  f"stdev {_fmt(st['stdev'])}")
        print(f"duration: {_fmt(s['duration_s'])} s")
    else:
        st, tl = s["kv_lengths"], s["kv_tiles"]
        print(f"batches: {s['batches']}  batch size: {_fmt(s['batch_size'])} requests")
        print(f"kv lengths (tokens): min {st['min']}  max {st['max']}  mean {_fmt(st['mean'])}  "
              f"stdev {_fmt(st['stdev'])}")
        print(f"kv tiles (tiles of {s['tile']} tokens): sum {tl['sum']}  max {tl['max']} per request")
    extra = {k: v for k, v in s["metadata"].items() if k not in ("model", "num_experts", "top_k")}
    if extra:
        print("metadata: " + "  ".join(f"{k}={v}" for k, v in sorted(extra.items())))


def _cmd_inspect(args: argparse.Namespace) -> int:
    _positive("tile", args.tile)
    stream = _open(args.path, args)
    summary = TraceSummary(stream.info, tile=args.tile).consume(stream.batches()).as_dict()
    if args.json:
        sys.stdout.write(json_text(summary, indent=2, sort_keys=True))
        sys.stdout.write("\n")
    else:
        _print_summary(summary)
    return 0


def _cmd_synth_routing(args: argparse.Namespace) -> int:
    output_format(args.out)
    model, shape_e, shape_k = resolve_model_arg(args.model, args.num_experts)
    shape = (shape_e, shape_k) if shape_k is not None else model_shape(model)
    num_experts = args.num_experts if args.num_experts is not None else (shape[0] if shape else None)
    top_k = args.top_k if args.top_k is not None else (shape[1] if shape else None)
    if shape and top_k != shape[1] and (shape_k is not None or args.top_k is not None):
        raise ConfigError(f"--top-k {top_k} conflicts with --model {args.model} (top_k {shape[1]})")
    if num_experts is None or top_k is None:
        raise ConfigError("synth routing needs --num-experts and --top-k (or a known --model such as mixtral, qwen)")
    for name, v in (("tokens", args.tokens), ("num-experts", num_experts), ("top-k", top_k), ("batch", args.batch)):
        _positive(name, v)
    if args.layer < 0:
        raise ConfigError(f"--layer must be >= 0, got {args.layer}")
    batches = iter_synthetic_routing(
        args.tokens,
        num_experts,
        top_k,
        args.seed,
        skew=args.skew,
        alpha=args.alpha,
        batch=args.batch,
        layer=args.layer,
        model=model,
        gate_weights=args.gate_weights,
    )
    schema = routing_schema_for(
        num_experts,
        top_k,
        model=model,
        seed=args.seed,
        skew=args.skew,
        alpha=args.alpha,
        gate_weights=args.gate_weights,
    )
    rows = write_trace(batches, args.out, schema=schema)
    print(f"wrote {args.out}: synthetic routing, {rows} tokens, {num_experts} experts, top-{top_k}, seed {args.seed}")
    return 0


def _cmd_synth_kv(args: argparse.Namespace) -> int:
    output_format(args.out)
    _positive("batch", args.batch)
    _positive("batches", args.batches)
    distribution, source = None, None
    if args.distribution:
        requests = read_trace(args.distribution)
        if "context_tokens" not in requests.schema.names:
            raise ConfigError(f"--distribution {args.distribution}: not a request trace (no context_tokens column)")
        distribution = requests.column("context_tokens").to_numpy().astype("int64")
        source = requests.schema.metadata.get(b"source", b"requests").decode()
    table = synthetic_kv_batches(
        args.batch, args.seed, num_batches=args.batches, distribution=distribution, source=source
    )
    write_trace(table, args.out)
    print(f"wrote {args.out}: synthetic KV lengths, {args.batches} batch(es) of {args.batch}, seed {args.seed}")
    return 0


def _non_negative_int(text: str) -> int:
    """argparse type of --seed (NumPy's generators take non-negative seeds only) and of the label flags."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an int >= 0, got {value}")
    return value


def register(subparsers) -> None:
    """Add the ``trace`` command (subcommands import, inspect, synth) to the stepsim CLI."""
    trace = subparsers.add_parser(
        "trace", help="import, inspect and synthesize traces", description="Import, inspect and synthesize traces."
    )
    trace.set_defaults(handler=lambda args: (trace.print_help(), 1)[1])
    sub = trace.add_subparsers(dest="trace_command", metavar="SUBCOMMAND")

    p = sub.add_parser("import", help="convert a trace (npz, npy, Azure CSV, Arrow, Parquet) to .arrow or .parquet")
    p.add_argument("src", metavar="SRC", help="trace file or folder")
    p.add_argument("--format", choices=FORMATS, help="input format (default: from the suffix)")
    p.add_argument("--num-experts", type=int, help="routing: experts per layer (when the input does not say; default: "
                                                                 "from --model)")
    p.add_argument("--model", help="routing: model name or alias (mixtral, qwen, ...: also sets num_experts/top_k) "
                                   "or a Hugging Face config.json (default: none)")
    _add_npz_label_arguments(p)
    p.add_argument("--out", required=True, help="output .arrow / .feather / .parquet file")
    p.set_defaults(handler=_cmd_import, out_kind="file")

    p = sub.add_parser(
        "import-routed",
        help="convert a serving engine's per-token routed-expert array [tokens, layers, top_k] (.npy, .npz, "
        ".safetensors) to a multi-layer routing trace",
        description="Convert the routed experts SGLang / vLLM return per token ([tokens, layers, top_k] integer "
        "array) to a routing trace with one batch per layer (or per iteration x layer with --iteration-key).",
    )
    p.add_argument("src", metavar="SRC", help=".npy, .npz or .safetensors file (safetensors: pip install "
                   "'stepsim[serving]')")
    p.add_argument("--key", help="array name in a .npz / .safetensors file (default: the only array, else "
                   "'routed_experts')")
    p.add_argument("--iteration-key", help="array [tokens] of iteration numbers in the same file: one batch per "
                   "(iteration, layer) (default: none, every row is --iteration)")
    p.add_argument("--iteration", type=int, default=0, help="iteration label of every row without --iteration-key "
                   "(default 0)")
    p.add_argument("--num-experts", type=int, help="experts per layer (default: from --model)")
    p.add_argument("--model", help="preset name or alias (mixtral, qwen, ...) or a Hugging Face config.json: "
                   "gives num_experts and checks top_k (default: none)")
    p.add_argument("--out", required=True, help="output .arrow / .parquet file")
    p.set_defaults(handler=_cmd_import_routed, out_kind="file")

    p = sub.add_parser("inspect", help="validate a trace and print its statistics")
    p.add_argument("path", metavar="PATH", help="trace file or folder")
    p.add_argument("--format", choices=FORMATS, help="input format (default: from the suffix)")
    p.add_argument("--num-experts", type=int, help="routing: experts per layer (when the input does not say; "
                                                   "default: from --model)")
    p.add_argument("--model", help="routing: model name or alias, or a Hugging Face config.json (default: none)")
    _add_npz_label_arguments(p)
    p.add_argument("--tile", type=int, default=32, help="KV sequence tile in tokens (default 32)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(handler=_cmd_inspect)

    synth = sub.add_parser("synth", help="generate a seeded synthetic trace")
    synth.set_defaults(handler=lambda args: (synth.print_help(), 1)[1])
    ssub = synth.add_subparsers(dest="synth_kind", metavar="KIND")

    p = ssub.add_parser("routing", help="MoE routing with controllable skew")
    p.add_argument("--tokens", type=int, required=True, help="token rows")
    p.add_argument("--num-experts", type=int, help="experts per layer (default: from --model)")
    p.add_argument("--top-k", type=int, help="experts per token (default: from --model)")
    p.add_argument("--model", help="model name for metadata; a preset or alias (mixtral, qwen, ...) or a Hugging "
                                   "Face config.json gives num_experts/top_k (default: none)")
    p.add_argument("--skew", choices=SKEWS, default="dirichlet", help="expert popularity model (default dirichlet)")
    p.add_argument(
        "--alpha",
        type=float,
        default=1.0,
        help="Dirichlet concentration (small = skewed) or Zipf exponent (large = skewed); default 1.0",
    )
    p.add_argument("--batch", type=int, help="tokens per iteration (default: all tokens in iteration 0)")
    p.add_argument("--layer", type=int, default=0, help="layer number stored in the rows (default 0)")
    p.add_argument("--gate-weights", action="store_true", help="also write normalized gate weights")
    p.add_argument("--seed", type=_non_negative_int, required=True, help="random seed >= 0 (same seed -> identical file)")
    p.add_argument("--out", required=True, help="output .arrow / .parquet file")
    p.set_defaults(handler=_cmd_synth_routing, out_kind="file")

    p = ssub.add_parser("kv", help="decode batches with KV lengths drawn from the Azure distribution")
    p.add_argument("--batch", type=int, required=True, help="requests per decode batch")
    p.add_argument("--batches", type=int, default=1, help="number of batches (default 1)")
    p.add_argument(
        "--distribution",
        metavar="TRACE",
        help="request trace (e.g. the Azure CSV) to resample context lengths from "
        "(default: bundled Azure percentile table)",
    )
    p.add_argument("--seed", type=_non_negative_int, required=True, help="random seed >= 0 (same seed -> identical file)")
    p.add_argument("--out", required=True, help="output .arrow / .parquet file")
    p.set_defaults(handler=_cmd_synth_kv, out_kind="file")
