"""``stepsim optimize``: find the Pareto front of a workload's schedules on a trace with few simulations.

>>> from stepsim import optimize                                              # doctest: +SKIP
>>> r = optimize("moe", model="qwen", trace="routing.npz", out="opt", jobs=2)  # doctest: +SKIP
>>> r.recommended.config, r.recommended.cycles, r.simulations                 # doctest: +SKIP

The pieces, one purpose each: :mod:`~stepsim.optimize.space` (the documented default search spaces and the
``--space`` TOML override), :mod:`~stepsim.optimize.pareto` (dominance, the roofline lower bound),
:mod:`~stepsim.optimize.search` (symbolic evaluation, budgets, pruning, simulation rounds),
:mod:`~stepsim.optimize.chips` (the parallel axes under a chip budget, ``--max-chips``),
:mod:`~stepsim.optimize.output` (Parquet, PNG, JSON, the ``stepsim run`` command line) and
:mod:`~stepsim.cli.optimize` (the subcommand).
"""

from __future__ import annotations

import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

from stepsim.base.errors import ConfigError
from stepsim.base.system.config import MAX_CHIPS

__all__ = ["OptimizeResult", "optimize"]

#: workloads whose default space gains their declared parallel axes under ``--max-chips`` (the decoder's in its
#: FFN stage)
CHIP_SEARCH_WORKLOADS = ("moe", "decoder")


@dataclass
class OptimizeResult:
    """What :func:`optimize` found.

    Attributes
    ----------
    workload, objective : str
        The workload kind and the objective of the recommendation.
    out : Path
        Output folder.
    front : list of Candidate
        The Pareto front over (cycles, on-chip bytes, allocated compute, chips), by cycles (chips: 1 for every
        candidate unless ``max_chips`` searched several).
    recommended : Candidate or None
        The front point best for ``objective``.
    candidate_list : list of Candidate
        Every candidate of the space, with its status.
    axes : list of str
        The searched knobs.
    budgets : dict
        ``max_on_chip`` (bytes), ``max_compute`` (FLOPs/cycle) and ``max_chips`` (chips), None when not set.
    simulated_now, rounds : int
        Simulations run by this call (the rest were read back from ``out``), simulation rounds.
    wall_s : float
        Wall time (seconds).
    files : dict
        Files written (``pareto``, ``candidates``, ``plot``, ``json``).
    plot_skipped : str or None
        Why ``pareto.png`` was not drawn (no candidate completed), None when it was.
    stages : list of dict
        The stages searched, in order: ``stage`` (name), ``candidates``, and for a stage that chooses for the
        next one, ``kept_strategies`` (the decoder's attention strategies on its front).
    """

    workload: str
    objective: str
    out: Path
    front: list
    recommended: object
    candidate_list: list
    axes: list
    budgets: dict
    simulated_now: int = 0
    rounds: int = 0
    wall_s: float = 0.0
    files: dict = field(default_factory=dict)
    plot_skipped: str | None = None
    stages: list = field(default_factory=list)

    def _count(self, *statuses) -> int:
        return sum(c.status in statuses for c in self.candidate_list)

    @property
    def candidates(self) -> int:
        """Size of the search space (distinct candidates)."""
        return len(self.candidate_list)

    @property
    def pruned_symbolically(self) -> int:
        """Candidates dropped without simulating: over a budget, with a dominated cycle bound, or proven to
        deadlock."""
        return self._count("over-budget", "pruned", "deadlock")

    @property
    def simulations(self) -> int:
        """Candidates the search simulated (ok or failed), including those read back when resuming."""
        return self._count("simulated", "failed")

    @property
    def command(self) -> str | None:
        """``stepsim run`` command line of the recommended configuration."""
        from stepsim.optimize.output import run_command

        return run_command(self.recommended.config) if self.recommended is not None else None

    def per_chips(self) -> dict:
        """``{chips: point}``: the fastest simulated candidate on each chip count (ties: on-chip bytes, compute,
        index), in chip order; what one more chip buys."""
        best: dict = {}
        for c in self.candidate_list:
            if c.status == "simulated":
                key = (c.cycles, c.on_chip_bytes, c.allocated_flops_per_cycle, c.index)
                if c.chips not in best or key < best[c.chips][0]:
                    best[c.chips] = (key, c)
        return {n: best[n][1].point() for n in sorted(best)}

    def to_json(self) -> dict:
        """The ``--json`` object: ``pareto``, ``recommended``, ``candidates``, ``pruned_symbolically``,
        ``simulations``, and details (budgets, objective, invalid / failed counts, files, ``per_chips``: the
        fastest point on each chip count, keyed by the count as a string)."""
        rec = None
        if self.recommended is not None:
            rec = {**self.recommended.point(), "command": self.command}
        return {"workload": self.workload, "objective": self.objective, **self.budgets,
                "pareto": [c.point() for c in self.front], "recommended": rec, "candidates": self.candidates,
                "pruned_symbolically": self.pruned_symbolically, "simulations": self.simulations,
                "per_chips": {str(n): p for n, p in self.per_chips().items()},
                "pruned_by_budget": self._count("over-budget"), "pruned_by_bound": self._count("pruned"),
                "proven_deadlocks": self._count("deadlock"),
                "invalid": self._count("invalid"), "failed_simulations": self._count("failed"),
                "simulations_run_now": self.simulated_now, "rounds": self.rounds, "stages": self.stages,
                "out": str(self.out), "plot_skipped": self.plot_skipped,
                "files": {k: str(v) for k, v in self.files.items()}}


