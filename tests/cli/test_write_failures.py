"""Writing fails after the work (a full disk, a read-only folder): every writer ends in one line naming the path
and the OS's reason, exit status 2, no traceback, and leaves each output complete or absent.

Two tables. The first injects the failure at the lowest level every writer passes through (``os.fsync`` of the
written temp file raises ENOSPC, as it does on a file system that allocates late); it runs everywhere. The second
writes into a real, full tmpfs (and a read-only one), where the failure comes from the write itself (pyarrow,
matplotlib, json); it needs root to mount, and skips, saying why, without.
"""

from __future__ import annotations

import errno
import functools
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from stepsim.cli import main

E = "stepsim: error: "
FULL = os.strerror(errno.ENOSPC)  # "No space left on device"
READ_ONLY = os.strerror(errno.EROFS)

SWEEP = """
workload = "swiglu"
out = "{out}"
mode = "simulate"
[axes]
tile_n = [16, 32]
"""


def _deadlocking_trace(folder: Path) -> Path:
    """A skewed routing trace on which a small MoE with 2-deep FIFOs deadlocks (tests/timeline uses it too)."""
    from stepsim.trace_io.synthetic import synthetic_routing

    table = synthetic_routing(1024, 32, 4, seed=1, skew="dirichlet", alpha=0.3)
    trace = folder / "skewed.npz"
    np.savez(trace, data=np.stack(table.column("expert_ids").to_numpy(zero_copy_only=False)).astype(np.int64))
    return trace


DEADLOCK = ("run moe --model custom --hidden 32 --intermediate 64 --experts 32 --top-k 4 --trace {t}/skewed.npz "
            "--tile-n 32 --channel-depth 2")


