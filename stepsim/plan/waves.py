"""A plan's work as tasks of the sweep runner's executors (docs/plan.md §4 "Waves", §6): local processes
(``--jobs N``), a Dask cluster (``--executor dask``) or this process, with the same rows whichever runs them.

* **Calibration wave**: one task per replica shape (:func:`calibration_config`); a worker serves the reference run
  with ``--fidelity fast`` into the shared calibration cache and returns the run's summary, from which the parent
  reads the calibration (:meth:`stepsim.plan.pricing.ShapePricer.adopt`).
* **Deployment waves**, one per chip count, fewest chips first: a task (:func:`deployment_config`) is one
  deployment's whole rate search (:func:`stepsim.plan.search.search_rate`) from plain data: the model, the shaped
  trace's file and its hash, the searched limits, the shapes' calibration keys (a worker rebuilds its providers with
  :meth:`~stepsim.plan.pricing.ShapePricer.from_config`, as the parent's pricer makes them), the deployment's
  rate bound and duration floor, the goodput it must beat (the best of fewer chips: the earlier waves are final)
  and the one it must reach (the best of its own chips so far: the earlier parts of its wave, below). Its row
  (:func:`result_row`: the search's probes, best and offered runs, replays) is written, atomically, into the plan's
  work folder as ``part-<id>.parquet``, the id hashing the task's config (calibration keys, deployment, trace hash,
  limits, percentile, the goodput to beat, the plan's and serve's sources: :func:`code_hash`); a plan run again
  skips every task whose row exists, so an interrupted plan resumes and one whose SLO, trace or calibrations
  changed recomputes what they change.

* **Offered runs** (:func:`offered_config`): the front's deployments whose searches did not serve the offered rate
  to the end, served there, one task per group that can share a replica's run (:func:`offered_groups`).
* **Verification** (:func:`verification_config`): each replica of the recommended deployment re-served, one task a
  replica: colocated replicas priced by one fresh calibration on the first one's requests (that task first, on the
  local workers), a disaggregated replica's pools by their own (:func:`stepsim.plan.api.calibration_file`).

* **Parts of a wave**: a wave's deployments (highest goodput bound first) run in parts of 1, 2, 4, 8, ...
  deployments; a part's tasks run together and know the best goodput of the wave's earlier parts, which a deployment
  of equal chips must reach to be on the front (equal goodput on equal chips: both are). The parts' sizes do not
  depend on the executor or its workers, so every executor writes the same rows; the first parts are small so that a
  wave's first searches (the highest bounds) set what the many deployments of its last parts must reach.

Workers write nothing: the parent writes every row (as the sweep runner does), so a killed worker leaves nothing
half-written.
"""

from __future__ import annotations

import functools
import json
import math
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

from stepsim.base.errors import StepsimError

#: the plan's work folder inside ``--out`` (the tasks' rows)
WORK_FOLDER = ".plan-work"
#: the shaped trace every task reads (in the work folder)
REFERENCE_FILE = "reference.parquet"


class PlanTaskError(StepsimError):
    """A plan task failed with an error that is not a deployment's (a bug, a lost worker): the plan stops; the rows
    of the finished tasks are written, and the same plan run again resumes after them."""


# --- the tasks (run by a worker) ------------------------------------------------------------------------------
def plan_task(config: dict, force: bool = False) -> dict:
    """A worker's entry (``WindowedExecutor.task_function``): run the calibration or deployment task ``config``.

    Returns ``{"status": "ok", "row": ...}``, or ``"failed"`` with the error's type, message and traceback for an
    error that is not the task's answer (a deployment's serve refusal is its answer: ``row["error"]``)."""
    start = time.perf_counter()
    try:
        run = {"calibration": run_calibration, "deployment": run_deployment, "offered": run_offered,
               "verification": run_verification}[config["kind"]]
        row = run(config)
        return {"status": "ok", "row": row, "wall_s": time.perf_counter() - start, "error_type": None,
                "error_message": None, "error_traceback": None}
    except Exception as exc:  # noqa: BLE001 - returned to the parent, which stops the plan with it
        return {"status": "failed", "row": None, "wall_s": time.perf_counter() - start,
                "error_type": type(exc).__name__, "error_message": str(exc),
                "error_traceback": traceback.format_exc()}


