"""Typed errors of stepsim.

Every error raised on purpose by stepsim derives from :class:`StepsimError`, so callers (and the CLI, which
prints the message and exits non-zero without a traceback) can catch one type. Messages say what was wrong,
where (operator name, stream shapes, trace file and row, config key) and, where possible, what would be right.
"""

from __future__ import annotations

from dataclasses import dataclass


class StepsimError(Exception):
    """Root of every error stepsim raises on purpose."""


class StepsimWarning(UserWarning):
    """A configuration that runs but is probably not what was meant (the CLI prints it as one line)."""


# --- exit statuses of the command line (documented in the README, "Exit statuses") --------------------------
#: a bad flag, input or output: the message says what to change
EXIT_ERROR = 2
#: the simulated program deadlocked: a property of the configuration (its FIFO depths), not of the command line;
#: the message points at ``stepsim size-fifos``
EXIT_DEADLOCK = 3


def exit_status(exc: "StepsimError") -> int:
    """The command line's exit status for ``exc``."""
    return EXIT_DEADLOCK if isinstance(exc, DeadlockError) else EXIT_ERROR


# --- outputs ---------------------------------------------------------------------------------------------
def os_reason(exc: OSError) -> str:
    """The OS's words for ``exc`` ("No space left on device"): pyarrow raises OSError without an errno but
    with "[errno 28]" in its message, so the number is read from the text when the attribute is missing."""
    import os
    import re

    number = exc.errno
    if number is None:
        found = re.search(r"\[errno (\d+)\]", str(exc), re.IGNORECASE)
        number = int(found.group(1)) if found else None
    return os.strerror(number) if number else (exc.strerror or str(exc) or type(exc).__name__)


class OutputError(StepsimError):
    """An output could not be written (a full disk, a read-only folder, no permission). The message is one line
    naming the path and the OS's reason; the writer has removed what it had begun (see
    :func:`stepsim.results.atomic_output`), so the output is absent, never half-written."""

    def __init__(self, path, exc: "OSError | OutputError"):
        self.path = str(path)
        self.reason = exc.reason if isinstance(exc, OutputError) else os_reason(exc)
        super().__init__(f"cannot write {path}: {self.reason}")


# --- graph definition -------------------------------------------------------------------------------------
class GraphError(StepsimError):
    """A graph is malformed (wiring, cycles without placeholders closed, unknown nodes)."""


class ShapeError(GraphError):
    """A stream shape does not satisfy an operator's shape rule."""


class DTypeError(GraphError):
    """A stream element type does not match what an operator accepts."""


class ArgumentError(GraphError):
    """An operator or function argument is invalid (negative size, rank out of range, ...)."""


class MetricError(StepsimError):
    """A symbolic metric cannot be evaluated (missing symbol values, bad substitution)."""


# --- configuration and lowering ---------------------------------------------------------------------------
class ConfigError(StepsimError):
    """A hardware / sweep / CLI configuration value is unknown or invalid (the message names the key)."""


class SystemConfigError(ConfigError):
    """A multi-chip system description is invalid (a link to a missing chip, zero bandwidth, an unreachable
    chip, ...); the message names the file and the key (:mod:`stepsim.base.system`)."""


class LoweringError(StepsimError):
    """A graph cannot be lowered to an engine program (an unresolved symbol, an unsupported operator)."""


# --- simulation ------------------------------------------------------------------------------------------
class SimulationError(StepsimError):
    """The engine stopped abnormally."""


class LatencyProviderError(SimulationError):
    """A serving latency provider priced a step with something other than an ``IterationCost`` of a positive,
    finite number of seconds that moves time on (the message names the step and what came back)."""


@dataclass(frozen=True)
class BlockedUnit:
    """One unfinished unit of a stopped run and what it waits for (both engines report these).

    ``waiting_for`` is ``"empty"`` (data on ``channel``), ``"full"`` (a free slot on ``channel``), ``"hbm"``,
    ``"time"`` or ``"none"``; a unit waiting on several channels at once (an EagerMerge choosing) has one record
    per channel. ``occupancy`` / ``capacity`` (elements) describe ``channel`` (None without a channel).
    """

    unit: str
    opcode: str
    clock: int
    channel: str | None
    waiting_for: str
    occupancy: int | None = None
    capacity: int | None = None


class DeadlockError(SimulationError):
    """No unit can make progress while some are unfinished; the message names the wait cycle, a fix and the
    blocked units (at most 40 lines; :mod:`stepsim.analysis.deadlock`).

    The engines raise it with the raw records only (:func:`raw_deadlock`: the blocked units and one line each);
    the explanation (wait cycles, the FIFO that breaks them) is built above the engine, by
    :func:`stepsim.analysis.deadlock.diagnosed`, which every caller that shows it to a person goes through
    (:func:`stepsim.simulation.simulate.simulate`, the passes, the report). So the engine imports no analysis.

    Attributes
    ----------
    blocked : list of BlockedUnit
        Every blocked unit (unit, opcode, clock, channel, waiting_for, occupancy, capacity), both engines.
    unit_lines : list of str
        One engine-formatted line per blocked record (what the message lists).
    diagnosis : stepsim.analysis.deadlock.Diagnosis or None
        The wait cycles and the channels whose deeper FIFO breaks them; None straight from an engine.
    program : stepsim.kernels.program.Program or None
        The deadlocked program (to diagnose, or to check a fix by rerunning it; not pickled).
    timeline : stepsim.simulation.timeline.Timeline or None
        ``simulate(..., timeline=...)``: the timeline up to the deadlock (not pickled).
    """

    def __init__(self, message: str, blocked: list[BlockedUnit] | None = None, diagnosis=None, program=None,
                 unit_lines: list[str] | None = None):
        super().__init__(message)
        self.blocked = blocked or []
        self.unit_lines = unit_lines or []
        self.diagnosis = diagnosis
        self.program = program
        self.timeline = None

    def __reduce__(self):  # worker processes send it back without the program's arrays
        return (type(self), (str(self), self.blocked, self.diagnosis, None, self.unit_lines))


def raw_deadlock(program, blocked: list[BlockedUnit], unit_lines: list[str]) -> DeadlockError:
    """The undiagnosed DeadlockError an engine raises: a summary line and the blocked units' lines."""
    message = "\n".join([f"deadlock: no unit can make progress; {len(blocked):,} record(s) of blocked units",
                         "blocked units:", *unit_lines])
    return DeadlockError(message, blocked, program=program, unit_lines=list(unit_lines))


class ArenaError(SimulationError):
    """The functional-mode value arena ran out of space (the message says how much was needed)."""


# --- traces ----------------------------------------------------------------------------------------------
class TraceError(StepsimError):
    """A trace file cannot be read or fails validation (the message names file, row, column and value)."""


class TraceSchemaError(TraceError):
    """A trace has the wrong columns, dtypes or schema version."""


class TraceValueError(TraceError):
    """A trace value is out of range (expert id, negative length, duplicated expert within a token, ...)."""


# --- layouts and the ONNX front end (issue 33) ----------------------------------------------------------
class LayoutError(GraphError):
    """A stream layout is malformed, or no converter can turn a producer's layout into a consumer's."""


class FrontendError(StepsimError):
    """A model cannot be imported: a malformed file, an unsupported operator or an unbindable dynamic shape."""
