"""One record per run: :class:`RunResult`, its fixed Arrow schema, and Parquet output.

A *run* is one configuration (the knobs of :mod:`stepsim.workloads.config`) measured in one of four modes:

* ``"metrics"``: the symbolic off-chip / on-chip / FLOP totals with the trace's values substituted;
* ``"simulate"``: the same plus a timing simulation on the compiled engine (cycles, measured traffic,
  per-unit and per-channel counters);
* ``"functional"``: the simulation with real tile values (seeded inputs, seed 0); timing columns are identical;
* ``"check"``: functional, then the stored tensors are compared with the package's NumPy reference
  (:func:`stepsim.workloads.reference.check_outputs`).

>>> run = run_config({"workload": "swiglu", "tile_m": 32, "tile_n": 64})
>>> run.row["off_chip_bytes"], run.row["cycles"] is None
(3735552, True)

The row (:attr:`RunResult.row`, :meth:`RunResult.to_arrow`) always has the columns of :data:`SCHEMA`, in
this order (units are stored as Arrow field metadata ``{"unit": ...}``; a dash means no unit):

=================================  ==========  ================================================================
column                             unit        meaning
=================================  ==========  ================================================================
run_id                             none        SHA-256 of everything that determines the result (identity_config:
                                               knobs, mode, hardware values, FIFO depth, timing-model version)
                                               and of the trace's content (never of how a path is spelled)
mode                               none        ``metrics``, ``simulate``, ``functional`` or ``check``
stepsim_version                    none        version that produced the record
trace_path                         none        trace read (the bundled one if no ``trace`` knob); null: no trace
trace_sha256                       none        SHA-256 of the trace file (of its files, for a folder)
hardware_name                      none        hardware the run used: a preset's name, or ``<preset>+<field>=<value>,...``
                                               for a hardware file or overrides (``Hardware.name``)
workload ... convention            none        every knob of :data:`~stepsim.workloads.config.KNOBS` as
                                               the run used it: as configured, and where unset the builder's
                                               value for the knobs of :data:`RESOLVED_KNOBS` (null = not used)
params                             none        canonical JSON of every parameter the builder used
cycles                             cycles      simulated cycles; null for metrics runs
off_chip_bytes                     bytes       measured total for simulations, symbolic total for metrics
off_chip_bytes_read / _written     bytes       measured by the engine; null for metrics runs
off_chip_bytes_measured            bytes       read + written; null for metrics runs
off_chip_bytes_symbolic            bytes       the graph's symbolic total with the trace's values
on_chip_bytes                      bytes       symbolic on-chip footprint (``convention``'s accounting)
on_chip_bytes_active               bytes       the same minus the footprint of operators that got no work
flops                              FLOP        the paper's algorithmic FLOPs (``graph_flops`` if none)
graph_flops                        FLOP        sum over compute operators (engine FLOP convention)
algorithmic_flops                  FLOP        the paper's formula; null when the workload defines none
allocated_compute_flops_per_cycle  FLOP/cycle  sum of ``compute_bw`` over FLOP-based compute operators
hbm_bytes_per_cycle                bytes/cycle peak off-chip bandwidth of the hardware (all chips' HBMs)
load_unit_cycles                   cycles      a lower bound on cycles: the busiest load unit's tiles one after
                                               another (:func:`stepsim.analysis.bounds.load_unit_cycles`)
compute_unit_cycles                cycles      a lower bound on cycles: the busiest compute unit's firings, each
                                               the larger of its FLOPs at ``compute_bw`` and its PMU reads of
                                               loaded tiles (:func:`stepsim.analysis.bounds.compute_unit_cycles`)
hbm_request_cycles                 cycles      a lower bound on cycles: the busiest HBM channel's share of the
                                               64-byte requests (:func:`stepsim.analysis.bounds.hbm_request_cycles`)
pipeline_cycles                    cycles      a lower bound on cycles: a load or compute unit's work after the
                                               earliest time its first operands can exist, or the HBM's last
                                               weight request (no earlier than its load can start) plus the
                                               firing its tile still gets
                                               (:func:`stepsim.analysis.bounds.pipeline_cycles`)
link_cycles                        cycles      a lower bound on cycles: the busiest link between chips' elements
                                               back to back plus its latency; 0 on one chip
                                               (:func:`stepsim.analysis.bounds.link_cycles`)
deadlock_proof                     -           null, or one line proving, without simulating, that the run
                                               deadlocks at its FIFO depths (a time-multiplexed MoE region
                                               whose experts' tiles cannot all wait for the Reassemble;
                                               :func:`stepsim.analysis.deadlock_proof.prove_deadlock`)
compute_utilization                ratio       ``flops / (cycles * allocated_compute_flops_per_cycle)``
off_chip_bw_utilization            ratio       ``off_chip_bytes / (cycles * hbm_bytes_per_cycle)``
events, fires                      count       engine events and unit firings; null for metrics runs
build_s                            s           building the workload (trace read included); null if unknown
metrics_s                          s           evaluating the symbolic metrics
lower_s, compile_s, sim_wall_s     s           lowering, first-call compilation, engine run; null (metrics)
total_s                            s           whole :func:`run_config` call; null when not measured
check_max_rel_error                ratio       ``check`` runs: max over stored tensors of max|sim-ref|/max|ref|
check_tolerance                    ratio       ``check`` runs: the smallest dtype-derived tolerance of them
check_passed                       none        ``check`` runs: every stored tensor within its tolerance
=================================  ==========  ================================================================

Utilizations follow docs/semantics.md §5.4: ``compute_util = (alg_flops / cycles) / allocated_comp_flops`` and
``off_chip_bandwidth_utilization = (off_chip_traffic / cycles) / 1024`` (1024 B/cycle is the step-eval HBM
peak; here the run's hardware peak). They are ratios (1.0 = 100 %), null for metrics runs or zero cycles.
``allocated_compute_flops_per_cycle`` counts operators whose function is FLOP-based (``fixed_cycles is
None``), so the token-packing ``Accum(RetileRow)`` is left out as in the paper: this reproduces §5.4's
787456 ... 152576 FLOPs/cycle for static tiling. (For the dynamic-tiling baseline the paper's scripts also
omit the final accumulation, 786432; this module counts it, 787456.)

Per-unit and per-channel counters of simulation runs: :meth:`RunResult.unit_table` and
:meth:`RunResult.channel_table` (:data:`UNIT_SCHEMA`, :data:`CHANNEL_SCHEMA`). :meth:`RunResult.write`
writes ``part-<run_id[:16]>.parquet`` (the row) and, for simulations, ``_units-<...>.parquet`` and
``_channels-<...>.parquet`` beside it. The underscore keeps the counter files out of
``pyarrow.dataset.dataset(root)`` discovery of the rows; :func:`read_runs` reads any of the three kinds.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepsim._version import __version__
from stepsim.analysis.bounds import cycle_bounds, link_cycles
from stepsim.analysis.deadlock_proof import prove_deadlock
from stepsim.base.defaults import TIMING_MODEL_VERSION, UNSET, resolve_channel_depth
from stepsim.base.errors import ConfigError
from stepsim.base.files import (
    TRACE_HASH_KEY,
    canonical_json,
    file_sha256,
    pa,  # pyarrow's stand-in: imported when a table is first made (a printed record needs none)
    partition_dir,
    provenance_metadata,
    published_folder,
    read_results,
    stable_hash,
    trace_sha256,
    write_parquet_atomic,
    write_partitioned,
)
from stepsim.base.hardware import Hardware
from stepsim.graph.gcpause import gc_paused
from stepsim.models.presets import is_model_file
from stepsim.workloads.base import Workload, flop_based
from stepsim.workloads.config import (
    BOOL_KEYS,
    CHOICES,
    KNOBS,
    STRING_KEYS,
    build_normalized,
    knob_where,
    normalize_config,
    resolve_hardware,
    resolved_trace,
)
from stepsim.workloads.kinds import WORKLOAD_CHANNEL_DEPTH

# The three Arrow schemas are made on first use (module __getattr__ below), which ruff cannot see.
__all__ = ["CHANNEL_SCHEMA", "SCHEMA", "UNIT_SCHEMA", "NotSimulatedError", "RunResult",  # noqa: F822
           "allocated_compute_flops", "concat_runs", "identity", "read_runs", "run_config", "run_identity",
           "trace_sha256"]


class NotSimulatedError(ConfigError):
    """Simulation-only data (cycles per unit, channel counters) was asked of a ``mode="metrics"`` run.

    A ConfigError because the run's configuration (its mode) does not produce what was asked for.
    """


# --- schemas ----------------------------------------------------------------------------------------------
#: knobs stored as strings (choices and free-form strings); the others are ints
_STRING_KNOBS = {k for k in KNOBS if k in CHOICES or k in STRING_KEYS}


# Columns are plain (name, Arrow type, unit) triples, so a record is built and printed without pyarrow (0.1 s of
# start-up); the Arrow schemas are made from them when a table is first written or read.
def _strings(*names: str) -> list[tuple]:
    return [(name, "string", None) for name in names]


def _i64(unit: str, *names: str) -> list[tuple]:
    return [(name, "int64", unit) for name in names]


def _f64(unit: str, *names: str) -> list[tuple]:
    return [(name, "float64", unit) for name in names]


#: the row's columns, (name, Arrow type, unit or None), in order (see the module docstring for their meaning)
COLUMNS = tuple(
    _strings("run_id", "mode", "stepsim_version", "trace_path", "trace_sha256", "hardware_name")
    + [(k, "string" if k in _STRING_KNOBS else "bool" if k in BOOL_KEYS else "int64", None) for k in KNOBS]
    + _strings("params") + _i64("cycles", "cycles")
    + _i64("bytes", "off_chip_bytes", "off_chip_bytes_read", "off_chip_bytes_written", "off_chip_bytes_measured",
           "off_chip_bytes_symbolic", "on_chip_bytes", "on_chip_bytes_active")
    + _i64("FLOP", "flops", "graph_flops", "algorithmic_flops")
    + _i64("FLOP/cycle", "allocated_compute_flops_per_cycle") + _i64("bytes/cycle", "hbm_bytes_per_cycle")
    + _i64("cycles", "load_unit_cycles", "compute_unit_cycles", "hbm_request_cycles",
           "pipeline_cycles", "link_cycles") + _strings("deadlock_proof")
    + _f64("ratio", "compute_utilization", "off_chip_bw_utilization") + _i64("count", "events", "fires")
    + _f64("s", "build_s", "metrics_s", "lower_s", "compile_s", "sim_wall_s", "total_s")
    + _f64("ratio", "check_max_rel_error", "check_tolerance") + [("check_passed", "bool", None)]
)
#: the row's column names, in order
COLUMN_NAMES = tuple(name for name, _, _ in COLUMNS)
#: {column: unit} of the row's columns that have one
COLUMN_UNITS = {name: unit for name, _, unit in COLUMNS if unit}
#: per-unit counters of a simulation run (one row per engine unit, in program order)
UNIT_COLUMNS = tuple(
    _strings("run_id", "name", "kind", "group", "label")
    + _i64("count", "fires")
    + _i64("cycles", "busy_cycles", "blocked_in_cycles", "blocked_out_cycles", "final_clock")
    + _f64("ratio", "utilization") + _i64("bytes", "bytes"))
#: per-channel counters of a simulation run (one row per FIFO channel, in program order)
CHANNEL_COLUMNS = tuple(_strings("run_id", "name") + _i64("count", "pushes") + _i64("elements", "peak_occupancy"))
#: the Arrow schemas (module attributes made on first use): row, per-unit and per-channel
_SCHEMA_COLUMNS = {"SCHEMA": COLUMNS, "UNIT_SCHEMA": UNIT_COLUMNS, "CHANNEL_SCHEMA": CHANNEL_COLUMNS}


@functools.cache
def arrow_schema(columns: tuple) -> pa.Schema:
    """The Arrow schema of ``columns`` ((name, Arrow type, unit) triples; units in field metadata)."""
    return pa.schema([pa.field(name, getattr(pa, "bool_" if typ == "bool" else typ)(),
                               metadata={"unit": unit} if unit else None) for name, typ, unit in columns])


def __getattr__(name: str):
    if name in _SCHEMA_COLUMNS:
        return arrow_schema(_SCHEMA_COLUMNS[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: {kind: (file name prefix, columns)} of the three tables a run folder holds
_KINDS = {"runs": ("part-", COLUMNS), "units": ("_units-", UNIT_COLUMNS),
          "channels": ("_channels-", CHANNEL_COLUMNS)}


# --- small pure helpers -----------------------------------------------------------------------------------
def allocated_compute_flops(workload: Workload) -> int:
    """FLOPs/cycle allocated to the workload: ``compute_bw`` summed over FLOP-based compute operators.

    Operators whose function takes fixed cycles (e.g. the token-packing ``Accum(RetileRow)``) are left out,
    as in docs/semantics.md §5.4's ``allocated_comp_flops``.
    """
    return sum(int(op.compute_bw) for op in workload.graph.finalize().ops if flop_based(op))


def _ratio(numerator: int | None, cycles: int | None, per_cycle: int | None) -> float | None:
    """``numerator / (cycles * per_cycle)``; None when any term is missing or the denominator is 0."""
    if numerator is None or not cycles or not per_cycle:
        return None
    return numerator / (cycles * per_cycle)


_NAME_SUFFIX = re.compile(r"_\d+$")


def _unit_kind(name: str, kinds: Mapping[str, str]) -> str:
    """Operator class of a unit: from the graph when the unit is an operator, else from its name."""
    if name in kinds:
        return kinds[name]
    if name.endswith(".implicit_sink"):
        return "Sink"
    return _NAME_SUFFIX.sub("", name)


def identity(cfg: Mapping, trace_hash: str | None) -> dict:
    """What ``run_id`` hashes (and what written files record as ``stepsim.config``).

    ``{"config": <identity config, see identity_config>, "trace_sha256": <trace content hash or None>}``, plus
    ``"model_sha256"`` (the file's content hash) when ``cfg``'s model is a Hugging Face ``config.json`` path
    (:func:`identity_config` already puts that hash in place of the path), so editing that file changes the
    run id. The stepsim version is left out (re-running a configuration after an upgrade that changed no cycle
    replaces its files), but the timing-model version is in the identity config.
    """
    ident = {"config": dict(cfg), "trace_sha256": trace_hash}
    model = cfg.get("model")
    if isinstance(model, str) and is_model_file(model):
        try:
            ident["model_sha256"] = file_sha256(model)
        except OSError as exc:
            raise ConfigError(f"model file {model}: cannot read: {exc.strerror or exc}") from None
    if cfg.get("fifo_depths") is not None:  # a FIFO depths file counts by its content, not its path
        ident["fifo_depths_sha256"] = file_sha256(cfg["fifo_depths"])
    return ident


_identity = identity  # the name stepsim.batch first imported

#: knobs whose value is a path: the identity holds what they resolve to (trace content hash, hardware values)
_PATH_KNOBS = ("trace", "hardware", "system")
#: knobs added after run ids were first written (the collectives' and expert parallelism's): they enter a run's
#: identity only when set, so a config that leaves them unset keeps the run id it always had (a resumed sweep
#: finds its results; tests/records/test_resolved_knobs.py pins four ids)
_KNOBS_IN_IDENTITY_WHEN_SET = ("op", "bytes", "algorithm", "system", "ep", "placement", "tp", "layers", "pp",
                               "micro_batches", "no_fuse", "spill")


def program_identity(cfg: Mapping) -> str:
    """What a config's ``program`` knob enters the run identity as: an ONNX model's file content, or a user's
    ``file.py:function`` as the function and the file's content (never the path)."""
    program = cfg["program"]
    if is_onnx_program(cfg):
        try:
            return f"onnx sha256:{file_sha256(program)}"
        except OSError as exc:
            raise ConfigError(f"ONNX model {program}: cannot read: {exc.strerror or exc}") from None
    from stepsim.workloads.program.build import split_spec

    path, function = split_spec(program)
    try:
        return f"{function} in sha256:{file_sha256(path)}"
    except OSError as exc:
        raise ConfigError(f"program {program!r}: cannot read {path}: {exc.strerror or exc}") from None


def identity_config(cfg: Mapping, hardware: Hardware, channel_depth: int) -> dict:
    """Everything that determines a run's result, as plain data: the identity half of :func:`identity`.

    The normalized config (every knob plus ``mode``) without the path-valued knobs, so the same run spelled
    with another path (relative or absolute, a copy, a symlink) has one identity (a model ``config.json`` path
    becomes its content hash); in place of the others the resolved
    hardware values (:meth:`Hardware.values`, after TOML file and overrides), the default FIFO depth the run
    uses (:func:`stepsim.base.defaults.resolve_channel_depth`) and :data:`~stepsim.base.defaults.TIMING_MODEL_VERSION`.
    The trace enters through its content hash (beside this config in :func:`identity`).
    """
    ident = {k: v for k, v in cfg.items()
             if k not in _PATH_KNOBS and not (k in _KNOBS_IN_IDENTITY_WHEN_SET and v is None)}
    model = cfg.get("model")
    if isinstance(model, str) and is_model_file(model):  # a config.json: its content, not its path
        try:
            ident["model"] = f"config.json sha256:{file_sha256(model)}"
        except OSError as exc:
            raise ConfigError(f"model file {model}: cannot read: {exc.strerror or exc}") from None
    for slot in ("routing", "kv_lengths"):  # the decoder's two traces: their content, not their paths
        if cfg.get(slot) is not None:
            ident[slot] = f"sha256:{trace_sha256(cfg[slot])}"
    system = cfg.get("system")
    if system is not None:  # a system preset by name, a system file by its content (its hardware: hardware_values)
        ident["system"] = system if not system.endswith(".toml") else _system_file_hash(system)
    program = cfg.get("program")
    if program is not None:
        ident["program"] = program_identity(cfg)
    ident.update(hardware_values=hardware.values(), run_channel_depth=int(channel_depth),
                 timing_model=TIMING_MODEL_VERSION)
    return ident


def _system_file_hash(path: str) -> str:
    try:
        return f"sha256:{file_sha256(path)}"
    except OSError as exc:
        raise ConfigError(f"system file {path}: cannot read: {exc.strerror or exc}") from None


def run_identity(config: Mapping, *, source: str | None = None) -> tuple[str, str | None, str | None]:
    """``(run_id, trace path, trace sha256)`` of a config without running it (what :func:`run_config` gives).

    Raises
    ------
    ConfigError
        Invalid config, or the trace or hardware file cannot be read.
    """
    return identity_of_normalized(normalize_config(config, source=source), source=source)


def identity_of_normalized(cfg: Mapping, *, source: str | None = None) -> tuple[str, str | None, str | None]:
    """:func:`run_identity` of a config already passed through ``normalize_config`` (not checked again)."""
    trace = resolved_trace(cfg)
    trace_hash = trace_sha256(trace) if trace is not None else None
    hardware = resolve_hardware(cfg, source=source)
    depth = resolve_channel_depth(_knob_depth(cfg), hardware, WORKLOAD_CHANNEL_DEPTH[cfg["workload"]])
    return stable_hash(identity(identity_config(cfg, hardware, depth), trace_hash)), trace, trace_hash


#: knobs a builder resolves when a config leaves them unset (a default tile, every expert its own region, the
#: FIFO depth of the hardware, a SwiGLU stack's micro-batches): the record stores the value the run used
#: (``workload.params``)
RESOLVED_KNOBS = ("tiling", "tile_n", "tile_f", "tile_m", "regions", "strategy", "softmax", "compute_bw",
                  "channel_depth", "kv_heads", "micro_batches")


def resolved_knobs(cfg: Mapping, params: Mapping, channel_depth: int | None) -> dict:
    """The record's knob columns: the config's knobs, where unset the value the run used.

    An unset knob of :data:`RESOLVED_KNOBS` that applies to the workload takes the builder's value from
    ``params`` (``tile_n`` 32 of a static MoE layer, ``regions`` = experts, ``compute_bw``...), and
    ``channel_depth`` the run's default FIFO depth; knobs the run did not use (a dynamic layer's ``tile_n``)
    stay null. The run id is not affected: it hashes the config as given (:func:`identity_config`), so runs that
    had one id keep it; two spellings of one run (a default given or left out) now record the same values,
    which is what :mod:`stepsim.insight.compare` and sweep tables pair and group by.
    """
    from stepsim.workloads.config import APPLIES_TO

    out = {k: cfg[k] for k in KNOBS}
    for k in RESOLVED_KNOBS:
        if out[k] is not None or cfg["workload"] not in APPLIES_TO.get(k, (cfg["workload"],)):
            continue
        value = channel_depth if k == "channel_depth" else params.get(k)
        if isinstance(value, (int, str)) and not isinstance(value, bool):
            out[k] = value
    return out


def _knob_depth(cfg: Mapping):
    """The ``channel_depth`` knob as a per-run depth (UNSET when the config leaves it unset)."""
    return UNSET if cfg.get("channel_depth") is None else cfg["channel_depth"]


# --- the record -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Timings:
    """Wall times (s) measured around a run by its caller; None = not measured."""

    build_s: float | None = None
    total_s: float | None = None


@dataclass(frozen=True)
class RunResult:
    """The record of one run: a flat row (:data:`SCHEMA`) plus, for simulations, per-unit/channel tables.

    Build one with :func:`run_config`, :meth:`from_metrics` or :meth:`from_simulation`.

    Attributes
    ----------
    row : dict
        Column name -> plain Python value (int, float, str or None), in :data:`SCHEMA` order.
    config : dict
        The run's identity config (:func:`identity_config`): the normalized knobs and ``mode`` without path
        knobs, plus the resolved hardware values, FIFO depth and timing-model version; :attr:`run_id` hashes it
        with the trace's content hash.
    """

    row: dict
    config: dict
    #: per-unit and per-channel counters, {column: values} (Arrow tables are made when asked for)
    _units: dict | None = field(default=None, repr=False)
    _channels: dict | None = field(default=None, repr=False)
    #: ``run_config(..., timeline=N)``: the run's :class:`stepsim.simulation.timeline.Timeline` (not part of the record)
    timeline: object | None = field(default=None, repr=False)

    # --- constructors ---------------------------------------------------------------------------------
    @classmethod
    def from_metrics(cls, workload: Workload, config: Mapping, *, convention: str | None = None,
                     source: str | None = None, timings: Timings | None = None) -> RunResult:
        """Record of a metrics run: the workload's symbolic totals with its trace values.

        Parameters
        ----------
        workload : Workload
            Built from ``config`` (e.g. by :func:`~stepsim.workloads.config.workload_from_config`).
        config : mapping
            The run's knobs (validated again; ``mode`` is set to ``"metrics"``).
        convention : {"published", "paper"}, optional
            On-chip accounting; overrides ``config["convention"]``.
        source : str, optional
            Label for error messages (a file name).
        timings : Timings, optional
            Build / total wall times measured by the caller.
        """
        cfg = _run_config(config, "metrics", convention, source, workload)
        return cls._make(workload, cfg, None, resolve_hardware(cfg, workload, source=source), timings)

    @classmethod
    def from_simulation(cls, workload: Workload, sim_result, config: Mapping, *, convention: str | None = None,
                        hardware: Hardware | None = None, source: str | None = None,
                        timings: Timings | None = None, mode: str = "simulate") -> RunResult:
        """Record of a simulation run (see :meth:`from_metrics`; ``mode`` is ``"simulate"`` unless a functional
        run says ``"functional"`` or ``"check"``).

        Parameters
        ----------
        sim_result : stepsim.simulation.simulate.SimResult
            What :func:`stepsim.simulation.simulate.simulate` returned for ``workload``.
        hardware : Hardware, optional
            The hardware simulated (for ``hbm_bytes_per_cycle``); default: resolved from ``config``.
        """
        cfg = _run_config(config, mode, convention, source, workload)
        hardware = hardware or resolve_hardware(cfg, workload, source=source)
        return cls._make(workload, cfg, sim_result, hardware, timings)

    @classmethod
    def _make(cls, workload: Workload, cfg: dict, sim, hardware: Hardware, timings: Timings | None) -> RunResult:
        start = time.perf_counter()
        values = workload.op_values(cfg["convention"])
        metrics = workload.metrics(cfg["convention"], values)
        metrics_s = time.perf_counter() - start
        trace = resolved_trace(cfg)
        trace_hash = trace_sha256(trace) if trace is not None else None
        depth = getattr(sim, "channel_depth", None) if sim is not None else None
        if depth is None:  # a metrics run: the depth a simulation of it would use
            depth = resolve_channel_depth(_knob_depth(cfg), hardware, workload.channel_depth)
        ident = identity_config(cfg, hardware, depth)
        run_id = stable_hash(identity(ident, trace_hash))
        # trace_path absolute: `stepsim report` run from another folder finds the trace (the knob keeps the path
        # as given, relative or not)
        row = {"run_id": run_id, "mode": cfg["mode"], "stepsim_version": __version__,
               "trace_path": None if trace is None else Path(trace).resolve().as_posix(),
               "trace_sha256": trace_hash, "hardware_name": hardware.name,
               **resolved_knobs(cfg, workload.params, depth), "params": canonical_json(workload.params)}
        row.update(_measurements(workload, metrics, sim, hardware, values, depth))
        timings = timings or Timings()
        row.update(build_s=timings.build_s, metrics_s=metrics_s, lower_s=_attr(sim, "lower_s"),
                   compile_s=_attr(sim, "compile_s"), sim_wall_s=_attr(sim, "sim_wall_s"), total_s=timings.total_s)
        row = {name: row.get(name) for name in COLUMN_NAMES}  # check_* stay null unless run_config checks
        units = channels = None
        if sim is not None:
            units = _unit_columns(run_id, sim, workload)
            channels = _channel_columns(run_id, sim)
        return cls(row=row, config=ident, _units=units, _channels=channels)

    # --- views ----------------------------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        """Hex SHA-256 identifying the configuration, mode and trace content of this run."""
        return self.row["run_id"]

    @property
    def simulated(self) -> bool:
        """True for records of an engine run (every mode but ``"metrics"``)."""
        return self.row["mode"] != "metrics"

    def to_arrow(self) -> pa.Table:
        """The row as a one-row table with :data:`SCHEMA` (units in field metadata)."""
        return pa.Table.from_pylist([self.row], schema=arrow_schema(COLUMNS))

    def unit_table(self) -> pa.Table:
        """Per-unit counters (:data:`UNIT_SCHEMA`), one row per engine unit.

        Raises
        ------
        NotSimulatedError
            This is a metrics run.
        """
        return self._need_simulation("unit counters", self._units, UNIT_COLUMNS)

    def channel_table(self) -> pa.Table:
        """Per-channel counters (:data:`CHANNEL_SCHEMA`), one row per FIFO channel.

        Raises
        ------
        NotSimulatedError
            This is a metrics run.
        """
        return self._need_simulation("channel counters", self._channels, CHANNEL_COLUMNS)

    def _need_simulation(self, what: str, data: dict | None, columns: tuple) -> pa.Table:
        if data is None:
            raise NotSimulatedError(f"run {self.run_id[:16]} ({self.row['workload']}) is a metrics run "
                                    f"(mode 'metrics'); {what} exist only for mode 'simulate'")
        return pa.Table.from_pydict(data, schema=arrow_schema(columns))

    # --- output ---------------------------------------------------------------------------------------
    def provenance(self) -> dict[str, str]:
        """Schema metadata for written files: stepsim version, identity config (JSON) and hash, trace hash."""
        return provenance_metadata(identity(self.config, self.row["trace_sha256"]),
                                   trace_hash=self.row["trace_sha256"])

    def write(self, out_dir: str | os.PathLike, partition_cols: tuple[str, ...] = ()) -> dict[str, Path]:
        """Write the record under ``out_dir`` atomically, with provenance metadata.

        Parameters
        ----------
        out_dir : path
            Root folder (created if needed).
        partition_cols : tuple of str
            Row columns that become hive folder levels (``("workload", "mode")`` gives
            ``out_dir/workload=swiglu/mode=simulate/``); they are dropped from the row file and restored as
            strings by :func:`read_runs`. Default: none, files go straight into ``out_dir``.

        Returns
        -------
        dict
            ``{"run": path}`` plus ``"units"`` and ``"channels"`` for simulation runs. Writing the same
            configuration again replaces the same files (the names derive from :attr:`run_id`).

        Raises
        ------
        ConfigError
            A partition column is unknown or null in this row.
        """
        ident = identity(self.config, self.row["trace_sha256"])
        extra = {TRACE_HASH_KEY: self.row["trace_sha256"]} if self.row["trace_sha256"] else None
        # the row and its tables appear together or not at all: a record without its channel table is a run
        # folder `stepsim report` rejects (a full disk after the first file left one)
        with published_folder(out_dir) as root:
            paths = {"run": write_partitioned(self.to_arrow(), root, partition_cols, config=ident,
                                              metadata=extra)}
            if self.simulated:
                folder = partition_dir(root, self.row, partition_cols)
                meta = self.provenance()
                for kind, table in (("units", self.unit_table()), ("channels", self.channel_table())):
                    path = folder / f"{_KINDS[kind][0]}{self.run_id[:16]}.parquet"
                    paths[kind] = write_parquet_atomic(table, path, meta)
        # a new folder was built under a temporary name: name the files where they are now
        return {kind: Path(out_dir) / path.relative_to(root) for kind, path in paths.items()}


def _attr(sim, name: str):
    return None if sim is None else getattr(sim, name)


def _run_config(config: Mapping, mode: str, convention: str | None, source: str | None,
                workload: Workload) -> dict:
    """Normalize ``config`` for a run of ``mode``; check it describes ``workload``."""
    override = {"mode": mode} if convention is None else {"mode": mode, "convention": convention}
    cfg = normalize_config({**config, **override}, source=source)
    if workload.name != cfg["workload"] and cfg["workload"] != "program":  # a user program returns any kind
        prefix = f"{source}: " if source else ""
        raise ConfigError(f"{prefix}config key 'workload' is {cfg['workload']!r} but the workload given is "
                          f"{workload.name!r}")
    return cfg


def _measurements(workload: Workload, metrics: Mapping, sim, hardware: Hardware, values: dict,
                  depth: int) -> dict[str, Any]:
    """Cycles, traffic, footprint, FLOPs, bounds, a deadlock proof, utilizations and event counts of one run
    (None = not measured); ``values`` is the workload's ``op_values``, ``depth`` the run's default FIFO depth."""
    allocated = allocated_compute_flops(workload)
    # every chip has its own HBM (docs/system.md): a multi-chip run's peak is the sum of its chips'
    chips = 1 + max((getattr(op, "chip", 0) for op in workload.graph.ops), default=0)
    hbm = hardware.hbm_peak_bytes_per_cycle * chips
    out = {
        "cycles": None, "off_chip_bytes": metrics["off_chip_bytes"], "off_chip_bytes_read": None,
        "off_chip_bytes_written": None, "off_chip_bytes_measured": None,
        "off_chip_bytes_symbolic": metrics["off_chip_bytes"], "on_chip_bytes": metrics["on_chip_bytes"],
        "on_chip_bytes_active": metrics["on_chip_bytes_active"], "flops": metrics["flops"],
        "graph_flops": metrics["graph_flops"], "algorithmic_flops": workload.algorithmic_flops,
        "allocated_compute_flops_per_cycle": allocated, "hbm_bytes_per_cycle": hbm,
        **cycle_bounds(workload, hardware, values), "link_cycles": link_cycles(workload),
        "deadlock_proof": getattr(prove_deadlock(workload, depth), "message", None),
        "compute_utilization": None, "off_chip_bw_utilization": None, "events": None, "fires": None,
    }
    if sim is not None:
        measured = int(sim.off_chip_bytes_read) + int(sim.off_chip_bytes_written)
        out.update(cycles=int(sim.cycles), off_chip_bytes=measured, off_chip_bytes_read=int(sim.off_chip_bytes_read),
                   off_chip_bytes_written=int(sim.off_chip_bytes_written), off_chip_bytes_measured=measured,
                   compute_utilization=_ratio(metrics["flops"], int(sim.cycles), allocated),
                   off_chip_bw_utilization=_ratio(measured, int(sim.cycles), hbm),
                   events=int(sim.events), fires=int(sim.fires))
    return out


def unit_labels(kinds: list[str], groups: list[str]) -> list[str]:
    """A stable label per unit: ``<group>/<kind>#<k>``, the k-th unit of that kind in that group, in program order
    (``expert 3/Matmul#1``). Unit names are numbered by position in the whole graph (``Map_130``), so one more
    operator anywhere renames every later unit; a label changes only when its own group changes, which lets
    ``stepsim compare`` match the units of two graphs of the same structure."""
    seen: dict[tuple[str, str], int] = {}
    labels = []
    for kind, group in zip(kinds, groups, strict=True):
        k = seen.get((group, kind), 0)
        seen[(group, kind)] = k + 1
        labels.append(f"{group}/{kind}#{k}")
    return labels


def _unit_columns(run_id: str, sim, workload: Workload) -> dict[str, list]:
    """Per-unit counters of ``sim`` (columns of SimResult.unit_counters: fires, busy, blocked in/out, clock), with
    each unit's operator class, group (``expert 3``; ``shared`` outside any group) and stable label."""
    from stepsim.graph.labels import graph_labels

    group_of, kind_of = graph_labels(workload.graph)
    counters = sim.unit_counters
    names = list(sim.unit_names)
    kinds = [_unit_kind(n, kind_of) for n in names]
    groups = [group_of.get(n, "shared") for n in names]
    cycles = int(sim.cycles)
    busy = [int(v) for v in counters[:, 1]]
    return {
        "run_id": [run_id] * len(names), "name": names, "kind": kinds, "group": groups,
        "label": unit_labels(kinds, groups),
        "fires": counters[:, 0].tolist(), "busy_cycles": busy, "blocked_in_cycles": counters[:, 2].tolist(),
        "blocked_out_cycles": counters[:, 3].tolist(), "final_clock": counters[:, 4].tolist(),
        "utilization": [b / cycles if cycles else None for b in busy],
        # bytes a Link unit carried (its busy cycles are its serialization, its utilization its occupancy)
        "bytes": _link_bytes(sim, names),
    }


def _link_bytes(sim, names: list) -> list:
    """Per unit: the bytes a Link carried, None for every other unit (and for results without the counter)."""
    carried = getattr(sim, "link_bytes", None)
    kinds = getattr(sim, "unit_opcodes", None)
    if carried is None or kinds is None:
        return [None] * len(names)
    return [int(b) if k == "Link" else None for b, k in zip(carried, kinds)]


def _channel_columns(run_id: str, sim) -> dict[str, list]:
    """Per-channel counters of ``sim`` (columns of SimResult.channel_counters: pushes, peak occupancy)."""
    counters = sim.channel_counters
    names = list(sim.channel_names)
    return {"run_id": [run_id] * len(names), "name": names, "pushes": counters[:, 0].tolist(),
            "peak_occupancy": counters[:, 1].tolist()}


# --- running and collecting -------------------------------------------------------------------------------
@gc_paused  # the build, lowering and records allocate long-lived objects: see stepsim.graph.gcpause
def run_config(config: Mapping, *, source: str | None = None, progress=None, timeline: int = 0,
               force: bool = False) -> RunResult:
    """Build and run one configuration; ``config["mode"]`` is one of ``"metrics"`` (default), ``"simulate"``,
    ``"functional"`` or ``"check"`` (see the module docstring).

    Parameters
    ----------
    config : mapping
        Knobs of :mod:`stepsim.workloads.config` plus ``mode``; plain data (picklable, JSON-able).
    source : str, optional
        Label for error messages (e.g. the sweep file and point).
    progress : callable, optional
        ``progress(events, cycle)`` between engine slices (:func:`stepsim.base.progress.engine_progress`).
    timeline : int
        Simulations: record a timeline of at most this many records into ``RunResult.timeline``
        (:mod:`stepsim.simulation.timeline`); 0 records nothing. It changes no result, so it is not part of the identity.
    force : bool
        Simulate even when the estimated work is over the limit (:mod:`stepsim.kernels.run_size`).

    Returns
    -------
    RunResult
        With ``build_s`` and ``total_s`` measured.

    Raises
    ------
    ConfigError
        Invalid config (names the key and ``source``).
    TraceError
        Unreadable trace.
    SimulationError
        The engine stopped abnormally (deadlock, ...).
    """
    start = time.perf_counter()
    cfg = normalize_config(config, source=source)
    workload = _build(cfg, source)
    build_s = time.perf_counter() - start
    hardware = resolve_hardware(cfg, workload, source=source)
    record = record_of(workload, hardware, cfg, source=source, build_s=build_s, progress=progress,
                       timeline=timeline, force=force)
    return dataclasses.replace(record, row=dict(record.row, total_s=time.perf_counter() - start))


def record_of(workload, hardware, cfg: dict, *, source: str | None, build_s: float, progress=None,
              timeline: int | None = None, force: bool = False) -> RunResult:
    """The record of ``workload`` built from the normalized ``cfg`` (its metrics, or its simulation on
    ``hardware`` in ``cfg["mode"]``), without ``total_s``: :func:`run_config`'s, and a mapped run's
    (:mod:`stepsim.mapping.runs`). ``build_s``: seconds the workload took to build."""
    if cfg["mode"] == "metrics":
        return RunResult.from_metrics(workload, cfg, source=source, timings=Timings(build_s=build_s))
    from stepsim.simulation.simulate import simulate

    mode = cfg["mode"]
    if mode == "check" and workload.name == "onnx":  # the reference's memory, before the simulation runs
        from stepsim.frontend.check import check_reference_fits

        check_reference_fits(workload)
    sim = simulate(workload, hardware, channel_depth=_knob_depth(cfg), functional=mode in ("functional", "check"),
                   progress=progress, timeline=timeline or False, force=force)
    record = RunResult.from_simulation(workload, sim, cfg, hardware=hardware, source=source,
                                       timings=Timings(build_s=build_s), mode=mode)
    record = dataclasses.replace(record, timeline=sim.timeline)
    if mode == "check":
        record = dataclasses.replace(record, row={**record.row, **check_columns(workload, sim)})
    return record


def is_onnx_program(cfg: Mapping) -> bool:
    """Whether a config's workload is an ONNX model (``stepsim run model.onnx``: the program knob names the file)."""
    program = cfg.get("program")
    return cfg.get("workload") == "program" and isinstance(program, str) and program.endswith(".onnx")


def build_workload(config: Mapping, *, source: str | None = None) -> Workload:
    """The workload a run config describes, built as :func:`run_config` builds it (an ONNX model through the
    front end, with its routing trace or teacher routing; FIFO depths files applied)."""
    return _build(normalize_config(config, source=source), source)


def _build(cfg: Mapping, source: str | None) -> Workload:
    """The workload of a normalized config: an ONNX model through the front end, else the kinds' builders."""
    if not is_onnx_program(cfg):
        return build_normalized(cfg, source=source)
    from stepsim.frontend import RoutingTrace, from_onnx  # the front end sits below results (docs/architecture.md)
    from stepsim.frontend.fusion import UnknownSpillError

    # token ids seeded; a MoE block routed by the trace given (--trace, as the moe workload), else as its router
    # chooses on seeded inputs (teacher forcing)
    routing = "teacher"
    if cfg.get("trace") is not None:
        routing = RoutingTrace(cfg["trace"], iteration=cfg.get("iteration"), layer=cfg.get("layer"))
    spill = tuple(n.strip() for n in cfg["spill"].split(",") if n.strip()) if cfg.get("spill") else ()
    try:
        workload = from_onnx(cfg["program"], values="seeded", routing=routing, fuse=not cfg.get("no_fuse"),
                             spill=spill)
    except UnknownSpillError as exc:  # named by its flag or config key, as every other knob's error
        raise ConfigError(f"{knob_where('spill', source)}: {exc.detail}") from None
    if cfg.get("fifo_depths") is not None:
        from stepsim.graph.depths_file import apply_depths_file

        apply_depths_file(workload, cfg["fifo_depths"])
    return workload


def check_columns(workload: Workload, sim) -> dict[str, Any]:
    """The ``check_*`` columns of a functional run: the largest relative error over the stored tensors
    (:func:`stepsim.workloads.reference.max_rel_error`), the smallest tolerance, and whether every tensor is
    within its own tolerance (an ONNX model's against onnx's reference evaluator, :mod:`stepsim.frontend.check`)."""
    if workload.name == "onnx":
        from stepsim.frontend.check import check_outputs
    else:
        from stepsim.workloads.reference import check_outputs

    checks = check_outputs(workload, sim.inputs, sim.outputs).values()
    return {"check_max_rel_error": max(c.error for c in checks), "check_tolerance": min(c.tolerance for c in checks),
            "check_passed": all(c.passed for c in checks)}


def concat_runs(runs: Iterable[RunResult], kind: str = "runs") -> pa.Table:
    """Concatenate many records into one table with the unified schema.

    Parameters
    ----------
    runs : iterable of RunResult
    kind : {"runs", "units", "channels"}
        Rows (:data:`SCHEMA`), or the per-unit / per-channel tables of the simulation runs among ``runs``
        (metrics runs contribute no rows there).

    Returns
    -------
    pyarrow.Table
        Empty (with the schema) when there is nothing to concatenate.
    """
    if kind not in _KINDS:
        raise ConfigError(f"kind must be one of {', '.join(_KINDS)}, got {kind!r}")
    runs = list(runs)
    if kind == "runs":
        return pa.Table.from_pylist([r.row for r in runs], schema=arrow_schema(COLUMNS))
    tables = [r.unit_table() if kind == "units" else r.channel_table() for r in runs if r.simulated]
    return pa.concat_tables(tables) if tables else arrow_schema(_KINDS[kind][1]).empty_table()


def read_runs(root: str | os.PathLike, partition_cols: tuple[str, ...] = (), kind: str = "runs",
              filter=None) -> pa.Table:
    """Read every record file of ``kind`` under ``root`` (as written by :meth:`RunResult.write`).

    Parameters
    ----------
    root : path
        Root folder.
    partition_cols : tuple of str
        The ``partition_cols`` the records were written with (restored as string columns).
    kind : {"runs", "units", "channels"}
    filter : pyarrow.compute.Expression, optional
        Row filter.

    Raises
    ------
    ConfigError
        Unknown ``kind`` or no file of that kind under ``root``.
    """
    if kind not in _KINDS:
        raise ConfigError(f"kind must be one of {', '.join(_KINDS)}, got {kind!r}")
    return read_results(root, partition_cols, filter=filter, pattern=f"{_KINDS[kind][0]}*.parquet")
