"""The one place that owns numba's jit flags for the engine.

Every kernel is ``@kernel``-decorated: ``numba.njit(nogil=True)`` with numba's disk cache (as ``cache=True``, but
built on first use). Under ``NUMBA_DISABLE_JIT=1`` the decorator returns the plain Python function, so the engine
also runs (slowly) as pure Python.

numba's on-disk cache is keyed on the source file of each function only, not on the modules it calls or the
constants it reads (for instance :mod:`stepsim.kernels.abi`). To keep cached machine code from going stale,
importing this module hashes the kernel modules' sources (``KERNEL_MODULES``) and drops the package's cache files
(``__pycache__/*.nbi|*.nbc`` and the symbol lists of :mod:`stepsim.kernels.cached_library`) when the hash
changed since the last run.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from stepsim.kernels.target import cache_on_first_use, import_numba

numba = import_numba()

_HERE = Path(__file__).resolve().parent
#: modules holding kernels or constants compiled into them (changing any of them invalidates the cache)
KERNEL_MODULES = ("abi.py", "jit.py", "channels.py", "hbm.py", "values.py", "units_common.py", "units_compute.py",
                  "units_memory.py", "units_routing.py", "units_shape.py", "units_sources.py", "units_link.py",
                  "engine.py", "timeline.py", "serve_fast.py", "serve_replay.py", "serve_mapped.py", "row_sum.py",
                  "routing_windows.py", "cpu.py")


def _invalidate_stale_cache() -> None:
    digest = hashlib.sha256()
    for name in KERNEL_MODULES:
        digest.update(name.encode())
        digest.update((_HERE / name).read_bytes())
    stamp_value = digest.hexdigest()
    cache_dir = _HERE / "__pycache__"
    stamp = cache_dir / "stepsim_kernels.sha256"
    try:
        if stamp.exists() and stamp.read_text() == stamp_value:
            return
        if cache_dir.is_dir():
            for path in cache_dir.iterdir():
                if path.suffix in (".nbi", ".nbc") or path.name.startswith("stepsim-symbols-"):  # cached_library.py
                    path.unlink(missing_ok=True)
        cache_dir.mkdir(exist_ok=True)
        tmp = stamp.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(stamp_value)
        os.replace(tmp, stamp)
    except OSError:  # read-only install: numba falls back to its own cache locator
        pass


_invalidate_stale_cache()


def kernels_cached(functional: bool = False, timeline: bool = False) -> bool:
    """True if numba's disk cache holds the engine's event loop for this kind of run (so a run loads it instead
    of compiling): timing, ``functional`` (tiles carry values) and ``timeline`` (recording) runs are separate
    specializations, each compiled on its first use (about a minute each on a cold cache).

    Looks where numba puts it: beside the sources (``__pycache__``), else under ``NUMBA_CACHE_DIR``, and reads the
    signatures its index lists (:func:`cached_variants`). Only decides whether to print the "compiling once"
    notice; a wrong answer costs nothing else.
    """
    pattern = "engine.event_loop-*.nbi"
    indexes = list((_HERE / "__pycache__").glob(pattern))
    cache_dir = os.environ.get("NUMBA_CACHE_DIR")
    if cache_dir:
        indexes += list(Path(cache_dir).rglob(pattern))
    return any((functional, timeline) in cached_variants(index) for index in indexes)


def cached_variants(index: Path) -> set[tuple[bool, bool]]:
    """The (functional, timeline) specializations of the event loop that numba's cache index ``index`` lists:
    the loop's last two arguments, the functional state and the timeline buffer, are None when unused. An index
    numba could not read either lists none (numba would compile again)."""
    import pickle

    try:
        with open(index, "rb") as f:
            pickle.load(f)  # numba's version
            _, overloads = pickle.loads(f.read())  # noqa: S301 - numba's own cache index, as numba reads it
        return {(not isinstance(key[0][-2], numba.types.NoneType), not isinstance(key[0][-1], numba.types.NoneType))
                for key in overloads}
    except Exception:  # noqa: BLE001 - any unreadable index is a cold cache for the notice
        return set()


def _cached(decorate):
    """``decorate`` (a ``numba.njit(...)`` decorator without ``cache=True``) whose dispatchers use numba's disk
    cache as ``cache=True`` would, built on first use and loading cached machine code without setting numba's
    whole CPU target up (:func:`stepsim.kernels.target.cache_on_first_use`)."""

    def decorator(fn):
        dispatcher = decorate(fn)
        cache_on_first_use(dispatcher)
        return dispatcher

    return decorator


#: decorator for every kernel: compiled without numba's runtime (``_nrt=False``), so passing arrays between
#: kernels costs no reference counting and loading them needs no runtime set-up. No kernel allocates: the
#: engine's state arrays come from NumPy (``engine.new_state``)
kernel = _cached(numba.njit(nogil=True, error_model="numpy", _nrt=False))

#: like ``kernel`` but inlined into its callers at numba-IR level (only for tiny call-forwarding functions)
inline_kernel = _cached(numba.njit(nogil=True, error_model="numpy", _nrt=False, inline="always"))

#: True when numba's JIT is disabled (NUMBA_DISABLE_JIT=1)
JIT_DISABLED = bool(numba.config.DISABLE_JIT)

