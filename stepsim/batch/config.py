"""Read and check a sweep file (TOML): which workload, which fixed knobs, which axes, which mode, where to.

A sweep file looks like this (paths are relative to the sweep file's folder)::

    workload = "swiglu"            # moe | swiglu | attention
    mode = "simulate"              # metrics (symbolic totals) | simulate (timing engine); default metrics
    out = "results/swiglu"         # output folder; ``stepsim sweep --out`` overrides it
    partition_by = ["workload"]    # hive folder levels (task-config keys; read back as strings); default ["workload"]
    report = ["cycles"]            # result columns of the end-of-sweep table; default by mode
    max_tasks = 50000              # the largest grid this file may expand to without --yes (default 10,000)

    [fixed]                        # knobs every task shares (the keys workload_from_config accepts)
    compute_bw = 4096

    [axes]                         # swept knobs; the grid is their cartesian product, in this order
    tile_m = [16, 32, 64]                          # a list
    tile_n = {start = 16, stop = 257, factor = 2}  # 16, 32, ..., 256 (stop is exclusive, like range)
    # channel_depth = {start = 1, stop = 5, step = 1}   # 1, 2, 3, 4
    # trace = {glob = "traces/kv/*.npy"}               # every matching file, sorted by path

Several grids whose knobs differ (static tiling with tile sizes, dynamic tiling without) are written as an
array of tables, ``[[axes]]`` ... ``[[axes]]``; the sweep runs them one after the other.

Every key is checked: an unknown key anywhere (top level, ``[fixed]``, ``[axes]``, inside a range table) is a
:class:`~stepsim.base.errors.ConfigError` that names the key and the file. Knob names come from
``stepsim.workloads.config.KNOBS`` (the same list a single-run config is checked against), so the two cannot
drift. Knob types and applicability are checked per task when the grid is expanded
(:func:`stepsim.batch.grid.expand`); values only the builder or the engine can refuse (a tile that does not
divide a dimension, a deadlock) fail that task when it runs, recorded as a failed row, not the whole sweep.

File-valued knobs (:data:`PATH_KEYS`) are resolved against the sweep file's folder and stored as absolute
POSIX paths, so the tasks mean the same thing in any worker whatever its working directory.
"""

from __future__ import annotations

import difflib
import glob as globlib
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from stepsim.base.errors import ConfigError
from stepsim.base.files import refuse_special_file
from stepsim.workloads.config import MODES

TOP_LEVEL_KEYS = ("workload", "mode", "out", "partition_by", "report", "fixed", "axes")
#: optional top-level keys accepted besides TOP_LEVEL_KEYS (error messages list the main keys only)
EXTRA_TOP_LEVEL_KEYS = ("max_tasks",)
#: grids larger than this need ``--yes`` (``run_sweep(yes=True)``) or a ``max_tasks`` key at least as large
DEFAULT_MAX_TASKS = 10_000
#: the most values one range axis may have: its values are listed in memory before the grid is counted (a range
#: to 10**12 was a MemoryError), and a grid's points are still limited by ``max_tasks``
MAX_AXIS_VALUES = 1_000_000
RANGE_KEYS = ("start", "stop", "step", "factor")
#: knobs whose values are files (a hardware knob is a file only when it names a ``.toml``, else a preset; a
#: serving sweep's ``routing`` only when it is not ``synthetic``)
PATH_KEYS = ("trace", "hardware", "fifo_depths", "routing", "kv_lengths")
#: result columns shown at the end of a sweep when the file has no ``report`` key
DEFAULT_REPORT = {"metrics": ("off_chip_bytes", "on_chip_bytes", "flops"),
                  "simulate": ("cycles", "off_chip_bytes"), "functional": ("cycles", "off_chip_bytes"),
                  "check": ("cycles", "check_max_rel_error", "check_passed")}
#: keys every task config holds besides the knobs
TASK_KEYS = ("workload", "mode")


