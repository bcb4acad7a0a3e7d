"""``--fidelity exact``: every layer of every iteration on the cycle engine (docs/serving.md §9).

For one scheduler step (an :class:`~stepsim.serve.latency.IterationBatch`), with the model's ``L`` layers and
``H`` KV heads:

* requests computing one token (decodes, and a 1-token prefill chunk: the same computation) form the decode
  attention over their KV lengths (the tokens cached before the step); requests computing more form the prefill
  attention over their chunks (``cached`` = tokens cached before the step). One KV head of each is simulated
  (:mod:`stepsim.serve.layers`); a layer's attention takes ``H x (decode + prefill)`` cycles (its KV heads share
  the attention units one after another). Every layer sees the same KV lengths, so the attention is simulated
  once per step and counted ``L`` times;
* the FFN of layer ``l`` is the MoE block over every token of the step with layer ``l``'s routing
  (:mod:`stepsim.serve.routing`, one row per token in batch order), or a dense FFN (one simulation per step);
* weights outside those graphs are off-chip traffic at the HBM's peak: per layer the q/k/v/o projections and
  the router (``(2 d h_q hd + 2 d H hd + d E) x 2`` bytes), per step the LM head (``vocab x d x 2``; a tied
  head is the embedding matrix, read all the same) and the step's embedding rows (``tokens x d x 2``), each
  ``ceil(bytes / hbm_peak_bytes_per_cycle)`` cycles. With mapped layers on one chip (``schedule="auto"``) the
  projections, routers and LM head are engine operators instead and the weights stream ahead
  (:mod:`stepsim.serve.projections`; ``cycles_hidden``: what streaming saved, taken off the step).

The step takes the sum of those cycles over its layers, at the hardware's clock: ``cycles / clock_hz`` seconds.
The stages of a layer do not overlap (the FFN needs the attention's output) and neither do layers.

Layers of one step run in parallel on ``jobs`` worker processes (the fork-server pool of
:mod:`stepsim.batch.executors`' local executor); every worker keeps its own templates. Results do not depend on
which worker ran what.
"""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from stepsim.base.hardware import Hardware
from stepsim.graph.gcpause import gc_paused
from stepsim.mapping.roofline import StepWork, projection_params, seen_tokens
from stepsim.models.presets import ModelConfig
from stepsim.serve.latency import IterationBatch, IterationCost
from stepsim.serve.layer_use import LayerUse
from stepsim.serve.layers import KV_TILE, LayerRunner, LayerSpec

#: bf16 bytes per weight
DTYPE_BYTES = 2
#: the cycles columns an engine-backed provider reports (iterations.parquet ``cycles_<kind>``)
CYCLE_KINDS = ("attention", "ffn", "weights")

_RUNNERS: dict = {}  # per process and thread (Dask thread workers share a process): LayerRunner by spec


def _runner(spec: LayerSpec) -> LayerRunner:
    # ModelConfig holds a dict: not hashable; its repr names every dimension
    key = (threading.get_ident(), repr(spec))
    runner = _RUNNERS.get(key)
    if runner is None:
        runner = _RUNNERS[key] = LayerRunner(spec)
    return runner


@gc_paused  # a template's build: the mapped expert-parallel block's builder does not pause the collector itself; paused
# here, a calibration's 16-chip Qwen3-30B-A3B template took 1.1 s, not 2.3 (bench/README.md, session 55)
def layer_task(spec: LayerSpec, kind: str, data) -> tuple[int, float, float, int]:
    """``(cycles, build seconds, engine seconds, templates built)`` of one layer piece (runs in a worker)."""
    runner = _runner(spec)
    build_s, engine_s, builds = runner.build_s, runner.engine_s + runner.bind_s, runner.builds
    cycles = runner.cycles(kind, data)
    return (cycles, runner.build_s - build_s, runner.engine_s + runner.bind_s - engine_s, runner.builds - builds)


def layer_tasks(spec: LayerSpec, tasks: list) -> list:
    """:func:`layer_task` of each ``(kind, data)`` of ``tasks``, in order (one worker's chunk)."""
    return [layer_task(spec, kind, data) for kind, data in tasks]


