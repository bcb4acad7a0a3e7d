"""The compiled replay (:mod:`stepsim.kernels.serve_replay`): the scheduler loop and, for ``--fidelity fast``, the
fast model's pricing in machine code, for the providers whose every number it reproduces bit for bit:

* :class:`~stepsim.serve.latency.ConstantLatency` (``--iteration-latency``);
* :class:`~stepsim.serve.fast.FastLatency` (calibrated, or a calibration's pilot: its reservoir fed every step), on
  one chip, dense or MoE
  with the synthetic routing (its pool and window starts are the Python path's: the starts are drawn from the
  routing's own generator, a batch of :data:`~stepsim.serve.routing.WINDOW_BATCH` steps at a time, as
  :meth:`~stepsim.serve.routing.SyntheticRouting.window` draws them).

:func:`compiled_replay` returns None for anything else (another provider, a scheduler subclass, a routing dump, a
system, a step whose numbers leave float64's exact integers, a step the reference refuses): the caller then runs
the reference loop (:func:`stepsim.serve.replay.replay_reference`), which also raises the reference's errors. The
routing's state is put back first, so the reference starts where the compiled loop did.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np

from stepsim.serve.latency import WORK_COLUMNS, ConstantLatency
from stepsim.serve.replay_result import ReplayResult
from stepsim.serve.scheduler import Scheduler

#: steps between two progress reports when a progress callback is given
PAUSE_STEPS = 2048
#: sequences a calibration pilot's loop keeps of its steps' batches before it returns them to the reservoir (one
#: step's at most besides: ``CompiledLoop.record``)
RECORD_COLUMNS = 1 << 16
#: most columns of a regressor row the compiled pricing takes (NumPy's pairwise sum in one block:
#: stepsim.kernels.serve_replay.ROW_SUM_LIMIT, not imported here so that this module loads without numba)
MAX_COLUMNS = 128


def _fast_parameters(provider, kr) -> dict | None:
    """The fast provider's constants as the kernel takes them, or None when it cannot price this provider."""
    from stepsim.serve import fast as model_of_steps
    from stepsim.serve.fast import FastLatency, few_experts, has_shared
    from stepsim.serve.replay_mapped import recordable
    from stepsim.serve.routing import SyntheticRouting

    tile_shift, compute_bw = model_of_steps._TILE_SHIFT, model_of_steps.BOUND_COMPUTE_BW
    few_tokens, kinds = model_of_steps.FEW_TOKENS, model_of_steps.MODELS

    from stepsim.serve.system_fast import SystemFastLatency

    system = type(provider) is SystemFastLatency
    if not (type(provider) is FastLatency or system) or not recordable(provider):
        return None
    if not system and provider.spec.system is not None:
        return None
    chips = provider.system.chips if system else 1
    if system and (provider.layer_bytes is not None or not provider.counts_head or chips < 2):
        return None  # a layer group's provider (stepsim.serve.layer_list): its weights are counted otherwise
    model = provider.model
    if model.is_moe and type(provider.routing) is not SyntheticRouting:
        return None
    hardware, roofline = provider.hardware, provider.roofline
    if (provider.spec.hardware.hbm_peak_bytes_per_cycle != hardware.hbm_peak_bytes_per_cycle
            or roofline.embedding_bytes != provider.embedding_bytes or provider.chips != chips
            or model_of_steps.DECODE_REGIONS != 4):
        return None
    chip_columns = system and model.is_moe  # SystemFastLatency.chip_columns
    forms = provider.forms or {}
    if set(forms) != {"decode", "prefill", "ffn"}:
        return None
    shared = has_shared(provider.spec)
    rounds = few_experts(provider.spec)
    experts = model.experts if model.is_moe else 0
    columns = 8 + few_tokens + 1 + int(shared) + (experts if rounds else 0) + (3 if chip_columns else 0)
    widths = {"decode": 4, "prefill": 4, "ffn": 6 if shared else 5}
    if columns > MAX_COLUMNS or any(len(forms[k].off_chip) != w or len(forms[k].flops) != w
                                    for k, w in widths.items()):
        return None
    form_rows = np.zeros((6, 6))
    for i, kind in enumerate(("decode", "prefill", "ffn")):
        form_rows[2 * i, :widths[kind]] = forms[kind].off_chip
        form_rows[2 * i + 1, :widths[kind]] = forms[kind].flops
    theta = provider.theta or {}
    if not isinstance(theta, dict) or not set(theta) <= set(kinds):  # coefficients of another shape: not this model's
        return None
    rows = [theta.get(kind) for kind in kinds]  # decode, prefill, ffn, ffn_prefill: the kernel's rows
    if any(r is not None and not (isinstance(r, (list, tuple)) and all(isinstance(v, (int, float)) for v in r))
           for r in rows):
        return None
    width = max([len(r) for r in rows if r is not None], default=1)
    if width > MAX_COLUMNS:
        return None
    theta_rows = np.zeros((4, width))
    pi = np.zeros(kr.P_ROWS, dtype=np.int64)
    for i, r in enumerate(rows):
        if r is not None:
            theta_rows[i, :len(r)] = np.asarray(r, dtype=np.float64)
        pi[kr.P_THETA_LENGTH + i] = -1 if r is None else len(r)
    pi[kr.P_MODE] = kr.FAST
    pi[kr.P_LAYERS] = model.layers
    pi[kr.P_HEADS] = provider.attention_heads()
    pi[kr.P_MOE] = int(model.is_moe)
    pi[kr.P_COUNT] = 1 if model.is_moe else model.layers
    pi[kr.P_LAYER_WEIGHTS] = provider.layer_weights
    pi[kr.P_HEAD_CYCLES] = provider.head_cycles
    pi[kr.P_EMBEDDING_BYTES] = provider.embedding_bytes
    pi[kr.P_HBM_PEAK] = hardware.hbm_peak_bytes_per_cycle
    pi[kr.P_CLOCK] = hardware.clock_hz
    pi[kr.P_SHARED] = int(shared)
    pi[kr.P_ROUNDS] = int(rounds)
    pi[kr.P_EXPERTS] = experts
    pi[kr.P_TILE_SHIFT] = tile_shift
    pi[kr.P_FEW_TOKENS] = few_tokens
    pi[kr.P_FIXED_BYTES] = roofline.fixed_bytes
    pi[kr.P_EXPERT_BYTES] = roofline.expert_bytes
    pi[kr.P_KV_BYTES] = roofline.kv_bytes_per_token
    pi[kr.P_FLOPS_PER_TOKEN] = roofline.flops_per_token
    pi[kr.P_HEAD_FLOPS] = roofline.head_flops
    pi[kr.P_ATTENTION_FLOPS] = roofline.attention_flops
    pi[kr.P_PEAK_BYTES] = roofline.peak_bytes
    pi[kr.P_PEAK_FLOPS] = roofline.peak_flops
    pi[kr.P_COMPUTE_BW] = compute_bw
    pi[kr.P_CHIPS] = chips
    pi[kr.P_SHARED_CHIPS] = model_of_steps.system_chips(provider.spec)
    pi[kr.P_CHIP_COLUMNS] = int(chip_columns)
    if system:  # SystemEngineLatency.weight_cycles: every weight read 1 / n a chip; the embedding rows in the loop
        from stepsim.serve.latency import IterationBatch

        pi[kr.P_LAYER_WEIGHTS], pi[kr.P_HEAD_CYCLES] = 0, provider.weight_cycles(IterationBatch([0], [0], 0, 0))
    if max(abs(int(v)) for v in pi) >= kr.EXACT:
        return None
    routing = provider.routing if model.is_moe else None
    expert_of_rank = np.zeros((1, 1), dtype=np.int64)
    if routing is not None:
        if routing._pool is None:
            routing._draw_pool()  # what the first window() does
        ranks, prefix, expert_of_rank = routing._pool
        pool_rows, prefix = np.ascontiguousarray(ranks), prefix
        expert_of_rank = np.ascontiguousarray(expert_of_rank)
    else:
        pool_rows, prefix = np.zeros((1, 1), dtype=np.int64), np.zeros((1, 2, 1), dtype=np.uint16)
    params = {"pi": pi, "forms": form_rows, "theta": theta_rows, "routing": routing, "pool_rows": pool_rows,
              "prefix": prefix, "x": np.zeros((max(model.layers, 1), max(columns, width))),
              "tiles": np.zeros(max(experts, 1) + 1, dtype=np.int64),
              "cycles": ("attention", "ffn", "floor", "weights"), "hardware": hardware, "roofline": roofline}
    if system:  # the collectives' table and the experts' chips, in the mapped pricing's arrays (unused there)
        from stepsim.serve.replay_mapped import price_memo
        from stepsim.workloads.moe.parallel import place_experts

        arrays = _no_mapped(kr)
        arrays["memo"] = price_memo(provider, "collectives",
                                    lambda: {"proj": np.full((1, 1, 1024), -1, dtype=np.int64)})
        arrays["proj"] = arrays["memo"]["proj"]
        arrays["expert_of_rank"] = expert_of_rank
        if chip_columns:
            arrays["counts"] = np.array(place_experts([0] * experts, chips, "contiguous"), dtype=np.int64)
            arrays["regions"] = np.zeros(chips, dtype=np.int64)
        params.update(mapped=arrays, fill=_fill_collective, provider=provider, no_notes=True)
    return params


