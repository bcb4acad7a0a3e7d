"""Command-line interface: ``stepsim <command> ...`` (also ``python -m stepsim``).

Each command has one module in this package (its argparse and its handler) with a ``register(subparsers)``
function, so this module stays a thin dispatcher; the flags several commands share are in
:mod:`stepsim.cli.args`. Every :class:`StepsimError` is printed as ``stepsim: error: <message>`` with exit
status 2 and no traceback. Before a command runs, its ``--out`` is checked (a parser declares ``out_kind``
"dir", "file" or "record"; :mod:`stepsim.base.outputs`), and a command that simulates says so once when the
kernels still have to be compiled. Ctrl-C prints
``stepsim: interrupted`` (exit 130) and SIGTERM ``stepsim: terminated`` (exit 143; :mod:`stepsim.base.signals`).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import re
import sys
import warnings

from stepsim._version import __version__
from stepsim.base.collector import tune_process
from stepsim.base.errors import EXIT_ERROR, StepsimError, exit_status
from stepsim.base.signals import STOPPED

#: the module that provides each command's ``register(subparsers)`` (in help order)
COMMANDS = {
    "run": "stepsim.cli.run",
    "metrics": "stepsim.cli.metrics",
    "trace": "stepsim.cli.trace",
    "models": "stepsim.cli.models",
    "cache": "stepsim.cli.cache",
    "demo": "stepsim.cli.demo",
    "sweep": "stepsim.cli.sweep",
    "reproduce": "stepsim.cli.reproduce",
    "size-fifos": "stepsim.cli.size_fifos",
    "report": "stepsim.cli.report",
    "compare": "stepsim.cli.compare",
    "optimize": "stepsim.cli.optimize",
    "graph": "stepsim.cli.graph",
    "server": "stepsim.cli.server",
    "serve": "stepsim.cli.serve",
    "plan": "stepsim.cli.plan",
    "map": "stepsim.cli.map",
}
COMMAND_MODULES = tuple(dict.fromkeys(COMMANDS.values()))


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; given the command line, only the module of its command is imported (each one pulls in
    what its command runs: sympy, numba, pyarrow...), so ``stepsim run`` does not pay for ``stepsim optimize``.
    ``stepsim --help`` and unknown commands import every module."""
    parser = argparse.ArgumentParser(
        prog="stepsim", description="Simulate Streaming Tensor Programs on dataflow accelerators: traffic, on-chip "
        "memory, FLOPs and cycles of LLM layers on real traces.",
        epilog="Run 'stepsim COMMAND --help' for a command's flags; 'python -m stepsim' works the same.")
    parser.add_argument("--version", action="version", version=f"stepsim {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    command = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), None)
    modules = [COMMANDS[command]] if command in COMMANDS else COMMAND_MODULES
    for module_name in modules:
        importlib.import_module(module_name).register(subparsers)
    _plain_help(parser)
    return parser


_ROLE = re.compile(r":(?:mod|func|class|meth|data|attr|exc):`~?([^`]+)`")


def plain_text(text: str) -> str:
    """Help text without reStructuredText markup: ``code`` and :func:`a.b` roles become their plain text
    (docstrings double as command descriptions, and --help is read in a terminal)."""
    return _ROLE.sub(lambda m: m.group(1), text).replace("``", "")


def _plain_help(parser: argparse.ArgumentParser) -> None:
    """:func:`plain_text` over a parser's description, epilog and every argument's help, subcommands included."""
    for attr in ("description", "epilog"):
        if getattr(parser, attr):
            setattr(parser, attr, plain_text(getattr(parser, attr)))
    for action in parser._actions:
        if action.help:
            action.help = plain_text(action.help)
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                if choice.help:
                    choice.help = plain_text(choice.help)
            for sub in dict.fromkeys(action.choices.values()):
                _plain_help(sub)


#: commands that run the engine (the compile notice is printed before them)
SIMULATING_COMMANDS = ("run", "demo", "sweep", "reproduce", "size-fifos", "optimize", "report", "serve", "map",
                       "plan")


def _check_out(args) -> None:
    """A bad ``--out`` fails now, before any work (see :mod:`stepsim.base.outputs`)."""
    out = getattr(args, "out", None)
    kind = getattr(args, "out_kind", None)
    if out is None or kind is None:
        return
    from stepsim.base.outputs import check_out_dir, check_out_file, check_record_out

    {"dir": check_out_dir, "file": check_out_file, "record": check_record_out}[kind](out)


def _compile_notice(args) -> None:
    """One line on stderr before the first kernel compilation (a cold numba cache takes 40-70 s on the 2-core
    reference machine, depending on its speed at the time), said just before the command's first engine work
    (:mod:`stepsim.base.compile_notice`): a command that fails on its input first says only its error."""
    from stepsim.base import compile_notice

    if args.command not in SIMULATING_COMMANDS or getattr(args, "dry_run", False):
        compile_notice.arm(None)
        return

    cached = {}  # (functional, timeline) -> in numba's cache: read once (serve runs the engine per step)

    def say(functional: bool, timeline: bool) -> bool:
        from stepsim.kernels.jit import kernels_cached

        kind = (functional, timeline)
        if kind not in cached:
            cached[kind] = kernels_cached(functional, timeline)
        if cached[kind]:
            return False
        what = " and ".join(name for name, on in (("functional", functional), ("timeline", timeline)) if on)
        print(f"stepsim: compiling the {what + ' ' if what else ''}simulation kernels once, about a minute "
              "(`stepsim cache warm` does it ahead)", file=sys.stderr, flush=True)
        return True

    compile_notice.arm(say)


def _print_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """stepsim's own warnings as one line (``stepsim: warning: ...``); others as Python prints them."""
    from stepsim.base.errors import StepsimWarning

    if issubclass(category, StepsimWarning):
        print(f"stepsim: warning: {message}", file=sys.stderr)
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


_python_showwarning = warnings.showwarning


#: the exit statuses of a command stopped by a signal (130 and 143: 128 + SIGINT, 128 + SIGTERM)
STOPPED_STATUSES = tuple(status for status, _ in STOPPED.values())


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        # the program itself: a running command server of this environment runs the command instead (about
        # 0.1 s instead of 1.5 s of imports and kernel loading; stepsim.cli.server_daemon)
        from stepsim.cli.server_client import forward

        status = forward(sys.argv)
        if status is not None:
            return status
        tune_process()  # the program's own process: fewer walks of everything alive, sympy's larger cache
        # (stepsim.base.collector)
    status = _main(argv)
    if argv is None:
        if status in STOPPED_STATUSES:  # also after the commands that print their own stop line (sweep, optimize)
            _ignore_stop_signals()
        # The program is about to exit, and Python's final collection would walk every object still alive (the
        # modules of sympy, numba, pyarrow, the workload's graph): 0.3-0.7 s of a 2 s `stepsim run`. Frozen
        # objects are skipped; atexit handlers, output buffers and files are unaffected. Only for the program
        # itself: an in-process caller keeps its collector as it was.
        gc.freeze()
    return status


def _ignore_stop_signals() -> None:
    """The program is stopping because of a signal: it ends with the stop's exit status (130 or 143), never by
    death from a signal, and nothing but its stop line is printed on the way out
    (:func:`stepsim.base.signals.quiet_after_stop`). Only for the program itself, not for in-process callers.

    * A repeated signal, while the line is printed or during interpreter shutdown, is ignored.
    * CPython (3.11; ``run_eval_code_obj`` in Python/pythonrun.c) marks "a KeyboardInterrupt went unhandled"
      whenever one leaves code run by ``exec`` of a *string*, even when a caller catches it, and at exit a marked
      process kills itself with SIGINT (bpo-1054041): exit status -2 after the stop line. A Ctrl-C landing in
      the ``exec`` of ``dataclasses`` (every ``@dataclass`` makes its methods so, as stepsim's modules load) did
      that, about 1 in 16 stops in the first second under load. Every such ``exec`` clears the mark first, so
      an empty one here clears it (tests/cli/test_interrupts.py reproduces the case)."""
    import signal

    from stepsim.base.signals import quiet_after_stop

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    exec("")  # noqa: S102 - clears CPython's unhandled-KeyboardInterrupt mark (see above); runs nothing
    quiet_after_stop()


def _main(argv: list[str] | None) -> int:
    from stepsim.base.signals import interrupts_raise, reason, stopped_status

    warnings.showwarning = _print_warning
    from stepsim.base.errors import StepsimWarning

    # each of stepsim's warnings is said every time its cause is there, also when a command server runs several
    # commands in one process (Python's default shows a warning once per place of the code)
    warnings.filterwarnings("always", category=StepsimWarning)
    try:
        with interrupts_raise():  # from the start: a signal while modules load stops cleanly too
            parser = build_parser(argv)
            args = parser.parse_args(argv)
            if not getattr(args, "handler", None):
                parser.print_help()
                return 1
            _check_out(args)
            if argv is None:  # the program itself, not an in-process caller; before numba is imported
                from stepsim.kernels.target import own_process

                own_process()
            _compile_notice(args)
            return int(args.handler(args) or 0)
    except StepsimError as exc:
        print(f"stepsim: error: {exc}", file=sys.stderr)
        return exit_status(exc)
    except BrokenPipeError:
        return 0
    except OSError as exc:  # the writers turn their own errors into OutputError; this catches any other failing
        # file operation, so that it too ends in one line naming the path rather than a traceback
        from stepsim.base.errors import os_reason

        where = f"{exc.filename}: " if exc.filename else ""
        print(f"stepsim: error: {where}{os_reason(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt as exc:
        if argv is None:
            _ignore_stop_signals()
        return stopped_status(reason(exc))


if __name__ == "__main__":
    raise SystemExit(main())
