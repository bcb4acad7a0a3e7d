"""``stepsim serve --disaggregate P:D`` and :func:`serve_disaggregated`: a trace served on a system's first ``P``
chips as the prefill pool and its next ``D`` chips as the decode pool (:mod:`stepsim.serve.disaggregated`), the KV
cache moved over the system's links (:mod:`stepsim.serve.kv_transfer`).

Each pool is served as colocated serving serves that many chips: one chip (the chips' hardware), or a system of
``k`` chips cut from the given one (its one dimension's topology, links and hardware: :func:`pool_system`), with
its own KV cache (:func:`stepsim.serve.system.system_capacity`) and the same latency providers
(``--iteration-latency``, ``--fidelity exact``; ``--fidelity fast`` calibrated on a colocated pilot of the trace on
the pool's chips, under the key colocated serving of those chips uses, :func:`stepsim.serve.api.fast_key_parts`).
The longest sequence is the smaller of the pools' (a request must fit both).

Outputs: the files and summary keys of a colocated run (``kv_cache`` is the decode pool's, ``fidelity`` the decode
pool's provider), with ``requests.parquet`` columns ``prefill_end_s``, ``transfer_start_s``, ``transfer_end_s``,
``kv_transfer_bytes``, an ``iterations.parquet`` column ``pool`` (0 prefill, 1 decode), and the summary's
``disaggregated`` object: the pools' chips, where the first token comes from, the transfers' bytes and seconds,
each pool's KV cache, steps and fidelity.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from stepsim.base.errors import ConfigError
from stepsim.serve.kv_cache import DEFAULT_BLOCK_SIZE
from stepsim.serve.kv_transfer import KVTransferPricer, check_split, kv_transfer_bytes


def pool_system(system, chips: int, hardware):
    """The system a pool of ``chips`` chips is served on: None for one chip, else ``system``'s one dimension (its
    topology and links) over ``chips`` chips of ``hardware``; a one-line error for a system of several
    dimensions or custom links."""
    import dataclasses

    from stepsim.base.system.config import from_dict

    if chips == 1:
        return None
    if len(system.dimensions) != 1:
        raise ConfigError(f"--disaggregate with --system {system.name}: a pool of {chips} chips is cut from a system "
                          "of one dimension (ring, fully-connected or switch); this one has "
                          f"{len(system.dimensions) or 'custom links and no'} dimension(s)")
    dim = system.dimensions[0]
    pool = from_dict({"chips": chips, "topology": dim.topology, "link_bandwidth": dim.link_bandwidth,
                      "link_latency": dim.link_latency}, name=f"{system.name}[{chips}]")
    return dataclasses.replace(pool, hardware=hardware, hardware_spec=system.hardware_spec)


def serve_disaggregated(model, requests, *, disaggregate, system, out=None, arrival_scale=None, arrival=None,
                        limit_requests=None, duration=None, hardware=None, scheduler="vllm", max_seqs=None,
                        max_batch_tokens=None, chunk_tokens=None, routing=None, fidelity=None, slo=None, jobs=None,
                        seed=0, iteration_latency=None, hbm_bytes=None, block_size=DEFAULT_BLOCK_SIZE,
                        calibration_cache=None, schedule=None, drop_long=False, truncate_long=False,
                        first_token="decode", providers=None, progress: bool = False, stop=None, **refused):
    """Serve ``requests`` on a prefill pool of ``P`` chips and a decode pool of ``D`` chips (``disaggregate``:
    ``"P:D"`` or ``(P, D)``) of ``system`` (module docstring). Other parameters as
    :func:`stepsim.serve.api.serve`'s; ``first_token``: ``decode`` (the default: the TTFT a user sees) or ``prefill`` (DistServe's TTFT)
    (:mod:`stepsim.serve.disaggregated`); ``providers``: ``(prefill pool's, decode pool's)`` latency providers
    instead of ``iteration_latency`` or ``fidelity`` (as :func:`stepsim.serve.api.serve`'s ``provider``; a plan's
    calibrated ones); ``stop``: a :class:`~stepsim.serve.replay_stop.StopRule` (as :func:`stepsim.serve.api.serve`'s,
    for :mod:`stepsim.plan`: the replay raises :class:`~stepsim.serve.replay_stop.ReplayStopped` once the SLO is
    provably missed). Returns a :class:`stepsim.serve.api.ServeResult`."""
    from stepsim.models.presets import resolve_model
    from stepsim.serve import api
    from stepsim.serve.disaggregated import FIRST_TOKEN, replay_disaggregated
    from stepsim.serve.long_requests import fit_long_requests, long_policy
    from stepsim.serve.memory import model_memory
    from stepsim.serve.metrics import parse_slo
    from stepsim.serve.scheduler import Scheduler, SchedulerConfig
    from stepsim.serve.system import load_system, system_capacity
    from stepsim.trace_io.requests import requests_of

    started = time.perf_counter()
    for name, value in refused.items():
        if value is not None and value is not False:
            raise ConfigError(f"--{name.replace('_', '-')} is not built with --disaggregate")
    if system is None:
        check_split(disaggregate, None)  # its message: --disaggregate needs --system
    if first_token not in FIRST_TOKEN:
        raise ConfigError(f"first_token must be {' or '.join(FIRST_TOKEN)}, got {first_token!r}")
    api.check_arguments(model=model, requests=requests, out=out, arrival_scale=arrival_scale, arrival=arrival,
                        limit_requests=limit_requests, duration=duration, hardware=hardware, scheduler=scheduler,
                        max_seqs=max_seqs, max_batch_tokens=max_batch_tokens, chunk_tokens=chunk_tokens,
                        routing=routing, fidelity=fidelity, slo=slo, seed=seed, iteration_latency=iteration_latency,
                        block_size=block_size, hbm_bytes=hbm_bytes, jobs=jobs, schedule=schedule,
                        drop_long=drop_long, truncate_long=truncate_long,
                        provider=None if providers is None else providers[1])
    policy = long_policy(drop_long, truncate_long)
    if out is not None:
        from stepsim.base.outputs import check_out_dir

        check_out_dir(out, "--out")
    if fidelity == "fast":
        api.checked_calibration_cache(calibration_cache)
    if jobs is not None:
        from stepsim.batch.executors import check_jobs

        check_jobs(jobs)
    whole, hw = load_system(system, hardware, fidelity, api.resolve_serving_hardware(hardware))
    p_chips, d_chips = check_split(disaggregate, whole.chips)
    slo_seconds = parse_slo(slo) if slo is not None else None
    config = SchedulerConfig.make(scheduler, max_num_seqs=max_seqs, max_num_batched_tokens=max_batch_tokens,
                                  chunk_tokens=chunk_tokens, block_size=block_size)
    resolved = resolve_model(model)
    if fidelity is not None:
        resolved.refuse_unmodelled("serving at --fidelity exact|fast")
    memory = model_memory(resolved)
    pools = []
    for role, chips in (("prefill", p_chips), ("decode", d_chips)):
        sub = pool_system(whole, chips, hw)
        if sub is None:
            hbm = hw.hbm_capacity_bytes if hbm_bytes is None else hbm_bytes
            capacity, weights = api.model_capacity(resolved, memory, hbm, block_size, config.max_num_seqs), None
        else:
            capacity, weights = system_capacity(sub, resolved, memory, block_size, hbm_bytes, config.max_num_seqs)
        limit = api.max_model_len(config, capacity, memory.max_position_embeddings)
        pools.append({"role": role, "chips": chips, "system": sub, "capacity": capacity, "weights": weights,
                      "limit": limit})
    limit = min(p["limit"] for p in pools)
    tight = min(pools, key=lambda p: p["limit"])
    trace = api.shape_trace(requests_of(requests), limit_requests=limit_requests, arrival=arrival,
                            arrival_scale=arrival_scale, duration=duration, seed=seed)
    trace, long = fit_long_requests(trace, limit, tight["capacity"], memory.max_position_embeddings, policy)
    pricer = KVTransferPricer(whole, p_chips, d_chips)
    kv_bytes = np.array([kv_transfer_bytes(resolved, int(p)) for p in trace.prompt_tokens.tolist()], dtype=np.int64)
    for k, pool in enumerate(pools):
        if providers is not None:
            pool["provider"], pool["calibration"] = providers[k], None
            continue
        pool["schedule"] = schedule if schedule is not None else api.default_schedule(hw, fidelity)
        pool["provider"], pool["calibration"] = _provider(pool, fidelity, iteration_latency, resolved, model, hw,
                                                          routing, seed, limit, memory, jobs, requests, trace, config,
                                                          limit_requests, arrival, arrival_scale, duration,
                                                          calibration_cache, policy, progress)
    pre, dec = pools
    try:
        run = replay_disaggregated(trace.arrival_s, trace.prompt_tokens, trace.output_tokens, kv_bytes,
                                   Scheduler(config, pre["capacity"], limit), Scheduler(config, dec["capacity"], limit),
                                   pre["provider"], dec["provider"], pricer.seconds, first_token, stop)
    finally:
        for pool in pools:
            if hasattr(pool["provider"], "close"):
                pool["provider"].close()
    knobs = {"arrival": arrival, "arrival_scale": arrival_scale, "limit_requests": limit_requests,
             "duration": duration, "iteration_latency": iteration_latency,
             "routing": None if routing is None else str(routing), "hbm_bytes": hbm_bytes,
             "disaggregate": f"{p_chips}:{d_chips}", "first_token": first_token}
    if policy is not None:
        knobs["long_requests"] = policy
    bare = api._finish(run.result, trace, dec["provider"], dec["calibration"], resolved, hw, config,
                       dec["capacity"], limit, slo_seconds, seed, requests, None, None, started, knobs, None, long)
    table = bare.requests
    for name, values in (("prefill_end_s", run.prefill_end), ("transfer_start_s", run.transfer_start),
                         ("transfer_end_s", run.transfer_end), ("kv_transfer_bytes", run.transfer_bytes)):
        table = table.append_column(name, pa.array(values))
    summary = bare.summary
    summary["system"] = _system_summary(whole, pools, hw.hbm_capacity_bytes if hbm_bytes is None else hbm_bytes)
    summary["disaggregated"] = _disaggregated_summary(run, pools, pricer, first_token)
    summary["wall_s"] = time.perf_counter() - started
    files = _publish(out, table, bare.iterations, summary, dec, resolved, hw, config, slo_seconds, seed, requests,
                     knobs)
    return api.ServeResult(summary, table, bare.iterations, files)


def _provider(pool, fidelity, iteration_latency, resolved, model, hw, routing, seed, limit, memory, jobs, requests,
              trace, config, limit_requests, arrival, arrival_scale, duration, calibration_cache, policy, progress):
    """``(provider, calibration record or None)`` of one pool: the providers colocated serving builds."""
    from stepsim.serve import api
    from stepsim.serve.latency import ConstantLatency
    from stepsim.serve.replay import replay
    from stepsim.serve.scheduler import Scheduler

    if iteration_latency is not None:
        return ConstantLatency(iteration_latency), None
    system, schedule = pool["system"], pool["schedule"]
    if fidelity == "exact":
        return api.engine_provider(resolved, model, hw, routing, seed=seed, max_model_len=limit,
                                   vocab=memory.vocab_size, jobs=jobs, system=system, schedule=schedule), None
    capacity = pool["capacity"]
    key_parts = api.fast_key_parts(resolved, hw, limit, capacity, config, memory, seed, requests, routing,
                                   limit_requests, arrival, arrival_scale, duration, policy, schedule, system)
    return api.fast_provider(resolved, model, hw, routing, seed=seed, max_model_len=limit, vocab=memory.vocab_size,
                             jobs=jobs, key_parts=key_parts, cache=calibration_cache, system=system,
                             progress=progress, schedule=schedule,
                             pilot=lambda p, on_step: replay(trace.arrival_s, trace.prompt_tokens, trace.output_tokens,
                                                             Scheduler(config, capacity, limit), p, on_step))


def _kv_summary(capacity, used: int) -> dict:
    return {"hbm_bytes": capacity.hbm_bytes, "weight_bytes": capacity.weight_bytes,
            "kv_bytes_per_token": capacity.kv_bytes_per_token, "block_size": capacity.block_size,
            "num_blocks": capacity.num_blocks, "usable_blocks": capacity.usable_blocks, "max_blocks_used": used}


def _system_summary(whole, pools, hbm_per_chip: int) -> dict:
    """The summary's ``system``: the chips both pools use, and how each pool splits the weights."""
    weights, parallelism = [], []
    for pool in pools:
        w = pool["weights"]
        weights += [pool["capacity"].weight_bytes] if w is None else list(w.chip_weight_bytes)
        parallelism.append(f"{pool['role']} {'one chip' if w is None else w.parallelism}")
    return {"name": whole.name, "chips": sum(p["chips"] for p in pools), "parallelism": ", ".join(parallelism),
            "hbm_bytes_per_chip": hbm_per_chip, "chip_weight_bytes": weights, "system_chips": whole.chips}


