"""numba's CPU target set-up for stepsim's kernels: only what loading cached machine code needs.

numba sets its CPU target up in full before the first kernel it loads from the disk cache
(``Cache.load_overload`` calls ``target_context.refresh()``): it imports and installs the lowering and typing
registries of everything numba can compile (NumPy's ufuncs and linear algebra, random generators, typed
containers, ...), 0.2-0.35 s per process on the 2-core reference machine, a third of a warm
``stepsim run swiglu``. Loading cached *nopython* code needs none of it: the cache holds finished machine code,
which needs only the C helpers set up when the context is created and, for code compiled with numba's
runtime (NRT, which allocates), that runtime (a numba pull request, numba/numba#9806, proposed the same:
refresh on a cache hit only for object mode). So every kernel dispatcher gets :func:`load_cached` as its cache
loader:

* a cache hit rebuilds the cached code, exactly as numba would, after initializing the runtime if the kernel
  uses it. The engine's kernels do not (``_nrt=False``, :mod:`stepsim.kernels.jit`), which saves compiling
  NRT's own functions (about 45 ms);
* a cache miss first sets the target up in full (:func:`prepare`), then numba compiles as usual.

The libraries a hit rebuilds link lazily (:mod:`stepsim.kernels.cached_library`: no LLVM bitcode is parsed), and
each dispatcher's cache is built on its first use (:func:`cache_on_first_use`).

Results are identical either way (the same cached bytes run); ``tests/kernels/test_target.py`` checks in fresh
processes that a hit skips the registries and a miss compiles and then loads the same function.

:func:`prepare` sets the target up without its BLAS probe in processes that stepsim owns. One of the
registries, ``numba.np.arraymath``, probes for BLAS by importing ``scipy.linalg`` (0.15-0.4 s; SciPy is
installed for the FIFO-sizing LP). The engine's kernels call no BLAS routine (no ``np.dot``, ``np.linalg``,
``np.correlate`` or ``np.convolve``), so a stepsim command and the worker pool's fork server set the target up
with ``scipy.linalg`` hidden. numba then records that BLAS is missing, which changes only ``np.correlate`` and
``np.convolve`` in jitted code (a plain inner product instead of BLAS's): code those processes never run. A
program that merely imports stepsim keeps numba's own behaviour, since its own jitted code may use them.

For the same reason those processes import numba (:func:`import_numba`) without the two modules numba imports
only to check something: SciPy (for its version) and PyYAML (to read a ``.numba_config.yaml`` in the working
directory, kept when such a file is there). Together 30-50 ms of a 0.6 s warm ``stepsim run``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys

_own_process = False

#: modules numba imports at its own import only for a check (see the module docstring)
CHECK_ONLY_IMPORTS = ("scipy", "yaml")


def own_process() -> None:
    """Declare this process stepsim's own (a command, a pool worker): it imports numba without its check-only
    imports, and its kernel set-up skips the BLAS probe (module docstring). Call it before numba is imported."""
    global _own_process
    _own_process = True


def import_numba():
    """``import numba``; in a process declared :func:`own_process`, with the modules of
    :data:`CHECK_ONLY_IMPORTS` that are not imported yet hidden meanwhile (PyYAML only without a
    ``.numba_config.yaml`` here). Returns the numba module."""
    hide = [] if not _own_process or "numba" in sys.modules else \
        [name for name in CHECK_ONLY_IMPORTS if name not in sys.modules]
    if "yaml" in hide and os.path.isfile(".numba_config.yaml"):
        hide.remove("yaml")
    for name in hide:
        sys.modules[name] = None  # importing it raises ImportError, which numba takes as "not installed"
    try:
        import numba
    finally:
        for name in hide:
            if sys.modules.get(name, False) is None:
                del sys.modules[name]
    return numba


def prepare() -> None:
    """Set numba's CPU target up in full (before compiling); in a process declared :func:`own_process` with
    ``scipy.linalg`` not yet imported, without importing it. Idempotent (numba refreshes once)."""
    from numba.core.registry import cpu_target

    hide = _own_process and "scipy.linalg" not in sys.modules
    if hide:
        sys.modules["scipy.linalg"] = None  # importing it, or any of its modules, raises ImportError
    try:
        cpu_target.target_context.refresh()
    except ImportError:
        if not hide:
            raise
        del sys.modules["scipy.linalg"]  # a numba that needs scipy.linalg beyond the probe: set up as usual
        hide = False
        cpu_target.target_context.refresh()
    finally:
        if hide and sys.modules.get("scipy.linalg", False) is None:
            del sys.modules["scipy.linalg"]


def cache_on_first_use(dispatcher) -> None:
    """Give ``dispatcher`` (made without ``cache=True``) numba's disk cache when it first needs it, with the
    light loader of :func:`load_cached`: the same as ``cache=True``, which builds the cache at decoration.

    Building a cache object locates its folder, proves it writable by creating a temporary file in it and
    hashes the source file: about 0.4 ms per kernel, 40-50 ms for the engine's ~120 kernels in every process that imports them, while
    a run with a warm cache touches only the few entry points (their callees come compiled into them). Kept
    as is under ``NUMBA_DISABLE_JIT`` (no dispatcher) or on a numba without ``enable_caching``.

    numba stamps a cache with the SHA-256 of the function's source file when it builds it, and loads only
    entries with that stamp. Built later, it would read the file as it is then: a kernel file edited between a
    process's import and its first call would let the process load machine code of the edited source under
    its old Python code. So the digest is taken now, once per file, and given to the cache when it is built.
    """
    if hasattr(dispatcher, "enable_caching") and hasattr(dispatcher, "_cache"):
        dispatcher._cache = _CacheOnFirstUse(dispatcher, _source_digest(dispatcher.py_func.__code__.co_filename))


@functools.lru_cache(maxsize=None)
def _source_digest(path: str) -> bytes | None:
    """SHA-256 of a source file as numba's cache stamps it (``caching._hash_source_file``); None if unreadable."""
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).digest()
    except OSError:
        return None


