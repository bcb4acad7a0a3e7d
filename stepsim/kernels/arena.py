"""Functional mode, Python side: lay out the value arena and tensor memory, read results back.

The engine's functional state is two flat arrays (see :mod:`stepsim.kernels.values` for their layout):

* ``fv`` (float32): ``capacity + 1`` blocks of ``block`` floats (tile values; the last block is the spare),
  then every tensor the program's memory operators name, once each, row-major;
* ``fi`` (int64): header, reference counts, free stack, and one row per unit saying where its tensor is.

Capacity (how many tiles may be alive at once) is chosen from the program so the arena cannot run out: a tile
is alive only while a token holding it sits in a channel slot, a unit's two stash registers or a Bufferize
arena row, plus at most two temporaries inside one step. A channel never holds more than ``min(capacity,
elements it carries)`` tokens; the element counts come from a timing run (timing does not depend on values).
Counting every FIFO slot instead would size the arena for the 1024-deep default FIFOs of every channel,
gigabytes for a layer whose channels mostly carry a handful of tiles.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepsim.base.errors import ArenaError, ArgumentError, LoweringError
from stepsim.kernels import abi as A
from stepsim.kernels import values as V

#: tiles a single step may hold besides its tokens (MapAccum's product and the new accumulator)
STEP_TEMPORARIES = 2


@dataclass(frozen=True)
class FunctionalStats:
    """What functional mode used.

    Attributes
    ----------
    arena_tiles : int
        Capacity of the value arena (tiles).
    block_elems : int
        Floats per tile block (the largest tile of the run).
    peak_tiles : int
        Most tiles alive at once.
    live_at_end : int
        Tiles still alive when the run ended (0 unless a token was left in a channel).
    allocations : int
        Tiles created (loads, compute results, pad and init tiles, split rows).
    arena_bytes : int
        Bytes of the value blocks, ``(arena_tiles + 1) * block_elems * 4``.
    """

    arena_tiles: int
    block_elems: int
    peak_tiles: int
    live_at_end: int
    allocations: int
    arena_bytes: int


def tensor_refs(program) -> dict:
    """Every tensor the program's memory operators name, by name, in unit order.

    Raises
    ------
    LoweringError
        A memory operator has no tensor (built without one, or with a symbolic shape), or two operators
        name one tensor with different shapes.
    """
    refs: dict = {}
    for u in range(program.n_units):
        op = program.opcode(u)
        if op not in A.MEMORY_READ_OPS and op not in A.MEMORY_WRITE_OPS:
            continue
        t = program.unit_tensors[u] if program.unit_tensors else None
        if t is None:
            raise LoweringError(f"{program.unit_names[u]} ({program.opcode_name(u)}): functional mode needs the "
                                "tensor the operator reads or writes (a TensorRef with static dims); it has none")
        old = refs.get(t.name)
        if old is not None and (old.rows, old.cols) != (t.rows, t.cols):
            raise LoweringError(f"{program.unit_names[u]}: tensor {t.name!r} is {t.rows}x{t.cols} here but "
                                f"{old.rows}x{old.cols} elsewhere")
        refs.setdefault(t.name, t)
    return refs


def _names(program, opcodes) -> list[str]:
    """Names of the tensors of the units with one of ``opcodes``, in unit order, once each."""
    names = []
    for u in range(program.n_units):
        if program.opcode(u) in opcodes and program.unit_tensors[u].name not in names:
            names.append(program.unit_tensors[u].name)
    return names


def stored_names(program) -> list[str]:
    """Names of the tensors some operator of the program writes."""
    return _names(program, A.MEMORY_WRITE_OPS)


def loaded_names(program) -> list[str]:
    """Names of the tensors some operator of the program reads."""
    return _names(program, A.MEMORY_READ_OPS)


def static_block_hint(program) -> int:
    """Floats of the largest tile known before running: memory tiles, accumulator inits and pad tiles."""
    p = program.unit_params
    best = 1
    for u in range(program.n_units):
        op = program.opcode(u)
        if op in (A.OP_OFFCHIP_LOAD, A.OP_DYN_OFFCHIP_LOAD, A.OP_RANDOM_OFFCHIP_LOAD, A.OP_RANDOM_OFFCHIP_STORE):
            best = max(best, int(p[u, A.UP_A0 + A.PA_TILE_ROWS] * p[u, A.UP_A0 + A.PA_TILE_COLS]))
        elif op in (A.OP_ACCUM, A.OP_MAP_ACCUM, A.OP_SCAN):
            best = max(best, int(p[u, A.UP_A0 + A.PA_INIT_ROWS] * p[u, A.UP_A0 + A.PA_INIT_COLS]))
        elif op == A.OP_RESHAPE:
            best = max(best, int(p[u, A.UP_A0 + A.PA_PAD_ROWS] * p[u, A.UP_A0 + A.PA_PAD_COLS]))
    return best


def safe_capacity(program, pushes: np.ndarray) -> int:
    """Tiles that can be alive at once, given each channel's element count from a timing run (see module doc)."""
    in_channels = int(np.minimum(program.ch_capacity, pushes).sum())
    return in_channels + 2 * program.n_units + int(program.arena_rows) + STEP_TEMPORARIES


