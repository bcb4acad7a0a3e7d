"""``stepsim run|metrics ... --schedule auto|paper|FILE``: one layer built with a mapped schedule (docs/mapping.md §6).

* ``paper``: the workload's own builder with the STeP paper's evaluation schedule, exactly as without the flag
  (:func:`stepsim.results.records.run_config`): the paper's cycles, records and run ids.
* ``auto``: the schedule the mapper chooses for the run's shape on its hardware (:func:`stepsim.mapping.map_layer`,
  cached), at the exact shape of the run's trace (tokens of the routing batch, requests of the decode batch), so
  ``stepsim map KIND --shape N`` shows the schedule an ``auto`` run of N tokens or requests uses.
* ``FILE``: a schedule written by ``stepsim map --out`` (:func:`stepsim.mapping.schedule.read_schedules`), checked
  against the run's kind and shape before the trace is simulated.

Without the flag a run on serving hardware (:func:`serving_hardware`) of a covered workload is ``auto``, every
other run ``paper``. Covered workloads (:data:`COVERED`): ``moe`` (kind ``ffn``: the MoE block; a dense FFN is one
expert, which ``stepsim map ffn`` maps but the ``moe`` workload does not build) and ``attention`` (kind ``decode``,
the dynamic strategy). The knobs a schedule sets (tiles, regions, ``compute_bw``) cannot be given beside it.

A mapped run's record holds the schedule in ``params["schedule"]`` (its kind, knobs, where it came from and the
compute units it uses) and its run id hashes the schedule's kind and knobs with the mapper's version:
two schedules never share a run id, and a paper run keeps the one it always had.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from pathlib import Path

from stepsim.base.errors import ConfigError
from stepsim.base.files import stable_hash
from stepsim.base.hardware import OVERRIDE_MARK, RESOURCE_FIELDS, Hardware
from stepsim.mapping.schedule import KNOBS, Schedule, read_schedules
from stepsim.mapping.units import Infeasible

#: the ``--schedule`` values that are not a file
CHOICES = ("auto", "paper")
#: the workloads a mapped schedule builds, and their mapped kind (:mod:`stepsim.mapping.kinds`)
COVERED = {"moe": "ffn", "attention": "decode"}
#: the preset whose base makes a hardware serving hardware (:func:`serving_hardware`)
SERVING_PRESET = "sn40l"
#: config knobs a mapped schedule sets or does not build (one chip, one layer): refused beside it
SCHEDULE_SETS = {
    "moe": ("tile_n", "tile_f", "regions", "compute_bw", "ep", "placement", "system", "tp", "algorithm", "layers",
            "pp", "micro_batches", "fifo_depths"),
    "attention": ("regions", "compute_bw", "fifo_depths"),
}


def serving_hardware(hardware: Hardware) -> bool:
    """Whether ``hardware`` is a serving chip, whose runs are mapped by default: the ``sn40l`` preset (or a file or
    overrides over it), or any hardware that sets its ``compute_units`` / ``memory_units`` explicitly. The paper's
    ``step-eval`` and ``step-hdl`` (and files over them) are not."""
    base = hardware.name.split(OVERRIDE_MARK, 1)[0]
    return base == SERVING_PRESET or any(f in hardware.explicit for f in RESOURCE_FIELDS)


def schedule_argument(value: str) -> str:
    """``--schedule``'s value: ``auto``, ``paper`` or a schedule file path (read later, before any work)."""
    if value in CHOICES:
        return value
    if not value.strip():
        raise ConfigError(f"--schedule must be auto, paper or a schedule file (stepsim map --out), got {value!r}")
    return value


def chosen(cfg: Mapping, hardware: Hardware, schedule: str | None) -> str:
    """The schedule a normalized config runs with: ``schedule`` as given, else ``auto`` for a covered workload on
    serving hardware and ``paper`` otherwise (module docstring)."""
    if schedule is not None:
        return schedule
    return "auto" if cfg["workload"] in COVERED and serving_hardware(hardware) else "paper"


def _check_covered(cfg: Mapping, schedule: str) -> str:
    """The mapped kind of the config's workload (a one-line error for a workload the mapper does not cover)."""
    kind = COVERED.get(cfg["workload"])
    if kind is None:
        covered = ", ".join(f"{w} (kind {k})" for w, k in COVERED.items())
        raise ConfigError(f"--schedule {_label(schedule)}: the mapper does not cover workload {cfg['workload']!r}; "
                          f"it maps {covered}; give --schedule paper")
    return kind


def _label(schedule: str) -> str:
    return schedule if schedule in CHOICES else "FILE"


