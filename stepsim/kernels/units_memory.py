"""Off-chip memory operators and on-chip buffers (docs/timing_model.md §5, §7.6).

Off-chip ops keep one tile in flight: phase 0 registers the tile with the HBM (:func:`hbm.hbm_register`) and
blocks with ``WAIT_HBM``; the HBM sets the unit's clock to the tile's completion and wakes it (phase 2).

* OffChipLoad: tiles in view order, ``ENQ(out, now)`` after the last response; stop = view dims closed.
* DynOffChipLoad: DEQ ref, then the whole view; the closing tile gets ``ref stop + len(view)``.
* RandomOffChipLoad: DEQ raddr, one tile, emitted with the address's stop level.
* OffChipStore: PEEK the tile, n_req from the tile's own size, wait for the acks, then DEQ. Traffic is
  counted at the stored dtype's width when the program gives one (``PA_ELEM_BYTES``), else the tile's.
* RandomOffChipStore: PEEK waddr and wdata, one tile, ENQ ack, DEQ both.
* Resident OffChipLoad / OffChipStore (``PA_RESIDENT``, a tensor held in one chip's on-chip memory, as the
  inputs and outputs of a collective are): no HBM and no off-chip bytes; the load emits its tiles at its clock
  (the consumer pays the PMU read through read_from_mu), the store DEQs each tile at its arrival.
* Bufferize(b): DEQ; +1 cycle per element except the closing one (stop >= b); ENQ the buffer reference.
* Streamify: PEEK the buffer, replay ``prod(repeat) * n`` elements at 1/cycle, then DEQ the buffer.
* DynStreamify: PEEK the buffer; per ref element DEQ ref and replay; DEQ the buffer at ref stop >= r+1.

Buffers live in ``arena`` (rows of N_TOKEN words): each Bufferize owns a ring region; a buffer reference
token carries (count in TK_ROWS, rank b in TK_COLS, owner in TK_OFFSET, ring start in TK_PAYLOAD). The
consumer's DEQ of a reference releases its elements (``us[owner, R_FREED]``).
"""

from __future__ import annotations

from stepsim.kernels import abi as A
from stepsim.kernels import values as V
from stepsim.kernels.channels import can_push, head_row, pop
from stepsim.kernels.hbm import (
    E_BYTES_READ,
    E_BYTES_WRITTEN,
    E_STATUS,
    E_STATUS_ARG,
    N_ENG,
    hbm_register,
    n_requests,
)
from stepsim.kernels.jit import kernel
from stepsim.kernels.units_common import (
    await_input,
    block,
    consume,
    emit,
    emit_copy,
    look,
    spend,
    stop_from_shape,
    take,
)
from stepsim.kernels.values import drop

R_I = A.US_R0 + 0  # tile index within the view / element index
R_REFSTOP = A.US_R0 + 1
R_WPOS = A.US_R0 + 2  # bufferize: ring write position (absolute)
R_BSTART = A.US_R0 + 3  # bufferize: ring position of the current buffer's first element
R_FREED = A.US_R0 + 4  # bufferize: ring position up to which elements were released
R_J = A.US_R0 + 5  # streamify: emitted count
R_TOTAL = A.US_R0 + 6
R_ADDR = A.US_R0 + 7  # random load: the tile address (functional mode)

TILE_FLAGS = A.KIND_TILE | A.FLAG_MU


@kernel
def _start_tile(u, up, us, eng, hq, hw, rows, cols, nbytes, traffic_bytes, is_write):
    """Register one tile with the HBM: ``nbytes`` per element set the request count (timing), ``traffic_bytes``
    per element are counted as off-chip traffic (they differ only for stores of mock-bf16 fp32 tiles).

    reads: hw / writes: us[u], eng byte counters / returns: STEP_BLOCKED.
    """
    nreq = n_requests(rows, cols, nbytes, hw[A.HW_ADDR_OFFSET])
    if is_write:
        eng[E_BYTES_WRITTEN] += rows * cols * traffic_bytes
    else:
        eng[E_BYTES_READ] += rows * cols * traffic_bytes
    par = up[u, A.UP_A0 + A.PA_PAR_DISPATCH]
    h = up[u, A.UP_CHIP]  # the chip's HBM: its queue rows and its segment of the engine scalars
    if not hbm_register(u, up, us, eng[h * N_ENG:(h + 1) * N_ENG], hq[h], us[u, A.US_CLOCK], nreq, par):
        eng[E_STATUS] = A.ST_CAUSALITY
        eng[E_STATUS_ARG] = u
    us[u, A.US_PHASE] = 1
    return A.STEP_BLOCKED


