"""The sections of ``headlab report``, in page order.

To add a section: write ``sections/<name>.py`` exposing ``SECTION`` (a
:class:`headlab.report.section.Section`) and append it to :data:`DEFAULT_SECTIONS`.
"""

from __future__ import annotations

from headlab.report.section import Section
from headlab.report.sections import analysis, params, parity

__all__ = ["DEFAULT_SECTIONS"]

DEFAULT_SECTIONS: list[Section] = [
    parity.SECTION,
    params.SECTION,
    analysis.SECTION,
]
