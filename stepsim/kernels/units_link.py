"""The link unit: one directed link between two chips, shared by every transfer routed over it (docs/system.md).

A link has ``n`` inputs and ``n`` outputs; transfer k enters on input k and leaves on output k. Timing
(bandwidth B bytes/cycle, latency alpha cycles, both >= 1):

* The link is time-sensitive while choosing (like EagerMerge, canonical rule 3): the engine calls it with a
  decision time ``T = max(clock, smallest head stamp)``; every element stamped <= T is then in its channel.
  It takes the head with the smallest stamp (ties: lowest input index): first come, first served.
* Serialization: an element of b bytes (``rows * cols * bytes``; a selector ``n_targets`` B, a scalar 8 B)
  occupies the link for ``ceil(b / B)`` cycles (busy), from T.
* Latency: it is sent on output k with requested stamp ``T + ceil(b / B) + alpha``, so it arrives alpha cycles
  after its last byte left (alpha includes the on-chip hop into the receiving unit, hence >= 1). The link is
  free for the next element as soon as the last byte left: transfers pipeline over the wire. If output k is
  full, the link waits for the credit (blocked-out) and the element arrives ``max(requested, credit + 1)``:
  the output FIFO's depth is the link's window of elements in flight (credit-based flow control).

Phases: ``PH_CHOOSE`` (0: wait for a decision time, take the chosen head and serialize it) -> ``PH_DELIVER``
(1: send it on its output) -> ``PH_CHOOSE``. Counters: fires = elements carried, busy = serialization
cycles, ``R_LINK_BYTES`` = bytes carried.
"""

from __future__ import annotations

from stepsim.kernels import abi as A
from stepsim.kernels.channels import can_pop, can_push, head_stamp
from stepsim.kernels.jit import kernel
from stepsim.kernels.units_common import block, emit_copy, spend, stash, take, tok_bytes, wait_input
from stepsim.kernels.units_routing import R_DECIDE
from stepsim.kernels.values import drop

PH_CHOOSE = 0
PH_DELIVER = 1
R_LINK_CHOSEN = A.US_R0 + 0  # the transfer (input / output index) of the element in flight
R_LINK_BYTES = A.US_R0 + 1  # bytes carried so far (read by kernels.api for the unit tables)
# R_DECIDE (US_R0 + 8, shared with EagerMerge): the decision time the engine sets, -1 while none


@kernel
def link_serialize_cycles(nbytes, bandwidth):
    """reads/writes: nothing / returns: ceil(nbytes / bandwidth), the cycles b bytes occupy a link."""
    return (nbytes + bandwidth - 1) // bandwidth


@kernel
def step_link(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree, hq, fv, fi,
              tl):
    """reads: inputs, us[u, R_DECIDE] / writes: outputs, us[u] / returns: STEP_TIME while choosing without a
    decision time, STEP_BLOCKED on a full output, DONE when every input closed and drained."""
    istart = up[u, A.UP_IN_START]
    n_in = up[u, A.UP_N_IN]
    ostart = up[u, A.UP_OUT_START]
    bandwidth = up[u, A.UP_A0 + A.PA_LINK_BW]
    latency = up[u, A.UP_A0 + A.PA_LINK_LAT]
    while True:
        if us[u, A.US_PHASE] == PH_CHOOSE:
            T = us[u, R_DECIDE]
            if T < 0:
                us[u, A.US_WAIT_KIND] = A.WAIT_TIME
                us[u, A.US_WAIT_CH] = -1
                return A.STEP_TIME
            us[u, R_DECIDE] = -1
            chosen = -1
            best = A.NEVER
            for k in range(n_in):
                c = in_ch[istart + k]
                if can_pop(chs, c):
                    t = head_stamp(chs, slots, c)
                    if t <= T and t < best:
                        best = t
                        chosen = k
            if chosen < 0:  # every input closed and empty (the engine's event time says so)
                wait_input(us, u, T, -1, tl)
                return A.STEP_DONE
            c = in_ch[istart + chosen]
            wait_input(us, u, T, c, tl)
            row = take(us, u, chs, slots, c, tl)
            stash(us, u, A.US_TOK_A, slots, row, A.SL_TOKEN)
            nbytes = tok_bytes(slots, row, A.SL_TOKEN)
            us[u, R_LINK_CHOSEN] = chosen
            us[u, R_LINK_BYTES] += nbytes
            us[u, A.US_FIRES] += 1
            spend(us, u, link_serialize_cycles(nbytes, bandwidth), tl)
            us[u, A.US_PHASE] = PH_DELIVER
        o = out_ch[ostart + us[u, R_LINK_CHOSEN]]
        if not can_push(chs, o):
            return block(us, u, o, A.WAIT_FULL)
        emit_copy(us, u, chs, slots, o, us[u, A.US_CLOCK] + latency, us, u, A.US_TOK_A,
                  us[u, A.US_TOK_A + A.TK_STOP], fi, tl)
        drop(fi, us, u, A.US_TOK_A)
        us[u, A.US_PHASE] = PH_CHOOSE
