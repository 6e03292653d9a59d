"""The README's sentences about MiniLM's heads are written by the analysis, never typed: `make readme`
rewrites the block (tests/support/regenerate.py) and this test checks it still says what a run says.
The README's Python blocks run in tests/test_docs.py."""

from __future__ import annotations

from tests.support.regenerate import README, readme_sentences


def test_readme_sentences_about_minilm_are_what_the_analysis_says() -> None:
    README.check(readme_sentences())