class _CacheOnFirstUse:
    """Stands in for a dispatcher's cache; the first use of any attribute builds the real one in its place,
    stamped with the source digest taken at decoration (:func:`cache_on_first_use`)."""

    __slots__ = ("_dispatcher", "_stamp")

    def __init__(self, dispatcher, stamp: bytes | None):
        self._dispatcher = dispatcher
        self._stamp = stamp

    def __getattr__(self, name):
        dispatcher = self._dispatcher
        dispatcher.enable_caching()  # dispatcher._cache = numba's FunctionCache
        cache_file = getattr(dispatcher._cache, "_cache_file", None)
        current = getattr(cache_file, "_source_stamp", None)
        if self._stamp is not None and isinstance(current, bytes) and len(current) == len(self._stamp):
            cache_file._source_stamp = self._stamp  # the same kind of stamp, of the source this process runs
        load_cached(dispatcher)
        return getattr(dispatcher._cache, name)


def load_cached(dispatcher) -> None:
    """Give ``dispatcher`` (a ``cache=True`` kernel) the light cache loader described in the module docstring.

    Keeps numba's own loader when the JIT is disabled, or when this numba's cache lacks the two internals
    numba's own ``Cache.load_overload`` is made of (``_load_overload`` and ``_guard_against_spurious_io_errors``).
    """
    cache = getattr(dispatcher, "_cache", None)
    if not (hasattr(cache, "_load_overload") and hasattr(cache, "_guard_against_spurious_io_errors")):
        return

    uses_runtime = dispatcher.targetoptions.get("_nrt", True)

    def load_overload(sig, target_context):
        # numba's Cache.load_overload with target_context.refresh() replaced by the runtime set-up that cached
        # nopython code needs; the guard turns a racing writer's partial file into a miss, as in numba. Runs
        # under numba's global compiler lock (Dispatcher.compile), like everything that creates libraries.
        if uses_runtime:
            from numba.core.runtime import rtsys

            rtsys.initialize(target_context)
        from stepsim.kernels.cached_library import lazy_linking_library

        codegen = target_context.codegen()
        previous = codegen._library_class
        codegen._library_class = lazy_linking_library(previous, cache._cache_path)
        result = None  # stays None if the guard swallows an I/O error: a miss
        try:
            with cache._guard_against_spurious_io_errors():
                result = cache._load_overload(sig, target_context)
        finally:
            codegen._library_class = previous
        if result is None:  # a miss: numba compiles next, with the target set up in full
            prepare()
        return result

    save = cache.save_overload

    def save_overload(sig, cres):
        # numba's, then the symbol list of what it saved, so that no later process parses its bitcode
        save(sig, cres)
        library = getattr(cres, "library", None)
        if hasattr(library, "_get_module_for_linking") and os.path.isdir(cache._cache_path):
            from stepsim.kernels.cached_library import save_symbols

            save_symbols(cache._cache_path, library._get_module_for_linking())

    cache.load_overload = load_overload
    cache.save_overload = save_overload