def calibration_config(model_arg, hardware: str, chips: int, system, cache, reference: Path, slo: str) -> dict:
    """The task that calibrates one replica shape on the reference run."""
    return {"kind": "calibration", "model": str(model_arg), "hardware": hardware, "chips": chips, "system": system,
            "cache": str(cache), "reference": str(reference), "slo": slo}


def run_calibration(config: dict) -> dict:
    """Calibrate a shape (:meth:`ShapePricer.calibrate`): ``{"summary", "schedule"}``, or ``{"error"}`` when serve
    refuses the shape (the model does not fit it: not a candidate)."""
    from stepsim.models.presets import resolve_model
    from stepsim.plan.pricing import ShapePricer

    pricer = ShapePricer(config["model"], resolve_model(config["model"]), config["hardware"], config["chips"],
                         config["system"], config["cache"])
    try:
        summary = pricer.calibrate(Path(config["reference"]), config["slo"])
    except StepsimError as exc:
        return {"error": str(exc)}
    return {"summary": summary, "schedule": pricer.schedule}


def verification_config(model_arg, dep, requests: Path, slo: str, cache, schedule, jobs: int | None = None,
                        calibration: Path | None = None, first_only: bool = False) -> dict:
    """The task that re-serves one replica of the recommended deployment (its requests' file) with ``--fidelity
    fast`` as the command plan.json gives for it (:func:`stepsim.plan.api.serve_command`): calibrated on its own
    requests, or on ``calibration``'s (``--calibration-requests``); ``jobs``: worker processes for the calibration's
    layer simulations (``--jobs``; the same calibration on any number). ``first_only``: serve only the file's first
    request (a colocated replica), priced with that calibration: the calibration, into the cache, and its error."""
    return {"kind": "verification", "model": str(model_arg), "deployment": _deployment_dict(dep),
            "requests": str(requests), "slo": slo, "cache": str(cache), "schedule": schedule, "jobs": jobs,
            "calibration": None if calibration is None else str(calibration), "first_only": first_only}


def run_verification(config: dict) -> dict:
    """Serve a verification task's replica: ``{"first_token", "finish"}`` (s, per request served) and the run's
    fidelity ``error``."""
    from stepsim.serve.api import serve
    from stepsim.trace_io.requests import read_requests

    dep = _deployment(config["deployment"])
    if dep.disaggregate:
        from stepsim.plan.disaggregated import verify_replica

        result = verify_replica(dep, config["model"], config["requests"], config["slo"], config["cache"])
    else:
        requests = read_requests(config["requests"]).head(1) if config["first_only"] else config["requests"]
        result = serve(config["model"], requests, fidelity="fast", schedule=config["schedule"],
                       slo=config["slo"], hardware=dep.hardware, system=dep.system,
                       calibration_cache=config["cache"], jobs=config["jobs"],
                       calibration_requests=config["calibration"], **dep.scheduler.serve_kwargs())
    return {"first_token": result.requests.column("first_token_s").to_numpy(),
            "finish": result.requests.column("finish_s").to_numpy(), "error": result.summary["fidelity"]["error"]}


def _deployment_dict(dep) -> dict:
    """A deployment as plain data (:func:`_deployment` reads it back)."""
    return {"chips_per_replica": dep.chips_per_replica, "replicas": dep.replicas, "router": dep.router,
            "scheduler": [dep.scheduler.policy, dep.scheduler.max_seqs, dep.scheduler.max_batch_tokens,
                          dep.scheduler.chunk_tokens],
            "hardware": dep.hardware, "disaggregate": list(dep.disaggregate)}


def deployment_config(model_arg, dep, *, cache, trace_sha256: str, shapes: dict, search_slo: dict,
                      percentile: float, prune: bool, rate_bound: float, duration_floor, beat: float,
                      match: float) -> dict:
    """The task that searches one deployment (module docstring). ``shapes``: ``{"hw xC": shape_config}`` of every
    calibrated replica shape (a disaggregated deployment prices its pools with them); ``rate_bound`` and
    ``duration_floor``: the deployment's :func:`~stepsim.plan.search.rate_bound`; ``beat``: the best goodput of
    fewer chips, to exceed; ``match``: the best of equal chips so far, to reach (-1: none)."""
    return {"kind": "deployment", "model": str(model_arg), "deployment": _deployment_dict(dep),
            "trace_sha256": trace_sha256, "shapes": shapes, "slo": dict(search_slo), "percentile": percentile,
            "prune": prune, "rate_bound": rate_bound, "duration_floor": duration_floor.to_json(), "beat": beat,
            "match": match, "cache": str(cache),
            "code": code_hash()}


