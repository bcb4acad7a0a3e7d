"""The one-line refusal of a cache folder chosen by an environment variable that cannot be one (``$STEPSIM_SERVE_CACHE``,
``$STEPSIM_MAPPING_CACHE``: stepsim.base.outputs.check_cache_dir), as the serve, plan and map tests check it."""

from __future__ import annotations

from stepsim.cli import main

E = "stepsim: error: "


def refuses_a_cache_folder_at_a_file(argv: list, variable: str, file, capsys, monkeypatch) -> None:
    """``argv`` exits 2 with one line naming ``$variable`` when that cache folder is the file ``file`` or under it."""
    monkeypatch.setenv(variable, str(file))
    assert main(argv) == 2
    assert capsys.readouterr().err == f"{E}${variable} {file}: is a file; give a folder (stepsim writes several " \
                                      "files into it)\n"
    monkeypatch.setenv(variable, str(file / "sub"))
    assert main(argv) == 2
    assert capsys.readouterr().err == f"{E}${variable} {file}/sub: {file} is a file, not a folder\n"
