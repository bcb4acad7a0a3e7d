"""Map the suite's seeded schedules again with today's code (run after changing the mapper or a mapped builder).

The test suite starts with a copy of this folder as its mapping cache (tests/conftest.py), so the serving tests
on ``--schedule auto`` do not each map their shapes from nothing (a cold Qwen3-30B-A3B FFN bucket takes minutes).
A seed is an ordinary cache file (:mod:`stepsim.mapping.mapper`): it is used only when its key, the hash of
everything its schedule depends on, the mapper's and the mapped builders' sources included, matches. So a stale
seed is never used; it only makes the suite slow, and tests/mapping/test_mapping_seeds.py fails until it is
mapped again::

    python tests/mapping_seeds/refresh.py            # every seed, with today's code (in parallel, one per core)
    # shapes new tests map: run them with a cache folder of their own, then add its files' shapes
    STEPSIM_TEST_MAPPING_CACHE=/tmp/new pytest tests/...
    python tests/mapping_seeds/refresh.py --add /tmp/new

A seed's schedule is the one the mapper finds now: a file mapped by older code is mapped again (only what it was
mapped for is read from it: kind, size, dimensions, hardware); one whose key is today's is kept as it is. The
simulated costs of :data:`COSTS` (a projection at one token count, an FFN bucket's point: what fast calibrations and
plans price) are seeded and refreshed the same way, each simulated again when what it depends on changed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

SEEDS = Path(__file__).resolve().parent


def request_of(record: dict) -> tuple:
    """``(kind, size, dims, hardware)`` a cache record was mapped for, rebuilt from its fields."""
    from stepsim.models.presets import MoEModel

    material = record["material"]
    dims = material["dims"]
    dims = MoEModel("seed", **dims) if "experts" in dims else dict(dims)  # the name: a label no schedule reads
    return material["kind"], material["size"], dims, _hardware(material["hardware"], material["hardware_explicit"])


def _hardware(values: dict, explicit: list):
    """The hardware of ``values`` whose explicitly set fields are ``explicit``: a preset with those fields set
    (the first preset that gives both back)."""
    from stepsim.base.hardware import PRESETS, SERVING_DEFAULTS, Hardware

    fields = {f: values[f] if f in values else SERVING_DEFAULTS[f] for f in explicit}  # values omit defaults
    for preset in sorted(PRESETS):
        try:
            hardware = Hardware.from_dict({"preset": preset, **fields}, source="seed")
        except Exception:  # noqa: BLE001 - a preset these fields do not fit: try the next
            continue
        if hardware.values() == values and list(hardware.explicit) == explicit:
            return hardware
    raise SystemExit(f"no preset gives back the hardware {values} with {explicit} set explicitly")


def projection_request_of(record: dict) -> tuple:
    """``(tokens, d_in, d_out, hardware)`` a projection's cache record (:mod:`stepsim.mapping.projection`, a kind
    with a key of its own) was mapped for."""
    material = record["material"]
    return (material["size"], material["dims"]["d_in"], material["dims"]["d_out"],
            _hardware(material["hardware"], material["hardware_explicit"]))


def _kept_or_made(path: str, record: dict, now: dict, make) -> str:
    """The seed's file name for a record of a kind with a key of its own (the hash of ``now``, what it would be
    made for today): the file copied when it is today's, else ``make()`` writes it into :data:`SEEDS`."""
    from stepsim.base.files import stable_hash

    name = f"{stable_hash(now)}.json"
    if now == record["material"] and record["key"] == name[:-5]:
        if Path(path) != SEEDS / name:
            shutil.copyfile(path, SEEDS / name)
    else:
        make()
    return name


def _remap_projection(path: str, record: dict) -> str:
    """:func:`remap` of a projection's record."""
    from stepsim.mapping.projection import key_material, map_projection

    request = projection_request_of(record)
    return _kept_or_made(path, record, key_material(*request), lambda: map_projection(*request, cache=SEEDS))


