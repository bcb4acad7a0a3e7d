"""Build a :class:`~stepsim.workloads.base.Workload` from a plain mapping of knobs, with validation.

The knobs are the flags of ``stepsim metrics`` / ``stepsim run`` (``--tile-n`` is ``tile_n``), so a sweep file,
a Python dict and the command line describe a run the same way; :func:`stepsim.cli.args.build_workload`
is a thin wrapper over :func:`workload_from_config`.

Example
-------
>>> w = workload_from_config({"workload": "swiglu", "tile_m": 32, "tile_n": 64})
>>> w.params["tile_m"], w.hardware
(32, 'step-hdl')

Validation (every failure is a :class:`~stepsim.base.errors.ConfigError` whose message starts with ``source: ``
when a ``source`` label such as a file name is given):

* an unknown key names the key (with a close match, if any) and lists the known keys;
* a wrong type or value names the key and the value;
* a knob that the chosen workload does not use is refused (``tile_m`` for ``moe``, ``tile_n`` with dynamic
  tiling, ``hidden`` without ``model="custom"``), so two configs that build the same program never differ
  only in an ignored knob;
* ``model`` is a preset name, an alias (``mixtral``, ``qwen``: stored as the preset's canonical name, so both
  spellings give one run id), a Hugging Face ``config.json`` path or ``custom``
  (:mod:`stepsim.models.presets`);
* errors raised by the builders themselves (a tile that does not divide a dimension, an unknown model) are
  re-raised as ConfigError with the ``source`` prefix.

Defaults applied here (the command line's defaults): ``model="mixtral-8x7b"`` and ``tiling="static"`` for
``moe``; ``tile_m=16``, ``tile_n=16`` for ``swiglu``; ``strategy="dynamic"`` for ``attention``, whose
``softmax`` is ``"stable"`` in modes ``functional`` / ``check`` and otherwise ``"plain"`` (the artifact's form,
whose cycles the paper reports); ``convention="published"`` and ``mode="metrics"`` for all. Every other unset knob keeps the builder's default
(e.g. MoE ``tile_n`` 32, ``compute_bw`` per experiment; see the builders).
"""

from __future__ import annotations

import difflib
import numbers
import os
from collections.abc import Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any

from stepsim.base.errors import ArgumentError, ConfigError
from stepsim.workloads.base import Workload
from stepsim.workloads.collective import ALGORITHMS as COLLECTIVE_ALGORITHMS
from stepsim.workloads.collective import OPS as COLLECTIVE_OPS
from stepsim.workloads.kinds import COMMON_KNOBS, KINDS

if TYPE_CHECKING:
    from stepsim.base.hardware import Hardware

#: workload kinds (:mod:`stepsim.workloads.kinds`); ``program`` is a user's ``file.py:function``
#: (:mod:`stepsim.workloads.program.build`)
WORKLOADS = tuple(KINDS)
MODES = ("metrics", "simulate", "functional", "check")

#: every workload knob, in the order of the result schema's config columns
KNOBS: tuple[str, ...] = (
    "workload", "model", "hidden", "intermediate", "experts", "top_k", "trace", "iteration", "layer", "batch_id",
    "tiling", "tile_n", "tile_f", "tile_m", "regions", "strategy", "softmax", "compute_bw", "channel_depth",
    "fifo_depths", "hardware", "convention", "program", "routing", "kv_lengths", "kv_heads",
    "op", "bytes", "algorithm", "system", "ep", "placement", "tp", "layers", "pp", "micro_batches",
    "no_fuse", "spill",
)
#: keys a config mapping may hold: the knobs plus ``mode`` (one of MODES: "metrics", "simulate", "functional" =
#: simulate with real values, "check" = functional plus the NumPy reference comparison; used by
#: :func:`stepsim.results.records.run_config`, validated and otherwise ignored by :func:`workload_from_config`)
KNOWN_KEYS: frozenset[str] = frozenset(KNOBS) | {"mode"}