@dataclass(frozen=True)
class SweepSpec:
    """A checked sweep file.

    Attributes
    ----------
    source : Path
        The sweep file (for messages).
    workload : str
        Workload kind.
    mode : str
        ``metrics`` or ``simulate``.
    out : Path or None
        Output folder (absolute), None when the file has none (the CLI's ``--out`` must then give one).
    fixed : dict
        Knobs shared by every task (paths resolved).
    grids : tuple of dict
        One ``{knob: values}`` dict per ``[axes]`` table (knobs in file order, each value tuple in sweep order,
        paths resolved); ``({},)`` when the file has no axes (a single task).
    partition_by : tuple of str
        Task-config keys that become hive folder levels.
    report : tuple of str
        Result columns of the summary table.
    max_tasks : int or None
        The file's ``max_tasks`` (None: :data:`DEFAULT_MAX_TASKS` applies).
    """

    source: Path
    workload: str
    mode: str
    out: Path | None
    fixed: dict
    grids: tuple
    partition_by: tuple
    report: tuple
    max_tasks: int | None = None
    force: bool = False  # run the tasks the run-size estimate refuses (--force; stepsim.kernels.run_size)

    @property
    def points(self) -> int:
        """Grid points (:func:`grid_points`)."""
        return grid_points(self.grids)


def grid_points(grids) -> int:
    """Grid points: the sum over ``grids`` (mappings of knob -> list of values) of the product of their axis
    lengths (before duplicates across grids are dropped); computed without expanding anything."""
    total = 0
    for grid in grids:
        n = 1
        for values in grid.values():
            n *= len(values)
        total += n
    return total


def load_sweep(path: str | Path) -> SweepSpec:
    """Read and check the sweep file at ``path``.

    Raises
    ------
    ConfigError
        The file is missing or not TOML, a key is unknown or duplicated between ``[fixed]`` and ``[axes]``, or a
        value has the wrong type (the message names the file and the key).
    """
    path = Path(path)
    refuse_special_file(path, ConfigError, "a sweep")
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"sweep file not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read sweep file {path}: {exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:  # a binary file is not UTF-8 text
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    return parse_sweep(data, source=path)