def _disaggregated_summary(run, pools, pricer, first_token) -> dict:
    """The summary's ``disaggregated`` object (bytes, seconds)."""
    moved = run.transfer_bytes > 0
    seconds = run.transfer_end - run.transfer_start
    iterations = run.result.iterations["pool"]
    out = {"prefill_chips": pools[0]["chips"], "decode_chips": pools[1]["chips"], "first_token": first_token,
           "kv_transfer": {"transfers": int(moved.sum()), "bytes": int(run.transfer_bytes.sum()),
                           "seconds": float(seconds[moved].sum()),
                           "max_s": float(seconds[moved].max()) if moved.any() else 0.0,
                           "wait_s": float((run.transfer_start - run.prefill_end)[moved].sum()),
                           **pricer.describe()}}
    for k, pool in enumerate(pools):
        used = run.prefill_blocks_used if k == 0 else run.result.max_blocks_used
        provider = pool["provider"]
        out[pool["role"]] = {"iterations": int((iterations == k).sum()),
                             "kv_cache": _kv_summary(pool["capacity"], used),
                             "fidelity": {"mode": provider.mode, "error": provider.error,
                                          **({} if pool["calibration"] is None else
                                             {"calibration": pool["calibration"]["key"]})},
                             "max_model_len": pool["limit"]}
    return out


def _publish(out, requests_table, iterations_table, summary, dec, resolved, hw, config, slo_seconds, seed, requests,
             knobs) -> dict:
    """The run's files in ``out``, all or none (as colocated serving publishes them)."""
    import contextlib

    from stepsim.base.files import published_folder, published_together
    from stepsim.serve import api

    if out is None:
        return {}
    with contextlib.ExitStack() as publish:
        folder = publish.enter_context(published_folder(out))
        publish.enter_context(published_together())
        return api._write_files(out, folder, requests_table, iterations_table, summary, dec["provider"],
                                dec["calibration"], resolved, hw, config, dec["capacity"], slo_seconds, seed,
                                requests, None, knobs)