#: string knobs with a fixed set of values
CHOICES: dict[str, tuple[str, ...]] = {
    "workload": WORKLOADS,
    "tiling": ("static", "dynamic"),
    "strategy": ("coarse", "interleave", "dynamic"),
    "softmax": ("plain", "stable"),
    "convention": ("published", "paper"),
    "mode": MODES,
    "op": COLLECTIVE_OPS,
    "algorithm": COLLECTIVE_ALGORITHMS,
    "placement": ("contiguous", "round-robin", "load-balanced"),
}
#: integer knobs and their smallest allowed value
INT_MINIMUM: dict[str, int] = {
    "hidden": 1, "intermediate": 1, "experts": 1, "top_k": 1, "iteration": 0, "layer": 0, "batch_id": 0,
    "tile_n": 1, "tile_f": 1, "tile_m": 1, "regions": 1, "compute_bw": 1, "channel_depth": 1, "kv_heads": 1,
    "bytes": 1, "ep": 1, "tp": 1, "layers": 1, "pp": 1, "micro_batches": 1,
}
#: largest value of every int knob: sizes, tiles, depths and FLOP rates beyond it would overflow the engine's
#: int64 arithmetic (products of a tile and a dimension) long before they meant anything
INT_MAXIMUM = 2**31 - 1
#: tighter limits where a knob multiplies what is built in memory before anything is estimated: a stack holds
#: every layer's (and micro-batch's) operators (a SwiGLU layer is tens of operators, a MoE layer hundreds; 100,000
#: layers took minutes and gigabytes before the first cycle), and the deepest models have under 200 layers
BUILD_MAXIMUM = {"layers": 1024, "micro_batches": 4096}
#: free-form string knobs (``trace`` and ``fifo_depths`` also accept os.PathLike); ``fifo_depths`` is a
#: ``stepsim size-fifos`` file whose per-channel depths override ``channel_depth`` (checked against the graph)
STRING_KEYS = ("model", "trace", "fifo_depths", "hardware", "program", "routing", "kv_lengths", "system", "spill")
#: boolean knobs (flags): ``no_fuse`` (``--no-fuse``: an ONNX model's edges all spill)
BOOL_KEYS = ("no_fuse",)
#: knobs of an ONNX model only (a program that is a ``file.py:function`` refuses them): its MoE routing trace and
#: its fusion policy (``--no-fuse``; ``--spill NAME[,NAME...]``: values whose edges spill, or ``VALUE->CONSUMER``)
ONNX_KNOBS = ("trace", "iteration", "layer", "no_fuse", "spill")
#: knobs used by some workloads only (absent here: used by every workload), from the kinds' registry entries
APPLIES_TO: dict[str, tuple[str, ...]] = {
    knob: tuple(k.name for k in KINDS.values() if knob in k.knobs)
    for knob in KNOBS if knob != "workload" and knob not in COMMON_KNOBS}
CUSTOM_MODEL_KEYS = ("hidden", "intermediate", "experts", "top_k")
#: defaults filled in by :func:`normalize_config` (per workload, then for all)
WORKLOAD_DEFAULTS: dict[str, dict[str, Any]] = {k.name: dict(k.defaults) for k in KINDS.values()}
COMMON_DEFAULTS: dict[str, Any] = {"convention": "published", "mode": "metrics"}

BUNDLED_TRACES = {"mixtral-8x7b": "synthetic_routing_mixtral_b64.arrow",
                  "qwen3-30b-a3b": "synthetic_routing_qwen_b64.arrow",
                  "attention": "synthetic_kv_b16.arrow"}


def bundled_trace(key: str) -> str:
    """Path of a synthetic trace shipped with stepsim (used when no ``trace`` is given).

    ``key`` is a MoE model preset name or ``"attention"``.
    """
    if key not in BUNDLED_TRACES:
        raise ConfigError(f"no bundled trace for {key!r}; pass --trace PATH (config key 'trace')")
    path = resources.files("stepsim") / "data" / BUNDLED_TRACES[key]
    if not path.is_file():
        raise ConfigError(f"no bundled trace for {key!r}; pass --trace PATH (config key 'trace')")
    return str(path)


# --- validation -------------------------------------------------------------------------------------------
#: the ``source`` of a config built from command-line flags: errors then name the flag (``--tile-n``)
COMMAND_LINE = "command line"


def _prefix(source: str | None) -> str:
    return f"{source}: " if source and source != COMMAND_LINE else ""


