"""``stepsim serve``: replay a request trace through a serving scheduler (argparse and handler; the work is
:mod:`stepsim.serve.api`).

Example (the Azure conversation trace's first 2,000 requests, 20 ms per step, vLLM V1 defaults):

  stepsim serve --model qwen3-30b-a3b --requests ../shared/traces/azure/AzureLLMInferenceTrace_conv.csv \\
      --limit-requests 2000 --iteration-latency 0.02 --slo ttft=2s,tpot=200ms --out serve-out
"""

from __future__ import annotations

import argparse

from stepsim.base.ranges import json_text


def register(subparsers) -> None:
    """Add ``stepsim serve`` to the top-level subparsers."""
    p = subparsers.add_parser(
        "serve", help="replay a request trace through a vLLM / Sarathi / Orca scheduler (TTFT, TPOT, goodput)",
        description="Replay a request trace (Azure LLM inference CSV, or Parquet/Arrow with arrival_s, "
                    "prompt_tokens, output_tokens) through a serving scheduler with a paged KV cache sized by the "
                    "HBM left after the model's weights, and report latencies as vllm bench serve does.",
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, metavar="M", help="preset name or Hugging Face config.json")
    p.add_argument("--requests", required=True, metavar="TRACE", help="request trace (.csv, .parquet, .arrow)")
    arrivals = p.add_mutually_exclusive_group()
    arrivals.add_argument("--arrival-scale", type=float, metavar="X",
                          help="multiply every arrival time by X (0.5: twice the rate; default 1)")
    arrivals.add_argument("--arrival", metavar="poisson:RATE",
                          help="replace the arrivals by a Poisson process of RATE requests/s (seeded by --seed; default: "
                               "the trace's arrivals)")
    window = p.add_mutually_exclusive_group()
    window.add_argument("--limit-requests", type=int, metavar="N", help="replay the first N requests (default: all)")
    window.add_argument("--duration", type=float, metavar="SECONDS",
                        help="replay the requests arriving in the first SECONDS (default: all)")
    long = p.add_mutually_exclusive_group()
    long.add_argument("--drop-long", action="store_true",
                      help="leave out requests whose prompt + output exceed the longest sequence the engine takes "
                           "(max_position_embeddings, or the KV cache); default: refuse the trace naming the row")
    long.add_argument("--truncate-long", action="store_true",
                      help="keep the last tokens of such a request's prompt so that prompt + output fits (its output "
                           "whole)")
    p.add_argument("--hardware", metavar="H", help="hardware preset or TOML (default sn40l): HBM, clock, on-chip memory; "
                                                   "with --system, every chip's")
    p.add_argument("--system", metavar="FILE|PRESET",
                   help="serve on a system's chips (docs/system.md): weights split, KV cache in every chip's HBM left; "
                        "the chips are --hardware, else the system file's hardware, else sn40l (default: none, one chip)")
    p.add_argument("--disaggregate", metavar="P:D",
                   help="disaggregated serving: the system's first P chips prefill, its next D chips decode, the KV "
                        "cache moved over its links (needs --system; default: none, colocated)")
    p.add_argument("--first-token", choices=("prefill", "decode"),
                   help="with --disaggregate, which pool's step gives the first token: prefill (DistServe's TTFT, "
                        "the transfer after it) or decode (TTFT counts the transfer and the first decode step) "
                        "(default: decode, what a user of vLLM's disaggregated serving sees)")
    p.add_argument("--scheduler", choices=("vllm", "sarathi", "orca"), default="vllm",
                   help="batch scheduler (default: vllm, V1 rules)")
    p.add_argument("--max-seqs", type=int, metavar="N", help="max_num_seqs (default 128)")
    p.add_argument("--max-batch-tokens", type=int, metavar="N",
                   help="vLLM's max_num_batched_tokens (default 2048)")
    p.add_argument("--chunk-tokens", type=int, metavar="N",
                   help="vLLM: long_prefill_token_threshold (default 0, off); Sarathi: chunk size (default 512)")
    p.add_argument("--routing", metavar="synthetic|FILE",
                   help="expert routing of --fidelity exact: the seeded synthetic model (default) or a routed-experts "
                        "dump [tokens, layers, top_k]")
    p.add_argument("--fidelity", choices=("exact", "fast"),
                   help="price each step on the cycle engine: exact simulates every layer; fast uses a model "
                        "calibrated on exact simulations of the same run (cached), with its measured error (default: "
                        "none; one of --fidelity and --iteration-latency is required)")
    p.add_argument("--calibration-requests", metavar="FILE",
                   help="--fidelity fast: calibrate on the run of FILE's requests (shaped as --requests) and price "
                        "this run with it; the run of FILE shares the calibration (a deployment's replicas calibrate "
                        "once; default: the run's own requests)")
    p.add_argument("--schedule", choices=("paper", "auto"),
                   help="how --fidelity exact|fast builds each layer: the STeP paper's evaluation schedules or auto, "
                        "mapped over the whole chip (docs/mapping.md) (default: auto on sn40l and systems of it where "
                        "mapped layers are built, paper on the paper's chips step-eval and step-hdl)")
    p.add_argument("--slo", metavar="ttft=2s,tpot=200ms", help="SLOs for attainment and goodput (ttft, tpot, e2e; default: none)")
    parallel = p.add_mutually_exclusive_group()
    parallel.add_argument("--jobs", type=int, metavar="N", help="worker processes (engine-backed latency; default 1)")
    parallel.add_argument("--executor", choices=("dask",),
                          help="run the layers of a step on a dask.distributed cluster (a local one, one worker "
                               "process per CPU, or the scheduler at --address); outputs identical to --jobs 1 (default: none, "
                               "local processes)")
    p.add_argument("--address", metavar="ADDR", help="Dask scheduler address (tcp://host:8786) for --executor dask (default: a local cluster)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of --arrival poisson (default 0)")
    p.add_argument("--iteration-latency", type=float, metavar="SECONDS",
                   help="every scheduler step takes SECONDS (instead of the engine; default: none, the engine prices "
                        "each step)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output folder: requests.parquet, iterations.parquet, summary.json, latency_cdf.png, "
                        "over_time.png")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--timeline", metavar="PATH",
                   help="timeline: Perfetto protobuf (.pftrace) or Chrome JSON (.json, .json.gz); one track per "
                        "request (queued, prefill, decode), the steps, the waiting queue and the KV blocks in use "
                        "(default: none)")
    p.set_defaults(handler=_serve, out_kind="dir")
    from stepsim.cli.help_topics import group_options

    group_options(p, "serve")


