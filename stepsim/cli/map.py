"""``stepsim map KIND --model M --shape N [--hardware H]``: the schedule the mapper chooses for a layer on a chip
(docs/mapping.md): its knobs, cycles and lower bound, HBM and compute utilisation, the units it uses and how the
search went. ``--out FILE.json`` writes the schedule (``stepsim run|metrics --schedule FILE`` and
:func:`stepsim.mapping.schedule.read_schedules` read it). ``projection``: every weight matrix a serving step prices
on the engine (a layer's fused q/k/v and o projections, an MoE model's router, the LM head), each mapped at N tokens.
"""

from __future__ import annotations

from stepsim.base.errors import ConfigError
from stepsim.base.ranges import json_text
from stepsim.mapping.schedule import KNOBS

#: ``stepsim map``'s kinds: a run's layers (:data:`KNOBS`) and a serving step's weight matrices
KINDS = (*KNOBS, "projection")


def _hardware(name: str):
    from stepsim.base.hardware import PRESETS, Hardware

    if name.endswith(".toml"):
        return Hardware.from_toml(name)
    if name not in PRESETS:
        raise ConfigError(f"--hardware must be a preset ({', '.join(sorted(PRESETS))}) or a .toml file, got {name!r}")
    return PRESETS[name]


def _run(args) -> int:
    from stepsim.base.files import atomic_output
    from stepsim.mapping import map_layer
    from stepsim.mapping.kinds import layer_dims
    from stepsim.models.presets import resolve_model

    if isinstance(args.shape, bool) or args.shape < 1:
        raise ConfigError(f"--shape must be an int >= 1 ({'requests' if args.kind == 'decode' else 'tokens'}), "
                          f"got {args.shape}")
    if args.shape > MAX_SHAPE:
        raise ConfigError(f"--shape {args.shape:,}: at most {MAX_SHAPE:,} (a serving step's tokens or requests)")
    if args.jobs < 1:
        raise ConfigError(f"--jobs must be an int >= 1, got {args.jobs}")
    if args.jobs > 1 and not args.buckets:
        raise ConfigError("--jobs maps buckets side by side: it needs --buckets")
    if args.no_cache and args.buckets:
        raise ConfigError("--buckets maps into the cache: it cannot take --no-cache")
    if args.out is not None and args.buckets:
        raise ConfigError("--out writes one schedule; with --buckets use --json")
    if args.out is not None and args.kind == "projection":
        raise ConfigError("--out: projection schedules are mapped for serve's steps, not a run's layer (stepsim "
                          f"run|metrics --schedule FILE takes {', '.join(KNOBS)}); use --json")
    if args.out is not None:  # a bad destination fails before the mapping, not after it
        from stepsim.base.outputs import check_out_file

        check_out_file(args.out, "--out")
    if not args.no_cache:  # the schedules are saved there: a bad folder fails before the mapping, not after it
        from stepsim.mapping.cache_folder import checked_mapping_cache

        checked_mapping_cache()
    hardware = _hardware(args.hardware)
    model = resolve_model(args.model)
    model.refuse_unmodelled("stepsim map")
    if args.kind == "ffn" and not model.is_moe and not model.dense_intermediate:
        raise ConfigError(f"model {model.name!r} has no FFN dimensions (intermediate_size)")
    if args.buckets:
        return _buckets(args, model, hardware)
    if args.kind == "projection":
        return _projections(args, model, hardware)
    dims = layer_dims(args.kind, model)
    schedule = map_layer(args.kind, args.shape, dims, hardware, cache=not args.no_cache)
    record = {"model": model.name, "hardware": hardware.name, "shape": args.shape, **schedule.to_dict(),
              "hbm_utilisation": schedule.hbm_utilisation(hardware.hbm_peak_bytes_per_cycle),
              "compute_utilisation": schedule.compute_utilisation(hardware.peak_flops_per_cycle)}
    if args.out is not None:
        with atomic_output(args.out) as tmp:
            tmp.write_text(json_text(schedule.to_dict(), indent=2) + "\n", encoding="utf-8")
    if args.json:
        print(json_text(record, indent=2))
        return 0
    unit = "requests" if args.kind == "decode" else "tokens"
    print(f"{args.kind} of {model.name} at {args.shape:,} {unit} on {hardware.name}")
    _print_schedule(schedule, record, hardware)
    return 0