def ep_request_of(record: dict) -> tuple:
    """``(tokens, model, system, hardware)`` an expert-parallel search's record
    (:func:`stepsim.mapping.expert_parallel.search_knobs`, a kind with a key of its own) was searched for: its
    system loaded again by name, with the record's hardware."""
    import dataclasses

    from stepsim.base.system import System
    from stepsim.models.presets import MoEModel

    material = record["material"]
    hardware = _hardware(material["hardware"], material["hardware_explicit"])
    system = dataclasses.replace(System.load(material["system"]), hardware=hardware)
    return material["size"], MoEModel("seed", **material["dims"]), system, hardware


def _remap_ep(path: str, record: dict) -> str:
    """:func:`remap` of an expert-parallel search's record (its proxy's ``ffn`` schedule from the seeds too)."""
    from stepsim.mapping.expert_parallel import search_knobs, search_material

    request = ep_request_of(record)
    now = search_material(*request)
    drift = {k for k in now if k not in ("source", "ep_search_version", "timing_model_version")
             and now[k] != record["material"][k]}
    if drift:
        raise SystemExit(f"{path}: cannot rebuild what it was searched for ({', '.join(sorted(drift))} differ)")
    return _kept_or_made(path, record, now, lambda: search_knobs(*request, cache=SEEDS))


def remap(path: str) -> str:
    """The seed of the cache file ``path`` in :data:`SEEDS`, mapped with today's code (copied when ``path`` is
    already today's: its key says so, and mapping is deterministic); the seed's file name."""
    from stepsim.mapping.mapper import _key, key_material, map_layer

    record = json.loads(Path(path).read_text(encoding="utf-8"))
    if "material" not in record:  # written before cache files said what they were mapped for
        raise SystemExit(f"{path}: does not say what it was mapped for (an older cache file): map its shape again")
    if record["material"]["kind"] == "projection":
        return _remap_projection(path, record)
    if record["material"]["kind"] == "ep":
        return _remap_ep(path, record)
    kind, size, dims, hardware = request_of(record)
    now = key_material(kind, size, dims, hardware)
    drift = {k for k in now if k not in ("source", "mapper_version", "timing_model_version")
             and now[k] != record["material"][k]}
    if drift:  # the rebuilt request must be the one the file was mapped for
        raise SystemExit(f"{path}: cannot rebuild what it was mapped for ({', '.join(sorted(drift))} differ)")
    name = f"{_key(kind, size, dims, hardware)}.json"
    if now == record["material"] and record["key"] == name[:-5]:
        if Path(path) != SEEDS / name:
            shutil.copyfile(path, SEEDS / name)
    else:
        map_layer(kind, size, dims, hardware, cache=SEEDS)
    return name


#: the subfolders of simulated costs seeded beside the schedules (tests/conftest.py copies them too): a projection's
#: cost at one token count (:mod:`stepsim.serve.projections`) and an FFN bucket's point (:mod:`stepsim.serve.ffn_points`)
COSTS = ("projection-costs", "ffn-points")


def cost_request_of(subfolder: str, record: dict, schedules: dict) -> tuple:
    """The arguments a cost seed was simulated for: a projection's ``(tokens, d_in, d_out, hardware)`` from its
    material's token count and its schedule's record (``schedules``: key -> record), an FFN point's ``(tokens, dims,
    hardware, system)`` from its material."""
    import dataclasses

    from stepsim.base.system import System
    from stepsim.models.presets import MoEModel

    material = record["material"]
    if subfolder == "projection-costs":
        schedule = schedules.get(material["schedule_key"])
        if schedule is None:
            raise SystemExit(f"projection cost of schedule {material['schedule_key']}: no seed of that schedule to "
                             "rebuild it from")
        _, d_in, d_out, hardware = projection_request_of(schedule)
        return material["tokens"], d_in, d_out, hardware
    hardware = _hardware(material["hardware"], material["hardware_explicit"])
    system = material["system"] and dataclasses.replace(System.load(material["system"]), hardware=hardware)
    return material["tokens"], MoEModel("seed", **material["dims"]), hardware, system or None


