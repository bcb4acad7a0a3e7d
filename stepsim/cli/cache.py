"""``stepsim cache warm``: compile every engine kernel into numba's on-disk cache (the timing, functional and
timeline specializations of the event loop), and the serving replay's loop."""

from __future__ import annotations

import argparse
import time


def register(subparsers) -> None:
    """Add the ``cache`` command family (``stepsim cache warm``) to the top-level subparsers."""
    cache = subparsers.add_parser("cache", help="manage the compiled-kernel cache")
    actions = cache.add_subparsers(dest="cache_command", metavar="ACTION")
    warm = actions.add_parser("warm", help="compile every engine kernel: timing, functional and timeline runs (a tiny program touching every opcode)",
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    warm.set_defaults(handler=_warm)
    cache.set_defaults(handler=lambda args: cache.print_help() or 1)


def _warm(args) -> int:
    t0 = time.perf_counter()
    from stepsim.kernels.api import run
    from stepsim.kernels.warm import warm_program

    result = run(warm_program())
    # the functional and the timeline runs are specializations of their own (each compiled on first use)
    from stepsim.kernels.api import _engine, _ensure_compiled

    _ensure_compiled(_engine(functional=True), functional=True)
    run(warm_program(), timeline=1 << 12)
    from stepsim.serve.replay_compiled import warm

    warm()  # the serving replay's loop (stepsim.kernels.serve_replay)
    elapsed = time.perf_counter() - t0
    print(f"engine kernels ready in {elapsed:.1f} s (warm-up program: {result.cycles} cycles, "
          f"{result.fires} firings)")
    return 0
