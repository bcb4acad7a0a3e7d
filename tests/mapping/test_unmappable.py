"""The layers no schedule fits, remembered in the process and on disk (stepsim/mapping/unmappable.py): the second
ask raises the first search's error without a second search, in the same process or a new one reading the mapper's
folder; a damaged file is searched again and replaced; a layer that fits is the mapper's schedule."""

from __future__ import annotations

import pytest

from stepsim.base.errors import StepsimWarning
from stepsim.base.hardware import PRESETS
from stepsim.mapping import mapper, schedule_for, unmappable
from stepsim.mapping.units import Infeasible
from stepsim.models.presets import MoEModel

LLAMA_FFN = MoEModel("llama-3.1-8b", hidden=4096, intermediate=14336, experts=1, top_k=1)


def test_an_unmappable_layer_is_searched_once(monkeypatch, tmp_path):
    tiny = PRESETS["sn40l"].__class__.preset("sn40l", compute_units=4)
    monkeypatch.setattr(unmappable, "_UNMAPPABLE", {})  # none remembered from another test
    searches = []
    search = mapper.evaluate
    monkeypatch.setattr(mapper, "evaluate", lambda *a, **k: searches.append(a[:2]) or search(*a, **k))
    errors = []
    for tokens in (1, 1, 2, 2):  # buckets 1 and 2: each searched once
        with pytest.raises(Infeasible) as e:
            schedule_for("ffn", tokens, LLAMA_FFN, tiny, cache=tmp_path)
        errors.append(str(e.value))
    assert searches == [("ffn", 1), ("ffn", 2)]
    assert errors[0] == errors[1] and errors[2] == errors[3] and errors[0] != errors[2]
    assert errors[0].startswith("no schedule of the 'ffn' layer at size 1 fits hardware 'sn40l+compute_units=4' "
                                "(30 candidates: ")
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 2 and all(name.endswith(".unmappable.json") for name in files)
    # a new process (an empty memory) reads the errors from the folder: no search
    monkeypatch.setattr(unmappable, "_UNMAPPABLE", {})
    for tokens, error in ((1, errors[0]), (2, errors[2])):
        with pytest.raises(Infeasible) as e:
            schedule_for("ffn", tokens, LLAMA_FFN, tiny, cache=tmp_path)
        assert str(e.value) == error
    assert searches == [("ffn", 1), ("ffn", 2)]
    # another folder, or none: searched again
    monkeypatch.setattr(unmappable, "_UNMAPPABLE", {})
    with pytest.raises(Infeasible):
        schedule_for("ffn", 1, LLAMA_FFN, tiny, cache=False)
    assert searches[-1] == ("ffn", 1) and len(searches) == 3


def test_a_damaged_unmappable_file_is_searched_again_and_replaced(monkeypatch, tmp_path):
    monkeypatch.setattr(unmappable, "_UNMAPPABLE", {})
    searches = []

    def search(kind, size, dims, hardware, **kw):  # the mapper's search, found infeasible at once
        searches.append((kind, size))
        raise Infeasible(f"no schedule of the {kind!r} layer at size {size} fits (test)")

    monkeypatch.setattr(unmappable.mapper, "schedule_for", search)
    with pytest.raises(Infeasible, match=r"^no schedule of the 'ffn' layer at size 1 fits \(test\)$"):
        schedule_for("ffn", 1, LLAMA_FFN, PRESETS["sn40l"], cache=tmp_path)
    (path,) = tmp_path.iterdir()
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("(test)", "(edited)"), encoding="utf-8")  # the checksum no longer matches
    monkeypatch.setattr(unmappable, "_UNMAPPABLE", {})
    with pytest.warns(StepsimWarning, match=rf"^mapping cache file {path}: unusable \(ValueError: its checksum or key "
                      r"does not match\); searching again \(the file will be replaced\)$"):
        with pytest.raises(Infeasible, match=r"^no schedule of the 'ffn' layer at size 1 fits \(test\)$"):
            schedule_for("ffn", 1, LLAMA_FFN, PRESETS["sn40l"], cache=tmp_path)
    assert searches == [("ffn", 1), ("ffn", 1)]
    assert path.read_text(encoding="utf-8") == text


def test_a_layer_that_fits_is_the_mappers_schedule(tmp_path):
    small = MoEModel("small", hidden=256, intermediate=512, experts=1, top_k=1)
    assert schedule_for("ffn", 3, small, PRESETS["sn40l"], cache=tmp_path) == mapper.map_layer(
        "ffn", 4, small, PRESETS["sn40l"], cache=tmp_path)
