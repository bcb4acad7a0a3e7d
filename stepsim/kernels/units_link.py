"""The link unit: one directed link between two chips, shared by every transfer routed over it (docs/system.md).

A link has ``n`` inputs and ``n`` outputs; transfer k enters on input k and leaves on output k. Timing
(bandwidth B bytes/cycle, latency alpha cycles, both >= 1):

* Credits. Output k's FIFO is transfer k's buffer at the receiving end, so the link sends an element of
  transfer k only when that FIFO has a free slot whose credit is back: transfer k is *ready* at
  ``max(head stamp, credit time of the slot its next element takes)``, and not at all while the FIFO is
  physically full. Transfers are independent (virtual channels): a full receiver never blocks the others, so
  a link cannot deadlock a graph by head-of-line blocking.
* Arbitration, first come first served. The link is time-sensitive while choosing (like EagerMerge, canonical
  rule 3): the engine calls it at ``T = max(clock, earliest ready time)``, when every element stamped <= T is in
  its channel and every slot that frees by T has (a consumer dequeues only at or after the time it woke up,
  which is later than T). Among the transfers ready by T it takes the head with the smallest stamp (ties: the
  lowest input).
* Serialization: an element of b bytes (``rows * cols * bytes``; a selector ``n_targets`` B, a scalar 8 B)
  occupies the link for ``ceil(b / B)`` cycles (busy), from T.
* Latency: it is sent on output k with requested stamp ``T + ceil(b / B) + alpha``, so it arrives alpha cycles
  after its last byte left (>= 1: the one-cycle hop into the receiving unit is the least). The link is free for
  the next element as soon as the last byte left: transfers pipeline over the wire, up to each output FIFO's
  depth in flight (its window; the graph layer sizes it to cover the link's bandwidth-delay product).
* Closing: a transfer ends on its own. When input k is observed closed and empty (at a decision time, like
  an arrival: the engine's event time includes it), output k closes at the link's clock; the link finishes when
  every input has. A link that waited for all its transfers would couple them: in a ring all-reduce a chip's
  last add waits for its received stream to close, and that stream shares links with later steps.

Phases: ``PH_CHOOSE`` (0: wait for a decision time, take the chosen head and serialize it) -> ``PH_DELIVER``
(1: send it on its output; its credit is already back) -> ``PH_CHOOSE``. Counters: fires = elements carried,
busy = serialization cycles, blocked-in = idle time, ``R_LINK_BYTES`` = bytes carried.
"""

from __future__ import annotations

from stepsim.kernels import abi as A
from stepsim.kernels.channels import can_pop, can_push, close, closed_empty, head_stamp, next_free
from stepsim.kernels.hbm import E_TS_RESCAN
from stepsim.kernels.jit import kernel
from stepsim.kernels.units_common import block, emit_copy, spend, stash, take, tok_bytes, wait_input
from stepsim.kernels.units_routing import R_DECIDE, decision_time
from stepsim.kernels.values import drop

PH_CHOOSE = 0
PH_DELIVER = 1
R_LINK_CHOSEN = A.US_R0 + 0  # the transfer (input / output index) of the element in flight
R_LINK_BYTES = A.US_R0 + 1  # bytes carried so far (read by kernels.api for the unit tables)
# the link's cached view of its transfers (link_decision_time; per transfer: abi.CH_LK_* on its input channel)
R_LINK_LEAVES = A.US_R0 + 2  # its tree's leaves: the least power of two >= max(2, transfers) (_tree_node)
R_LINK_CLOSED = A.US_R0 + 3  # its inputs closed and empty
R_LINK_LAST_CLOSE = A.US_R0 + 4  # the latest close time of those (0: none)
# R_DECIDE (US_R0 + 8, shared with EagerMerge): the decision time the engine sets, -1 while none


@kernel
def link_serialize_cycles(nbytes, bandwidth):
    """reads/writes: nothing / returns: ceil(nbytes / bandwidth), the cycles b bytes occupy a link."""
    return (nbytes + bandwidth - 1) // bandwidth