def _fill_collective(params: dict) -> None:
    """A system's collectives at the step's tokens (``need[0]``) into ``proj[0, 0]``: the provider's own
    ``collective_cycles`` of a step of that many tokens (they depend on the tokens alone)."""
    from stepsim.serve.latency import IterationBatch

    arrays = params["mapped"]
    tokens = int(arrays["need"][0])
    proj = arrays["proj"] = arrays["memo"]["proj"]  # the shared table as it is now (replay_mapped.fill)
    if tokens >= proj.shape[2]:
        grown = np.full((1, 1, max(2 * proj.shape[2], tokens + 1)), -1, dtype=np.int64)
        grown[:, :, :proj.shape[2]] = proj
        proj = arrays["proj"] = arrays["memo"]["proj"] = grown
    value = params["provider"].collective_cycles(IterationBatch([0], [tokens], tokens, 0))
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < 1 << 53:
        raise ValueError(f"the collectives' cycles at {tokens} tokens are {value!r}")
    proj[0, 0, tokens] = int(value)


def _constant_parameters(kr) -> dict:
    pi = np.zeros(kr.P_ROWS, dtype=np.int64)
    pi[kr.P_MODE] = kr.CONSTANT
    return {"pi": pi, "forms": np.zeros((6, 6)), "theta": np.zeros((4, 1)), "routing": None,
            "pool_rows": np.zeros((1, 1), dtype=np.int64), "prefix": np.zeros((1, 2, 1), dtype=np.uint16),
            "x": np.zeros((1, 1)), "tiles": np.zeros(2, dtype=np.int64), "cycles": ()}


