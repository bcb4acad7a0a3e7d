"""Each mapped kind's cache key names exactly the sources that decide that kind (docs/mapping.md §5): the shared
search, the kind's own module and its builders, so editing one kind's module or builder stales that kind alone."""

from __future__ import annotations

from pathlib import Path

import pytest

import stepsim
from stepsim.base.files import file_sha256, stable_hash
from stepsim.mapping import mapper

PACKAGE = Path(stepsim.__file__).parent
SHARED = ["mapping/mapper.py", "mapping/units.py", "mapping/kinds/__init__.py", "mapping/kinds/common.py"]
OWN = {"ffn": ["mapping/kinds/ffn.py", "workloads/moe/build.py", "workloads/moe/stage.py"],
       "decode": ["mapping/kinds/decode.py", "workloads/attention/build.py"],
       "prefill": ["mapping/kinds/prefill.py", "workloads/prefill_attention/build.py"]}


@pytest.mark.parametrize("kind", sorted(OWN))
def test_each_kind_hashes_the_shared_search_its_module_and_its_builders(kind):
    files = [str(p.relative_to(PACKAGE)) for p in mapper.source_files(kind)]
    assert files == SHARED + OWN[kind]
    assert mapper.source_hash(kind) == stable_hash([file_sha256(PACKAGE / f) for f in files])


def test_a_kinds_own_files_are_no_other_kinds(monkeypatch):
    """Editing a file (its hash changed) changes the keys of exactly the kinds that name it."""
    before = {kind: mapper._source_hash(kind) for kind in OWN}
    real = mapper.file_sha256
    for edited in SHARED + [f for own in OWN.values() for f in own]:
        monkeypatch.setattr(mapper, "file_sha256", lambda p, e=edited: "edited" if p == PACKAGE / e else real(p))
        changed = {kind for kind in OWN if mapper._source_hash(kind) != before[kind]}
        assert changed == ({kind for kind in OWN if edited in OWN[kind]} if edited not in SHARED else set(OWN)), edited


def test_the_calibrations_hash_is_every_kinds_and_a_kind_not_mapped_is_refused():
    assert mapper.source_hash() == stable_hash({kind: mapper.source_hash(kind) for kind in ("ffn", "decode",
                                                                                            "prefill")})
    with pytest.raises(ValueError, match="unknown mapped kind 'projection'; expected one of 'ffn', 'decode', "
                                         "'prefill'"):
        mapper.source_files("projection")