@kernel
def _load_values(u, t, rows, cols, fv, fi):
    """Functional mode: a fresh block holding tile t of unit u's tensor. returns: its handle."""
    h = V.alloc(fi, rows * cols, u)
    V.copy_tile(fv, fi, u, t, h, rows, cols, False)
    return h


@kernel
def _store_values(u, t, src, row, fv, fi):
    """Functional mode: write the tile token at ``src[row]`` as tile t of unit u's tensor."""
    c = A.SL_TOKEN
    V.copy_tile(fv, fi, u, t, V.tile_handle(src, row, c), src[row, c + A.TK_ROWS], src[row, c + A.TK_COLS], True)


@kernel
def step_offchip_load(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                      hq, fv, fi, tl):
    """reads: view shape / writes: tile output, HBM registration, us[u] / returns: DONE after the last tile."""
    out = out_ch[up[u, A.UP_OUT_START]]
    n_tiles = up[u, A.UP_A0 + A.PA_N_TILES]
    rows = up[u, A.UP_A0 + A.PA_TILE_ROWS]
    cols = up[u, A.UP_A0 + A.PA_TILE_COLS]
    nb = up[u, A.UP_A0 + A.PA_ELEM_BYTES]
    voff = up[u, A.UP_A0 + A.PA_VIEW_OFF]
    vlen = up[u, A.UP_A0 + A.PA_VIEW_LEN]
    is_dyn = up[u, A.UP_OPCODE] == A.OP_DYN_OFFCHIP_LOAD
    while True:
        ph = us[u, A.US_PHASE]
        if ph == 0:
            if is_dyn:
                ref = in_ch[up[u, A.UP_IN_START]]
                if us[u, R_I] == 0 or us[u, R_I] == n_tiles:
                    got = await_input(us, u, chs, ref, tl)
                    if got != A.STEP_READY:
                        return got
                    row = consume(us, u, chs, slots, ref, fi, tl)
                    us[u, R_REFSTOP] = slots[row, A.SL_TOKEN + A.TK_STOP]
                    us[u, R_I] = 0
            elif us[u, R_I] == n_tiles:
                return A.STEP_DONE
            if up[u, A.UP_A0 + A.PA_RESIDENT]:  # already on chip: no HBM round trip
                us[u, A.US_PHASE] = 2
                continue
            return _start_tile(u, up, us, eng, hq, hw, rows, cols, nb, nb, False)
        elif ph == 1:
            if us[u, A.US_WAIT_KIND] == A.WAIT_HBM:
                return A.STEP_BLOCKED
            us[u, A.US_PHASE] = 2
        else:
            if not can_push(chs, out):
                return block(us, u, out, A.WAIT_FULL)
            i = us[u, R_I]
            stop = stop_from_shape(payload, voff, vlen, i)
            if is_dyn and i == n_tiles - 1:
                stop += us[u, R_REFSTOP]
            value = -1
            if fi is not None:
                value = _load_values(u, V.view_tile(fi, payload, u, voff, vlen, i), rows, cols, fv, fi)
            emit(us, u, chs, slots, out, us[u, A.US_CLOCK], stop, TILE_FLAGS, nb, rows, cols, rows, value, tl)
            us[u, R_I] = i + 1
            us[u, A.US_FIRES] += 1
            us[u, A.US_PHASE] = 0