def _positive(name: str, value) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def _absolute(config: dict) -> dict:
    """File-valued knobs as absolute POSIX paths (workers may run in another folder)."""
    from stepsim.batch.config import _is_path_value

    return {k: (Path(v).resolve().as_posix() if _is_path_value(k, v) else v) for k, v in config.items()}


def _default_stages(cfg: dict, max_chips: int | None = None, system=None) -> list[tuple[str, list]]:
    """The default space of the normalized base config ``cfg`` as ``[(stage name, grids)]``
    (:mod:`stepsim.optimize.space`): one stage for the MoE and attention layers, two for the decoder; with
    ``max_chips``, the MoE space and the decoder's FFN stage gain the kind's parallel axes
    (:mod:`stepsim.optimize.chips`)."""
    from stepsim.optimize import space
    from stepsim.trace_io.load import load_kv_lengths
    from stepsim.workloads.config import CUSTOM_MODEL_KEYS, resolved_trace

    if cfg["workload"] == "moe":
        from stepsim.models.presets import moe_model
        from stepsim.trace_io.load import load_routing

        model = moe_model(cfg["model"], **{k: cfg[k] for k in CUSTOM_MODEL_KEYS})
        routing = load_routing(resolved_trace(cfg), model.experts, iteration=cfg["iteration"], layer=cfg["layer"])
        grids = space.default_moe_grids(model.experts, model.intermediate, int(routing.shape[0]))
        if max_chips is not None:
            from stepsim.optimize.chips import parallel_grids
            from stepsim.workloads.kinds import kind

            grids = parallel_grids(grids, max_chips, axes=kind("moe").parallel, experts=model.experts,
                                   widths=(model.intermediate, model.shared_intermediate),
                                   batch=int(routing.shape[0]), layers=cfg.get("layers") or 1, system=system,
                                   stack_ep=True)
        if cfg.get("micro_batches") is None:  # a stack's space: no regions, its micro-batch count (one layer: as is)
            from stepsim.optimize.stack import stack_space

            grids = stack_space(grids, workload="moe", batch=int(routing.shape[0]), layers=cfg.get("layers") or 1,
                                shared=model.shared_intermediate)
        return [("space", grids)]
    if cfg["workload"] == "decoder":
        from stepsim.models.presets import resolve_model

        if cfg.get("kv_lengths") is None:
            raise ConfigError("stepsim optimize decoder needs the KV lengths of its decode batch: --kv-lengths PATH")
        batch = len(load_kv_lengths(cfg["kv_lengths"], cfg["batch_id"]))
        model = resolve_model(cfg["model"])
        model.refuse_unmodelled("the decoder workload")
        stages = space.default_decoder_stages(model, batch)
        if max_chips is not None:  # tp, ep in the FFN stage, with the strategies the one-chip stage 1 keeps
            from stepsim.optimize.chips import parallel_grids
            from stepsim.workloads.kinds import kind

            widths = (model.moe.intermediate, model.moe.shared_intermediate) if model.is_moe \
                else (model.dense_intermediate,)
            name, ffn = stages[-1]
            stages[-1] = (name, parallel_grids(ffn, max_chips, axes=kind("decoder").parallel,
                                               experts=model.experts if model.is_moe else 1, widths=widths,
                                               batch=batch, heads=cfg.get("kv_heads") or model.kv_heads,
                                               layers=cfg.get("layers") or 1, system=system,
                                               stack_ep=model.is_moe))  # decoder/many_chips.py's expert_parallel_decoder
        if cfg.get("micro_batches") is None:  # a stack's FFN space: no regions, its micro-batch count
            from stepsim.optimize.stack import stack_space

            name, ffn = stages[-1]
            shared = model.moe.shared_intermediate if model.is_moe else 0  # with ep (optimize/stack.py)
            stages[-1] = (name, stack_space(ffn, workload="decoder", batch=batch, layers=cfg.get("layers") or 1,
                                            shared=shared))
        return stages
    return [("space", space.default_attention_grids(len(load_kv_lengths(resolved_trace(cfg), cfg["batch_id"]))))]


