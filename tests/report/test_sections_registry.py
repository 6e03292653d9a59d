"""The default page: one part per question about heads, each with a section that measures its answer."""

from __future__ import annotations

from headlab.report.build import _check_ids
from headlab.report.section import Part
from headlab.report.sections import DEFAULT_SECTIONS


def test_every_question_has_a_part_with_measured_sections() -> None:
    parts = {e.id: e for e in DEFAULT_SECTIONS if isinstance(e, Part)}
    questions = ["shared-weights", "more-heads", "separate-qk", "heads-vs-one-head", "different-heads"]
    assert list(parts)[:5] == questions
    for q in questions:
        assert parts[q].title.endswith("?") and parts[q].sections, q
    assert [s.id for s in parts["heads"].sections] == ["analysis", "patching", "circuits", "viewer"]
    _check_ids(DEFAULT_SECTIONS)  # unique ids, every cross-reference lands


def test_each_section_appears_once() -> None:
    ids = [s.id for e in DEFAULT_SECTIONS for s in (e.sections if isinstance(e, Part) else (e,))]
    assert len(ids) == len(set(ids))