def code_hash() -> str:
    """sha256 of the sources a deployment task's row depends on beyond its calibrations (whose keys hash the fitted
    model's and the exact pricing's): the plan's search and the serve package's replay and scheduler, so a row
    written by other code is not read back."""
    global _CODE
    if _CODE is None:
        import stepsim
        from stepsim.base.files import file_sha256, stable_hash

        root = Path(stepsim.__file__).parent
        paths = sorted([*root.joinpath("plan").glob("*.py"), *root.joinpath("serve").glob("*.py")])
        _CODE = stable_hash([[str(p.relative_to(root)), file_sha256(p)] for p in paths])
    return _CODE


_CODE = None


def task_id(config: dict) -> str:
    """The hash of everything that decides a task's row (its config but where files live)."""
    from stepsim.base.files import stable_hash

    return stable_hash({k: v for k, v in config.items() if k not in ("cache", "reference", "work")})


def trace_hash(base) -> str:
    """sha256 of the shaped requests (arrivals, prompts, outputs): a task reads them from the work folder's file
    and checks this."""
    from stepsim.base.files import arrays_sha256

    return arrays_sha256({"arrival": base.arrival.astype(np.float64), "prompt": base.prompt.astype(np.int64),
                          "output": base.output.astype(np.int64)})


def read_base(path: Path, expected_sha256: str):
    """The shaped trace a task reads (its hash checked: a changed file is an error, not a silent other plan)."""
    from stepsim.plan.evaluate import BaseTrace
    from stepsim.trace_io.requests import read_requests

    t = read_requests(path)
    base = BaseTrace(np.asarray(t.arrival_s, dtype=np.float64), t.prompt_tokens.astype(np.int64),
                     t.output_tokens.astype(np.int64))
    if trace_hash(base) != expected_sha256:
        raise StepsimError(f"{path}: the plan's shaped trace changed while it ran (its hash differs)")
    return base


def run_deployment(config: dict) -> dict:
    """One deployment's rate search (:func:`search_rate`, as docs/plan.md §4 defines it) with its own
    :class:`~stepsim.plan.evaluate.Evaluator`; returns :func:`result_row`'s row."""
    from stepsim.plan.search import DurationFloor, can_reach_front, goodput_bound, multiplier, search_rate

    dep = _deployment(config["deployment"])
    base = read_base(Path(config["work"]) / REFERENCE_FILE, config["trace_sha256"])
    prune, beat, match = config["prune"], config["beat"], config["match"]
    duration = DurationFloor.from_json(config["duration_floor"])
    with tempfile.TemporaryDirectory(prefix="stepsim-plan-task-") as tmp:
        evaluator = task_evaluator(config, base, Path(tmp), stop_early=prune)

        def can_win(e_hi):
            """Whether a failure at multiplier(e_hi) leaves the deployment a chance: its goodput bound (its rate
            below multiplier(e_hi)) above the best of fewer chips and at least the best of equal chips so far."""
            if not prune:
                return True
            return can_reach_front(goodput_bound(base.n, multiplier(e_hi), duration), beat, match)

        error = None
        res = None
        try:
            res = search_rate(lambda m: evaluator.evaluate(dep, m), can_win,
                              rate_bound=config["rate_bound"] if prune else math.inf)
        except StepsimError as exc:  # serve refused a run of this deployment (a request its KV cache cannot hold)
            error = str(exc)
    return result_row(res, error, evaluator)


def task_evaluator(config: dict, base, folder: Path, stop_early: bool = False):
    """The :class:`~stepsim.plan.evaluate.Evaluator` of a deployment or offered task: the shapes' providers rebuilt
    from their calibration keys (``config["shapes"]``, as the parent's pricers make them)."""
    from stepsim.models.presets import resolve_model
    from stepsim.plan.evaluate import Evaluator
    from stepsim.plan.pricing import ShapePricer

    resolved = resolve_model(config["model"])
    pricers = {}
    for shape in config["shapes"].values():
        pricers[(shape["hardware"], shape["chips"])] = ShapePricer.from_config(config["model"], resolved,
                                                                               config["cache"], shape)
    evaluator = Evaluator(config["model"], base, config["slo"], config["percentile"], pricers, folder,
                          stop_early=stop_early)
    evaluator.calibration_cache = config["cache"]  # where a disaggregated pool's shape is calibrated
    evaluator.reference_file = Path(config["work"]) / REFERENCE_FILE
    return evaluator