def _check_knobs(cfg: Mapping, schedule: str, given: bool, hardware: Hardware) -> None:
    """Refuse the knobs the schedule sets (module docstring), naming the flag and why."""
    why = "" if given else f" (the default on serving hardware {hardware.name!r})"
    conflicts = [k for k in SCHEDULE_SETS[cfg["workload"]] if cfg.get(k) is not None]
    if cfg["workload"] == "moe" and cfg.get("tiling") == "dynamic":
        conflicts.insert(0, "tiling")
    if cfg["workload"] == "attention" and cfg.get("strategy") != "dynamic":
        conflicts.insert(0, "strategy")
    if conflicts:
        flag = "--" + conflicts[0].replace("_", "-")
        raise ConfigError(f"{flag} does not apply with --schedule {_label(schedule)}{why}: the mapped schedule sets "
                          f"the tiles, regions and compute_bw of one layer on one chip; give --schedule paper to "
                          f"build with {flag}")


def read_schedule_file(path: str, kind: str, workload: str) -> Schedule:
    """The ``kind`` schedule of a schedule file (one-line errors: unreadable, malformed, no schedule of that kind)."""
    try:
        schedules = read_schedules(path)
    except ConfigError as exc:
        raise ConfigError(f"--schedule: {exc}") from None
    if kind not in schedules:
        held = " and ".join(f"{k!r}" for k in schedules)
        raise ConfigError(f"--schedule {path}: its schedule is of kind {held}; this {workload} run needs kind {kind!r} "
                          f"(stepsim map {kind} --out FILE)")
    return schedules[kind]


def check_fits(schedule: Schedule, size: int, dims, where: str) -> None:
    """Refuse knobs the run's layer cannot be built with (one line naming the knob): an ``ffn`` schedule's
    ``tile_n`` above the run's tokens, ``regions`` not dividing the experts, ``tile_f`` x ``lanes`` not dividing
    the FFN's intermediate size; a ``decode`` schedule's ``regions`` above the run's requests."""
    k = schedule.knobs
    if schedule.kind == "decode":
        if k["regions"] > size:
            raise ConfigError(f"{where}: regions {k['regions']} exceeds the run's {size} requests (a schedule mapped "
                              f"for another batch: stepsim map decode --shape {size})")
        return
    if k["tile_n"] > size:
        raise ConfigError(f"{where}: tile_n {k['tile_n']} exceeds the run's {size} tokens (a schedule mapped for "
                          f"another batch: stepsim map ffn --shape {size})")
    if k["regions"] > dims.experts or dims.experts % k["regions"]:
        raise ConfigError(f"{where}: regions {k['regions']} must divide the model's {dims.experts} experts")
    for name, f in (("intermediate", dims.intermediate), ("shared_intermediate", dims.shared_intermediate)):
        if f and f % (k["tile_f"] * (k["lanes"] if name == "intermediate" else 1)):
            what = f"tile_f {k['tile_f']} x lanes {k['lanes']}" if name == "intermediate" else f"tile_f {k['tile_f']}"
            raise ConfigError(f"{where}: {what} must divide the model's {name.replace('_', ' ')} size {f:,}")


def _data(cfg: Mapping):
    """``(kind, data, dims)`` of a covered normalized config: the routing batch and the MoE layer, or the decode
    batch's KV lengths and the attention workload's head dimensions (its builder's defaults)."""
    from stepsim.workloads.config import resolved_trace

    if cfg["workload"] == "moe":
        from stepsim.models.presets import moe_model
        from stepsim.trace_io.load import load_routing
        from stepsim.workloads.config import CUSTOM_MODEL_KEYS

        dims = moe_model(cfg["model"], **{key: cfg[key] for key in CUSTOM_MODEL_KEYS})
        routing = load_routing(resolved_trace(cfg), dims.experts, iteration=cfg["iteration"], layer=cfg["layer"])
        return "ffn", routing, dims
    import inspect

    from stepsim.trace_io.load import load_kv_lengths
    from stepsim.workloads.attention.build import build_attention

    defaults = inspect.signature(build_attention).parameters
    dims = {"head_dim": defaults["head_dim"].default, "query_per_kv_head": defaults["query_per_kv_head"].default}
    return "decode", load_kv_lengths(resolved_trace(cfg), cfg["batch_id"]), dims


def _build(kind: str, data, dims, hardware: Hardware, schedule: Schedule, softmax: str | None):
    """The layer of ``data`` built with ``schedule``; returns ``(workload, compute units used)``. A decode attention
    with the stable softmax (functional runs) gets its units from representative data built with that softmax."""
    from stepsim.mapping.mapper import mapped_workload

    if kind == "decode" and softmax == "stable":
        from stepsim.mapping import kinds
        from stepsim.mapping.units import assign_compute_units, compute_ops
        from stepsim.workloads.attention.build import build_attention

        def build(kv):
            return build_attention(kv, "dynamic", head_dim=dims["head_dim"], query_per_kv_head=dims[
                "query_per_kv_head"], tile_n=kinds.KV_TILE, regions=min(schedule.knobs["regions"], len(kv)),
                compute_bw=kinds.PLACEHOLDER_BW, softmax="stable", shared_kv=dims.get("shared_kv", False))

        representative = build(kinds.decode.decode_lengths(len(data)))
        units = assign_compute_units(representative, hardware)
        plan = {op.name: op.compute_bw for op in compute_ops(representative.graph)}
        workload = build(data)
        for op in compute_ops(workload.graph):
            op.compute_bw = plan[op.name]
        return workload, units
    return mapped_workload(kind, data, dims, hardware, schedule.knobs)


