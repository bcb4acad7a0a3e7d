"""The bottleneck report of one simulation run: is it memory-, compute- or latency/imbalance-bound, and why.

Input: a folder written by ``stepsim run --out RUN_DIR`` (its row ``part-*.parquet`` and the per-unit and
per-channel tables ``_units-*`` / ``_channels-*``, :mod:`stepsim.results.records`), or a :class:`RunResult` in memory.
The graph's topology (which unit produces and consumes each channel, FIFO depths, operator groups) is not in
those files: it is rebuilt from the row's configuration (the trace must still be where the row says, with the
same content hash) and checked against the tables' unit and channel names.

JSON keys (stable):

* ``bound``: ``"memory-bound"``, ``"compute-bound"`` or ``"latency-or-imbalance-bound"``. With
  ``memory_cycles = off_chip_bytes / hbm_bytes_per_cycle`` and ``compute_cycles = flops /
  allocated_compute_flops_per_cycle`` (the row's columns), the run is bound by the larger of the two when that
  roofline time is at least :data:`BOUND_FRACTION` of the simulated cycles; otherwise neither resource is
  near its peak, and the time goes to latency (pipeline fill, dependencies) or load imbalance.
* ``roofline``: ``cycles``, ``memory_cycles``, ``compute_cycles`` (floats, cycles), ``off_chip_bytes``,
  ``flops``, ``hbm_bytes_per_cycle`` (peak), ``achieved_hbm_bytes_per_cycle``, ``hbm_utilization``,
  ``allocated_compute_flops_per_cycle``, ``achieved_flops_per_cycle``, ``compute_utilization`` (ratios 0-1).
* ``critical_path``: list of ``{unit, kind, group, busy_cycles, blocked_input_cycles, blocked_output_cycles}``,
  from the unit that finishes last (largest final clock) back towards the start: at each unit, when it spent
  at least as many cycles blocked on input as on output, the next hop is the producer that starved it;
  otherwise the consumer that back-pressured it. The walk ends at a unit with neither kind of wait, a unit already on the
  path, or after :data:`MAX_PATH` hops. The culprit among several neighbours is the one that spent the most
  cycles not waiting for this unit (a starved unit's producer: final clock minus its cycles blocked on output;
  a back-pressured unit's consumer: final clock minus its cycles blocked on input), then the one finishing last.
* ``top_units``: ``by_busy`` and ``by_blocked`` (the :data:`TOP` units with the largest busy / blocked
  cycles, each with its share of the run's cycles) and ``groups``: every group's counters summed over its
  ``units`` (``busy_cycles`` etc.; a sum over units, so it can exceed the run), ``max_unit_busy_cycles`` (its
  busiest unit's busy cycles: at most the run's cycles) and ``final_clock``; ordered by
  ``max_unit_busy_cycles``, then the sum.
* ``imbalance``: across the expert / region groups (``op.group`` labels of the builders; SwiGLU has none):
  ``kind``, ``groups``, ``idle_groups`` (groups none of whose units was ever busy: experts that received no
  tokens), ``max_busy_cycles`` / ``mean_busy_cycles`` (largest ``max_unit_busy_cycles`` of the groups, and its
  mean over the groups that are not idle), ``ratio`` (max / mean), ``busiest`` (the group with the largest
  ``max_unit_busy_cycles``; ties: the one finishing last, then the first), ``lead_cycles`` (its busiest unit's
  busy cycles minus those of every other group's busiest unit: what the run waits on this group alone; null
  with a single group) and
  ``straggler``: ``busiest`` when its lead is at least :data:`STRAGGLER_SHARE` of the run's cycles, otherwise
  null (the groups' bottlenecks are equally busy, however their summed work differs), with
  ``straggler_final_clock``; null fields when the graph has no such groups.
* ``spills``: an ONNX model's spilled edges, ``edges`` (``{"VALUE->CONSUMER": why}``) and ``converters`` (the
  layout converters spills replaced, ``{key: "kind of VALUE (bytes B): producer layout -> consumer layout"}``);
  null for other workloads.
* ``full_fifos``: ``full`` (channels whose peak occupancy reached their depth), ``n_full``,
  ``never_above_one`` (channels that carried data but never held more than one element: their depth could
  shrink), ``n_never_above_one`` and ``source``. With a timeline of the run (``source: "timeline"``) every full
  channel has ``full_cycles`` (the exact cycles it spent at its depth) and ``stall_cycles``: the cycles its
  producer spent blocked on it *while its consumer was busy*, i.e. the stall this FIFO's consumer caused
  upstream. A FIFO full because its consumer waits on another input (a depth-1 metadata FIFO beside a slow data
  stream) or on its own output (back-pressure from further down) causes no stall of its own: the wait is
  charged where it starts. The list is ordered by ``stall_cycles``, then ``full_cycles``. Without a timeline
  (``source: "producer back-pressure"``, ``full_cycles`` and ``stall_cycles`` null) it is ordered by the
  producer's cycles blocked on output. ``stepsim report`` simulates the run again with a timeline when the
  original simulation took at most :data:`RESIMULATE_SECONDS`; ``stepsim run --report`` records it during the run.

Groups: ``expert 7`` / ``region 2`` from the graph's ``op.group`` labels; other operators are ``shared``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from stepsim.base.errors import ConfigError
from stepsim.base.ranges import json_text

#: a run is bound by a resource when that resource's roofline time is at least this share of the cycles
BOUND_FRACTION = 0.5
#: the busiest group is a straggler when its busiest unit is busy at least this share of the run's cycles
#: longer than every other group's busiest unit
STRAGGLER_SHARE = 0.01
#: a latency-or-imbalance-bound run whose busiest unit is busy at least this share of it is paced by that unit
UNIT_BOUND_SHARE = 0.9
#: units listed in ``top_units``
TOP = 10
#: longest critical path walked (hops)
MAX_PATH = 64
#: full channels listed in ``full_fifos.full`` (all are counted)
TOP_FIFOS = 10
#: ``stepsim report`` re-simulates a run with a timeline when its engine time was at most this (seconds)
RESIMULATE_SECONDS = 30.0


def _one(folder: Path, prefix: str) -> Path:
    files = sorted(folder.glob(f"{prefix}*.parquet"))
    if not files:
        raise ConfigError(f"{folder}: no {prefix}*.parquet file (write a run folder with `stepsim run ... --out "
                          f"{folder}`)")
    if len(files) > 1:
        raise ConfigError(f"{folder}: holds {len(files)} runs ({prefix}*.parquet files); give a folder with one "
                          f"run (stepsim run --out)")
    return files[0]


def load_run(run_dir: str | os.PathLike) -> tuple[dict, list[dict], list[dict]]:
    """``(row, unit rows, channel rows)`` of a ``stepsim run --out`` folder, or of the ``NAME.parquet`` file of
    ``stepsim run --out NAME.parquet`` (its tables ``NAME_units.parquet`` / ``NAME_channels.parquet`` beside it);
    ConfigError when it is neither."""

    folder = Path(run_dir)
    if folder.is_file() and folder.suffix == ".parquet":  # `stepsim run --out NAME.parquet`
        part = folder
        tables = [folder.with_name(f"{folder.stem}_{kind}.parquet") for kind in ("units", "channels")]
    elif not folder.is_dir():
        raise ConfigError(f"{folder}: not a folder (give the folder of `stepsim run ... --out DIR`)")
    else:
        part = _one(folder, "part-")
        tables = None
    row = _read_table(part)[0]
    if row.get("workload") == "program":  # what its program was when it ran (the record's provenance metadata)
        row["program_identity"] = _stored_program_identity(part)
    if row.get("mode") == "metrics" or row.get("cycles") is None:
        raise ConfigError(f"{part}: a metrics run (no simulation); write it with `stepsim run ... --out DIR`")
    if tables is None:
        tables = [_one(folder, "_units-"), _one(folder, "_channels-")]
    missing = [t for t in tables if not t.is_file()]
    if missing:
        raise ConfigError(f"{folder}: no {missing[0].name} beside it (written by `stepsim run ... --out "
                          f"{folder.name}`)")
    units, channels = (_read_table(t) for t in tables)
    return row, units, channels


def _read_table(path: Path) -> list[dict]:
    """The rows of a Parquet file of a run; ConfigError for a cut or damaged one (pyarrow raises several types,
    with its own multi-line wording)."""
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as exc:  # ArrowInvalid, OSError, ...: one line naming the file
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{path}: not a readable Parquet table (cut or damaged? {reason}); write the run again "
                          f"with stepsim run --out") from None
    if not rows:
        raise ConfigError(f"{path}: an empty table; write the run again with stepsim run --out")
    return rows


def rebuild(row: dict):
    """``(workload, program)`` of a row's configuration, lowered as the run was (checked trace content)."""
    from stepsim.base.defaults import UNSET, resolve_channel_depth
    from stepsim.base.files import trace_sha256
    from stepsim.graph.lower import lower
    from stepsim.results.records import build_workload
    from stepsim.workloads.config import KNOBS, normalize_config, resolve_hardware, resolved_trace

    knobs = {k: row[k] for k in KNOBS if row.get(k) is not None}
    if knobs.get("trace") and not Path(knobs["trace"]).exists() and row.get("trace_path") \
            and Path(row["trace_path"]).exists():  # a relative trace, and the report runs from another folder
        knobs["trace"] = row["trace_path"]
    if row.get("workload") == "program" and row.get("program"):
        changed = _program_changed(row, knobs)
        if changed:
            raise ConfigError(changed)
    cfg = normalize_config(knobs)
    trace = resolved_trace(cfg)
    if trace is not None and row.get("trace_sha256") and trace_sha256(trace) != row["trace_sha256"]:
        raise ConfigError(f"trace {trace} changed since the run (content hash differs); the report needs the "
                          f"graph the run simulated")
    schedule = json.loads(row.get("params") or "{}").get("schedule")
    if schedule is not None:  # a mapped run (stepsim run --schedule auto|FILE): built with the schedule it recorded
        from stepsim.mapping.runs import rebuild_recorded

        workload = rebuild_recorded(knobs, schedule)
    else:
        workload = build_workload(cfg)  # an ONNX model through the front end, as the run built it (records._build)
    hardware = resolve_hardware(cfg, workload)
    depth = resolve_channel_depth(UNSET if cfg.get("channel_depth") is None else cfg["channel_depth"], hardware,
                                  workload.channel_depth)
    program = lower(workload.graph, hardware, channel_depth=depth, channel_depths=workload.channel_depths)
    return workload, program


