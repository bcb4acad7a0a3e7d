"""The hierarchical search of ``stepsim optimize``: symbolic evaluation, pruning, simulation in rounds.

1. **Symbolic evaluation** of every candidate (a ``mode = "metrics"`` sweep into ``OUT/metrics``): exact
   on-chip bytes, off-chip bytes, FLOPs and allocated compute (:meth:`stepsim.workloads.base.Workload.metrics`,
   :func:`stepsim.results.records.allocated_compute_flops`), and from them a lower bound on cycles: the largest of the
   roofline (:func:`stepsim.optimize.pareto.roofline_lower_bound`) and the per-unit bounds of
   :mod:`stepsim.analysis.bounds` (record columns :data:`BOUND_COLUMNS`): the busiest off-chip load unit's tiles one
   after another, the busiest compute unit's firings (each the larger of its exact FLOPs at the unit's bandwidth
   and its PMU reads of loaded weight tiles), the busiest HBM channel's 64-byte requests, and each unit's work
   after the pipeline's fill in front of it, or the HBM's last weight request plus the firing its tile still
   gets (``pipeline_cycles``). The compute and load bounds are the tight ones for time-multiplexed MoE
   layers (padded static tiles, small tiles against weight tiles, the region with the most tokens) and decode
   attention, and the pipeline bound for memory-bound layers with a region per expert (no weight request
   before the routed tokens are loaded) and where large weight tiles make the fill or the drain long (a
   256-column tile and one firing on it before a region's down projection can start, or after the last
   request). Candidates that differ only in their FIFO depths share one evaluation (the published on-chip
   accounting does not count FIFOs). On several chips (``--max-chips``, :mod:`stepsim.optimize.chips`) each chip
   has its own HBM: the roofline divides the off-chip bytes by all of them, the per-unit bounds are per chip
   already (each unit is on one chip), and the busiest link adds its own bound (``link_cycles``: its elements back
   to back plus its latency); the chip count is a fourth objective, so a candidate is pruned only by a point on
   no more chips.
2. **Budgets and proven deadlocks**: candidates over ``max_on_chip`` bytes or ``max_compute`` FLOPs/cycle are
   dropped, and so are those whose metrics row proves they deadlock at their FIFO depths (``deadlock_proof``,
   :mod:`stepsim.analysis.deadlock_proof`: a time-multiplexed MoE region whose experts' tiles cannot all wait for the
   Reassemble; on Qwen3-30B-A3B B=64, 25 of the 34 deadlocks the default space used to simulate). The metrics
   row is evaluated at the workload's own FIFO depths, so its proof applies only to candidates that set no FIFO
   knob (or to every candidate under the ``paper`` convention, whose metrics rows keep them).
3. **Simulation in rounds** (``mode = "simulate"`` sweeps into ``OUT/runs``), in order of promise (lowest cycle
   bound first, then on-chip bytes, then allocated compute): before each round, a candidate whose *optimistic*
   vector (cycle bound, on-chip bytes, allocated compute) is dominated by a simulated point is dropped: its
   real cycles are at least its bound, so the same point dominates it, and it cannot enter the front. The next
   :data:`ROUND_SIZE` remaining candidates that no earlier one could prune (:func:`next_round`) are simulated in
   parallel on the sweep executors. The search stops when no candidate remains, so the front equals the front
   of simulating every candidate (exhaustive), point for point. The candidates simulated are those of
   simulating one at a time in promise order, whatever the round size and the worker count.

Both sweeps use the sweep runner (:func:`stepsim.batch.runner.run_sweep`), so a search stopped at any point
resumes when run again into the same folder: finished evaluations and simulations are read back, and the
search takes the same decisions, in the same order, without running them again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from stepsim.base.errors import ConfigError
from stepsim.optimize.pareto import dominates, pareto_front, roofline_lower_bound

#: candidates simulated per round at most (the parallelism; the candidates simulated do not depend on it)
ROUND_SIZE = 4
#: objectives of the recommendation: the lexicographic order of (cycles, on-chip bytes, allocated compute, chips)
OBJECTIVES = {"cycles": ("cycles", "on_chip_bytes", "allocated_flops_per_cycle", "chips"),
              "on-chip": ("on_chip_bytes", "cycles", "allocated_flops_per_cycle", "chips"),
              "compute": ("allocated_flops_per_cycle", "cycles", "on_chip_bytes", "chips"),
              "chips": ("chips", "cycles", "on_chip_bytes", "allocated_flops_per_cycle")}
#: knobs that change only the FIFO depths (not the symbolic metrics under the published accounting)
FIFO_KNOBS = ("channel_depth", "fifo_depths")
#: task keys that are not knobs of the candidate
TASK_ONLY = ("mode",)
#: record columns holding per-unit lower bounds on cycles (stepsim.analysis.bounds)
BOUND_COLUMNS = ("load_unit_cycles", "compute_unit_cycles", "hbm_request_cycles", "pipeline_cycles", "link_cycles")
#: sub-folders of the output folder
METRICS_DIR, RUNS_DIR = "metrics", "runs"


@dataclass
class Candidate:
    """One point of the space and what is known about it.

    Attributes
    ----------
    index : int
        Position in the space (grid order).
    config : dict
        The candidate's knobs (normalized, unset ones left out; ``workload`` included, ``mode`` not).
    run_id : str
        Run id of its simulation (:func:`stepsim.results.records.run_identity` with ``mode = "simulate"``).
    on_chip_bytes, off_chip_bytes, flops, allocated_flops_per_cycle, hbm_bytes_per_cycle : int
        Symbolic metrics (bytes, FLOPs in the engine's convention, FLOP/cycle, bytes/cycle).
    lower_bound : int
        Lower bound on cycles: the roofline over all the candidate's chips and the per-unit and link bounds.
    chips : int
        Chips the candidate runs on (:func:`stepsim.optimize.chips.chip_count`); 1 unless it is parallel.
    status : str
        ``invalid`` (the builder refused it), ``over-budget``, ``pruned`` (its bound is dominated),
        ``deadlock`` (proven without simulating), ``simulated`` (ok), ``failed`` (the simulation failed, e.g. a
        deadlock), ``pending``.
    cycles : int or None
        Simulated cycles.
    error : str or None
        First line of the error of an invalid or failed candidate, or the deadlock proof.
    """

    index: int
    config: dict
    run_id: str = ""
    on_chip_bytes: int | None = None
    off_chip_bytes: int | None = None
    flops: int | None = None
    allocated_flops_per_cycle: int | None = None
    hbm_bytes_per_cycle: int | None = None
    lower_bound: int | None = None
    chips: int = 1
    status: str = "pending"
    cycles: int | None = None
    error: str | None = None

    @property
    def optimistic(self) -> tuple[int, int, int, int]:
        """(cycle lower bound, on-chip bytes, allocated compute, chips): the best this candidate can be."""
        return (self.lower_bound, self.on_chip_bytes, self.allocated_flops_per_cycle, self.chips)

    @property
    def objectives(self) -> tuple[int, int, int, int]:
        """(cycles, on-chip bytes, allocated compute, chips) of a simulated candidate (on one chip, as in every
        search without ``--max-chips``, the fourth objective ties and the front is the three-objective one)."""
        return (self.cycles, self.on_chip_bytes, self.allocated_flops_per_cycle, self.chips)

    def point(self) -> dict:
        """The JSON form of a simulated candidate (the ``pareto`` entries): its knobs, objectives, and its
        parallel axes ``tp``, ``ep``, ``pp`` (chips each; 1 = the axis unused; their product is ``chips``) and a
        stack's ``micro_batches`` (1 when unset)."""
        from stepsim.optimize.stack import RECORDED_KNOBS

        return {"config": self.config, "cycles": self.cycles, "on_chip_bytes": self.on_chip_bytes,
                "allocated_flops_per_cycle": self.allocated_flops_per_cycle, "chips": self.chips,
                **{k: int(self.config.get(k) or 1) for k in RECORDED_KNOBS}}

    def label(self, axes) -> str:
        """``k=v`` of the searched knobs, for messages."""
        return " ".join(f"{k}={self.config[k]}" for k in axes if k in self.config) or "(fixed knobs only)"


@dataclass
class SearchState:
    """Everything the search decided (see :class:`stepsim.optimize.OptimizeResult` for the public view)."""

    candidates: list = field(default_factory=list)
    axes: list = field(default_factory=list)
    simulated_now: int = 0
    rounds: int = 0


def _first_line(message: str | None) -> str | None:
    return message.splitlines()[0] if message else message


def _spec(source: Path, workload: str, mode: str, fixed: dict, grids: list, force: bool = False):
    from stepsim.batch.config import DEFAULT_REPORT, SweepSpec

    return SweepSpec(source=source, workload=workload, mode=mode, out=None, fixed=fixed, grids=tuple(grids),
                     partition_by=("workload",), report=DEFAULT_REPORT[mode], max_tasks=None, force=force)


def _run_rows(spec, out: Path, runner, progress: bool, index=None) -> tuple[dict, int]:
    """Run (or resume) the sweep ``spec`` into ``out``: ``({run_id: (status, row or None, error)}, tasks run
    now)``; the rows of tasks finished earlier are read back. ``index``: the folder's
    :class:`~stepsim.batch.store.ResultIndex` kept from the previous round (only newer files are read)."""
    from stepsim.batch.grid import expand
    from stepsim.batch.runner import run_sweep

    rows: dict = {}

    def take(task, outcome):
        record = outcome["record"]
        rows[task.run_id] = (outcome["status"], record.row if record is not None else None,
                             _first_line(outcome["error_message"]))

    report = run_sweep(spec, out=out, executor=runner, progress=progress, on_outcome=take, yes=True, index=index)
    ran = len(rows)

    for task in expand(spec):
        if task.run_id in rows:
            continue
        row = report.row(task)
        status = report.status(task)
        if row is None or status is None:
            raise ConfigError(f"{out}: the result of task {task.key} could not be read back")
        rows[task.run_id] = (status, row, _first_line(row.get("error_message")))
    return rows, ran


def symbolic_key(config: dict, convention: str) -> tuple:
    """Candidates with one key share their symbolic metrics (FIFO depths aside, published accounting)."""
    drop = FIFO_KNOBS if convention == "published" else ()
    return tuple(sorted((k, str(v)) for k, v in config.items() if k not in drop and k not in TASK_ONLY))


def evaluate_space(base: dict, grids: list, *, out: Path, runner, source: Path, progress: bool) -> SearchState:
    """Expand the space into candidates and evaluate each one symbolically (a metrics sweep into
    ``out/metrics``, resumable). Invalid candidates (the builder refuses them) are marked, not raised."""
    from stepsim.batch.grid import expand
    from stepsim.optimize.chips import chip_count
    from stepsim.workloads.config import normalize_config

    workload = base["workload"]
    fixed = {k: v for k, v in base.items() if k != "workload"}
    sim_tasks = expand(_spec(source, workload, "simulate", fixed, grids))
    convention = normalize_config({**base, "mode": "metrics"})["convention"]
    metric_grids = [{k: v for k, v in g.items() if k not in FIFO_KNOBS} for g in grids] \
        if convention == "published" else grids
    metric_spec = _spec(source, workload, "metrics", fixed, metric_grids)
    metric_tasks = expand(metric_spec)
    rows, _ = _run_rows(metric_spec, out / METRICS_DIR, runner, progress)
    by_key = {symbolic_key(t.config, convention): rows[t.run_id] for t in metric_tasks}
    state = SearchState(axes=list(dict.fromkeys(k for g in grids for k in g)))
    for task in sim_tasks:
        config = {k: v for k, v in task.config.items() if k not in TASK_ONLY}
        cand = Candidate(index=task.index, config=config, run_id=task.run_id, chips=chip_count(config))
        status, row, error = by_key[symbolic_key(task.config, convention)]
        if status != "ok":
            cand.status, cand.error = "invalid", error
        else:
            cand.on_chip_bytes = int(row["on_chip_bytes"])
            cand.off_chip_bytes = int(row["off_chip_bytes"])
            cand.flops = int(row["graph_flops"])
            cand.allocated_flops_per_cycle = int(row["allocated_compute_flops_per_cycle"])
            cand.hbm_bytes_per_cycle = int(row["hbm_bytes_per_cycle"])
            # a row written before a bound column existed lacks it (a weaker bound, still valid); each chip has
            # its own HBM and the row's peak counts all of them, so the bytes roofline divides by every chip's
            # (the per-unit bounds are per chip)
            cand.lower_bound = max(roofline_lower_bound(cand.off_chip_bytes, cand.hbm_bytes_per_cycle, cand.flops,
                                                        cand.allocated_flops_per_cycle),
                                   *(int(row.get(k) or 0) for k in BOUND_COLUMNS))
            proof = row.get("deadlock_proof")
            if proof and (convention != "published" or not any(k in config for k in FIFO_KNOBS)):
                cand.status, cand.error = "deadlock", proof
        state.candidates.append(cand)
    return state


def apply_budgets(state: SearchState, max_on_chip: int | None, max_compute: int | None,
                  required: bool = True, max_chips: int | None = None) -> None:
    """Mark the candidates over a budget (on-chip bytes, allocated compute, chips); a ConfigError naming the
    smallest candidate when none fits and ``required`` (when not, such a state simply has nothing to
    simulate)."""
    valid = [c for c in state.candidates if c.status != "invalid"]
    if not valid:
        first = state.candidates[0] if state.candidates else None
        why = f": {first.label(state.axes)}: {first.error}" if first is not None else ""
        raise ConfigError(f"no candidate of the search space can be built{why}")

    def fits(c):
        return ((max_on_chip is None or c.on_chip_bytes <= max_on_chip)
                and (max_compute is None or c.allocated_flops_per_cycle <= max_compute)
                and (max_chips is None or c.chips <= max_chips))

    for c in valid:
        if not fits(c):
            c.status = "over-budget"
    if any(fits(c) for c in valid) or not required:
        return
    fewest = min(valid, key=lambda c: (c.chips, c.index))
    if max_chips is not None and fewest.chips > max_chips:
        raise ConfigError(f"--max-chips {max_chips}: no candidate fits; the fewest chips is {fewest.chips} "
                          f"({fewest.label(state.axes)})")
    valid = [c for c in valid if max_chips is None or c.chips <= max_chips]  # the other budgets, within it
    smallest_on = min(valid, key=lambda c: (c.on_chip_bytes, c.allocated_flops_per_cycle, c.index))
    smallest_comp = min(valid, key=lambda c: (c.allocated_flops_per_cycle, c.on_chip_bytes, c.index))
    if max_on_chip is not None and smallest_on.on_chip_bytes > max_on_chip:
        raise ConfigError(f"--max-on-chip {max_on_chip:,}: no candidate fits; the smallest on-chip footprint is "
                          f"{smallest_on.on_chip_bytes:,} bytes ({smallest_on.label(state.axes)})")
    if max_compute is not None and smallest_comp.allocated_flops_per_cycle > max_compute:
        raise ConfigError(f"--max-compute {max_compute:,}: no candidate fits; the smallest allocated compute is "
                          f"{smallest_comp.allocated_flops_per_cycle:,} FLOPs/cycle "
                          f"({smallest_comp.label(state.axes)})")
    within = min((c for c in valid if c.allocated_flops_per_cycle <= max_compute),
                 key=lambda c: (c.on_chip_bytes, c.index))
    raise ConfigError(f"--max-on-chip {max_on_chip:,} with --max-compute {max_compute:,}: no candidate fits both; "
                      f"the smallest on-chip footprint within --max-compute is {within.on_chip_bytes:,} bytes "
                      f"({within.label(state.axes)})")


def promise(c: Candidate) -> tuple:
    """Order of simulation: lowest cycle bound first (it sets the bar the others are pruned against)."""
    return (c.lower_bound, c.on_chip_bytes, c.allocated_flops_per_cycle, c.chips, c.index)


def next_round(remaining: list, round_size: int) -> list:
    """The first ``round_size`` of ``remaining`` (in promise order) that no candidate before them could prune.

    Candidate ``p`` can prune ``c`` only if ``p``'s optimistic vector dominates ``c``'s (its cycles are at
    least its bound). A candidate that no earlier one can prune is never pruned (a point that dominates it
    comes earlier in promise order, and the simulated ones were checked already), so simulating it now
    wastes nothing; a candidate that an earlier one might prune waits for that one's result. A round may
    therefore be shorter than ``round_size``. Every candidate is decided with all its possible pruners
    resolved, exactly as when simulating one at a time in promise order, so the candidates simulated (and
    their number) do not depend on ``round_size``: only the parallelism does.
    """
    batch = []
    for i, c in enumerate(remaining):
        if not any(dominates(p.optimistic, c.optimistic) for p in remaining[:i]):
            batch.append(c)
            if len(batch) == round_size:
                break
    return batch


def simulate_rounds(state: SearchState, base: dict, *, out: Path, runner, source: Path,
                    round_size: int = ROUND_SIZE, force: bool = False) -> None:
    """Simulate the promising candidates in rounds on ``runner``, pruning before each (module docstring);
    ``force``: simulate those the run-size estimate refuses (else each is a failed candidate naming it)."""
    from stepsim.batch.store import ResultIndex

    workload = base["workload"]
    index = ResultIndex(out / RUNS_DIR)  # kept across the rounds: each reads only the files written since

    def simulate(batch: list) -> None:
        grids = [{k: (v,) for k, v in c.config.items() if k != "workload"} for c in batch]
        rows, ran = _run_rows(_spec(source, workload, "simulate", {}, grids, force), out / RUNS_DIR, runner,
                              progress=False, index=index)
        state.simulated_now += ran
        for c in batch:
            status, row, error = rows[c.run_id]
            if status == "ok":
                c.status, c.cycles = "simulated", int(row["cycles"])
            else:
                c.status, c.error = "failed", error

    search_rounds(state, round_size, simulate)


def search_rounds(state: SearchState, round_size: int, simulate) -> None:
    """The pruning loop: ``simulate(batch)`` sets each candidate's status to ``simulated`` (with cycles) or
    ``failed``; pending candidates end ``pruned`` or simulated (module docstring)."""
    remaining = sorted((c for c in state.candidates if c.status == "pending"), key=promise)
    front: list = []
    while True:
        kept = []
        for c in remaining:
            if any(dominates(p.objectives, c.optimistic) for p in front):
                c.status = "pruned"
            else:
                kept.append(c)
        remaining = kept
        if not remaining:
            break
        batch = next_round(remaining, round_size)
        chosen = {id(c) for c in batch}
        remaining = [c for c in remaining if id(c) not in chosen]
        simulate(batch)
        state.rounds += 1
        simulated = [c for c in state.candidates if c.status == "simulated"]
        front = [simulated[i] for i in pareto_front([c.objectives for c in simulated])]


def front_of(state: SearchState) -> list:
    """The Pareto front of the simulated candidates, by cycles then on-chip bytes then compute then chips."""
    simulated = [c for c in state.candidates if c.status == "simulated"]
    front = [simulated[i] for i in pareto_front([c.objectives for c in simulated])]
    return sorted(front, key=lambda c: (*c.objectives, c.index))


def recommend(front: list, objective: str):
    """The front point best for ``objective`` (:data:`OBJECTIVES`: lexicographic), None on an empty front."""
    keys = OBJECTIVES[objective]
    if not front:
        return None
    return min(front, key=lambda c: (*(c.point()[k] for k in keys), c.index))

