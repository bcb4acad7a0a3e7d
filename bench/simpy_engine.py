"""A SimPy model of a stepsim program, as the "off-the-shelf discrete-event simulator" baseline of the benchmarks.

It reads the graph of a built :class:`stepsim.kernels.program.Program` (units, channels, capacities, latencies), so it
runs exactly the graphs the numba and reference engines run, and models each unit as one SimPy process:

* a channel is a ``simpy.Store`` (unbounded; it only carries ``(stamp, value)``) plus a ``simpy.Container`` of
  ``capacity`` credits. A send first takes a credit (blocking while the FIFO is full, so the sender's time moves to
  the credit's return), then puts the element stamped ``max(requested, now + latency)``; the receiver waits until
  ``now >= stamp``. A dequeue at time ``d`` returns its credit at ``d + credit_latency`` (a delayed
  ``Container.put``). Keeping occupancy in the credits rather than in the Store is what lets a Map *peek* (hold
  the slot) until its output was accepted, as STEP_TIMING §6 requires;
* the end of a stream is a ``CLOSED`` element that takes no credit and is stamped with the producer's final
  time (STEP_TIMING §1.3 canonical rule: a closure is observed at the producer's final clock);
* reported cycles = the largest final time over the units, like the engines (no memory ops here).

Only the operators of the throughput benchmarks are modelled: MetadataGen, unary and binary Map, Broadcast and
Sink. Where it differs from the engines:

* SimPy has one global clock and an event heap; the engines give every unit its own clock and only synchronise on
  channel stamps. For these purely blocking (timestamp-deterministic) operators both orders give the same times,
  so the cycle counts match the engines exactly (asserted by the benchmark), but this model would need extra
  care for the time-sensitive units (EagerMerge, the HBM), which it does not implement;
* a Map's cost is a constant ``map_cycles`` per element (1 cycle: ``max(L, F, W)`` of a u64 scalar at the
  benchmark's compute bandwidth) instead of the cost model evaluated on each tile;
* values are passed through unchanged (Maps do not compute), and stop levels are not tracked (the benchmark
  streams are flat), so a stop-level mismatch of a binary Map is not detected; a close on only one of its inputs
  is.
"""

from __future__ import annotations

from dataclasses import dataclass

import simpy

from stepsim.kernels import abi as A

#: end-of-stream marker (carried like an element but takes no credit)
CLOSED = object()

#: own cycles of a Map per element in the benchmark graphs (u64 scalars; see the module docstring)
MAP_CYCLES = 1


@dataclass(frozen=True)
class SimpyResult:
    """Outcome of one SimPy run: ``cycles`` (max final time over units) and ``fires`` (as the engines count)."""

    cycles: int
    fires: int


class _Channel:
    __slots__ = ("credit_latency", "credits", "env", "items", "latency")

    def __init__(self, env: simpy.Environment, capacity: int, latency: int, credit_latency: int):
        self.env = env
        self.items = simpy.Store(env)
        self.credits = simpy.Container(env, capacity=capacity, init=capacity)
        self.latency = latency
        self.credit_latency = credit_latency

    def put(self, value, requested: int) -> None:
        """Enqueue after a credit was taken: the element lands at ``max(requested, now + latency)``."""
        self.items.put((max(requested, self.env.now + self.latency), value))

    def close(self) -> None:
        """The producer finished: the close is observed at its final time."""
        self.items.put((self.env.now, CLOSED))

    def release(self) -> None:
        """Dequeue at ``now``: the slot's credit is back ``credit_latency`` cycles later."""
        if self.credit_latency:
            self.env.timeout(self.credit_latency).callbacks.append(lambda _event: self.credits.put(1))
        else:
            self.credits.put(1)


