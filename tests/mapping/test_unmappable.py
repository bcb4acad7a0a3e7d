"""The layers no schedule fits, remembered in the process (stepsim/mapping/unmappable.py): the second ask raises the
first search's error without a second search; a layer that fits is the mapper's schedule."""

from __future__ import annotations

import pytest

from stepsim.base.hardware import PRESETS
from stepsim.mapping import mapper, schedule_for
from stepsim.mapping.units import Infeasible
from stepsim.models.presets import MoEModel

LLAMA_FFN = MoEModel("llama-3.1-8b", hidden=4096, intermediate=14336, experts=1, top_k=1)


def test_an_unmappable_layer_is_searched_once(monkeypatch, tmp_path):
    tiny = PRESETS["sn40l"].__class__.preset("sn40l", compute_units=4)
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
    assert list(tmp_path.iterdir()) == []  # nothing written: the disk cache holds schedules only


def test_a_layer_that_fits_is_the_mappers_schedule(tmp_path):
    small = MoEModel("small", hidden=256, intermediate=512, experts=1, top_k=1)
    assert schedule_for("ffn", 3, small, PRESETS["sn40l"], cache=tmp_path) == mapper.map_layer(
        "ffn", 4, small, PRESETS["sn40l"], cache=tmp_path)
