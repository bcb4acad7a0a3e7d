"""Cached kernel libraries that load without parsing their LLVM bitcode (used by :mod:`stepsim.kernels.target`).

numba caches a compiled library as its machine code plus the LLVM bitcode of the whole library, and parses that
bitcode on every load (33-46 ms for the engine's event loop, 0.45 MB) for two uses: the names of the symbols the
library defines, which the JIT engine must know before it looks any up, and linking the library into code compiled
later (which a warm ``stepsim run`` never does). Here:

* the names come from a list kept beside numba's cache files, ``stepsim-symbols-<sha256 of the bitcode>.json``
  (:func:`defined_symbols`), written when numba saves the library (:func:`save_symbols`) or, for a library saved
  without one, at its first load. A list is named after what it is derived from, written once (atomically) and
  never changed: processes cannot race on one, and a stale one is never read (other bitcode, other name);
* the bitcode is parsed when something links the library (:func:`lazy_linking_library`).

The names are exactly those numba would collect (``tests/kernels/test_target.py`` compares them, and links a
lazily loaded kernel into new jitted code).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os

_lazy_classes: dict = {}


def lazy_linking_library(base: type, folder: str) -> type:
    """A subclass of ``base`` (numba's JIT code library class) whose cached libraries load with the symbol names
    of :func:`defined_symbols` and parse their bitcode only when linked (module docstring); one per base class
    and cache folder. ``base`` itself when this numba lacks the internals the subclass relies on."""
    key = (base, folder)
    if key in _lazy_classes:
        return _lazy_classes[key]
    if not all(hasattr(base, name) for name in ("_unserialize", "_get_module_for_linking", "_set_compiled_object",
                                                 "_finalize_final_module", "enable_object_caching")):
        _lazy_classes[key] = base
        return base
    import llvmlite.binding as ll

    class LazyLinkingLibrary(base):
        _linking_bitcode = None

        @classmethod
        def _unserialize(cls, codegen, state):
            # numba's CPUCodeLibrary._unserialize for object code, with the bitcode kept instead of parsed
            name, kind, data = state
            if kind != "object" or not hasattr(codegen._engine, "_defined_symbols"):
                return super()._unserialize(codegen, state)
            object_code, bitcode = data
            library = codegen.create_library(name)
            library.enable_object_caching()
            library._set_compiled_object(object_code)
            library._linking_bitcode = bitcode
            library._finalize_final_module()
            names, module = defined_symbols(bitcode, folder)
            library._shared_module = module  # parsed here only when the names were not on file yet
            codegen._engine._defined_symbols |= names
            return library

        def _get_module_for_linking(self):
            if self._shared_module is None and self._linking_bitcode is not None:
                self._shared_module = ll.parse_bitcode(self._linking_bitcode)
            return super()._get_module_for_linking()

    _lazy_classes[key] = LazyLinkingLibrary
    return LazyLinkingLibrary


def defined_symbols(bitcode: bytes, folder: str | None):
    """``(names, module)``: the symbols the LLVM bitcode module ``bitcode`` defines (:func:`module_symbols`),
    and the parsed module, or None when the names were read from their list in ``folder`` (written here if
    missing; an unwritable folder only means parsing again next time)."""
    path = symbols_path(folder, bitcode) if folder else None
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                return set(json.load(f)), None
        except (OSError, ValueError):
            pass
    import llvmlite.binding as ll

    module = ll.parse_bitcode(bitcode)
    names = module_symbols(module)
    if path:
        _write_symbols(path, names)
    return names, module


def save_symbols(folder: str, module) -> None:
    """Keep the symbol list of a library numba just saved into ``folder``; ``module``: its module for linking,
    whose bitcode numba saved (nothing happens when the folder is not writable)."""
    _write_symbols(symbols_path(folder, module.as_bitcode()), module_symbols(module))


def module_symbols(module) -> set[str]:
    """The symbols an LLVM module defines: its functions and global variables that are not declarations, as
    numba's ``JitEngine._load_defined_symbols`` collects them."""
    return {gv.name for group in (module.functions, module.global_variables) for gv in group
            if not gv.is_declaration}


def symbols_path(folder: str, bitcode: bytes) -> str:
    """Where :func:`defined_symbols` keeps the symbol names of ``bitcode``."""
    return os.path.join(folder, f"stepsim-symbols-{hashlib.sha256(bitcode).hexdigest()}.json")


def _write_symbols(path: str, names: set[str]) -> None:
    """Write the list atomically (a temporary file renamed into place); nothing when the folder is not
    writable (a later load parses the bitcode instead)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(sorted(names), f)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