def _roofline(row: dict) -> dict:
    cycles = int(row["cycles"])
    off_chip = int(row["off_chip_bytes"] or 0)
    flops = int(row["flops"] or 0)
    hbm = int(row["hbm_bytes_per_cycle"] or 0)
    alloc = int(row["allocated_compute_flops_per_cycle"] or 0)
    return {"cycles": cycles, "memory_cycles": off_chip / hbm if hbm else None,
            "compute_cycles": flops / alloc if alloc else None, "off_chip_bytes": off_chip, "flops": flops,
            "hbm_bytes_per_cycle": hbm, "achieved_hbm_bytes_per_cycle": off_chip / cycles if cycles else None,
            "hbm_utilization": off_chip / (cycles * hbm) if cycles and hbm else None,
            "allocated_compute_flops_per_cycle": alloc,
            "achieved_flops_per_cycle": flops / cycles if cycles else None,
            "compute_utilization": flops / (cycles * alloc) if cycles and alloc else None}


def _bound(roof: dict) -> str:
    mem, comp, cycles = roof["memory_cycles"] or 0.0, roof["compute_cycles"] or 0.0, roof["cycles"]
    if cycles and max(mem, comp) >= BOUND_FRACTION * cycles:
        return "memory-bound" if mem >= comp else "compute-bound"
    return "latency-or-imbalance-bound"