def _fmt(d: dict | None, scale: float = 1000.0, unit: str = "ms") -> str:
    if not d or d["mean"] is None:
        return "n/a"
    return ", ".join(f"{k} {d[k] * scale:.1f}" for k in ("mean", "p50", "p90", "p99")) + f" {unit}"


def _serve(args) -> int:

    from stepsim.serve.api import serve

    if args.disaggregate is not None:
        if args.calibration_requests is not None:
            from stepsim.base.errors import ConfigError

            raise ConfigError("--calibration-requests is for a colocated run; with --disaggregate P:D each pool "
                              "calibrates on its own steps")
        return _print(args, _disaggregated(args))
    if args.first_token is not None:
        from stepsim.base.errors import ConfigError

        raise ConfigError("--first-token is for --disaggregate P:D (a colocated run's first token is its prefill's)")
    result = serve(args.model, args.requests, out=args.out, arrival_scale=args.arrival_scale, arrival=args.arrival,
                   limit_requests=args.limit_requests, duration=args.duration, hardware=args.hardware,
                   scheduler=args.scheduler, max_seqs=args.max_seqs, max_batch_tokens=args.max_batch_tokens,
                   chunk_tokens=args.chunk_tokens, routing=args.routing, fidelity=args.fidelity, slo=args.slo,
                   schedule=args.schedule,
                   jobs=args.jobs, executor=args.executor, address=args.address, seed=args.seed,
                   iteration_latency=args.iteration_latency, timeline=args.timeline, system=args.system,
                   drop_long=args.drop_long, truncate_long=args.truncate_long,
                   calibration_requests=args.calibration_requests,
                   progress=True)  # bars only on a terminal, after 2 s
    return _print(args, result)