def _no_mapped(kr) -> dict:
    """The mapped pricing's arrays for a loop that does not price on mapped layers (unused; the same types)."""
    from stepsim.kernels import serve_mapped as sm

    one = np.zeros(1, dtype=np.int64)
    return {"pm": np.zeros(sm.M_ROWS, dtype=np.int64), "buckets_i": np.zeros((sm.B_ROWS, 1), dtype=np.int64),
            "buckets_f": np.zeros((sm.BF_ROWS, 1)), "proj": np.zeros((4, 4, 1), dtype=np.int64),
            "expert_of_rank": np.zeros((1, 1), dtype=np.int64), "rank_of_expert": np.zeros((1, 1), dtype=np.int64),
            "need": np.zeros(3, dtype=np.int64),
            "res": np.zeros(sm.R_ROWS, dtype=np.int64), "mloads": one, "counts": one, "regions": one,
            "pc": np.zeros((sm.PC_ROWS, 1), dtype=np.int64)}


def compiled_replay(arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray, scheduler: Scheduler,
                    provider, progress: Callable[[int, int], None] | None = None, stop=None):
    """:func:`stepsim.serve.replay.replay` in machine code: the same :class:`~stepsim.serve.replay_result.ReplayResult`,
    bit for bit, or None when this provider or scheduler is not one it reproduces (module docstring). ``stop``: a
    :class:`~stepsim.serve.replay_stop.StopRule` (raises :class:`~stepsim.serve.replay_stop.ReplayStopped` where
    the reference would)."""
    return _compiled(arrival_s, prompt, output, scheduler, provider, progress, stop, None, None)