def _entry(u: dict, cycles: int) -> dict:
    return {"unit": u["name"], "kind": u["kind"], "group": u["group"], "busy_cycles": u["busy_cycles"],
            "blocked_input_cycles": u["blocked_in_cycles"], "blocked_output_cycles": u["blocked_out_cycles"],
            "busy_share": u["busy_cycles"] / cycles if cycles else None,
            "blocked_share": (u["blocked_in_cycles"] + u["blocked_out_cycles"]) / cycles if cycles else None}


def _critical_path(units: list[dict], program) -> list[dict]:
    order = {id(u): i for i, u in enumerate(units)}
    # the unit finishing last; ties: the busiest, then program order
    current = max(units, key=lambda u: (u["final_clock"], u["busy_cycles"], -order[id(u)]))
    path, seen = [], set()
    while current is not None and len(path) < MAX_PATH:
        i = order[id(current)]
        seen.add(i)
        path.append({k: v for k, v in _entry(current, 0).items() if not k.endswith("_share")})
        bin_, bout = current["blocked_in_cycles"], current["blocked_out_cycles"]
        if bin_ == 0 and bout == 0:
            break
        starved = bin_ >= bout
        if starved:
            cands = [int(program.ch_producer[c]) for c in program.inputs(i)]
        else:
            cands = [int(program.ch_consumer[c]) for c in program.outputs(i)]
        cands = [c for c in dict.fromkeys(cands) if c not in seen]
        if not cands:
            break
        # the culprit is the neighbour that spent the most time *not* waiting for this unit: a producer that
        # sat back-pressured (blocked on output) had data ready; a consumer that sat starved had room
        waited = "blocked_out_cycles" if starved else "blocked_in_cycles"
        nxt = max(cands, key=lambda c: (units[c]["final_clock"] - units[c][waited], units[c]["final_clock"], -c))
        current = units[nxt]
    return path


