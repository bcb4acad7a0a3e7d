"""Form decode batches from a request trace, as the STeP paper's dynamic-parallelization experiment does.

A decode batch of size B is a window of B consecutive requests; the KV-cache length of a request is its
``context_tokens`` (docs/semantics.md §5.2, the artifact's convention). Windows are named by the 1-based,
inclusive request numbers of the Azure CSV (``request_id`` from :func:`~stepsim.trace_io.readers.read_trace`):
``conv_stdev0987_3349_3364.npy`` holds requests 3349..3364, i.e. 0-based data rows 3348..3363. This is the
only convention that reproduces every shipped ``kv_lengths/*.npy`` file exactly.

The stdev of a window is the sample standard deviation (ddof=1) in tokens; file names carry its floor.
Windows are chosen by stdev: :func:`select_windows` returns, for each target stdev, the closest windows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stepsim.base.errors import ConfigError, TraceValueError
from stepsim.trace_io.schemas import DECODE_BATCHES, SOURCE_KEY, TraceInfo, decode_metadata

#: the paper's chosen windows, (start, end, floor of stdev) per batch size and variance class (spec §5.5)
PAPER_WINDOWS: dict[int, dict[str, tuple[tuple[int, int, int], ...]]] = {
    16: {
        "high": ((2805, 2820, 1456), (821, 836, 1455), (985, 1000, 1454)),
        "med": ((3349, 3364, 987), (3275, 3290, 987), (3181, 3196, 986)),
        "low": ((3799, 3814, 480), (2477, 2492, 479), (1063, 1078, 479)),
    },
    64: {
        "high": ((961, 1024, 1457), (3239, 3302, 1374), (1727, 1790, 1370)),
        "med": ((4007, 4070, 996), (3123, 3186, 995), (733, 796, 995)),
        "low": ((2019, 2082, 508), (4185, 4248, 484), (271, 334, 477)),
    },
    80: {
        "high": ((981, 1060, 1413), (3227, 3306, 1334), (815, 894, 1310)),
        "med": ((4687, 4766, 987), (3989, 4068, 986), (1891, 1970, 987)),
        "low": ((4181, 4260, 562), (135, 214, 531), (2025, 2104, 529)),
    },
}


@dataclass(frozen=True)
class KVWindow:
    """A window of consecutive requests.

    Attributes
    ----------
    start, end : int
        First and last request number (1-based, inclusive).
    stdev : float
        Sample standard deviation (ddof=1) of the window's KV lengths, in tokens.
    """

    start: int
    end: int
    stdev: float

    @property
    def batch(self) -> int:
        """Requests in the window."""
        return self.end - self.start + 1

    @property
    def label(self) -> int:
        """Floor of the stdev, as in the artifact's file names."""
        return math.floor(self.stdev)

    def file_name(self, trace: str = "conv") -> str:
        """The artifact's file name, ``<trace>_stdev<SSSS>_<start>_<end>.npy``."""
        return f"{trace}_stdev{self.label:04d}_{self.start:04d}_{self.end:04d}.npy"


def kv_lengths(requests: pa.Table) -> np.ndarray:
    """KV length of every request (its ``context_tokens``), int64 tokens, in trace order."""
    return requests.column("context_tokens").to_numpy().astype(np.int64)


def _ids(requests: pa.Table) -> np.ndarray:
    return requests.column("request_id").to_numpy()


def request_window(requests: pa.Table, start: int, end: int) -> np.ndarray:
    """KV lengths (int64 tokens) of requests ``start..end`` inclusive (by ``request_id``).

    Raises
    ------
    TraceValueError
        Some request in the window is not in the trace.
    """
    if end < start:
        raise ConfigError(f"window end {end} is before start {start}")
    mask = pc.and_(pc.greater_equal(requests["request_id"], start), pc.less_equal(requests["request_id"], end))
    sel = requests.filter(mask)
    ids = _ids(sel)
    if len(ids) != end - start + 1 or (len(ids) and (np.sort(ids) != np.arange(start, end + 1)).any()):
        src = decode_metadata(requests.schema).get(SOURCE_KEY, "<requests>")
        raise TraceValueError(
            f"{src}: window {start}..{end} needs {end - start + 1} requests, the trace has {len(ids)} of them"
        )
    return kv_lengths(sel)[np.argsort(ids, kind="stable")]


def window_stdevs(kv: np.ndarray, batch: int) -> np.ndarray:
    """Sample stdev (ddof=1, tokens) of every window of ``batch`` consecutive values.

    Element ``i`` is the window ``kv[i : i + batch]``. Computed per window with ``np.std`` (not a running
    sum, whose cancellation could move a value across an integer and change the floored label).
    """
    kv = np.asarray(kv, dtype=np.float64)
    if batch < 2:
        raise ConfigError(f"batch must be >= 2 for a sample stdev, got {batch}")
    if len(kv) < batch:
        return np.empty(0)
    return np.lib.stride_tricks.sliding_window_view(kv, batch).std(axis=1, ddof=1)


