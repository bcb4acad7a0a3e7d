"""Scale is estimated before anything is built: systems of thousands of chips load in a fraction of a second
(routes are found per source when first used), a system with more links than the engine takes, a collective with
more operators than the limit, a stack of too many layers and a sweep range of a trillion values are refused in
one line naming the flag or key, the estimate and the limit; a signal during a long pure-Python build stops the
command within seconds with its one line."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stepsim.base.system import System
from stepsim.base.system.topology import routes
from stepsim.cli import main

E = "stepsim: error: "
STEPSIM = [sys.executable, "-m", "stepsim"]


def _system(folder: Path, name: str, chips: int, topology: str) -> str:
    (folder / f"{name}.toml").write_text(f'chips = {chips}\ntopology = "{topology}"\nlink_bandwidth = 64\n'
                                         f'link_latency = 500\n')
    return f"{name}.toml"


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _system(tmp_path, "ring4096", 4096, "ring")
    _system(tmp_path, "ring1024", 1024, "ring")
    _system(tmp_path, "fc4096", 4096, "fully-connected")
    _system(tmp_path, "switch4096", 4096, "switch")
    (tmp_path / "torus.toml").write_text(
        "[[dimension]]\nsize = 64\ntopology = 'fully-connected'\nlink_bandwidth = 64\nlink_latency = 500\n"
        "[[dimension]]\nsize = 64\ntopology = 'fully-connected'\nlink_bandwidth = 64\nlink_latency = 500\n")
    (tmp_path / "huge_range.toml").write_text(
        'workload = "swiglu"\n[axes]\ntile_m = {start = 1, stop = 1000000000000, step = 1}\n')
    return tmp_path


#: (command line, exit status, the exact last line of stderr)
CASES = [
    ("run collective --system fc4096.toml --bytes 16384", 2,
     E + "fc4096.toml: topology (fully-connected of 4096) makes 16,773,120 links; the limit is 262,144 (each link "
         "is an engine unit): use a 'switch' or 'ring' topology, or fewer chips"),
    ("run collective --system torus.toml --bytes 16384", 2,
     E + "torus.toml: topology (fully-connected of 64 x fully-connected of 64) makes 516,096 links; the limit is "
         "262,144 (each link is an engine unit): use a 'switch' or 'ring' topology, or fewer chips"),
    ("run collective --system ring1024.toml --bytes 16384", 2,
     E + "--system ring1024.toml: all-reduce over 1,024 chips builds about 3,147,776 operators (3 x 1,024^2 chunks, "
         "plus the links); the limit is 65,536 (about a minute to build and simulate): use fewer chips"),
    ("run collective --system ring4096.toml --bytes 16384 --op all-gather", 2,
     E + "--system ring4096.toml: all-gather over 4,096 chips builds about 16,785,408 operators (1 x 4,096^2 chunks, "
         "plus the links); the limit is 65,536 (about a minute to build and simulate): use fewer chips"),
    ("run collective --system switch4096.toml --bytes 16384 --op reduce-scatter", 2,
     E + "--system switch4096.toml: reduce-scatter over 4,096 chips builds about 33,562,624 operators (2 x 4,096^2 "
         "chunks, plus the links); the limit is 65,536 (about a minute to build and simulate): use fewer chips"),
    ("run swiglu --layers 100000", 2,
     E + "--layers must be at most 1,024 (each one's operators are built in memory before the run), got 100000"),
    ("metrics moe --layers 2000", 2,
     E + "--layers must be at most 1,024 (each one's operators are built in memory before the run), got 2000"),
    ("run swiglu --layers 4 --pp 2 --system ring-2 --micro-batches 100000", 2,
     E + "--micro-batches must be at most 4,096 (each one's operators are built in memory before the run), got "
         "100000"),
    ("optimize moe --max-chips 1000000 --out s", 2,
     E + "--max-chips must be at most 4,096 (the most chips a system may have), got 1,000,000"),
    ("sweep huge_range.toml --out s", 2,
     E + "huge_range.toml: [axes] tile_m: range has 999,999,999,999 values; the limit is 1,000,000 per axis"),
]


@pytest.mark.parametrize("line, status, last", CASES, ids=[c[0] for c in CASES])
def test_scale_is_refused_before_building(files, capsys, line, status, last):
    start = time.monotonic()
    assert main(line.split()) == status
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == last
    assert time.monotonic() - start < 5  # refused from the estimate, not after building
    assert sorted(p.name for p in files.iterdir() if p.name.startswith(".") or p.name == "s") == []


@pytest.mark.parametrize("spec, chips, links", [("ring4096.toml", 4096, 8192), ("switch4096.toml", 4096, 8192)])
def test_a_system_of_4096_chips_loads_in_a_moment(files, spec, chips, links):
    start = time.monotonic()
    system = System.load(spec)
    assert (system.chips, len(system.links)) == (chips, links)
    assert time.monotonic() - start < 5  # was 28 s and 2.3 GB for 1,024 chips (every route tabled up front)
    if spec.startswith("ring"):  # the short way round, either direction; ties go to the earlier links
        assert system.route(0, 2) == (0, 1)
        assert system.route(0, 4095) == (8191,)  # the reverse links follow the forward ones: 8191 is chip0->chip4095
        assert len(system.route(0, 2048)) == 2048 and system.route(0, 2048)[:2] == (0, 1)
        assert len(system.route(17, 17 + 2047)) == 2047
    else:
        assert system.route(5, 9) == (10, 19)  # chip c's up-link is link 2c, its down-link 2c + 1


@pytest.mark.parametrize("preset", ["ring-4", "ring-8", "fully-connected-8", "switch-8", "torus-4x4"])
def test_routes_found_on_demand_are_the_routes_of_the_table(preset):
    system = System.preset(preset)
    table = routes(system.links, system.chips, system.chips + system.n_switches)
    assert {(s, d): system.route(s, d) for s in range(system.chips) for d in range(system.chips) if s != d} == table


def _handlers_installed(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "status", "line"), [(signal.SIGINT, 130, "stepsim: interrupted"),
                                                        (signal.SIGTERM, 143, "stepsim: terminated")])
def test_a_signal_during_a_collective_build_stops_it_at_once(tmp_path, signum, status, line):
    """A 128-chip ring all-reduce (49,408 operators, under the limit): about 15 s of pure-Python building and
    lowering before its first cycle; the signal comes 3 s in and the command ends within a bound (loose, for a
    loaded machine; measured about 0.6 s)."""
    _system(tmp_path, "ring128", 128, "ring")
    proc = subprocess.Popen([*STEPSIM, "run", "collective", "--system", "ring128.toml", "--bytes", "8192", "--out",
                             "out"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not _handlers_installed(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(3.0)
    assert proc.poll() is None, "the command ended before the signal"
    proc.send_signal(signum)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err.strip().splitlines()[-1]) == (status, line)
    assert "Traceback" not in err
    assert time.monotonic() - sent < 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ring128.toml"]