def check_inputs(program, inputs: dict) -> dict[str, np.ndarray]:
    """The float32 matrix of every loaded tensor, from ``inputs`` (any shape with the tensor's element count).

    Raises
    ------
    ArgumentError
        A loaded tensor is missing, has the wrong number of elements, or ``inputs`` names an unknown tensor.
    """
    refs = tensor_refs(program)
    unknown = sorted(set(inputs) - set(refs))
    if unknown:
        raise ArgumentError(f"functional inputs name tensors the program does not use: {unknown} "
                            f"(its tensors: {sorted(refs)})")
    loaded = loaded_names(program)
    arrays = {}
    for name, t in refs.items():
        if name not in inputs:
            if name in loaded:
                raise ArgumentError(f"functional mode: no input for tensor {name!r} "
                                    f"[{', '.join(map(str, t.shape or (t.rows, t.cols)))}], which the program loads")
            continue
        a = np.asarray(inputs[name])
        if a.size != t.rows * t.cols:
            raise ArgumentError(f"functional input {name!r} has shape {list(a.shape)} ({a.size} elements); the "
                                f"program uses it as [{', '.join(map(str, t.shape or (t.rows, t.cols)))}]")
        arrays[name] = np.ascontiguousarray(a, dtype=np.float32).reshape(t.rows, t.cols)
    return arrays


def build_state(program, arrays: dict, capacity: int, block: int):
    """The engine's functional arrays for a run.

    Returns
    -------
    fv : float32 array, fi : int64 array, offsets : dict of tensor name to its first float in fv
    """
    refs = tensor_refs(program)
    offsets = {}
    pos = (capacity + 1) * block
    for name, t in refs.items():
        offsets[name] = pos
        pos += t.rows * t.cols
    _check_memory(4 * pos, 4 * (capacity + 1) * block)
    fv = np.zeros(pos, dtype=np.float32)
    for name, a in arrays.items():
        fv[offsets[name]:offsets[name] + a.size] = a.ravel()

    n_units = program.n_units
    refs_off = V.N_FI_HEADER
    stack_off = refs_off + capacity
    units_off = stack_off + capacity
    fi = np.zeros(units_off + n_units * V.N_FU, dtype=np.int64)
    fi[V.FI_BLOCK] = block
    fi[V.FI_CAP] = capacity
    fi[V.FI_TOP] = capacity
    fi[V.FI_REFS] = refs_off
    fi[V.FI_STACK] = stack_off
    fi[V.FI_UNITS] = units_off
    fi[stack_off:stack_off + capacity] = np.arange(capacity - 1, -1, -1)  # handle 0 is allocated first
    for u in range(n_units):
        row = units_off + u * V.N_FU
        t = program.unit_tensors[u] if program.unit_tensors else None
        if t is None:
            fi[row + V.FU_MEM] = -1
            continue
        fi[row + V.FU_MEM] = offsets[t.name]
        fi[row + V.FU_COLS] = t.cols
        fi[row + V.FU_GRID_COLS] = t.cols // t.tile_cols
        fi[row + V.FU_TILE_ROWS] = t.tile_rows
        fi[row + V.FU_TILE_COLS] = t.tile_cols
        fi[row + V.FU_BF16] = int(t.bf16)
        fi[row + V.FU_N_TILES] = t.n_tiles
        fi[row + V.FU_STRIDE:row + V.FU_STRIDE + V.N_STRIDES] = _strides(program, u, t)
    return fv, fi, offsets


