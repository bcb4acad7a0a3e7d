"""CPU instructions numba does not spell, for kernels: :func:`prefetch` (LLVM's ``llvm.prefetch``) and
:func:`lowest_bit` (``llvm.cttz``, one ``tzcnt`` on x86-64).

Why (bench/README.md, session 48): the mapped pricing of a step (:func:`stepsim.kernels.serve_mapped.price_mapped`)
reads, for each of a model's MoE layers, two rows of the routing pool's prefix counts at a random offset of an 8 MiB
table; each layer waited for its rows' cache misses, one layer after another (12 % of the Qwen3-30B-A3B whole-trace
replay's samples, 220 ns a layer against 35 ns with the table in cache), and asked for a few layers ahead the misses
overlap. Its decode attention deals each request to the least loaded region (the lowest index on a tie): with
the regions of each load as the bits of a word, the lowest one is one instruction
(:func:`stepsim.kernels.serve_mapped.deal_by_bits`).

Under ``NUMBA_DISABLE_JIT=1`` both are the Python functions: :func:`prefetch` does nothing.
"""

from __future__ import annotations

from stepsim.kernels.target import import_numba

numba = import_numba()


def prefetch(array, i, j, k):
    """Hint that ``array[i, j, k]`` (a 3-d array) will be read soon: the CPU brings its cache line in without
    waiting for it. No effect on any value."""


def lowest_bit(x):
    """The index of the lowest bit set in the 64-bit integer ``x`` (not 0): 0 for an odd ``x``, 63 for -2**63."""
    x = int(x)
    return (x & -x).bit_length() - 1


if not numba.config.DISABLE_JIT:
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic, overload

    @intrinsic
    def _prefetch_3d(typingctx, array, i, j, k):
        def codegen(context, builder, signature, args):
            array_type = signature.args[0]
            values = context.make_array(array_type)(context, builder, args[0])
            pointer = cgutils.get_item_pointer(context, builder, array_type, values, list(args[1:]),
                                               wraparound=False)
            byte_pointer = builder.bitcast(pointer, ir.IntType(8).as_pointer())
            i32 = ir.IntType(32)
            function = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [byte_pointer.type, i32, i32, i32]),
                "llvm.prefetch.p0i8")
            # (address, 0: a read, 3: keep it in every cache level, 1: the data cache)
            builder.call(function, [byte_pointer, i32(0), i32(3), i32(1)])
            return context.get_dummy_value()

        return types.void(array, i, j, k), codegen

    @intrinsic
    def _lowest_bit_i64(typingctx, x):
        def codegen(context, builder, signature, args):
            i64, i1 = ir.IntType(64), ir.IntType(1)
            function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i64, i1]),
                                                      "llvm.cttz.i64")
            return builder.call(function, [args[0], i1(1)])  # 1: a zero x is undefined (the callers never pass one)

        return types.int64(types.int64), codegen

    @overload(prefetch)
    def _prefetch_overload(array, i, j, k):
        if isinstance(array, types.Array) and array.ndim == 3:
            return lambda array, i, j, k: _prefetch_3d(array, i, j, k)
        return None

    @overload(lowest_bit)
    def _lowest_bit_overload(x):
        if x == types.int64:
            return lambda x: _lowest_bit_i64(x)
        return None
