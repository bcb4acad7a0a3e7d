"""``reproduce --force``: a point whose estimated engine events are over the limit (stepsim.kernels.run_size)
fails its experiment with the estimate as the reason and leaves no output; with --force it runs, and the files are
byte-identical to a run under the default limit (forcing changes nothing but whether the point runs). The limit
is lowered with STEPSIM_MAX_EVENTS to 2,000: the validation sweep's 16 x 16 SwiGLU point is estimated at 3,880
events. validation needs no traces (an empty folder will do)."""

from __future__ import annotations

from stepsim.cli import main

E = "stepsim: error: "
TABLES = ("validation.csv", "validation.parquet", "validation_headline.json")


def test_refused_without_force_and_identical_with_it(tmp_path, capsys, monkeypatch):
    traces = tmp_path / "no-traces"
    traces.mkdir()
    base = ["reproduce", "validation", "--traces", str(traces), "--jobs", "1"]
    assert main([*base, "--out", str(tmp_path / "default")]) == 0
    capsys.readouterr()

    monkeypatch.setenv("STEPSIM_MAX_EVENTS", "2000")
    assert main([*base, "--out", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (
        E + "validation: point tile_m=16 tile_n=16 failed: ConfigError: this run needs up to 3.88e+03 engine events, "
            "under a second at 1e+06 events/s; the limit is 2,000 (check the model dimensions), --force runs it anyway")
    assert not any((tmp_path / "refused").glob("validation*"))

    assert main([*base, "--out", str(tmp_path / "forced"), "--force"]) == 0
    for name in TABLES:
        assert (tmp_path / "forced" / name).read_bytes() == (tmp_path / "default" / name).read_bytes(), name
