"""Command-line interface: ``stepsim <command> ...`` (also ``python -m stepsim``).

Each command family lives beside the code it drives and registers itself here through a
``register(subparsers)`` function, so this module stays a thin dispatcher. Every :class:`StepsimError` is
printed as ``stepsim: error: <message>`` with exit status 2 and no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from stepsim._version import __version__
from stepsim.errors import StepsimError

#: modules that provide ``register(subparsers)``; imported lazily so ``stepsim --help`` stays fast
COMMAND_MODULES = (
    "stepsim.workloads.cli",  # metrics, run
    "stepsim.trace_io.cli",  # trace import / inspect / synth
    "stepsim.kernels.cli",  # cache warm
    "stepsim.demo",  # demo
    "stepsim.sweep.cli",  # sweep
    "stepsim.reproduce.cli",  # reproduce
    "stepsim.passes.cli",  # size-fifos
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stepsim", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"stepsim {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:  # a command family not built yet
            if exc.name == module_name:
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 1
    try:
        return int(args.handler(args) or 0)
    except StepsimError as exc:
        print(f"stepsim: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
