"""``stepsim.serve(...)``: replay a request trace through a serving scheduler and report its latencies.

Steps: read the trace (:mod:`stepsim.trace_io.requests`); take the first ``limit_requests``; replace the arrivals
by a seeded Poisson process (``arrival="poisson:RATE"``) or scale them (``arrival_scale``); keep the requests
arriving before ``duration`` seconds; size the KV cache from the HBM left after the model's weights; check that
every request fits; replay (:mod:`stepsim.serve.replay`); compute the metrics (:mod:`stepsim.serve.metrics`);
write the outputs (:mod:`stepsim.serve.output`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa

from stepsim._version import __version__
from stepsim.base.errors import ConfigError, TraceError
from stepsim.base.files import file_sha256, published_together
from stepsim.base.hardware import PRESETS, SERVING_FIELDS, VALUE_FIELDS, Hardware
from stepsim.base.ranges import MAX_TIME_S, MAX_TIME_TEXT
from stepsim.models.presets import resolve_model
from stepsim.serve.kv_cache import DEFAULT_BLOCK_SIZE, KVCapacity, kv_capacity, pooled_capacity
from stepsim.serve.latency import ConstantLatency, LatencyProvider
from stepsim.serve.long_requests import fit_long_requests, long_policy
from stepsim.serve.memory import kv_pools, model_memory
from stepsim.serve.metrics import parse_slo, request_latencies, summarize
from stepsim.serve.output import write_outputs
from stepsim.serve.replay import replay
from stepsim.serve.scheduler import Scheduler, SchedulerConfig
from stepsim.trace_io.requests import RequestTrace, requests_of, requests_sha256

#: hardware when none is given: one SambaNova SN40L socket (docs/hardware.md), a shipping dataflow accelerator
DEFAULT_HARDWARE = "sn40l"
#: its HBM capacity (bytes): 64 GiB
DEFAULT_HBM_BYTES = 64 * 2**30

@dataclass
class ServeResult:
    """A serve run: ``summary`` (the ``--json`` object), ``requests`` and ``iterations`` tables, the files."""

    summary: dict
    requests: pa.Table
    iterations: pa.Table
    files: dict[str, Path]


def _positive(name: str, value, integer: bool):
    bad = isinstance(value, bool) or not isinstance(value, (int,) if integer else (int, float))
    if bad or not math.isfinite(value) or value <= 0:
        kind = "a positive integer" if integer else "a positive number"
        raise ConfigError(f"{name} must be {kind}, got {value!r}")
    return value


def _poisson_rate(text: str) -> float:
    kind, _, rate = text.partition(":")
    try:
        value = float(rate)
    except ValueError:
        value = math.nan
    if kind != "poisson" or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"--arrival {text!r}: expected poisson:RATE with RATE in requests per second > 0")
    return value


def check_types(*, model=None, requests=None, out=None, slo=None, arrival=None, hbm_bytes=None,
                block_size=DEFAULT_BLOCK_SIZE) -> None:
    """A Python caller's arguments of the wrong type, as one line each (the command line passes strings)."""
    for name, value, what in (("model", model, "a preset name or a config.json path"),
                              ("requests", requests, "a request trace's path"), ("out", out, "a folder path")):
        if name == "requests" and isinstance(value, RequestTrace):
            continue  # in memory (stepsim.plan's replicas): checked as a file's rows are when the run reads it
        if (value is not None and not isinstance(value, (str, os.PathLike))) or \
                (name != "out" and (value is None or str(value) == "")):
            raise ConfigError(f"{name} must be {what} (str or Path), got {value!r}")
    for flag, value, example in (("--slo", slo, "ttft=2s,tpot=200ms"), ("--arrival", arrival, "poisson:4")):
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{flag} must be a string such as {example!r}, got {value!r}")
    if hbm_bytes is not None and (isinstance(hbm_bytes, bool) or not isinstance(hbm_bytes, int) or hbm_bytes < 1):
        raise ConfigError(f"hbm_bytes must be a positive integer (bytes), got {hbm_bytes!r}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ConfigError(f"block size must be at least 1 token, got {block_size!r}")


#: ``--schedule`` values: the STeP paper's evaluation schedules, or every layer mapped over the chip
SCHEDULES = ("paper", "auto")


#: hardware whose serve runs map their layers by default (``--schedule auto``): a serving chip; the STeP paper's
#: evaluation chips (``step-eval``, ``step-hdl``) keep the paper's schedules
SERVING_HARDWARE = ("sn40l",)


def check_schedule(schedule, fidelity) -> None:
    """``--schedule``: a known value (None: :func:`default_schedule`); ``auto`` prices layers on the engine
    (``--fidelity exact|fast``); on a system, a dense model's tensor-parallel layers
    (:func:`stepsim.serve.system.system_engine_latency` refuses an MoE model's expert-parallel block)."""
    if schedule is None:
        return
    if schedule not in SCHEDULES:
        raise ConfigError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if schedule == "auto" and fidelity not in FIDELITIES:
        raise ConfigError("--schedule auto maps the layers the engine prices: it needs --fidelity exact or fast")


def default_schedule(hardware: Hardware, fidelity) -> str:
    """The schedule of a serve run that gives none: ``auto`` on serving hardware (:data:`SERVING_HARDWARE`, a preset
    with overrides too) with ``--fidelity exact`` or ``fast``, on one chip or a system (a dense model's
    tensor-parallel shards, an MoE model's expert-parallel chips: each mapped); ``paper`` otherwise (the paper's
    chips are not mapped; without a fidelity no layer is built)."""
    from stepsim.base.hardware import OVERRIDE_MARK

    if fidelity is None or hardware.name.split(OVERRIDE_MARK, 1)[0] not in SERVING_HARDWARE:
        return "paper"
    return "auto"


def system_fast_class(model, schedule: str):
    """The fast provider class of ``model`` on a system with ``schedule``, as serve's fast fidelity and plan's pricing
    build it: the paper's layers (:class:`~stepsim.serve.system_fast.SystemFastLatency`), a dense model's mapped
    tensor-parallel shards (:class:`~stepsim.serve.system_fast.MappedSystemFastLatency`) or an MoE model's mapped
    expert-parallel chips (:class:`~stepsim.serve.fast_mapped_ep.MappedEPFastLatency`)."""
    from stepsim.serve.system_fast import MappedSystemFastLatency, SystemFastLatency

    if schedule != "auto":
        return SystemFastLatency
    if model.is_moe:
        from stepsim.serve.fast_mapped_ep import MappedEPFastLatency

        return MappedEPFastLatency
    return MappedSystemFastLatency


def check_arguments(*, model=None, requests=None, out=None, arrival_scale=None, arrival=None, limit_requests=None, duration=None,
                    hardware=None, scheduler="vllm", max_seqs=None, max_batch_tokens=None, chunk_tokens=None,
                    routing=None, fidelity=None, slo=None, seed=0, iteration_latency=None, block_size=DEFAULT_BLOCK_SIZE,
                    hbm_bytes=None, jobs=None, executor=None, provider=None, schedule=None, system=None,
                    drop_long=False, truncate_long=False, calibration_requests=None, **_others) -> None:
    """The checks of :func:`serve`'s arguments that need no trace and no run, with :func:`serve`'s messages: serve
    makes them first, and a serving sweep refuses a bad task with them before any task runs (the trace, the
    weights against HBM and the requests against the KV cache are checked by the run). Other keyword arguments
    are ignored."""
    check_types(model=model, requests=requests, out=out, slo=slo, arrival=arrival, hbm_bytes=hbm_bytes,
                block_size=block_size)
    if fidelity is not None and fidelity not in FIDELITIES:
        raise ConfigError(f"--fidelity must be one of {', '.join(FIDELITIES)}, got {fidelity!r}")
    given = [name for name, value in (("--iteration-latency", iteration_latency), ("--fidelity", fidelity),
                                      ("provider", provider)) if value is not None]
    if len(given) != 1:
        raise ConfigError("stepsim serve needs --iteration-latency SECONDS or --fidelity exact|fast" if not given else
                          f"{' and '.join(given)} both price the steps; give one")
    if iteration_latency is not None:
        ConstantLatency(iteration_latency)  # its own check and message
    if fidelity is None:
        for name, value in (("--routing", routing), ("--jobs", jobs), ("--executor", executor)):
            if value is not None:
                raise ConfigError(f"{name} is for the engine-backed latency (--fidelity exact|fast); "
                                  f"{given[0]} does not simulate layers")
    if calibration_requests is not None and fidelity != "fast":
        what = f"--fidelity {fidelity}" if fidelity is not None else given[0]
        raise ConfigError(f"--calibration-requests is for --fidelity fast (the requests it calibrates on); {what} "
                          "calibrates nothing")
    check_routing(routing)
    check_schedule(schedule, fidelity)
    long_policy(drop_long, truncate_long)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"--seed must be an integer >= 0, got {seed!r}")
    if arrival is not None and arrival_scale is not None:
        raise ConfigError("--arrival and --arrival-scale both set the arrivals; give one")
    if arrival is not None:
        _poisson_rate(arrival)
    for flag, value, integer in (("--limit-requests", limit_requests, True), ("--arrival-scale", arrival_scale, False),
                                 ("--duration", duration, False)):
        if value is not None:
            _positive(flag, value, integer)
    if slo is not None:
        parse_slo(slo)
    SchedulerConfig.make(scheduler, max_num_seqs=max_seqs, max_num_batched_tokens=max_batch_tokens,
                         chunk_tokens=chunk_tokens, block_size=block_size)
    resolved = resolve_model(model)  # an unknown model is refused here, before a sweep runs any task
    if fidelity is not None:  # a heterogeneous model is priced layer group by layer group (serve/layer_list.py)
        _check_layer_list(resolved, routing, system, fidelity)
    if hardware is not None:
        resolve_serving_hardware(hardware)