def _groups(units: list[dict]) -> list[dict]:
    groups: dict[str, dict] = {}
    for u in units:
        g = groups.setdefault(u["group"], {"group": u["group"], "units": 0, "busy_cycles": 0,
                                           "blocked_input_cycles": 0, "blocked_output_cycles": 0,
                                           "max_unit_busy_cycles": 0, "final_clock": 0})
        g["units"] += 1
        g["busy_cycles"] += u["busy_cycles"]
        g["blocked_input_cycles"] += u["blocked_in_cycles"]
        g["blocked_output_cycles"] += u["blocked_out_cycles"]
        g["max_unit_busy_cycles"] = max(g["max_unit_busy_cycles"], u["busy_cycles"])
        g["final_clock"] = max(g["final_clock"], u["final_clock"])
    return sorted(groups.values(), key=lambda g: (-g["max_unit_busy_cycles"], -g["busy_cycles"],
                                                  _group_key(g["group"])))


def _group_key(label: str) -> tuple:
    """Sort key of a group label: ``expert 2`` before ``expert 10`` (numbers compared as numbers)."""
    kind, _, number = label.partition(" ")
    return (kind, int(number)) if number.isdigit() else (kind, -1)


def _imbalance(groups: list[dict], cycles: int) -> dict:
    labelled = [g for g in groups if g["group"] != "shared"]
    if not labelled:
        return {"kind": None, "groups": 0, "idle_groups": 0, "max_busy_cycles": None, "mean_busy_cycles": None, "ratio": None,
                "busiest": None, "lead_cycles": None, "straggler": None, "straggler_final_clock": None}
    kind = labelled[0]["group"].split()[0]
    labelled = sorted((g for g in labelled if g["group"].split()[0] == kind), key=lambda g: _group_key(g["group"]))
    busy = [g["max_unit_busy_cycles"] for g in labelled]
    active = [b for b in busy if b > 0]
    mean = sum(active) / len(active) if active else 0.0
    top = max(labelled, key=lambda g: (g["max_unit_busy_cycles"], g["final_clock"], -labelled.index(g)))
    others = [b for g, b in zip(labelled, busy, strict=True) if g is not top]
    lead = top["max_unit_busy_cycles"] - max(others) if others else None  # one group: nothing to lag behind
    straggler = lead is not None and lead > 0 and lead >= STRAGGLER_SHARE * cycles
    return {"kind": kind, "groups": len(labelled), "idle_groups": len(busy) - len(active),
            "max_busy_cycles": max(busy), "mean_busy_cycles": mean,
            "ratio": max(busy) / mean if mean else None, "busiest": top["group"], "lead_cycles": lead,
            "straggler": top["group"] if straggler else None,
            "straggler_final_clock": top["final_clock"] if straggler else None}


def _full_cycles(timeline, capacity: dict[str, int]) -> dict[str, int]:
    """Cycles each channel spent holding ``capacity`` elements (its depth), from the timeline's FIFO table."""
    fifo = timeline.fifo.to_pydict()
    full: dict[str, int] = {}
    rows = list(zip(fifo["channel"], fifo["t"], fifo["occupancy"]))
    for (ch, t, occ), nxt in zip(rows, rows[1:] + [(None, None, None)]):
        if occ >= capacity[ch] and nxt[0] == ch:
            full[ch] = full.get(ch, 0) + nxt[1] - t
    return full


def _merged(starts, ends):
    """Sorted, non-overlapping ``(starts, ends)`` covering the union of intervals ``[s, e)``."""
    import numpy as np

    order = np.argsort(starts, kind="stable")
    s, e = np.asarray(starts, dtype=np.int64)[order], np.asarray(ends, dtype=np.int64)[order]
    reach = np.maximum.accumulate(e) if len(e) else e
    new = np.r_[True, s[1:] > reach[:-1]] if len(s) else np.zeros(0, bool)
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, len(s) - 1] if len(s) else first
    return s[first], reach[last]


def _overlap(starts, ends, cover) -> int:
    """Cycles of the intervals ``[starts, ends)`` that fall inside ``cover`` (sorted disjoint intervals)."""
    import numpy as np

    cs, ce = cover
    if not len(starts) or not len(cs):
        return 0
    length = np.r_[0, np.cumsum(ce - cs)]

    def covered_before(t):  # cycles of the cover before each t
        k = np.searchsorted(cs, t, side="right")  # intervals starting at or before t
        inside = np.where(k > 0, np.minimum(t, ce[np.maximum(k - 1, 0)]) - cs[np.maximum(k - 1, 0)], 0)
        return length[np.maximum(k - 1, 0)] * (k > 0) + np.maximum(inside, 0)

    starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    return int((covered_before(ends) - covered_before(starts)).sum())