def _merged(states: list):
    """One search state of the stages' candidates (a candidate a later stage repeats is kept once, as the
    earlier stage decided it) and their counts."""
    from stepsim.optimize.search import SearchState

    merged, seen = SearchState(), set()
    for state in states:
        merged.candidates += [c for c in state.candidates if c.run_id not in seen]
        seen.update(c.run_id for c in state.candidates)
        merged.axes += [a for a in state.axes if a not in merged.axes]
        merged.simulated_now += state.simulated_now
        merged.rounds += state.rounds
    return merged


def optimize(workload: str, *, out, objective: str = "cycles", max_on_chip: int | None = None,
             max_compute: int | None = None, max_chips: int | None = None, space=None, jobs: int | None = None,
             executor="local", address: str | None = None, round_size: int | None = None, progress: bool = False,
             force: bool = False, **knobs) -> OptimizeResult:
    """Search the schedules of ``workload`` on a trace for the Pareto front (module docstring of
    :mod:`stepsim.optimize.search` for the method) and write it into ``out``.

    Parameters
    ----------
    workload : str
        ``moe``, ``attention`` or ``decoder`` (searched stage by stage: :mod:`stepsim.optimize.space`).
    out : str or Path
        Output folder (created; a search into a folder that holds an earlier one resumes it).
    objective : str
        ``cycles`` (default), ``on-chip``, ``compute`` or ``chips``: what the recommendation minimizes first.
    max_on_chip : int, optional
        On-chip budget (bytes); candidates over it are dropped.
    max_compute : int, optional
        Allocated-compute budget (FLOPs/cycle).
    max_chips : int, optional
        Chip-count budget: search the parallel axes (tensor and expert parallelism and the placement, and
        pipeline parallelism for a kind that declares it, on the ``system`` knob's chips scaled to each count)
        up to this many chips in all (the decoder: ``tp`` or ``ep`` in its FFN stage), and add the chip count to the front's
        objectives (:mod:`stepsim.optimize.chips`); candidates on more chips are over budget.
    space : str, Path or list of dict, optional
        A space file (:mod:`stepsim.optimize.space`) or grids ``[{knob: values}]``; default: the documented
        default space of the workload.
    jobs : int, optional
        Worker processes (default: the CPUs available).
    executor : str or executor object
        ``local`` or ``dask`` (or an executor object, used as is and not closed).
    address : str, optional
        Dask scheduler address.
    round_size : int, optional
        Candidates simulated per round (default :data:`stepsim.optimize.search.ROUND_SIZE`).
    progress : bool
        Progress bar of the symbolic evaluation on stderr.
    force : bool
        Simulate the candidates the run-size estimate refuses (:mod:`stepsim.kernels.run_size`); without it
        each is a failed candidate whose reason names the estimate.
    **knobs
        The fixed knobs of the run (``model``, ``trace``, ``hardware``, ``compute_bw``, ...: the keys of
        :data:`stepsim.workloads.config.KNOBS`).

    Returns
    -------
    OptimizeResult

    Raises
    ------
    ConfigError
        Bad workload, objective, budget, knob or space; no candidate within the budgets (the message names the
        smallest candidate).
    """
    from stepsim.batch.executor_factory import make_executor
    from stepsim.batch.executors import check_jobs, default_jobs
    from stepsim.optimize import search
    from stepsim.optimize.output import write_outputs
    from stepsim.optimize.space import OPTIMIZE_WORKLOADS, grid_size, load_space
    from stepsim.workloads.config import COMMAND_LINE, normalize_config

    start = time.perf_counter()
    if workload not in OPTIMIZE_WORKLOADS:
        raise ConfigError(f"stepsim optimize searches {', '.join(OPTIMIZE_WORKLOADS)}, not {workload!r}")
    if objective not in search.OBJECTIVES:
        raise ConfigError(f"--objective must be one of {', '.join(search.OBJECTIVES)}, got {objective!r}")
    max_on_chip = _positive("--max-on-chip", max_on_chip)
    max_compute = _positive("--max-compute", max_compute)
    max_chips = _positive("--max-chips", max_chips)
    if max_chips is not None and max_chips > MAX_CHIPS:  # the search enumerates every count up to it
        raise ConfigError(f"--max-chips must be at most {MAX_CHIPS:,} (the most chips a system may have), got "
                          f"{max_chips:,}")
    if max_chips is not None and workload not in CHIP_SEARCH_WORKLOADS:
        raise ConfigError(f"--max-chips searches the parallel axes (tp, ep, pp), which stepsim optimize builds for "
                          f"the MoE and decoder layers only, not {workload!r}")
    round_size = _positive("round_size", round_size) or search.ROUND_SIZE
    if jobs is not None:
        check_jobs(jobs)
    if "mode" in knobs:
        raise ConfigError("stepsim optimize sets the mode itself (metrics, then simulate); leave 'mode' out")
    base = _absolute({"workload": workload, **{k: v for k, v in knobs.items() if v is not None}})
    system = None
    if max_chips is not None and base.get("system") is not None:  # each candidate gets the system at its count
        from stepsim.base.errors import SystemConfigError
        from stepsim.base.system import System

        if base.get("hardware") is not None:
            raise ConfigError("--hardware does not apply with --system: the system file names the chips' hardware")
        system_spec = base.pop("system")
        try:
            system = System.load(system_spec)
        except SystemConfigError as exc:
            raise ConfigError(f"--system: {exc}") from None
    cfg = normalize_config({**base, "mode": "metrics"}, source=COMMAND_LINE)
    if space is None:
        stages, source = _default_stages(cfg, max_chips, system), Path(out) / "default-space"
    elif isinstance(space, (str, Path)):
        stages, source = [("space", load_space(space, workload))], Path(space)
    else:
        stages, source = [("space", [dict(g) for g in space])], Path(out) / "space"
    for _, grids in stages:
        if not grids or grid_size(grids) == 0:
            raise ConfigError("the search space is empty")
        for grid in grids:
            both = [k for k in grid if k in base and k != "workload"]
            if both:
                raise ConfigError(f"knob {both[0]!r} is both fixed (--{both[0].replace('_', '-')}) and an axis of "
                                  f"the search space; leave one")
    from stepsim.base.outputs import check_out_dir

    out = check_out_dir(out)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    if system is not None:
        from stepsim.optimize.chips import on_system

        stages = [(name, on_system(grids, system, system_spec, out)) for name, grids in stages]
    elif max_chips is not None:
        from stepsim.optimize.chips import default_pipeline_systems

        stages = [(name, default_pipeline_systems(grids, out)) for name, grids in stages]
    owned = isinstance(executor, str)
    runner = make_executor(executor, jobs=jobs or default_jobs(), warm_kernels=True, address=address) \
        if owned else executor
    ok = False
    states, summary, kept = [], [], None
    try:
        for number, (name, grids) in enumerate(stages, 1):
            last = number == len(stages)
            if kept:  # the decoder's FFN stage: with every attention strategy stage 1 kept
                grids = [{"strategy": kept, **g} for g in grids]
            state = search.evaluate_space(base, grids, out=out, runner=runner, source=source, progress=progress)
            # an earlier stage only chooses what the next one keeps: a budget that rules out all of it keeps all
            search.apply_budgets(state, max_on_chip, max_compute, required=last, max_chips=max_chips)
            search.simulate_rounds(state, base, out=out, runner=runner, source=source, round_size=round_size,
                                   force=force)
            states.append(state)
            summary.append({"stage": name, "candidates": len(state.candidates)})
            if not last:
                strategies = [c.config["strategy"] for c in search.front_of(state)] \
                    or [c.config["strategy"] for c in state.candidates]
                kept = tuple(dict.fromkeys(strategies))
                summary[-1]["kept_strategies"] = list(kept)
        ok = True
    except ConfigError:  # a space file's value refused as its first task is checked: leave no empty search folder
        if created and not any(out.iterdir()):
            out.rmdir()
        raise
    finally:
        if owned:
            runner.close() if ok else runner.abort()
    state = _merged(states)
    front = search.front_of(state)
    result = OptimizeResult(workload=workload, objective=objective, out=out, front=front,
                            recommended=search.recommend(front, objective), candidate_list=state.candidates,
                            axes=state.axes,
                            budgets={"max_on_chip": max_on_chip, "max_compute": max_compute, "max_chips": max_chips},
                            simulated_now=state.simulated_now, rounds=state.rounds, stages=summary)
    result.files = write_outputs(out, result)
    result.wall_s = time.perf_counter() - start
    return result



class _CallableModule(types.ModuleType):
    """``stepsim.optimize(...)`` is :func:`optimize`: the package and the function share the name."""

    def __call__(self, *args, **kwargs) -> OptimizeResult:
        return optimize(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