def shape_trace(trace: RequestTrace, *, limit_requests=None, arrival=None, arrival_scale=None, duration=None,
                seed: int = 0) -> RequestTrace:
    """The requests replayed: the first ``limit_requests``, arrivals replaced or scaled, then those arriving
    before ``duration`` seconds."""
    if arrival is not None and arrival_scale is not None:
        raise ConfigError("--arrival and --arrival-scale both set the arrivals; give one")
    if limit_requests is not None:
        trace = trace.head(_positive("--limit-requests", limit_requests, integer=True))
    if arrival is not None:
        rate = _poisson_rate(arrival)
        gaps = np.random.default_rng(seed).exponential(1.0 / rate, len(trace))
        trace = trace.with_arrivals(np.cumsum(gaps))
    elif arrival_scale is not None:
        with np.errstate(over="ignore"):  # an overflow to infinity is refused below, in one line
            trace = trace.with_arrivals(trace.arrival_s * _positive("--arrival-scale", arrival_scale, integer=False))
    if not np.isfinite(trace.arrival_s[-1]):  # sorted: the last is the largest
        flag = f"--arrival {arrival}" if arrival is not None else f"--arrival-scale {arrival_scale}"
        raise ConfigError(f"{flag}: the arrivals overflow to infinity (the last request would arrive at "
                          f"{float(trace.arrival_s[-1])} s); give a larger rate or a smaller scale")
    if trace.arrival_s[-1] > MAX_TIME_S:  # finite, but a step would vanish in rounding (stepsim.base.ranges)
        flag = f"--arrival {arrival}" if arrival is not None else f"--arrival-scale {arrival_scale}"
        raise ConfigError(f"{flag}: the last request would arrive at {float(trace.arrival_s[-1])!r} s, beyond "
                          f"{MAX_TIME_TEXT}; give a larger rate or a smaller scale")
    if duration is not None:
        keep = int(np.searchsorted(trace.arrival_s, _positive("--duration", duration, integer=False), side="left"))
        if keep == 0:
            raise ConfigError(f"--duration {duration}: no request arrives in the first {duration} s "
                              f"(the first arrives at {float(trace.arrival_s[0])} s)")
        trace = trace.head(keep)
    return trace


def model_capacity(model, memory, hbm_bytes: int, block_size: int, max_num_seqs: int) -> KVCapacity:
    """The KV cache of ``model`` (a ModelConfig with its :class:`~stepsim.serve.memory.ModelMemory`) in
    ``hbm_bytes`` of one chip: one pool of every layer, or with sliding-window layers a pool per attention kind
    (:func:`stepsim.serve.kv_cache.pooled_capacity`)."""
    if model.sliding_layers or model.chunked_layers:
        return pooled_capacity(hbm_bytes, memory.weight_bytes, kv_pools(model), block_size, max_num_seqs)
    return kv_capacity(hbm_bytes, memory.weight_bytes, memory.kv_bytes_per_token, block_size)