def _stall_cycles(timeline, names: list[str], program, channels: list[dict]) -> dict[str, int]:
    """Per full channel (``names``): cycles its producer spent blocked on it while its consumer was busy."""
    iv = timeline.intervals.to_pydict()
    busy: dict[str, tuple[list, list]] = {}
    blocked: dict[str, tuple[list, list]] = {}
    wanted = set(names)
    for unit, state, s, e, ch in zip(iv["unit"], iv["state"], iv["start"], iv["end"], iv["channel"]):
        if state == "busy":
            busy.setdefault(unit, ([], []))
            busy[unit][0].append(s)
            busy[unit][1].append(e)
        elif state == "blocked_out" and ch in wanted:
            blocked.setdefault(ch, ([], []))
            blocked[ch][0].append(s)
            blocked[ch][1].append(e)
    index = {ch["name"]: c for c, ch in enumerate(channels)}
    covers: dict[str, tuple] = {}
    stall = {}
    for name in names:
        consumer = program.unit_names[int(program.ch_consumer[index[name]])]
        if consumer not in covers:
            covers[consumer] = _merged(*busy.get(consumer, ([], [])))
        stall[name] = _overlap(*blocked.get(name, ([], [])), covers[consumer])
    return stall


def _fifos(units: list[dict], channels: list[dict], program, timeline=None) -> dict:
    capacity = {ch["name"]: int(program.ch_capacity[c]) for c, ch in enumerate(channels)}
    full_cycles = _full_cycles(timeline, capacity) if timeline is not None and timeline.complete else None
    full, idle = [], []
    for c, ch in enumerate(channels):
        cap = int(program.ch_capacity[c])
        prod, cons = int(program.ch_producer[c]), int(program.ch_consumer[c])
        if ch["peak_occupancy"] >= cap:
            full.append({"channel": ch["name"], "producer": units[prod]["name"], "consumer": units[cons]["name"],
                         "capacity": cap, "peak_occupancy": ch["peak_occupancy"], "pushes": ch["pushes"],
                         "producer_blocked_output_cycles": units[prod]["blocked_out_cycles"],
                         "full_cycles": None if full_cycles is None else full_cycles.get(ch["name"], 0),
                         "stall_cycles": None})
        elif ch["pushes"] > 0 and ch["peak_occupancy"] <= 1:
            idle.append(ch["name"])
    if full_cycles is None:
        full.sort(key=lambda f: -f["producer_blocked_output_cycles"])
    else:
        stall = _stall_cycles(timeline, [f["channel"] for f in full], program, channels)
        for f in full:
            f["stall_cycles"] = stall[f["channel"]]
        full.sort(key=lambda f: (-f["stall_cycles"], -f["full_cycles"], -f["producer_blocked_output_cycles"]))
    return {"n_full": len(full), "full": full[:TOP_FIFOS], "n_never_above_one": len(idle), "never_above_one": idle,
            "source": "producer back-pressure" if full_cycles is None else "timeline"}


def build_report(row: dict, units: list[dict], channels: list[dict], workload=None, program=None,
                 timeline=None) -> dict:
    """The report (see the module docstring) of a run's row and tables; rebuilds the graph unless given.
    ``timeline``: the run's :class:`stepsim.simulation.timeline.Timeline`, for the exact time each FIFO spent full."""
    if workload is None or program is None:
        workload, program = rebuild(row)
    names = [u["name"] for u in units]
    if names != list(program.unit_names) or [c["name"] for c in channels] != list(program.channel_names):
        raise ConfigError("the run's unit/channel tables do not match the graph rebuilt from its configuration "
                          f"({_why_different(row)})")
    from stepsim.simulation.timeline import graph_labels

    groups = graph_labels(workload.graph)[0]
    units = [dict(u, group=groups.get(u["name"], "shared")) for u in units]
    cycles = int(row["cycles"])
    roof = _roofline(row)
    by_group = _groups(units)
    return {
        "run_id": row.get("run_id"), "workload": row.get("workload"),
        "bound": _bound(roof),
        "roofline": roof,
        "critical_path": _critical_path(units, program),
        "top_units": {
            "by_busy": [_entry(u, cycles) for u in sorted(units, key=lambda u: -u["busy_cycles"])[:TOP]],
            "by_blocked": [_entry(u, cycles) for u in sorted(
                units, key=lambda u: -(u["blocked_in_cycles"] + u["blocked_out_cycles"]))[:TOP]],
            "groups": by_group},
        "imbalance": _imbalance(by_group, cycles),
        "full_fifos": _fifos(units, channels, program, timeline),
        "spills": _spills(row),
    }