def window_stats(kv: np.ndarray, start: int, end: int, first_id: int = 1) -> KVWindow:
    """The :class:`KVWindow` of requests ``start..end`` of a KV-length array whose first request is ``first_id``."""
    lo, hi = start - first_id, end - first_id + 1
    if lo < 0 or hi > len(kv) or hi - lo < 2:
        raise ConfigError(f"window {start}..{end} is outside requests {first_id}..{first_id + len(kv) - 1}")
    return KVWindow(start, end, float(np.std(np.asarray(kv[lo:hi], dtype=np.float64), ddof=1)))


def select_windows(
    kv: np.ndarray,
    batch: int,
    targets: Sequence[float],
    per_target: int = 3,
    *,
    first_id: int = 1,
    allow_overlap: bool = False,
    within: tuple[int, int] | None = None,
) -> list[list[KVWindow]]:
    """For each target stdev, the ``per_target`` windows whose stdev is closest to it.

    Parameters
    ----------
    kv : ndarray
        KV lengths of consecutive requests (tokens); ``kv[0]`` is request ``first_id``.
    batch : int
        Requests per window.
    targets : sequence of float
        Target sample stdevs (tokens), e.g. high / medium / low variance.
    per_target : int
        Windows returned per target.
    first_id : int
        Request number of ``kv[0]`` (1 for the Azure CSV numbering).
    allow_overlap : bool
        If False (default), a window sharing a request with an already chosen window (for any target) is
        skipped, so a batch is never simulated twice with near-identical contents.
    within : (int, int), optional
        Only windows lying inside requests ``within[0]..within[1]`` (inclusive).

    Returns
    -------
    list of list of KVWindow
        One list per target, closest first; ties go to the earlier window.
    """
    stdevs = window_stdevs(kv, batch)
    starts = np.arange(len(stdevs)) + first_id
    keep = np.ones(len(stdevs), dtype=bool)
    if within is not None:
        keep = (starts >= within[0]) & (starts + batch - 1 <= within[1])
    cand = np.flatnonzero(keep)
    taken: list[tuple[int, int]] = []
    result = []
    for target in targets:
        order = cand[np.argsort(np.abs(stdevs[cand] - target), kind="stable")]
        chosen: list[KVWindow] = []
        for i in order:
            s, e = int(starts[i]), int(starts[i]) + batch - 1
            if not allow_overlap and any(s <= te and ts <= e for ts, te in taken):
                continue
            chosen.append(KVWindow(s, e, float(stdevs[i])))
            taken.append((s, e))
            if len(chosen) == per_target:
                break
        result.append(chosen)
    return result


def paper_windows(batch: int, variance: str | None = None) -> list[tuple[int, int, int]]:
    """The paper's (start, end, stdev label) windows for ``batch`` (16, 64 or 80), optionally one class."""
    if batch not in PAPER_WINDOWS:
        raise ConfigError(f"the paper lists windows for batch sizes 16, 64, 80, not {batch}")
    classes = PAPER_WINDOWS[batch]
    if variance is not None:
        if variance not in classes:
            raise ConfigError(f"variance class must be one of {', '.join(classes)}, got {variance!r}")
        return list(classes[variance])
    return [w for c in ("high", "med", "low") for w in classes[c]]


def decode_batches_table(requests: pa.Table, windows: Sequence[KVWindow | tuple[int, int]]) -> pa.Table:
    """A decode-batches trace with one batch per window (``batch_id`` = position in ``windows``)."""
    rows_ids, rows_kv = [], []
    for w in windows:
        start, end = (w.start, w.end) if isinstance(w, KVWindow) else (int(w[0]), int(w[1]))
        rows_kv.append(request_window(requests, start, end))
        rows_ids.append(np.arange(start, end + 1, dtype=np.int64))
    meta = {SOURCE_KEY: decode_metadata(requests.schema).get(SOURCE_KEY, "")}
    schema = TraceInfo(kind=DECODE_BATCHES, source=meta[SOURCE_KEY], metadata=meta).schema()
    return pa.table(
        [
            pa.array(np.arange(len(windows), dtype=np.int32)),
            pa.array(rows_ids, pa.list_(pa.int64())),
            pa.array(rows_kv, pa.list_(pa.int64())),
        ],
        schema=schema,
    )


def attention_metadata(kv: np.ndarray, tile: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Per-request attention metadata of a decode batch (docs/semantics.md §5.2).

    Parameters
    ----------
    kv : array_like of int
        Current KV-cache length per request (tokens).
    tile : int
        Sequence tile (tokens per KV tile), 32 in the paper.

    Returns
    -------
    seq_len_tiled : ndarray of int64
        ``ceil((x + 1) / tile)``: KV tiles including the slot of the token being generated.
    offset : ndarray of int64
        ``x mod tile``: position of the new token in its (last) tile.
    """
    x = np.asarray(kv, dtype=np.int64)
    if tile <= 0:
        raise ConfigError(f"tile must be positive, got {tile}")
    if x.size and x.min() < 0:
        i = int(np.argmax(x < 0))
        raise TraceValueError(f"KV length {x[i]} of request {i} is negative")
    # integer ceil, exact for any int64 length (no float rounding)
    return (x + tile) // tile, x % tile