def parse_sweep(data: Mapping, *, source: str | Path) -> SweepSpec:
    """Check the parsed TOML ``data`` of the sweep file ``source`` (see the module docstring for the format)."""
    source = Path(source)
    base = source.resolve().parent
    _check_keys({k: v for k, v in data.items() if k not in EXTRA_TOP_LEVEL_KEYS}, TOP_LEVEL_KEYS, source, where="")
    workload = data.get("workload")
    if workload is None:
        raise ConfigError(f"{source}: missing key 'workload' (one of {', '.join(_workloads())})")
    if workload not in _workloads():
        raise ConfigError(f"{source}: unknown workload {workload!r} (expected one of {', '.join(_workloads())}), "
                          "or serve for a serving sweep")  # read by stepsim.serve.sweep before this parser
    mode = data.get("mode", "metrics")
    if mode not in MODES:
        raise ConfigError(f"{source}: mode must be one of {', '.join(MODES)}, got {mode!r}")
    out = data.get("out")
    if out is not None and not (isinstance(out, str) and out):
        raise ConfigError(f"{source}: out must be a folder path (a non-empty string), got {out!r}")

    fixed, grids = parse_grid(data, _knob_keys(), source)

    task_keys = (*TASK_KEYS, *fixed, *dict.fromkeys(k for grid in grids for k in grid))
    partition_by = _string_list(data, "partition_by", source, default=("workload",))
    for key in partition_by:
        if key not in task_keys:
            raise ConfigError(f"{source}: partition_by key {key!r} is not a key of the tasks "
                              f"(expected one of {', '.join(task_keys)})")
    report = _string_list(data, "report", source, default=DEFAULT_REPORT[mode])
    columns = _row_columns()
    for column in report:
        if column not in columns:
            close = difflib.get_close_matches(column, columns, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{source}: report column {column!r} is not a result column{hint}")
    max_tasks = data.get("max_tasks")
    if max_tasks is not None and (isinstance(max_tasks, bool) or not isinstance(max_tasks, int) or max_tasks < 1):
        raise ConfigError(f"{source}: max_tasks must be an int >= 1, got {max_tasks!r}")
    return SweepSpec(source=source, workload=workload, mode=mode, out=(base / out) if out else None, fixed=fixed,
                     grids=tuple(grids), partition_by=partition_by, report=report, max_tasks=max_tasks)


def parse_grid(data: Mapping, knobs, source: Path) -> tuple[dict, list]:
    """``(fixed, grids)`` of a sweep file's ``[fixed]`` and ``[axes]`` / ``[[axes]]`` tables: every key one of
    ``knobs``, file paths made absolute against ``source``'s folder, axes as value tuples (shared by the
    workload sweeps and ``stepsim.serve.sweep``)."""
    base = Path(source).resolve().parent
    fixed_raw = _table(data.get("fixed", {}), source, where="[fixed]")
    axes_raw = data.get("axes", {})
    axes_tables = axes_raw if isinstance(axes_raw, list) else [axes_raw]
    if not axes_tables:
        raise ConfigError(f"{source}: [[axes]] is an empty list; leave axes out for a single task")
    _check_keys(fixed_raw, knobs, source, where="[fixed]")
    fixed = {k: _resolve_value(k, v, base, source, where="[fixed]") for k, v in fixed_raw.items()}
    grids = []
    for number, table in enumerate(axes_tables, start=1):
        where = "[axes]" if len(axes_tables) == 1 else f"[[axes]] #{number}"
        table = _table(table, source, where=where)
        _check_keys(table, knobs, source, where=where)
        both = [k for k in table if k in fixed_raw]
        if both:
            raise ConfigError(f"{source}: key {both[0]!r} is both in [fixed] and in {where}; keep one")
        grids.append({k: _axis_values(k, v, base, source, where=f"{where} {k}") for k, v in table.items()})
    return fixed, grids


def check_keys(data: Mapping, known, source: Path, *, where: str = "") -> None:
    """Every key of ``data`` is one of ``known``; else a ConfigError naming the key, ``where`` and the file."""
    _check_keys(data, known, source, where=where)


# --- pieces ---------------------------------------------------------------------------------------------
def _workloads() -> tuple:
    """The workload kinds a sweep runs: all but ``program`` (a user's file.py:function), whose result depends on
    Python code the run id does not fingerprint (modules it imports, data it reads), so resuming a sweep could
    reuse a stale result; user programs run with ``stepsim run``."""
    from stepsim.workloads.config import WORKLOADS

    return tuple(w for w in WORKLOADS if w != "program")


def _knob_keys() -> tuple:
    """The knobs a sweep may set in [fixed] / [axes]: every workload knob but ``workload`` (top level) and
    ``program`` (user programs do not run in sweeps, see :func:`_workloads`)."""
    from stepsim.workloads.config import KNOBS

    return tuple(k for k in KNOBS if k not in TASK_KEYS and k != "program")


def _row_columns() -> list:
    """Columns of a sweep row: the record schema plus the sweep's status columns."""
    from stepsim.batch.columns import SWEEP_COLUMNS
    from stepsim.results.records import COLUMN_NAMES

    return [*COLUMN_NAMES, *SWEEP_COLUMNS.names]


def _check_keys(data: Mapping, known, source: Path, *, where: str) -> None:
    for key in data:
        if key not in known:
            place = f" in {where}" if where else ""
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{source}: unknown key {key!r}{place}{hint}; known keys: {', '.join(known)}")


def _table(value, source: Path, *, where: str) -> dict:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{source}: {where} must be a table, got {value!r}")
    return dict(value)


def _string_list(data: Mapping, key: str, source: Path, *, default: tuple) -> tuple:
    value = data.get(key, default)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{source}: {key} must be a list of strings, got {value!r}")
    if len(set(value)) != len(value):
        raise ConfigError(f"{source}: {key} lists a key twice: {value!r}")
    return tuple(value)


def _is_path_value(key: str, value) -> bool:
    # a hardware knob is either a preset name ("step-eval") or a TOML file; only the file is a path. A model knob
    # naming a Hugging Face config.json is a path too (a preset name or alias is not)
    if key == "model":
        return isinstance(value, str) and value.lower().endswith(".json")
    if key == "routing" and value == "synthetic":
        return False
    if key == "requests":  # a serving sweep's request trace (stepsim.serve.sweep)
        return isinstance(value, str)
    return key in PATH_KEYS and isinstance(value, str) and (key != "hardware" or value.endswith(".toml"))


def _resolve_value(key: str, value, base: Path, source: Path, *, where: str):
    """A scalar knob value, with file paths made absolute against the sweep file's folder."""
    if isinstance(value, (Mapping, list)):
        raise ConfigError(f"{source}: {where} {key} must be a single value, got {value!r}"
                          + (" (sweep it under [axes])" if where == "[fixed]" else ""))
    if _is_path_value(key, value):
        return (base / value).resolve().as_posix()
    return value


def _axis_values(key: str, value, base: Path, source: Path, *, where: str) -> tuple:
    """The values of one axis (``where`` names it in messages): a list, a range table or a glob table."""
    if isinstance(value, list):
        values = tuple(_resolve_value(key, v, base, source, where=where) for v in value)
    elif isinstance(value, Mapping) and "glob" in value:
        values = _glob_values(key, value, base, source, where=where)
    elif isinstance(value, Mapping):
        values = _range_values(value, source, where=where)
    else:
        raise ConfigError(f"{source}: {where} must be a list, a range {{start, stop, step|factor}} or "
                          f"{{glob = \"...\"}}, got {value!r}")
    if not values:
        raise ConfigError(f"{source}: {where} has no values")
    seen = set()
    for v in values:
        marker = (type(v).__name__, v)  # 1 and 1.0 and True are distinct knob values
        if marker in seen:
            raise ConfigError(f"{source}: {where} lists the value {v!r} twice")
        seen.add(marker)
    return values


def _glob_values(key: str, value: Mapping, base: Path, source: Path, *, where: str) -> tuple:
    """Every file matching ``{glob = "pattern"}`` (relative to the sweep file), sorted by path."""
    extra = [k for k in value if k != "glob"]
    if extra:
        raise ConfigError(f"{source}: unknown key {extra[0]!r} in {where} (a glob table holds only 'glob')")
    if key not in PATH_KEYS:
        raise ConfigError(f"{source}: {where}: glob is only for file knobs ({', '.join(PATH_KEYS)})")
    pattern = value["glob"]
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError(f"{source}: {where}: glob must be a non-empty string, got {pattern!r}")
    full = pattern if Path(pattern).is_absolute() else (base / pattern).as_posix()
    files = sorted(Path(p).resolve().as_posix() for p in globlib.glob(full, recursive=True) if Path(p).is_file())
    if not files:
        raise ConfigError(f"{source}: {where}: glob {pattern!r} matches no file (relative to {base})")
    return tuple(files)


def _range_values(value: Mapping, source: Path, *, where: str) -> tuple:
    """``{start, stop, step}`` (arithmetic) or ``{start, stop, factor}`` (geometric); stop is exclusive."""
    for k in value:
        if k not in RANGE_KEYS:
            raise ConfigError(f"{source}: unknown key {k!r} in {where} (a range holds start, stop and step or "
                              f"factor; a file list holds glob)")
    for k in ("start", "stop"):
        if k not in value:
            raise ConfigError(f"{source}: {where}: a range needs {k!r}")
    if ("step" in value) == ("factor" in value):
        raise ConfigError(f"{source}: {where}: a range needs exactly one of 'step' and 'factor'")
    for k, v in value.items():
        if not isinstance(v, int) or isinstance(v, bool):
            raise ConfigError(f"{source}: {where}: range {k} must be an integer, got {v!r}")
    start, stop = value["start"], value["stop"]
    if "step" in value:
        if value["step"] == 0:
            raise ConfigError(f"{source}: {where}: range step must not be 0")
        values = range(start, stop, value["step"])
        if len(values) > MAX_AXIS_VALUES:
            raise ConfigError(f"{source}: {where}: range has {len(values):,} values; the limit is "
                              f"{MAX_AXIS_VALUES:,} per axis")
        return tuple(values)
    factor = value["factor"]
    if factor < 2 or start < 1:
        raise ConfigError(f"{source}: {where}: a geometric range needs factor >= 2 and start >= 1, "
                          f"got start={start}, factor={factor}")
    values = []
    v = start
    while v < stop:
        values.append(v)
        v *= factor
    return tuple(values)