def _spills(row: dict) -> dict | None:
    """An ONNX model's fusion outcome from its record's params: ``edges`` (``{"VALUE->CONSUMER": why}`` of the
    spilled edges) and ``converters`` (the converters spills replaced); None for other workloads."""
    params = json.loads(row.get("params") or "{}")
    if "spill_reasons" not in params:
        return None
    return {"edges": params["spill_reasons"], "converters": params["spilled_converters"]}


def report_run_dir(run_dir: str | os.PathLike, *, with_timeline: bool = True) -> tuple[dict, object | None]:
    """``(report, timeline)`` of a ``stepsim run --out`` folder (Python entry point of ``stepsim report``).

    With ``with_timeline`` the run is simulated again with a timeline when its engine time was at most
    :data:`RESIMULATE_SECONDS` (the timeline is None otherwise); the rerun must reproduce the row's cycles."""
    row, units, channels = load_run(run_dir)
    workload, program = rebuild(row)
    timeline = None
    if with_timeline and (row.get("sim_wall_s") or 0.0) <= RESIMULATE_SECONDS:
        timeline = _resimulate(row, workload, program)
    return build_report(row, units, channels, workload, program, timeline), timeline


def _stored_program_identity(part: Path) -> str | None:
    """The program's identity (:func:`stepsim.results.records.program_identity`) in a record file's provenance
    metadata, None in a file without it."""
    import json

    import pyarrow.parquet as pq

    from stepsim.base.files import CONFIG_KEY

    meta = pq.read_schema(part).metadata or {}
    stored = json.loads(meta.get(CONFIG_KEY.encode(), b"{}"))
    return (stored.get("config") or {}).get("program")


def _program_changed(row: dict, knobs: dict) -> str | None:
    """Why a user program's run cannot be rebuilt as it ran: its file changed since (the file's content is part
    of the run's identity, stored with the record), or it cannot be read; None when it did not change (or the
    record does not say what it was)."""
    from stepsim.results.records import program_identity

    try:
        now = program_identity(knobs)
    except ConfigError as exc:
        return f"the run's program cannot be read again: {exc}"
    if row.get("program_identity") is not None and now != row["program_identity"]:
        return (f"the program {row['program']} changed since the run (its content is part of the run id "
                f"{str(row.get('run_id'))[:16]}); run it again, then report")
    return None


def _why_different(row: dict) -> str:
    """Why a rebuilt run differs from its record (a changed program is refused before, by :func:`rebuild`)."""
    from stepsim._version import __version__

    written = row.get("stepsim_version")
    if written != __version__:
        return f"written by stepsim {written or 'of an unknown version'}, this is {__version__}"
    return f"written by this stepsim version, {__version__}: a difference it should not have, please report it"


def _resimulate(row: dict, workload, program):
    """The run's timeline: the rebuilt program simulated again (it must give the recorded cycles)."""
    from stepsim.kernels import run
    from stepsim.simulation.timeline import DEFAULT_RECORDS, decode, graph_labels

    result = run(program, timeline=DEFAULT_RECORDS)
    if result.cycles != row["cycles"]:
        raise ConfigError(f"simulating the run again gave {result.cycles:,} cycles, the record says "
                          f"{row['cycles']:,} ({_why_different(row)})")
    return decode(result.timeline, program, *graph_labels(workload.graph))