def mapped_knobs(material: dict, schedules: dict) -> bool:
    """Whether an FFN point was simulated under the knobs of a schedule among ``schedules`` (key -> record), the
    one its material names: a point of a test that injects its own schedules (tests/serve/test_replay_mapped.py's
    mappers) is not, and is simulated again under its own knobs (:func:`recost`)."""
    schedule = schedules.get(material["schedule_key"])
    return schedule is not None and schedule["schedule"]["knobs"] == material["knobs"]


@contextlib.contextmanager
def injected_knobs(knobs: dict | None):
    """While open, :func:`stepsim.mapping.schedule_for` gives a schedule of ``knobs`` (a test's injected mapper, as
    the point was simulated under it; None: the mapper's own)."""
    import stepsim.mapping
    from stepsim.mapping.schedule import Schedule

    mapper = stepsim.mapping.schedule_for
    if knobs is not None:
        stepsim.mapping.schedule_for = lambda kind, size, dims, hardware, cache=True: Schedule(kind, dict(knobs))
    try:
        yield
    finally:
        stepsim.mapping.schedule_for = mapper


def _cost_functions(subfolder: str) -> tuple:
    """``(material of a request, simulate and store it)`` of a cost subfolder."""
    if subfolder == "projection-costs":
        from stepsim.serve.projections import cost_material, projection_cost

        return cost_material, projection_cost
    from stepsim.serve.ffn_points import point_cycles, point_material

    return point_material, point_cycles


def todays_material(subfolder: str, record: dict, request: tuple, injected: bool) -> dict:
    """What today's code would simulate the cost seed ``record`` for (``request``, :func:`cost_request_of`)."""
    with injected_knobs(record["material"]["knobs"] if injected else None):
        return _cost_functions(subfolder)[0](*request)


def recost(job: tuple) -> str:
    """The seed of the cost file ``path`` of ``subfolder`` simulated for ``request`` with today's code (copied when
    its material is today's; ``injected``: an FFN point of a test's own knobs, :func:`mapped_knobs`); its name
    relative to :data:`SEEDS`. The simulation writes into ``SEEDS``, the process's mapping cache (:func:`main`)."""
    from stepsim.base.files import stable_hash

    subfolder, path, request, injected = job
    record = json.loads(Path(path).read_text(encoding="utf-8"))
    now = todays_material(subfolder, record, request, injected)
    target = SEEDS / subfolder / f"{stable_hash(now)}.json"
    if now == record["material"]:
        if Path(path) != target:
            shutil.copyfile(path, target)
    else:
        with injected_knobs(record["material"]["knobs"] if injected else None):
            _cost_functions(subfolder)[1](*request)
    return str(target.relative_to(SEEDS))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--add", type=Path, help="also map the shapes of this folder's cache files")
    args = parser.parse_args(argv)
    folders = [SEEDS] + ([args.add] if args.add else [])
    old = sorted(SEEDS.glob("*.json"))
    sources = [str(p) for p in old] + ([str(p) for p in sorted(args.add.glob("*.json"))] if args.add else [])
    schedules = {}
    for path in sources:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
        schedules[record.get("key")] = record
    os.environ["STEPSIM_MAPPING_CACHE"] = str(SEEDS)  # where the costs simulated again are written
    old_costs = sorted(p for sub in COSTS for p in (SEEDS / sub).glob("*.json"))
    for sub in COSTS:
        (SEEDS / sub).mkdir(exist_ok=True)
    jobs = []
    for folder in folders:
        for sub in COSTS:
            for path in sorted((folder / sub).glob("*.json")):
                record = json.loads(path.read_text(encoding="utf-8"))
                injected = sub == "ffn-points" and not mapped_knobs(record["material"], schedules)
                jobs.append((sub, str(path), cost_request_of(sub, record, schedules), injected))
    with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
        kept = set(pool.map(remap, sources))
        kept_costs = set(pool.map(recost, jobs, chunksize=8))
    for path in old:
        if path.name not in kept:
            path.unlink()
    for path in old_costs:
        if str(path.relative_to(SEEDS)) not in kept_costs:
            path.unlink()
    print(f"{len(kept)} seeds in {SEEDS} ({len(old)} before); {len(kept_costs)} simulated costs "
          f"({len(old_costs)} before)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
