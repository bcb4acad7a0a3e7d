"""User programs: ``stepsim run path/to/file.py:function`` (config ``{"workload": "program", "program": ...}``).

The function is called without arguments and returns what to simulate:

* a :class:`~stepsim.graph.Graph`: run on the ``step-eval`` preset with FIFOs of 2 unless ``--hardware`` /
  ``--channel-depth`` say otherwise (the workload kind ``program``);
* a :class:`~stepsim.workloads.base.Workload` (e.g. built with :func:`stepsim.workloads.moe.build.build_moe` on the
  user's own model and trace): run with its own hardware, FIFO depth and bindings; ``--functional --check``
  then compares with the NumPy reference of its kind (``moe``, ``swiglu``, ``attention``).

The file is imported as a module of its own (its folder first on ``sys.path`` while it loads, so it can import
files beside it). Every way this can fail is one :class:`~stepsim.base.errors.ConfigError` line naming the file and
function: a spec without ``:function``, a missing file, an import that raises, a missing function, a call
that raises, a result of another type.

Identity: the run id hashes the file's content and the function name (not its path). Modules the file imports
and data it reads are not hashed, so user programs run with ``stepsim run`` / ``stepsim metrics`` only, never in
sweeps, whose resume reuses results by run id.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path

from stepsim.base.errors import ConfigError
from stepsim.workloads.base import Workload


def split_spec(spec: str) -> tuple[Path, str]:
    """``path/to/file.py:function`` -> (path, function name); ConfigError for another shape."""
    path, sep, function = str(spec).rpartition(":")
    if not sep or not path.endswith(".py") or not function.isidentifier():
        raise ConfigError(f"program {spec!r}: expected path/to/file.py:function")
    return Path(path), function


def is_program_spec(value: str) -> bool:
    """Whether a workload argument names a user program (``...py:function``) rather than a workload kind."""
    return ".py:" in str(value)


def _load_module(path: Path, spec: str):
    if not path.is_file():
        raise ConfigError(f"program {spec!r}: no such file {path}")
    name = "stepsim_user_program_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    try:
        module_spec.loader.exec_module(module)
    except SystemExit as exc:  # not an exit of stepsim: it once ended the command silently with the user's status
        raise ConfigError(f"program {spec!r}: importing {path} called sys.exit({exc.code!r}); a program returns a "
                          f"Graph or Workload instead") from None
    except Exception as exc:  # the user's code: any error becomes one line naming the file
        raise ConfigError(f"program {spec!r}: importing {path} raised {type(exc).__name__}: {exc}") from None
    finally:
        if sys.path and sys.path[0] == folder:
            sys.path.pop(0)
    return module


def build_program(spec: str) -> Workload:
    """Import the file of ``spec``, call its function and return the Workload to simulate (see the module
    docstring). Raises ConfigError naming ``spec`` for every failure."""
    from stepsim.graph import Graph

    path, function = split_spec(spec)
    module = _load_module(path, spec)
    fn = getattr(module, function, None)
    if not callable(fn):
        names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                       and getattr(v, "__module__", None) == module.__name__)
        raise ConfigError(f"program {spec!r}: {path} has no function {function!r} "
                          f"(functions: {', '.join(names) or 'none'})")
    try:
        built = fn()
    except SystemExit as exc:  # see _load_module
        raise ConfigError(f"program {spec!r}: {function}() called sys.exit({exc.code!r}); it must return a stepsim "
                          f"Graph or Workload") from None
    except Exception as exc:  # the user's code
        raise ConfigError(f"program {spec!r}: {function}() raised {type(exc).__name__}: {exc}") from None
    if isinstance(built, Workload):
        return built
    if isinstance(built, Graph):
        return Workload(name="program", graph=built, params={"program": spec})
    raise ConfigError(f"program {spec!r}: {function}() returned {type(built).__name__}; expected a stepsim Graph "
                      f"or Workload")


def from_config(cfg: Mapping) -> Workload:
    """The program workload of a normalized run config (:func:`stepsim.workloads.config.normalize_config`)."""
    if cfg.get("program") is None:
        raise ConfigError("workload 'program' needs the knob 'program' (path/to/file.py:function)")
    return build_program(cfg["program"])