def knob_where(key: str, source: str | None) -> str:
    """How an error names knob ``key`` of a config from ``source``: ``"--spill"`` on the command line, else
    ``"file.toml: config key 'spill'"``."""
    return f"{_prefix(source)}{_key(key, source)}"


def _key(key: str, source: str | None) -> str:
    """How an error names a knob: the flag the user typed on the command line, else the config key."""
    return f"--{key.replace('_', '-')}" if source == COMMAND_LINE else f"config key {key!r}"


def _check_known(config: Mapping, source: str | None) -> None:
    for key in config:
        if key not in KNOWN_KEYS:
            close = difflib.get_close_matches(str(key), sorted(KNOWN_KEYS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{_prefix(source)}unknown config key {key!r}{hint}; "
                              f"known keys: {', '.join(sorted(KNOWN_KEYS))}")


def _check_value(key: str, value: Any, source: str | None) -> Any:
    """The value, type-checked and converted to a plain int / str; None passes (unset)."""
    if value is None:
        return None
    where = f"{_prefix(source)}{_key(key, source)}"
    if key in INT_MINIMUM:
        low = INT_MINIMUM[key]
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < low:
            raise ConfigError(f"{where} must be an int >= {low}, got {value!r}")
        if int(value) > INT_MAXIMUM:
            raise ConfigError(f"{where} must be at most {INT_MAXIMUM:,} (2**31 - 1), got {value!r}")
        if key in BUILD_MAXIMUM and int(value) > BUILD_MAXIMUM[key]:
            raise ConfigError(f"{where} must be at most {BUILD_MAXIMUM[key]:,} (each one's operators are built in "
                              f"memory before the run), got {value!r}")
        return int(value)
    if key in BOOL_KEYS:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if key in CHOICES:
        if not isinstance(value, str) or value not in CHOICES[key]:
            raise ConfigError(f"{where} must be one of {', '.join(map(repr, CHOICES[key]))}, got {value!r}")
        return value
    if key in ("trace", "fifo_depths", "routing", "kv_lengths", "system") and isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where} must be a non-empty string, got {value!r}")
    if key == "spill" and not all(name.strip() for name in value.split(",")):
        # ',,' named nothing and ran as if --spill were not given; 'a,,b' hides a name lost in editing
        raise ConfigError(f"{where} {value!r}: an empty name in the list; expected NAME[,NAME...], each a value "
                          "or VALUE->CONSUMER")
    return value


def _check_applicable(cfg: dict, source: str | None) -> None:
    workload = cfg["workload"]
    for key, workloads in APPLIES_TO.items():
        if cfg.get(key) is not None and workload not in workloads:
            raise ConfigError(f"{_prefix(source)}{_key(key, source)} does not apply to workload {workload!r} "
                              f"(it applies to: {', '.join(workloads)})")
    if workload == "program" and not str(cfg.get("program") or "").endswith(".onnx"):
        for key in ONNX_KNOBS:
            if cfg.get(key) is not None:
                what = "its fusion" if key in ("no_fuse", "spill") else "the routing of its MoE blocks"
                raise ConfigError(f"{_prefix(source)}{_key(key, source)} applies to a program only when it is an "
                                  f"ONNX model (.onnx: {what}), got {cfg.get('program')!r}")
    if workload == "program" and cfg.get("trace") is None:
        for key in ("iteration", "layer"):
            if cfg.get(key) is not None:  # no bundled trace for a model file: nothing to pick a batch from
                raise ConfigError(f"{_prefix(source)}{_key(key, source)} picks a batch of the routing trace; "
                                  f"give the trace with {_key('trace', source)}")
    if workload not in ("moe", "decoder"):
        return
    if workload == "moe" and cfg.get("model") != "custom":
        for key in CUSTOM_MODEL_KEYS:
            if cfg.get(key) is not None:
                raise ConfigError(f"{_prefix(source)}{_key(key, source)} only applies with model 'custom' "
                                  f"(model is {cfg.get('model')!r})")
    if cfg.get("tiling") == "dynamic" and cfg.get("tile_n") is not None:
        raise ConfigError(f"{_prefix(source)}{_key('tile_n', source)} does not apply to tiling 'dynamic' "
                          f"(dynamic tiling packs each expert's tokens into one tile)")