def compiled_decode_pool(arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray, scheduler: Scheduler,
                         provider, first_token: str, prefill_end: np.ndarray, stop=None, since=None):
    """A disaggregated deployment's decode pool (:func:`stepsim.serve.disaggregated._decode_pool`) in machine
    code, or None as :func:`compiled_replay`. The requests are the pool's, in the order they arrive
    (``arrival_s``: their KV transfers' ends, s, sorted); ``first_token`` ``"decode"`` (the pool recomputes each
    prompt's last token and produces the first token) or ``"prefill"`` (the first token came at ``prefill_end``,
    s). Its ``ReplayResult`` is per pool request in that order (``first_scheduled``: admission to the pool).
    ``stop``: a :class:`~stepsim.serve.replay_stop.StopRule` over the pool's requests, their metrics measured from
    ``since`` (s, their arrivals in the trace; default ``arrival_s``: :mod:`stepsim.serve.disaggregated`, "Early
    stop")."""
    return _compiled(arrival_s, prompt, output, scheduler, provider, None, stop, first_token, prefill_end, since)


def _compiled(arrival_s, prompt, output, scheduler, provider, progress, stop, first_token, prefill_end, since=None):
    """The compiled loop: a colocated replay (``first_token`` None) or a decode pool; ``stop`` as
    :func:`compiled_replay`'s."""
    loop = CompiledLoop.make(len(arrival_s), scheduler, provider, progress, stop, first_token is not None)
    if loop is None:
        return None
    loop.know(arrival_s, prompt, output, first_token, prefill_end, since)
    if loop.run() is None:
        return None
    return loop.result(scheduler)


