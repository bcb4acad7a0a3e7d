"""The code's references to the documentation point to sections that exist in the repository's docs/."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REFERENCE = re.compile(r"docs/([a-z_]+\.md) §([0-9]+(?:\.[0-9]+)?)")


def _sections(doc: Path) -> set[str]:
    """Numbers of the headings of ``doc`` (``## 4. ...`` -> "4", ``### 4.2 ...`` -> "4.2") and of the numbered
    items of a section (``9.5`` for item 5 of ``## 9.``)."""
    found, current = set(), None
    for line in doc.read_text().splitlines():
        heading = re.match(r"#+ ([0-9]+(?:\.[0-9]+)?)\.? ", line)
        if heading:
            current = heading.group(1)
            found.add(current)
            continue
        item = re.match(r"([0-9]+)\. ", line)
        if item and current and "." not in current:
            found.add(f"{current}.{item.group(1)}")
    return found


def test_every_docs_reference_in_the_code_names_an_existing_section():
    refs = {(m.group(1), m.group(2), str(p.relative_to(REPO))) for p in (REPO / "stepsim").rglob("*.py")
            for m in REFERENCE.finditer(p.read_text())}
    assert len(refs) > 40
    sections = {doc.name: _sections(doc) for doc in (REPO / "docs").glob("*.md")}
    missing = sorted((where, f"{doc} §{sec}") for doc, sec, where in refs if sec not in sections.get(doc, ()))
    assert missing == []


def test_no_reference_points_outside_the_repository():
    stale = [str(p.relative_to(REPO)) for p in (REPO / "stepsim").rglob("*.py")
             if re.search(r"STEP_(TIMING|SEMANTICS)", p.read_text())]
    assert stale == []
