"""The mapper: the fastest schedule of a layer kind and shape on a hardware, within its units (docs/mapping.md).

For every candidate of the kind's space (its module in :mod:`stepsim.mapping.kinds`) the layer is built on
representative data, its compute units assigned and its use of the chip checked (:mod:`stepsim.mapping.units`; a candidate that does
not fit is *infeasible*). Feasible candidates are taken in order of their lower bound (bytes at the HBM's peak,
FLOPs at the units' peak): each is simulated on the engine unless its bound already reaches the best cycles found
(*pruned*: it cannot win). The bound is sound, so the chosen schedule is the best of the whole space; ties go to the
candidate first in bound order, then in space order, so the choice is deterministic.

Schedules are cached per (kind, shape bucket, layer dimensions, hardware), in the process and on disk
(``$STEPSIM_MAPPING_CACHE``, else ``~/.cache/stepsim/mapping``; one checksummed JSON file per key, never reused when
unreadable, edited or another key's). A shape's bucket is the next power of two: a serving run maps a dozen
buckets, not every token count.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from pathlib import Path

from stepsim.base.defaults import TIMING_MODEL_VERSION, UNSET, resolve_channel_depth
from stepsim.base.errors import DeadlockError, StepsimWarning
from stepsim.base.files import atomic_output, file_sha256, stable_hash
from stepsim.base.hardware import Hardware
from stepsim.mapping.kinds import KINDS, decode, ffn, prefill
from stepsim.mapping.schedule import Schedule
from stepsim.mapping.units import Infeasible, assign_compute_units, compute_ops, usage

#: FIFO depth of a mapped FFN (the serving layers' first depth: deep enough for a prefill's skewed routing)
FFN_CHANNEL_DEPTH = 64
#: bumped whenever the search, a space or the representative data change: older cached schedules are not reused
MAPPER_VERSION = 1

_MEMO: dict[str, Schedule] = {}


def bucket(size: int) -> int:
    """The shape bucket of ``size`` (tokens or requests): the next power of two, at least 1."""
    return 1 << max(0, (int(size) - 1).bit_length())


def mapped_workload(kind: str, data, dims, hardware: Hardware, knobs: dict, *, max_n: int | None = None):
    """The ``kind`` layer of ``data`` built with ``knobs``, every compute operator's ``compute_bw`` set from the
    units it gets on the representative data of the same shape (:func:`unit_plan`), so a layer's units depend on
    its shape and knobs, never on its data.

    ``data``: the routing ``[tokens, top_k]`` (``ffn``) or the KV lengths (``decode``); ``dims``: the
    :class:`~stepsim.models.presets.MoEModel` (``ffn``) or ``{"head_dim", "query_per_kv_head"}`` (``decode``).
    Returns ``(workload, compute units used)``.

    Raises
    ------
    Infeasible
        More compute operators than the chip has compute units.
    """
    workload = _build(kind, data, dims, knobs, max_n)
    plan, units = unit_plan(kind, _size(kind, data, dims), dims, hardware, knobs)
    _apply(workload, plan)
    return workload, units


def _size(kind: str, data, dims) -> int:
    """The size ``data`` is mapped at before its bucket: tokens (``ffn``), requests (``decode``), a head's query
    positions in whole tiles (``prefill``, :func:`stepsim.mapping.kinds.prefill.prefill_size`)."""
    return prefill.prefill_size(data, dims) if kind == "prefill" else len(data)


def _apply(workload, plan: dict) -> None:
    for op in compute_ops(workload.graph):
        op.compute_bw = plan[op.name]


def _build(kind: str, data, dims, knobs: dict, max_n: int | None = None):
    if kind == "ffn":
        workload = ffn.build_ffn(data, dims, knobs)
        workload.channel_depth = FFN_CHANNEL_DEPTH
        return workload
    if kind == "prefill":
        return prefill.build_prefill(data, dims, knobs, max_n)
    return decode.build_decode(data, dims, knobs, max_n)


_PLANS: dict = {}


def unit_plan(kind: str, size: int, dims, hardware: Hardware, knobs: dict, representative=None) -> tuple[dict, int]:
    """``({operator name: compute_bw}, units used)`` of the ``kind`` layer at ``size`` with ``knobs``: its compute
    units assigned on the representative data (:func:`stepsim.mapping.units.assign_compute_units`; in place on
    ``representative``, that layer already built, when given), memoised."""
    key = (kind, size, repr(dims), tuple(sorted(hardware.values().items())), tuple(sorted(knobs.items())))
    if key not in _PLANS:
        workload = representative or _build(kind, _representative(kind, size, dims)[0], dims, knobs)
        units = assign_compute_units(workload, hardware)
        _PLANS[key] = ({op.name: op.compute_bw for op in compute_ops(workload.graph)}, units)
    return _PLANS[key]


def _simulate(workload, hardware: Hardware) -> int:
    from stepsim.analysis.deadlock import run_diagnosed
    from stepsim.graph.lower import lower

    depth = resolve_channel_depth(UNSET, hardware, workload.channel_depth)
    program = lower(workload.graph, hardware, channel_depth=depth, channel_depths=workload.channel_depths)
    return int(run_diagnosed(program).cycles)


def _representative(kind: str, size: int, dims) -> list:
    """The representative data the mapper decides on: a few routings (``ffn``), one set of KV lengths (``decode``),
    one prompt a KV head (``prefill``)."""
    if kind == "ffn":
        return [ffn.ffn_routing(size, dims, s) for s in range(ffn.ffn_samples(size))]
    if kind == "prefill":
        return [prefill.prefill_data(size, dims)]
    return [decode.decode_lengths(size)]


def _mean(values: list[int]) -> int:
    """The mean of ``values``, rounded up (a mean of lower bounds rounded up is still one)."""
    return -(-sum(values) // len(values))


def _space(kind: str, size: int, dims) -> list[dict]:
    if kind == "prefill":
        return prefill.prefill_space(size, dims)
    return ffn.ffn_space(size, dims) if kind == "ffn" else decode.decode_space(size)


def _grows_with(kind: str, a: dict, b: dict) -> bool:
    """Whether candidate ``b`` needs at least the units ``a`` does: the same tiles, and at least as many lanes and
    regions."""
    grow = ("lanes", "regions") if kind == "ffn" else ("regions",)
    return all(b[k] == a[k] for k in a if k not in grow) and all(b[k] >= a[k] for k in grow)


def evaluate(kind: str, size: int, dims, hardware: Hardware, *, exhaustive: bool = False):
    """Every candidate of the space at ``size``: ``(schedule, rows)``, ``rows`` one dict per candidate in space
    order (``knobs``, ``status`` simulated / pruned / infeasible, ``why``, ``bound_cycles``, ``cycles``). Cycles
    and bounds are means over the representative data (:func:`_representative`), rounded up; the traffic, FLOPs
    and units of the schedule are its first sample's.

    Candidates are taken in order of a bound from their knobs alone (:func:`stepsim.mapping.kinds.ffn.ffn_bound`),
    then of the built graph's bound (:func:`stepsim.mapping.units.usage`); either reaching the best cycles so far
    prunes the candidate, and so does a smaller candidate's infeasibility (more lanes or regions need more units).
    ``exhaustive`` builds every candidate and simulates every feasible one: the test of the mapper's optimality.
    """
    samples = _representative(kind, size, dims)
    space = _space(kind, size, dims)
    knob_bound = {"ffn": ffn.ffn_bound, "prefill": prefill.prefill_bound}.get(kind, decode.decode_bound)
    rows = [{"knobs": knobs, "status": None, "bound_cycles": _mean([knob_bound(knobs, d, dims, hardware)
                                                                    for d in samples]),
             "cycles": None, "why": None} for knobs in space]
    too_big, best = [], None
    for row in sorted(rows, key=lambda r: r["bound_cycles"]):  # stable: ties in space order
        knobs = row["knobs"]
        if best is not None and not exhaustive and row["bound_cycles"] >= best.cycles:
            row.update(status="pruned", why="bound from the knobs")
            continue
        if not exhaustive and any(_grows_with(kind, small, knobs) for small in too_big):
            row.update(status="infeasible", why="needs more units than a smaller infeasible candidate")
            continue
        try:
            workloads = [_build(kind, d, dims, knobs) for d in samples]
            plan, units = unit_plan(kind, size, dims, hardware, knobs, representative=workloads[0])
            uses = []
            for workload in workloads:
                _apply(workload, plan)  # the first: already so when the plan was made on it just now
                uses.append(usage(workload, hardware, units))
        except Infeasible as exc:
            row.update(status="infeasible", why=str(exc))
            too_big.append(knobs)
            continue
        row["bound_cycles"] = max(row["bound_cycles"], _mean([use.bound_cycles for use in uses]))
        if best is not None and not exhaustive and row["bound_cycles"] >= best.cycles:
            row.update(status="pruned", why="bound of the built graph")
            continue
        try:
            cycles = _mean([_simulate(workload, hardware) for workload in workloads])
        except DeadlockError as exc:
            row.update(status="infeasible", why=f"deadlocks ({str(exc).splitlines()[0]})")
            continue
        row.update(status="simulated", cycles=cycles)
        if best is None or cycles < best.cycles:
            use = uses[0]
            best = Schedule(kind, dict(knobs), cycles, row["bound_cycles"], use.off_chip_bytes, use.flops,
                            use.compute_units, use.memory_units, max(u.on_chip_bytes for u in uses))
    if best is None:
        raise Infeasible(f"no schedule of the {kind!r} layer at size {size} fits hardware {hardware.name!r} "
                         f"({len(rows)} candidates: {rows[0]['why'] if rows else 'empty space'})")
    counts = {status: sum(r["status"] == status for r in rows) for status in ("simulated", "pruned", "infeasible")}
    return Schedule(**{**best.to_dict(), "candidates": counts}), rows


#: the mapping modules every kind's schedules depend on: the search (this module), the units, the kinds' registry
#: and what they share. Not ``schedule.py`` (the schedule's fields and files), ``runs.py`` or ``roofline.py``, which
#: read, print or price a schedule: a change there leaves every cached schedule what the mapper would find.
SHARED_MODULES = ("mapper.py", "units.py", "kinds/__init__.py", "kinds/common.py")


def source_files(kind: str) -> list[Path]:
    """The sources the ``kind`` layer's schedules depend on: the shared modules (:data:`SHARED_MODULES`), the kind's
    own module (``kinds/<kind>.py``: its space, representative data, bound and build) and the builders it names
    (its ``BUILDERS``). Editing one kind's module or builders changes that kind's key alone."""
    import importlib

    if kind not in KINDS:
        raise ValueError(f"unknown mapped kind {kind!r}; expected one of {', '.join(map(repr, KINDS))}")
    here = Path(__file__).parent
    module = KINDS[kind]
    return ([here / name for name in SHARED_MODULES] + [Path(module.__file__)]
            + [Path(importlib.import_module(name).__file__) for name in module.BUILDERS])


def _source_hash(kind: str) -> str:
    """SHA-256 over :func:`source_files` of ``kind``. A schedule found by other code is never reused, even when
    :data:`MAPPER_VERSION` was not bumped. (The engine's timing is in the key as ``TIMING_MODEL_VERSION``; the
    pruning bounds of :mod:`stepsim.analysis.bounds` are sound, so they decide what is simulated, never what wins.)"""
    return stable_hash([file_sha256(f) for f in source_files(kind)])


def source_hash(kind: str | None = None) -> str:
    """:func:`_source_hash` of ``kind``, computed once a process; without a kind, the hash of every kind's (what a
    serving run's mapped layers all depend on: a fast calibration's key, :mod:`stepsim.serve.calibration_cache`)."""
    if kind is None:
        return stable_hash({k: source_hash(k) for k in KINDS})
    if kind not in _SOURCE:
        _SOURCE[kind] = _source_hash(kind)
    return _SOURCE[kind]


def key_material(kind: str, size: int, dims, hardware: Hardware) -> dict:
    """Everything a schedule depends on: the mapper's and timing model's versions, the kind, size, dimensions,
    hardware and the kind's sources (:func:`source_files`). Its hash is the cache key; the cache file keeps it too, so
    a cached schedule says what it was mapped for and whether today's code would map it the same. The dimensions
    are their fields without the model's name (:func:`dims_fields`), so one shape maps once whichever file or
    preset it came from. The hardware is its values and which of them were set explicitly: an explicit
    ``channel_depth`` overrides the layer's own FIFO depth (:func:`stepsim.base.defaults.resolve_channel_depth`),
    so two hardwares of equal values can simulate a layer differently."""
    return {"mapper_version": MAPPER_VERSION, "timing_model_version": TIMING_MODEL_VERSION, "kind": kind,
            "size": size, "dims": dims_fields(dims), "hardware": hardware.values(),
            "hardware_explicit": list(hardware.explicit), "source": source_hash(kind)}


def _key(kind: str, size: int, dims, hardware: Hardware) -> str:
    return stable_hash(key_material(kind, size, dims, hardware))


_SOURCE: dict[str, str] = {}


def map_layer(kind: str, size: int, dims, hardware: Hardware, *, cache: Path | None | bool = True) -> Schedule:
    """The best schedule of ``kind`` at ``size`` exactly (tokens for ``ffn``, requests for ``decode``), cached
    (module docstring; ``cache=False``: neither read nor written, a Path: that folder)."""
    key = _key(kind, size, dims, hardware)
    if key in _MEMO:
        return _MEMO[key]
    folder = _cache_folder(cache)
    schedule = _load(folder, key) if folder is not None else None
    if schedule is None:
        schedule, _ = evaluate(kind, size, dims, hardware)
        if folder is not None:
            _save(folder, key, schedule, key_material(kind, size, dims, hardware))
    _MEMO[key] = schedule
    return schedule


def schedule_for(kind: str, size: int, dims, hardware: Hardware, *, cache: Path | None | bool = True) -> Schedule:
    """The schedule a layer of ``size`` is built with: the one mapped at its bucket (:func:`bucket`)."""
    return map_layer(kind, bucket(size), dims, hardware, cache=cache)


# ------------------------------------------------------------------------------------------------ disk cache
def _cache_folder(cache) -> Path | None:
    if cache is False or cache is None:
        return None
    if isinstance(cache, (str, Path)):
        return Path(cache)
    env = os.environ.get("STEPSIM_MAPPING_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "stepsim" / "mapping"


def _checksum(record: dict) -> str:
    return hashlib.sha256(json.dumps({k: v for k, v in record.items() if k != "sha256"}, sort_keys=True)
                          .encode()).hexdigest()


def _load(folder: Path, key: str) -> Schedule | None:
    path = folder / f"{key}.json"
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(record, dict) or record.get("sha256") != _checksum(record) or record.get("key") != key:
            raise ValueError("its checksum or key does not match")
        return Schedule.from_dict(record["schedule"], source=str(path))
    except Exception as exc:  # noqa: BLE001 - any damage means: map again and replace the file
        warnings.warn(f"mapping cache file {path}: unusable ({type(exc).__name__}: {exc}); mapping again (the file "
                      "will be replaced)", StepsimWarning, stacklevel=3)
        return None


def dims_fields(dims) -> dict:
    """``dims`` as JSON: an FFN's :class:`~stepsim.models.presets.MoEModel` fields but its name (a label of the
    graph, a file's path for a model read from a file: no schedule depends on it), or the decode's dict."""
    if dataclasses.is_dataclass(dims):
        return {k: v for k, v in dataclasses.asdict(dims).items() if k != "name"}
    return dict(dims)


def _save(folder: Path, key: str, schedule: Schedule, material: dict) -> None:
    """One checksummed file ``KEY.json``: the key, what it was mapped for (``material``, whose hash is the key)
    and the schedule."""
    record = {"key": key, "material": material, "schedule": schedule.to_dict()}
    with atomic_output(folder / f"{key}.json") as tmp:
        tmp.write_text(json.dumps({**record, "sha256": _checksum(record)}, indent=2) + "\n", encoding="utf-8")