class _Model:
    def __init__(self, program, map_cycles: int):
        self.env = simpy.Environment()
        self.map_cycles = map_cycles
        self.channels = [_Channel(self.env, int(program.ch_capacity[c]), int(program.ch_latency[c]),
                                  int(program.ch_credit_latency[c])) for c in range(program.n_channels)]
        self.final = [0] * program.n_units
        self.fires = [0] * program.n_units
        self.done = [False] * program.n_units
        for u in range(program.n_units):
            ins = [self.channels[c] for c in program.inputs(u)]
            outs = [self.channels[c] for c in program.outputs(u)]
            op = program.opcode(u)
            if op == A.OP_METADATA_GEN:
                proc = self._metadata_gen(u, outs[0], int(program.unit_params[u, A.UP_A0 + A.PA_N_ELEMS]))
            elif op == A.OP_MAP and len(ins) == 1:
                proc = self._unary_map(u, ins[0], outs[0])
            elif op == A.OP_MAP:
                proc = self._binary_map(u, ins[0], ins[1], outs[0], program.unit_names[u])
            elif op == A.OP_BROADCAST:
                proc = self._broadcast(u, ins[0], outs)
            elif op == A.OP_SINK:
                proc = self._sink(u, ins[0])
            else:
                raise NotImplementedError(f"{program.unit_names[u]}: the SimPy model has no {program.opcode_name(u)}")
            self.env.process(proc)

    def _recv(self, ch: _Channel):
        """Blocking receive: wait for an element, then for its stamp; returns the value (or ``CLOSED``)."""
        stamp, value = yield ch.items.get()
        if stamp > self.env.now:
            yield self.env.timeout(stamp - self.env.now)
        return value

    def _finish(self, u: int, outs) -> None:
        self.final[u] = self.env.now
        self.done[u] = True
        for ch in outs:
            ch.close()

    # Each unit below follows the per-element steps of STEP_TIMING §6-§7.

    def _metadata_gen(self, u, out: _Channel, n: int):
        for i in range(n):
            yield out.credits.get(1)
            out.put(i, requested=i)  # element i requested at stamp i: arrivals 1, 1, 2, 3, ...
            self.fires[u] += 1
        self._finish(u, [out])

    def _unary_map(self, u, inp: _Channel, out: _Channel):
        env, cost = self.env, self.map_cycles
        while True:
            value = yield from self._recv(inp)  # PEEK: the slot stays taken until the DEQ below
            if value is CLOSED:
                break
            if cost:
                yield env.timeout(cost)
            yield out.credits.get(1)
            out.put(value, env.now)
            inp.release()  # DEQ after the ENQ was accepted
            self.fires[u] += 1
        self._finish(u, [out])

    def _binary_map(self, u, in1: _Channel, in2: _Channel, out: _Channel, name: str):
        env, cost = self.env, self.map_cycles
        while True:
            a = yield from self._recv(in1)
            b = yield from self._recv(in2)
            if a is CLOSED or b is CLOSED:
                if a is not b:
                    raise RuntimeError(f"{name}: one input closed before the other")
                break
            if cost:
                yield env.timeout(cost)
            yield out.credits.get(1)
            out.put(a, env.now)
            in1.release()
            in2.release()
            self.fires[u] += 1
        self._finish(u, [out])

    def _broadcast(self, u, inp: _Channel, outs):
        env = self.env
        while True:
            value = yield from self._recv(inp)
            if value is CLOSED:
                break
            inp.release()  # DEQ first: the input credit returns at once
            for ch in outs:  # the clock moves to the latest credit among the targets
                yield ch.credits.get(1)
            for ch in outs:
                ch.put(value, env.now)
            self.fires[u] += 1
        self._finish(u, outs)

    def _sink(self, u, inp: _Channel):
        env = self.env
        while True:
            value = yield from self._recv(inp)
            if value is CLOSED:
                break
            inp.release()
            yield env.timeout(1)
            self.fires[u] += 1
        self._finish(u, [])


def run(program, *, map_cycles: int = MAP_CYCLES) -> SimpyResult:
    """Simulate ``program`` (MetadataGen / Map / Broadcast / Sink only) with SimPy.

    Raises
    ------
    NotImplementedError
        The program uses an operator the model does not implement.
    RuntimeError
        The run ended with a unit still blocked (a deadlock), or a binary Map saw only one input close.
    """
    model = _Model(program, map_cycles)
    model.env.run()
    # the event heap ran dry: a unit that has not finished is blocked forever
    if not all(model.done):
        raise RuntimeError(f"SimPy model: deadlock ({model.done.count(False)} units blocked)")
    return SimpyResult(cycles=int(max(model.final, default=0)), fires=int(sum(model.fires)))
