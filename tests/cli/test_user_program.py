"""``stepsim run path/to/file.py:function``: a user's function builds the graph (or workload) to simulate."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

from stepsim.base.errors import ConfigError
from stepsim.batch.config import load_sweep
from stepsim.cli import main
from stepsim.results.records import run_identity
from stepsim.simulation.simulate import simulate
from stepsim.workloads.program.build import build_program

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "user_graph.py"


def _run_json(capsys, *args) -> dict:
    assert main(["run", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_graph_function_runs_like_the_graph_itself(capsys):
    row = _run_json(capsys, f"{EXAMPLE}:silu_rows")
    import importlib.util

    spec = importlib.util.spec_from_file_location("user_graph_direct", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    direct = simulate(module.silu_rows())  # step-eval, FIFOs of 2: a bare graph's defaults
    assert (row["workload"], row["program"], row["hardware_name"]) == ("program", f"{EXAMPLE}:silu_rows", "step-eval")
    assert (row["cycles"], row["off_chip_bytes_measured"]) == (direct.cycles, direct.off_chip_bytes) == (861, 98304)
    deeper = _run_json(capsys, f"{EXAMPLE}:silu_rows", "--channel-depth", "1", "--hardware", "step-hdl")
    assert deeper["hardware_name"] == "step-hdl"
    assert deeper["cycles"] == simulate(module.silu_rows(), "step-hdl", channel_depth=1).cycles


def test_a_workload_function_keeps_its_kind_for_the_functional_check(capsys):
    row = _run_json(capsys, f"{EXAMPLE}:small_moe_with_shared_expert", "--functional", "--check")
    workload = build_program(f"{EXAMPLE}:small_moe_with_shared_expert")
    assert workload.name == "moe" and row["check_passed"] is True and row["check_max_rel_error"] < 1e-6
    assert row["cycles"] == simulate(workload).cycles


def test_the_run_id_follows_the_files_content_and_the_function_not_its_path(tmp_path):
    copy = tmp_path / "elsewhere.py"
    shutil.copy(EXAMPLE, copy)
    ident = run_identity({"workload": "program", "program": f"{EXAMPLE}:silu_rows"})[0]
    assert run_identity({"workload": "program", "program": f"{copy}:silu_rows"})[0] == ident
    assert run_identity({"workload": "program", "program": f"{copy}:small_moe_with_shared_expert"})[0] != ident
    copy.write_text(copy.read_text().replace("compute_bw=1024", "compute_bw=2048"))
    assert run_identity({"workload": "program", "program": f"{copy}:silu_rows"})[0] != ident


BAD_FILES = {
    "raises_on_import.py": "raise RuntimeError('no GPU here')\n",
    "funcs.py": ("def boom():\n    raise ValueError('tile too big')\n\n"
                 "def number():\n    return 42\n"),
}
BAD_CASES = [
    ("missing.py:f", "program 'missing.py:f': no such file missing.py"),
    ("funcs.py", None),  # argparse's own error: not a workload kind nor file.py:function
    ("funcs.py:", "program 'funcs.py:': expected path/to/file.py:function"),
    ("funcs.py:nothing", "program 'funcs.py:nothing': funcs.py has no function 'nothing' (functions: boom, number)"),
    ("funcs.py:boom", "program 'funcs.py:boom': boom() raised ValueError: tile too big"),
    ("funcs.py:number", "program 'funcs.py:number': number() returned int; expected a stepsim Graph or Workload"),
    ("raises_on_import.py:f",
     "program 'raises_on_import.py:f': importing raises_on_import.py raised RuntimeError: no GPU here"),
    ("funcs.py:boom --tile-n 4", "--tile-n does not apply to workload 'program' (it applies to: moe, swiglu, prefill_attention, mla_attention, mla_prefill, sliding_attention, decoder)"),
]


@pytest.mark.parametrize(("args", "message"), BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_programs_are_one_line_errors(tmp_path, monkeypatch, capsys, args, message):
    for name, text in BAD_FILES.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    try:
        status = main(["run", *shlex.split(args)])
    except SystemExit as exc:
        status = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and "Traceback" not in "\n".join(err)
    if message is None:
        assert err[-1] == ("stepsim run: error: argument WORKLOAD: invalid choice: 'funcs.py' (choose from moe, "
                           "swiglu, attention, prefill_attention, mla_attention, mla_prefill, sliding_attention, decoder, collective, path/to/file.py:function "
                           "or path/to/model.onnx)")
    else:
        assert err == [f"stepsim: error: {message}"]


def test_sweeps_refuse_user_programs(tmp_path):
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(f'workload = "program"\n[fixed]\nprogram = "{EXAMPLE}:silu_rows"\n')
    with pytest.raises(ConfigError, match=r"unknown workload 'program' \(expected one of moe, swiglu, attention, prefill_attention, mla_attention, mla_prefill, sliding_attention, decoder, collective\)"):
        load_sweep(sweep)