class CompiledLoop:
    """One compiled replay's state (every array :func:`stepsim.kernels.serve_replay.replay_loop` takes) and its
    driver: :meth:`run` calls the loop until it is done or reaches the horizon, answering what it returns
    (more step columns, window starts, a mapped table, progress). A replay knows every request at once
    (:func:`_compiled`); a replica replayed alongside others (:mod:`stepsim.plan.joint`) is sent each request
    when its router routes it (:meth:`send`) and runs up to the next request's arrival (:meth:`run_until`)."""

    @classmethod
    def make(cls, total: int, scheduler: Scheduler, provider, progress=None, stop=None, decode_pool=False):
        """The loop of at most ``total`` requests through ``provider``, or None when this provider or scheduler is
        not one it reproduces (module docstring)."""
        if (type(scheduler) is not Scheduler or scheduler.running or scheduler.waiting or total == 0
                or scheduler.usable != scheduler.free):
            return None
        from stepsim.kernels import serve_replay as kr

        if type(provider) is ConstantLatency:
            params = _constant_parameters(kr)
            constant_s = float(provider.seconds)
        else:
            from stepsim.serve.replay_mapped import mapped_parameters

            params = _fast_parameters(provider, kr) or mapped_parameters(provider, kr)
            if params is None:
                return None
            constant_s = 0.0
        return cls(kr, total, scheduler, provider, params, constant_s, progress, stop, decode_pool)

    def __init__(self, kr, total, scheduler, provider, params, constant_s, progress, stop, decode_pool):
        self.kr, self.params, self.constant_s, self.progress = kr, params, constant_s, progress
        self.provider = provider
        # a calibration's pilot replay: every step offered to the provider's reservoir (_record) whenever the loop
        # returns; the reservoir as it was, for the reference loop should it take over
        self.recorder = getattr(provider, "recorder", None)
        self.recorded = 0
        self.fresh_recorder = None if self.recorder is None else copy.deepcopy(self.recorder)
        self.mapped = params.get("mapped") or _no_mapped(kr)
        self.routing = routing = params["routing"]
        self.saved = None
        if routing is not None:  # put back when the reference takes over
            self.saved = (routing._windows.bit_generator.state, routing._starts, routing._used)
        _compile_notice()
        config = scheduler.config
        cfg = self.cfg = np.zeros(kr.C_ROWS, dtype=np.int64)
        cfg[kr.C_POLICY] = {"vllm": kr.VLLM, "sarathi": kr.SARATHI, "orca": kr.ORCA}[config.policy]
        cfg[kr.C_MAX_SEQS] = config.max_num_seqs
        cfg[kr.C_BUDGET] = config.max_num_batched_tokens or 0
        cfg[kr.C_CHUNK] = config.chunk_tokens
        cfg[kr.C_BLOCK_SIZE] = scheduler.block_size
        cfg[kr.C_MAX_MODEL_LEN] = scheduler.max_model_len
        cfg[kr.C_USABLE] = scheduler.usable
        cfg[kr.C_WATERMARK] = scheduler.watermark
        cfg[kr.C_PAUSE] = PAUSE_STEPS if progress is not None else np.iinfo(np.int64).max
        # a pilot's steps' batches (cfg[C_RECORD]): room for a step of every known request besides RECORD_COLUMNS
        self.record = np.zeros((2, 1), dtype=np.int64)
        if self.recorder is not None:
            cfg[kr.C_RECORD] = 1
            self.record = np.zeros((2, RECORD_COLUMNS + min(config.max_num_seqs, total)), dtype=np.int64)
        cfg[kr.C_DECODE_POOL] = int(decode_pool)
        st = self.st = np.zeros(kr.S_ROWS, dtype=np.int64)
        st[kr.S_FREE] = scheduler.free
        self.req = np.zeros((kr.R_ROWS, total), dtype=np.int64)
        self.times = np.full((kr.T_ROWS, total), -1.0)
        self.times[kr.T_ARRIVAL] = np.inf  # a request not yet known never arrives (the stop rule's pointers)
        self.queues = np.zeros((6, total), dtype=np.int64)  # running, waiting, rest, prefills, batch requests, tokens
        self.ctx = np.zeros(total, dtype=np.int64)
        self.gaps = np.zeros(0)  # a slot for every token after a request's first (``gap_slots`` of the known)
        self.gap_slots = 0
        capacity = 4 * total + 1024
        self.steps_i = np.zeros((kr.I_ROWS, capacity), dtype=np.int64)
        self.steps_f = np.zeros((kr.F_ROWS, capacity))
        self.clock = np.array([0.0, np.inf])
        self.starts = np.zeros((1, 1), dtype=np.int64)
        if routing is not None:
            self.starts = routing._starts
            st[kr.S_STARTS_USED] = routing._used
        self.scratch = (np.zeros(4, dtype=np.int64), np.zeros(5, dtype=np.int64), np.zeros(3, dtype=np.int64),
                        params["x"], np.zeros(6), np.zeros(MAX_COLUMNS), params["tiles"])
        if stop is None:
            self.stop_f, self.stop_i = np.zeros(3), np.zeros(kr.SP_ROWS, dtype=np.int64)  # inactive
        else:
            self.stop_f, self.stop_i = stop.as_arrays()
        self.seen = np.zeros(total, dtype=np.int64)

    def know(self, arrival_s, prompt, output, first_token=None, prefill_end=None, since=None) -> None:
        """Every request at once (a replay): their arrivals (s, sorted), prompt and output tokens; a decode pool's
        ``first_token``, ``prefill_end`` and ``since`` as :func:`compiled_decode_pool`'s."""
        kr, req, times = self.kr, self.req, self.times
        req[kr.R_PROMPT] = prompt
        req[kr.R_OUTPUT] = output
        req[kr.R_NUM_TOKENS] = prompt
        req[kr.R_PREFILLING] = 1
        times[kr.T_ARRIVAL] = times[kr.T_SINCE] = arrival_s
        if since is not None:  # a decode pool's requests measured from their arrivals in the trace
            times[kr.T_SINCE] = since
        if first_token is not None:  # the decode pool's requests arrive with their KV (disaggregated._decode_pool)
            req[kr.R_PREFILLING] = 0
            if first_token == "prefill":  # the prefill's token is the first: p tokens cached, p + 1 known
                req[kr.R_COMPUTED] = prompt
                req[kr.R_NUM_TOKENS] = np.asarray(prompt, dtype=np.int64) + 1
                req[kr.R_OUTPUTS] = 1
                times[kr.T_FIRST_TOKEN] = prefill_end
                times[kr.T_LAST_TOKEN] = prefill_end
            else:  # the pool recomputes the prompt's last token
                req[kr.R_COMPUTED] = np.asarray(prompt, dtype=np.int64) - 1
        self.gap_slots = int(np.maximum(np.asarray(output, dtype=np.int64), 1).sum())
        self.gaps = np.zeros(self.gap_slots)
        self.st[kr.S_KNOWN] = len(arrival_s)

    def send(self, arrival_s: float, prompt: int, output: int) -> None:
        """One more request, arriving at ``arrival_s`` (s, no earlier than the last sent), the table's next column."""
        kr, k = self.kr, int(self.st[self.kr.S_KNOWN])
        self.req[kr.R_PROMPT, k] = self.req[kr.R_NUM_TOKENS, k] = prompt
        self.req[kr.R_OUTPUT, k] = output
        self.req[kr.R_PREFILLING, k] = 1
        self.times[kr.T_ARRIVAL, k] = self.times[kr.T_SINCE, k] = arrival_s
        self.st[kr.S_KNOWN] = k + 1
        self.gap_slots += max(output, 1)
        if self.gap_slots > len(self.gaps):
            grown = np.zeros(max(2 * len(self.gaps), self.gap_slots, 1024))
            grown[:len(self.gaps)] = self.gaps
            self.gaps = grown

    def run_until(self, horizon_s: float):
        """Run every step that starts before ``horizon_s`` (s; inf: to the end): the status :meth:`run` returns."""
        self.clock[self.kr.CLOCK_HORIZON] = horizon_s
        return self.run()

    def run(self):
        """Call the loop until it is done (``kr.DONE``) or at the horizon (``kr.HORIZON``); None when the reference
        must replay (the routing's state put back); raises :class:`~stepsim.serve.replay_stop.ReplayStopped`."""
        kr, params, routing, mapped, st = self.kr, self.params, self.routing, self.mapped, self.st
        running, waiting, rest, prefills, batch_r, batch_n = self.queues
        while True:
            status = kr.replay_loop(self.cfg, st, self.clock, self.req, self.times, running, waiting, rest, prefills,
                                    batch_r, batch_n, self.ctx, self.gaps, self.steps_i, self.steps_f, params["pi"],
                                    self.constant_s, params["forms"], params["theta"], params["prefix"],
                                    params["pool_rows"], self.starts, *self.scratch, self.stop_f, self.stop_i,
                                    self.seen, mapped["pm"], mapped["buckets_i"], mapped["buckets_f"],
                                    mapped["proj"], mapped["expert_of_rank"], mapped["rank_of_expert"],
                                    mapped["need"], mapped["res"], mapped["mloads"], mapped["counts"],
                                    mapped["regions"], mapped["pc"], self.record)
            if routing is not None:
                routing._used = int(st[kr.S_STARTS_USED])
            if self.recorder is not None and st[kr.S_STEPS] > self.recorded:
                self._record()
            if status in (kr.DONE, kr.HORIZON):
                return status
            if status == kr.STOPPED:
                _note(params, self.steps_i, st, kr)
                _stopped(self.stop_i, st, self.clock, self.steps_i, self.steps_f, params, kr)
            if status == kr.NEED:  # a bucket's schedule, a token count's projections or collectives: the provider's
                from stepsim.mapping.units import Infeasible
                from stepsim.serve.replay_mapped import fill

                try:
                    params.get("fill", fill)(params)
                except Infeasible:  # no schedule of the step's layer fits the chip: the Python loop would replay to
                    raise  # this step and meet the same error (a plan's unservable rate, docs/plan.md §4)
                except Exception as exc:  # noqa: BLE001 - the Python loop replays, and raises the provider's error
                    status, _fallback_reason[0] = kr.UNSUPPORTED, f"{type(exc).__name__}: {exc}"
            if status in (kr.REFUSED, kr.UNSUPPORTED):
                if self.saved is not None:
                    routing._windows.bit_generator.state, routing._starts, routing._used = self.saved
                if self.recorder is not None:
                    self.provider.recorder = self.fresh_recorder
                return None
            if status == kr.FULL:
                self.steps_i = np.concatenate([self.steps_i, np.zeros_like(self.steps_i)], axis=1)
                self.steps_f = np.concatenate([self.steps_f, np.zeros_like(self.steps_f)], axis=1)
            elif status == kr.STARTS:  # SyntheticRouting.window's draw, at the step that needs it
                from stepsim.serve.routing import POOL_TOKENS, WINDOW_BATCH

                routing._starts = routing._windows.integers(0, POOL_TOKENS, size=(WINDOW_BATCH, routing.layers))
                routing._used = 0
                self.starts = routing._starts
                st[kr.S_STARTS_USED] = 0
            if self.progress is not None:
                self.progress(int(st[kr.S_DONE]), int(st[kr.S_STEPS]))

    def _record(self) -> None:
        """Offer the steps made since the last call to the provider's reservoir, as its ``__call__`` would have
        been offered them one by one (:meth:`~stepsim.serve.fast.Reservoir.offer_steps`): each step's
        :class:`~stepsim.serve.latency.IterationBatch` (its sequences' cached and new tokens, which the loop appended
        to ``record``), whether it has a prefill chunk, and its tasks, made only for a step kept (the FFN's from the
        routing window the step drew, :meth:`_ffn_tasks`; the loop returns at least before the starts are drawn
        again, so the steps drew the rows before ``st[S_STARTS_USED]``, one each)."""
        from stepsim.serve.latency import IterationBatch

        kr, st, steps_i = self.kr, self.st, self.steps_i
        first, stop = self.recorded, int(st[kr.S_STEPS])
        self.recorded = stop
        sequences = steps_i[kr.I_SEQUENCES, first:stop]
        ends = np.cumsum(sequences)
        begins = ends - sequences
        recorded = int(st[kr.S_RECORDED])
        st[kr.S_RECORDED] = 0
        ctx, new = self.record[kr.RC_CONTEXT, :recorded].copy(), self.record[kr.RC_NEW, :recorded].copy()
        chunk = new != 1
        prefill_step = np.add.reduceat(chunk, begins) > 0
        cached = np.maximum.reduceat(np.where(chunk, ctx, 0), begins)
        starts_used = int(st[kr.S_STARTS_USED])
        provider = self.provider

        def make(i: int) -> tuple:
            k, span = first + i, slice(int(begins[i]), int(ends[i]))
            batch = IterationBatch(ctx[span].tolist(), new[span].tolist(), int(steps_i[kr.I_PREFILL, k]),
                                   int(steps_i[kr.I_DECODE, k]))
            row = None if self.routing is None else self.starts[starts_used - (stop - k)].copy()
            ffn_tasks = self._ffn_tasks(batch.prefill_tokens + batch.decode_tokens, row)
            return batch, provider.tasks(batch, ffn_tasks())[0]

        self.recorder.offer_steps(prefill_step, sequences, cached, make)

    def _ffn_tasks(self, tokens: int, row):
        """The provider's FFN tasks of a step of ``tokens`` tokens that drew the routing window at ``row`` (the
        routing's state put back after)."""
        routing = self.routing
        if row is None:
            return self.provider.ffn_rows(tokens)[1]
        saved = routing._starts, routing._used
        routing._starts, routing._used = row[None, :], 0
        try:
            return self.provider.ffn_rows(tokens)[1]
        finally:
            routing._starts, routing._used = saved

    def result(self, scheduler: Scheduler) -> ReplayResult:
        """The finished run's :class:`~stepsim.serve.replay_result.ReplayResult` (its requests in the table's
        order); ``scheduler`` gets the loop's free blocks and preemptions."""
        kr, params, st, steps_i, steps_f = self.kr, self.params, self.st, self.steps_i, self.steps_f
        _note(params, steps_i, st, kr)
        scheduler.free = int(st[kr.S_FREE])
        scheduler.preempted = int(st[kr.S_PREEMPTED])
        if self.progress is not None:
            self.progress(int(st[kr.S_DONE]), int(st[kr.S_STEPS]))
        n = int(st[kr.S_STEPS])
        known = int(st[kr.S_KNOWN])
        blocks = steps_i[kr.I_BLOCKS, :n].copy()
        iterations = {
            "start_s": steps_f[kr.F_START, :n].copy(), "duration_s": steps_f[kr.F_DURATION, :n].copy(),
            "tokens": steps_i[kr.I_TOKENS, :n].copy(), "sequences": steps_i[kr.I_SEQUENCES, :n].copy(),
            "prefill_tokens": steps_i[kr.I_PREFILL, :n].copy(), "decode_tokens": steps_i[kr.I_DECODE, :n].copy(),
            "kv_blocks_used": blocks, "preemptions": steps_i[kr.I_PREEMPTIONS, :n].copy(),
            "waiting": steps_i[kr.I_WAITING, :n].copy(),
        }
        rows = {"attention": kr.I_CYCLES_ATTENTION, "ffn": kr.I_CYCLES_FFN, "hidden": kr.I_CYCLES_HIDDEN,
                "weights": kr.I_CYCLES_WEIGHTS, "floor": kr.I_CYCLES_FLOOR}
        for kind in params["cycles"]:  # sorted, as the reference's columns
            iterations[f"cycles_{kind}"] = steps_i[rows[kind], :n].copy()
        if params["cycles"]:  # StepWork.work and .utilisation: int / int, exact below 2**53 (the kernel checked)
            roofline = params["roofline"]
            hbm, flops = steps_i[kr.I_HBM, :n].copy(), steps_i[kr.I_FLOPS, :n].copy()
            cycles = steps_i[kr.I_CYCLES, :n]
            work = {"hbm_bytes": hbm, "flops": flops, "hbm_utilisation": hbm / (cycles * roofline.peak_bytes),
                    "compute_utilisation": flops / (cycles * roofline.peak_flops)}
            for name in WORK_COLUMNS:
                iterations[name] = work[name]
        times = self.times[:, :known]
        return ReplayResult(
            first_scheduled=times[kr.T_FIRST_SCHEDULED].copy(), first_token=times[kr.T_FIRST_TOKEN].copy(),
            finish=times[kr.T_FINISH].copy(), preemptions=self.req[kr.R_PREEMPTIONS, :known].copy(),
            itl=self.gaps[:int(st[kr.S_GAPS])].copy(), iterations=iterations,
            max_blocks_used=int(blocks.max(initial=0)))