def max_model_len(config: SchedulerConfig, capacity: KVCapacity, max_position_embeddings: int | None) -> int:
    """The longest sequence (prompt + output, tokens) the engine takes: the model's ``max_position_embeddings``,
    capped by what the KV cache can hold for one request (Orca and Sarathi: above the watermark)."""
    from stepsim.serve.scheduler import WATERMARK

    blocks = capacity.usable_blocks
    if config.policy != "vllm":
        blocks -= int(WATERMARK * capacity.num_blocks)
    limit = blocks * capacity.block_size
    return min(limit, max_position_embeddings) if max_position_embeddings else limit


def matplotlib_available() -> bool:
    """Whether the ``plot`` extra is installed (the figure is written only then)."""
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def resolve_serving_hardware(hardware) -> Hardware:
    """The :class:`Hardware` a serve run uses: a given one, a preset name, a ``.toml`` file, or ``sn40l``."""
    if isinstance(hardware, Hardware):
        return hardware
    name = DEFAULT_HARDWARE if hardware is None else str(hardware)
    if name.endswith(".toml"):
        return Hardware.from_toml(name)
    if name not in PRESETS:
        raise ConfigError(f"--hardware must be a preset ({', '.join(sorted(PRESETS))}) or a .toml file, "
                          f"got {name!r}")
    return PRESETS[name]


#: engine-backed fidelities
FIDELITIES = ("exact", "fast")
#: where fast-fidelity calibrations are cached when no ``calibration_cache`` is given
CALIBRATION_CACHE_ENV = "STEPSIM_SERVE_CACHE"


