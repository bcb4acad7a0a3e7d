"""A tiny program that touches every opcode (and both HBM paths), used to compile / warm the engine."""

from __future__ import annotations

import dataclasses

from stepsim.base.hardware import Hardware
from stepsim.kernels.abi import (
    MEMORY_READ_OPS,
    OP_OFFCHIP_STORE,
    OP_RANDOM_OFFCHIP_STORE,
    PA_TILE_COLS,
    PA_TILE_ROWS,
    UP_A0,
)


def warm_program(functional: bool = False):
    """Build a small program exercising every opcode. Returns a :class:`stepsim.kernels.program.Program`.

    With ``functional``, every memory operator gets a tensor of 16 x 16 of its tiles (4 x 4 tiles for the
    store) so the program also compiles the functional specialization; its values are meaningless.
    """
    from stepsim.kernels.program import ProgramBuilder, TensorRef

    b = ProgramBuilder(Hardware.preset("step-eval"))
    ch = b.add_channel
    # loads -> map / accum / map_accum / scan
    l1, l2, l3 = ch(), ch(), ch()
    b.offchip_load(out=l1, tile_rows=4, tile_cols=32, elem_bytes=2, view_shape=(2, 2))
    b.offchip_load(out=l2, tile_rows=4, tile_cols=32, elem_bytes=2, view_shape=(2, 2), par_dispatch=2)
    m, bc1, bc2, bc3 = ch(), ch(), ch(), ch()
    b.map(ins=[l1, l2], out=m, fn="add", compute_bw=64)
    b.broadcast(inp=m, outs=[bc1, bc2, bc3])
    a1, a2 = ch(), ch()
    b.accum(inp=bc1, out=a1, fn="add", init_rows=4, init_cols=32, init_elem_bytes=2, rank=1, write_back_mu=True)
    sc = ch()
    b.scan(inp=bc2, out=sc, fn="retile_row", init_rows=0, init_cols=32, init_elem_bytes=2, rank=1)
    b.sink(inp=sc)
    b.offchip_load(out=l3, tile_rows=4, tile_cols=32, elem_bytes=2, view_shape=(2, 2))
    b.map_accum(in1=bc3, in2=l3, out=a2, fn="matmul", fn_param=1, init_rows=0, init_cols=4, init_elem_bytes=2,
                rank=1)
    b.offchip_store(inp=a2)
    # shape ops
    f, p, po, r, rs, rp = ch(), ch(), ch(), ch(), ch(), ch()
    b.flatten(inp=a1, out=f, min_rank=0, max_rank=1)
    b.promote(inp=f, out=p, rank=0)
    b.promote(inp=p, out=po, rank=2, input_rank=1)
    b.reshape(inp=po, out=r, chunk=3, rank=0, pad_rows=1, pad_cols=32, pad_elem_bytes=2)
    b.row_streamify(inp=r, out=rs, split_rows=True, filter_padding=True)
    b.repeat_static(inp=rs, out=rp, count=2)
    buf, st = ch(), ch()
    b.bufferize(inp=rp, out=buf, rank=1)
    b.streamify(inp=buf, out=st, rank=1, repeat_factors=(2,))
    b.sink(inp=st)
    # selectors and routing
    s1, s2, parts = ch(), ch(), [ch(), ch()]
    b.select_gen(out=s1, targets_ptr=[0, 1, 3], targets_idx=[0, 0, 1], n_targets=2)
    l4 = ch()
    b.offchip_load(out=l4, tile_rows=2, tile_cols=32, elem_bytes=2, view_shape=(2,))
    b.partition(data=l4, sel=s1, outs=parts, rank=0, switch_cycles=[1, 1])
    merged, msel, lanes = ch(), ch(), [ch(), ch()]
    b.eager_merge(ins=parts, data_out=merged, sel_out=msel, rank=0)
    b.parallelize(inp=merged, outs=lanes, rank=0, switch_cycles=[1, 1])
    re = ch()
    b.reassemble(ins=lanes, sel=s2, out=re, rank=0, switch_cycles=[1, 1])
    b.select_gen(out=s2, targets_ptr=[0, 2, 3], targets_idx=[0, 1, 0], n_targets=2)
    b.sink(inp=re)
    b.sink(inp=msel)
    # generators, random memory, expand, dyn ops
    sel3, addr, rl = ch(), ch(), ch()
    b.select_gen(out=sel3, targets_ptr=[0, 1], targets_idx=[1], n_targets=2)
    b.expert_addr_gen(sel=sel3, out=addr, tiles_per_target=2, base=0)
    b.random_offchip_load(raddr=addr, out=rl, tile_rows=2, tile_cols=32, elem_bytes=2)
    idx, sl, sl_b1, sl_b2, sl_b3, cr, ft = ch(), ch(), ch(), ch(), ch(), ch(), ch()
    b.metadata_gen(out=idx, values=[1])
    b.metadata_gen(out=sl, values=[3])
    b.broadcast(inp=sl, outs=[sl_b1, sl_b2, sl_b3])
    b.cache_read_addr_gen(idx=idx, seq_len=sl_b1, out=cr, row_offset=8)
    b.filter_last_tile(seq_len=sl_b2, out=ft)
    b.sink(inp=ft)
    ex = ch()
    b.expand_ref(inp=sl_b3, ref=cr, out=ex, rank=1)
    wd, ack = ch(), ch()
    b.dyn_offchip_load(ref=ex, out=wd, tile_rows=2, tile_cols=32, elem_bytes=2, view_shape=(1,))
    b.random_offchip_store(waddr=rl, wdata=wd, ack=ack, tile_rows=2, tile_cols=32, elem_bytes=2)
    b.sink(inp=ack)
    # dyn streamify
    l5, buf2, ref2, ds = ch(), ch(), ch(), ch()
    b.offchip_load(out=l5, tile_rows=2, tile_cols=32, elem_bytes=2, view_shape=(1, 2))
    b.bufferize(inp=l5, out=buf2, rank=1)
    b.metadata_gen(out=ref2, values=[0, 0], shape=(2,))
    b.dyn_streamify(inp=buf2, ref=ref2, out=ds, repeat_rank=0, bufferized_rank=1)
    b.sink(inp=ds)
    program = b.build()
    if not functional:
        return program
    p = program.unit_params
    tensors = []
    for u in range(program.n_units):
        op = program.opcode(u)
        if op in MEMORY_READ_OPS or op == OP_RANDOM_OFFCHIP_STORE:
            rows, cols = int(p[u, UP_A0 + PA_TILE_ROWS]), int(p[u, UP_A0 + PA_TILE_COLS])
            tensors.append(TensorRef(f"t{u}", 16 * rows, 16 * cols, rows, cols))
        elif op == OP_OFFCHIP_STORE:
            tensors.append(TensorRef(f"t{u}", 16, 16, 4, 4))
        else:
            tensors.append(None)
    return dataclasses.replace(program, unit_tensors=tuple(tensors))