def shape_chunks(tasks: list, jobs: int) -> list[list[int]]:
    """The indices of ``tasks`` in chunks for ``jobs`` workers, largest first: the tasks of one (kind, shape) in one
    chunk, so one worker builds its template (spread task by task, each worker built most shapes' templates: a
    2-chip calibration's 180 shapes were 422 templates on two workers), unless they are more than a worker's share
    (an exact run's step: its layers' FFN pieces are one shape), then in about ``tasks of the shape x jobs /
    tasks`` chunks, at most ``jobs``. Which worker runs what changes no result."""
    from stepsim.serve.layers import shape_of

    groups: dict = {}
    for i, (kind, data) in enumerate(tasks):
        groups.setdefault((kind, shape_of(kind, data)), []).append(i)
    chunks = []
    for members in groups.values():
        parts = min(jobs, max(1, round(len(members) * jobs / len(tasks))))
        chunks.extend(members[p::parts] for p in range(parts))
    return sorted(chunks, key=len, reverse=True)


def max_kv_rows(max_model_len: int) -> int:
    """KV rows reserved per request in the attention graphs: ``max_model_len + 1`` rounded up to tiles."""
    return -(-(max_model_len + 1) // KV_TILE) * KV_TILE


def layer_weight_bytes(model: ModelConfig) -> int:
    """Bytes of one layer's weights outside the graphs: its q/k/v/o projections and, for an MoE model, its router."""
    return (projection_params(model) + (model.hidden * model.experts if model.is_moe else 0)) * DTYPE_BYTES


def weight_cycles(model: ModelConfig, hardware: Hardware, vocab: int) -> tuple[int, int, int]:
    """``(per layer, LM head per step, embedding bytes per token)``: the off-chip weights outside the graphs."""
    d = model.hidden
    peak = hardware.hbm_peak_bytes_per_cycle
    return (math.ceil(layer_weight_bytes(model) / peak), math.ceil(vocab * d * DTYPE_BYTES / peak),
            d * DTYPE_BYTES)


class EngineLatency:
    """The exact provider (module docstring).

    Parameters
    ----------
    model : ModelConfig
    hardware : Hardware
    routing : SyntheticRouting or ReplayRouting, optional
        Required for an MoE model.
    max_model_len : int
        The longest sequence: sizes the KV rows of the attention graphs.
    vocab : int
        Vocabulary size (the LM head's rows).
    jobs : int, optional
        Worker processes for the layers of a step (default: in this process).
    layers_executor : stepsim.serve.dask_layers.DaskLayers, optional
        Runs the layers of a step instead (``--executor dask``); its owner closes it.
    schedule : {"paper", "auto"}
        How the layers are built: the STeP paper's evaluation schedules, or mapped over the whole chip
        (:mod:`stepsim.mapping`; :class:`~stepsim.serve.layers.LayerSpec`).
    """

    mode = "exact"
    error = None
    #: a layer group's attention matrices when they are not its model's q/k/v and o, and whether the LM head is
    #: this provider's to count (:func:`stepsim.serve.layer_list.count_weights_once`;
    #: :func:`stepsim.serve.projections.provider_projections`)
    attention_matrices: list | None = None
    counts_head: bool = True

    def __init__(self, model: ModelConfig, hardware: Hardware, routing, *, max_model_len: int, vocab: int,
                 jobs: int | None = None, layers_executor=None, schedule: str = "paper"):
        self.model, self.hardware, self.routing = model, hardware, routing
        self.layers_executor = layers_executor
        self.spec = LayerSpec(model, hardware, max_kv_rows(max_model_len), schedule=schedule)
        self.layer_weights, self.head_cycles, self.embedding_bytes = weight_cycles(model, hardware, vocab)
        self.vocab = vocab
        self.roofline = StepWork(model, hardware, vocab, self.chips)
        self.jobs = jobs
        self._pool = None
        self.build_s = self.engine_s = 0.0
        self.templates = self.simulations = 0
        self.wall_s = 0.0
        #: ``on_simulated(n)`` after every ``n`` layer simulations finished (a progress bar; changes nothing)
        self.on_simulated = None
        #: the mapped schedules the steps use (summary.json ``layers``), None on the paper's schedules
        self.layer_use = LayerUse(self.spec) if schedule == "auto" else None

    # ---------------------------------------------------------------------------------------- parallelism
    def run_tasks(self, tasks: list, batch: IterationBatch | None = None) -> list:
        """``layer_task`` of every ``(kind, data)`` task, in order (on the workers when ``jobs`` > 1); their
        times and templates are added to :meth:`stats`. On workers with mapped layers, the buckets the tasks (and
        ``batch``'s projections, when given) need and nothing holds yet are mapped first, one a worker
        (:mod:`stepsim.serve.map_ahead`)."""
        if self.jobs and self.jobs > 1 and self.layers_executor is None and self.spec.schedule == "auto" \
                and self.spec.system is None:
            from stepsim.serve.map_ahead import map_ahead

            map_ahead(self, batch, tasks, self._workers())
        results = self._run(tasks)
        for _, build_s, engine_s, built in results:
            self.build_s += build_s
            self.engine_s += engine_s
            self.templates += built
            self.simulations += 1
        return results

    def _run(self, tasks: list) -> list:
        if self.layers_executor is not None:
            return self._counted(self.layers_executor.run(self.spec, tasks))
        if not self.jobs or self.jobs == 1:
            return [self._counted(layer_task(self.spec, kind, data)) for kind, data in tasks]
        results = [None] * len(tasks)
        chunks = shape_chunks(tasks, self.jobs)
        futures = [self._workers().submit(layer_tasks, self.spec, [tasks[i] for i in chunk]) for chunk in chunks]
        for chunk, future in zip(chunks, futures):
            for i, result in zip(chunk, future.result()):
                results[i] = self._counted(result)
        return results

    def _workers(self) -> ProcessPoolExecutor:
        """The ``jobs`` worker processes, started on first use."""
        if self._pool is None:
            from stepsim.batch.executors import local_worker_pool

            self._pool = local_worker_pool(self.jobs, warm_kernels=True)
        return self._pool

    def _counted(self, done):
        """``done`` (one layer task's result, or a list of them) passed through, counted for :attr:`on_simulated`."""
        if self.on_simulated is not None:
            self.on_simulated(len(done) if isinstance(done, list) else 1)
        return done

    def close(self) -> None:
        if self._pool is not None:
            from stepsim.batch.executors import close_pool

            close_pool(self._pool)
            self._pool = None

    # ---------------------------------------------------------------------------------------- one step
    def tasks(self, batch: IterationBatch, ffn: list | None = None) -> tuple[list, list]:
        """The layer pieces of a step: ``(tasks, roles)``, ``roles[i]`` = ``("attention", count)`` or
        ``("ffn", count)``: how many of the step's layers task ``i`` stands for. ``ffn``: the FFN tasks when the
        caller routed the step itself (the fast path), else they are routed here."""
        context = np.asarray(batch.context_tokens, dtype=np.int64)
        new = np.asarray(batch.new_tokens, dtype=np.int64)
        tokens = int(new.sum())
        layers = self.model.layers
        tasks = []
        decode = new == 1
        # mapped: the KV heads' caches are independent requests of one attention spread over the chip, so
        # they run side by side (each head a request of its own); the paper's schedule runs one head at a time
        heads = self.spec.model.kv_heads if self.spec.schedule == "auto" else 1
        if decode.any():
            tasks.append(("decode", np.tile(context[decode], heads)))
        if (~decode).any():  # mapped: every KV head's chunks as requests of one attention, as the decode's
            tasks.append(("prefill", (np.tile(context[~decode], heads), np.tile(new[~decode], heads))))
        if ffn is not None:
            tasks.extend(ffn)
        elif self.model.is_moe:
            routing = self.routing.route(tokens)
            tasks.extend(("ffn", np.ascontiguousarray(routing[:, layer, :])) for layer in range(layers))
        else:
            tasks.append(("ffn", np.zeros((tokens, 1), dtype=np.int64)))
        return tasks, self.roles(tasks)

    def roles(self, tasks: list) -> list:
        """``(cycles column, layers it counts for)`` of each task: the attention counts for every KV head of
        every layer (a mapped attention holds every head already: for every layer), an MoE layer for
        itself, a dense FFN for every layer."""
        heads, layers = self.spec.model.kv_heads, self.model.layers  # the heads of the layer one chip runs
        every_head = dict.fromkeys(("decode", "prefill"), layers if self.spec.schedule == "auto" else heads * layers)
        return [("attention", every_head[kind]) if kind != "ffn" else ("ffn", 1 if self.model.is_moe else layers)
                for kind, _ in tasks]

    def weight_cycles(self, batch: IterationBatch) -> int:
        """Cycles of the off-chip weights outside the graphs for ``batch`` (module docstring)."""
        tokens = int(sum(batch.new_tokens))
        embedding = math.ceil(tokens * self.embedding_bytes / self.hardware.hbm_peak_bytes_per_cycle)
        return self.model.layers * self.layer_weights + self.head_cycles + embedding

    #: chips the step runs on (a system's provider: its chips), for the roofline's peaks
    chips = 1

    @property
    def streams_weights(self) -> bool:
        """Whether a step's projections, router and LM head run on the engine and the weights stream ahead
        (:mod:`stepsim.serve.projections`): mapped layers, on one chip or on each chip of a system (a dense model's
        tensor-parallel shards, an MoE model's head shards beside its expert-parallel block)."""
        return self.spec.schedule == "auto"

    def allreduce_cycles(self, batch: IterationBatch) -> int:
        """Cycles of one all-reduce of the step's activations between a layer's pieces: none on one chip (a
        system's: :class:`stepsim.serve.system.SystemEngineLatency`)."""
        return 0

    def mapped_weight_cycles(self, batch: IterationBatch, tasks: list, results: list) -> tuple[int, int]:
        """``(weights, hidden)``: the engine cycles of the step's projections, routers and LM head plus the embedding
        rows' closed-form read, and the cycles streaming the weights ahead hid (:mod:`stepsim.serve.projections`);
        ``self.last_streamed``: every piece's place in the step."""
        from stepsim.serve.projections import engine_pieces

        return self.streamed_weight_cycles(batch, engine_pieces(self, batch, tasks, results))

    def streamed_weight_cycles(self, batch: IterationBatch, pieces: list) -> tuple[int, int]:
        """:meth:`mapped_weight_cycles` of a step's ``pieces`` (:func:`stepsim.serve.projections.step_pieces`)."""
        from stepsim.serve.projections import stream_ahead

        hw = self.hardware
        self.last_streamed = stream_ahead(pieces, hw.on_chip_capacity_bytes, hw.hbm_peak_bytes_per_cycle,
                                          hw.peak_flops_per_cycle)
        tokens = int(sum(batch.new_tokens))  # the embedding rows: a chip's share (split by vocabulary as the LM head)
        embedding = math.ceil(-(-tokens * self.embedding_bytes // self.chips) / hw.hbm_peak_bytes_per_cycle)
        weights = sum(p.cycles for p in pieces if p.kind == "projection")
        return weights + embedding, sum(s.saved for s in self.last_streamed)

    def __call__(self, batch: IterationBatch) -> IterationCost:
        start = time.perf_counter()
        tasks, roles = self.tasks(batch)
        if self.layer_use is not None:
            self.layer_use.note(batch)
        results = self.run_tasks(tasks, batch)
        cycles = dict.fromkeys(CYCLE_KINDS, 0)
        for (role, count), (c, *_) in zip(roles, results):
            cycles[role] += count * c
        cycles["attention"] += self.collective_cycles(batch)
        if self.streams_weights:  # the weights on the engine, streamed ahead (stepsim.serve.projections)
            cycles["weights"], cycles["hidden"] = self.mapped_weight_cycles(batch, tasks, results)
            total = cycles["attention"] + cycles["ffn"] + cycles["weights"] - cycles["hidden"]
        else:
            cycles["weights"] = self.weight_cycles(batch)
            total = sum(cycles.values())
        touched = sum(len(np.unique(data)) for kind, data in tasks if kind == "ffn") if self.model.is_moe else 0
        self.wall_s += time.perf_counter() - start
        return IterationCost(total / self.hardware.clock_hz, cycles, self.step_work(batch, touched, total))

    def collective_cycles(self, batch: IterationBatch) -> int:
        """Cycles of a step's collectives outside the layer pieces: none on one chip (a system's all-reduces:
        :class:`stepsim.serve.system.SystemEngineLatency`)."""
        return 0

    def step_work(self, batch: IterationBatch, touched: int, cycles: int) -> dict:
        """The step's roofline and the utilisation its ``cycles`` achieve (:class:`IterationCost`'s ``work``);
        ``touched``: experts touched, summed over layers."""
        hbm, flops = self.roofline.work(batch.prefill_tokens + batch.decode_tokens, sum(batch.context_tokens),
                                        seen_tokens(batch.context_tokens, batch.new_tokens), touched,
                                        len(batch.new_tokens))
        hbm_use, compute_use = self.roofline.utilisation(hbm, flops, cycles)
        return {"hbm_bytes": hbm, "flops": flops, "hbm_utilisation": hbm_use, "compute_utilisation": compute_use}

    def describe(self) -> dict:
        """What the summary's ``fidelity`` says beyond the mode: the routing and the engine runs (not the
        templates built, which depend on how many workers built them: the outputs do not)."""
        routing = self.routing.describe() if self.routing is not None else None
        described = {"routing": routing, "simulations": self.simulations}
        if self.spec.schedule != "paper":  # said only when mapped: a paper-schedule summary stays as it was
            described["schedule"] = self.spec.schedule
        return described

    def stats(self) -> dict:
        """Where the provider's time went: templates built (graph building and lowering) against engine runs."""
        return {"templates": self.templates, "simulations": self.simulations, "build_s": self.build_s,
                "engine_s": self.engine_s, "provider_wall_s": self.wall_s, "jobs": self.jobs or 1}
