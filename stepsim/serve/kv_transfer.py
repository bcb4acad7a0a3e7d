"""A request's KV cache moved from the prefill pool to the decode pool over a system's links (disaggregated serving,
:mod:`stepsim.serve.disaggregated`), priced by the engine's link units.

Bytes. A request of ``p`` prompt tokens moves its KV cache as its pools hold it (:func:`kv_transfer_bytes`): every
full-attention (or MLA) layer's ``p`` tokens, a sliding-window layer's last ``min(p, window - 1)`` tokens (what vLLM's
sliding-window manager keeps), at the model's KV bytes per token of each kind (:func:`stepsim.serve.memory.kv_pools`).

Chips. The system's chips ``0 .. P-1`` are the prefill pool, ``P .. P+D-1`` the decode pool. The bytes move as
``max(P, D)`` transfers (:func:`transfer_pairs`): transfer k from prefill chip ``k mod P`` to decode chip
``P + k mod D``, so every prefill chip sends and every decode chip receives; the bytes are split over them evenly in
bf16 values (the remainder one value each on the first transfers), each one whole tile.

Time. :func:`engine_transfer_cycles` builds the transfers as a graph (a resident tensor on the sending chip, sent
through :class:`stepsim.graph.network.Network`, stored on the receiving chip) and runs it on the engine: the Link
units serialize ``ceil(b / B)`` cycles a hop and add the link latency (docs/system.md). When no two transfers share
a link the time has a closed form (:func:`closed_form_cycles`, equal to the engine: tests/serve/test_disaggregated.py):
a transfer of b bytes over a route of links ``l_1 .. l_h`` arrives after

    sum_i (latency_i + ceil(b / bandwidth_i)) - (h - 1)        cycles

(the first hop's latency counts the on-chip edge into the link; a relayed hop does not have one, so each further hop
adds ``latency - 1 + ceil(b / B)``: :mod:`stepsim.graph.network`), and the transfers together take the longest of
them. Where routes share a link, the engine decides (:class:`KVTransferPricer` memoises it by byte count).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stepsim.base.errors import ConfigError
from stepsim.serve.memory import DTYPE_BYTES, kv_pools


def kv_transfer_bytes(model, prompt: int) -> int:
    """Bytes of a ``prompt``-token request's KV cache (module docstring): per attention kind, bytes per token times
    the tokens its layers keep."""
    total = 0
    for pool in kv_pools(model):
        tokens = prompt if pool.window is None else min(prompt, pool.window - 1)
        total += pool.bytes_per_token * tokens
    return total


def transfer_pairs(prefill_chips: int, decode_chips: int) -> tuple[tuple[int, int], ...]:
    """``(source chip, destination chip)`` of the ``max(P, D)`` transfers of one request (module docstring).

    >>> transfer_pairs(2, 3)
    ((0, 2), (1, 3), (0, 4))
    """
    p, d = prefill_chips, decode_chips
    return tuple((k % p, p + k % d) for k in range(max(p, d)))


def split_values(nbytes: int, parts: int) -> list[int]:
    """``nbytes`` (a whole number of bf16 values) as ``parts`` value counts, the remainder one each on the first."""
    values = nbytes // DTYPE_BYTES
    return [values // parts + (1 if k < values % parts else 0) for k in range(parts)]


def closed_form_cycles(system, pairs, nbytes: int) -> int | None:
    """Cycles of moving ``nbytes`` as ``pairs``' transfers over ``system``'s idle links when no two routes share a
    link (module docstring); None when some do (the engine decides then)."""
    used: set[int] = set()
    worst = 0
    for (src, dst), values in zip(pairs, split_values(nbytes, len(pairs))):
        route = system.route(src, dst)
        if used.intersection(route):
            return None
        used.update(route)
        if not values:
            continue
        b = values * DTYPE_BYTES
        links = [system.links[i] for i in route]
        cycles = sum(link.latency + -(-b // link.bandwidth) for link in links) - (len(links) - 1)
        worst = max(worst, cycles)
    return worst


def engine_transfer_cycles(system, pairs, nbytes: int) -> int:
    """Cycles of moving ``nbytes`` as ``pairs``' transfers, simulated on the engine (module docstring)."""
    from stepsim.graph import Graph, ResidentLoad, ResidentStore, Tensor
    from stepsim.graph.network import Network
    from stepsim.simulation.simulate import simulate

    g = Graph("kv-transfer")
    net = Network(g, system)
    sent = False
    for k, ((src, dst), values) in enumerate(zip(pairs, split_values(nbytes, len(pairs)))):
        if not values:
            continue
        x = ResidentLoad(g, Tensor(f"kv{k}", (1, values), "bf16"), tile=(1, values), out_shape_tiled=(1,),
                         stride=(1,))
        x.chip = src
        store = ResidentStore(g, net.send(src, dst, x), tensor_name=f"kv{k}@chip{dst}")
        store.chip = dst
        sent = True
    if not sent:
        return 0
    net.finish()
    return int(simulate(g, system.hardware).cycles)


@dataclass
class KVTransferPricer:
    """Cycles and seconds of a request's KV transfer from the prefill pool (``prefill_chips``) to the decode pool
    (``decode_chips``) of ``system``: the closed form where it holds, else the engine, memoised by byte count."""

    system: object
    prefill_chips: int
    decode_chips: int
    pairs: tuple = field(init=False)
    simulated: int = field(init=False, default=0)
    _memo: dict = field(init=False, default_factory=dict, repr=False)

    def __post_init__(self):
        self.pairs = transfer_pairs(self.prefill_chips, self.decode_chips)

    def cycles(self, nbytes: int) -> int:
        """Cycles of moving ``nbytes`` (0 for none)."""
        if nbytes <= 0:
            return 0
        got = self._memo.get(nbytes)
        if got is None:
            got = closed_form_cycles(self.system, self.pairs, nbytes)
            if got is None:
                got = engine_transfer_cycles(self.system, self.pairs, nbytes)
                self.simulated += 1
            self._memo[nbytes] = got
        return got

    def seconds(self, nbytes: int) -> float:
        """Seconds of moving ``nbytes`` at the chips' clock."""
        return self.cycles(nbytes) / self.system.hardware.clock_hz

    def describe(self) -> dict:
        """The summary's description of the links between the pools."""
        return {"pairs": [list(p) for p in self.pairs], "engine_simulations": self.simulated,
                "closed_form": closed_form_cycles(self.system, self.pairs, DTYPE_BYTES * len(self.pairs)) is not None}


def check_split(text, system_chips: int | None) -> tuple[int, int]:
    """``--disaggregate P:D``: two integers >= 1 whose sum fits the system's chips; one line otherwise."""
    if isinstance(text, tuple) and len(text) == 2:
        parts = list(text)
    else:
        parts = str(text).split(":")
        try:
            parts = [int(x) for x in parts] if len(parts) == 2 else None
        except ValueError:
            parts = None
    if parts is None or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in parts):
        raise ConfigError(f"--disaggregate {text!r}: expected P:D, prefill chips and decode chips, each an integer "
                          ">= 1 (e.g. 2:2)")
    p, d = parts
    if system_chips is None:
        raise ConfigError(f"--disaggregate {p}:{d} moves the KV cache over a system's links: give --system "
                          f"(a preset or file of at least {p + d} chips)")
    if p + d > system_chips:
        raise ConfigError(f"--disaggregate {p}:{d}: {p + d} chips, but the system has {system_chips}")
    return p, d
