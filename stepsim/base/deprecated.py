"""Deprecated import paths of the modules the restructuring of 2026-11-24 moved, kept for one release.

``import stepsim.simulate`` (and every other path of :data:`MOVED`) still works: it warns once with a
``DeprecationWarning`` naming the new path and gives a stand-in module that reads every attribute from the module
at that path (nothing is copied, so a monkeypatch of the real module is seen). The packages that replaced a
module of the same name (``stepsim.workloads.moe``, ``stepsim.results``, ``stepsim.demo``) forward the old
module's names the same way through :func:`moved_attribute`.

Why a finder rather than files at the old paths: the top of the package holds only packages
(docs/architecture.md), and ``stepsim.simulate`` must stay the function of the top-level API too (the stand-in of
a module whose function the top level exports is callable as that function, as ``stepsim.optimize`` is).
Nothing here imports a module of a higher layer: every target is a string, imported on first use.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

#: removed in the release after this one
REMOVAL = "will be removed in the next release"

#: old module path -> new module path (``git log --summary db78d60 6c307e0 4c01f06``)
MOVED: dict[str, str] = {
    "stepsim.simulate": "stepsim.simulation.simulate",
    "stepsim.timeline": "stepsim.simulation.timeline",
    "stepsim.timeline_export": "stepsim.simulation.timeline_export",
    "stepsim.records": "stepsim.results.records",
    "stepsim.hardware": "stepsim.base.hardware",
    "stepsim.errors": "stepsim.base.errors",
    "stepsim.defaults": "stepsim.base.defaults",
    "stepsim.display": "stepsim.base.display",
    "stepsim.outputs": "stepsim.base.outputs",
    "stepsim.progress": "stepsim.base.progress",
    "stepsim.signals": "stepsim.base.signals",
    "stepsim.forkserver": "stepsim.base.forkserver",
    "stepsim.lazy_import": "stepsim.base.lazy_import",
    "stepsim.bounds": "stepsim.analysis.bounds",
    "stepsim.deadlock_proof": "stepsim.analysis.deadlock_proof",
    "stepsim.program": "stepsim.kernels.program",
    "stepsim.reference_engine": "stepsim.kernels.reference",
    "stepsim.insight.deadlock": "stepsim.analysis.deadlock",
    "stepsim.insight.cli": "stepsim.cli.report",
    "stepsim.passes.channels": "stepsim.graph.channels",
    "stepsim.passes.depths_file": "stepsim.graph.depths_file",
    "stepsim.passes.cli": "stepsim.cli.size_fifos",
    "stepsim.kernels.cli": "stepsim.cli.cache",
    "stepsim.kernels.routing_draws": "stepsim.kernels.serve_fast",
    "stepsim.optimize.cli": "stepsim.cli.optimize",
    "stepsim.reproduce.cli": "stepsim.cli.reproduce",
    "stepsim.trace_io.cli": "stepsim.cli.trace",
    "stepsim.workloads.cli": "stepsim.cli.run",
    "stepsim.workloads.models": "stepsim.models.presets",
    "stepsim.workloads.models_cli": "stepsim.cli.models",
    "stepsim.workloads.traces": "stepsim.trace_io.load",
    "stepsim.server": "stepsim.cli.server",
    "stepsim.server.cli": "stepsim.cli.server",
    "stepsim.server.client": "stepsim.cli.server_client",
    "stepsim.server.daemon": "stepsim.cli.server_daemon",
    "stepsim.sweep": "stepsim.batch",
    **{f"stepsim.sweep.{name}": f"stepsim.batch.{name}" for name in (
        "config", "dask_executor", "executors", "forkserver_preload", "grid", "rows", "runner", "store", "summary",
        "tasks")},
    "stepsim.sweep.cli": "stepsim.cli.sweep",
}

#: old module whose function the top-level API exports: its stand-in is callable as that function
CALLABLE = {"stepsim.simulate": "simulate"}

#: packages that replaced a module of the same name -> the module that now holds the old module's names
MOVED_NAMES: dict[str, str] = {
    "stepsim.results": "stepsim.base.files",
    "stepsim.demo": "stepsim.demo.moe_tiling",
    **{f"stepsim.workloads.{kind}": f"stepsim.workloads.{kind}.build"
       for kind in ("attention", "decoder", "moe", "program", "swiglu")},
}


def message(old: str, new: str) -> str:
    """The warning's text: the old path, the new one, and when the old one goes."""
    return f"{old} is deprecated and {REMOVAL}: use {new}"


class _Alias(types.ModuleType):
    """The module at an old path: every attribute read from the module at the new one."""

    def __init__(self, name: str, target: str) -> None:
        super().__init__(name)
        self.__dict__["_target"] = target

    def _module(self) -> types.ModuleType:
        return importlib.import_module(self.__dict__["_target"])

    def __getattr__(self, attribute: str):
        return getattr(self._module(), attribute)

    def __dir__(self) -> list[str]:
        return dir(self._module())

    def __call__(self, *args, **kwargs):
        function = CALLABLE.get(self.__name__)
        if function is None:
            raise TypeError(f"'module' object {self.__name__} is not callable")
        return getattr(self._module(), function)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<deprecated alias {self.__name__!r} of module {self.__dict__['_target']!r}>"


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        target = MOVED[spec.name]
        # stacklevel 2 is the import machinery's caller: warnings skips importlib's frames, so the warning
        # names the user's import line
        warnings.warn(message(spec.name, target), DeprecationWarning, stacklevel=2)
        importlib.import_module(target)  # a missing target fails here, at the import
        return _Alias(spec.name, target)

    def exec_module(self, module) -> None:
        """Nothing to run: the stand-in reads the real module."""


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name not in MOVED:
            return None
        # a package's stand-in is a package too, so its old submodules import (they are in MOVED themselves)
        return importlib.machinery.ModuleSpec(name, _LOADER, is_package=any(k.startswith(name + ".") for k in MOVED))


_LOADER = _Loader()
_FINDER = _Finder()


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once): before the path finder, which would otherwise find the
    new packages' files under an old name (``stepsim.sweep.config`` below a stand-in of ``stepsim.batch``)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def moved_attribute(package: str, name: str):
    """``package.name`` for a name the module ``package`` had before it became a package: read from the module
    that holds it now, with a ``DeprecationWarning`` (once: the name is then kept in the package, as
    ``from package import name`` reads it twice); an unknown name is the usual AttributeError."""
    target = MOVED_NAMES[package]
    if not name.startswith("__"):
        module = importlib.import_module(target)
        if hasattr(module, name):
            warnings.warn(message(f"{package}.{name}", f"{target}.{name}"), DeprecationWarning, stacklevel=3)
            value = getattr(module, name)
            setattr(sys.modules[package], name, value)
            return value
    raise AttributeError(f"module {package!r} has no attribute {name!r}")
