"""stepsim compare on two plans: the recommended goodput per chip is the gate (exit 1 when worse by more than the
threshold, 0 otherwise; 2 with one line for a plan against a non-plan or a broken plan.json)."""

from __future__ import annotations

import json

import pytest

from stepsim.cli import main


def _plan(folder, goodput_per_chip, deployment="1x1ch sn40l none vllm seqs 128 batch 2048"):
    folder.mkdir()
    rec = None if goodput_per_chip is None else {"deployment": deployment, "goodput_per_chip": goodput_per_chip}
    (folder / "plan.json").write_text(json.dumps({"recommended": rec}))
    return folder


@pytest.mark.parametrize("base, cand, threshold, status, last", [
    (10.0, 9.0, "5%", 1, "worse by more than 5 %"),
    (10.0, 9.6, "5%", 0, "not worse by more than 5 %"),
    (10.0, 12.0, "0", 0, "not worse by more than 0 %"),
    (10.0, None, "5%", 1, "worse by more than 5 %"),
    (None, 3.0, "5%", 0, "not worse by more than 5 %"),
])
def test_the_recommended_goodput_per_chip_gates(tmp_path, capsys, base, cand, threshold, status, last):
    a, b = _plan(tmp_path / "a", base), _plan(tmp_path / "b", cand)
    assert main(["compare", str(a), str(b), "--threshold", threshold]) == status
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == last
    if base == 10.0 and cand == 9.0:
        assert lines[0] == ("recommended goodput_per_chip: baseline 10 requests/s a chip (1x1ch sn40l none vllm seqs "
                            "128 batch 2048), candidate 9 requests/s a chip (1x1ch sn40l none vllm seqs 128 batch "
                            "2048) (-10.00 %)")


def test_a_plan_against_something_else_is_one_line(tmp_path, capsys):
    a = _plan(tmp_path / "a", 1.0)
    (tmp_path / "b").mkdir()
    assert main(["compare", str(a), str(tmp_path / "b")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        f"stepsim: error: {a} is a stepsim plan folder and {tmp_path / 'b'} is not: compare like with like"
    for pair in ((a, tmp_path / "missing"), (tmp_path / "missing", a)):  # named as missing, not as "not a plan"
        assert main(["compare", *map(str, pair)]) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == \
            f"stepsim: error: {tmp_path / 'missing'}: no such file or folder"
    c = tmp_path / "c"
    c.mkdir()
    (c / "plan.json").write_text("{")
    assert main(["compare", str(a), str(c)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"stepsim: error: {c}/plan.json: not a plan's "
                                                                       "JSON (")