@kernel
def link_event_time(u, up, us, in_ch, out_ch, chs, slots):
    """When may link u decide? (only while choosing)

    reads: its inputs' heads and close times, its outputs' closed flags / writes: nothing / returns:
    max(clock, the earliest ready time of a transfer (head stamp and credit, see the module docstring) or close
    time of an input whose output is still open), or, when every input is closed and empty and every output
    closed, max(clock, last close time); NEVER while it must wait.
    """
    istart = up[u, A.UP_IN_START]
    ostart = up[u, A.UP_OUT_START]
    clock = us[u, A.US_CLOCK]
    best = A.NEVER
    all_closed = True
    last_close = clock
    for k in range(up[u, A.UP_N_IN]):
        c = in_ch[istart + k]
        best = min(best, _transfer_ready(chs, slots, c, out_ch[ostart + k]))
        if closed_empty(chs, c):
            last_close = max(last_close, chs[c, A.CH_CLOSE_TIME])
        else:
            all_closed = False
    return decision_time(clock, best, all_closed, last_close)


@kernel
def _transfer_ready(chs, slots, c, o):
    """The ready time of the transfer from input ``c`` to output ``o`` (cycles): its head's stamp and its
    receiver's free slot's credit, the later, when it has a head and a free slot; its close time when it is closed
    and empty and its output still open (the Link passes the end on then); else NEVER.
    reads: chs[c], chs[o], their head and tail slots / writes: nothing."""
    if can_pop(chs, c):
        if can_push(chs, o):
            return max(head_stamp(chs, slots, c), next_free(chs, slots, o))
        return A.NEVER
    if chs[c, A.CH_CLOSED] == 1 and chs[o, A.CH_CLOSED] == 0:
        return chs[c, A.CH_CLOSE_TIME]
    return A.NEVER


@kernel
def link_cache_init(up, in_ch, out_ch, chs, us):
    """Set up every Link's cached view of its transfers (:func:`link_decision_time`) in a fresh run state: each
    transfer's channels point at each other and every transfer is on its Link's list of changed ones.

    reads: the program / writes: chs[:, CH_LK_*], the Links' R_LINK_* registers / returns: nothing.
    """
    for c in range(chs.shape[0]):
        chs[c, A.CH_LK_NEXT] = -2
        chs[c, A.CH_LK_OUT] = -1
        chs[c, A.CH_LK_IN] = -1
    for u in range(up.shape[0]):
        if up[u, A.UP_OPCODE] != A.OP_LINK or up[u, A.UP_N_IN] == 0:
            continue
        istart = up[u, A.UP_IN_START]
        ostart = up[u, A.UP_OUT_START]
        first = in_ch[istart]
        changed = -1
        for k in range(up[u, A.UP_N_IN] - 1, -1, -1):
            c = in_ch[istart + k]
            o = out_ch[ostart + k]
            chs[c, A.CH_LK_OUT] = o
            chs[o, A.CH_LK_IN] = c
            chs[c, A.CH_LK_FIRST] = first
            chs[c, A.CH_LK_K] = k
            chs[c, A.CH_LK_VAL] = A.NEVER
            chs[c, A.CH_LK_NEXT] = changed
            changed = c
        chs[first, A.CH_LK_HEAD] = changed
        us[u, R_LINK_CLOSED] = 0
        us[u, R_LINK_LAST_CLOSE] = 0
        leaves = 2
        while leaves < up[u, A.UP_N_IN]:
            leaves *= 2
        us[u, R_LINK_LEAVES] = leaves
        for i in range(1, leaves):
            _set_tree_node(up, in_ch, chs, u, i, A.NEVER)


@kernel
def _tree_node(up, in_ch, chs, u, leaves, i):
    """Node ``i`` of Link u's tree of its transfers' cached ready times (heap numbering: node 1 the root, node
    ``leaves + k`` transfer k's CH_LK_VAL, NEVER past the last transfer; an internal node the least of its two
    children), kept on the Link's input rows (:data:`stepsim.kernels.abi.CH_LK_TREE_LO` / ``_HI``: ``leaves`` < 2n
    for n transfers, so every internal node has a row). reads: chs / returns: the node's value."""
    n = up[u, A.UP_N_IN]
    istart = up[u, A.UP_IN_START]
    if i >= leaves:
        return chs[in_ch[istart + i - leaves], A.CH_LK_VAL] if i - leaves < n else A.NEVER
    if i < n:
        return chs[in_ch[istart + i], A.CH_LK_TREE_LO]
    return chs[in_ch[istart + i - n], A.CH_LK_TREE_HI]