def _check_hardware_name(name: str | None, source: str | None) -> None:
    from stepsim.base.hardware import PRESETS

    if name is not None and not name.endswith(".toml") and name not in PRESETS:
        raise ConfigError(f"{_prefix(source)}{_key('hardware', source)} must be a preset "
                          f"({', '.join(sorted(PRESETS))}) or a .toml file, got {name!r}")


def normalize_config(config: Mapping, *, source: str | None = None) -> dict[str, Any]:
    """Validate ``config`` and return every key of :data:`KNOWN_KEYS` with defaults applied (None = unset).

    Parameters
    ----------
    config : mapping of str to plain values
        Knobs (see :data:`KNOBS`) plus an optional ``mode``; ``workload`` is required. A value of None
        means "unset".
    source : str, optional
        Label of where the config came from (a file name, ``"sweep point 7"``); prefixes every message.

    Returns
    -------
    dict
        Keys in :data:`KNOBS` order, then ``mode``; ints are Python ints, ``trace`` a string path.

    Raises
    ------
    ConfigError
        Not a mapping, unknown key, missing ``workload``, wrong type or value, or a knob that does not apply.
    """
    if not isinstance(config, Mapping):
        raise ConfigError(f"{_prefix(source)}a config must be a mapping of knobs, got {type(config).__name__}")
    _check_known(config, source)
    cfg = {key: _check_value(key, config.get(key), source) for key in (*KNOBS, "mode")}
    if cfg["workload"] is None:
        raise ConfigError(f"{_prefix(source)}missing required config key 'workload' "
                          f"(one of {', '.join(WORKLOADS)})")
    if cfg["model"] is not None:  # one name per model in records and run ids: aliases become the preset name
        from stepsim.models.presets import canonical_model_name

        cfg["model"] = canonical_model_name(cfg["model"])
    if cfg["no_fuse"] is False:  # the default spelled out: one run id, one record, whether given or not
        cfg["no_fuse"] = None
    for key, value in {**WORKLOAD_DEFAULTS[cfg["workload"]], **COMMON_DEFAULTS}.items():
        if cfg[key] is None:
            cfg[key] = value
    if cfg["workload"] in ("attention", "decoder") and cfg["softmax"] is None:
        # runs with real values use the numerically stable form; cycle and metric runs the artifact's form
        cfg["softmax"] = "stable" if cfg["mode"] in ("functional", "check") else "plain"
    _check_applicable(cfg, source)
    _check_hardware_name(cfg["hardware"], source)
    return cfg


# --- building ---------------------------------------------------------------------------------------------
def resolved_trace(cfg: Mapping) -> str | None:
    """Trace path a normalized config reads: its ``trace``, else the bundled one (a routing trace per model,
    one decode batch for attention); None for a kind that reads no trace (and for a program not given one)."""
    slot = KINDS[cfg["workload"]].trace
    if cfg["workload"] == "program":  # an ONNX model's routing trace, when given (no bundled one)
        return cfg.get("trace")
    if slot is None:
        return None
    if cfg["workload"] == "decoder":  # its routing slot (the KV lengths enter the identity beside it)
        return cfg.get("routing")
    if cfg.get("trace") is not None:
        return cfg["trace"]
    return bundled_trace(cfg["model"] if slot == "routing" else "attention")


def bandwidth_kwargs(cfg: Mapping) -> dict[str, int]:
    """The ``compute_bw`` (FLOPs/cycle) and ``channel_depth`` (elements) knobs a config sets, as builder keywords."""
    return {key: cfg[key] for key in ("compute_bw", "channel_depth") if cfg.get(key) is not None}


def compute_bw_kwargs(cfg: Mapping) -> dict[str, int]:
    """The ``compute_bw`` knob (FLOPs/cycle) a config sets, as a builder keyword: for the builders that fix their
    experiment's FIFO depth (:func:`apply_channel_depth` overrides it after the build)."""
    return {"compute_bw": cfg["compute_bw"]} if cfg.get("compute_bw") is not None else {}