def offered_groups(deps: list, n: int) -> list[list[int]]:
    """Indices of ``deps`` (served at one rate, ``n`` requests) in groups outside which no two runs can share a
    replica's replay (:func:`may_share`), each group in the order given, the groups in the order of their first
    member. So the groups are tasks of their own and every count, ``replays_reused`` too, is what one evaluator
    serving them all in order counts."""
    group = list(range(len(deps)))  # each deployment's group: the lowest index joined with it so far
    for j in range(len(deps)):
        for i in range(j):
            if may_share(deps[i], deps[j], n):
                old, new = max(group[i], group[j]), min(group[i], group[j])
                group = [new if g == old else g for g in group]
    return [[i for i in range(len(deps)) if group[i] == g] for g in sorted(set(group))]


def may_share(a, b, n: int) -> bool:
    """Whether runs of deployments ``a`` and ``b`` at one rate (``n`` requests) may share a replica's replay: they
    do when they send one replica of the same hardware, chips, pools and scheduler the same requests
    (:meth:`~stepsim.plan.evaluate.Evaluator._serve_replica`'s key), so when their round-robin replicas have a
    request set in common, or either routes by state (its replicas' sets are known only once served)."""
    if (a.hardware, a.chips_per_replica, a.disaggregate, a.scheduler) != \
            (b.hardware, b.chips_per_replica, b.disaggregate, b.scheduler):
        return False
    sets_a, sets_b = _replica_sets(n, a.replicas, a.router), _replica_sets(n, b.replicas, b.router)
    return sets_a is None or sets_b is None or bool(sets_a & sets_b)


@functools.lru_cache(maxsize=64)
def _replica_sets(n: int, replicas: int, router: str) -> frozenset | None:
    """The request sets (as bytes) of ``replicas`` round-robin replicas of ``n`` requests; None for a router by
    state."""
    from stepsim.plan.replicas import round_robin

    if router != "round-robin" and replicas > 1:
        return None
    assignment = round_robin(n, replicas)
    return frozenset(np.flatnonzero(assignment == r).tobytes() for r in range(replicas)) - {b""}


def offered_config(model_arg, deps: list, *, cache, trace_sha256: str, shapes: dict, search_slo: dict,
                   percentile: float) -> dict:
    """The task that serves a group of front deployments (:func:`offered_groups`) at the offered rate, to the
    end, one after the other with one evaluator (the parent's serial loop until 2026-11-29: 121 s of the
    full-size plan with one core idle)."""
    return {"kind": "offered", "model": str(model_arg), "deployments": [_deployment_dict(d) for d in deps],
            "trace_sha256": trace_sha256, "shapes": shapes, "slo": dict(search_slo), "percentile": percentile,
            "cache": str(cache)}


def run_offered(config: dict) -> dict:
    """Serve an offered task's deployments at the offered rate: ``{"runs": [{"offered": evaluation, counts}]}``,
    one a deployment (its evaluation as :func:`_evaluation_dict` gives it, its replays as
    :meth:`~stepsim.plan.evaluate.Evaluator.counts` keys them); a serve refusal is raised (the deployment's search
    served the same requests, so this is a bug)."""
    base = read_base(Path(config["work"]) / REFERENCE_FILE, config["trace_sha256"])
    runs = []
    with tempfile.TemporaryDirectory(prefix="stepsim-plan-offered-") as tmp:
        evaluator = task_evaluator(config, base, Path(tmp))
        for d in config["deployments"]:
            before = evaluator.counts()
            ev = evaluator.evaluate(_deployment(d), 1.0)
            runs.append({"offered": _evaluation_dict(ev),
                         **{key: after - before[key] for key, after in evaluator.counts().items()}})
    return {"runs": runs}


# --- rows: a search result as plain data, and back ------------------------------------------------------------
def result_row(res, error, evaluator) -> dict:
    """The row of a deployment task: its search (JSON: probes, best and offered runs) and its replays."""
    return {"error": error, "search": None if res is None else json.dumps(_search_dict(res), sort_keys=True),
            **evaluator.counts()}


