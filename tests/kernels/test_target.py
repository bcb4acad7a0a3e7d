"""Loading cached kernels without numba's full CPU-target set-up (stepsim.kernels.target.load_cached).

Each check runs in a fresh interpreter, since what is under test is what a new process imports and loads.
``numba.np.arraymath`` stands for numba's lowering registries: the full set-up imports it, a cache hit must not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from stepsim.kernels.api import _engine, _ensure_compiled

#: a child process reporting what loading the engine's kernels did, and one simulation's exact counts
ENGINE_CHILD = """
import json, sys
from stepsim.kernels import api
from stepsim.kernels.warm import warm_program
engine = api._engine()
api._ensure_compiled(engine)
loop = engine.event_loop.stats
res = api.run(warm_program())
registries = "numba.np.arraymath" in sys.modules
allocator = "numba.np.arrayobj" in sys.modules
from numba.core.runtime import rtsys
runtime = rtsys._init
import numba, numpy as np  # the process's own jitted code afterwards: numba sets its target up then

@numba.njit
def total(a):
    return np.sum(a * 2)

print(json.dumps({"registries": registries, "scipy_linalg": "scipy.linalg" in sys.modules,
                  "allocator": allocator, "runtime": runtime, "hits": sum(loop.cache_hits.values()), "misses": sum(loop.cache_misses.values()),
                  "counts": [int(res.cycles), int(res.events), int(res.fires), int(res.bytes_read),
                             int(res.bytes_written)], "own_jit": int(total(np.arange(4)))}))
"""

#: a tiny allocating kernel (needs numba's runtime, unlike the engine's) in its own file, so numba can cache it
TINY_KERNEL = """
import numba
import numpy as np
from stepsim.kernels.jit import _cached

@_cached(numba.njit())  # cached as stepsim's kernels are
def ramp(n):
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        out[i] = i * i
    return out
"""

TINY_CHILD = """
import json, sys
if sys.argv[1] == "own":  # a process stepsim owns (a command, a pool worker)
    from stepsim.kernels.target import own_process

    own_process()
import llvmlite.binding as ll

parsed = []
parse_bitcode = ll.parse_bitcode
ll.parse_bitcode = lambda *args: parsed.append(1) or parse_bitcode(*args)
import tiny_kernel
values = tiny_kernel.ramp(5).tolist()
stats = tiny_kernel.ramp.stats
arraymath = sys.modules.get("numba.np.arraymath")
from numba.core.runtime import rtsys
print(json.dumps({"registries": arraymath is not None, "blas": arraymath and arraymath._HAVE_BLAS,
                  "scipy_linalg": "scipy.linalg" in sys.modules, "runtime": rtsys._init, "values": values,
                  "bitcode_parses": len(parsed),
                  "hits": sum(stats.cache_hits.values()), "misses": sum(stats.cache_misses.values())}))
