"""``depths.toml``: every branch that writes it gives a file stepsim reads back (as TOML and as depths, with the
permissions of other outputs), and a file applied to a run it does not fit is refused or warned about, with the
reason, every time (the cut, foreign, edited and huge files of the audit of issue 31)."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest

from stepsim.cli import main
from stepsim.graph.depths_file import read_depths_file
from stepsim.passes import size_fifos
from stepsim.passes.depths_writer import write_depths_file
from stepsim.trace_io.synthetic import synthetic_routing
from stepsim.workloads.config import workload_from_config

E = "stepsim: error: "
W = "stepsim: warning: "
MOE = ["moe", "--model", "custom", "--hidden", "32", "--intermediate", "64", "--experts", "32", "--top-k", "4",
       "--tile-n", "32", "--channel-depth", "2"]


def _routing(path: Path, seed: int, **skew) -> Path:
    """A B=1024 routing trace; skewed (``skew="dirichlet", alpha=0.3``), MOE deadlocks at its default depth 2 (so
    the sizing keeps a fix)."""
    table = synthetic_routing(1024, 32, 4, seed=seed, **skew)
    np.savez(path, data=np.stack(table.column("expert_ids").to_numpy(zero_copy_only=False)).astype(np.int64))
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("depths")
    _routing(d / "skewed.npz", 1, skew="dirichlet", alpha=0.3)
    _routing(d / "other.npz", 2)  # uniform: the depths sized on the skewed trace finish on it
    return d


@pytest.fixture(scope="module")
def deadlock_fix_file(folder):
    """size-fifos where the default depth deadlocks: the branch that writes ``[sizing.deadlock_fix_channels]``."""
    out = folder / "fix.toml"
    assert main(["size-fifos", *MOE, "--trace", str(folder / "skewed.npz"), "--out", str(out), "--json"]) == 0
    return out


@pytest.fixture(scope="module")
def swiglu_file(folder):
    """size-fifos of a workload that reads no trace, whose default depth finishes (no deadlock fix)."""
    out = folder / "swiglu.toml"
    assert main(["size-fifos", "swiglu", "--out", str(out), "--json"]) == 0
    return out


def _mode(path: Path) -> int:
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask  # like every other output (not mkstemp's 0600)
    return path.stat().st_mode & 0o777


# --- every branch that writes reads back --------------------------------------------------------------------
def test_a_deadlock_fix_is_written_as_toml_and_the_file_runs(deadlock_fix_file, folder, capsys):
    capsys.readouterr()
    data = tomllib.loads(deadlock_fix_file.read_text())
    fix = data["sizing"]["deadlock_fix_channels"]
    assert len(fix) == 10 and set(fix.values()) == {3}  # default depth 2 + 1, as a TOML table (not a dict repr)
    depths = read_depths_file(deadlock_fix_file)
    assert depths.trace_hashes == data["traces"]["sha256"] and len(depths.trace_hashes) == 1
    assert all(depths.channels[name] >= 3 for name in fix)
    _mode(deadlock_fix_file)
    assert main(["run", *MOE, "--trace", str(folder / "skewed.npz"), "--fifo-depths", str(deadlock_fix_file),
                 "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""  # the trace it was sized on: no warning
    assert f'"cycles": {data["sizing"]["cycles"]},' in captured.out


def test_a_file_without_traces_or_fix_reads_back_and_runs(swiglu_file, capsys):
    capsys.readouterr()
    data = tomllib.loads(swiglu_file.read_text())
    assert data["traces"]["sha256"] == [] and data["sizing"]["deadlock_fix_channels"] == {}
    _mode(swiglu_file)
    assert main(["run", "swiglu", "--fifo-depths", str(swiglu_file), "--json"]) == 0
    assert f'"cycles": {data["sizing"]["cycles"]},' in capsys.readouterr().out


def test_a_file_sized_from_python_without_a_config_reads_back(tmp_path):
    # a Workload (not a config): [workload] has no config key, the trace hash is of the routing array
    workload = workload_from_config({"workload": "swiglu", "tile_m": 16, "tile_n": 16})
    path = write_depths_file(size_fifos(workload), tmp_path / "api.toml")
    data = tomllib.loads(path.read_text())
    assert "config" not in data["workload"]
    depths = read_depths_file(path)
    assert depths.config is None and depths.channels == data["channels"]
    _mode(path)


# --- files that do not fit the run --------------------------------------------------------------------------
def _edited(source: Path, dest: Path, edit) -> Path:
    dest.write_text(edit(source.read_text()))
    return dest


def _cut(text: str) -> str:
    """Keep the first third of the [channels] lines."""
    head, channels = text.split("[channels]\n")
    lines = channels.splitlines()
    return head + "[channels]\n" + "\n".join(lines[:len(lines) // 3]) + "\n"


def _huge(text: str) -> str:
    return re.sub(r'("Partition_5\[0\]" = )\d+', r"\g<1>1000000000000", text)


def _renamed(text: str) -> str:
    return text.replace('"Partition_5[0]" =', '"Partition_5[99]" =')


CASES = [
    # (edit of fix.toml, the exact last line of stderr)
    (_cut, E + "{p}: gives depths for 269 of the graph's 809 channels; missing 'Flatten_238[0]', "
               "'LinearOffChipLoad_239[0]', 'Flatten_240[0]' and 537 more (a cut or edited file?); write it again with "
               "stepsim size-fifos"),
    (_huge, E + "{p}: [channels] 'Partition_5[0]' = 1,000,000,000,000 is deeper than stepsim allows "
                "(2,147,483,647, the limit of --channel-depth); size the FIFOs with stepsim size-fifos"),
    (_renamed, E + "{p}: gives depths for 808 of the graph's 809 channels; missing 'Partition_5[0]' (a cut or "
                   "edited file?); write it again with stepsim size-fifos"),
]


@pytest.mark.parametrize("edit, last", CASES, ids=[c[0].__name__ for c in CASES])
def test_a_file_that_does_not_fit_is_refused_with_its_reason(deadlock_fix_file, folder, tmp_path, capsys, edit,
                                                              last):
    path = _edited(deadlock_fix_file, tmp_path / f"{edit.__name__}.toml", edit)
    status = main(["run", *MOE, "--trace", str(folder / "skewed.npz"), "--fifo-depths", str(path)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert (status, err.splitlines()[-1]) == (2, last.format(p=path))


def test_a_file_with_an_unknown_channel_is_refused(deadlock_fix_file, folder, tmp_path, capsys):
    path = _edited(deadlock_fix_file, tmp_path / "extra.toml", lambda t: t + '"Map_99999[0]" = 4\n')
    assert main(["run", *MOE, "--trace", str(folder / "skewed.npz"), "--fifo-depths", str(path)]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        E + f"{path}: names 1 channel(s) graph moe-custom-static does not have: 'Map_99999[0]'; write it again "
            f"with stepsim size-fifos")


def test_a_file_sized_on_another_trace_warns_every_time(deadlock_fix_file, folder, capsys):
    capsys.readouterr()
    sized = read_depths_file(deadlock_fix_file).trace_hashes[0][:12]
    other = folder / "other.npz"
    from stepsim.base.files import trace_sha256

    warning = (W + f"{deadlock_fix_file}: sized on another trace (sha256 {sized}) than this run's {other} (sha256 "
                   f"{trace_sha256(other)[:12]}); its depths may run slower or deadlock here; size this trace with "
                   f"stepsim size-fifos")
    for _ in range(2):  # in one process too (a command server runs many commands): every time
        status = main(["run", *MOE, "--trace", str(other), "--fifo-depths", str(deadlock_fix_file), "--json"])
        err = capsys.readouterr().err.splitlines()
        assert (status, err) == (0, [warning])
