"""Serving sweeps: ``stepsim sweep SWEEP.toml`` with ``workload = "serve"`` runs :func:`stepsim.serve` over a grid
of serving knobs (arrival rate, hardware, scheduler, batch limits ...), in parallel on local workers or Dask,
resumably (docs/serving.md §11).

A serving sweep file::

    workload = "serve"
    out = "serve-sweep"                  # output folder; stepsim sweep --out overrides it

    [fixed]                              # keyword arguments of stepsim.serve shared by every task
    model = "qwen3-30b-a3b"
    requests = "../shared/traces/azure/AzureLLMInferenceTrace_conv.csv"   # relative to the sweep file
    limit_requests = 2000
    iteration_latency = 0.02
    slo = "ttft=2s,tpot=200ms"

    [axes]                               # the grid: the cartesian product, last axis fastest
    arrival = ["poisson:2", "poisson:4"]
    scheduler = ["vllm", "sarathi"]
    max_seqs = [64, 128]

Keys (:data:`KNOBS`) are ``stepsim serve``'s flags with ``_`` for ``-`` (``max_seqs``, ``max_batch_tokens``,
``iteration_latency`` ...; ``drop_long`` / ``truncate_long`` true or false) plus ``hbm_bytes`` and ``block_size``; axes are lists or ranges as in a workload
sweep (:mod:`stepsim.batch.config`). A task runs its layers in its own process (no ``jobs`` / ``executor``
inside a task: the sweep's workers are the parallelism).

Identity: a task's ``run_id`` is the SHA-256 of the stepsim version and every knob of the task, with each file
(requests, a routing dump, a model config ``.json``, a hardware ``.toml``) replaced by the SHA-256 of its
content, so moving a file keeps the id and editing it changes it. Defaults are filled in first
(:func:`with_defaults`: the values :func:`stepsim.serve` would use, read from its signature and the scheduler's
per-policy defaults), so a knob left out and the same knob spelled with its default value are one id (a re-run
reuses the row), and a changed default changes the id of every task that relied on it.

Outputs in ``out``: one ``part-<run_id[:16]>.parquet`` per task (written atomically by the parent; workers write
nothing), holding one row: ``run_id``, ``status`` (``ok`` / ``failed``), ``error_type``, ``error_message``,
``task_wall_s``, ``config`` (the task's knobs, canonical JSON) and, for an ok task, the serve record
(:func:`stepsim.results.serve_record.serve_row`: ``ttft_s.p50``, ``ttft_s.p99``, ``tpot_s.p99``,
``throughput_tokens_per_s``, ``goodput_requests_per_s``, ``slo_attainment`` ...). A re-run skips the tasks
that have a row (failed ones too, unless ``retry_failed``) and first deletes the rows of its own tasks written
under another run id (the same knobs, but a file's content or stepsim's version changed), so the folder never
holds two generations of a task; rows of other grids' tasks are left alone. :func:`read_serve_sweep` reads the folder back;
``stepsim compare`` compares two such folders configuration by configuration.
"""

from __future__ import annotations

import json
import math
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from stepsim.base.errors import ConfigError, StepsimError
from stepsim.base.files import refuse_special_file

#: what marks a sweep file as a serving sweep
SERVE_WORKLOAD = "serve"
#: keys of [fixed] / [axes]: keyword arguments of stepsim.serve
KNOBS = ("model", "requests", "arrival_scale", "arrival", "limit_requests", "duration", "hardware", "scheduler",
         "max_seqs", "max_batch_tokens", "chunk_tokens", "routing", "fidelity", "slo", "seed",
         "iteration_latency", "hbm_bytes", "block_size", "drop_long", "truncate_long", "schedule")
