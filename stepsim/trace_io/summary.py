"""One-pass, bounded-memory statistics of a trace (what ``stepsim trace inspect`` prints).

:class:`TraceSummary` is fed normalized record batches one at a time and keeps only running aggregates:
per-expert counts, tokens per (iteration, layer), exact integer sums for length statistics. Sums are kept as
Python integers so the reported mean/stdev do not depend on how the trace was split into batches.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stepsim.trace_io.schemas import DECODE_BATCHES, REQUESTS, ROUTING, TraceInfo

#: elements per int64 partial sum of squares: (2**21)**2 * 2**20 < 2**63, so no overflow below 2**21
_SQ_CHUNK = 1 << 20
_SQ_SAFE = 1 << 21


@dataclass
class LengthStats:
    """Exact running count / sum / sum of squares / min / max of non-negative integers (tokens)."""

    n: int = 0
    total: int = 0
    squares: int = 0
    lo: int | None = None
    hi: int | None = None

    def add(self, v: np.ndarray) -> None:
        """Accumulate an array of non-negative integers."""
        if not len(v):
            return
        v = v.astype(np.int64, copy=False)
        self.n += len(v)
        self.total += int(v.sum())
        vmax = int(v.max())
        for i in range(0, len(v), _SQ_CHUNK):
            part = v[i : i + _SQ_CHUNK]
            if vmax < _SQ_SAFE:
                self.squares += int(np.dot(part, part))
            else:  # exact, slow path for huge values
                self.squares += sum(int(x) * int(x) for x in part)
        vmin = int(v.min())
        self.lo = vmin if self.lo is None else min(self.lo, vmin)
        self.hi = vmax if self.hi is None else max(self.hi, vmax)

    def as_dict(self) -> dict:
        """``count, min, max, sum, mean, stdev`` (sample, ddof=1; None below 2 values)."""
        if not self.n:
            return {"count": 0, "min": None, "max": None, "sum": 0, "mean": None, "stdev": None}
        stdev = None
        if self.n > 1:
            # n*Σx² - (Σx)² is exact in integers; one rounding at the end
            var_num = self.n * self.squares - self.total * self.total
            stdev = math.sqrt(var_num / (self.n * (self.n - 1)))
        return {
            "count": self.n,
            "min": self.lo,
            "max": self.hi,
            "sum": self.total,
            "mean": self.total / self.n,
            "stdev": stdev,
        }


@dataclass
class TraceSummary:
    """Running statistics of one trace.

    Parameters
    ----------
    info : TraceInfo
        The trace's kind and metadata.
    tile : int
        Sequence tile (tokens) for the KV-tile statistics of decode batches.
    """

    info: TraceInfo
    tile: int = 32
    rows: int = 0
    counts: np.ndarray | None = None
    groups: dict = field(default_factory=dict)
    lengths: LengthStats = field(default_factory=LengthStats)
    generated: LengthStats = field(default_factory=LengthStats)
    tiles: LengthStats = field(default_factory=LengthStats)
    batch_sizes: set = field(default_factory=set)
    first_arrival: int | None = None
    last_arrival: int | None = None

    def add(self, batch: pa.RecordBatch) -> None:
        """Accumulate one normalized record batch."""
        self.rows += batch.num_rows
        kind = self.info.kind
        if kind == ROUTING:
            ids = batch.column("expert_ids").flatten().to_numpy()
            c = np.bincount(ids, minlength=self.info.num_experts)
            self.counts = c if self.counts is None else self.counts + c
            it = batch.column("iteration").to_numpy().astype(np.int64)
            layer = batch.column("layer").to_numpy().astype(np.int64)
            keys, n = np.unique((it << 32) | layer, return_counts=True)
            for k, m in zip(keys.tolist(), n.tolist()):
                self.groups[k] = self.groups.get(k, 0) + m
        elif kind == REQUESTS:
            self.lengths.add(batch.column("context_tokens").to_numpy())
            self.generated.add(batch.column("generated_tokens").to_numpy())
            t = batch.column("arrival").cast(pa.int64()).to_numpy()
            lo, hi = int(t.min()), int(t.max())
            self.first_arrival = lo if self.first_arrival is None else min(self.first_arrival, lo)
            self.last_arrival = hi if self.last_arrival is None else max(self.last_arrival, hi)
        elif kind == DECODE_BATCHES:
            kv_col = batch.column("kv_lengths")
            kv = kv_col.flatten().to_numpy()
            self.lengths.add(kv)
            self.tiles.add((kv + self.tile) // self.tile)
            self.batch_sizes.update(np.unique(pc.list_value_length(kv_col).to_numpy()).tolist())

    def consume(self, batches: Iterable[pa.RecordBatch]) -> TraceSummary:
        """Accumulate every batch; returns self."""
        for b in batches:
            self.add(b)
        return self

    def as_dict(self) -> dict:
        """JSON-ready statistics (ints, floats, lists, str)."""
        info = self.info
        out: dict = {"source": info.source, "kind": info.kind, "rows": self.rows, "metadata": dict(info.metadata)}
        if info.kind == ROUTING:
            counts = self.counts if self.counts is not None else np.zeros(info.num_experts, dtype=np.int64)
            sizes = sorted(set(self.groups.values()))
            out.update(
                tokens=self.rows,
                top_k=info.top_k,
                num_experts=info.num_experts,
                model=info.metadata.get("model"),
                iterations_layers=len(self.groups),
                # tokens per (iteration, layer): the decode batch size when every group has the same size
                batch_size=sizes[0] if len(sizes) == 1 else None,
                assignments=int(counts.sum()),
                expert_counts=counts.tolist(),
                idle_experts=int((counts == 0).sum()),
                idle_expert_ids=np.flatnonzero(counts == 0).tolist(),
                max_count=int(counts.max()) if len(counts) else 0,
                active_experts=int((counts > 0).sum()),
            )
        elif info.kind == REQUESTS:
            span = None
            if self.first_arrival is not None:
                span = (self.last_arrival - self.first_arrival) / 1e6
            out.update(
                requests=self.rows,
                context_tokens=self.lengths.as_dict(),
                generated_tokens=self.generated.as_dict(),
                duration_s=span,
            )
        else:
            sizes = sorted(self.batch_sizes)
            out.update(
                batches=self.rows,
                batch_size=sizes[0] if len(sizes) == 1 else None,
                kv_lengths=self.lengths.as_dict(),
                tile=self.tile,
                kv_tiles=self.tiles.as_dict(),
            )
        return out