@kernel
def step_random_offchip_load(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng,
                             hfree, hq, fv, fi, tl):
    """reads: address input / writes: tile output, HBM registration, us[u] / returns: DONE when raddr closes."""
    c = in_ch[up[u, A.UP_IN_START]]
    out = out_ch[up[u, A.UP_OUT_START]]
    rows = up[u, A.UP_A0 + A.PA_TILE_ROWS]
    cols = up[u, A.UP_A0 + A.PA_TILE_COLS]
    nb = up[u, A.UP_A0 + A.PA_ELEM_BYTES]
    while True:
        ph = us[u, A.US_PHASE]
        if ph == 0:
            got = await_input(us, u, chs, c, tl)
            if got != A.STEP_READY:
                return got
            row = consume(us, u, chs, slots, c, fi, tl)
            us[u, R_REFSTOP] = slots[row, A.SL_TOKEN + A.TK_STOP]
            us[u, R_ADDR] = slots[row, A.SL_TOKEN + A.TK_PAYLOAD]
            return _start_tile(u, up, us, eng, hq, hw, rows, cols, nb, nb, False)
        elif ph == 1:
            if us[u, A.US_WAIT_KIND] == A.WAIT_HBM:
                return A.STEP_BLOCKED
            us[u, A.US_PHASE] = 2
        else:
            if not can_push(chs, out):
                return block(us, u, out, A.WAIT_FULL)
            value = -1
            if fi is not None:
                value = _load_values(u, us[u, R_ADDR], rows, cols, fv, fi)
            emit(us, u, chs, slots, out, us[u, A.US_CLOCK], us[u, R_REFSTOP], TILE_FLAGS, nb, rows, cols, rows,
                 value, tl)
            us[u, A.US_FIRES] += 1
            us[u, A.US_PHASE] = 0


@kernel
def step_offchip_store(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                       hq, fv, fi, tl):
    """reads: tile input / writes: HBM registration, input credits, us[u] / returns: DONE when the input closes."""
    c = in_ch[up[u, A.UP_IN_START]]
    while True:
        ph = us[u, A.US_PHASE]
        if ph == 0:
            got = await_input(us, u, chs, c, tl)
            if got != A.STEP_READY:
                return got
            row = look(us, u, chs, slots, c, tl)
            if up[u, A.UP_A0 + A.PA_RESIDENT]:  # into on-chip memory: no HBM round trip
                us[u, A.US_PHASE] = 1
                continue
            nb = slots[row, A.SL_TOKEN + A.TK_BYTES]
            traffic = up[u, A.UP_A0 + A.PA_ELEM_BYTES]
            return _start_tile(u, up, us, eng, hq, hw, slots[row, A.SL_TOKEN + A.TK_ROWS],
                               slots[row, A.SL_TOKEN + A.TK_COLS], nb, traffic if traffic > 0 else nb, True)
        elif ph == 1:
            if us[u, A.US_WAIT_KIND] == A.WAIT_HBM:
                return A.STEP_BLOCKED
            row = head_row(chs, c)
            if fi is not None:  # tile i of the stream is tile i of the tensor
                _store_values(u, us[u, A.US_FIRES], slots, row, fv, fi)
            pop(chs, slots, c, us[u, A.US_CLOCK], tl)
            drop(fi, slots, row, A.SL_TOKEN)
            us[u, A.US_FIRES] += 1
            us[u, A.US_PHASE] = 0


@kernel
def step_random_offchip_store(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng,
                              hfree, hq, fv, fi, tl):
    """reads: waddr and wdata inputs / writes: ack output, HBM registration, us[u] / returns: DONE on close."""
    ca = in_ch[up[u, A.UP_IN_START]]
    cd = in_ch[up[u, A.UP_IN_START] + 1]
    out = out_ch[up[u, A.UP_OUT_START]]
    rows = up[u, A.UP_A0 + A.PA_TILE_ROWS]
    cols = up[u, A.UP_A0 + A.PA_TILE_COLS]
    nb = up[u, A.UP_A0 + A.PA_ELEM_BYTES]
    on_waddr = up[u, A.UP_A0 + A.PA_ACK_ON_WADDR]
    while True:
        ph = us[u, A.US_PHASE]
        if ph == 0:
            got = await_input(us, u, chs, ca, tl)
            if got != A.STEP_READY:
                return got
            got = await_input(us, u, chs, cd, tl)
            if got != A.STEP_READY:
                return got
            look(us, u, chs, slots, ca, tl)
            look(us, u, chs, slots, cd, tl)
            return _start_tile(u, up, us, eng, hq, hw, rows, cols, nb, nb, True)
        elif ph == 1:
            if us[u, A.US_WAIT_KIND] == A.WAIT_HBM:
                return A.STEP_BLOCKED
            us[u, A.US_PHASE] = 2
        else:
            if not can_push(chs, out):
                return block(us, u, out, A.WAIT_FULL)
            src = head_row(chs, ca) if on_waddr else head_row(chs, cd)
            stop = slots[src, A.SL_TOKEN + A.TK_STOP]
            data = head_row(chs, cd)
            if fi is not None:
                _store_values(u, slots[head_row(chs, ca), A.SL_TOKEN + A.TK_PAYLOAD], slots, data, fv, fi)
            emit(us, u, chs, slots, out, us[u, A.US_CLOCK], stop, A.KIND_SCALAR, 1, 1, 1, 1, 1, tl)
            pop(chs, slots, ca, us[u, A.US_CLOCK], tl)
            pop(chs, slots, cd, us[u, A.US_CLOCK], tl)
            drop(fi, slots, data, A.SL_TOKEN)
            us[u, A.US_FIRES] += 1
            us[u, A.US_PHASE] = 0