#: top-level keys of a serving sweep file
TOP_LEVEL_KEYS = ("workload", "out", "fixed", "axes", "max_tasks")
#: knobs every task needs
REQUIRED = ("model", "requests")
#: knobs whose value may be a file (hashed by content in the run id)
FILE_KNOBS = ("requests", "routing", "model", "hardware")
#: grids larger than this need ``yes`` (``--yes``) or a larger ``max_tasks``
DEFAULT_MAX_TASKS = 10_000
#: columns of the end-of-sweep table, after the swept knobs
#: (row column, header, scale, format)
REPORT = (("ttft_s.p50", "TTFT p50 ms", 1e3, ",.1f"), ("ttft_s.p99", "TTFT p99 ms", 1e3, ",.1f"),
          ("tpot_s.p50", "TPOT p50 ms", 1e3, ",.1f"), ("tpot_s.p99", "TPOT p99 ms", 1e3, ",.1f"),
          ("throughput_tokens_per_s", "tokens/s", 1.0, ",.1f"), ("goodput_requests_per_s", "goodput req/s", 1.0, ".3f"))


@dataclass(frozen=True)
class ServeSweepSpec:
    """A checked serving sweep file: ``source``, ``out`` (absolute or None), ``fixed`` knobs, ``grids`` (one
    ``{knob: values}`` per ``[axes]`` table), ``max_tasks``."""

    source: Path
    out: Path | None
    fixed: dict
    grids: tuple
    max_tasks: int | None = None

    @property
    def points(self) -> int:
        """Grid points (the sum over grids of the product of their axis lengths)."""
        from stepsim.batch.config import grid_points

        return grid_points(self.grids)

    @property
    def axes(self) -> list:
        """Every swept knob, in file order."""
        return list(dict.fromkeys(k for grid in self.grids for k in grid))


def read_toml(path: str | Path) -> dict:
    """The parsed sweep file (one-line ConfigErrors for a missing or non-TOML file)."""
    path = Path(path)
    refuse_special_file(path, ConfigError, "a sweep")
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"sweep file not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read sweep file {path}: {exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc


def is_serve_sweep(data: dict) -> bool:
    """Whether the parsed sweep file is a serving sweep (``workload = "serve"``)."""
    return data.get("workload") == SERVE_WORKLOAD


def parse_serve_sweep(data: dict, *, source: str | Path) -> ServeSweepSpec:
    """Check a parsed serving sweep file (module docstring); every problem is one line naming the file and key."""
    from stepsim.batch.config import check_keys, parse_grid

    source = Path(source)
    check_keys(data, TOP_LEVEL_KEYS, source)
    out = data.get("out")
    if out is not None and not (isinstance(out, str) and out):
        raise ConfigError(f"{source}: out must be a folder path (a non-empty string), got {out!r}")
    max_tasks = data.get("max_tasks")
    if max_tasks is not None and (isinstance(max_tasks, bool) or not isinstance(max_tasks, int) or max_tasks < 1):
        raise ConfigError(f"{source}: max_tasks must be an int >= 1, got {max_tasks!r}")
    fixed, grids = parse_grid(data, KNOBS, source)
    for key in REQUIRED:
        if key not in fixed and not all(key in grid for grid in grids):
            raise ConfigError(f"{source}: {key!r} is needed in [fixed] or in every [axes] table")
    base = source.resolve().parent
    return ServeSweepSpec(source=source, out=(base / out) if out else None, fixed=fixed, grids=tuple(grids),
                          max_tasks=max_tasks)


def load_serve_sweep(path: str | Path) -> ServeSweepSpec:
    """Read and check the serving sweep file at ``path``."""
    return parse_serve_sweep(read_toml(path), source=path)


#: knob value types (checked for every task before anything runs)
_INTS = ("limit_requests", "max_seqs", "max_batch_tokens", "chunk_tokens", "seed", "hbm_bytes", "block_size")
_NUMBERS = ("arrival_scale", "duration", "iteration_latency")
_BOOLS = ("drop_long", "truncate_long")
_CHOICES = {"scheduler": ("vllm", "sarathi", "orca"), "fidelity": ("exact", "fast")}


