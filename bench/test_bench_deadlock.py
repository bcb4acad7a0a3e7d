"""How fast a deadlock is detected: the engine stops when its event queue drains, it never waits for a timeout.

Moved here from the unit tests (which asserted under 1.0 s of wall time; a timed assertion does not belong in a
unit test): the fork-join program of ``tests/kernels/kernel_helpers.py`` deadlocks at its default depth 2 and
finishes at depth 8 (918 cycles). Both run on the numba engine in the same process, alternating, best of
``rounds``; the ratio of detecting the deadlock (the raw ``DeadlockError``, before any diagnosis) to finishing
the deeper run is the cost of detection, expected near 1 (both walk the same few hundred events; the deadlock
also collects its blocked-unit records). A loop of two Maps without initial tokens (no event at all) is timed
the same way. Hard asserts only on what is deterministic: the outcome and the cycle count.
"""

from __future__ import annotations

import time

from kernel_helpers import fork_join_program

from stepsim.base.errors import DeadlockError
from stepsim.base.hardware import Hardware
from stepsim.kernels import run
from stepsim.kernels.program import ProgramBuilder


def _loop_without_tokens():
    b = ProgramBuilder(Hardware.preset("step-eval"))
    x, y = b.add_channel(name="x"), b.add_channel(name="y")
    b.map(ins=[x], out=y, fn="exp", name="first")
    b.map(ins=[y], out=x, fn="exp", name="second")
    return b.build()


def _seconds_to_deadlock(program) -> float:
    start = time.perf_counter()
    try:
        run(program)
    except DeadlockError:
        return time.perf_counter() - start
    raise AssertionError("the program was expected to deadlock")


def test_deadlock_detection_costs_about_one_run(benchmark, rounds, bench_summary):
    from stepsim.kernels.warm import warm_program

    run(warm_program())
    stuck, deep, loop = fork_join_program(), fork_join_program(direct_depth=8), _loop_without_tokens()
    detect, finish, empty = [], [], []

    def measure():
        detect.append(_seconds_to_deadlock(stuck))
        start = time.perf_counter()
        cycles = run(deep).cycles
        finish.append(time.perf_counter() - start)
        assert cycles == 918
        empty.append(_seconds_to_deadlock(loop))

    benchmark.pedantic(measure, rounds=rounds(20), iterations=1)
    ratio = min(detect) / min(finish)
    benchmark.extra_info.update(detect_s=min(detect), finish_s=min(finish), loop_s=min(empty), ratio=ratio)
    bench_summary("deadlock detection", f"fork-join: deadlock found in {1e3 * min(detect):.2f} ms, the depth-8 run "
                                        f"finishes in {1e3 * min(finish):.2f} ms (ratio {ratio:.2f}); a loop without "
                                        f"tokens: {1e3 * min(empty):.2f} ms")
