"""The micro scenarios S1-S13 of STEP_TIMING §9, built with ProgramBuilder (shared by the reference tests).

Each builder returns ``(program, ids)`` where ``ids`` maps readable names to unit / channel ids.
Common setup (§9): ``step-eval`` hardware (HBMConfig(64,32,2,2,1,14), PMU 64 B/cycle, depth 2), bf16 loads.
"""

from __future__ import annotations

from stepsim.base.hardware import Hardware
from stepsim.kernels.program import ProgramBuilder


def _b(**hw):
    return ProgramBuilder(Hardware.preset("step-eval", **hw))


def s1_single_big_tile():
    b = _b()
    x = b.add_channel(name="x")
    load = b.offchip_load(out=x, tile_rows=64, tile_cols=4096, elem_bytes=2, view_shape=(1,), name="load")
    sink = b.sink(inp=x, name="sink")
    return b.build(), dict(load=load, sink=sink, x=x)


def s2_map_chain(pmu_bw=64):
    b = _b(pmu_bw=pmu_bw)
    x, y = b.add_channel(name="x"), b.add_channel(name="y")
    load = b.offchip_load(out=x, tile_rows=64, tile_cols=64, elem_bytes=2, view_shape=(4,), name="load")
    m = b.map(ins=[x], out=y, fn="exp", compute_bw=1024, write_back_mu=False, name="exp")
    sink = b.sink(inp=y, name="sink")
    return b.build(), dict(load=load, map=m, sink=sink, x=x, y=y)


def s3_read_from_mu(map1_wb=True):
    b = _b()
    x, y, z = (b.add_channel(name=n) for n in "xyz")
    load = b.offchip_load(out=x, tile_rows=64, tile_cols=64, elem_bytes=2, view_shape=(4,), name="load")
    m1 = b.map(ins=[x], out=y, fn="exp", compute_bw=1024, write_back_mu=map1_wb, name="map1")
    m2 = b.map(ins=[y], out=z, fn="exp", compute_bw=1024, write_back_mu=False, name="map2")
    sink = b.sink(inp=z, name="sink")
    return b.build(), dict(load=load, map1=m1, map2=m2, sink=sink, z=z)


def s4_binary_map(compute_bw=4096):
    b = _b()
    a, c, y = b.add_channel(name="a"), b.add_channel(name="b"), b.add_channel(name="y")
    la = b.offchip_load(out=a, tile_rows=64, tile_cols=64, elem_bytes=2, view_shape=(1,), name="loadA")
    lb = b.offchip_load(out=c, tile_rows=64, tile_cols=64, elem_bytes=2, view_shape=(1,), name="loadB")
    m = b.map(ins=[a, c], out=y, fn="matmul", compute_bw=compute_bw, write_back_mu=False, name="matmul")
    sink = b.sink(inp=y, name="sink")
    return b.build(), dict(loadA=la, loadB=lb, map=m, sink=sink, a=a, b=c, y=y)


def s5_accum():
    b = _b()
    x, y = b.add_channel(name="x"), b.add_channel(name="y")
    load = b.offchip_load(out=x, tile_rows=64, tile_cols=64, elem_bytes=2, view_shape=(4,), name="load")
    acc = b.accum(inp=x, out=y, fn="add", init_rows=64, init_cols=64, init_elem_bytes=2, rank=1, compute_bw=1024,
                  write_back_mu=True, name="accum")
    sink = b.sink(inp=y, name="sink")
    return b.build(), dict(load=load, accum=acc, sink=sink, y=y)


def s6_eager_merge():
    b = _b()
    a, c, d, s = (b.add_channel(name=n) for n in ("a", "b", "data", "sel"))
    la = b.offchip_load(out=a, tile_rows=16, tile_cols=64, elem_bytes=2, view_shape=(1,), name="loadA")
    lb = b.offchip_load(out=c, tile_rows=32, tile_cols=64, elem_bytes=2, view_shape=(1,), name="loadB")
    em = b.eager_merge(ins=[a, c], data_out=d, sel_out=s, rank=1, name="merge")
    dsink = b.sink(inp=d, name="data_sink")
    ssink = b.sink(inp=s, name="sel_sink")
    return b.build(), dict(loadA=la, loadB=lb, merge=em, data_sink=dsink, sel_sink=ssink, data=d, sel=s)


def s7_partition():
    b = _b()
    s, x, o0, o1 = (b.add_channel(name=n) for n in ("sel", "x", "out0", "out1"))
    sg = b.select_gen(out=s, targets_ptr=[0, 1, 2, 3], targets_idx=[0, 1, 0], n_targets=2, name="selgen")
    load = b.offchip_load(out=x, tile_rows=64, tile_cols=64, elem_bytes=2, view_shape=(3,), name="load")
    part = b.partition(data=x, sel=s, outs=[o0, o1], rank=0, switch_cycles=[1, 1], write_back_mu=False,
                       name="partition")
    k0 = b.sink(inp=o0, name="sink0")
    k1 = b.sink(inp=o1, name="sink1")
    return b.build(), dict(selgen=sg, load=load, partition=part, sink0=k0, sink1=k1, out0=o0, out1=o1)


