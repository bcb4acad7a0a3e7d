"""Random small STeP programs for engine cross-checks (deterministic from a seed).

A program is grown from sources (off-chip loads, metadata and selector generators) by applying random
operators to a pool of open streams, each described by ``(count, dims, tile)``: ``count`` tensors of static
shape ``dims`` (outermost first; stop levels follow STEP_SEMANTICS §1.2, so the element closing a tensor
carries ``len(dims)``), made of ``tile = (rows, cols, bytes)`` tiles. Shape rules keep every stream
well-formed (binary maps only join a stream with a shape-preserving copy of itself, selectors match the group
counts), so programs either finish or deadlock on purpose-free FIFO limits: both engines must agree either way.
Leftover streams end in sinks or off-chip stores. FIFO depths are random in {1, 2, 3, 4, 8}.

``random_program(seed, links=True)`` builds multi-chip programs: the operators also include links between chips
(one to three streams sharing a Link unit with random bandwidth and latency, and chains of links, as a transfer
routed over several hops), and after each link the operators go on on a random one of three chips, each with
its own HBM; without ``links`` the programs are the same as before links existed.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from stepsim.base.hardware import Hardware
from stepsim.kernels.program import ProgramBuilder

DEPTHS = (1, 2, 3, 4, 8)


@dataclass
class _S:
    ch: int
    count: int
    dims: tuple
    tile: tuple  # rows, cols, bytes (None for selectors / scalars)
    kind: str = "tile"  # tile | scalar | selector

    @property
    def n(self):
        return self.count * math.prod(self.dims)


class _Gen:
    def __init__(self, seed, max_ops, repeat_depth, links=False):
        self.r = random.Random(seed)
        self.links = links
        self.ops = self.OPS + (("op_link", "op_link", "op_route") if links else ())
        hw = Hardware.preset("step-eval", hbm_channels=self.r.choice([4, 8, 32]),
                             pmu_bw=self.r.choice([64, 256]))
        self.b = ProgramBuilder(hw)
        self.pool: list[_S] = []
        self.max_ops = max_ops
        self.repeat_depth = repeat_depth
        self.n_units = 0

    # ---------------------------------------------------------------- helpers
    def ch(self, depth=None):
        return self.b.add_channel(capacity=depth if depth is not None else self.r.choice(DEPTHS))

    def take(self, pred=lambda s: True):
        cands = [s for s in self.pool if pred(s)]
        if not cands:
            return None
        s = self.r.choice(cands)
        self.pool.remove(s)
        return s

    def tile(self):
        return (self.r.choice([1, 2, 4, 16]), self.r.choice([16, 32, 64]), self.r.choice([2, 4]))

    # ---------------------------------------------------------------- sources
    def src_load(self):
        dims = tuple(self.r.randint(1, 3) for _ in range(self.r.randint(1, 2)))
        rows, cols, nb = self.tile()
        c = self.ch()
        self.b.offchip_load(out=c, tile_rows=rows, tile_cols=cols, elem_bytes=nb, view_shape=dims,
                            par_dispatch=self.r.choice([1, 2, 4]))
        self.pool.append(_S(c, 1, dims, (rows, cols, nb)))

    def src_meta(self):
        n = self.r.randint(1, 4)
        c = self.ch()
        self.b.metadata_gen(out=c, values=[self.r.randint(0, 3) for _ in range(n)], shape=(n,))
        self.pool.append(_S(c, 1, (n,), (1, 1, 8), "scalar"))

    # ---------------------------------------------------------------- operators (return False if n/a)
    def op_unary(self):
        s = self.take(lambda s: s.kind == "tile")
        if s is None:
            return False
        c = self.ch()
        fn = self.r.choice(["exp", "silu", "rowsum"])
        self.b.map(ins=[s.ch], out=c, fn=fn, compute_bw=self.r.choice([64, 1024]),
                   write_back_mu=self.r.random() < 0.5)
        rows, cols, nb = s.tile
        self.pool.append(_S(c, s.count, s.dims, (rows, 1 if fn == "rowsum" else cols, nb)))
        return True

    def op_binary(self):
        s = self.take(lambda s: s.kind == "tile")
        if s is None:
            return False
        c1, c2, c3 = self.ch(), self.ch(), self.ch()
        self.b.broadcast(inp=s.ch, outs=[c1, c2])
        self.b.map(ins=[c1], out=c3, fn="exp", compute_bw=1024, write_back_mu=self.r.random() < 0.5)
        out = self.ch()
        fn = self.r.choice(["add", "mul", "matmul"]) if s.tile[0] == s.tile[1] else "add"
        self.b.map(ins=[c3, c2] if self.r.random() < 0.5 else [c2, c3], out=out, fn=fn,
                   compute_bw=self.r.choice([256, 4096]), write_back_mu=self.r.random() < 0.5)
        self.pool.append(_S(out, s.count, s.dims, s.tile))
        return True

    def op_accum(self):
        s = self.take(lambda s: s.kind == "tile" and len(s.dims) >= 1)
        if s is None:
            return False
        r = self.r.randint(1, len(s.dims))
        c = self.ch()
        rows, cols, nb = s.tile
        if self.r.random() < 0.3:
            self.b.accum(inp=s.ch, out=c, fn="retile_row", init_rows=0, init_cols=cols, init_elem_bytes=nb, rank=r,
                         compute_bw=0, write_back_mu=self.r.random() < 0.5)
            tile = (rows * math.prod(s.dims[-r:]), cols, nb)
        else:
            self.b.accum(inp=s.ch, out=c, fn="add", init_rows=rows, init_cols=cols, init_elem_bytes=nb, rank=r,
                         compute_bw=self.r.choice([64, 1024]), write_back_mu=self.r.random() < 0.5)
            tile = s.tile
        self.pool.append(_S(c, s.count, s.dims[:-r], tile))
        return True

    def op_map_accum(self):
        s = self.take(lambda s: s.kind == "tile" and len(s.dims) >= 1 and s.tile[0] == s.tile[1])
        if s is None:
            return False
        r = self.r.randint(1, len(s.dims))
        c1, c2, out = self.ch(), self.ch(), self.ch()
        self.b.broadcast(inp=s.ch, outs=[c1, c2])
        rows, cols, nb = s.tile
        self.b.map_accum(in1=c1, in2=c2, out=out, fn="matmul", init_rows=rows, init_cols=cols, init_elem_bytes=nb,
                         rank=r, compute_bw=self.r.choice([256, 4096]), write_back_mu=self.r.random() < 0.5)
        self.pool.append(_S(out, s.count, s.dims[:-r], s.tile))
        return True

    def op_scan(self):
        s = self.take(lambda s: s.kind == "tile" and len(s.dims) >= 1)
        if s is None:
            return False
        c = self.ch()
        rows, cols, nb = s.tile
        self.b.scan(inp=s.ch, out=c, fn="add", init_rows=rows, init_cols=cols, init_elem_bytes=nb,
                    rank=self.r.randint(1, len(s.dims)), compute_bw=256, write_back_mu=self.r.random() < 0.5)
        self.pool.append(_S(c, s.count, s.dims, s.tile))
        return True

    def op_flatten(self):
        s = self.take(lambda s: len(s.dims) >= 2)
        if s is None:
            return False
        c = self.ch()
        self.b.flatten(inp=s.ch, out=c, min_rank=0, max_rank=1)
        self.pool.append(_S(c, s.count, s.dims[:-2] + (s.dims[-2] * s.dims[-1],), s.tile, s.kind))
        return True

    def op_promote(self):
        s = self.take()
        if s is None:
            return False
        c = self.ch()
        p = self.r.randint(0, len(s.dims))
        self.b.promote(inp=s.ch, out=c, rank=p, input_rank=len(s.dims))
        k = len(s.dims) - p
        self.pool.append(_S(c, s.count, s.dims[:k] + (1,) + s.dims[k:], s.tile, s.kind))
        return True

    def op_reshape(self):
        s = self.take(lambda s: s.kind == "tile" and len(s.dims) >= 1)
        if s is None:
            return False
        c = self.ch()
        S = self.r.randint(1, 3)
        D = s.dims[-1]
        rows, cols, nb = s.tile
        pad = D % S != 0
        dims = s.dims[:-1] + (-(-D // S), S)
        flags = self.ch(self.r.choice([1, 2])) if self.r.random() < 0.3 else None  # the padding-flag stream
        self.b.reshape(inp=s.ch, out=c, chunk=S, rank=0, pad_rows=rows if pad else 0, pad_cols=cols if pad else 0,
                       pad_elem_bytes=nb if pad else 0, write_back_mu=self.r.random() < 0.5, flags_out=flags)
        self.pool.append(_S(c, s.count, dims, s.tile))
        if flags is not None:
            self.pool.append(_S(flags, s.count, dims, (1, 1, 1), "scalar"))
        return True

    def op_repeat(self):
        s = self.take()
        if s is None:
            return False
        n = self.r.randint(1, 3)
        c = self.ch(self.repeat_depth)
        self.b.repeat_static(inp=s.ch, out=c, count=n)
        self.pool.append(_S(c, s.count, s.dims + (n,), s.tile, s.kind))
        return True

    def op_buffer(self):
        s = self.take(lambda s: s.kind != "selector" and len(s.dims) >= 1)
        if s is None:
            return False
        bb = self.r.randint(1, len(s.dims))
        c1, c2 = self.ch(), self.ch()
        self.b.bufferize(inp=s.ch, out=c1, rank=bb)
        reps = tuple(self.r.randint(1, 2) for _ in range(self.r.randint(0, 1)))
        self.b.streamify(inp=c1, out=c2, rank=bb, repeat_factors=reps)
        self.pool.append(_S(c2, s.count, s.dims[:-bb] + reps + s.dims[-bb:], s.tile, s.kind))
        return True

    def op_rows(self):
        s = self.take(lambda s: s.kind == "tile" and len(s.dims) >= 1 and s.tile[0] <= 4)
        if s is None:
            return False
        c = self.ch()
        rows, cols, nb = s.tile
        self.b.row_streamify(inp=s.ch, out=c, split_rows=True)
        self.pool.append(_S(c, s.count, s.dims[:-1] + (s.dims[-1] * rows,), (1, cols, nb)))
        return True

    def _selector(self, n_groups, n_targets, multi):
        ptr, idx = [0], []
        for _ in range(n_groups):
            if multi:
                t = sorted(self.r.sample(range(n_targets), self.r.randint(0, n_targets)))
            else:
                t = [self.r.randrange(n_targets)]
            idx.extend(t)
            ptr.append(len(idx))
        return ptr, idx

    def op_partition(self):
        s = self.take(lambda s: s.kind == "tile" and len(s.dims) >= 1 and s.count >= 1)
        if s is None:
            return False
        r = self.r.randint(0, len(s.dims))
        n_out = self.r.randint(1, 3)
        n_groups = s.count * math.prod(s.dims[:len(s.dims) - r])
        ptr, idx = self._selector(n_groups, n_out, self.r.random() < 0.5)
        sel = self.ch()
        self.b.select_gen(out=sel, targets_ptr=ptr, targets_idx=idx, n_targets=n_out)
        outs = [self.ch() for _ in range(n_out)]
        reassemble = self.r.random() < 0.5
        if reassemble:
            sel_p, sel_r = self.ch(), self.ch(8)
            self.b.broadcast(inp=sel, outs=[sel_p, sel_r])
            sel = sel_p
        sw = [self.r.randint(0, 2) for _ in range(n_out)]
        self.b.partition(data=s.ch, sel=sel, outs=outs, rank=r, switch_cycles=sw,
                         write_back_mu=self.r.random() < 0.5)
        inner = s.dims[len(s.dims) - r:]
        counts = [sum(1 for g in range(n_groups) if e in idx[ptr[g]:ptr[g + 1]]) for e in range(n_out)]
        if reassemble:
            mids = []
            for o in outs:
                m = self.ch()
                self.b.map(ins=[o], out=m, fn="exp", compute_bw=self.r.choice([64, 1024]))
                mids.append(m)
            out = self.ch()
            self.b.reassemble(ins=mids, sel=sel_r, out=out, rank=r, switch_cycles=sw,
                              write_back_mu=self.r.random() < 0.5)
            self.b.sink(inp=out)
        else:
            for o, k in zip(outs, counts):
                self.pool.append(_S(o, k, inner, s.tile))
        return True

    def op_merge(self):
        s1 = self.take(lambda s: s.kind == "tile" and len(s.dims) >= 1)
        if s1 is None:
            return False
        s2 = self.take(lambda s: s.kind == "tile" and s.dims == s1.dims)
        ins = [s1] + ([s2] if s2 is not None else [])
        if s2 is None:
            self.src_load()
            s2 = self.take(lambda s: s.dims == s1.dims)
            if s2 is not None:
                ins.append(s2)
        d, sel = self.ch(), self.ch()
        self.b.eager_merge(ins=[s.ch for s in ins], data_out=d, sel_out=sel, rank=len(s1.dims))
        self.b.sink(inp=sel)
        self.pool.append(_S(d, sum(s.count for s in ins), s1.dims, s1.tile))
        return True

    def op_parallelize(self):
        s = self.take(lambda s: len(s.dims) >= 1)
        if s is None:
            return False
        n = self.r.randint(1, 3)
        outs = [self.ch() for _ in range(n)]
        self.b.parallelize(inp=s.ch, outs=outs, rank=len(s.dims), switch_cycles=[self.r.randint(0, 2)
                                                                                 for _ in range(n)])
        for k, o in enumerate(outs):
            self.pool.append(_S(o, len(range(k, s.count, n)), s.dims, s.tile, s.kind))
        return True

    def op_expand(self):
        s = self.take(lambda s: s.kind == "tile" and s.dims == (1,))
        if s is None:
            return False
        self.src_meta()
        ref = self.pool.pop()
        c = self.ch()
        self.b.expand_ref(inp=s.ch, ref=ref.ch, out=c, rank=1)
        self.pool.append(_S(c, 1, ref.dims, s.tile))
        return True

    def op_dyn_load(self):
        self.src_meta()
        ref = self.pool.pop()
        c = self.ch()
        rows, cols, nb = self.tile()
        if self.r.random() < 0.5:
            dims = (self.r.randint(1, 2),)
            self.b.dyn_offchip_load(ref=ref.ch, out=c, tile_rows=rows, tile_cols=cols, elem_bytes=nb, view_shape=dims)
            self.pool.append(_S(c, 1, ref.dims + dims, (rows, cols, nb)))
        else:
            self.b.random_offchip_load(raddr=ref.ch, out=c, tile_rows=rows, tile_cols=cols, elem_bytes=nb)
            self.pool.append(_S(c, 1, ref.dims, (rows, cols, nb)))
        return True

    def op_random_store(self):
        s = self.take(lambda s: s.kind == "tile" and 1 <= s.n <= 12)
        if s is None:
            return False
        a = self.ch()  # one address per data tile (lock-stepped)
        self.b.metadata_gen(out=a, values=[self.r.randint(0, 3) for _ in range(s.n)], shape=(s.n,))
        ack = self.ch()
        rows, cols, nb = s.tile
        self.b.random_offchip_store(waddr=a, wdata=s.ch, ack=ack, tile_rows=rows, tile_cols=cols, elem_bytes=nb)
        self.b.sink(inp=ack)
        return True

    def _link(self, streams):
        outs = [self.ch() for _ in streams]
        self.b.link(ins=[s.ch for s in streams], outs=outs, bandwidth=self.r.choice([1, 8, 64, 512]),
                    latency=self.r.choice([1, 2, 7, 40]))
        # later operators (their loads and stores) may sit on another chip, with its own HBM
        self.b.chip = self.r.randrange(3)
        return [_S(o, s.count, s.dims, s.tile, s.kind) for s, o in zip(streams, outs)]

    def op_link(self):
        """One to three streams share one link (each a transfer between the same two chips)."""
        streams = []
        for _ in range(self.r.randint(1, 3)):
            s = self.take()
            if s is None:
                break
            streams.append(s)
        if not streams:
            return False
        self.pool.extend(self._link(streams))
        return True

    def op_route(self):
        """A transfer over two or three hops (links in a chain)."""
        s = self.take()
        if s is None:
            return False
        for _ in range(self.r.randint(2, 3)):
            s, = self._link([s])
        self.pool.append(s)
        return True

    OPS = ("op_unary", "op_binary", "op_accum", "op_map_accum", "op_scan", "op_flatten", "op_promote", "op_reshape",
           "op_repeat", "op_buffer", "op_rows", "op_partition", "op_merge", "op_parallelize", "op_expand",
           "op_dyn_load", "op_random_store")

    def build(self):
        for _ in range(self.r.randint(1, 2)):
            self.src_load()
        if self.r.random() < 0.3:
            self.src_meta()
        for _ in range(self.r.randint(1, self.max_ops)):
            for _attempt in range(5):
                if getattr(self, self.r.choice(self.ops))():
                    break
        if self.links:  # the leftover streams leave the chip: most multi-chip programs end in shared links
            self.op_link()
        for s in self.pool:
            if s.kind == "tile" and self.r.random() < 0.3:
                self.b.offchip_store(inp=s.ch, par_dispatch=self.r.choice([1, 4]))
            else:
                self.b.sink(inp=s.ch)
        return self.b.build()


def random_program(seed: int, *, max_ops: int = 6, repeat_depth: int | None = 1024, links: bool = False):
    """A random well-formed program (deterministic in ``seed``).

    ``repeat_depth`` fixes the capacity of RepeatStatic outputs (``None``: random like every other FIFO);
    ``links`` adds links between chips to the operators (multi-chip programs).
    """
    return _Gen(seed, max_ops, repeat_depth, links).build()