def apply_channel_depth(workload: Workload, cfg: Mapping) -> Workload:
    """``workload`` with the config's ``channel_depth`` knob (elements), when set, as its depth and in its
    ``params`` (what its record says it ran with)."""
    if cfg.get("channel_depth") is not None:
        workload.channel_depth = cfg["channel_depth"]
        workload.params["channel_depth"] = cfg["channel_depth"]
    return workload


def build_normalized(cfg: Mapping, *, source: str | None = None) -> Workload:
    """Build the workload of a config already passed through :func:`normalize_config`.

    Raises
    ------
    ConfigError
        A builder refused a value (message prefixed with ``source``). Trace errors keep their own type.
    """
    try:
        workload = KINDS[cfg["workload"]].function("build")(cfg)
        if cfg.get("fifo_depths") is not None:
            from stepsim.graph.depths_file import apply_depths_file

            apply_depths_file(workload, cfg["fifo_depths"], resolved_trace(cfg))
        return workload
    except (ArgumentError, ConfigError) as exc:
        if source is None and isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{_prefix(source)}{exc}") from exc


def resolve_hardware(cfg: Mapping, workload: Workload | None = None, *, source: str | None = None) -> Hardware:
    """The :class:`~stepsim.base.hardware.Hardware` a normalized config runs on.

    ``cfg["hardware"]`` (a preset name or a TOML file) if set, else the workload experiment's preset (that of
    ``workload``, or without one :data:`stepsim.workloads.kinds.WORKLOAD_HARDWARE` of the config's workload kind).

    Raises
    ------
    ConfigError
        Unknown preset, unreadable TOML or unknown hardware key (message prefixed with ``source``).
    """
    from stepsim.base.hardware import Hardware
    from stepsim.workloads.kinds import WORKLOAD_HARDWARE

    name = cfg.get("hardware") or (workload.hardware if workload is not None else WORKLOAD_HARDWARE[cfg["workload"]])
    if cfg.get("system") is not None and cfg.get("hardware") is None:  # many chips: the system names their hardware
        from stepsim.base.errors import SystemConfigError
        from stepsim.base.system import System

        try:
            name = System.load(cfg["system"]).hardware_spec
        except SystemConfigError as exc:
            if source is None:
                raise
            raise ConfigError(f"{_prefix(source)}{exc}") from exc
    try:
        return Hardware.from_toml(name) if name.endswith(".toml") else Hardware.preset(name)
    except ConfigError as exc:
        if source is None:
            raise
        raise ConfigError(f"{_prefix(source)}{exc}") from exc


def workload_from_config(config: Mapping, *, source: str | None = None) -> Workload:
    """Validate a mapping of knobs and build its workload.

    Parameters
    ----------
    config : mapping
        Knobs named as in :data:`KNOBS` (``workload`` required; None = unset), optionally ``mode``.
    source : str, optional
        Where the config came from; prefixes error messages (e.g. ``"sweep.toml: unknown config key ..."``).

    Returns
    -------
    Workload
        Ready to measure (``.metrics()``) or simulate (:func:`stepsim.simulation.simulate.simulate`).

    Raises
    ------
    ConfigError
        Unknown key, bad type or value, inapplicable knob, or a value the builder refuses.
    TraceError
        The trace cannot be read (names the file).
    """
    cfg = normalize_config(config, source=source)
    return build_normalized(cfg, source=source)


#: config keys that decide the graph a depths file (:mod:`stepsim.graph.depths_file`) was sized for (FIFO defaults, hardware and accounting do not)
DEPTHS_MATCH_KEYS = ("workload", "model", "hidden", "intermediate", "experts", "top_k", "iteration", "layer", "batch_id",
              "tiling", "tile_n", "tile_f", "regions", "strategy", "softmax", "compute_bw")


def matches_depths_file(depths, config) -> bool:
    """Whether ``config`` (a run config) builds the workload ``depths`` was sized for: the same knobs of
    :data:`DEPTHS_MATCH_KEYS` and a trace among the ones it was sized on (by content hash)."""
    from stepsim.base.files import trace_sha256

    if depths.config is None:
        return False
    cfg = normalize_config(config)
    if any(cfg.get(key) != depths.config.get(key) for key in DEPTHS_MATCH_KEYS):
        return False
    trace = resolved_trace(cfg)
    return trace is not None and trace_sha256(trace) in depths.trace_hashes