def _projections(args, model, hardware) -> int:
    """``stepsim map projection``: each weight matrix of a serving step (stepsim.serve.projections), mapped at
    ``--shape`` rows (tokens; the LM head's rows are a step's sequences), printed one after another."""
    from stepsim.mapping.projection import map_projection
    from stepsim.serve.memory import model_memory
    from stepsim.serve.projections import projection_shapes

    layer, head = projection_shapes(model, model_memory(model).vocab_size)
    records = []
    for name, d_in, d_out in [*layer, head]:
        schedule = map_projection(args.shape, d_in, d_out, hardware, cache=not args.no_cache)
        records.append((name, d_in, d_out, schedule, {
            "matrix": name, "d_in": d_in, "d_out": d_out, **schedule.to_dict(),
            "hbm_utilisation": schedule.hbm_utilisation(hardware.hbm_peak_bytes_per_cycle),
            "compute_utilisation": schedule.compute_utilisation(hardware.peak_flops_per_cycle)}))
    if args.json:
        print(json_text({"model": model.name, "hardware": hardware.name, "shape": args.shape,
                         "projections": [r for *_, r in records]}, indent=2))
        return 0
    print(f"projections of {model.name} at {args.shape:,} tokens on {hardware.name}")
    for name, d_in, d_out, schedule, record in records:
        print(f"{name:<12} {d_in:,} x {d_out:,} bf16 weights ({d_in * d_out * 2:,} bytes)")
        _print_schedule(schedule, record, hardware)
    return 0


def bucket_jobs(kind: str, shape: int, model, vocab: int | None) -> list[tuple]:
    """The mapping jobs (:mod:`stepsim.serve.map_ahead`) of every serving bucket of ``kind`` up to ``shape``'s: the
    powers of two from 1 (``prefill``: from one 32-row tile) to the bucket of ``shape``, each projection matrix at
    each for ``projection``, but the LM head only up to serve's default ``--max-seqs`` (a step's LM head has a row
    a sequence, not a token: above that its schedules are never used by default)."""
    from stepsim.mapping.kinds import KV_TILE
    from stepsim.mapping.mapper import bucket
    from stepsim.serve.projections import projection_shapes

    first = KV_TILE if kind == "prefill" else 1
    sizes = [first << i for i in range(max(0, bucket(shape).bit_length() - first.bit_length()) + 1)]
    if kind != "projection":
        return [("layer", kind, size) for size in sizes]
    from stepsim.serve.scheduler import VLLM_MAX_SEQS

    layer, head = projection_shapes(model, vocab)
    return [("projection", size, d_in, d_out) for size in sizes for _, d_in, d_out in [*layer, head]
            if (d_in, d_out) != head[1:] or size <= VLLM_MAX_SEQS]


def _bucket_of(job: tuple) -> int:
    """A mapping job's bucket: ``("layer", kind, size)`` or ``("projection", tokens, d_in, d_out)``."""
    return job[2] if job[0] == "layer" else job[1]