@kernel
def _set_tree_node(up, in_ch, chs, u, i, value):
    """Set internal node ``i`` of Link u's tree (:func:`_tree_node`). writes: chs / returns: nothing."""
    n = up[u, A.UP_N_IN]
    istart = up[u, A.UP_IN_START]
    if i < n:
        chs[in_ch[istart + i], A.CH_LK_TREE_LO] = value
    else:
        chs[in_ch[istart + i - n], A.CH_LK_TREE_HI] = value


@kernel
def _tree_update(up, in_ch, chs, u, leaves, k):
    """Transfer k's CH_LK_VAL changed: its ancestors made the least of their children again, up to the first that
    stays as it was (those above it stay too). writes: chs / returns: nothing."""
    i = (leaves + k) >> 1
    while i >= 1:
        value = min(_tree_node(up, in_ch, chs, u, leaves, 2 * i), _tree_node(up, in_ch, chs, u, leaves, 2 * i + 1))
        if value == _tree_node(up, in_ch, chs, u, leaves, i):
            return
        _set_tree_node(up, in_ch, chs, u, i, value)
        i >>= 1


@kernel
def _refresh(u, up, us, in_ch, chs, slots):
    """Bring Link u's cached view up to date (:func:`link_decision_time`): look again at the transfers on its list
    of changed ones, count those newly closed and empty, and keep each one's ready time in the tree
    (:func:`_tree_update`), whose root is the least.

    reads: the listed transfers' channels / writes: their chs[:, CH_LK_*], us[u, R_LINK_*] / returns: nothing.
    """
    first = in_ch[up[u, A.UP_IN_START]]
    leaves = us[u, R_LINK_LEAVES]
    c = chs[first, A.CH_LK_HEAD]
    chs[first, A.CH_LK_HEAD] = -1
    while c >= 0:
        after = chs[c, A.CH_LK_NEXT]
        chs[c, A.CH_LK_NEXT] = -2
        new = _transfer_ready(chs, slots, c, chs[c, A.CH_LK_OUT])
        if chs[c, A.CH_LK_CLOSED] == 0 and closed_empty(chs, c):  # closed and empty stays so: counted once
            chs[c, A.CH_LK_CLOSED] = 1
            us[u, R_LINK_CLOSED] += 1
            us[u, R_LINK_LAST_CLOSE] = max(us[u, R_LINK_LAST_CLOSE], chs[c, A.CH_CLOSE_TIME])
        if new != chs[c, A.CH_LK_VAL]:
            chs[c, A.CH_LK_VAL] = new
            _tree_update(up, in_ch, chs, u, leaves, chs[c, A.CH_LK_K])
        c = after


@kernel
def link_decision_time(u, up, us, in_ch, chs, slots):
    """:func:`link_event_time` from the Link's cached view: only the transfers on its list of changed ones are
    looked at again (a transfer's terms read its two channels alone, and every push, pop and close of one of them
    lists it: :func:`stepsim.kernels.channels.link_transfer_changed`); the least ready time is the root of a tree
    over the cached values (:func:`_tree_node`). Why: a 16-chip all-to-all's links carry
    hundreds of transfers, and looking at every one at every decision was over half of an expert-parallel layer's
    engine time. The same value, always: a run with ``reuse_scans=False`` looks at every transfer, and
    tests/reference/test_scan_reuse.py compares the two on random multi-chip programs.

    reads: the changed transfers' channels, the cached values / writes: chs[:, CH_LK_*] of those, us[u, R_LINK_*] /
    returns: the decision time.
    """
    clock = us[u, A.US_CLOCK]
    n_in = up[u, A.UP_N_IN]
    if n_in == 0:
        return decision_time(clock, A.NEVER, True, clock)
    _refresh(u, up, us, in_ch, chs, slots)
    return decision_time(clock, _tree_node(up, in_ch, chs, u, us[u, R_LINK_LEAVES], 1), us[u, R_LINK_CLOSED] == n_in,
                         max(clock, us[u, R_LINK_LAST_CLOSE]))


