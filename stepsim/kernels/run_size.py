"""The size of a run, estimated from its Program before the engine starts: memory and HBM work.

Model dimensions have no upper limit (a hidden size of 2**30 or 10**15 is a valid int), and the engine's cost
grows with them: its state holds one slot per FIFO element of capacity (a depth of 10**12 asks for terabytes),
and every HBM request of a tile is served (a tile of 2**30 columns is billions of requests). Finding out by
running means a MemoryError traceback after the allocation, or minutes of a run nobody meant to start.

* Memory: the engine's arrays (FIFO slots, value arena, timeline buffer) are counted exactly; more than the
  machine has available is refused, always (the allocation would fail).
* Work: HBM requests are counted for the off-chip loads whose tile count the Program knows (static views), and
  at one tile for the others (so the estimate is a lower bound); more than :data:`MAX_HBM_REQUESTS` is refused
  unless the caller forces it (``--force``). The paper's largest layers need about 10**8 requests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from stepsim.base.errors import ConfigError
from stepsim.kernels import abi as A

#: HBM requests a run may need without --force: a hundred times the paper's largest layers, so such a run almost
#: certainly has a dimension wrong. Not a time: since an HBM serves its ticks in bulk up to the next event that can
#: observe them, the engine's time follows its events more than its requests (a 5e10-request layer of 2,400
#: events ran in 0.7 s), so the refusal names the traffic, not a duration
MAX_HBM_REQUESTS = 10**10


@dataclass(frozen=True)
class RunSize:
    """What a run of a Program will take (see the module docstring)."""

    memory_bytes: int
    fifo_slots: int
    hbm_requests: int
    largest_tile_requests: int


def estimate(program, timeline_records: int = 0) -> RunSize:
    """The memory and HBM work of running ``program`` (no allocation, no engine call)."""
    up = program.unit_params
    opcodes = up[:, A.UP_OPCODE]
    slots = max(int(np.asarray(program.ch_capacity, dtype=object).sum()), 1)  # object: no int64 overflow
    scratch = int(up[opcodes == A.OP_REASSEMBLE, A.UP_N_IN].sum())
    memory = 8 * (slots * A.N_SLOT + (int(program.arena_rows) + scratch) * A.N_TOKEN
                  + up.shape[0] * A.N_US + len(program.ch_capacity) * A.N_CH) + 32 * int(timeline_records)
    addr = int(program.hw[A.HW_ADDR_OFFSET])
    total = largest = 0
    for u in np.flatnonzero(np.isin(opcodes, A.MEMORY_READ_OPS + A.MEMORY_WRITE_OPS)):
        if up[u, A.UP_A0 + A.PA_RESIDENT]:  # an on-chip tensor (a collective's): no HBM requests
            continue
        rows, cols, elem = (int(up[u, A.UP_A0 + k]) for k in (A.PA_TILE_ROWS, A.PA_TILE_COLS, A.PA_ELEM_BYTES))
        per_tile = rows * -(-cols * elem // addr)
        tiles = int(up[u, A.UP_A0 + A.PA_N_TILES]) if opcodes[u] == A.OP_OFFCHIP_LOAD else 1
        total += per_tile * max(tiles, 1)
        largest = max(largest, per_tile)
    return RunSize(memory_bytes=memory, fifo_slots=slots, hbm_requests=total, largest_tile_requests=largest)


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux ``MemAvailable``), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"


def check(size: RunSize, force: bool = False, available: int | None = None) -> None:
    """Refuse a run whose memory exceeds what is available (always) or whose HBM work exceeds
    :data:`MAX_HBM_REQUESTS` (unless ``force``), with the estimate; ConfigError otherwise nothing."""
    available = available_memory() if available is None else available
    if available is not None and size.memory_bytes > available:
        raise ConfigError(f"this run needs about {_gb(size.memory_bytes)} of engine memory ({size.fifo_slots:,} FIFO "
                          f"slots: the sum of the FIFO depths), more than the {_gb(available)} available; use "
                          f"smaller FIFO depths (--channel-depth, the depths file) or model dimensions")
    if size.hbm_requests > MAX_HBM_REQUESTS and not force:
        raise ConfigError(f"this run needs at least {size.hbm_requests:.2e} HBM requests (the largest tile "
                          f"{size.largest_tile_requests:.2e}, {_gb(64 * size.hbm_requests)} of traffic); the "
                          f"limit is {MAX_HBM_REQUESTS:.0e} (check the model dimensions), --force runs it anyway")
