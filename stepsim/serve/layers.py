"""One serving layer's pieces on the cycle engine, each built once per shape and rebound per iteration.

A serving iteration runs, per decoder layer, three stepsim workloads (docs/serving.md §9):

* ``decode``: GQA decode attention of one KV head over the decoding requests' KV lengths
  (:func:`stepsim.workloads.attention.build.build_attention`, dynamic strategy, the artifact's plain softmax);
* ``prefill``: causal prefill attention of one KV head over the prompt chunks
  (:func:`stepsim.workloads.prefill_attention.build.build_prefill_attention`);
* ``ffn``: the MoE block (routed and shared experts, :func:`stepsim.workloads.moe.build.build_moe`, static
  tiling) over every token of the iteration with that layer's routing, or a dense model's FFN (the same
  builder with one expert every token goes to). Its FIFOs hold 64 elements: with the paper's depth of 2, a
  prefill chunk of a couple of thousand tokens with skewed routing deadlocks the token-order reassembly (the
  engine proves it), which a serving engine's buffers never do. A piece that still deadlocks is run again at
  256, 1024, then 4096 elements (:data:`FFN_DEPTHS`), so the depth is a function of the piece's data alone.
  Deeper FIFOs cost engine time (every channel's buffer is allocated per run).

**Rebinding.** Which graph a builder makes depends only on a *shape* (decode: requests; prefill: requests and
query tiles; ffn: tokens); the KV lengths and the routing enter the engine program only as the values of
metadata sources (``Program.payload``) and the targets of selector sources (``Program.sel_idx``). A
:class:`Template` builds and lowers a shape once, from *marker* data chosen so that every data-derived source is
recognisable by its values (no two candidate arrays coincide), records where those values sit, and for each
iteration writes the new values there (:meth:`Template.bind`). Nothing else of the program changes, which
``tests/serve/test_exact.py`` checks array for array against a fresh build, and cycle for cycle. On a system the
FFN is the sharded block (:mod:`stepsim.workloads.moe.sharded`), whose FIFO depths follow its token count, not its
routing; every chip with tokens has its own selectors of its shard's rows, rebound by chip (``<name>.<chip>``,
:func:`source_values`; ``tests/serve/test_serve_system_templates.py``).

Each shape's on-chip requirement (the workload's ``on_chip_bytes``) is checked against the hardware when its
template is made: a layer that does not fit is a one-line error saying by how much.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from stepsim.base.defaults import UNSET, resolve_channel_depth
from stepsim.base.errors import StepsimError
from stepsim.base.hardware import Hardware
from stepsim.graph.lower import lower
from stepsim.kernels import abi
from stepsim.models.presets import ModelConfig, MoEModel
from stepsim.workloads.attention.build import kv_metadata
from stepsim.workloads.prefill_attention.build import query_tiles, region_source_name

#: KV rows per tile of the decode attention (the paper's) and of the prefill attention
KV_TILE = 32
KINDS = ("decode", "prefill", "ffn")
#: FIFO depths of the FFN graphs, tried in turn while the engine proves a deadlock (module docstring)
FFN_DEPTHS = (64, 256, 1024, 4096)


@dataclass(frozen=True)
class LayerSpec:
    """What a serving layer's graphs depend on besides their shape: the model's dimensions, the hardware and
    the KV-cache rows reserved per request (``max_n``, a multiple of :data:`KV_TILE`); with a ``system``
    (:class:`~stepsim.base.system.System`), the MoE block's experts on its chips by expert parallelism,
    contiguously, and a step's tokens sharded over them when it has at least one a chip
    (:mod:`stepsim.serve.system`)."""

    model: ModelConfig
    hardware: Hardware
    max_n: int
    system: object = None
    #: ``"paper"``: the STeP paper's evaluation schedules; ``"auto"``: the FFN, the decode and the prefill attention
    #: mapped over the whole chip (:mod:`stepsim.mapping`; with a ``system``, the MoE block's experts over its chips
    #: each chip's share mapped, :mod:`stepsim.mapping.expert_parallel`)
    schedule: str = "paper"

    @property
    def ffn_model(self) -> MoEModel:
        m = self.model
        if m.is_moe:
            return m.moe
        return MoEModel(m.name, hidden=m.hidden, intermediate=m.dense_intermediate, experts=1, top_k=1)


# --------------------------------------------------------------------------------------- data -> source values
def _decode_values(kv: np.ndarray) -> dict[str, np.ndarray]:
    seq_len_tiled, offset = kv_metadata(kv, KV_TILE)
    return {"seq_len_tiled": seq_len_tiled, "offset": offset}


def _prefill_values(data: tuple[np.ndarray, np.ndarray], regions: int = 1) -> dict[str, np.ndarray]:
    """The query tiles' requests and KV-tile counts; with ``regions`` > 1 (a mapped layer) each region's own, by
    its sources' names (query tile ``j`` in region ``j % regions``: the builder's dealing)."""
    request, group = query_tiles(data[0], data[1], KV_TILE)
    if regions == 1:
        return {"request": request, "groups": group + 1}
    return {region_source_name(r, name): value[r::regions] for r in range(regions)
            for name, value in (("request", request), ("kv_tiles", group + 1))}


def _ffn_values(routing: np.ndarray) -> dict[str, np.ndarray]:
    if routing.shape[1] == 1:  # top-1: a token's sorted experts are its one slot
        return {"experts_by_slot": routing.ravel()}
    return {"experts_sorted": np.sort(routing, axis=1).ravel(), "experts_by_slot": routing.ravel()}


def _elements(kind: str, name: str, data) -> int:
    """Source elements holding value array ``name`` (a selector of a token's experts has top_k targets)."""
    if kind == "ffn" and name == "experts_sorted":
        return len(data)
    return len(VALUES[kind](data)[name])


VALUES: dict[str, Callable] = {"decode": _decode_values, "prefill": _prefill_values, "ffn": _ffn_values}


def source_values(kind: str, data, chips: int = 0, regions: int = 1) -> dict[str, np.ndarray]:
    """``VALUES[kind](data)``; for the FFN on ``chips`` chips (a system), each chip with tokens has its own
    selectors of its shard's rows (:mod:`stepsim.workloads.moe.sharded`): ``<name>.<chip>``; for the prefill
    attention of ``regions`` > 1 regions, each region's values (:func:`_prefill_values`)."""
    if kind == "prefill":
        return _prefill_values(data, regions)
    if kind != "ffn" or not chips:
        return VALUES[kind](data)
    from stepsim.workloads.moe.sharded import shard_bounds

    bounds = shard_bounds(len(data), chips)
    return {f"{name}.{c}": value for c in range(chips) if bounds[c + 1] > bounds[c]
            for name, value in _ffn_values(data[bounds[c]:bounds[c + 1]]).items()}


def _source_elements(kind: str, name: str, data, chips: int) -> int:
    """Source elements holding value array ``name`` of :func:`source_values`."""
    if kind != "ffn" or not chips:
        return _elements(kind, name, data)
    from stepsim.workloads.moe.sharded import shard_bounds

    base, chip = name.rsplit(".", 1)
    bounds = shard_bounds(len(data), chips)
    return _elements(kind, base, data[bounds[int(chip)]:bounds[int(chip) + 1]])


# --------------------------------------------------------------------------------------- marker data per shape
def marker(kind: str, shape: tuple, spec: LayerSpec):
    """Data of ``shape`` whose source values are all distinct arrays (see the module docstring)."""
    if kind == "decode":
        (b,) = shape
        i = np.arange(b, dtype=np.int64)
        # offset (7i + 5) % 31 and tiles i % 5 + 3 differ from each other and from 0..b-1 at i = 0
        return KV_TILE * (i % 5 + 2) + (7 * i + 5) % 31
    if kind == "prefill":
        requests, tiles = shape
        per = np.full(requests, tiles // requests, dtype=np.int64)
        per[: tiles % requests] += 1  # query tiles of each request, >= 1
        cached = KV_TILE * (np.arange(requests, dtype=np.int64) % 3 + 1) + 1  # chunks start inside tile 1..3
        chunk = KV_TILE * per - 1
        return cached, chunk
    (tokens,) = shape
    m = spec.ffn_model
    # descending within a row, so the by-slot order differs from the sorted one
    rows = (np.arange(tokens)[:, None] * 7 - np.arange(m.top_k)[None, :] * 3 + 3 * m.top_k) % m.experts
    rows = _distinct_rows(rows, m.experts)
    if spec.system is not None:  # chips' shards of equal length must differ: chip c's first token takes experts
        from stepsim.workloads.moe.sharded import shard_bounds  # c + k - 1 .. c (a cyclic run: distinct per c)

        bounds = shard_bounds(tokens, spec.system.chips)
        for c in range(spec.system.chips):
            if bounds[c + 1] > bounds[c]:
                rows[bounds[c]] = (c + m.top_k - 1 - np.arange(m.top_k)) % m.experts
    return rows


def _distinct_rows(rows: np.ndarray, experts: int) -> np.ndarray:
    """``rows`` with duplicates in a row moved to the next free expert."""
    out = rows.copy()
    for r in range(len(out)):
        seen: set[int] = set()
        for j in range(out.shape[1]):
            e = int(out[r, j])
            while e in seen:
                e = (e + 1) % experts
            seen.add(e)
            out[r, j] = e
    return out


def shape_of(kind: str, data) -> tuple:
    """The template key of ``data``."""
    if kind == "decode":
        return (len(data),)
    if kind == "prefill":
        request, _ = query_tiles(data[0], data[1], KV_TILE)
        return (len(data[0]), len(request))
    return (len(data),)


def build(kind: str, data, spec: LayerSpec, depth: int = FFN_DEPTHS[0]):
    """The workload of one layer piece (fresh, no template); ``depth``: the FFN's FIFO depth."""
    from stepsim.workloads.attention.build import build_attention
    from stepsim.workloads.moe.build import build_moe
    from stepsim.workloads.prefill_attention.build import build_prefill_attention

    a = spec.model.attention
    if spec.schedule == "auto" and kind in MAPPED_KINDS:
        return _mapped(kind, data, spec, depth)
    if kind == "decode":
        return build_attention(data, "dynamic", head_dim=a.head_dim, query_per_kv_head=a.query_per_kv_head,
                               max_n=spec.max_n, shared_kv=spec.model.shared_kv)
    if kind == "prefill":
        return build_prefill_attention(data[0], data[1], head_dim=a.head_dim,
                                       query_per_kv_head=a.query_per_kv_head, tile_n=KV_TILE, max_n=spec.max_n,
                                       shared_kv=spec.model.shared_kv)
    with warnings.catch_warnings():  # tile_n above a small iteration's token count: padding, said in the docs
        warnings.simplefilter("ignore")
        parallel = {}
        if spec.system is not None:  # the batch sharded over the chips (a chip past the batch holds no tokens)
            parallel = {"ep": spec.system.chips, "placement": "contiguous", "system": spec.system}
        workload = build_moe(spec.ffn_model, data, **parallel)
    workload.channel_depth = depth
    return workload


def piece_dims(kind: str, model: ModelConfig):
    """The dimensions the mapper takes for a piece of ``kind`` of ``model``'s layer
    (:func:`stepsim.mapping.kinds.layer_dims`), with ``"shared_kv": True`` for an attention piece whose one cache is
    the keys and the values (an MLA layer group's engine model, :attr:`ModelConfig.shared_kv`); absent otherwise,
    so a GQA layer's schedules keep their keys. Added here rather than in ``layer_dims``: ``mapping/kinds/common.py``
    is hashed into every kind's schedule key (:func:`stepsim.mapping.mapper.source_files`), and an edit there
    would drop every cached FFN schedule, which this does not change."""
    from stepsim.mapping.kinds import layer_dims

    dims = layer_dims(kind, model)
    if kind != "ffn" and model.shared_kv:
        dims = {**dims, "shared_kv": True}
    return dims


#: the pieces ``schedule="auto"`` maps (:mod:`stepsim.mapping`)
MAPPED_KINDS = ("decode", "ffn", "prefill")


def _mapped(kind: str, data, spec: LayerSpec, depth: int):
    """The piece built with the schedule mapped at its shape's bucket; its compute units are those of the
    mapper's representative data at the same shape, so they depend on the shape alone (a template rebound to any
    data is the piece built for that data)."""
    from stepsim.mapping import mapped_workload, schedule_for
    from stepsim.mapping.kinds.prefill import prefill_size

    if spec.system is not None and kind == "ffn":  # an MoE block over the chips, each chip's share mapped
        from stepsim.mapping.expert_parallel import mapped_ep_workload

        return mapped_ep_workload(spec.ffn_model, data, spec.system, spec.hardware, channel_depth=depth)[0]
    # the attention on a system: one chip's share of the heads (spec.model), the chips side by side
    dims = piece_dims(kind, spec.model)
    size = prefill_size(data, dims) if kind == "prefill" else len(data)
    schedule = schedule_for(kind, size, dims, spec.hardware)
    workload, _ = mapped_workload(kind, data, dims, spec.hardware, schedule.knobs, max_n=spec.max_n)
    if kind == "ffn":
        workload.channel_depth = depth
    return workload


class RebindError(StepsimError):
    """A template could not locate its data-derived sources (a builder changed): a stepsim bug."""


@dataclass
class Template:
    """A lowered program of one (kind, shape) and where its data-derived values sit.

    Attributes
    ----------
    program : Program
    payload_slots : list of (start, stop, name)
        Slices of ``program.payload`` holding ``VALUES[kind](data)[name]``.
    sel_slots : list of (start, stop, name)
        Slices of ``program.sel_idx`` holding ``VALUES[kind](data)[name]``.
    on_chip_bytes : int
        The shape's on-chip requirement (checked against the hardware).
    build_s : float
        Seconds spent building and lowering it.
    chips : int
        The system's chips the FFN is sharded over (values per chip, :func:`source_values`); 0 on one chip.
    """

    kind: str
    program: object
    payload_slots: list
    sel_slots: list
    on_chip_bytes: int
    build_s: float
    chips: int = 0
    #: the prefill attention's regions (its values are each region's, :func:`source_values`); 1 elsewhere
    regions: int = 1

    def bind(self, data):
        """The program with ``data``'s values written in (a new Program; the template is untouched)."""
        values = source_values(self.kind, data, self.chips, self.regions)
        replace = {}
        if self.payload_slots:
            payload = self.program.payload.copy()
            for start, stop, name in self.payload_slots:
                payload[start:stop] = values[name]
            payload.setflags(write=False)
            replace["payload"] = payload
        if self.sel_slots:
            sel_idx = self.program.sel_idx.copy()
            for start, stop, name in self.sel_slots:
                sel_idx[start:stop] = values[name]
            sel_idx.setflags(write=False)
            replace["sel_idx"] = sel_idx
        return dataclasses.replace(self.program, **replace)


def lowered(workload, hardware: Hardware):
    """``workload`` lowered as :func:`stepsim.simulation.simulate.simulate` lowers it on ``hardware``."""
    depth = resolve_channel_depth(UNSET, hardware, workload.channel_depth)
    return lower(workload.graph, hardware, channel_depth=depth, channel_depths=workload.channel_depths)


def make_template(kind: str, shape: tuple, spec: LayerSpec, depth: int = FFN_DEPTHS[0]) -> Template:
    """Build and lower ``kind`` at ``shape`` from marker data, and locate its data-derived values."""
    start = time.perf_counter()
    data = marker(kind, shape, spec)
    workload = build(kind, data, spec, depth)
    on_chip = int(workload.metrics()["on_chip_bytes"])
    if spec.system is None:
        spec.hardware.check_on_chip(on_chip, f"serving layer {kind!r} at shape {shape}")
    else:  # each chip holds its own operators' buffers: the busiest chip must fit
        chip, needed = busiest_chip_on_chip(workload)
        spec.hardware.check_on_chip(needed, f"serving layer {kind!r} at shape {shape} on chip {chip}")
    program = lowered(workload, spec.hardware)
    chips = spec.system.chips if kind == "ffn" and spec.system is not None else 0
    regions = int(workload.params.get("regions", 1)) if kind == "prefill" else 1
    values = source_values(kind, data, chips, regions)
    if chips and spec.ffn_model.top_k == spec.ffn_model.experts:  # every token takes every expert: the sorted
        # selectors are the same for any routing, and alike across chips (no marker tells them apart): kept as built
        values = {name: value for name, value in values.items() if not name.startswith("experts_sorted.")}
    payload_slots, sel_slots = [], []
    params = program.unit_params
    for u in range(program.n_units):
        op = int(params[u, abi.UP_OPCODE])
        n = int(params[u, abi.UP_A0 + abi.PA_N_ELEMS])
        off = int(params[u, abi.UP_A0 + abi.PA_VALUES_OFF])
        if op not in (abi.OP_METADATA_GEN, abi.OP_SELECT_GEN):
            continue
        if op == abi.OP_METADATA_GEN:
            lo, hi, slots, array = off, off + n, payload_slots, program.payload
        else:
            lo, hi, slots, array = int(program.sel_ptr[off]), int(program.sel_ptr[off + n]), sel_slots, program.sel_idx
        if regions > 1:  # each region's sources by name: their values can be alike (one request: all zeros)
            if program.unit_names[u] in values:
                payload_slots.append((lo, hi, program.unit_names[u]))
            continue
        matches = [name for name, want in values.items()
                   if _source_elements(kind, name, data, chips) == n and len(want) == hi - lo and np.array_equal(array[lo:hi], want)]
        if len(matches) > 1:
            raise RebindError(f"serving layer {kind!r} at shape {shape}: the marker data make {matches} alike "
                              "(stepsim bug)")
        slots.extend((lo, hi, name) for name in matches)
    found_names = {name for *_, name in payload_slots + sel_slots}
    needed = set(values) if kind != "ffn" or spec.ffn_model.experts > 1 else set()  # one expert: constant
    if not needed <= found_names:
        raise RebindError(f"serving layer {kind!r} at shape {shape}: the program holds no source of "
                          f"{sorted(needed - found_names)} (a builder changed; stepsim bug)")
    return Template(kind, program, payload_slots, sel_slots, on_chip, time.perf_counter() - start, chips, regions)


def busiest_chip_on_chip(workload) -> tuple[int, int]:
    """``(chip, bytes)``: the chip whose operators need the most on-chip memory (bytes; an operator's ``chip``,
    0 when unplaced), ties to the lower chip."""
    values = workload.op_values()
    per_chip: dict[int, int] = {}
    for op in workload.graph.ops:
        value = values.get(op.name)
        if value is not None:
            chip = getattr(op, "chip", 0)
            per_chip[chip] = per_chip.get(chip, 0) + int(value.on_chip_bytes)
    return max(sorted(per_chip.items()), key=lambda item: item[1], default=(0, 0))


@dataclass
class LayerRunner:
    """Templates of one process, and the time spent building versus running them."""

    spec: LayerSpec
    templates: dict = dataclasses.field(default_factory=dict)
    build_s: float = 0.0
    bind_s: float = 0.0
    engine_s: float = 0.0
    builds: int = 0
    runs: int = 0

    def cycles(self, kind: str, data) -> int:
        """Engine cycles of one layer piece on ``data`` (its template built on first use, on a system too: the
        sharded layer's FIFO depths follow its token count, not its routing, :mod:`stepsim.workloads.moe.sharded`)."""
        return self._first_completing(kind, lambda depth: self._bound_program(kind, data, depth))

    def fresh_cycles(self, kind: str, data) -> int:
        """Engine cycles of one layer piece built, checked (per chip on a system) and lowered for ``data`` alone,
        deeper FIFOs while the engine proves a deadlock (as :meth:`cycles`)."""
        return self._first_completing(kind, lambda depth: self._fresh_program(kind, data, depth))

    def _bound_program(self, kind: str, data, depth: int):
        """The program of ``kind``'s template at ``depth`` (built on first use), rebound to ``data``."""
        key = (kind, shape_of(kind, data), depth)
        template = self.templates.get(key)
        if template is None:
            template = self.templates[key] = make_template(kind, key[1], self.spec, depth)
            self.build_s += template.build_s
            self.builds += 1
        t0 = time.perf_counter()
        program = template.bind(data)
        self.bind_s += time.perf_counter() - t0
        return program

    def _fresh_program(self, kind: str, data, depth: int):
        """The program of ``kind`` built for ``data`` at ``depth``, its on-chip bytes checked per chip."""
        t0 = time.perf_counter()
        workload = build(kind, data, self.spec, depth)
        chip, needed = busiest_chip_on_chip(workload)
        self.spec.hardware.check_on_chip(needed, f"serving layer {kind!r} at shape {shape_of(kind, data)} on "
                                                  f"chip {chip}")
        program = lowered(workload, self.spec.hardware)
        self.build_s += time.perf_counter() - t0
        self.builds += 1
        return program

    def _first_completing(self, kind: str, program_at) -> int:
        """Cycles of ``program_at(depth)`` at the first FIFO depth of :data:`FFN_DEPTHS` the engine does not prove
        deadlocked (the attention: the first depth only), so the depth depends on the piece's data alone."""
        from stepsim.analysis.deadlock import run_diagnosed
        from stepsim.base.errors import DeadlockError

        depths = FFN_DEPTHS if kind == "ffn" else FFN_DEPTHS[:1]
        for i, depth in enumerate(depths):
            program = program_at(depth)
            t1 = time.perf_counter()
            try:
                result = run_diagnosed(program)
            except DeadlockError:
                if i + 1 == len(depths):
                    raise
                continue
            finally:
                self.engine_s += time.perf_counter() - t1
                self.runs += 1
            return int(result.cycles)
        raise AssertionError("unreachable")