#: why the last compiled replay on mapped layers handed its run to the Python loop (a table it could not fill)
_fallback_reason = [None]


def _note(params, steps_i, st, kr) -> None:
    """On mapped layers, the run's buckets in the provider's ``layer_use`` (summary.json ``layers``)."""
    if params.get("mapped") is not None and not params.get("no_notes"):
        from stepsim.serve.replay_mapped import note_buckets

        note_buckets(params, steps_i, int(st[kr.S_STEPS]), kr)


def _stopped(stop_i, st, clock, steps_i, steps_f, params, kr) -> None:
    """Raise :class:`~stepsim.serve.replay_stop.ReplayStopped` for a loop that returned STOPPED (the metric as the
    reference names it, the largest utilisation of the steps made as its ``StepWork`` computes it)."""
    from stepsim.serve.replay_stop import ReplayStopped

    metric = next(name for name, miss, allow in kr.SP_METRICS if stop_i[miss] > stop_i[allow])
    n = int(st[kr.S_STEPS])
    util = 0.0
    if params["cycles"] and n:
        roofline = params["roofline"]
        cycles = steps_i[kr.I_CYCLES, :n]
        util = float(max(np.max(steps_i[kr.I_HBM, :n] / (cycles * roofline.peak_bytes)),
                         np.max(steps_i[kr.I_FLOPS, :n] / (cycles * roofline.peak_flops))))
    raise ReplayStopped(metric, n, float(clock[kr.CLOCK_NOW]), util)