def s8_reassemble():
    b = _b()
    a, c, s, y = (b.add_channel(name=n) for n in ("a", "b", "sel", "y"))
    la = b.offchip_load(out=a, tile_rows=16, tile_cols=64, elem_bytes=2, view_shape=(1,), name="loadA")
    lb = b.offchip_load(out=c, tile_rows=32, tile_cols=64, elem_bytes=2, view_shape=(1,), name="loadB")
    sg = b.select_gen(out=s, targets_ptr=[0, 2], targets_idx=[0, 1], n_targets=2, name="selgen")
    ra = b.reassemble(ins=[a, c], sel=s, out=y, rank=0, switch_cycles=[1, 1], write_back_mu=False,
                      name="reassemble")
    sink = b.sink(inp=y, name="sink")
    return b.build(), dict(loadA=la, loadB=lb, selgen=sg, reassemble=ra, sink=sink, y=y)


def s9_bufferize_streamify():
    b = _b()
    x, buf, y = (b.add_channel(name=n) for n in ("x", "buf", "y"))
    load = b.offchip_load(out=x, tile_rows=64, tile_cols=64, elem_bytes=2, view_shape=(4,), name="load")
    bz = b.bufferize(inp=x, out=buf, rank=1, name="bufferize")
    st = b.streamify(inp=buf, out=y, rank=1, name="streamify")
    sink = b.sink(inp=y, name="sink")
    return b.build(), dict(load=load, bufferize=bz, streamify=st, sink=sink, buf=buf, y=y)


def s10_repeat_static(depth=1024):
    b = _b(channel_depth=depth)
    x, y = b.add_channel(name="x"), b.add_channel(name="y")
    load = b.offchip_load(out=x, tile_rows=64, tile_cols=64, elem_bytes=2, view_shape=(1,), name="load")
    rep = b.repeat_static(inp=x, out=y, count=4, name="repeat")
    sink = b.sink(inp=y, name="sink")
    return b.build(), dict(load=load, repeat=rep, sink=sink, y=y)


def s11_depth_bubble(depth=1):
    b = _b(channel_depth=depth)
    x, rows, y = (b.add_channel(name=n) for n in ("x", "rows", "y"))
    load = b.offchip_load(out=x, tile_rows=64, tile_cols=64, elem_bytes=2, view_shape=(1,), name="load")
    rs = b.row_streamify(inp=x, out=rows, split_rows=True, name="rows")
    m = b.map(ins=[rows], out=y, fn="exp", compute_bw=1024, write_back_mu=False, name="exp")
    sink = b.sink(inp=y, name="sink")
    return b.build(), dict(load=load, rows=rs, map=m, sink=sink, y=y)


def s12_hbm_queueing(rows=4, cols=64, par_dispatch=4, channels=8, elem_bytes=4):
    b = ProgramBuilder(Hardware.preset("step-hdl", hbm_channels=channels))
    x = b.add_channel(name="x")
    load = b.offchip_load(out=x, tile_rows=rows, tile_cols=cols, elem_bytes=elem_bytes, view_shape=(1,),
                          par_dispatch=par_dispatch, name="load")
    sink = b.sink(inp=x, name="sink")
    return b.build(), dict(load=load, sink=sink, x=x)


def s13_store_tail():
    b = _b()
    x, y = b.add_channel(name="x"), b.add_channel(name="y")
    load = b.offchip_load(out=x, tile_rows=64, tile_cols=64, elem_bytes=2, view_shape=(1,), name="load")
    m = b.map(ins=[x], out=y, fn="exp", compute_bw=1024, write_back_mu=False, name="exp")
    st = b.offchip_store(inp=y, name="store")
    return b.build(), dict(load=load, map=m, store=st, y=y)


#: every scenario variant with its canonical total (STEP_TIMING §9; lower bound where §9 gives a range)
ALL = {
    "S1": (s1_single_big_tile, {}, 8212),
    "S2": (s2_map_chain, {}, 715),
    "S2_pmu512": (s2_map_chain, {"pmu_bw": 512}, 603),
    "S3": (s3_read_from_mu, {}, 844),
    "S3_wb_false": (s3_read_from_mu, {"map1_wb": False}, 732),
    "S4": (s4_binary_map, {}, 405),
    "S4_bw1024": (s4_binary_map, {"compute_bw": 1024}, 661),
    "S5": (s5_accum, {}, 715),
    "S6": (s6_eager_merge, {}, 85),
    "S7": (s7_partition, {}, 570),
    "S8": (s8_reassemble, {}, 150),
    "S9": (s9_bufferize_streamify, {}, 591),
    "S10_depth1024": (s10_repeat_static, {"depth": 1024}, 152),
    "S10_depth2": (s10_repeat_static, {"depth": 2}, 154),
    "S11_depth1": (s11_depth_bubble, {"depth": 1}, 404),
    "S11_depth2": (s11_depth_bubble, {"depth": 2}, 278),
    "S12": (s12_hbm_queueing, {}, 25),
    "S13": (s13_store_tail, {}, 423),
}


def build(name):
    """(program, ids, expected total) of a scenario in :data:`ALL`."""
    fn, kwargs, total = ALL[name]
    program, ids = fn(**kwargs)
    return program, ids, total