def available_memory_bytes() -> int | None:
    """Bytes this process can still allocate: the smaller of MemAvailable (/proc/meminfo) and what the
    address-space limit (``ulimit -v``, RLIMIT_AS) leaves above the process's current size (VmSize). None where
    neither can be read (e.g. not Linux)."""
    limits = [_meminfo_available(), _address_space_left()]
    known = [n for n in limits if n is not None]
    return min(known) if known else None


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _address_space_left() -> int | None:
    """RLIMIT_AS minus VmSize: numpy allocations beyond it fail with MemoryError (or crash in numba)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY:
            return None
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return max(soft - int(line.split()[1]) * 1024, 0)
    except (ImportError, OSError, ValueError, IndexError):
        return None
    return None


def _mib(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB"


def _check_memory(needed: int, arena_bytes: int) -> None:
    """Refuse a functional run whose value array does not fit in the memory available now.

    Why: ``np.zeros`` maps zero pages lazily, so an oversized run would not fail here but be killed by the
    kernel's OOM killer halfway through, with no message. Raises :class:`ArenaError` saying how much it needs.
    """
    free = available_memory_bytes()
    if free is not None and needed > free:
        raise ArenaError(f"functional mode needs {_mib(needed)} for tile values and tensors (arena "
                         f"{_mib(arena_bytes)}, tensors {_mib(needed - arena_bytes)}) but only {_mib(free)} of "
                         "memory is available; use smaller model dimensions (e.g. "
                         "stepsim.workloads.reference.small_moe_model) or a smaller arena_tiles")


def check_tensors_fit(program) -> None:
    """Refuse a functional run whose tensors alone (fp32, inputs and outputs) cannot fit in the memory this
    process may still allocate (:func:`available_memory_bytes`, which includes ``ulimit -v``), before any input is
    generated. Raises :class:`ArenaError`."""
    needed = sum(4 * t.rows * t.cols for t in tensor_refs(program).values())
    free = available_memory_bytes()
    if free is not None and needed > free:
        raise ArenaError(f"functional mode needs {_mib(needed)} for its tensors alone (fp32) but only {_mib(free)} "
                         "of memory is available to this process (free memory and ulimit -v); use smaller model "
                         "dimensions (e.g. stepsim.workloads.reference.small_moe_model)")


def _strides(program, u: int, t) -> np.ndarray:
    """A load's per-view-dim tile strides, padded to N_STRIDES (row-major over the view when not given)."""
    out = np.zeros(V.N_STRIDES, dtype=np.int64)
    if program.opcode(u) not in (A.OP_OFFCHIP_LOAD, A.OP_DYN_OFFCHIP_LOAD):
        return out
    off = int(program.unit_params[u, A.UP_A0 + A.PA_VIEW_OFF])
    dims = [int(d) for d in program.payload[off:off + int(program.unit_params[u, A.UP_A0 + A.PA_VIEW_LEN])]]
    strides = list(t.strides) or [int(np.prod(dims[k + 1:])) for k in range(len(dims))]
    out[:len(strides)] = strides
    return out


def read_outputs(program, fv: np.ndarray, offsets: dict) -> dict[str, np.ndarray]:
    """Every stored tensor after the run, as float32 arrays in the tensor's own shape (copies)."""
    refs = tensor_refs(program)
    outputs = {}
    for name in stored_names(program):
        t = refs[name]
        flat = fv[offsets[name]:offsets[name] + t.rows * t.cols]
        outputs[name] = flat.reshape(t.shape or (t.rows, t.cols)).copy()
    return outputs


def stats(fi: np.ndarray) -> FunctionalStats:
    """Usage counters of a finished run."""
    cap, block = int(fi[V.FI_CAP]), int(fi[V.FI_BLOCK])
    return FunctionalStats(arena_tiles=cap, block_elems=block, peak_tiles=int(fi[V.FI_PEAK]),
                           live_at_end=int(fi[V.FI_LIVE]), allocations=int(fi[V.FI_ALLOCS]),
                           arena_bytes=(cap + 1) * block * 4)
