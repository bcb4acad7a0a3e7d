"""Per-layer utilisation of a mapped serving run (``--schedule auto``): for each layer kind and shape bucket a run's
steps used, the mapped schedule's cycles, HBM and compute utilisation and units (summary.json ``layers``,
``stepsim report RUN_DIR`` on a serve folder).

A step's pieces (:meth:`stepsim.serve.exact.EngineLatency.tasks`) are built with the schedule mapped at their
bucket (:func:`stepsim.mapping.mapper.bucket`): the decode attention at its requests (every KV head's), the prefill
attention at one head's query positions in whole tiles (:func:`stepsim.mapping.kinds.prefill.prefill_size`), the FFN at the
step's tokens. Each row is that schedule on the mapper's representative data of the bucket:

* ``cycles``: its engine cycles (a layer: every KV head of the attention, one FFN);
* ``hbm_utilisation`` = ``off_chip_bytes / (cycles x hbm_peak_bytes_per_cycle)``; ``compute_utilisation`` =
  ``flops / (cycles x peak_flops_per_cycle)`` (0..1, the chip's peaks);
* ``compute_units`` and ``memory_units`` it occupies; ``steps``: how many of the run's steps used it.
"""

from __future__ import annotations

import numpy as np

from stepsim.serve.latency import IterationBatch

#: the layer kinds in the order a step runs them (and the rows are listed)
ORDER = ("prefill", "decode", "ffn")


class LayerUse:
    """Counts the (kind, bucket) schedules a run's steps use (:meth:`note`) and lists them (:meth:`rows`)."""

    def __init__(self, spec):
        self.spec = spec
        self.steps: dict[tuple[str, int], int] = {}

    def note(self, batch: IterationBatch) -> None:
        """Count the buckets of ``batch``'s pieces (one step)."""
        for key in step_buckets(batch, self.spec.model):
            self.steps[key] = self.steps.get(key, 0) + 1

    def rows(self) -> list[dict]:
        """One dict a (kind, bucket) used, in :data:`ORDER` then bucket order (module docstring)."""
        from stepsim.mapping import schedule_for  # at call time: the one serve builds with
        from stepsim.serve.layers import piece_dims

        hw = self.spec.hardware
        out = []
        for kind, size in sorted(self.steps, key=lambda k: (ORDER.index(k[0]), k[1])):
            s = schedule_for(kind, size, piece_dims(kind, self.spec.model), hw)
            out.append({"kind": kind, "bucket": size, "steps": self.steps[(kind, size)], "knobs": dict(s.knobs),
                        "cycles": s.cycles, "off_chip_bytes": s.off_chip_bytes, "flops": s.flops,
                        "hbm_utilisation": s.hbm_utilisation(hw.hbm_peak_bytes_per_cycle),
                        "compute_utilisation": s.compute_utilisation(hw.peak_flops_per_cycle),
                        "compute_units": s.compute_units, "memory_units": s.memory_units})
        return out


def step_buckets(batch: IterationBatch, model) -> list[tuple[str, int]]:
    """``[(kind, bucket)]`` of a step's mapped pieces (module docstring)."""
    from stepsim.mapping.kinds.prefill import prefill_size
    from stepsim.mapping.mapper import bucket
    from stepsim.serve.layers import piece_dims

    context = np.asarray(batch.context_tokens, dtype=np.int64)
    new = np.asarray(batch.new_tokens, dtype=np.int64)
    heads = model.kv_heads
    out = []
    decode = new == 1
    if (~decode).any():
        data = (np.tile(context[~decode], heads), np.tile(new[~decode], heads))
        out.append(("prefill", bucket(prefill_size(data, piece_dims("prefill", model)))))
    if decode.any():
        out.append(("decode", bucket(int(decode.sum()) * heads)))
    out.append(("ffn", bucket(int(new.sum()))))
    return out

