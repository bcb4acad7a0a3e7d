"""The ``projection`` kind: a matrix product of a step's tokens against weights streamed from HBM, mapped over the chip.

A serving layer's q/k/v projections (fused: one ``d x (h_q + 2 H) hd`` matrix), its o projection, an MoE router and
the LM head are each ``y = x W`` with ``x`` the step's ``tokens`` rows of ``d_in`` (bf16 in HBM) and ``W`` a
``d_in x d_out`` bf16 matrix; the shape is ``(tokens, d_in, d_out)``. The graph (:func:`build_projection`):

* the token rows load once as tiles of ``tile_m`` rows (the last zero-padded: the tensor has
  ``ceil(tokens / tile_m) tile_m`` rows), in ``k_parts`` column slices of ``d_in / k_parts`` (tensors ``x.k<k>``:
  the reduction dimension split, as a GEMM's split-K);
* ``lanes`` column stripes, each split ``k_parts`` ways: lane ``(j, k)`` holds ``n_j`` weight tiles of
  ``d_in / k_parts x tile_f`` (tensor ``w.lane<j>.k<k>``, or ``w.lane<j>`` unsplit; the ``ceil(d_out / tile_f)``
  tiles dealt as evenly as they go, the first lanes one more; a ``d_out`` no ``tile_f`` divides is zero-padded to
  whole tiles), re-read once per token tile, and multiplies each token slice by each of them (one ``Map(Matmul)``);
  lane ``j``'s ``k_parts`` partial sums are added pairwise (``Map(Add)``, a tree) and its ``tile_m x tile_f``
  results stored (tensor ``y.lane<j>``, fp32 as the paper's outputs).

Each lane's weight load streams on its own (one request a cycle: docs/timing_model.md §4.1), so the weights arrive
at up to ``lanes x k_parts`` times one load's rate; and each Matmul reads its token tile from on-chip memory at
``pmu_bw`` (§3.1), which splitting ``d_in`` divides by ``k_parts``: without the split a prefill's narrow
projection (a tensor-parallel shard's q/k/v, ``d_out`` 768) is bound by that read, not by the HBM. The traffic and
the Matmuls' FLOPs do not depend on the lanes or the split. Space: ``tile_m`` (powers of two, the largest
``min(bucket, MAX_TILE_M)`` and down to an eighth of it), ``tile_f`` (32, 64, 128), ``lanes`` (powers of two up to
``ceil(d_out / tile_f)`` and :data:`MAX_LANES`) and ``k_parts`` (powers of two dividing ``d_in``, at most
:data:`MAX_K_PARTS` and ``MAX_LANES / lanes``). Bound from the knobs alone (:func:`projection_bound`): the weights'
bytes (once per token tile) at the HBM's peak, and the busiest lane's requests one a cycle. The search and its
cache are the mapper's (:func:`map_projection`), its key of kind ``projection`` with this module's source in it, so
no other kind's cached schedule depends on this module.
"""

from __future__ import annotations

from stepsim.base.files import file_sha256, stable_hash
from stepsim.base.hardware import Hardware
from stepsim.mapping.schedule import Schedule

#: F columns per weight tile the search tries
TILE_F_CHOICES = (32, 64, 128)
#: at most this many column stripes (each a compute and a memory operator, plus the store's)
MAX_LANES = 128
#: ways the reduction dimension ``d_in`` is split at most
MAX_K_PARTS = 16
#: token rows per tile at most (a prefill chunk's tile of d_in fp32 values stays a few memory units)
MAX_TILE_M = 256
#: token tiles tried: the largest and down to 1 / 2**this of it
TILE_M_HALVINGS = 3
#: bumped whenever the graph, the space or the search change
PROJECTION_VERSION = 2


def _powers_of_two(limit: int) -> list[int]:
    out, p = [], 1
    while p <= limit:
        out.append(p)
        p *= 2
    return out


