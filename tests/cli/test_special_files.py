"""Special files and broken tables as inputs: a named pipe or a device (``/dev/zero``, through a symbolic link with
the right suffix) given as a trace, request, system, hardware, sweep, space, depths or model file is refused in
one line before it is opened (reading it would wait forever or never end); a CSV header or a Parquet schema that
names a column twice, and a Parquet file missing its first bytes, are one line naming the file (were library
tracebacks or multi-line messages). Exit status 2, no traceback, nothing written.

CLI cases run ``stepsim.cli.main`` in-process in a folder holding the files; each asserts the exit status and the
exact last line of stderr (a hang fails by the subprocess case's timeout, or blocks the in-process case: the
check is before any open)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stepsim.cli import main

E = "stepsim: error: "
FIFO = "is a named pipe, not a regular file"
DEVICE = "is a character device, not a regular file"
WAIT = "(reading it could wait forever)"


@pytest.fixture
def special(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("pipe.arrow", "pipe.csv", "pipe.toml", "pipe.npz"):
        os.mkfifo(tmp_path / name)
    for name in ("zero.parquet", "zero.toml", "zero.json", "zero.csv"):
        (tmp_path / name).symlink_to("/dev/zero")
    (tmp_path / "dup.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens\n"
                                      "2023-11-16 18:15:46.6805900,374,44,5\n")
    pq.write_table(pa.table([pa.array([1, 2]), pa.array([3, 4]), pa.array([5, 6]), pa.array([0.0, 1.0])],
                            names=["context_tokens", "generated_tokens", "context_tokens", "arrival"]), "dup.parquet")
    (tmp_path / "ok.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                                     "2023-11-16 18:15:47.6805900,37,4\n")
    assert main(["trace", "import", "ok.csv", "--out", "req.parquet"]) == 0
    (tmp_path / "cut.parquet").write_bytes((tmp_path / "req.parquet").read_bytes()[4:])  # its first bytes lost
    (tmp_path / "serve_sweep.toml").write_text('workload = "serve"\n[fixed]\nmodel = "qwen3-30b-a3b"\n'
                                               'requests = "pipe.csv"\niteration_latency = 0.02\n'
                                               '[axes]\nmax_seqs = [8, 16]\n')
    return tmp_path


#: (command line, exit status, the exact last line of stderr)
CASES = [
    ("trace inspect pipe.arrow", 2, E + f"pipe.arrow: {FIFO}; give a trace file {WAIT}"),
    ("trace inspect zero.parquet", 2, E + f"zero.parquet: {DEVICE}; give a trace file {WAIT}"),
    ("trace inspect /dev/zero --format parquet", 2, E + f"/dev/zero: {DEVICE}; give a trace file {WAIT}"),
    ("run moe --trace pipe.npz", 2, E + f"pipe.npz: {FIFO}; give a trace file {WAIT}"),
    ("trace import pipe.csv --out x.parquet", 2, E + f"pipe.csv: {FIFO}; give a trace file {WAIT}"),
    ("serve --model qwen3-30b-a3b --requests pipe.csv --out o --iteration-latency 0.02", 2,
     E + f"pipe.csv: {FIFO}; give a request trace file {WAIT}"),
    ("serve --model qwen3-30b-a3b --requests zero.csv --out o --iteration-latency 0.02", 2,
     E + f"zero.csv: {DEVICE}; give a request trace file {WAIT}"),
    ("sweep serve_sweep.toml --out ss", 2, E + "{d}/pipe.csv: " + f"{FIFO}; give an input file {WAIT}"),
    ("run collective --system pipe.toml", 2, E + f"pipe.toml: {FIFO}; give a system file {WAIT}"),
    ("run moe --hardware zero.toml", 2, E + f"zero.toml: {DEVICE}; give a hardware file {WAIT}"),
    ("sweep zero.toml", 2, E + f"zero.toml: {DEVICE}; give a sweep file {WAIT}"),
    ("run moe --fifo-depths pipe.toml", 2, E + f"pipe.toml: {FIFO}; give a FIFO depths file {WAIT}"),
    ("run moe --model zero.json", 2, E + f"zero.json: {DEVICE}; give a model config.json file {WAIT}"),
    ("optimize moe --space zero.toml --out opt", 2, E + f"zero.toml: {DEVICE}; give a space file {WAIT}"),
    # repeated columns, truncated Parquet
    ("trace inspect dup.csv", 2,
     E + "dup.csv: column 'ContextTokens' appears twice in the CSV header (columns 2 and 4)"),
    ("trace import dup.csv --out d.parquet", 2,
     E + "dup.csv: column 'ContextTokens' appears twice in the CSV header (columns 2 and 4)"),
    ("serve --model qwen3-30b-a3b --requests dup.csv --out o --iteration-latency 0.02", 2,
     E + "dup.csv: column 'ContextTokens' appears twice in the CSV header (columns 2 and 4)"),
    ("serve --model qwen3-30b-a3b --requests dup.parquet --out o --iteration-latency 0.02", 2,
     E + "dup.parquet: column 'context_tokens' appears twice in the parquet schema (columns 1 and 3)"),
    ("trace inspect cut.parquet", 2,
     E + "cut.parquet: cannot read parquet data: Couldn't deserialize thrift: TProtocolException: Invalid data; "
         "Deserializing page header failed."),
    ("serve --model qwen3-30b-a3b --requests cut.parquet --out o --iteration-latency 0.02", 2,
     E + "cut.parquet: cannot read parquet data: Couldn't deserialize thrift: TProtocolException: Invalid data; "
         "Deserializing page header failed."),
]


def _written(folder) -> list[str]:
    """What a command left beside the inputs (outputs, temp files)."""
    inputs = {"pipe.arrow", "pipe.csv", "pipe.toml", "pipe.npz", "zero.parquet", "zero.toml", "zero.json", "zero.csv",
              "dup.csv", "dup.parquet", "ok.csv", "req.parquet", "cut.parquet", "serve_sweep.toml"}
    return sorted(p.name for p in folder.iterdir() if p.name not in inputs)


@pytest.mark.parametrize("line, status, last", CASES, ids=[c[0] for c in CASES])
def test_special_and_broken_inputs_are_one_line(special, capsys, line, status, last):
    assert main(shlex.split(line)) == status
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == last.format(d=special)
    assert [w for w in _written(special) if w != "ss"] == []
    if (special / "ss").exists():  # the sweep's folder holds its lock only
        assert sorted(p.name for p in (special / "ss").iterdir()) == [".stepsim-sweep.lock"]


@pytest.mark.parametrize("line", ["trace inspect pipe.arrow", "serve --model qwen3-30b-a3b --requests pipe.csv --out o "
                                  "--iteration-latency 0.02", "trace inspect zero.parquet"])
def test_special_files_in_a_new_process_never_hang(special, line):
    [(status, last)] = [(c[1], c[2]) for c in CASES if c[0] == line]
    proc = subprocess.run([sys.executable, "-m", "stepsim", *shlex.split(line)], cwd=special, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "STEPSIM_SERVER": "off"})
    assert (proc.returncode, proc.stderr.strip().splitlines()[-1], proc.stdout) == (status, last, "")