def check_task(config: dict, where: str) -> None:
    """One line naming ``where`` (the file and the task) and the knob for a value of the wrong type or not finite,
    an unknown scheduler or fidelity, an SLO or arrival string that does not parse, and whatever else
    :func:`stepsim.serve.api.check_arguments` refuses without a run (a value out of range, knobs that exclude each
    other, an unknown model or hardware); what only the run can refuse (the trace's rows, weights against HBM)
    is a failed row."""
    from stepsim.serve.api import _poisson_rate, check_arguments
    from stepsim.serve.metrics import parse_slo

    for key, value in config.items():
        if key in _INTS:
            ok = isinstance(value, int) and not isinstance(value, bool)
            kind = "an integer"
        elif key in _NUMBERS:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            kind = "a number"
        elif key in _BOOLS:
            ok, kind = isinstance(value, bool), "true or false"
        else:
            ok, kind = isinstance(value, str), "a string"
        if not ok:
            raise ConfigError(f"{where}: {key} must be {kind}, got {value!r}")
        if key in _NUMBERS and not math.isfinite(value):  # TOML has nan and inf
            raise ConfigError(f"{where}: {key} must be a finite number, got {value!r}")
        if key in _CHOICES and value not in _CHOICES[key]:
            raise ConfigError(f"{where}: {key} must be one of {', '.join(_CHOICES[key])}, got {value!r}")
    try:
        if "slo" in config:
            parse_slo(config["slo"])
        if "arrival" in config:
            _poisson_rate(config["arrival"])
        # everything else serve checks without a run (ranges, combinations, the model and hardware names): a
        # task it would refuse is refused here, before any runs, not a failed row
        check_arguments(**config)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _is_file(key: str, value) -> bool:
    if key not in FILE_KNOBS or not isinstance(value, str):
        return False
    if key == "routing":
        return value != "synthetic"
    if key == "model":
        return value.lower().endswith(".json")
    if key == "hardware":
        return value.endswith(".toml")
    return True


def with_defaults(config: dict) -> dict:
    """``config`` with every knob :func:`stepsim.serve` defaults filled in with the value it would use: ``scheduler``,
    ``seed`` and ``block_size`` from its signature, ``hardware`` (``DEFAULT_HARDWARE``), the policy's
    ``max_seqs`` / ``max_batch_tokens`` / ``chunk_tokens`` (:meth:`SchedulerConfig.make`; only the knobs the policy
    has), and ``routing = "synthetic"`` for an engine-backed run of an MoE model. Read from the live code, so a changed
    default changes the ids of the tasks that relied on it. Knobs the run will refuse are left as given (the task
    fails with the run's own message)."""
    import inspect

    from stepsim.serve.api import DEFAULT_HARDWARE, serve
    from stepsim.serve.scheduler import SchedulerConfig

    params = inspect.signature(serve).parameters
    out = {key: params[key].default for key in ("scheduler", "seed", "block_size")}
    out["hardware"] = DEFAULT_HARDWARE
    out.update(config)
    for key in ("drop_long", "truncate_long"):  # false is the default spelled out: one id whether given or not
        if out.get(key) is False:
            del out[key]
    try:
        policy = SchedulerConfig.make(out["scheduler"], max_num_seqs=config.get("max_seqs"),
                                      max_num_batched_tokens=config.get("max_batch_tokens"),
                                      chunk_tokens=config.get("chunk_tokens"), block_size=out["block_size"])
    except (StepsimError, TypeError):  # the run refuses these knobs: a failed row, whatever its id
        return out
    out["max_seqs"] = policy.max_num_seqs
    if policy.max_num_batched_tokens is not None:  # vLLM's budget; the others refuse the knob
        out["max_batch_tokens"] = policy.max_num_batched_tokens
    if policy.policy != "orca":  # orca refuses --chunk-tokens
        out["chunk_tokens"] = policy.chunk_tokens
    if out.get("fidelity") is not None and "routing" not in config and _is_moe(config.get("model")):
        out["routing"] = "synthetic"
    if out.get("fidelity") is not None and out.get("schedule") is None:  # paper or mapped layers: another result
        schedule = _default_schedule(out)
        if schedule is not None:
            out["schedule"] = schedule
    return out