def report_record(record, workload=None) -> dict:
    """The report of an in-memory :class:`stepsim.results.records.RunResult` of a simulation run (with its timeline
    when it was recorded: ``run_config(..., timeline=N)``)."""
    return build_report(record.row, record.unit_table().to_pylist(), record.channel_table().to_pylist(),
                        workload, None, record.timeline)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def format_report(rep: dict) -> str:
    """The report as text (at most about 40 lines)."""
    roof = rep["roofline"]
    lines = [f"verdict: {rep['bound']} ({roof['cycles']:,} cycles; memory roofline "
             f"{roof['memory_cycles'] or 0:,.0f}, compute roofline {roof['compute_cycles'] or 0:,.0f} cycles)",
             f"  HBM: {roof['achieved_hbm_bytes_per_cycle'] or 0:,.1f} of {roof['hbm_bytes_per_cycle']:,} B/cycle "
             f"({_pct(roof['hbm_utilization'])}); compute: {roof['achieved_flops_per_cycle'] or 0:,.0f} of "
             f"{roof['allocated_compute_flops_per_cycle']:,} FLOP/cycle ({_pct(roof['compute_utilization'])})"]
    busiest = rep["top_units"]["by_busy"][0] if rep["top_units"]["by_busy"] else None
    if (rep["bound"] == "latency-or-imbalance-bound" and busiest is not None
            and (busiest["busy_share"] or 0) >= UNIT_BOUND_SHARE):
        # neither roofline is near, but one unit never rests: the run goes at that unit's pace
        lines.append(f"  one unit sets the pace: {busiest['unit']} ({busiest['kind']}, {busiest['group']}) busy "
                     f"{_pct(busiest['busy_share'])} of the run")
    imb = rep["imbalance"]
    if imb["kind"] and imb["lead_cycles"] is None:
        lines.append(f"imbalance: none (one {imb['kind']}, {imb['busiest']})")
    elif imb["kind"]:
        cycles = roof["cycles"] or 1
        idle = f" ({imb['idle_groups']} idle)" if imb["idle_groups"] else ""
        head = (f"imbalance across {imb['groups']} {imb['kind']}s{idle}: busiest unit max/mean "
                f"{'-' if imb['ratio'] is None else format(imb['ratio'], '.2f')}; ")
        lead = f"busy {imb['lead_cycles']:,} cycles ({_pct(imb['lead_cycles'] / cycles)} of the run) longer"
        if imb["straggler"]:
            lines.append(head + f"straggler {imb['straggler']}: its busiest unit is {lead} than any other "
                                f"{imb['kind']}'s, finishes at {imb['straggler_final_clock']:,}")
        else:
            lines.append(head + f"no straggler (the busiest, {imb['busiest']}, is {lead} than the next)")
    path = rep["critical_path"]
    lines.append(f"critical path ({len(path)} hops, from the unit finishing last; busy / blocked in / blocked out "
                 f"cycles):")
    shown = path[:12]
    lines += [f"  {h['unit']} ({h['kind']}, {h['group']}): {h['busy_cycles']:,} / {h['blocked_input_cycles']:,} / "
              f"{h['blocked_output_cycles']:,}" for h in shown]
    if len(path) > len(shown):
        lines.append(f"  ... {len(path) - len(shown)} more hops (--json has all)")
    lines.append("top units by busy share:")
    lines += [f"  {u['unit']} ({u['kind']}, {u['group']}): {_pct(u['busy_share'])}"
              for u in rep["top_units"]["by_busy"][:5]]
    lines.append("top groups by their busiest unit's busy share: " + ", ".join(
        f"{g['group']} {_pct(g['max_unit_busy_cycles'] / (roof['cycles'] or 1))}"
        for g in rep["top_units"]["groups"][:5]))
    fifos = rep["full_fifos"]
    if fifos["source"] == "timeline":
        lines.append(f"FIFOs full at some point: {fifos['n_full']} (largest stall first: cycles the producer "
                     f"waited on the FIFO while its consumer was busy):")
        lines += [f"  {f['channel']} depth {f['capacity']}: stall {f['stall_cycles']:,} cycles; full "
                  f"{f['full_cycles']:,} cycles; consumer {f['consumer']}" for f in fifos["full"][:5]]
    else:
        lines.append(f"FIFOs full at some point: {fifos['n_full']} (longest producer back-pressure first):")
        lines += [f"  {f['channel']} depth {f['capacity']}: {f['producer']} blocked on output "
                  f"{f['producer_blocked_output_cycles']:,} cycles" for f in fifos["full"][:5]]
    lines.append(f"FIFOs never above one element: {fifos['n_never_above_one']}")
    spills = rep.get("spills")
    if spills is not None:  # an ONNX model: its spilled edges move 2x their tensor off chip
        lines.append(f"spilled edges: {len(spills['edges'])}" + ("" if spills["edges"] else " (every edge fused)"))
        lines += [f"  {edge}: {why}" for edge, why in spills["edges"].items()]
        lines += [f"  converter {key} ({what}): replaced by a spill" for key, what in spills["converters"].items()]
    return "\n".join(lines)


def _busy_before(starts, ends, edges):
    """Busy cycles before each edge of one set of disjoint intervals ``[starts, ends)``."""
    import numpy as np

    s, e = np.sort(np.asarray(starts, dtype=float)), np.sort(np.asarray(ends, dtype=float))
    # busy time before t: sum over intervals of clip(t - s, 0, e - s) = sum_{s<t}(t - s) - sum_{e<t}(t - e)
    cs, ce = np.r_[0, np.cumsum(s)], np.r_[0, np.cumsum(e)]
    ns, ne = np.searchsorted(s, edges), np.searchsorted(e, edges)
    return ns * edges - cs[ns] - (ne * edges - ce[ne])


