"""``stepsim.plan(...)``: the deployment with the most goodput per chip under an SLO (docs/plan.md).

Steps: shape the trace (the first ``limit_requests``; the offered rate from ``arrival_scale`` or ``rate``);
enumerate the deployments (:mod:`stepsim.plan.space`); calibrate one fast model per replica shape
(:mod:`stepsim.plan.pricing`); bound every deployment's rate; search the deployments in waves, one per chip count,
fewest chips first, each in parts of 1, 2, 4, ... deployments, pruning those that cannot reach the front
(:mod:`stepsim.plan.search`), each search a task of the sweep runner's executors whose row is kept in the work
folder (:mod:`stepsim.plan.waves`); serve the front at the offered rate where its searches did not; re-serve the
recommended deployment with its own calibration; write the outputs (:mod:`stepsim.plan.output`).
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stepsim.base.errors import ConfigError
from stepsim.plan.evaluate import REPLAY_COUNTS, BaseTrace, Evaluator
from stepsim.plan.search import can_reach_front, front, goodput_bound, rate_bound
from stepsim.plan.space import DEFAULT_SPACE, deployments, load_space, parse_space
from stepsim.plan.waves import WORK_FOLDER, WaveRunner

#: --max-chips default and limit
DEFAULT_MAX_CHIPS = 16
MAX_CHIPS = 4096
#: --percentile default
DEFAULT_PERCENTILE = 99.0


@dataclass
class PlanResult:
    """A plan: ``summary`` (plan.json's object), ``deployments`` (one dict per deployment) and the files."""

    summary: dict
    deployments: list
    files: dict
    #: the tasks' work folder (``folder``), the deployment tasks run now (``ran``) and read back from an earlier run
    #: of the same plan (``skipped``), and what ran them (``executor``)
    work: dict = None


def check_plan_arguments(*, model, requests, slo, out=None, arrival_scale=None, rate=None, limit_requests=None,
                         percentile=DEFAULT_PERCENTILE, hardware=None, max_chips=DEFAULT_MAX_CHIPS, space=None,
                         jobs=None, executor=None) -> None:
    """Every argument checked before any work, one line naming the flag."""
    from stepsim.base.ranges import is_real
    from stepsim.serve.api import check_types, resolve_serving_hardware
    from stepsim.serve.metrics import parse_slo

    check_types(model=model, requests=requests, out=out, slo=slo)
    if slo is None:
        raise ConfigError("--slo is required: a plan searches the rate at which the SLO holds (e.g. ttft=2s,tpot=100ms)")
    parse_slo(slo)
    if arrival_scale is not None and rate is not None:
        raise ConfigError("--arrival-scale and --rate both set the offered rate; give one")
    for flag, value in (("--arrival-scale", arrival_scale), ("--rate", rate)):
        if value is not None and (not is_real(value) or not math.isfinite(value) or value <= 0):
            raise ConfigError(f"{flag} must be a positive finite number, got {value!r}")
    if limit_requests is not None and (isinstance(limit_requests, bool) or not isinstance(limit_requests, int)
                                       or limit_requests < 2):
        raise ConfigError(f"--limit-requests must be an integer >= 2 (a rate needs two arrivals), got {limit_requests!r}")
    if not is_real(percentile) or not math.isfinite(percentile) or not 0 < percentile <= 100:
        raise ConfigError(f"--percentile must be a number in (0, 100], got {percentile!r}")
    if isinstance(max_chips, bool) or not isinstance(max_chips, int) or not 1 <= max_chips <= MAX_CHIPS:
        raise ConfigError(f"--max-chips must be an integer in 1..{MAX_CHIPS}, got {max_chips!r}")
    for hw in hardware_list(hardware):
        resolve_serving_hardware(hw)
    if jobs is not None:
        from stepsim.batch.executors import check_jobs

        check_jobs(jobs)
        if executor is not None:
            raise ConfigError("--jobs and --executor both run the candidates; give one")
    # an executor object (stepsim.batch's: imap_unordered) is used as is, as the sweep runner takes one
    if executor is not None and executor != "dask" and not hasattr(executor, "imap_unordered"):
        raise ConfigError(f"--executor must be dask, got {executor!r}")


def hardware_list(hardware) -> list:
    if hardware is None:
        return ["sn40l"]
    return [hardware] if isinstance(hardware, str) else list(hardware)


def base_trace(requests, limit_requests, arrival_scale, rate) -> tuple[BaseTrace, float]:
    """The shaped requests (arrivals from 0) at the offered rate and the arrival scale that gives it."""
    from stepsim.trace_io.requests import read_requests

    trace = read_requests(requests)
    if limit_requests is not None:
        trace = trace.head(limit_requests)
    arrival = trace.arrival_s - trace.arrival_s[0]
    if len(arrival) < 2 or arrival[-1] <= 0:
        raise ConfigError(f"{requests}: a plan needs requests arriving over a time span (got {len(arrival)} "
                          f"request(s) over {float(arrival[-1]) if len(arrival) else 0.0} s)")
    scale = 1.0
    if arrival_scale is not None:
        scale = float(arrival_scale)
    elif rate is not None:
        scale = ((len(arrival) - 1) / float(arrival[-1])) / float(rate)
    return BaseTrace(arrival * scale, trace.prompt_tokens.astype(np.int64), trace.output_tokens.astype(np.int64)), \
        scale


def plan(model, requests, *, slo, out=None, arrival_scale=None, rate=None, limit_requests=None,
         percentile=DEFAULT_PERCENTILE, hardware=None, max_chips=DEFAULT_MAX_CHIPS, space=None, jobs=None,
         executor=None, calibration_cache=None, prune: bool = True, verify: bool = True,
         progress: bool = False) -> PlanResult:
    """Find the deployment with the most goodput per chip that meets ``slo`` at ``percentile`` (docs/plan.md).

    Parameters
    ----------
    model, requests : as :func:`stepsim.serve`'s.
    slo : str
        ``ttft=2s,tpot=100ms`` (ttft, tpot, e2e).
    arrival_scale, rate : float, optional
        The offered rate: arrivals multiplied by ``arrival_scale``, or scaled to ``rate`` requests/s (requests - 1
        over the arrival span); default the trace's.
    limit_requests : int, optional
        The first N requests.
    percentile : float
        The SLO holds when each metric's percentile (0..100] is at most its limit.
    hardware : str or list of str
        Chips to plan for (presets or ``.toml`` files); default ``sn40l``.
    max_chips : int
        Deployments of at most this many chips.
    space : str, path or dict, optional
        The deployment space (:mod:`stepsim.plan.space`): a TOML / JSON file or its table.
    jobs, executor : int; ``"dask"`` or an executor object of :mod:`stepsim.batch`, optional
        Run the plan's tasks (the shapes' calibrations, then each deployment's search, wave by wave:
        :mod:`stepsim.plan.waves`) on ``jobs`` local worker processes or on a Dask cluster (a local one of one
        worker per CPU); default: in this process. The same plan whichever runs them; their rows are kept in
        ``out``'s work folder (``.plan-work``), so the same plan run again resumes after the finished ones.
    calibration_cache : path, optional
        The fast calibrations' cache (as serve's).
    prune : bool
        False: search every deployment fully, every probe served to the end, with no bound or cut (the brute
        force a plan's front is tested against).
    verify : bool
        Re-serve the recommended deployment with its own ``--fidelity fast`` calibration and report the
        difference.
    """
    started = time.perf_counter()
    check_plan_arguments(model=model, requests=requests, slo=slo, out=out, arrival_scale=arrival_scale, rate=rate,
                         limit_requests=limit_requests, percentile=percentile, hardware=hardware,
                         max_chips=max_chips, space=space, jobs=jobs, executor=executor)
    from stepsim.models.presets import resolve_model
    from stepsim.serve.api import checked_calibration_cache, default_schedule, resolve_serving_hardware
    from stepsim.serve.metrics import parse_slo

    if out is not None:
        from stepsim.base.outputs import check_out_dir

        check_out_dir(out, "--out")
    cache = checked_calibration_cache(calibration_cache)
    if space is None:
        space_table = parse_space(DEFAULT_SPACE)
    elif isinstance(space, dict):
        space_table = parse_space(space)
    else:
        space_table = load_space(space)
    resolved = resolve_model(model)  # a heterogeneous model is served layer group by layer group (serve/layer_list.py)
    slo_seconds = parse_slo(slo)
    hws = [str(h) for h in hardware_list(hardware)]
    if any(default_schedule(resolve_serving_hardware(h), "fast") == "auto" for h in hws):  # mapped layers
        from stepsim.mapping.cache_folder import checked_mapping_cache

        checked_mapping_cache()
    base, scale = base_trace(requests, limit_requests, arrival_scale, rate)
    deps = deployments(space_table, max_chips, hws)
    if not deps:
        raise ConfigError(f"--max-chips {max_chips}: no deployment of the space fits (its smallest replica has "
                          f"{min(space_table['chips_per_replica'])} chip(s))")
    with tempfile.TemporaryDirectory(prefix="stepsim-plan-") as tmp:
        # the tasks' rows: in --out (a plan run again resumes after the finished ones), else a temporary folder
        work = Path(out) / WORK_FOLDER if out is not None else Path(tmp) / WORK_FOLDER
        from stepsim.batch.runner import exclusive

        work.mkdir(parents=True, exist_ok=True)
        with exclusive(work):  # one plan at a time per work folder (before any worker starts)
            runner = WaveRunner(work, executor, jobs)
            aborted = True
            try:
                result = _plan(model, requests, resolved, slo, slo_seconds, percentile, base, scale, deps, hws, cache,
                               work, out, prune, verify, limit_requests, started, resolve_serving_hardware, runner)
                aborted = False
            finally:
                runner.close(aborted)
        return result


def _touched(dep, touched: dict):
    """The least experts touched (:func:`stepsim.plan.pricing.least_touched`) that bound ``dep``'s steps: its shape's,
    or a disaggregated replica's pools' (the smaller, step by step); None where a shape has none."""
    shapes = [(dep.hardware, chips) for chips in dep.disaggregate] if dep.disaggregate else [
        (dep.hardware, dep.chips_per_replica)]
    found = [touched.get(shape) for shape in shapes]
    if any(t is None for t in found):
        return None
    return np.minimum.reduce(found)


def _plan(model, requests, resolved, slo, slo_seconds, percentile, base, scale, deps, hws, cache, work, out, prune,
          verify, limit_requests, started, resolve_hw, runner) -> PlanResult:
    from stepsim.plan.pricing import ShapePricer
    from stepsim.plan.waves import REFERENCE_FILE, calibration_config, deployment_config, trace_hash
    from stepsim.trace_io.requests import RequestTrace, write_requests

    reference = work / REFERENCE_FILE
    write_requests(RequestTrace(str(reference), np.arange(base.n, dtype=np.int64), base.arrival, base.prompt,
                                base.output), reference)
    trace_sha256 = trace_hash(base)
    pricers, shape_errors, calibrations = {}, {}, {}
    # the first wave: one calibration per replica shape; a disaggregated replica is priced by its pools' shapes
    # (plan/disaggregated.py), not by its own chips'
    shapes = list(dict.fromkeys((d.hardware, d.chips_per_replica) for d in deps if not d.disaggregate))
    systems = {shape: next(d.system for d in deps if (d.hardware, d.chips_per_replica) == shape) for shape in shapes}
    # the order the workers take them in (each calibration is its own: the order changes none)
    ordered = calibration_order(shapes, runner.workers)
    calibrated = dict(zip(ordered, runner.run([
        calibration_config(model, hw, chips, systems[(hw, chips)], cache, reference, slo)
        for hw, chips in ordered])))
    phases: dict = {}  # wall seconds (s) of the plan's phases, in order
    phase_tasks: dict = {}  # and the seconds its tasks ran in each (on N workers, up to N times the wall)

    def lap(phase: str) -> None:
        phases[phase] = time.perf_counter() - started - sum(phases.values())
        phase_tasks[phase] = runner.task_s - sum(phase_tasks.values())

    lap("calibrations")
    for hw, chips in shapes:
        got = calibrated[(hw, chips)]
        if "error" in got:  # the model does not fit, a system it cannot be split over: not a candidate
            shape_errors[(hw, chips)] = got["error"]
            continue
        pricer = ShapePricer(model, resolved, hw, chips, systems[(hw, chips)], cache)
        summary = pricer.adopt(got["summary"], got["schedule"])
        pricers[(hw, chips)] = pricer
        calibrations[f"{hw} x{chips}"] = {"calibration": summary["fidelity"]["calibration"],
                                          "error": summary["fidelity"]["error"]}
    from stepsim.plan.margin import fidelity_margin, search_slo  # the SLO less the prices' error (margin.py)

    margin = fidelity_margin(calibrations)
    searched_slo = search_slo(slo_seconds, margin)
    # every task gets every shape's calibration key: a disaggregated deployment prices its pools with them, and a
    # changed calibration (its key hashes the fitted model's sources) re-runs every task
    shape_configs = {f"{hw} x{chips}": p.shape_config() for (hw, chips), p in pricers.items()}
    # the fewest experts a step's tokens touch, under each shape's routing (the step floor's, pricing.StepFloor)
    longest = max(d.scheduler.max_seqs for d in deps)
    touched = {shape: p.least_touched(longest) for shape, p in pricers.items()}
    rows = []
    for i, dep in enumerate(deps):
        row = {"index": i, "dep": dep, "chips": dep.chips, "goodput": None, "decided": None, "bound": None,
               "error": shape_errors.get((dep.hardware, dep.chips_per_replica))}
        if row["error"] is None:
            hw = resolve_hw(dep.hardware)
            m_ub, duration, binds = rate_bound(dep, resolved, hw, base, slo_seconds, percentile,
                                               _touched(dep, touched))
            row.update(m_ub=m_ub, duration_floor=duration, binds=binds,
                       goodput_ub=goodput_bound(base.n, m_ub, duration))
        rows.append(row)

    # then one wave per chip count, fewest first (docs/plan.md §4): the front of fewer chips is final when a wave
    # starts; a wave runs in parts of 1, 2, 4, ... deployments (highest bound first), each part knowing the best of
    # the wave's earlier parts; a deployment whose bound cannot beat or reach them is pruned, the others searched as
    # tasks that each know them
    order = sorted((r for r in rows if r["error"] is None), key=lambda r: (r["chips"], -r["goodput_ub"], r["index"]))
    replays = dict.fromkeys(REPLAY_COUNTS, 0)
    offered_task = dict(cache=cache, trace_sha256=trace_sha256, shapes=shape_configs, search_slo=searched_slo,
                        percentile=percentile)
    offered_runs: list = []  # the front's runs at the offered rate, started as soon as they can be (_start_offered)
    for chips in sorted({r["chips"] for r in order}):
        beat = max((r["goodput"] for r in rows if r["goodput"] is not None and r["chips"] < chips), default=-1.0)
        for part in wave_parts([r for r in order if r["chips"] == chips]):
            match = max((r["goodput"] for r in rows if r["goodput"] is not None and r["chips"] == chips),
                        default=-1.0)
            searched = []
            for row in part:
                if prune and not can_reach_front(row["goodput_ub"], beat, match):
                    row.update(decided="pruned", bound=row["binds"], replays=0)
                    continue
                searched.append(row)
            done = runner.search([deployment_config(model, row["dep"], cache=cache, trace_sha256=trace_sha256,
                                                     shapes=shape_configs, search_slo=searched_slo,
                                                     percentile=percentile, prune=prune, rate_bound=row["m_ub"],
                                                     duration_floor=row["duration_floor"], beat=beat, match=match)
                                   for row in searched])
            for row, got in zip(searched, done):
                _take(row, got)
                for key in replays:
                    replays[key] += got[key]
            unsettled = [r["dep"] for r in order if r["decided"] is None and r["error"] is None]
            offered_runs += _start_offered(rows, unsettled, base.n, runner, model, offered_task)
    runner.retire_others()
    lap("searches")
    on_front = front(rows)
    offered = _collect_offered(offered_runs, runner)
    for key in replays:
        replays[key] += offered[key]
    lap("offered_runs")
    summary, table = _summarize(rows, on_front, base, scale, slo, percentile, calibrations, model,
                                requests, limit_requests, prune)
    recommended = summary.get("recommended")
    replica_files = _replica_files(rows[recommended["index"]], base) if recommended is not None else []
    if recommended is not None:
        folder = "." if out is None else str(out)
        rec_dep = rows[recommended["index"]]["dep"]
        # the layers the plan priced the shape with (serve's default: mapped on one sn40l chip); a disaggregated
        # replica's pools each take their own default, as the plan priced them (no --schedule)
        schedule = None if rec_dep.disaggregate else pricers[(rec_dep.hardware, rec_dep.chips_per_replica)].schedule
        shared = calibration_file(rec_dep, replica_files)
        summary["commands"] = [serve_command(rec_dep, model, f"{folder}/{name}", slo,
                                             f"serve-{name.removesuffix('.parquet')}", schedule,
                                             None if shared in (None, name) else f"{folder}/{shared}")
                               for name, _ in replica_files]
        if verify:
            summary["verification"] = _verify(rows[recommended["index"]], replica_files, model, slo, slo_seconds,
                                              percentile, base, cache, schedule, runner)
            lap("verification")
    summary["slo_margin"] = margin
    summary["replays"] = replays["replays"]  # full replays: every request served
    summary["replays_stopped"] = replays["replays_stopped"]  # stopped early, the SLO provably missed
    summary["replays_reused"] = replays["replays_reused"]
    summary["replays_unservable"] = replays["replays_unservable"]  # ended by a step the chip cannot run
    summary["wall_s"] = time.perf_counter() - started
    summary["phase_wall_s"] = phases  # where the wall time went (like wall_s, the one part that varies run to run)
    summary["phase_task_s"] = phase_tasks  # the tasks' seconds per phase (as wall_s, varies run to run)
    files = {}
    if out is not None:
        from stepsim.plan.output import write_plan

        files = write_plan(out, summary, table, replica_files)
    return PlanResult(summary, table, files, {"folder": work, "ran": runner.ran, "skipped": runner.skipped,
                                               "executor": runner.describe()})


def calibration_order(shapes: list, workers: int) -> list:
    """The replica shapes ``(hardware, chips)`` in the order ``workers`` workers should take their calibrations
    (each the next in the order as it frees up) to end soonest, estimating a calibration's time as
    ``1 + log2(chips) / 2``: the one order of the fewest estimated seconds, the closest to most chips first (every
    order is tried, up to 8 shapes; more, most chips first).

    Why: the most chips first, the longest first, leaves the shortest last; on the full-size plan of
    bench/test_bench_plan.py (16, 8, 4, 2 and 1 chips in 430, 333, 263, 224 and 133 s on two workers, session 56:
    close to the estimate's 3 : 2.5 : 2 : 1.5 : 1) that order ended with the one-chip calibration alone for 75 s
    (729 s in all), where this order, 16, 8, 2, 4, 1, ends both workers within 3 s of each other at those times
    (693 s; measured 631-650 s, a faster machine, both workers busy to the end). Until session 51 the order was 1, 2,
    4, 8, 16: the 16-chip calibration, 19 minutes alone then, started last and ended 8.6 minutes after the 8-chip
    one."""
    import heapq
    import itertools

    longest = sorted(shapes, key=lambda shape: -shape[1])
    if workers < 2 or len(longest) > 8:
        return longest

    def makespan(order) -> float:
        free = [0.0] * workers  # each worker's next free time, as a heap: the first free takes the next shape
        for _, chips in order:
            heapq.heappush(free, heapq.heappop(free) + 1 + math.log2(chips) / 2)
        return max(free)

    return list(min(itertools.permutations(longest), key=makespan))  # min: the first of the least, LPT's order first


def wave_parts(wave: list) -> list[list]:
    """A wave's deployments in parts of 1, 2, 4, 8, ... (the last part what is left): sizes that depend on nothing
    but the wave, so every executor runs the same parts (:mod:`stepsim.plan.waves`)."""
    parts, size, i = [], 1, 0
    while i < len(wave):
        parts.append(wave[i:i + size])
        i += size
        size *= 2
    return parts


def _start_offered(rows: list, unsettled: list, n: int, runner, model, task: dict) -> list:
    """Start (``runner.start``, at low priority) the front's runs at the offered rate (plan.json reports them) where
    the search did not serve that rate: the same runs a brute force makes, counted with the replays (a stopped run
    there has no metrics to report: served again to the end). Returns ``(rows, handle)`` per task started, each a
    group of front deployments that may share a replica's replay (:func:`~stepsim.plan.waves.offered_groups`);
    ``task``: :func:`~stepsim.plan.waves.offered_config`'s keywords but the deployments; each row started is
    marked (``offered_started``).

    Called after each part of the waves with the deployments not searched yet (``unsettled``): a group of the
    front so far starts when every member is final (no unsettled deployment has at most its chips: only those could
    dominate it) and no unsettled deployment may share a replay with one of its members (none can join it). So
    every group run is a group of the whole front, every count is unchanged, and the runs take the CPU the later
    waves' parts leave idle (the full-size plan's offered runs: 72 s after the searches, one core idle about half
    the searches' 130 s; now 56 s after them, bench/README.md, session 56). Why not a lone deployment's run as soon as its search ends,
    dropped if it leaves the front: tried, those runs held the low-priority workers when the searches ended
    (104 s after them on the full-size plan, where waiting for finality left 59 s)."""
    from stepsim.plan.waves import may_share, offered_config, offered_groups

    todo = [rows[i] for i in front(rows) if not rows[i].get("offered_started") and (
        rows[i]["search"].offered is None or rows[i]["search"].offered.metrics is None)]
    groups = [[todo[i] for i in group] for group in offered_groups([row["dep"] for row in todo], n)]
    least = min((d.chips for d in unsettled), default=None)  # the fewest chips a deployment not searched yet has
    ready = [group for group in groups
             if not any(may_share(row["dep"], d, n) for row in group for d in unsettled)
             and (least is None or all(row["chips"] < least for row in group))]
    for group in ready:
        for row in group:
            row["offered_started"] = True
    handles = runner.start([offered_config(model, [row["dep"] for row in group], **task) for group in ready])
    return list(zip(ready, handles))


def _collect_offered(started: list, runner) -> dict:
    """The offered runs of :func:`_start_offered` into their rows (``search.offered``, set in place, and the replay
    counts); returns the replays."""
    from stepsim.plan.waves import evaluation

    total = dict.fromkeys(REPLAY_COUNTS, 0)
    for (group, _), got in zip(started, runner.collect([handle for _, handle in started])):
        for row, run in zip(group, got["runs"]):
            row["search"].offered = evaluation(run["offered"])
            for key in REPLAY_COUNTS:
                row[key] = row.get(key, 0) + run[key]
                total[key] += run[key]
    return total


def _take(row: dict, got: dict) -> None:
    """A deployment task's row (:mod:`stepsim.plan.waves`) into the plan's row of that deployment."""
    from stepsim.plan.waves import search_of

    row["replays"], row["replays_stopped"] = got["replays"], got["replays_stopped"]
    row["replays_unservable"] = got["replays_unservable"]
    if got["error"] is not None:  # serve refused a run of this deployment (a request its KV cache cannot hold)
        row["error"] = got["error"]
        return
    res = search_of(got["search"])
    row["search"] = res
    if res.status == "cut":  # a failed rate (served, or above the rate bound) proved it off the front
        row.update(decided="cut", bound="failed rate")
        return
    row["decided"] = "simulated"
    if res.best is not None:
        row["goodput"] = res.best.metrics["goodput_requests_per_s"]


def _replica_files(row, base) -> list:
    """The recommended deployment's replicas' requests at its rate, routed as its search routed them:
    ``(name, RequestTrace)`` per replica that got requests."""
    from stepsim.trace_io.requests import RequestTrace

    best = row["search"].best
    arrival = base.arrival / best.multiplier
    out = []
    for r in range(row["dep"].replicas):
        idx = np.flatnonzero(best.assignment == r)
        if len(idx):
            name = f"replica-{r}.parquet"
            out.append((name, RequestTrace(name, idx.astype(np.int64), arrival[idx], base.prompt[idx],
                                           base.output[idx])))
    return out


def calibration_file(dep, replica_files: list) -> str | None:
    """The replica file every replica of ``dep`` calibrates on: the first replica's, for colocated replicas of
    one shape (they serve alike, so one fresh calibration prices them all: ``--calibration-requests``); None for a
    disaggregated replica (each pool calibrates on its own steps) or a lone one."""
    if dep.disaggregate or len(replica_files) < 2:
        return None
    return replica_files[0][0]


def serve_command(dep, model, file: str, slo: str, out: str, schedule: str | None = "paper",
                  calibration: str | None = None) -> str:
    """The ``stepsim serve`` command of one replica of ``dep`` on its requests ``file`` (``schedule`` None: no
    ``--schedule``, serve's default), calibrated on the requests ``calibration`` when given."""
    import shlex

    parts = ["stepsim", "serve", "--model", str(model), "--requests", file, "--hardware", dep.hardware]
    if dep.system is not None:
        parts += ["--system", dep.system]
    for key, value in dep.scheduler.serve_kwargs().items():
        parts += [f"--{key.replace('_', '-')}", str(value)]
    from stepsim.plan.disaggregated import serve_flags

    parts += serve_flags(dep)
    parts += ["--fidelity", "fast"] + ([] if schedule is None else ["--schedule", schedule])  # as the plan priced it
    if calibration is not None:
        parts += ["--calibration-requests", calibration]
    parts += ["--slo", slo, "--out", out]
    return " ".join(shlex.quote(p) for p in parts)


def _verify(row, replica_files, model, slo, slo_seconds, percentile, base, cache, schedule, runner) -> dict:
    """Re-serve the recommended deployment's replicas with ``--fidelity fast`` as plan.json's commands do, and
    compare with the plan's numbers: colocated replicas with one fresh calibration on the first one's requests (that
    calibration first, its layer simulations on all of ``runner``'s local workers; then every replica, side by side,
    each pricing its run with it), a disaggregated replica's pools each with their own."""
    from stepsim.plan.waves import verification_config
    from stepsim.trace_io.requests import write_requests

    best = row["search"].best
    arrival = base.arrival / best.multiplier
    first = np.full(base.n, np.nan)
    finish = np.full(base.n, np.nan)
    shared = calibration_file(row["dep"], replica_files)
    # the replicas' requests in the plan's work folder, where its workers read the shaped trace too
    with tempfile.TemporaryDirectory(prefix="stepsim-plan-verify-", dir=runner.work) as tmp:
        files = [write_requests(trace, Path(tmp) / name) for name, trace in replica_files]
        if shared is None:
            served = runner.run([verification_config(model, row["dep"], f, slo, cache, schedule) for f in files])
            errors = [got["error"] for got in served]  # one a calibration
        else:  # the calibration once, on every local worker (serving one request: the first replica's whole
            # replay then ran alone; the full-size plan's verification 130 -> 122 s); then every replica side by
            # side, each priced with it
            calibrated = runner.run([verification_config(model, row["dep"], files[0], slo, cache, schedule,
                                                         jobs=runner.local_jobs, calibration=files[0],
                                                         first_only=True)])
            served = runner.run([verification_config(model, row["dep"], f, slo, cache, schedule,
                                                      calibration=files[0]) for f in files])
            errors = [calibrated[0]["error"]]
    for (_, trace), got in zip(replica_files, served):
        first[trace.request_id], finish[trace.request_id] = got["first_token"], got["finish"]
    ev = Evaluator(model, base, slo_seconds, percentile, {}, Path("."))
    fresh = ev.metrics(arrival, first, finish)
    plan_m = best.metrics

    def rel(a, b):
        return None if a is None or b is None or b == 0 else (a - b) / b

    return {"meets_slo": fresh["meets_slo"], "ttft_p": fresh["ttft_p"], "tpot_p": fresh["tpot_p"],
            "goodput_requests_per_s": fresh["goodput_requests_per_s"],
            "ttft_p_error": rel(plan_m["ttft_p"], fresh["ttft_p"]),
            "tpot_p_error": rel(plan_m["tpot_p"], fresh["tpot_p"]),
            "goodput_error": rel(plan_m["goodput_requests_per_s"], fresh["goodput_requests_per_s"]),
            "fidelity_errors": errors}


def _summarize(rows, on_front, base, scale, slo, percentile, calibrations, model, requests,
               limit_requests, prune) -> tuple[dict, list]:
    """plan.json's object and the deployments' table (one dict per deployment)."""
    from stepsim.plan.disaggregated import split_columns

    table = []
    front_set = set(on_front)
    for row in rows:
        dep = row["dep"]
        res = row.get("search")
        best = res.best if res is not None else None
        offered = res.offered if res is not None else None
        rate = best.multiplier * base.rate if best is not None else None
        table.append({
            "deployment": dep.label(), "hardware": dep.hardware, "chips": dep.chips,
            "chips_per_replica": dep.chips_per_replica, "replicas": dep.replicas, "router": dep.router,
            "system": dep.system, **split_columns(dep), "scheduler": dep.scheduler.policy, "max_seqs": dep.scheduler.max_seqs,
            "max_batch_tokens": dep.scheduler.max_batch_tokens, "chunk_tokens": dep.scheduler.chunk_tokens,
            "decided": row["decided"] or "infeasible", "bound": row["bound"], "error": row["error"],
            "rate_bound_multiplier": row.get("m_ub"), "goodput_bound_requests_per_s": row.get("goodput_ub"),
            "search": res.status if res is not None else None,
            "probes": len(res.probes) if res is not None else 0,
            # the doubling (and bisection) rates above the rate bound: failures the search did not serve
            "probes_proved": len(res.proved) if res is not None else 0,
            "replays": row.get("replays", 0),
            "replays_stopped": row.get("replays_stopped", 0),
            "replays_unservable": row.get("replays_unservable", 0),
            "multiplier": best.multiplier if best is not None else None,
            "rate_requests_per_s": rate,
            "goodput_requests_per_s": row["goodput"],
            "goodput_per_chip": None if row["goodput"] is None else row["goodput"] / dep.chips,
            "slo_attainment": best.metrics["slo_attainment"] if best is not None else None,
            "ttft_p99_s": best.metrics["ttft_p99"] if best is not None else None,
            "tpot_p99_s": best.metrics["tpot_p99"] if best is not None else None,
            "offered_meets_slo": offered.meets if offered is not None else None,
            # None where the offered rate was not served to the end (docs/plan.md §4, "Offered rate")
            "offered_slo_attainment": offered.metrics["slo_attainment"] if offered is not None
            and offered.metrics is not None else None,
            "offered_goodput_requests_per_s": offered.metrics["goodput_requests_per_s"] if offered is not None
            and offered.metrics is not None else None,
            "max_utilisation": res.max_utilisation if res is not None else None,
            "on_front": row["index"] in front_set,
        })
    summary = {"model": str(model), "requests": str(requests), "limit_requests": limit_requests,
               "requests_planned": base.n, "offered_rate_requests_per_s": base.rate, "arrival_scale": scale,
               "slo": slo, "percentile": percentile, "deployments": len(rows),
               "simulated": sum(r["decided"] == "simulated" for r in rows),
               "pruned": sum(r["decided"] == "pruned" for r in rows),
               "cut": sum(r["decided"] == "cut" for r in rows),
               "infeasible": sum(r["decided"] is None for r in rows), "prune": prune, "calibrations": calibrations}
    front_rows = sorted(on_front, key=lambda i: rows[i]["chips"])
    summary["front"] = [table[i] for i in front_rows]
    if front_rows:
        rec = max(front_rows, key=lambda i: (rows[i]["goodput"] / rows[i]["chips"], -rows[i]["chips"], -i))
        best = table[rec]
        summary["recommended"] = {**best, "index": rec}
        rec_gpc = best["goodput_per_chip"]
        why = []
        for i in front_rows:
            if i == rec:
                continue
            t = table[i]
            why.append({"deployment": t["deployment"], "chips": t["chips"],
                        "goodput_per_chip": t["goodput_per_chip"],
                        "why": (f"{t['goodput_per_chip']:.4g} requests/s a chip on {t['chips']} chip(s), "
                                f"{(1 - t['goodput_per_chip'] / rec_gpc) * 100:.1f} % less than the recommended "
                                f"{rec_gpc:.4g} on {best['chips']}")})
        summary["front_lost"] = why
    else:
        summary["recommended"] = None
    return summary, table