def _default_schedule(config: dict) -> str | None:
    """The schedule :func:`stepsim.serve` would build an engine-backed task's layers with when it gives none
    (:func:`stepsim.serve.api.default_schedule`; None when the hardware does not resolve: the run refuses it)."""
    from stepsim.serve.api import default_schedule, resolve_serving_hardware

    try:
        return default_schedule(resolve_serving_hardware(config["hardware"]), config["fidelity"])
    except (StepsimError, TypeError, OSError, ValueError):
        return None


def _is_moe(model) -> bool:
    """Whether ``model`` resolves to an MoE model (False when it does not resolve: the run refuses it)."""
    from stepsim.models.presets import resolve_model

    try:
        return bool(resolve_model(model).is_moe)
    except (StepsimError, OSError, TypeError, ValueError):
        return False


def run_identity(config: dict, *, source: Path) -> str:
    """The task's ``run_id`` (module docstring): of its knobs with the defaults filled in (:func:`with_defaults`);
    a ConfigError naming the knob when a file cannot be read."""
    from stepsim._version import __version__
    from stepsim.base.files import file_sha256, stable_hash

    ident = {}
    for key, value in sorted(with_defaults(config).items()):
        if _is_file(key, value):
            try:
                value = {"sha256": file_sha256(value)}
            except OSError as exc:
                raise ConfigError(f"{source}: {key} {value}: cannot read ({exc.strerror or exc})") from None
        ident[key] = value
    return stable_hash({"stepsim": __version__, "serve": ident})


def iter_tasks(spec: ServeSweepSpec):
    """The tasks (:class:`stepsim.batch.grid.Task`) in grid order; a task two grids produce is kept once."""
    import itertools

    from stepsim.batch.grid import KEY_DIGITS, Task, short_value

    seen, index = set(), 0
    for grid in spec.grids:
        names = list(grid)
        for values in itertools.product(*(grid[n] for n in names)):
            point = dict(zip(names, values))
            config = {**spec.fixed, **point}
            label = " ".join(f"{k}={short_value(v)}" for k, v in point.items())
            check_task(config, f"{spec.source} (task {label})" if label else str(spec.source))
            run_id = run_identity(config, source=spec.source)
            if run_id[:KEY_DIGITS] in seen:
                continue
            seen.add(run_id[:KEY_DIGITS])
            yield Task(index=index, config=config, run_id=run_id)
            index += 1


def serve_task(config: dict, force: bool = False) -> dict:
    """What a worker runs for one task: :func:`stepsim.serve` with the task's knobs, its record row or the
    error (a StepsimError, or any other exception with its traceback, is a failed outcome, never raised).
    ``force`` is the executors' second argument (the workload sweeps' run-size ``--force``); a serving sweep
    refuses ``--force`` (stepsim.cli.sweep), so it is always False here."""
    import traceback

    from stepsim.base.files import file_sha256
    from stepsim.results.serve_record import serve_row
    from stepsim.serve.api import serve

    start = time.perf_counter()
    row = error_type = error_message = error_traceback = None
    try:
        result = serve(**config)
        knobs = {k: config.get(k) for k in ("arrival", "arrival_scale", "limit_requests", "duration",
                                            "iteration_latency", "routing", "hbm_bytes")}
        knobs["long_requests"] = "drop" if config.get("drop_long") else "truncate" if config.get("truncate_long") \
            else None
        row = serve_row(result.summary, requests=config["requests"], requests_sha256=file_sha256(config["requests"]),
                        seed=config.get("seed", 0), knobs=knobs)
    except StepsimError as exc:
        error_type, error_message = type(exc).__name__, str(exc)
    except Exception as exc:  # noqa: BLE001 - one bad grid point must not cost the rest of the sweep
        error_type, error_message, error_traceback = type(exc).__name__, str(exc), traceback.format_exc()
    return {"status": "ok" if row is not None else "failed", "error_type": error_type,
            "error_message": error_message, "error_traceback": error_traceback,
            "wall_s": time.perf_counter() - start, "row": row}