"""


def _child(code: str, *args: str, cwd=None, **env) -> dict:
    """Run ``code`` in a fresh interpreter (argv ``args``, working directory ``cwd``, ``env`` added to the
    environment); its JSON output."""
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd,
                          env=dict(os.environ, **env), timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_cached_engine_loads_without_numba_registries():
    """With the kernels cached, a new process loads them (one hit, no miss) without numba's registries, its
    allocator module, its runtime or SciPy's linear algebra, and simulates exactly what this process
    simulates; jitted code of its own compiles afterwards as usual."""
    from stepsim.kernels.api import run
    from stepsim.kernels.warm import warm_program

    _ensure_compiled(_engine())
    res = run(warm_program())
    child = _child(ENGINE_CHILD)
    assert child == {"registries": False, "scipy_linalg": False, "allocator": False, "runtime": False,
                     "hits": 1, "misses": 0,
                     "counts": [int(res.cycles), int(res.events), int(res.fires), int(res.bytes_read),
                                int(res.bytes_written)], "own_jit": 12}


def test_cache_miss_compiles_with_full_target_then_hit_loads_light(tmp_path):
    """A miss sets numba's target up in full and compiles: in a process stepsim owns without the BLAS probe
    (scipy.linalg hidden), elsewhere with it. The save writes the code's symbol list too. The next process hits and loads the same machine code (runtime
    allocation included: this kernel, unlike the engine's, uses numba's runtime) without the registries and
    without parsing LLVM bitcode, and changes no cache file."""
    (tmp_path / "tiny_kernel.py").write_text(textwrap.dedent(TINY_KERNEL))
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    values = [0, 1, 4, 9, 16]
    own = _child(TINY_CHILD, "own", **env, NUMBA_CACHE_DIR=str(tmp_path / "own"))
    assert own == {"registries": True, "blas": False, "scipy_linalg": False, "runtime": True, "values": values,
                   "bitcode_parses": 0, "hits": 0, "misses": 1}
    saved = {p: p.stat().st_mtime_ns for p in (tmp_path / "own").rglob("*") if p.is_file()}
    assert sorted(p.suffix for p in saved) == [".json", ".nbc", ".nbi"]  # the symbol list comes with the code
    hit = _child(TINY_CHILD, "own", **env, NUMBA_CACHE_DIR=str(tmp_path / "own"))
    assert hit == {"registries": False, "blas": None, "scipy_linalg": False, "runtime": True, "values": values,
                   "bitcode_parses": 0, "hits": 1, "misses": 0}
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "own").rglob("*") if p.is_file()} == saved
    library_user = _child(TINY_CHILD, "library", **env, NUMBA_CACHE_DIR=str(tmp_path / "library"))
    assert library_user == {"registries": True, "blas": True, "scipy_linalg": True, "runtime": True,
                            "values": values, "bitcode_parses": 0, "hits": 0, "misses": 1}


#: a child importing the kernels' numba: argv[1] "own" declares the process stepsim's own first
IMPORT_CHILD = """
import json, sys
if sys.argv[1] == "own":
    from stepsim.kernels.target import own_process

    own_process()
import stepsim.kernels.jit
from numba.core import config
imported = {name: name in sys.modules for name in ("scipy", "yaml")}
import scipy, yaml  # importable afterwards
print(json.dumps({**imported, "numba_reads_yaml": config._HAVE_YAML, "boundscheck": config.BOUNDSCHECK}))
"""


def test_own_process_imports_numba_without_check_only_modules(tmp_path):
    """A process stepsim owns imports numba without SciPy (a version check) and PyYAML (a config-file reader),
    unless a ``.numba_config.yaml`` is in its working directory, which numba then reads as usual; both stay
    importable afterwards. Any other process imports numba exactly as numba does."""

    plain, with_config = tmp_path / "plain", tmp_path / "with_config"
    plain.mkdir()
    with_config.mkdir()
    (with_config / ".numba_config.yaml").write_text("boundscheck: 1\n")
    assert _child(IMPORT_CHILD, "own", cwd=plain) == {"scipy": False, "yaml": False, "numba_reads_yaml": False, "boundscheck": None}
    assert _child(IMPORT_CHILD, "own", cwd=with_config) == {"scipy": False, "yaml": True, "numba_reads_yaml": True, "boundscheck": 1}
    assert _child(IMPORT_CHILD, "library", cwd=plain) == {"scipy": True, "yaml": True, "numba_reads_yaml": True, "boundscheck": None}


#: a child loading the engine (symbol lists on file), then linking a cached kernel into its own jitted code
LAZY_LINKING_CHILD = """
import json
import llvmlite.binding as ll

parsed = []
parse_bitcode = ll.parse_bitcode
ll.parse_bitcode = lambda *args: parsed.append(1) or parse_bitcode(*args)
from stepsim.kernels import api