def default_calibration_cache() -> Path:
    """``$STEPSIM_SERVE_CACHE``, else ``~/.cache/stepsim/serve-calibration``."""
    env = os.environ.get(CALIBRATION_CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "stepsim" / "serve-calibration"


def checked_calibration_cache(cache) -> Path:
    """The fast calibration's cache folder (``cache``, else :func:`default_calibration_cache`), checked before any
    work: a folder that exists as a file, or cannot be created or written, would fail only after the calibration's
    minutes. One line naming where the folder came from; nothing is created."""
    from stepsim.base.outputs import check_cache_dir, check_out_dir

    if cache is not None:
        return check_out_dir(cache, "calibration_cache")
    return check_cache_dir(default_calibration_cache(), CALIBRATION_CACHE_ENV, "the calibration cache")


#: the files ``--routing`` replays (stepsim.trace_io.serving.load_routed_experts)
ROUTING_SUFFIXES = (".npy", ".npz", ".safetensors")


def check_routing(routing) -> None:
    """``--routing``: ``synthetic`` or an existing routed-experts file, checked before any work (its content is
    checked when it is read, before the first step)."""
    if routing is None or routing == "synthetic":
        return
    if not isinstance(routing, (str, os.PathLike)):
        raise ConfigError(f"--routing must be synthetic or a file path, got {routing!r}")
    path = Path(routing)
    if path.suffix.lower() not in ROUTING_SUFFIXES:
        raise ConfigError(f"--routing {str(routing)!r}: expected synthetic or a routed-experts dump "
                          f"[tokens, layers, top_k] ({', '.join(ROUTING_SUFFIXES)})")
    if not path.is_file():
        raise ConfigError(f"--routing {routing}: " + ("a folder, not a file" if path.is_dir() else "no such file"))


def _routing_identity(routing) -> dict:
    if routing is None or routing == "synthetic":
        return {"mode": "synthetic"}
    return {"mode": "replay", "sha256": file_sha256(routing)}


def fast_provider(model, model_arg, hardware: Hardware, routing, *, seed: int, max_model_len: int, vocab: int,
                  jobs: int | None, key_parts: dict, cache, pilot, layers_executor=None, system=None,
                  progress: bool = False, schedule: str = "paper", gate=None, calibrate_on=None):
    """The calibrated fast provider and its calibration record (cached; :mod:`stepsim.serve.fast`).
    ``pilot(provider, on_step)`` replays the run with a provider (``on_step`` as :func:`replay`'s ``progress``); on
    ``system``'s chips when given (calibrated on :class:`stepsim.serve.system.SystemEngineLatency`'s pieces:
    :class:`stepsim.serve.system_fast.SystemFastLatency`). ``progress``: a calibration bar on a terminal.
    ``calibrate_on``: a model of ``model``'s layers but fewer of them, whose providers the calibration simulates
    (its pieces are ``model``'s, layer for layer: :func:`stepsim.serve.layer_list.calibration_model`); the
    provider returned is ``model``'s."""
    from stepsim.serve.calibration_cache import calibration_key, load_calibration, save_calibration
    from stepsim.serve.fast import FastLatency, calibrated, forms_of

    if system is not None:  # before the calibration's long work
        from stepsim.serve.system import check_exact_system

        check_exact_system(system, model, "fast")
    cache = checked_calibration_cache(cache)
    key = calibration_key(key_parts)
    record = load_calibration(cache, key)

    built = {}  # the metric forms, found once

    def make(theta=None, error=None, forms=None, model=model):
        engine = engine_provider(model, model_arg, hardware, routing, seed=seed, max_model_len=max_model_len,
                                 vocab=vocab, jobs=jobs, system=system, schedule=schedule, gate=gate,
                                 layers_executor=layers_executor)  # refuses --executor dask with --system
        if forms is None and "forms" not in built:
            built["forms"] = forms_of(engine.spec)
        forms = forms or built["forms"]
        if system is not None:
            provider = system_fast_class(model, schedule)
            return provider(model, system, engine.routing, max_model_len=max_model_len, vocab=vocab, jobs=jobs,
                            forms=forms, theta=theta, error=error)
        provider = FastLatency
        if schedule == "auto":  # mapped layers: the bucket's schedule in every regressor
            from stepsim.serve.fast_mapped import MappedFastLatency as provider
        return provider(model, hardware, engine.routing, max_model_len=max_model_len, vocab=vocab, jobs=jobs,
                        forms=forms, theta=theta, error=error, layers_executor=layers_executor, schedule=schedule)

    if record is None:
        with _bar(progress, "calibrating", "layer simulations") as update:
            simulated = [0]

            def observed(theta):  # a provider whose exact simulations advance the bar
                provider = make(theta) if calibrate_on is None else make(theta, model=calibrate_on)
                if update is not None:
                    def counted(n):
                        simulated[0] += n
                        update(simulated[0], "simulating sampled steps exactly")
                    provider.on_simulated = counted
                return provider

            def pilot_observed(provider):
                on_step = None if update is None else (
                    lambda done, steps: update(simulated[0], f"pilot replay: {done:,} requests served"))
                return pilot(provider, on_step)

            probe, theta, error, stats = calibrated(observed, pilot_observed, seed)
        forms = {kind: [list(f.off_chip), list(f.flops)] for kind, f in probe.forms.items()}
        record = {"key": key, "theta": theta, "error": error, "forms": forms, "stats": stats}
        save_calibration(cache, key, record)
        record["cached"] = False
    else:
        record["cached"] = True
    from stepsim.serve.fast import MetricForm

    forms = {kind: MetricForm(tuple(v[0]), tuple(v[1])) for kind, v in record["forms"].items()}
    return make(record["theta"], record["error"], forms), record


def _bar(progress: bool, desc: str, unit: str, total: int | None = None):
    """:func:`stepsim.base.progress.count_progress` when ``progress``, else a context yielding None."""
    if not progress:
        return contextlib.nullcontext(None)
    from stepsim.base.progress import count_progress

    return count_progress(desc, unit, total)


def engine_provider(model, model_arg, hardware: Hardware, routing, *, seed: int, max_model_len: int, vocab: int,
                    jobs: int | None, layers_executor=None, system=None, schedule: str = "paper", gate=None,
                    columns=None):
    """The exact provider for ``model`` on ``hardware`` with ``routing`` (``synthetic``, the default for an
    MoE model, or a routed-experts file); on ``system``'s chips when given (:mod:`stepsim.serve.system`).
    ``gate`` (a :class:`~stepsim.workloads.group_routing.GateConfig` with ``n_group > 1``): the synthetic routing
    goes through it (:class:`stepsim.serve.group_synthetic.GroupSyntheticRouting`; a layer group of DeepSeek-V3).
    ``columns``: ``(the whole model's layers, the file's layers this group replays)`` for a layer group of a
    heterogeneous model (:func:`stepsim.serve.layer_list.routing_columns`)."""
    from stepsim.serve.exact import EngineLatency
    from stepsim.serve.routing import ReplayRouting, SyntheticRouting

    source = None
    if model.is_moe:
        if (routing is None or routing == "synthetic") and gate is not None:
            from stepsim.serve.group_synthetic import GroupSyntheticRouting

            source = GroupSyntheticRouting(gate, model.layers, seed=seed)
        elif routing is None or routing == "synthetic":
            source = SyntheticRouting(model.experts, model.top_k, model.layers, seed=seed)
        else:
            layers, taken = (model.layers, None) if columns is None else columns
            source = ReplayRouting(routing, str(model_arg), layers, taken)
    elif routing is not None:
        raise ConfigError(f"--routing: model {model.name!r} is dense (no routed experts)")
    if system is not None:
        from stepsim.serve.system import system_engine_latency

        if layers_executor is not None:
            raise ConfigError("--executor dask: not built with --system (its MoE blocks are built per step in "
                              "this process); use --jobs N")
        return system_engine_latency(model, system, source, max_model_len=max_model_len, vocab=vocab, jobs=jobs,
                                     schedule=schedule)
    return EngineLatency(model, hardware, source, max_model_len=max_model_len, vocab=vocab, jobs=jobs,
                         layers_executor=layers_executor, schedule=schedule)


def serve(model, requests, *, out=None, arrival_scale=None, arrival=None, limit_requests=None, duration=None,
          hardware=None, scheduler="vllm", max_seqs=None, max_batch_tokens=None, chunk_tokens=None, routing=None,
          fidelity=None, slo=None, jobs=None, executor=None, address=None, seed=0, iteration_latency=None,
          timeline=None, hbm_bytes=None, block_size=DEFAULT_BLOCK_SIZE, provider: LatencyProvider | None = None,
          calibration_cache=None, system=None, progress: bool = False, schedule: str | None = None,
          drop_long: bool = False, truncate_long: bool = False, stop=None, report_layers: bool = True,
          calibration_requests=None) -> ServeResult:
    """Replay ``requests`` on ``model`` through a serving scheduler.

    Parameters
    ----------
    model : str or path
        Preset name or Hugging Face ``config.json`` (weights and KV bytes per token, max_position_embeddings).
    requests : str, path or RequestTrace
        Request trace (:func:`stepsim.trace_io.requests.read_requests`), or its requests in memory
        (:func:`stepsim.trace_io.requests.requests_of`: checked as a file's rows are).
    out : str or path, optional
        Folder for ``requests.parquet``, ``iterations.parquet`` and ``summary.json``.
    arrival_scale : float, optional
        Multiply every arrival time (s) by this (0.5: the same requests at twice the rate).
    arrival : str, optional
        ``poisson:RATE``: arrivals of a Poisson process of RATE requests/s (seeded by ``seed``).
    limit_requests : int, optional
        Replay the first N requests.
    duration : float, optional
        Replay the requests arriving in the first SECONDS (after ``arrival`` / ``arrival_scale``).
    scheduler : str
        ``vllm``, ``sarathi`` or ``orca``.
    max_seqs, max_batch_tokens, chunk_tokens : int, optional
        ``max_num_seqs``; vLLM's ``max_num_batched_tokens``; vLLM's ``long_prefill_token_threshold`` or
        Sarathi's chunk size (defaults in :mod:`stepsim.serve.scheduler`).
    slo : str, optional
        ``ttft=2s,tpot=200ms`` (keys ttft, tpot, e2e): enables ``slo_attainment`` and goodput.
    seed : int
        Seed of the Poisson arrivals.
    iteration_latency : float, optional
        Seconds per scheduler step (the constant provider).
    hardware : str, path or Hardware, optional
        Preset name or TOML file (docs/hardware.md); default ``sn40l``. Its ``hbm_capacity_bytes`` sizes the
        KV cache, its clock turns an engine-backed latency's cycles into seconds.
    hbm_bytes : int, optional
        HBM capacity (bytes) instead of the hardware's; the KV cache is what the weights leave.
    block_size : int
        Tokens per KV block.
    provider : LatencyProvider, optional
        Prices each step (instead of ``iteration_latency``).
    fidelity : {"exact", "fast"}, optional
        Price each step on the cycle engine (:mod:`stepsim.serve.exact`) or with the model calibrated on exact
        simulations of the same run (:mod:`stepsim.serve.fast`).
    routing : str or path, optional
        ``synthetic`` (default for an MoE model, seeded by ``seed``) or a routed-experts dump
        ``[tokens, layers, top_k]`` (:mod:`stepsim.serve.routing`).
    jobs : int, optional
        Worker processes for the layers of a step (exact fidelity).
    executor : str or DaskExecutor, optional
        ``"dask"``: the layers of a step on a ``dask.distributed`` cluster (a local one with one worker process
        per CPU, or the scheduler at ``address``); or a :class:`stepsim.batch.dask_executor.DaskExecutor` to use
        (not closed). Outputs are byte-identical to ``jobs=1``. Not with ``jobs``.
    address : str, optional
        Dask scheduler address (``tcp://host:8786``) for ``executor="dask"``.
    timeline : str or path, optional
        Write a timeline, Perfetto protobuf (``.pftrace`` / ``.perfetto-trace``) or Chrome JSON (``.json`` /
        ``.json.gz``): one track per request (queued, prefill, decode), the steps (:mod:`stepsim.serve.timeline`).
    calibration_cache : path, optional
        Folder of cached fast-fidelity calibrations (default ``$STEPSIM_SERVE_CACHE`` or
        ``~/.cache/stepsim/serve-calibration``).
    system : str or path, optional
        A system preset or file (docs/system.md): serve on its chips, the weights split over them and the KV
        cache in every chip's HBM left (:mod:`stepsim.serve.system`).
    progress : bool
        Progress bars on stderr while calibrating and serving, drawn only on a terminal once the work has taken
        2 s (``stepsim serve`` sets it; the results do not depend on it).
    schedule : {"paper", "auto"}, optional
        ``paper``: every layer with the STeP paper's evaluation schedule; ``auto``: the FFN and the decode attention
        mapped over the whole chip (:mod:`stepsim.mapping`, docs/mapping.md), ``--fidelity exact`` or ``fast`` on
        one chip, ``exact`` for a dense model on a system. Default (None): ``auto`` on serving hardware (``sn40l``
        and systems of it) where it is built, else ``paper`` (:func:`default_schedule`).
    drop_long, truncate_long : bool
        Requests whose prompt + output exceed the longest sequence the engine takes (``max_model_len``) are left
        out, or keep the last tokens of their prompts that fit (:mod:`stepsim.serve.long_requests`); without
        either, such a request is an error naming its row. The summary's ``long_requests`` says what was done.
    stop : stepsim.serve.replay_stop.StopRule, optional
        Stop the replay once its SLO is provably missed at a percentile: raises
        :class:`~stepsim.serve.replay_stop.ReplayStopped` (for :mod:`stepsim.plan`; a calibration's own replays
        never stop).
    calibration_requests : str, path or RequestTrace, optional
        With ``fidelity="fast"``: calibrate on the run of these requests (shaped as ``requests`` are: the same
        ``limit_requests``, arrivals and long-request policy) instead of the run served, and price the served run
        with that calibration. It is cached under that run's key, so the run of those requests shares it: the
        replicas of a deployment (:mod:`stepsim.plan`: each replica's command calibrates on the first replica's
        requests) calibrate once, not once each. The summary's ``fidelity.calibration_requests`` names them.
    report_layers : bool
        On mapped layers, the summary's ``layers``: each (kind, bucket) the run used with its mapped schedule, which
        maps any bucket not mapped yet (on an expert-parallel system the whole block's one-chip FFN schedule at
        each bucket, which its pricing never uses: minutes each at thousands of tokens). ``False`` leaves it out:
        :mod:`stepsim.plan`'s replays, which read only their requests.

    Returns
    -------
    ServeResult
    """
    started = time.perf_counter()
    check_arguments(model=model, requests=requests, out=out, arrival_scale=arrival_scale, arrival=arrival,
                    limit_requests=limit_requests, duration=duration, hardware=hardware, scheduler=scheduler,
                    max_seqs=max_seqs, max_batch_tokens=max_batch_tokens, chunk_tokens=chunk_tokens, routing=routing,
                    fidelity=fidelity, slo=slo, seed=seed, iteration_latency=iteration_latency, block_size=block_size,
                    hbm_bytes=hbm_bytes, jobs=jobs, executor=executor, provider=provider, schedule=schedule,
                    system=system, drop_long=drop_long, truncate_long=truncate_long,
                    calibration_requests=calibration_requests)
    policy = long_policy(drop_long, truncate_long)
    if out is not None:  # as the command line checks --out: now, not after the run
        from stepsim.base.outputs import check_out_dir

        check_out_dir(out, "--out")
    if fidelity == "fast":
        checked_calibration_cache(calibration_cache)
    if jobs is not None:
        from stepsim.batch.executors import check_jobs

        check_jobs(jobs)
        if executor is not None:
            raise ConfigError("--jobs and --executor both run the layers; give one")
    if address is not None and executor is None:
        raise ConfigError("--address is only for --executor dask")
    if timeline is not None:
        from stepsim.serve.output import OUTPUT_FILES
        from stepsim.serve.timeline import check_timeline_path

        check_timeline_path(timeline)
        if str(_inside(timeline, out)) in OUTPUT_FILES:
            raise ConfigError(f"--timeline {timeline}: is one of the files --out writes ({', '.join(OUTPUT_FILES)})")
    if provider is None and iteration_latency is not None:
        provider = ConstantLatency(iteration_latency)
    slo_seconds = parse_slo(slo) if slo is not None else None
    config = SchedulerConfig.make(scheduler, max_num_seqs=max_seqs, max_num_batched_tokens=max_batch_tokens,
                                  chunk_tokens=chunk_tokens, block_size=block_size)
    if system is not None:  # many chips: stepsim/serve/system.py
        from stepsim.serve.system import load_system

        system, hw = load_system(system, hardware, fidelity, resolve_serving_hardware(hardware))
    else:
        hw = resolve_serving_hardware(hardware)
    resolved = resolve_model(model)
    if fidelity is not None:  # before any work: a heterogeneous model is priced layer group by layer group
        _check_layer_list(resolved, routing, system, fidelity)
    if schedule is None:
        schedule = default_schedule(hw, fidelity)
    if schedule == "auto":  # the layers' schedules and simulated costs are kept there
        from stepsim.mapping.cache_folder import checked_mapping_cache

        checked_mapping_cache()
        if system is not None and fidelity is not None and resolved.is_moe and resolved.experts % system.chips:
            # every chip's experts are mapped alike (stepsim/mapping/expert_parallel.py); the paper's placement
            # puts at most ceil(E / n) on a chip
            raise ConfigError(f"--system {system.name} --schedule auto: the mapped expert-parallel block needs the "
                              f"{resolved.experts} experts of {resolved.name!r} divisible by the {system.chips} chips "
                              f"(or --schedule paper, which places them unevenly)")
    memory = model_memory(resolved)
    capacity, chips, limit = kv_cache_of(resolved, memory, config, hw, system, hbm_bytes)
    def shaped(trace: RequestTrace):
        """``(trace as the run serves it, what the long-request policy did)``: the shaping flags, then the policy."""
        trace = shape_trace(trace, limit_requests=limit_requests, arrival=arrival, arrival_scale=arrival_scale,
                            duration=duration, seed=seed)
        return fit_long_requests(trace, limit, capacity, memory.max_position_embeddings, policy)

    trace, long = shaped(requests_of(requests))
    calibration_run = None
    if calibration_requests is not None:  # shaped as the served requests, checked before any work
        try:
            calibration_trace = requests_of(calibration_requests)
        except (ConfigError, TraceError) as exc:  # which of the two files: the same error, named by its flag
            raise type(exc)(f"--calibration-requests {exc}") from None
        calibration_run = (calibration_requests, shaped(calibration_trace)[0])
    layers_executor = None
    if executor is not None:  # after every check: starting a cluster takes seconds
        from stepsim.serve.dask_layers import open_dask_layers

        layers_executor = open_dask_layers(executor, address)
    try:
        provider, calibration, result = _replay_with(
            provider, fidelity, resolved, model, hw, routing, seed, limit, memory, jobs, layers_executor, requests,
            trace, config, capacity, limit_requests, arrival, arrival_scale, duration, calibration_cache, system,
            progress, schedule, policy, stop=stop, calibration_run=calibration_run)
    finally:
        if layers_executor is not None:
            layers_executor.close()
    knobs = {"arrival": arrival, "arrival_scale": arrival_scale, "limit_requests": limit_requests,
             "duration": duration, "iteration_latency": iteration_latency,
             "routing": None if routing is None else str(routing), "hbm_bytes": hbm_bytes}
    if policy is not None:  # only when given: the metadata of every earlier run stays as it was
        knobs["long_requests"] = policy
    if calibration_requests is not None:
        calibration["calibration_requests"] = _requests_name(calibration_requests)
    return _finish(result, trace, provider, calibration, resolved, hw, config, capacity, limit, slo_seconds, seed,
                   requests, out, timeline, started, knobs, chips, long, report_layers)


def kv_cache_of(resolved, memory, config: SchedulerConfig, hw, system, hbm_bytes=None):
    """``(capacity, chips, max_model_len)``: the KV cache a run of ``resolved`` keeps on ``hw`` (or every chip of
    ``system``, ``chips`` its per-chip split; None on one chip) with ``config``'s block size and sequences, and the
    longest sequence it serves."""
    chips = None
    if system is not None:
        from stepsim.serve.system import system_capacity

        capacity, chips = system_capacity(system, resolved, memory, config.block_size, hbm_bytes,
                                          config.max_num_seqs)
    else:
        hbm = hw.hbm_capacity_bytes if hbm_bytes is None else hbm_bytes
        capacity = model_capacity(resolved, memory, hbm, config.block_size, config.max_num_seqs)
    return capacity, chips, max_model_len(config, capacity, memory.max_position_embeddings)


def replica_schedulers(model, *, hardware=None, system=None, scheduler="vllm", max_seqs=None,
                       max_batch_tokens=None, chunk_tokens=None) -> Callable[[], Scheduler]:
    """A maker of fresh :class:`~stepsim.serve.scheduler.Scheduler` s as :func:`serve` builds them for these
    arguments (a ``provider`` given, the default block size and HBM): the replicas replayed outside :func:`serve`
    (:mod:`stepsim.plan.joint`), the model, hardware and KV cache resolved once."""
    config = SchedulerConfig.make(scheduler, max_num_seqs=max_seqs, max_num_batched_tokens=max_batch_tokens,
                                  chunk_tokens=chunk_tokens, block_size=DEFAULT_BLOCK_SIZE)
    hw = resolve_serving_hardware(hardware)
    if system is not None:
        from stepsim.serve.system import load_system

        system, hw = load_system(system, hardware, None, hw)
    resolved = resolve_model(model)
    capacity, _, limit = kv_cache_of(resolved, model_memory(resolved), config, hw, system)
    return lambda: Scheduler(config, capacity, limit)


def fast_key_parts(resolved, hw, limit, capacity, config, memory, seed, requests, routing, limit_requests, arrival,
                   arrival_scale, duration, long_policy, schedule, system) -> dict:
    """What a fast calibration's cache key holds (:func:`stepsim.serve.calibration_cache.calibration_key`): everything
    that changes the calibrated run. Shared by colocated serving and each pool of a disaggregated run
    (:mod:`stepsim.serve.disaggregated`), so a pool reuses the calibration of the same chips served colocated."""
    # the model's dimensions without its labels: a user's model is named by its file's path (and read from it),
    # so one shape calibrates once wherever its file lies (a test's copy in a temporary clone included)
    model_dims = repr(replace(resolved, name="", source=""))
    key_parts = {"stepsim": __version__, "model": model_dims, "hardware": {f: getattr(hw, f) for f in VALUE_FIELDS},
                 # an explicit channel_depth overrides the layers' FIFO depths: equal values, other cycles
                 "hardware_explicit": list(hw.explicit),
                 "max_model_len": limit, "kv_blocks": capacity.num_blocks, "scheduler": asdict(config),
                 # the LM head's bytes price every step (its held-out error too); not in the model's repr
                 "vocab": memory.vocab_size,
                 "seed": seed, "requests": requests_sha256(requests), "routing": _routing_identity(routing),
                 "shaping": {"limit_requests": limit_requests, "arrival": arrival, "arrival_scale": arrival_scale,
                             "duration": duration}}
    if long_policy is not None:  # the requests served differ (dropped, truncated); absent: earlier keys kept
        key_parts["shaping"]["long_requests"] = long_policy
    from stepsim.serve.calibration_cache import schedule_identity

    key_parts["schedule"] = schedule_identity(schedule)  # paper or mapped layers (and the mapper's sources)
    if system is not None:  # every field of the system: its chips, hardware, dimensions and links
        from stepsim.serve.system import system_key

        key_parts["system"] = system_key(system)
    return key_parts


def _replay_with(provider, fidelity, resolved, model, hw, routing, seed, limit, memory, jobs, layers_executor,
                 requests, trace, config, capacity, limit_requests, arrival, arrival_scale, duration,
                 calibration_cache, system, progress, schedule="paper", long_policy=None, stop=None,
                 calibration_run=None):
    """``(provider, calibration record or None, replay result)``: the run's latency provider built and the trace
    replayed through it. ``calibration_run``: ``(requests, shaped trace)`` a fast run calibrates on instead of its
    own (:func:`serve`'s ``calibration_requests``)."""
    calibration = None
    cal_requests, cal_trace = calibration_run or (requests, trace)
    if fidelity is not None and provider is None:
        from stepsim.serve.layer_list import takes_layer_list

        if takes_layer_list(resolved):
            return _replay_layer_list(fidelity, resolved, model, hw, routing, seed, limit, memory, jobs,
                                      layers_executor, cal_requests, cal_trace, trace, config, capacity,
                                      limit_requests, arrival, arrival_scale, duration, calibration_cache, system,
                                      progress, schedule, long_policy)
    if fidelity == "exact":
        provider = engine_provider(resolved, model, hw, routing, seed=seed, max_model_len=limit,
                                   vocab=memory.vocab_size, jobs=jobs, layers_executor=layers_executor,
                                   system=system, schedule=schedule)
    elif fidelity == "fast":
        key_parts = fast_key_parts(resolved, hw, limit, capacity, config, memory, seed, cal_requests, routing,
                                   limit_requests, arrival, arrival_scale, duration, long_policy, schedule, system)
        provider, calibration = fast_provider(resolved, model, hw, routing, seed=seed, max_model_len=limit,
                                              vocab=memory.vocab_size, jobs=jobs, key_parts=key_parts,
                                              cache=calibration_cache, layers_executor=layers_executor,
                                              system=system, progress=progress, schedule=schedule,
                                              pilot=lambda p, on_step: replay(
                                                  cal_trace.arrival_s, cal_trace.prompt_tokens,
                                                  cal_trace.output_tokens, Scheduler(config, capacity, limit), p,
                                                  on_step))
    return _replayed(provider, calibration, trace, config, capacity, limit, progress, stop)


def _requests_name(requests) -> str:
    """How outputs name a run's requests: the file given, or a trace in memory's source."""
    return requests.source if isinstance(requests, RequestTrace) else str(requests)


def _check_layer_list(resolved, routing, system, fidelity) -> None:
    """What a model priced layer group by layer group (:mod:`stepsim.serve.layer_list`) does not take, refused in
    one line before any work (:func:`~stepsim.serve.layer_list.check_layer_list`)."""
    from stepsim.serve.layer_list import check_layer_list, takes_layer_list

    if takes_layer_list(resolved):
        check_layer_list(resolved, routing, system, fidelity)


def _replay_layer_list(fidelity, resolved, model, hw, routing, seed, limit, memory, jobs, layers_executor,
                       cal_requests, cal_trace, trace, config, capacity, limit_requests, arrival, arrival_scale,
                       duration, calibration_cache, system, progress, schedule, long_policy):
    """:func:`_replay_with` for a heterogeneous model: one exact or fast provider per layer group
    (:mod:`stepsim.serve.layer_list`), a fast one calibrated on ``cal_requests``' run (``cal_trace``)."""
    from stepsim.serve import layer_list
    from stepsim.serve.layer_list import calibration_model, exact_layer_list, fast_layer_list, group_gate, group_seed

    def pilot(p, on_step):
        return replay(cal_trace.arrival_s, cal_trace.prompt_tokens, cal_trace.output_tokens,
                      Scheduler(config, capacity, limit), p, on_step)

    calibration = None
    if fidelity == "exact":
        def group_routing(g):  # a routed-experts file: each MoE group its layers' columns (layer_list.py)
            columns = layer_list.routing_columns(resolved, g)
            if routing is None or routing == "synthetic" or columns is None:
                return None, None
            return routing, (resolved.layers, columns)

        provider = exact_layer_list(resolved, lambda sub, g: engine_provider(
            sub, model, hw, group_routing(g)[0], seed=group_seed(seed, g), max_model_len=limit,
            vocab=memory.vocab_size, jobs=jobs, layers_executor=layers_executor, system=system, schedule=schedule,
            gate=group_gate(resolved, sub), columns=group_routing(g)[1]), routing=routing, system=system)
    else:
        key_parts = fast_key_parts(resolved, hw, limit, capacity, config, memory, seed, cal_requests, routing,
                                   limit_requests, arrival, arrival_scale, duration, long_policy, schedule, system)
        provider, calibration = fast_layer_list(resolved, lambda sub, parts, group_pilot, g: fast_provider(
            sub, model, hw, None, seed=group_seed(seed, g), max_model_len=limit, vocab=memory.vocab_size, jobs=jobs,
            key_parts=parts, cache=calibration_cache, layers_executor=layers_executor, progress=progress,
            system=system, schedule=schedule, pilot=group_pilot, gate=group_gate(resolved, sub),
            calibrate_on=calibration_model(sub)), key_parts, pilot, routing=routing, system=system)
    return _replayed(provider, calibration, trace, config, capacity, limit, progress)


def _replayed(provider, calibration, trace, config, capacity, limit, progress, stop=None):
    """``(provider, calibration, result)``: the trace replayed through ``provider`` (closed after); ``stop``: the
    replay's :class:`~stepsim.serve.replay_stop.StopRule`."""
    try:
        with _bar(progress, f"serving ({provider.mode})", "requests", len(trace.arrival_s)) as update:
            on_step = None if update is None else (lambda done, steps: update(done, f"step {steps:,}"))
            result = replay(trace.arrival_s, trace.prompt_tokens, trace.output_tokens,
                            Scheduler(config, capacity, limit), provider, on_step, stop)
    finally:
        if hasattr(provider, "close"):
            provider.close()
    return provider, calibration, result


def _finish(result, trace, provider, calibration, resolved, hw, config, capacity, limit, slo_seconds, seed,
            requests, out, timeline, started, knobs: dict, chips, long=None, report_layers: bool = True) -> ServeResult:
    """The tables, the summary and the files of a replayed run."""
    lat = request_latencies(trace.arrival_s, result.first_token, result.finish, trace.output_tokens)
    requests_table = pa.table({
        "request_id": pa.array(trace.request_id, pa.int64()),
        "arrival_s": trace.arrival_s, "first_scheduled_s": result.first_scheduled,
        "first_token_s": result.first_token, "finish_s": result.finish,
        "prompt_tokens": pa.array(trace.prompt_tokens, pa.int64()),
        "output_tokens": pa.array(trace.output_tokens, pa.int64()),
        "ttft_s": lat["ttft_s"], "tpot_s": pa.array(lat["tpot_s"], pa.float64(), from_pandas=True),
        "e2e_s": lat["e2e_s"], "preemptions": result.preemptions,
    })
    iterations = {"iteration": np.arange(len(result.iterations["start_s"]), dtype=np.int64), **result.iterations}
    iterations_table = pa.table(iterations)

    summary = summarize(trace.arrival_s, result.finish, trace.output_tokens, lat, result.itl, slo_seconds)
    summary["preemptions"] = int(result.preemptions.sum())
    summary["iterations"] = iterations_table.num_rows
    summary["fidelity"] = {"mode": provider.mode, "error": provider.error}
    if hasattr(provider, "describe"):
        summary["fidelity"].update(provider.describe())
    if calibration is not None:
        summary["fidelity"]["calibration"] = calibration["key"]
        if "calibration_requests" in calibration:
            summary["fidelity"]["calibration_requests"] = calibration["calibration_requests"]
    summary["model"] = resolved.name
    summary["hardware"] = {"name": hw.name, **{f: getattr(hw, f) for f in SERVING_FIELDS}}
    if chips is not None:
        summary["system"] = chips.summary()
    summary["scheduler"] = asdict(config)
    if long is not None:  # --drop-long / --truncate-long: what was done to the requests longer than the limit
        summary["long_requests"] = long.summary()
    summary["kv_cache"] = {"hbm_bytes": capacity.hbm_bytes, "weight_bytes": capacity.weight_bytes,
                           "kv_bytes_per_token": capacity.kv_bytes_per_token, "block_size": capacity.block_size,
                           "num_blocks": capacity.num_blocks, "usable_blocks": capacity.usable_blocks,
                           "max_blocks_used": result.max_blocks_used, "max_model_len": limit}
    if capacity.sliding_pool_bytes:  # a model with sliding-window layers: their pool beside the counted one
        summary["kv_cache"]["sliding_pool_bytes"] = capacity.sliding_pool_bytes
    if "hbm_bytes" in iterations:
        summary["utilisation"] = run_utilisation(iterations)
    from stepsim.serve.layer_use import provider_rows

    layers = provider_rows(provider) if report_layers else None  # mapped layers: each bucket's schedule
    if layers is not None:
        summary["layers"] = layers
    summary["wall_s"] = time.perf_counter() - started
    files = {}
    with contextlib.ExitStack() as publish:
        if out is not None:  # the run's files (and its timeline) appear together, or none of them: a failure never
            # leaves this run's requests.parquet beside an earlier run's summary.json
            from stepsim.base.files import published_folder

            folder = publish.enter_context(published_folder(out))
        publish.enter_context(published_together())
        files = _write_files(out, folder if out is not None else None, requests_table, iterations_table, summary,
                             provider, calibration, resolved, hw, config, capacity, slo_seconds, seed, requests,
                             timeline, knobs)
    return ServeResult(summary, requests_table, iterations_table, files)


def run_utilisation(iterations: dict) -> dict:
    """The run's HBM and compute utilisation: over the whole run (the steps' must-read bytes and FLOPs over their
    cycles at the peaks, so long steps weigh more) and the median step's."""
    hbm, flops = iterations["hbm_bytes"], iterations["flops"]
    hbm_use, compute_use = iterations["hbm_utilisation"], iterations["compute_utilisation"]
    capacity_bytes = (hbm / hbm_use).sum()  # sum over steps of cycles x peak bytes per cycle
    capacity_flops = (flops / compute_use).sum()
    return {"hbm": float(hbm.sum() / capacity_bytes), "compute": float(flops.sum() / capacity_flops),
            "hbm_p50": float(np.percentile(hbm_use, 50)), "compute_p50": float(np.percentile(compute_use, 50))}


def _write_files(out, folder, requests_table, iterations_table, summary, provider, calibration, resolved, hw, config,
                 capacity, slo_seconds, seed, requests, timeline, knobs) -> dict:
    """Write the run's files into ``folder`` (a temporary one while ``out`` is new) and the timeline; returns
    their final paths by name."""
    files = {}
    if out is not None:
        config_text = json.dumps({k: summary[k] for k in ("model", "hardware", "scheduler", "kv_cache", "fidelity", "slo")},
                                 sort_keys=True)
        meta = {"stepsim.version": __version__, "stepsim.config": config_text, "stepsim.seed": str(seed),
                "stepsim.requests": _requests_name(requests),
                "stepsim.requests_sha256": requests_sha256(requests),
                "stepsim.knobs": json.dumps(knobs, sort_keys=True)}
        files = write_outputs(folder, requests_table, iterations_table, summary, meta)
        if matplotlib_available():
            from stepsim.serve.figures import CDF_FILE, OVER_TIME_FILE, latency_cdf, over_time

            title = (f"{Path(resolved.name).name} on {hw.name}, {config.policy}, {summary['completed']} "
                     f"requests, {provider.mode}")
            files["latency_cdf"] = latency_cdf(requests_table, folder / CDF_FILE, title=title, slo=slo_seconds)
            files["over_time"] = over_time(iterations_table, folder / OVER_TIME_FILE, title=title,
                                           usable_blocks=capacity.usable_blocks)
            if "hbm_bytes" in iterations_table.column_names:
                from stepsim.serve.roofline_figure import ROOFLINE_FILE, roofline

                chips = summary["system"]["chips"] if "system" in summary else 1
                files["roofline"] = roofline(iterations_table, folder / ROOFLINE_FILE, title=title,
                                             peak_flops_per_s=chips * hw.peak_flops_per_cycle * hw.clock_hz,
                                             hbm_bytes_per_s=chips * hw.hbm_peak_bytes_per_cycle * hw.clock_hz)
        files = {name: Path(out) / path.name for name, path in files.items()}  # where they are once published
    if timeline is not None:
        from stepsim.serve.timeline import write_timeline

        inside = _inside(timeline, out)  # into --out: written into the folder being built, published with it
        target = Path(timeline) if inside is None else folder / inside
        write_timeline(target, requests_table, iterations_table)
        files["timeline"] = Path(timeline)
    return files


def _inside(path, folder) -> Path | None:
    """``path`` relative to ``folder`` when it lies inside it (None otherwise, or without a folder)."""
    if folder is None:
        return None
    try:
        return Path(path).resolve().relative_to(Path(folder).resolve())
    except ValueError:
        return None