def part_file(out: Path, task) -> Path:
    """Where the row of ``task`` is written."""
    return Path(out) / f"part-{task.key}.parquet"


def row_table(task, outcome: dict) -> pa.Table:
    """The one-row table of a task's outcome (module docstring)."""
    from stepsim.base.files import canonical_json

    row = {"run_id": task.run_id, "status": outcome["status"], "error_type": outcome["error_type"],
           "error_message": outcome["error_message"], "error_traceback": outcome["error_traceback"],
           "task_wall_s": outcome["wall_s"], "config": canonical_json(task.config)}
    row.update(outcome["row"] or {"record": "serve"})
    return pa.Table.from_pylist([row])


def read_serve_sweep(out: str | Path) -> pa.Table:
    """Every row of a serving sweep's folder (ok and failed), in run-id order."""
    import pyarrow.parquet as pq

    files = sorted(Path(out).glob("part-*.parquet"))
    if not files:
        raise ConfigError(f"{out}: no serving sweep rows (part-*.parquet) found")
    table = pa.concat_tables([pq.read_table(f) for f in files], promote_options="default")
    return table.sort_by("run_id")


@dataclass
class ServeSweepReport:
    """What a serving sweep did: ``total`` tasks, ``ran`` / ``skipped`` (had a row) / ``failed`` task keys,
    the rows of the grid in order (``rows``: ``(task, row dict or None)``), ``executor``, ``wall_s``, and
    ``superseded``: rows of older generations of the grid's tasks removed."""

    out: Path
    total: int = 0
    ran: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    failed: list = field(default_factory=list)
    rows: list = field(default_factory=list)
    executor: str = ""
    wall_s: float = 0.0
    superseded: int = 0


def run_serve_sweep(spec: ServeSweepSpec, *, out=None, executor="local", jobs: int | None = None,
                    address: str | None = None, retry_failed: bool = False, yes: bool = False,
                    progress: bool = False) -> ServeSweepReport:
    """Run every task of ``spec`` without a row in ``out`` (default: the file's ``out``) on ``executor``
    (``local``, ``dask``, or an executor object, used as is and not closed); write each row as it arrives.
    Holds the folder's sweep lock (:func:`stepsim.batch.runner.exclusive`); ``progress`` shows a bar on stderr."""
    from stepsim.batch.executors import check_jobs
    from stepsim.batch.runner import exclusive

    start = time.perf_counter()
    out = Path(out) if out is not None else spec.out
    if out is None:
        raise ConfigError(f"{spec.source}: no output folder; set out = \"...\" in the sweep file or pass --out")
    if jobs is not None:
        check_jobs(jobs)
    limit = spec.max_tasks or DEFAULT_MAX_TASKS
    if spec.points > limit and not yes:
        raise ConfigError(f"{spec.source}: the grid has {spec.points:,} points, more than {limit:,}; pass --yes to "
                          f"run it (or set max_tasks = {spec.points} in the sweep file)")
    tasks = list(iter_tasks(spec))  # every file read and hashed before anything runs
    out.mkdir(parents=True, exist_ok=True)
    report = ServeSweepReport(out=out, total=len(tasks))
    with exclusive(out):  # one sweep at a time per folder, serving or not
        _run(report, tasks, executor, jobs, address, retry_failed, progress)
    report.wall_s = time.perf_counter() - start
    return report