engine = api._engine()
api._ensure_compiled(engine)
parses_on_load = len(parsed)
library = engine.event_loop.overloads[engine.event_loop.signatures[0]].library
known = library._codegen._engine._defined_symbols
module = library._get_module_for_linking()  # parsed now, on first use
defined = {gv.name for group in (module.functions, module.global_variables) for gv in group
           if not gv.is_declaration}
import numba
from stepsim.kernels.units_common import pmu_cycles

@numba.njit
def reads(nbytes, pmu_bw):
    return pmu_cycles(nbytes, pmu_bw)

value = reads(1000, 64)
print(json.dumps({"parses_on_load": parses_on_load, "parses_to_link": len(parsed) - parses_on_load,
                  "defined_known": defined <= known, "defined": len(defined), "reads": value,
                  "callee_hits": sum(pmu_cycles.stats.cache_hits.values())}))
"""


def test_cached_library_links_lazily_with_exact_symbols():
    """A process loading the cached engine parses no LLVM bitcode (the symbol names come from the lists
    stepsim.kernels.cached_library keeps beside the cache), yet the JIT engine knows every symbol the library defines,
    and the library still links into code compiled afterwards (its bitcode parsed then, once)."""
    from stepsim.kernels.units_common import pmu_cycles

    _ensure_compiled(_engine())
    _child(LAZY_LINKING_CHILD)  # writes the symbol lists if this cache has none yet
    child = _child(LAZY_LINKING_CHILD)
    assert child["defined"] > 100
    assert child == {"parses_on_load": 0, "parses_to_link": 2, "defined_known": True, "defined": child["defined"],
                     "reads": pmu_cycles(1000, 64), "callee_hits": 1}
    assert pmu_cycles(1000, 64) == 16


def test_defined_symbols_file_holds_exactly_the_parsed_names(tmp_path):
    """The symbol list is parsed once, written beside the cache under the bitcode's digest, and read back as
    exactly the names a parse gives; without a writable folder every call parses."""
    import hashlib

    from stepsim.kernels.cached_library import defined_symbols

    engine = _engine()
    _ensure_compiled(engine)
    bitcode = engine.event_loop.overloads[engine.event_loop.signatures[0]].library._get_module_for_linking() \
        .as_bitcode()
    names, module = defined_symbols(bitcode, str(tmp_path))
    assert module is not None
    assert names == {gv.name for group in (module.functions, module.global_variables) for gv in group
                     if not gv.is_declaration}
    assert [p.name for p in tmp_path.iterdir()] == [f"stepsim-symbols-{hashlib.sha256(bitcode).hexdigest()}.json"]
    assert defined_symbols(bitcode, str(tmp_path)) == (names, None)
    missing = str(tmp_path / "absent")
    again, parsed = defined_symbols(bitcode, missing)
    assert again == names and parsed is not None
    assert not os.path.exists(missing)


#: a child importing the tiny kernel, editing its file before the first call, then calling it
EDITED_CHILD = """
import hashlib, json, sys
from pathlib import Path
import tiny_kernel

path = Path(tiny_kernel.__file__)
digest = hashlib.sha256(path.read_bytes()).digest()
path.write_text(path.read_text() + "# edited after the import\\n")
values = tiny_kernel.ramp(3).tolist()
stamp = tiny_kernel.ramp._cache._cache_file._source_stamp
print(json.dumps({"values": values, "stamp_of_imported_source": stamp == digest}))
"""


def test_cache_built_on_first_use_is_stamped_with_the_imported_source(tmp_path):
    """A kernel's cache is built on its first call but stamped with its source file as imported, as with
    ``cache=True``: editing the file in between must not let the process load code of the edited source."""
    (tmp_path / "tiny_kernel.py").write_text(textwrap.dedent(TINY_KERNEL))
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    assert _child(EDITED_CHILD, **env, NUMBA_CACHE_DIR=str(tmp_path / "cache")) == {
        "values": [0, 1, 4], "stamp_of_imported_source": True}