def _evaluation_dict(ev) -> dict | None:
    if ev is None:
        return None
    return {"multiplier": ev.multiplier, "meets": bool(ev.meets), "metrics": ev.metrics, "rounds": ev.rounds,
            "max_utilisation": ev.max_utilisation, "assignment": np.asarray(ev.assignment).tolist()}


def _search_dict(res) -> dict:
    return {"status": res.status, "probes": [[int(e), bool(m)] for e, m in res.probes], "hi": res.hi,
            "best": _evaluation_dict(res.best), "offered": _evaluation_dict(res.offered),
            "max_utilisation": res.max_utilisation, "proved": [int(e) for e in res.proved]}


def search_of(text: str | None):
    """The :class:`~stepsim.plan.search.SearchResult` of a row's ``search`` (floats read back bit for bit: JSON
    keeps a float's shortest repr)."""
    from stepsim.plan.search import SearchResult

    if text is None:
        return None
    d = json.loads(text)
    best = evaluation(d["best"])
    offered = evaluation(d["offered"])
    if d["offered"] is not None and d["offered"] == d["best"]:
        offered = best  # one run
    return SearchResult(d["status"], [(e, m) for e, m in d["probes"]], best, d["hi"], offered, d["max_utilisation"],
                        list(d["proved"]))


def evaluation(e: dict | None):
    """The :class:`~stepsim.plan.evaluate.Evaluation` of :func:`_evaluation_dict`'s ``e`` (None: None)."""
    from stepsim.plan.evaluate import Evaluation

    if e is None:
        return None
    return Evaluation(e["multiplier"], e["meets"], e["metrics"], e["rounds"], e["max_utilisation"],
                      np.asarray(e["assignment"], dtype=np.int64))