def _run(report: ServeSweepReport, tasks: list, executor, jobs, address, retry_failed: bool,
         progress: bool) -> None:
    """Skip the tasks with a row, run the others, write each row as it arrives (``run_serve_sweep``)."""
    import sys

    import pyarrow.parquet as pq
    from tqdm import tqdm

    from stepsim.base.files import write_parquet_atomic
    from stepsim.batch.executor_factory import make_executor
    from stepsim.batch.executors import default_jobs

    out = report.out
    report.superseded = _remove_older_generations(out, tasks)
    rows = {}
    pending = []
    for task in tasks:
        path = part_file(out, task)
        if path.is_file():
            row = pq.read_table(path).to_pylist()[0]
            if not (retry_failed and row["status"] == "failed"):
                rows[task.key] = row
                report.skipped.append(task.key)
                continue
        pending.append(task)
    if pending:
        owned = isinstance(executor, str)
        runner = make_executor(executor, jobs=jobs or default_jobs(), warm_kernels=True, address=address) \
            if owned else executor
        runner.task_function = serve_task
        report.executor = runner.describe()
        bar = tqdm(total=len(pending), desc="serving sweep", unit="task", disable=not progress, file=sys.stderr,
                   dynamic_ncols=True)
        stopped = True
        try:
            for task, outcome in runner.imap_unordered(pending):
                table = row_table(task, outcome)
                write_parquet_atomic(table, part_file(out, task))
                rows[task.key] = table.to_pylist()[0]
                report.ran.append(task.key)
                bar.update(1)
            stopped = False
        finally:
            bar.close()
            if owned and stopped:  # Ctrl-C, a lost worker: the rows written so far stay, a re-run resumes
                runner.abort()
            elif owned:
                runner.close()
    report.rows = [(task, rows.get(task.key)) for task in tasks]
    report.failed = [task.key for task, row in report.rows if row is not None and row["status"] == "failed"]


def _remove_older_generations(out: Path, tasks: list) -> int:
    """Delete the rows of this grid's tasks written under another run id (a file they read changed, or another
    stepsim version ran them): their ``config`` is a task's, their run id is not. Returns how many."""
    import pyarrow.parquet as pq

    from stepsim.base.files import canonical_json

    current = {canonical_json(t.config): t.run_id for t in tasks}
    removed = 0
    for path in sorted(out.glob("part-*.parquet")):
        if "config" not in pq.read_schema(path).names:  # not a serving sweep's row
            continue
        row = pq.read_table(path, columns=["run_id", "config"]).to_pylist()[0]
        run_id = current.get(row["config"])
        if run_id is not None and run_id != row["run_id"]:
            path.unlink()
            removed += 1
    return removed


def format_report(report: ServeSweepReport, axes: list) -> str:
    """The end-of-sweep text: counts, then one line per task (its swept knobs and the metrics of :data:`REPORT`,
    or its error)."""
    from stepsim.batch.grid import short_value

    lines = [f"serving sweep -> {report.out}: {report.total} task(s), {len(report.ran)} run, "
             f"{len(report.skipped)} already done, {len(report.failed)} failed"
             + (f", {report.superseded} older row(s) replaced" if report.superseded else "")
             + (f" ({report.executor})" if report.executor else "")]
    header = [*axes, *(label for _, label, _, _ in REPORT)]
    table = []
    for task, row in report.rows:
        cells = [short_value(task.config.get(k)) for k in axes]
        if row is None:
            cells.append("(not run)")
        elif row["status"] != "ok":
            cells.append(f"failed: {row['error_type']}: {(row['error_message'] or '').splitlines()[0]}")
        else:
            cells += ["-" if row.get(c) is None else format(row[c] * scale, spec) for c, _, scale, spec in REPORT]
        table.append(cells)
    widths = [max([len(h)] + [len(r[i]) for r in table if i < len(r)]) for i, h in enumerate(header)]
    for cells in [header, *table]:  # a failed task's error runs past the metric columns
        lines.append("  " + "  ".join(c.rjust(w) for c, w in zip(cells, widths)))
    return "\n".join(lines)


def config_of(row: dict) -> dict:
    """The task knobs of a sweep row (its ``config`` column)."""
    return json.loads(row["config"])
