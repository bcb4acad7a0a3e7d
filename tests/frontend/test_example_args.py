"""The example scripts that write ONNX models check their arguments (issue 44): a bad one is one line (argparse's
``<script>: error: ...``), exit status 2, no traceback, no file written; good ones write the model the builder
makes. In-process (``main(argv)``) in a temporary folder, one case again as a new process."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
import onnx_blocks  # noqa: E402
import onnx_models  # noqa: E402

B, M = "onnx_blocks.py: error: ", "onnx_models.py: error: "
LIMIT = "more than the 2,147,483,647 an ONNX file holds (protobuf's 2 GB limit)"

#: (script, arguments, the exact last line of stderr); exit status 2 for each
CASES = [
    ("onnx_blocks", "llama a.onnx --hidden 0", B + "argument --hidden: must be at least 1, got 0"),
    ("onnx_blocks", "gpt2 a.onnx --batch -2", B + "argument --batch: must be at least 1, got -2"),
    ("onnx_blocks", "llama a.onnx --seq x", B + "argument --seq: expected an integer, got 'x'"),
    ("onnx_blocks", "llama a.onnx --intermediate 2.5", B + "argument --intermediate: expected an integer, got '2.5'"),
    ("onnx_blocks", "mistral a.onnx", B + "argument block: invalid choice: 'mistral' (choose from 'gpt2', 'llama')"),
    ("onnx_blocks", "llama a.txt",
     B + "out 'a.txt': the file name must end in .onnx (stepsim recognizes a model by its suffix)"),
    ("onnx_blocks", "llama nodir/sub/a.onnx", B + "out 'nodir/sub/a.onnx': no such folder 'nodir/sub'"),
    ("onnx_blocks", "llama dir.onnx", B + "out 'dir.onnx': is a folder"),
    ("onnx_blocks", "llama a.onnx --hidden 100000 --intermediate 100000",
     B + f"--hidden 100000 x --intermediate 100000: the weights take 120,001,600,000 bytes, {LIMIT}"),
    ("onnx_models", "llama a.onnx --layers 0", M + "argument --layers: must be at least 1, got 0"),
    ("onnx_models", "llama a.onnx --past -1", M + "argument --past: must be at least 0, got -1"),
    ("onnx_models", "llama a.onnx --kv-heads -1", M + "argument --kv-heads: must be at least 0, got -1"),
    ("onnx_models", "llama a.onnx --kv-heads 3",
     M + "--kv-heads 3 must divide --heads 4 (each key / value head serves heads / kv_heads query heads)"),
    ("onnx_models", "qwen3_moe a.onnx --kv-heads 8",
     M + "--kv-heads 8 must divide --heads 4 (each key / value head serves heads / kv_heads query heads)"),
    ("onnx_models", "gpt2 a.onnx --kv-heads 2",
     M + "--kv-heads applies to llama and qwen3_moe (GPT-2 has as many key / value heads as query heads)"),
    ("onnx_models", "llama a.onnx --heads 3", M + "--heads 3 does not divide --hidden 64 (each head is hidden / heads "
                                                   "wide)"),
    ("onnx_models", "llama a.onnx --hidden 12 --heads 4",
     M + "--hidden 12 / --heads 4 = 3: RoPE rotates half of each head, so the head width must be even"),
    ("onnx_models", "qwen3_moe a.onnx --vocab 10000000",
     M + f"the weights take 5,121,713,408 bytes, {LIMIT}; give smaller --vocab, --hidden, --intermediate or --layers"),
    ("onnx_models", "gpt2 a.onnx --hidden 0", M + "argument --hidden: must be at least 1, got 0"),
]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    (tmp_path / "dir.onnx").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("script", "args", "line"), CASES, ids=[f"{c[0]} {c[1]}" for c in CASES])
def test_a_bad_argument_is_one_line(folder, capsys, script, args, line):
    module = {"onnx_blocks": onnx_blocks, "onnx_models": onnx_models}[script]
    with pytest.raises(SystemExit) as stop:
        module.main(shlex.split(args))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert (stop.value.code, err.strip().splitlines()[-1]) == (2, line)
    assert sorted(p.name for p in folder.iterdir()) == ["dir.onnx"]  # nothing written


def test_a_bad_argument_in_a_new_process(folder):
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "onnx_models.py"), "llama", "a.onnx",
                           "--kv-heads", "3"], cwd=folder, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr.strip().splitlines()[-1], proc.stdout) == (2, CASES[12][2], "")
    assert "Traceback" not in proc.stderr and not (folder / "a.onnx").exists()


def test_good_arguments_write_the_builders_model(folder):
    onnx_blocks.main(["gpt2", "g.onnx", "--hidden", "32", "--intermediate", "64"])
    assert onnx.load("g.onnx") == onnx_blocks.BLOCKS["gpt2"](2, 8, 32, 64)
    onnx_models.main(["llama", "l.onnx", "--layers", "1", "--kv-heads", "2", "--past", "3"])
    assert onnx.load("l.onnx") == onnx_models.MODELS["llama"](1, 2, 8, 64, 4, 128, 128, past=3, kv_heads=2)
    assert sorted(p.name for p in folder.iterdir()) == ["dir.onnx", "g.onnx", "l.onnx"]  # no temporary file left
