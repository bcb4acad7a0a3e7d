"""Step prices for the candidates of a plan: one fast calibration per replica shape, shared by every deployment
of that shape, and a sound lower bound on any step's time (docs/plan.md §2).

``--fidelity fast`` calibrates on exact simulations of the run it serves (docs/serving.md §10) and keys its cache
by the run's scheduler and shaping, so a plan that served its hundreds of (deployment, rate) runs with
``fidelity="fast"`` would calibrate each one (minutes apiece). A plan calibrates once per replica shape (hardware,
chips per replica) on the reference run (the shaped trace at the offered rate, vLLM's defaults, one replica) and
prices every candidate of that shape with a fresh provider of that calibration, passed to :func:`stepsim.serve` as
its ``provider`` (fresh: the synthetic routing draws per token, so a provider is never shared by two runs). The
recommended deployment is then re-served with its own calibration (``--fidelity fast``) and the difference
reported (:mod:`stepsim.plan.api`).

:func:`floor_s` is the least time any steps computing some new tokens can take on a replica: the chips' HBM
roofline of the bytes such a step must read (every weight matrix once, for an MoE model ``top_k`` experts of every
layer, the new tokens' KV) and their compute roofline of its FLOPs (:class:`stepsim.mapping.roofline.StepWork`),
over the replica's chips; :class:`StepFloor` adds the context the steps read and, from the providers' routing pool
(:func:`least_touched`), the experts more decode tokens touch. The engine never beats it, and every replay checks
that the provider did not either (every step's ``hbm_utilisation`` and ``compute_utilisation`` at most 1).
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np

from stepsim.base.errors import ConfigError


class ShapePricer:
    """Fresh calibrated fast providers for replicas of ``chips`` chips of ``hardware`` (module docstring)."""

    def __init__(self, model_arg, resolved, hardware: str, chips: int, system: str | None, cache, seed: int = 0):
        self.model_arg, self.model, self.hardware_name = model_arg, resolved, hardware
        self.chips, self.system_name, self.cache, self.seed = chips, system, Path(cache), seed
        self.record = None
        self.summary = None
        #: serve's default schedule for this shape (``auto``: mapped layers on one sn40l chip; else ``paper``)
        self.schedule = None
        #: each calibration record's (by id) step prices, shared by its providers (:meth:`provider`)
        self._price_memos: dict[int, dict] = {}

    def calibrate(self, reference_file, slo: str) -> dict:
        """Calibrate ``--fidelity fast`` on the reference run (or read its calibration from the cache) and keep the
        calibration; returns the summary of a run served with it.

        Served is the reference run's first request alone, priced by the reference run's calibration (serve's
        ``calibration_requests``: the same key and record as serving the whole run): the plan keeps the calibration
        and the summary's KV cache, not the run, whose replay was 15-20 s a shape of the full-size plan's
        calibration tasks (bench/README.md, session 55)."""
        from stepsim.serve.api import default_schedule, resolve_serving_hardware, serve
        from stepsim.trace_io.requests import read_requests

        # the layers serve prices a run of this shape with (its --schedule default): mapped on sn40l chips, the
        # paper's elsewhere; provider() rebuilds the matching provider, the commands and the verification name it
        self.schedule = default_schedule(resolve_serving_hardware(self.hardware_name), "fast")
        # report_layers=False: the plan keeps the run's calibration and summary, not its per-bucket schedules
        result = serve(self.model_arg, read_requests(reference_file).head(1), fidelity="fast",
                       schedule=self.schedule, slo=slo, hardware=self.hardware_name, system=self.system_name,
                       calibration_cache=self.cache, seed=self.seed, report_layers=False,
                       calibration_requests=reference_file)
        return self.adopt(result.summary, self.schedule)

    def adopt(self, summary: dict, schedule: str) -> dict:
        """Keep the calibration of a reference run's ``summary`` (served here by :meth:`calibrate`, or in a worker
        of the sweep runner, :mod:`stepsim.plan.waves`) read from the cache; returns the summary."""
        from stepsim.serve.calibration_cache import load_calibration

        self.summary, self.schedule = summary, schedule
        self._price_memos = {}  # a new calibration: none of the old one's prices hold (and its ids may be reused)
        key = summary["fidelity"]["calibration"]
        if "groups" in summary["fidelity"]:  # a heterogeneous model: one calibration per layer group
            self.record = [load_calibration(self.cache, k) for k in key.split("+")]
            if None in self.record:
                raise ConfigError(f"calibration {key} vanished from {self.cache} while planning")
            return summary
        self.record = load_calibration(self.cache, key)
        if self.record is None:  # written by serve a moment ago
            raise ConfigError(f"calibration {key} vanished from {self.cache} while planning")
        return summary

    def shape_config(self) -> dict:
        """What a worker needs to rebuild this pricer (:meth:`from_config`): plain data, the calibration by its
        cache key(s) (``calibration``: joined with ``+`` for a heterogeneous model)."""
        return {"hardware": self.hardware_name, "chips": self.chips, "system": self.system_name,
                "seed": self.seed, "schedule": self.schedule, "calibration": self.summary["fidelity"]["calibration"],
                "groups": "groups" in self.summary["fidelity"],
                "max_model_len": self.summary["kv_cache"]["max_model_len"]}

    @classmethod
    def from_config(cls, model_arg, resolved, cache, config: dict) -> ShapePricer:
        """The pricer of :meth:`shape_config`'s ``config``, its calibration read from ``cache`` (as
        :meth:`adopt` reads it: the same provider, bit for bit)."""
        pricer = cls(model_arg, resolved, config["hardware"], config["chips"], config["system"], cache,
                     config["seed"])
        fidelity = {"calibration": config["calibration"], **({"groups": True} if config["groups"] else {})}
        pricer.adopt({"fidelity": fidelity, "kv_cache": {"max_model_len": config["max_model_len"]}},
                     config["schedule"])
        return pricer

    def provider(self):
        """A fresh provider of the calibration (as :func:`stepsim.serve.api.fast_provider` makes it)."""
        from stepsim.serve.api import resolve_serving_hardware
        from stepsim.serve.fast import FastLatency, MetricForm
        from stepsim.serve.memory import model_memory
        from stepsim.serve.routing import SyntheticRouting

        limit = self.summary["kv_cache"]["max_model_len"]
        vocab = model_memory(self.model).vocab_size
        hw = resolve_serving_hardware(self.hardware_name)
        system = None
        if self.system_name is not None:
            from stepsim.serve.system import load_system

            system, _ = load_system(self.system_name, self.hardware_name, "fast", hw)

        def make(model, record, seed, gate=None):
            forms = {kind: MetricForm(tuple(v[0]), tuple(v[1])) for kind, v in record["forms"].items()}
            routing = SyntheticRouting(model.experts, model.top_k, model.layers, seed=seed) if model.is_moe else None
            if gate is not None:  # DeepSeek-V3's group-limited routing (a layer group's)
                from stepsim.serve.group_synthetic import GroupSyntheticRouting

                routing = GroupSyntheticRouting(gate, model.layers, seed=seed)
            if system is None:
                kind = FastLatency
                if self.schedule == "auto":  # mapped layers, as fast_provider builds them
                    from stepsim.serve.fast_mapped import MappedFastLatency as kind
                provider = kind(model, hw, routing, max_model_len=limit, vocab=vocab, jobs=None, forms=forms,
                                theta=record["theta"], error=record["error"], schedule=self.schedule)
            else:
                from stepsim.serve.api import system_fast_class

                provider = system_fast_class(model, self.schedule)(
                    model, system, routing, max_model_len=limit, vocab=vocab, jobs=None, forms=forms,
                    theta=record["theta"], error=record["error"])
            # the step prices compiled replays fill, shared by this calibration's providers
            # (stepsim.serve.replay_mapped.price_memo)
            provider.price_memo = self._price_memos.setdefault(id(record), {})
            return provider

        if isinstance(self.record, list):  # a heterogeneous model, layer group by layer group
            from stepsim.serve.layer_list import calibrated_layer_list

            return calibrated_layer_list(self.model, self.record, make, self.seed)
        return make(self.model, self.record, self.seed)

    def least_touched(self, longest: int) -> np.ndarray | None:
        """:func:`least_touched` of this shape's providers' routing (every provider of the shape draws the same
        pool): the fewest experts a step of up to ``longest`` tokens touches; None for a dense or heterogeneous
        model (the floor's step term then counts ``top_k`` experts a layer)."""
        if not self.model.is_moe or isinstance(self.record, list):
            return None
        provider = self.provider()
        try:
            return least_touched(getattr(provider, "routing", None), self.model.layers, longest)
        finally:
            getattr(provider, "close", lambda: None)()


def floor_s(model, hardware, chips: int, steps: int, tokens: int) -> float:
    """The least seconds ``steps`` steps computing ``tokens`` new tokens in all take on ``chips`` chips of
    ``hardware`` (:class:`StepFloor`; for many calls on one replica shape make the :class:`StepFloor` once)."""
    return StepFloor(model, hardware, chips)(steps, tokens)


def least_touched(routing, layers: int, longest: int) -> np.ndarray | None:
    """``[longest + 1]`` (int64): ``[t]`` the fewest experts, summed over the ``layers`` layers, that the tokens of
    a fast step of ``t`` tokens touch under ``routing`` (a fast provider's synthetic routing): the fast path takes a
    step's tokens from windows of one drawn pool (:meth:`stepsim.serve.routing.SyntheticRouting.window`: each layer
    at its own start, its experts a permutation of the pool's, wrapping around its end), so every layer's window of
    ``t`` tokens holds at least the fewest distinct experts of any window of ``t`` pool tokens
    (:func:`stepsim.kernels.routing_windows.least_distinct`), and a step's roofline reads every expert its windows
    touch (:meth:`stepsim.mapping.roofline.StepWork.work`). Windows longer than the pool hold a whole pool's. None
    for another routing (a plan's providers draw the synthetic one)."""
    from stepsim.kernels.routing_windows import least_distinct
    from stepsim.serve.routing import SyntheticRouting

    if not isinstance(routing, SyntheticRouting):
        return None
    if routing._pool is None:
        routing._draw_pool()  # what the first window() does (as the compiled loop's set-up)
    rows = np.ascontiguousarray(routing._pool[0], dtype=np.int64)  # [pool tokens, top_k]
    t = min(longest, len(rows))
    out = np.zeros(longest + 1, dtype=np.int64)
    least_distinct(rows, t, np.zeros(int(rows.max()) + 1, dtype=np.int64), out)
    out[t + 1:] = out[t]
    return layers * out


class StepFloor:
    """The least seconds steps take on ``chips`` chips of ``hardware`` (any batches, any context; module
    docstring): every step reads every weight matrix once (and an MoE model's ``top_k`` experts of every layer: a
    token meets that many distinct experts), every token writes its K and V, reads its embedding row and does its
    FLOPs (attending to itself at least); the time is at least the bytes over the chips' HBM peak and at least the
    FLOPs over their compute peak. Summing over the steps before taking the maximum only lowers it, so it bounds any
    split of the tokens into the steps. A heterogeneous model adds its layer groups' rooflines, each group's layers
    counted as they are (MLA's latent cache and own weights, dense or MoE FFN:
    :func:`stepsim.serve.layer_list.layer_list_works`).

    Two terms a caller that knows them adds (a model of one layer kind; :meth:`__call__`'s ``decode`` and
    ``context``):

    * *the experts more decode tokens touch*: with ``touched`` (:func:`least_touched` of the providers' routing),
      a step's tokens touch at least ``touched[t]`` experts, so a step with ``d >= 1`` decode tokens (``d`` at most
      ``max_seqs``, the policy's cap on running requests) touches at least ``touched[1] + b (d - 1)``, ``b`` the
      least slope ``(touched[d] - touched[1]) / (d - 1)`` over ``d`` up to ``max_seqs`` (a chord below every
      point): over steps of ``D`` decode tokens in all, at least ``steps x touched[1] + b max(0, D - steps)``
      experts (the floor still rises with the steps: ``b <= touched[1]``). Without it the floor knew only the
      ``top_k`` of one token a step: on issue 42's must-show case a median decode step (15 tokens) read 2.3x the
      bytes of a one-token step;
    * *the context read*: a step reads every cached token of its sequences (its K and V) and attends to them.

    The floor is linear in steps, tokens and context, and convex in the decode tokens (so positively homogeneous and
    convex: the floor of R replicas' steps together is at most R times the largest replica's); the terms are
    computed once here (Python integers where the work is, the slope a fraction, so a call is exact arithmetic and
    cheap)."""

    def __init__(self, model, hardware, chips: int, touched=None, max_seqs: int = 1):
        from stepsim.mapping.roofline import StepWork
        from stepsim.serve.memory import model_memory

        vocab = model_memory(model).vocab_size
        self.decode_bytes, self.context_bytes, self.context_flops = Fraction(0), 0, 0
        if model.unmodelled():  # a heterogeneous model (DeepSeek-V3): each layer group as its layers are
            from stepsim.serve.layer_list import layer_list_works

            works = layer_list_works(model, hardware, vocab, chips)
        else:
            work = StepWork(model, hardware, vocab, chips)
            step_experts = model.layers * model.top_k if model.is_moe else 0
            if touched is not None and model.is_moe:
                if len(touched) <= max_seqs:
                    raise ValueError(f"touched covers {len(touched) - 1} tokens, fewer than max_seqs {max_seqs}")
                step_experts = int(touched[1])
                slope = min((Fraction(int(touched[d]) - step_experts, d - 1) for d in range(2, max_seqs + 1)),
                            default=Fraction(0))
                self.decode_bytes = slope * work.expert_bytes
            works = [(work, step_experts)]
            # a step's context: its sequences' cached tokens, read and attended to (StepWork.work)
            self.context_bytes, self.context_flops = work.kv_bytes_per_token, work.attention_flops
        #: per layer group: (bytes a step, bytes a token, FLOPs a token, FLOPs a step)
        self.terms = [(work.fixed_bytes + experts * work.expert_bytes, work.kv_bytes_per_token + work.embedding_bytes,
                       work.flops_per_token + work.attention_flops, work.head_flops) for work, experts in works]
        work = works[-1][0]
        self.peak_bytes, self.peak_flops = work.peak_bytes, work.peak_flops  # per cycle, all the chips
        self.clock_hz = hardware.clock_hz

    def __call__(self, steps: int, tokens: int, decode: int = 0, context: int = 0) -> float:
        """Seconds of ``steps`` steps computing ``tokens`` new tokens in all (0 for no step), ``decode`` of them
        decode tokens, over ``context`` cached tokens in all (each step's sequences' context, summed)."""
        if steps <= 0:
            return 0.0
        hbm = flops = 0
        for step_bytes, token_bytes, token_flops, step_flops in self.terms:
            hbm += steps * step_bytes + tokens * token_bytes
            flops += tokens * token_flops + steps * step_flops  # a sequence a step
        hbm += context * self.context_bytes
        flops += context * self.context_flops
        if self.decode_bytes and decode > steps:
            hbm = self.decode_bytes * (decode - steps) + hbm  # a Fraction
        return float(max(hbm / self.peak_bytes, flops / self.peak_flops) / self.clock_hz)