def _buckets(args, model, hardware) -> int:
    """``--buckets``: map every bucket up to ``--shape``'s on ``--jobs`` processes (a cold cache ahead of a serve
    run); one line a bucket, in bucket order, each as soon as it and those before it are done."""
    from stepsim.serve.map_ahead import map_job, mapping_cache

    vocab = None
    if args.kind == "projection":
        from stepsim.serve.memory import model_memory

        vocab = model_memory(model).vocab_size
    jobs = bucket_jobs(args.kind, args.shape, model, vocab)
    if args.jobs == 1:
        schedules = (map_job(job, model, hardware) for job in jobs)
        pool = None
    else:
        from stepsim.batch.executors import kill_workers, local_worker_pool

        pool = local_worker_pool(args.jobs, warm_kernels=True)
        cache = mapping_cache()
        schedules = (f.result() for f in [pool.submit(map_job, job, model, hardware, cache) for job in jobs])
    records = []
    try:
        if not args.json:
            print(f"{args.kind} of {model.name} on {hardware.name}: every bucket up to {_bucket_of(jobs[-1]):,} "
                  f"({len(jobs)} schedules, {args.jobs} process{'es' if args.jobs > 1 else ''})")
        for job, schedule in zip(jobs, schedules):
            matrix = {"d_in": job[2], "d_out": job[3]} if job[0] == "projection" else {}
            record = {"bucket": _bucket_of(job), **matrix, **schedule.to_dict(),
                      "hbm_utilisation": schedule.hbm_utilisation(hardware.hbm_peak_bytes_per_cycle)}
            records.append(record)
            if not args.json:
                dims = f" {job[2]:,} x {job[3]:,}" if matrix else ""
                knobs = ", ".join(f"{k} {v}" for k, v in schedule.knobs.items())
                print(f"{record['bucket']:>7,}{dims}  {knobs}: {schedule.cycles:,} cycles, HBM "
                      f"{record['hbm_utilisation'] * 100:.1f} %", flush=True)
    except BaseException:  # a stop or a failed search: the searches still running would take minutes each (a
        # Ctrl-C waited for every queued one); a killed search saves nothing (its cache file is written whole)
        if pool is not None:
            kill_workers(pool)
        raise
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    if args.json:
        print(json_text({"model": model.name, "hardware": hardware.name, "kind": args.kind, "buckets": records},
                        indent=2))
    return 0


def _print_schedule(schedule, record: dict, hardware) -> None:
    """A schedule's lines: knobs, cycles, HBM, compute, units and search."""
    from stepsim.mapping.schedule import ALL_KNOBS

    knobs = ", ".join(f"{k} {schedule.knobs[k]}" for k in ALL_KNOBS[schedule.kind])
    c = schedule.candidates
    print(f"schedule     {knobs}")
    print(f"cycles       {schedule.cycles:,} (lower bound {schedule.bound_cycles:,})")
    print(f"HBM          {schedule.off_chip_bytes:,} bytes, {record['hbm_utilisation'] * 100:.1f} % of "
          f"{hardware.hbm_peak_bytes_per_cycle:,} B/cycle")
    print(f"compute      {schedule.flops:,} FLOPs, {record['compute_utilisation'] * 100:.1f} % of "
          f"{hardware.peak_flops_per_cycle:,} FLOPs/cycle")
    print(f"units        {schedule.compute_units:,} of {hardware.compute_units:,} compute, "
          f"{schedule.memory_units:,} of {hardware.memory_units:,} memory; "
          f"{schedule.on_chip_bytes:,} bytes on chip")
    print(f"search       {c['simulated']} simulated, {c['pruned']} pruned by bounds, {c['infeasible']} infeasible")


#: the largest --shape: a serving step holds at most a few thousand tokens or requests
MAX_SHAPE = 65_536


def register(subparsers) -> None:
    """Add ``stepsim map``."""
    p = subparsers.add_parser(
        "map", help="the whole-chip schedule of a layer (mapper): knobs, cycles, utilisation, units",
        description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("kind", choices=KINDS, help="ffn: the MoE block or dense FFN; decode: the decode attention of one "
                                               "KV head; prefill: the prefill attention of every KV head; "
                                               "projection: a serving step's weight matrices (q/k/v, o, router, "
                                               "LM head)")
    p.add_argument("--model", required=True, metavar="M", help="preset name or Hugging Face config.json")
    p.add_argument("--shape", type=int, required=True, metavar="N",
                   help="tokens (ffn, projection), decoding requests (decode) or prompt tokens a KV head computes, "
                        "in whole 32-row tiles (prefill)")
    p.add_argument("--hardware", default="sn40l", metavar="H", help="hardware preset or TOML (default sn40l)")
    p.add_argument("--out", metavar="FILE.json",
                   help="write the schedule as JSON (default: none, only printed; stepsim run|metrics --schedule FILE "
                        "reads it)")
    p.add_argument("--no-cache", action="store_true", help="map again, neither reading nor writing the cache")
    p.add_argument("--buckets", action="store_true",
                   help="map every serving bucket (power of two) up to --shape's, one line each, into the cache "
                        "(ahead of a serve run on a cold cache; default: --shape alone, in full)")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="with --buckets: map N buckets side by side in worker processes (default 1)")
    p.add_argument("--json", action="store_true", help="print the schedule and its figures as one JSON object")
    p.set_defaults(handler=_run)