def projection_space(tokens: int, d_in: int, d_out: int) -> list[dict]:
    """Every candidate's knobs at ``tokens`` tokens (module docstring), in a fixed order."""
    top = min(1 << max(0, (tokens - 1).bit_length()), MAX_TILE_M)
    tile_ms = [m for m in _powers_of_two(top) if m * (1 << TILE_M_HALVINGS) >= top]
    space = []
    for tile_f in TILE_F_CHOICES:
        stripes = -(-d_out // tile_f)
        for lanes in _powers_of_two(min(MAX_LANES, stripes)):
            for k_parts in _powers_of_two(min(MAX_K_PARTS, MAX_LANES // lanes)):
                if d_in % k_parts == 0:
                    space.extend({"tile_m": m, "tile_f": tile_f, "lanes": lanes, "k_parts": k_parts}
                                 for m in tile_ms)
    return space


def lane_tiles(stripes: int, lanes: int) -> list[int]:
    """Weight tiles (column stripes of ``tile_f``) of each lane: ``stripes`` dealt as evenly as they go, the first
    lanes one more."""
    base, extra = divmod(stripes, lanes)
    return [base + (j < extra) for j in range(lanes)]


def projection_bound(knobs: dict, tokens: int, d_in: int, d_out: int, hardware: Hardware) -> int:
    """A lower bound on the candidate's cycles from its knobs (module docstring): the weights, read once per token
    tile, at the HBM's peak; and the busiest lane's weight requests (each row of a ``d_in x tile_f`` bf16 tile is
    ``ceil(2 tile_f / addr_offset)`` requests) issued one a cycle."""
    m_tiles = -(-tokens // knobs["tile_m"])
    weight_bytes = m_tiles * d_in * d_out * 2
    busiest = lane_tiles(-(-d_out // knobs["tile_f"]), knobs["lanes"])[0]
    rows = d_in // knobs.get("k_parts", 1)  # a lane's slice of the weights
    requests = m_tiles * busiest * rows * -(-2 * knobs["tile_f"] // hardware.addr_offset)
    return max(-(-weight_bytes // hardware.hbm_peak_bytes_per_cycle), requests)


def build_projection(tokens: int, d_in: int, d_out: int, knobs: dict, compute_bw: int = 1):
    """The projection workload (module docstring) with every Matmul at ``compute_bw`` (the mapper replaces it)."""
    from stepsim.graph import (
        BF16,
        FP32,
        Add,
        Graph,
        LinearOffChipLoad,
        LinearOffChipStore,
        Map,
        Matmul,
        RepeatStatic,
        Tensor,
    )
    from stepsim.workloads.base import Workload

    tile_m, tile_f, lanes = knobs["tile_m"], knobs["tile_f"], knobs["lanes"]
    k_parts = knobs.get("k_parts", 1)
    m_tiles, rows = -(-tokens // tile_m), d_in // k_parts
    g = Graph(f"projection-{tokens}x{d_in}x{d_out}")
    slices = [Tensor("x" if k_parts == 1 else f"x.k{k}", (m_tiles * tile_m, rows), BF16) for k in range(k_parts)]
    tiles = [LinearOffChipLoad(g, x, (tile_m, rows), (m_tiles,), (1,), stream_dtype=FP32) for x in slices]
    for j, n_f in enumerate(lane_tiles(-(-d_out // tile_f), lanes)):
        partials = []
        for k, x_tiles in enumerate(tiles):
            w = Tensor(f"w.lane{j}" if k_parts == 1 else f"w.lane{j}.k{k}", (rows, n_f * tile_f), BF16)
            weights = LinearOffChipLoad(g, w, (rows, tile_f), (n_f,), (1,), ref=x_tiles, stream_dtype=FP32)
            partials.append(Map(g, [RepeatStatic(g, x_tiles, n_f), weights], Matmul(), compute_bw=compute_bw))
        while len(partials) > 1:  # the split-K partial sums added pairwise
            partials = [Map(g, partials[i:i + 2], Add(), compute_bw=compute_bw) if i + 1 < len(partials)
                        else partials[i] for i in range(0, len(partials), 2)]
        LinearOffChipStore(g, partials[0], tensor_name=f"y.lane{j}")
    flops = 2 * m_tiles * tile_m * d_in * d_out
    return Workload(name="projection", graph=g, channel_depth=None, algorithmic_flops=flops,
                    params=dict(tokens=tokens, d_in=d_in, d_out=d_out, **knobs))


def mapped_projection(tokens: int, d_in: int, d_out: int, knobs: dict, hardware: Hardware):
    """``(workload, compute units used)``: the projection built with ``knobs``, its Matmuls' ``compute_bw`` from the
    compute units they get (:func:`stepsim.mapping.units.assign_compute_units`).

    Raises
    ------
    Infeasible
        More compute operators than the chip has compute units.
    """
    from stepsim.mapping.units import assign_compute_units

    workload = build_projection(tokens, d_in, d_out, knobs)
    return workload, assign_compute_units(workload, hardware)


def evaluate_projection(tokens: int, d_in: int, d_out: int, hardware: Hardware, *, exhaustive: bool = False):
    """Every candidate at ``tokens``: ``(schedule, rows)`` as :func:`stepsim.mapping.mapper.evaluate` gives them.
    Candidates in order of their knob bound (ties in space order); a candidate whose bound (from the knobs, then
    from the built graph) reaches the best cycles so far is pruned unless ``exhaustive``."""
    from stepsim.base.errors import DeadlockError
    from stepsim.mapping.mapper import _simulate
    from stepsim.mapping.units import Infeasible, usage

    space = projection_space(tokens, d_in, d_out)
    rows = [{"knobs": k, "status": None, "bound_cycles": projection_bound(k, tokens, d_in, d_out, hardware),
             "cycles": None, "why": None} for k in space]
    best = None
    for row in sorted(rows, key=lambda r: r["bound_cycles"]):
        knobs = row["knobs"]
        if best is not None and not exhaustive and row["bound_cycles"] >= best.cycles:
            row.update(status="pruned", why="bound from the knobs")
            continue
        try:
            workload, units = mapped_projection(tokens, d_in, d_out, knobs, hardware)
            use = usage(workload, hardware, units)
        except Infeasible as exc:
            row.update(status="infeasible", why=str(exc))
            continue
        row["bound_cycles"] = max(row["bound_cycles"], use.bound_cycles)
        if best is not None and not exhaustive and row["bound_cycles"] >= best.cycles:
            row.update(status="pruned", why="bound of the built graph")
            continue
        try:
            cycles = _simulate(workload, hardware)
        except DeadlockError as exc:
            row.update(status="infeasible", why=f"deadlocks ({str(exc).splitlines()[0]})")
            continue
        row.update(status="simulated", cycles=cycles)
        if best is None or cycles < best.cycles:
            best = Schedule("projection", dict(knobs), cycles, row["bound_cycles"], use.off_chip_bytes, use.flops,
                            use.compute_units, use.memory_units, use.on_chip_bytes)
    if best is None:
        raise Infeasible(f"no schedule of the projection {tokens}x{d_in}x{d_out} fits hardware {hardware.name!r}")
    counts = {s: sum(r["status"] == s for r in rows) for s in ("simulated", "pruned", "infeasible")}
    return Schedule(**{**best.to_dict(), "candidates": counts}), rows


def _source_hash() -> str:
    """This module's, the units' and the mapper's simulation's sources: a schedule found by other code is not reused."""
    from pathlib import Path

    here = Path(__file__).parent
    return stable_hash([file_sha256(here / name) for name in ("projection.py", "units.py", "mapper.py")])


_MEMO: dict[str, Schedule] = {}
_SOURCE: dict[str, str] = {}


def key_material(tokens: int, d_in: int, d_out: int, hardware: Hardware) -> dict:
    """What a projection schedule depends on (its hash is the cache key)."""
    from stepsim.base.defaults import TIMING_MODEL_VERSION

    if "source" not in _SOURCE:
        _SOURCE["source"] = _source_hash()
    return {"projection_version": PROJECTION_VERSION, "timing_model_version": TIMING_MODEL_VERSION,
            "kind": "projection", "size": tokens, "dims": {"d_in": d_in, "d_out": d_out},
            "hardware": hardware.values(), "hardware_explicit": list(hardware.explicit), "source": _SOURCE["source"]}


def map_projection(tokens: int, d_in: int, d_out: int, hardware: Hardware, *, cache=True) -> Schedule:
    """The best projection schedule at exactly ``tokens`` tokens, cached in the process and in the mapper's folder
    (``cache``: as :func:`stepsim.mapping.mapper.map_layer`'s)."""
    from stepsim.mapping.mapper import _cache_folder, _load, _save

    material = key_material(tokens, d_in, d_out, hardware)
    key = stable_hash(material)
    if key in _MEMO:
        return _MEMO[key]
    folder = _cache_folder(cache)
    schedule = _load(folder, key) if folder is not None else None
    if schedule is None:
        schedule, _ = evaluate_projection(tokens, d_in, d_out, hardware)
        if folder is not None:
            _save(folder, key, schedule, material)
    _MEMO[key] = schedule
    return schedule


def projection_schedule(tokens: int, d_in: int, d_out: int, hardware: Hardware, *, cache=True) -> Schedule:
    """The schedule ``tokens`` tokens are built with: the one mapped at their bucket (the next power of two)."""
    return map_projection(1 << max(0, (int(tokens) - 1).bit_length()), d_in, d_out, hardware, cache=cache)


def weight_bytes(d_in: int, d_out: int) -> int:
    """Bytes of a projection's bf16 weights."""
    return d_in * d_out * 2

