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

On an expert-parallel system (an MoE model with ``--system``, ``LayerSpec.system``) the attention rows are one
chip's share of the heads, as each chip runs it, and the FFN rows are the MoE block over the system's chips
(:mod:`stepsim.mapping.expert_parallel`: each chip's experts mapped, the regions searched on the system), not the
one-chip schedule of the whole block (which these rows showed until 2026-11-27): ``knobs`` are the block's (its
``regions`` in all), ``cycles`` the search's mean over the representative routings of the bucket, ``off_chip_bytes``
and ``flops`` the whole system's on the first of them, the utilisations over all the chips' peaks, and
``compute_units`` / ``memory_units`` the busiest chip's, with every chip's in ``chip_compute_units`` /
``chip_memory_units`` and the system in ``system`` and ``chips``.

A heterogeneous model (:class:`stepsim.serve.layer_list.LayerListLatency`: one provider a layer group) lists each
group's rows in group order, each naming its group in ``group`` (its ``layers`` and ``kind``, e.g. ``mla + moe
(shared)``): a group's buckets are the steps as its layers see them (a sliding layer's context stops at the window)
and its schedules are its own model's (:func:`provider_rows`).
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
            if kind == "ffn" and self.spec.system is not None:
                out.append({"kind": kind, "bucket": size, "steps": self.steps[(kind, size)],
                            **expert_parallel_row(size, self.spec.ffn_model, self.spec.system, hw)})
                continue
            s = schedule_for(kind, size, piece_dims(kind, self.spec.model), hw)
            out.append({"kind": kind, "bucket": size, "steps": self.steps[(kind, size)], "knobs": dict(s.knobs),
                        "cycles": s.cycles, "off_chip_bytes": s.off_chip_bytes, "flops": s.flops,
                        "hbm_utilisation": s.hbm_utilisation(hw.hbm_peak_bytes_per_cycle),
                        "compute_utilisation": s.compute_utilisation(hw.peak_flops_per_cycle),
                        "compute_units": s.compute_units, "memory_units": s.memory_units})
        return out


def provider_rows(provider) -> list[dict] | None:
    """summary.json's ``layers`` of a run priced by ``provider``: its :meth:`LayerUse.rows`, or a heterogeneous
    model's groups' rows, each with its ``group`` (module docstring); None when it ran no mapped layers (the paper's
    schedules)."""
    groups = getattr(provider, "groups", None)
    if groups is None:
        use = getattr(provider, "layer_use", None)
        return None if use is None else use.rows()
    used = [(kind, layers, group.inner.layer_use) for kind, layers, group in groups
            if getattr(group.inner, "layer_use", None) is not None]
    if not used:
        return None
    return [{"group": {"layers": list(layers), "kind": kind.describe()}, **row}
            for kind, layers, use in used for row in use.rows()]


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


def expert_parallel_row(tokens: int, model, system, hardware) -> dict:
    """The FFN row's fields for the MoE block of ``tokens`` tokens (a bucket) expert-parallel over ``system``'s
    chips (module docstring): the knobs and units :func:`~stepsim.mapping.expert_parallel.ep_schedule` gives the
    layer a serving run builds, the mean cycles its region search measured (read from the mapping cache, or
    simulated again when that search was not stored: the same simulations), the bytes and FLOPs of the layer on the
    first representative routing.

    Why the search module's private helpers: :mod:`stepsim.mapping.expert_parallel` is hashed into the key of every
    stored search (its ``SEARCH_SOURCES``), so a public function added there would make every stored search stale."""
    import math

    from stepsim.base.files import stable_hash
    from stepsim.mapping.expert_parallel import _fitting, _mean_cycles, assign_chip_units, ep_schedule, search_material
    from stepsim.mapping.mapper import _cache_folder, _load

    knobs, plan = ep_schedule(tokens, model, system, hardware)
    _, _, layer = _fitting(tokens, model, system, hardware, knobs)  # the representative layer, with those units
    folder = _cache_folder(True)
    searched = None if folder is None else _load(folder, stable_hash(search_material(tokens, model, system,
                                                                                      hardware)))
    cycles = searched.cycles if searched is not None and searched.knobs == knobs else \
        round(_mean_cycles(tokens, model, system, hardware, knobs, plan, first=layer))
    values = layer.op_values()
    metrics = layer.metrics(values=values)
    off_chip, flops = int(metrics["off_chip_bytes"]), int(metrics["graph_flops"])
    compute = assign_chip_units(layer, hardware)
    memory = [0] * system.chips
    for op in layer.graph.ops:  # as stepsim.mapping.units.usage counts one chip's: its bytes, at least its ports
        v = values.get(op.name)
        needed = math.ceil(int(v.on_chip_bytes) / hardware.memory_unit_bytes) if v is not None else 0
        memory[getattr(op, "chip", 0)] += max(needed, getattr(op, "par_dispatch", 0))
    return {"knobs": dict(knobs), "cycles": cycles, "off_chip_bytes": off_chip, "flops": flops,
            "hbm_utilisation": off_chip / (cycles * system.chips * hardware.hbm_peak_bytes_per_cycle),
            "compute_utilisation": flops / (cycles * system.chips * hardware.peak_flops_per_cycle),
            "compute_units": max(compute), "memory_units": max(memory), "system": system.name,
            "chips": system.chips, "chip_compute_units": list(compute), "chip_memory_units": memory}