def _leftovers(folder: Path, keep: set) -> list[str]:
    """Every file or folder under ``folder`` except ``keep`` (names relative to it): outputs, temp files."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if str(p.relative_to(folder)) not in keep)


def _run(argv: list[str], capsys) -> tuple[int, list[str]]:
    status = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return status, err.splitlines()


# (command line with {d} the output folder, the exact last line of stderr); every case exits 2 and leaves nothing
INJECTED_CASES = [
    ("run swiglu --out {d}/run", E + f"cannot write {{d}}/run: {FULL}"),
    ("run swiglu --out {d}/r.parquet", E + f"cannot write {{d}}/r_units.parquet: {FULL}"),
    ("metrics swiglu --out {d}/m.parquet", E + f"cannot write {{d}}/m.parquet: {FULL}"),
    ("run swiglu --timeline {d}/t.json", E + f"cannot write {{d}}/t.json: {FULL}"),
    ("run swiglu --timeline {d}/t.json.gz", E + f"cannot write {{d}}/t.json.gz: {FULL}"),
    (DEADLOCK + " --deadlock-report {d}/dl.json", E + f"cannot write {{d}}/dl.json: {FULL}"),
    ("size-fifos swiglu --out {d}/depths.toml", E + f"cannot write {{d}}/depths.toml: {FULL}"),
]


def _enospc(fd):
    raise OSError(errno.ENOSPC, FULL)


@pytest.fixture
def disk_full_on_fsync(monkeypatch):
    """Every fsync of a written file fails with ENOSPC (a full disk found at the flush)."""
    monkeypatch.setattr(os, "fsync", _enospc)


@pytest.mark.parametrize("command, last", INJECTED_CASES, ids=[c[0].split(" --")[0] + " " + c[0].split()[-1]
                                                                 for c in INJECTED_CASES])
def test_a_failed_write_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, capsys, command, last):
    _deadlocking_trace(tmp_path)
    d = tmp_path / "out"
    d.mkdir()
    argv = command.format(d=d, t=tmp_path).split()
    monkeypatch.setattr(os, "fsync", _enospc)
    status, err = _run(argv, capsys)
    assert (status, err[-1]) == (2, last.format(d=d))
    assert _leftovers(d, set()) == []  # no output, no temp file, no empty run folder


def test_a_sweep_that_cannot_write_its_rows_stops_in_one_line(tmp_path, capsys, disk_full_on_fsync):
    out = tmp_path / "results"
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(SWEEP.format(out=out))
    status, err = _run(["sweep", str(sweep), "--jobs", "1", "--no-progress"], capsys)
    assert status == 2
    assert err[-1].startswith(E + f"cannot write {out}/workload=swiglu/") and err[-1].endswith(f".parquet: {FULL}")
    # no row, no table without its row, no temp file (the lock file stays: it is how sweeps exclude each other)
    assert [p.name for p in out.rglob("*") if p.is_file()] == [".stepsim-sweep.lock"]


def test_optimize_that_cannot_write_stops_in_one_line(shared_traces, tmp_path, capsys, disk_full_on_fsync):
    window = shared_traces / "kv_lengths" / "b16" / "conv_stdev0174_1845_1860.npy"
    out = tmp_path / "opt"
    status, err = _run(["optimize", "attention", "--trace", str(window), "--jobs", "1", "--out", str(out),
                        "--no-progress"], capsys)
    assert status == 2
    assert err[-1].startswith(E + f"cannot write {out}/") and err[-1].endswith(f": {FULL}")
    assert [p.name for p in out.rglob("*") if p.is_file()] == [".stepsim-sweep.lock"]


def test_reproduce_that_cannot_write_stops_in_one_line(shared_traces, tmp_path, capsys, monkeypatch):
    from stepsim.reproduce.driver import reproduce

    monkeypatch.setattr("stepsim.reproduce.driver.reproduce", functools.partial(
        reproduce, options={"validation": {"tile_m": (64,), "tile_n": (64, 128)}}))
    monkeypatch.setattr(os, "fsync", _enospc)
    out = tmp_path / "repro"
    status, err = _run(["reproduce", "validation", "--traces", str(shared_traces), "--out", str(out)], capsys)
    assert (status, err[-1]) == (2, E + f"cannot write {out}/validation.parquet: {FULL}")
    assert [p.name for p in out.rglob("*") if p.is_file()] == []


def test_report_png_that_cannot_be_written_is_one_line(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    assert main(["run", "swiglu", "--out", str(run)]) == 0
    capsys.readouterr()
    monkeypatch.setattr(os, "fsync", lambda fd: _raise(OSError(errno.EROFS, READ_ONLY)))
    png = tmp_path / "figs" / "report.png"
    status, err = _run(["report", str(run), "--png", str(png)], capsys)
    assert (status, err[-1]) == (2, E + f"cannot write {png}: {READ_ONLY}")
    assert not png.exists() and list(png.parent.iterdir()) == []


def test_the_run_folder_appears_whole_when_it_is_written(tmp_path, capsys):
    # the other side of "complete or absent": a new nested folder, built under a temp name, is renamed into place
    run = tmp_path / "a" / "b" / "run"
    assert main(["run", "swiglu", "--out", str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    written = [ln.split(": ", 1)[1] for ln in lines if ln.startswith("wrote ")]
    assert sorted(Path(p).name[:6] for p in written) == ["_chann", "_units", "part-8"]
    assert all(Path(p).is_file() and Path(p).parent == run for p in written)
    assert _leftovers(tmp_path, {"a", "a/b", "a/b/run"} | {str(Path(p).relative_to(tmp_path)) for p in written}) \
        == []
    assert oct(run.stat().st_mode & 0o777) == oct(0o777 & ~_umask())


def _raise(exc):
    raise exc


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --- a real full (and a real read-only) file system ---------------------------------------------------------
def _mount(folder: Path, options: str) -> None:
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        folder.rmdir()
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or 'mount failed'}); the injected cases "
                    "above cover the same writers")


@pytest.fixture
def full_disk(tmp_path):
    """A 256 kB tmpfs filled to the last block (a file grown until the write fails)."""
    disk = tmp_path / "disk"
    _mount(disk, "size=256k")
    try:
        fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        finally:
            os.close(fd)
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


@pytest.fixture
def read_only_disk(tmp_path):
    disk = tmp_path / "ro"
    _mount(disk, "size=64k,ro")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


FULL_DISK_CASES = [
    ("run swiglu --out {d}/run", E + f"cannot write {{d}}/run: {FULL}"),
    ("run swiglu --out {d}/r.parquet", E + f"cannot write {{d}}/r_units.parquet: {FULL}"),
    ("run swiglu --timeline {d}/t.json", E + f"cannot write {{d}}/t.json: {FULL}"),
    ("size-fifos swiglu --out {d}/depths.toml", E + f"cannot write {{d}}/depths.toml: {FULL}"),
]


@pytest.mark.parametrize("command, last", FULL_DISK_CASES, ids=[c[0].split()[-1].split("/")[-1]
                                                                for c in FULL_DISK_CASES])
def test_a_full_disk_is_one_line_and_leaves_nothing(full_disk, capsys, command, last):
    status, err = _run(command.format(d=full_disk).split(), capsys)
    assert (status, err[-1]) == (2, last.format(d=full_disk))
    assert _leftovers(full_disk, {"filler"}) == []


def test_report_png_into_a_read_only_folder_is_one_line(read_only_disk, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["run", "swiglu", "--out", str(run)]) == 0
    capsys.readouterr()
    png = read_only_disk / "report.png"
    status, err = _run(["report", str(run), "--png", str(png)], capsys)
    assert status == 2
    # checked before the report is built (stepsim.base.outputs), or at the write: either way the path and the reason
    assert err[-1] in (E + f"--png {png}: {read_only_disk} is not writable", E + f"cannot write {png}: {READ_ONLY}")
    assert list(read_only_disk.iterdir()) == []