# ---------------------------------------------------------------------------------------------- buffers
@kernel
def step_bufferize(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                   hq, fv, fi, tl):
    """reads: element input / writes: arena region, buffer output, us[u] / returns: DONE when the input closes."""
    c = in_ch[up[u, A.UP_IN_START]]
    out = out_ch[up[u, A.UP_OUT_START]]
    b = up[u, A.UP_A0 + A.PA_RANK]
    base = up[u, A.UP_A0 + A.PA_ARENA_BASE]
    size = up[u, A.UP_A0 + A.PA_ARENA_SIZE]
    while True:
        if us[u, A.US_PHASE] == 0:
            got = await_input(us, u, chs, c, tl)
            if got != A.STEP_READY:
                return got
            wpos = us[u, R_WPOS]
            if wpos - us[u, R_FREED] >= size:
                eng[E_STATUS] = A.ST_ARENA_FULL
                eng[E_STATUS_ARG] = u
                return block(us, u, c, A.WAIT_EMPTY)
            row = take(us, u, chs, slots, c, tl)
            arow = base + wpos % size
            for k in range(A.N_TOKEN):
                arena[arow, k] = slots[row, A.SL_TOKEN + k]
            s = slots[row, A.SL_TOKEN + A.TK_STOP]
            us[u, R_WPOS] = wpos + 1
            us[u, A.US_FIRES] += 1
            if s < b:
                spend(us, u, 1, tl)
                continue
            arena[arow, A.TK_STOP] = b
            us[u, A.US_TOK_A + A.TK_STOP] = s - b
            us[u, A.US_PHASE] = 1
        if not can_push(chs, out):
            return block(us, u, out, A.WAIT_FULL)
        start = us[u, R_BSTART]
        emit(us, u, chs, slots, out, us[u, A.US_CLOCK], us[u, A.US_TOK_A + A.TK_STOP], A.KIND_BUFFER, 0,
             us[u, R_WPOS] - start, b, u, start, tl)
        us[u, R_BSTART] = us[u, R_WPOS]
        us[u, A.US_PHASE] = 0


@kernel
def _release_buffer(up, us, slots, row, arena, fi):
    """The consumer dequeued a buffer reference: release its arena elements (and, functional, their values).

    reads: the reference token / writes: the owner's freed position / returns: nothing.
    """
    owner = slots[row, A.SL_TOKEN + A.TK_OFFSET]
    start = slots[row, A.SL_TOKEN + A.TK_PAYLOAD]
    count = slots[row, A.SL_TOKEN + A.TK_ROWS]
    if fi is not None:
        abase = up[owner, A.UP_A0 + A.PA_ARENA_BASE]
        asize = up[owner, A.UP_A0 + A.PA_ARENA_SIZE]
        for j in range(count):
            drop(fi, arena, abase + (start + j) % asize, 0)
    us[owner, R_FREED] = max(us[owner, R_FREED], start + count)


@kernel
def _buffer_stop(arena, arow, b, closing_extra):
    """Stop of a replayed element: inner levels kept; the buffer-closing element gets b + closing_extra."""
    s = arena[arow, A.TK_STOP]
    if s >= b:
        return b + closing_extra
    return s


