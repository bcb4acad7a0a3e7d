"""Modules imported on first use.

sympy takes 0.3-0.4 s to import and pyarrow about 0.1 s, which is most of the start-up of a short command such as
``stepsim run swiglu --json``, whose graph has only static dimensions and which writes no Parquet. Modules that
need them refer to them through a :class:`LazyModule`, so a command that never touches a symbolic dimension or
an Arrow table never imports them (``tests/cli/test_process_startup.py`` checks which commands do).
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


class LazyModule:
    """Stands for the module ``name`` and imports it the first time one of its attributes is read.

    Every attribute read is passed on to the module (nothing is copied, so a monkeypatched attribute is seen). On
    that first read the stand-in also replaces itself by the module in the globals of every stepsim module that
    holds it: graph construction reads ``sp.<name>`` tens of thousands of times per MoE configuration, and after
    the first read those are plain module attribute look-ups again, with no forwarding in between.
    """

    #: every stand-in created so far (see :func:`import_all`)
    instances: list[LazyModule] = []

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None
        LazyModule.instances.append(self)

    def __getattr__(self, attribute: str):
        return getattr(self._module or self.module(), attribute)

    def module(self) -> ModuleType:
        """The module itself (imported now if it was not yet)."""
        if self._module is None:
            self._module = importlib.import_module(self._name)
            for holder in list(sys.modules.values()):
                if getattr(holder, "__name__", "").startswith("stepsim."):
                    namespace = vars(holder)
                    for key, value in list(namespace.items()):
                        if value is self:
                            namespace[key] = self._module
        return self._module

    def __repr__(self) -> str:
        return f"<lazily imported module {self._name!r}>"


def import_all() -> None:
    """Import every module that stands in for one now (and put them in place). The processes that fork others
    (the worker pool's fork server, the command server) call it while preloading, so a worker or command
    neither imports them again nor copies the module pages it would change by putting them in place."""
    for stand_in in LazyModule.instances:
        stand_in.module()