def _compile_notice() -> None:
    """The command line's "compiling once" line before the replay kernel's first compilation
    (:func:`stepsim.base.compile_notice.say_kernels_once`)."""
    from stepsim.base.compile_notice import say_kernels_once

    say_kernels_once("serving replay", _cached, "about 30 s")


def _cached() -> bool:
    """Whether numba's disk cache holds the replay kernel: its index beside the sources (``__pycache__``) or
    under ``NUMBA_CACHE_DIR`` (as :func:`stepsim.kernels.jit.kernels_cached` looks for the engine's)."""
    import os
    from pathlib import Path

    import stepsim.kernels as kernels

    pattern = "serve_replay.replay_loop-*.nbi"
    if any((Path(kernels.__file__).parent / "__pycache__").glob(pattern)):
        return True
    cache_dir = os.environ.get("NUMBA_CACHE_DIR")
    return bool(cache_dir) and any(Path(cache_dir).rglob(pattern))


def warm() -> None:
    """Compile (or load) the replay kernel: one request replayed at a constant step (``stepsim cache warm``). The
    fast model's steps use the same specialization (every argument has the same type)."""
    from stepsim.serve.kv_cache import kv_capacity
    from stepsim.serve.scheduler import SchedulerConfig

    capacity = kv_capacity(64 * 16, 0, 1, 16)
    done = compiled_replay(np.zeros(1), np.array([3]), np.array([2]),
                           Scheduler(SchedulerConfig.make("vllm"), capacity, 512), ConstantLatency(0.5))
    if done is None:
        from stepsim.base.errors import SimulationError

        raise SimulationError("the compiled replay refused its warm-up run (stepsim bug)")