@kernel
def step_streamify(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                   hq, fv, fi, tl):
    """reads: buffer references, arena / writes: element output, us[u] / returns: DONE when the input closes."""
    c = in_ch[up[u, A.UP_IN_START]]
    out = out_ch[up[u, A.UP_OUT_START]]
    roff = up[u, A.UP_A0 + A.PA_REPEAT_OFF]
    rlen = up[u, A.UP_A0 + A.PA_REPEAT_LEN]
    nrep = up[u, A.UP_A0 + A.PA_REPEAT_PROD]
    while True:
        got = await_input(us, u, chs, c, tl)
        if got != A.STEP_READY:
            return got
        row = look(us, u, chs, slots, c, tl)
        count = slots[row, A.SL_TOKEN + A.TK_ROWS]
        b = slots[row, A.SL_TOKEN + A.TK_COLS]
        owner = slots[row, A.SL_TOKEN + A.TK_OFFSET]
        start = slots[row, A.SL_TOKEN + A.TK_PAYLOAD]
        bstop = slots[row, A.SL_TOKEN + A.TK_STOP]
        abase = up[owner, A.UP_A0 + A.PA_ARENA_BASE]
        asize = up[owner, A.UP_A0 + A.PA_ARENA_SIZE]
        total = count * nrep
        while us[u, R_J] < total:
            if not can_push(chs, out):
                return block(us, u, out, A.WAIT_FULL)
            j = us[u, R_J]
            rep = j // count
            arow = abase + (start + j % count) % asize
            extra = stop_from_shape(payload, roff, rlen, rep) if rlen > 0 else 0
            if extra == rlen:
                extra += bstop
            emit_copy(us, u, chs, slots, out, us[u, A.US_CLOCK], arena, arow, 0, _buffer_stop(arena, arow, b, extra),
                      fi, tl)
            spend(us, u, 1, tl)
            us[u, R_J] = j + 1
        pop(chs, slots, c, us[u, A.US_CLOCK], tl)
        _release_buffer(up, us, slots, row, arena, fi)
        us[u, R_J] = 0
        us[u, A.US_FIRES] += 1


@kernel
def step_dyn_streamify(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                       hq, fv, fi, tl):
    """reads: buffer references, ref input, arena / writes: element output, us[u] / returns: DONE on close."""
    c = in_ch[up[u, A.UP_IN_START]]
    ref = in_ch[up[u, A.UP_IN_START] + 1]
    out = out_ch[up[u, A.UP_OUT_START]]
    repeat_rank = up[u, A.UP_A0 + A.PA_REPEAT_RANK]
    while True:
        got = await_input(us, u, chs, c, tl)
        if got != A.STEP_READY:
            return got
        row = look(us, u, chs, slots, c, tl)
        if us[u, A.US_PHASE] == 0:
            got = await_input(us, u, chs, ref, tl)
            if got != A.STEP_READY:
                return got
            rrow = consume(us, u, chs, slots, ref, fi, tl)
            us[u, R_REFSTOP] = slots[rrow, A.SL_TOKEN + A.TK_STOP]
            us[u, R_J] = 0
            us[u, A.US_PHASE] = 1
        count = slots[row, A.SL_TOKEN + A.TK_ROWS]
        b = slots[row, A.SL_TOKEN + A.TK_COLS]
        owner = slots[row, A.SL_TOKEN + A.TK_OFFSET]
        start = slots[row, A.SL_TOKEN + A.TK_PAYLOAD]
        abase = up[owner, A.UP_A0 + A.PA_ARENA_BASE]
        asize = up[owner, A.UP_A0 + A.PA_ARENA_SIZE]
        while us[u, R_J] < count:
            if not can_push(chs, out):
                return block(us, u, out, A.WAIT_FULL)
            j = us[u, R_J]
            arow = abase + (start + j) % asize
            emit_copy(us, u, chs, slots, out, us[u, A.US_CLOCK], arena, arow, 0,
                      _buffer_stop(arena, arow, b, us[u, R_REFSTOP]), fi, tl)
            spend(us, u, 1, tl)
            us[u, R_J] = j + 1
        us[u, A.US_FIRES] += 1
        us[u, A.US_PHASE] = 0
        if us[u, R_REFSTOP] >= repeat_rank + 1:
            pop(chs, slots, c, us[u, A.US_CLOCK], tl)
            _release_buffer(up, us, slots, row, arena, fi)