# --- the parent: run a wave, keep its rows ---------------------------------------------------------------------
class WaveRunner:
    """Runs waves of plan tasks in ``work`` (a folder), skipping those with a row there: in this process
    (``executor`` None), or on an executor of :mod:`stepsim.batch` (``--jobs N``: local processes, ``dask``, or an
    executor object, used as is and not closed). ``ran`` / ``skipped`` count the deployment tasks."""

    def __init__(self, work: Path, executor=None, jobs: int | None = None):
        self.work = Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        self._executor = None
        self._owned = False
        if executor is not None and not isinstance(executor, str):
            self._executor = executor
        elif executor is not None or jobs is not None:
            from stepsim.batch.executor_factory import make_executor
            from stepsim.batch.executors import default_jobs

            self._executor = make_executor(executor or "local", jobs=jobs or default_jobs(), warm_kernels=True)
            self._owned = True
        self.ran = 0
        self.skipped = 0
        self._background: list = []  # start()'s tasks, a handle each: (task, its future or None in this process)
        self.written: set = set()  # the row files of this plan's tasks
        #: wall seconds of the tasks run so far, each as long as it ran where it ran (a worker's, or this process's):
        #: the CPU time the plan's work took, against the wall time of its phases
        self.task_s = 0.0

    def describe(self) -> str:
        return "this process" if self._executor is None else self._executor.describe()

    @property
    def workers(self) -> int:
        """Tasks that run at once: the executor's workers, or 1 in this process."""
        return 1 if self._executor is None else self._executor.jobs

    @property
    def local_jobs(self) -> int | None:
        """The worker processes of a local executor (``--jobs N``), which a lone long task may use for its own
        layer simulations while the others idle; None in this process or on Dask."""
        from stepsim.batch.executors import LocalExecutor

        return self._executor.jobs if isinstance(self._executor, LocalExecutor) else None

    def run(self, configs: list) -> list:
        """Run tasks whose rows are never stored: the calibrations (the calibration cache is their store), the
        front's offered runs (only a finished search knows the front) and the verification (once, at the plan's
        end); rows in order."""
        return self._run(configs, store=False)

    def search(self, configs: list) -> list:
        """Run (or read back) the deployment tasks; their rows in order."""
        return self._run(configs, store=True)

    def start(self, configs: list) -> list:
        """Start tasks whose rows are not stored (the front's offered runs of a finished wave) at low priority
        (:meth:`~stepsim.batch.executors.WindowedExecutor.background`: on the CPU the tasks :meth:`run` and
        :meth:`search` wait for leave idle); returns handles for :meth:`collect`. In this process they run at
        :meth:`collect`. Where and when they run changes no row."""
        from stepsim.batch.grid import Task

        if self._executor is not None:
            self._executor.task_function = plan_task
        handles = []
        for config in configs:
            config = {**config, "work": str(self.work)}
            task = Task(len(self._background), config, task_id(config))
            self._background.append((task, None if self._executor is None else self._executor.background(task)))
            handles.append(task.index)
        return handles

    def collect(self, handles: list) -> list:
        """The rows of :meth:`start`'s ``handles``, in order (waiting for those still running)."""
        rows = []
        for handle in handles:
            task, future = self._background[handle]
            outcome = plan_task(task.config) if future is None else self._executor.outcome(future, task, 1)
            rows.append(self._row(task, outcome))
        return rows

    def _run(self, configs: list, store: bool) -> list:
        import pyarrow.parquet as pq

        from stepsim.batch.grid import Task

        rows: dict = {}
        pending = []
        for i, config in enumerate(configs):
            config = {**config, "work": str(self.work)}
            tid = task_id(config)
            path = self.work / f"part-{tid[:32]}.parquet"
            if store:
                self.written.add(path.name)
                if path.is_file():
                    table = pq.read_table(path)
                    if table.column("task_id")[0].as_py() == tid:
                        rows[i] = table.to_pylist()[0]
                        self.skipped += 1
                        continue
            pending.append(Task(i, config, tid))
        for task, outcome in self._outcomes(pending):  # completion order; each row stored as it arrives
            row = self._row(task, outcome)
            if store:
                row = self._store(task, row)
                self.ran += 1
            rows[task.index] = row
        return [rows[i] for i in range(len(configs))]

    def _row(self, task, outcome: dict) -> dict:
        """A finished task's row (its seconds counted), or the :class:`PlanTaskError` of its failure."""
        if outcome["status"] != "ok":
            raise PlanTaskError(f"plan task {_name(task.config)} failed: {outcome['error_type']}: "
                                f"{outcome['error_message']}\n{outcome['error_traceback']}")
        self.task_s += outcome["wall_s"]
        return outcome["row"]

    def _outcomes(self, pending: list):
        """``(task, outcome)`` as the tasks finish: here, in order; on an executor, in completion order."""
        if self._executor is None:
            for task in pending:
                yield task, plan_task(task.config)
            return
        self._executor.task_function = plan_task
        yield from self._executor.imap_unordered(pending)

    def _store(self, task, row: dict) -> dict:
        """Write a deployment task's row (atomically) and return it as read back."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from stepsim.base.files import write_parquet_atomic

        path = self.work / f"part-{task.run_id[:32]}.parquet"
        table = pa.Table.from_pylist([{"task_id": task.run_id, "deployment": _name(task.config), **row}],
                                     schema=ROW_SCHEMA)
        write_parquet_atomic(table, path)
        return pq.read_table(path).to_pylist()[0]

    def retire_others(self) -> int:
        """Remove the rows of tasks this plan did not run or read (an earlier plan's, whose inputs changed)."""
        removed = 0
        for path in sorted(self.work.glob("part-*.parquet")):
            if path.name not in self.written:
                path.unlink()
                removed += 1
        return removed

    def close(self, aborted: bool = False) -> None:
        if self._owned:
            if aborted:
                self._executor.abort()
            else:
                self._executor.close()


def _name(config: dict) -> str:
    """A task's name in messages: its shape, or its deployment's label."""
    if config["kind"] == "calibration":
        return f"calibration of {config['hardware']} x{config['chips']}"
    if config["kind"] == "offered":
        return "offered runs of " + ", ".join(_deployment(d).label() for d in config["deployments"])
    if config["kind"] == "verification":
        return f"verification of {_deployment(config['deployment']).label()} on {Path(config['requests']).name}"
    return _deployment(config["deployment"]).label()


def _deployment(d: dict):
    from stepsim.plan.space import Deployment, SchedulerChoice

    return Deployment(d["chips_per_replica"], d["replicas"], d["router"], SchedulerChoice(*d["scheduler"]),
                      d["hardware"], tuple(d["disaggregate"]))


def _schema():
    import pyarrow as pa

    return pa.schema([("task_id", pa.string()), ("deployment", pa.string()), ("error", pa.string()),
                      ("search", pa.string()), ("replays", pa.int64()), ("replays_stopped", pa.int64()),
                      ("replays_reused", pa.int64()), ("replays_unservable", pa.int64())])


ROW_SCHEMA = _schema()