@kernel
def _choose_scan(u, up, us, in_ch, out_ch, chs, slots, T):
    """Link u's choice at its decision time T from every transfer: among those ready by T (head arrived, a free
    slot whose credit is back by T) the head with the smallest stamp (ties: the lowest input); each transfer that
    closed by T passes its closure on to its output (the engine wakes the consumer after this step).

    reads: every input and output / writes: the closed transfers' outputs / returns: (the chosen input or -1, the
    transfers still open).
    """
    istart = up[u, A.UP_IN_START]
    ostart = up[u, A.UP_OUT_START]
    chosen = -1
    best = A.NEVER
    open_transfers = 0
    for k in range(up[u, A.UP_N_IN]):
        c = in_ch[istart + k]
        o = out_ch[ostart + k]
        if can_pop(chs, c):
            t = head_stamp(chs, slots, c)
            if t < best and can_push(chs, o) and max(t, next_free(chs, slots, o)) <= T:
                best = t
                chosen = k
            open_transfers += 1
        elif chs[c, A.CH_CLOSED] == 1 and chs[c, A.CH_CLOSE_TIME] <= T:
            close(chs, o, us[u, A.US_CLOCK])
        else:
            open_transfers += 1
    return chosen, open_transfers


@kernel
def _choose_cached(u, up, us, in_ch, out_ch, chs, slots, T):
    """:func:`_choose_scan` from the cached view, brought up to date (:func:`_refresh`) and with every closed and
    empty transfer closed by T: a transfer is ready by T iff its cached ready time is (a closed one's is its close
    time while its output is open), and the transfers not open are the closed and empty ones. The ready ones are
    the tree's leaves <= T, visited by transfer, into the subtrees whose least is <= T only: a 16-chip
    all-to-all's Link carries hundreds of transfers, few of them ready at once (bench/README.md, session 55).

    reads: the tree, the ready transfers' inputs / writes: the ended transfers' outputs / returns: (the chosen input
    or -1, the transfers still open).
    """
    istart = up[u, A.UP_IN_START]
    ostart = up[u, A.UP_OUT_START]
    leaves = us[u, R_LINK_LEAVES]
    chosen = -1
    best = A.NEVER
    i = 1
    while i > 0:
        if _tree_node(up, in_ch, chs, u, leaves, i) <= T:
            if i < leaves:
                i *= 2  # its left child first
                continue
            k = i - leaves  # < n: a leaf past the last transfer holds NEVER, and T < NEVER
            c = in_ch[istart + k]
            if can_pop(chs, c):
                t = head_stamp(chs, slots, c)
                if t < best:
                    best = t
                    chosen = k
            else:  # transfer k ended: pass its closure on (the engine wakes the consumer after this step)
                close(chs, out_ch[ostart + k], us[u, A.US_CLOCK])
        while i & 1:  # the next subtree to the right: up past the right children, then across
            i >>= 1
        if i > 0:
            i += 1
    return chosen, up[u, A.UP_N_IN] - us[u, R_LINK_CLOSED]


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
            wait_input(us, u, T, -1, tl)
            if n_in > 0:
                _refresh(u, up, us, in_ch, chs, slots)
            if n_in > 0 and eng[E_TS_RESCAN] == 0 and us[u, R_LINK_LAST_CLOSE] <= T:
                chosen, open_transfers = _choose_cached(u, up, us, in_ch, out_ch, chs, slots, T)
            else:  # every transfer looked at (reuse_scans=False, or a transfer that closes after T)
                chosen, open_transfers = _choose_scan(u, up, us, in_ch, out_ch, chs, slots, T)
            if chosen < 0:
                if open_transfers == 0:
                    return A.STEP_DONE
                us[u, A.US_WAIT_KIND] = A.WAIT_TIME
                us[u, A.US_WAIT_CH] = -1
                return A.STEP_TIME
            c = in_ch[istart + chosen]
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