def _disaggregated(args):
    """``--disaggregate P:D``: :func:`stepsim.serve.disaggregated_serve.serve_disaggregated`."""
    from stepsim.serve.disaggregated_serve import serve_disaggregated

    return serve_disaggregated(
        args.model, args.requests, disaggregate=args.disaggregate, system=args.system, out=args.out,
        arrival_scale=args.arrival_scale, arrival=args.arrival, limit_requests=args.limit_requests,
        duration=args.duration, hardware=args.hardware, scheduler=args.scheduler, max_seqs=args.max_seqs,
        max_batch_tokens=args.max_batch_tokens, chunk_tokens=args.chunk_tokens, routing=args.routing,
        fidelity=args.fidelity, slo=args.slo, schedule=args.schedule, jobs=args.jobs, seed=args.seed,
        iteration_latency=args.iteration_latency, drop_long=args.drop_long, truncate_long=args.truncate_long,
        first_token=args.first_token or "decode", progress=True, executor=args.executor, address=args.address,
        timeline=args.timeline)


def _print(args, result) -> int:
    """The run's summary: JSON with ``--json``, else a few lines."""
    s = result.summary
    if args.json:
        print(json_text(s, indent=2))
        return 0
    print(f"requests    {s['completed']} of {s['requests']} completed in {s['duration_s']:.2f} s, "
          f"{s['iterations']} steps, {s['preemptions']} preemptions")
    if "system" in s:  # early: which chips served the run (--hardware, the system file's, else sn40l)
        print(f"system      {s['system']['name']}: {s['system']['chips']} chips of {s['hardware']['name']}, weights "
              f"split by {s['system']['parallelism']}, at most {max(s['system']['chip_weight_bytes']) / 1e9:.2f} GB "
              "a chip")
    if "disaggregated" in s:
        d = s["disaggregated"]
        x = d["kv_transfer"]
        print(f"pools       prefill {d['prefill_chips']} chips ({d['prefill']['iterations']} steps), decode "
              f"{d['decode_chips']} chips ({d['decode']['iterations']} steps); first token from {d['first_token']}")
        print(f"KV moved    {x['transfers']} transfers, {x['bytes'] / 1e9:.3f} GB in {x['seconds'] * 1e3:.3f} ms "
              f"(longest {x['max_s'] * 1e3:.3f} ms, waited {x['wait_s'] * 1e3:.3f} ms for the links)")
    if "long_requests" in s:
        from stepsim.serve.long_requests import LongRequests

        print(f"long        {LongRequests(**s['long_requests']).line()}")
    print(f"throughput  {s['throughput_tokens_per_s']:.1f} tokens/s, {s['throughput_requests_per_s']:.3f} requests/s")
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        print(f"{key[:-2]:<11} {_fmt(s[key])}")
    if s["slo_attainment"] is not None:
        print(f"SLO         {s['slo_attainment'] * 100:.1f} % attained, goodput {s['goodput_requests_per_s']:.3f} "
              "requests/s")
    f = s["fidelity"]
    if f["mode"] == "exact":
        print(f"fidelity    exact: {f['simulations']} layer simulations on {s['hardware']['name']}")
    elif f["mode"] == "fast":
        e = f["error"]
        print(f"fidelity    fast: held-out step error p50 {e['iteration_p50'] * 100:.1f} %, p95 "
              f"{e['iteration_p95'] * 100:.1f} % ({e['held_out_iterations']} steps simulated exactly)")
    kv = s["kv_cache"]
    print(f"KV cache    {kv['usable_blocks']} blocks of {kv['block_size']} tokens, at most {kv['max_blocks_used']} "
          f"used; wall {s['wall_s']:.2f} s")
    print(f"wrote       {', '.join(str(p) for p in result.files.values())}")
    return 0