def busy_over_time(timeline, groups: list[str], units_per_group: list[int] | None = None, bins: int = 100):
    """``(edges, share)``: per group, the busy share of its busiest unit in each of ``bins`` equal windows of the
    run (``share[g, k]`` in [0, 1]: the largest over the group's units of the unit's busy cycles in window k
    over the window's cycles; ``edges`` in cycles). With ``units_per_group`` the share is the mean over the
    group's units instead (busy cycles of all its units over ``units * window``). Exact: integrates the busy
    intervals."""
    import numpy as np

    iv = timeline.intervals.to_pydict()
    end = max(iv["end"], default=0)
    edges = np.linspace(0, max(end, 1), bins + 1)
    share = np.zeros((len(groups), bins))
    index = {g: k for k, g in enumerate(groups)}
    per_unit: dict[tuple[str, str], tuple[list, list]] = {}
    for unit, g, state, s, e in zip(iv["unit"], iv["group"], iv["state"], iv["start"], iv["end"]):
        if state == "busy" and g in index:
            starts, ends = per_unit.setdefault((g, unit), ([], []))
            starts.append(s)
            ends.append(e)
    width = np.diff(edges)
    for (g, _), (starts, ends) in per_unit.items():
        k = index[g]
        unit_share = np.diff(_busy_before(starts, ends, edges)) / width
        if units_per_group is None:
            share[k] = np.maximum(share[k], unit_share)
        else:
            share[k] += unit_share / max(units_per_group[k], 1)
    return edges, share


def write_png(rep: dict, path: str | os.PathLike, timeline=None) -> Path:
    """Bars of the busy / blocked-in / blocked-out share of each group's units (groups on the critical path in
    red) and, with the run's timeline, a heat map of each group's busiest unit's busy share over time; needs
    matplotlib (the ``plot`` extra). Written atomically (:func:`stepsim.base.figures.save_figure`)."""
    from stepsim.base.figures import require_matplotlib, save_figure, si_axis

    plt = require_matplotlib()
    groups = rep["top_units"]["groups"][:40]
    on_path = {h["group"] for h in rep["critical_path"]}
    cycles = rep["roofline"]["cycles"] or 1
    height = max(0.24 * len(groups) + 1.8, 3.0)
    if timeline is None:
        fig, ax = plt.subplots(figsize=(7, height))
    else:
        fig, (ax, heat) = plt.subplots(1, 2, figsize=(13, height), gridspec_kw={"width_ratios": [1, 1.3]})
    y = list(range(len(groups)))[::-1]
    units = [max(g["units"], 1) * cycles for g in groups]  # per-group share of its units' time
    busy = [g["busy_cycles"] / n for g, n in zip(groups, units, strict=True)]
    bin_ = [g["blocked_input_cycles"] / n for g, n in zip(groups, units, strict=True)]
    bout = [g["blocked_output_cycles"] / n for g, n in zip(groups, units, strict=True)]
    ax.barh(y, busy, color="tab:blue", label="busy")
    ax.barh(y, bin_, left=busy, color="tab:orange", label="blocked on input")
    ax.barh(y, bout, left=[a + b for a, b in zip(busy, bin_, strict=True)], color="tab:gray",
            label="blocked on output")
    ax.set_yticks(y, [g["group"] for g in groups], fontsize=8)
    for tick, g in zip(ax.get_yticklabels(), groups, strict=True):
        if g["group"] in on_path:
            tick.set_color("red")
            tick.set_fontweight("bold")
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of the run's cycles (mean over the group's units)", fontsize=9)
    ax.set_title(f"{rep.get('workload')}: {rep['bound']}; groups on the critical path in red", fontsize=10)
    ax.legend(fontsize=8, loc="lower right", framealpha=0.9)
    if timeline is not None:
        names = [g["group"] for g in groups]
        edges, share = busy_over_time(timeline, names)
        image = heat.imshow(share, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest",
                            extent=(edges[0], edges[-1], len(names) - 0.5, -0.5))
        heat.set_yticks(range(len(names)), names, fontsize=8)
        for tick, name in zip(heat.get_yticklabels(), names, strict=True):
            if name in on_path:
                tick.set_color("red")
                tick.set_fontweight("bold")
        heat.set_xlabel("cycle", fontsize=9)
        si_axis(heat.xaxis)  # 200k, 1.5M cycles
        heat.set_title("busy share of each group's busiest unit over time", fontsize=10)
        bar = fig.colorbar(image, ax=heat, fraction=0.04, pad=0.02)
        bar.set_label("busy share (0 idle, 1 always busy)", fontsize=9)
    return save_figure(fig, Path(path))


def to_json(rep: dict) -> str:
    return json_text(rep)