def _note(workload, schedule: Schedule, source: str, units: int) -> None:
    """Record the schedule in the workload's params; ``compute_bw`` is per operator (from its units), not one value."""
    for key in ("compute_bw", "packing_compute_bw"):
        workload.params.pop(key, None)
    workload.params["schedule"] = {"source": source, "kind": schedule.kind, "knobs": dict(schedule.knobs),
                                   "compute_units": units}


def _with_schedule_identity(record, schedule: Schedule):
    """The record with a run id that hashes the schedule too (the same identity plus ``schedule``)."""
    from stepsim.mapping.mapper import MAPPER_VERSION
    from stepsim.results.records import identity

    ident = {**record.config, "schedule": {"kind": schedule.kind, "knobs": dict(schedule.knobs),
                                           "mapper_version": MAPPER_VERSION}}
    run_id = stable_hash(identity(ident, record.row["trace_sha256"]))
    replace = {"row": {**record.row, "run_id": run_id}, "config": ident}
    for name in ("_units", "_channels"):
        table = getattr(record, name)
        if table is not None:
            replace[name] = {**table, "run_id": [run_id] * len(table["run_id"])}
    return dataclasses.replace(record, **replace)


def rebuild_recorded(config: Mapping, recorded: Mapping):
    """The workload a mapped run's record describes (``stepsim report`` of a written record): ``config`` its knob
    columns, ``recorded`` its params' ``schedule``, built with those knobs (never mapped again). The knob columns
    the schedule set (``tile_n``, ``tile_f``, ``regions``) are the schedule's, left out of the config."""
    from stepsim.workloads.config import normalize_config, resolve_hardware

    cfg = normalize_config({k: v for k, v in config.items() if k not in ("tile_n", "tile_f", "regions", "compute_bw")})
    schedule = Schedule(recorded["kind"], dict(recorded["knobs"]))
    kind, data, dims = _data(cfg)
    workload, units = _build(kind, data, dims, resolve_hardware(cfg), schedule, cfg["softmax"])
    _note(workload, schedule, recorded["source"], units)
    return workload


def run_scheduled(config: Mapping, schedule: str | None, *, source: str | None = None, progress=None,
                  timeline: int = 0, force: bool = False):
    """:func:`stepsim.results.records.run_config` with a ``--schedule`` (module docstring): a paper run is exactly
    ``run_config``'s; a mapped run builds the layer with the schedule and records it.

    Raises
    ------
    ConfigError
        An uncovered workload, a knob the schedule sets, an unreadable or unfitting schedule file (one line each,
        before the trace is simulated).
    """
    from stepsim.results.records import record_of, run_config
    from stepsim.workloads.config import normalize_config, resolve_hardware

    start = time.perf_counter()
    cfg = normalize_config(config, source=source)
    paper = schedule == "paper" or (schedule is None and cfg["workload"] not in COVERED)
    hardware = None if paper else resolve_hardware(cfg, source=source)
    choice = "paper" if paper else chosen(cfg, hardware, schedule)
    if choice == "paper":  # the paper's run, untouched: its record and run id are run_config's
        return run_config(config, source=source, progress=progress, timeline=timeline, force=force)
    kind = _check_covered(cfg, choice)
    _check_knobs(cfg, choice, schedule is not None, hardware)
    from_file = read_schedule_file(choice, kind, cfg["workload"]) if choice not in CHOICES else None
    kind, data, dims = _data(cfg)
    size = len(data)
    if from_file is None:
        from stepsim.mapping.cache_folder import checked_mapping_cache
        from stepsim.mapping.mapper import map_layer

        checked_mapping_cache()  # before the mapping: its schedule is saved there
        mapped, where = map_layer(kind, size, dims, hardware), "auto"
    else:
        check_fits(from_file, size, dims, f"--schedule {choice}")
        mapped, where = from_file, f"file {Path(choice).name}"
    try:
        workload, units = _build(kind, data, dims, hardware, mapped, cfg["softmax"])
        if from_file is not None:  # the mapper checked its own choice; a file's may ask for more than the chip has
            from stepsim.mapping.units import usage

            usage(workload, hardware, units)
    except Infeasible as exc:
        raise ConfigError(f"--schedule {choice}: does not fit hardware {hardware.name!r}: {exc}") from None
    _note(workload, mapped, where, units)
    build_s = time.perf_counter() - start
    record = record_of(workload, hardware, cfg, source=source, build_s=build_s, progress=progress,
                       timeline=timeline, force=force)
    record = _with_schedule_identity(record, mapped)
    return dataclasses.replace(record, row=dict(record.row, total_s=time.perf_counter() - start))


__all__ = ["CHOICES", "COVERED", "KNOBS", "chosen", "rebuild_recorded", "run_scheduled", "schedule_argument",
           "serving_hardware"]
