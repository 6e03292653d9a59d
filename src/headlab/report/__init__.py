"""HTML report: sections rendered into one self-contained folder (``index.html`` + assets).

Each section is a function from a :class:`ReportContext` to an HTML fragment; the
registry of default sections lives in :mod:`headlab.report.sections`.
"""

from __future__ import annotations

from headlab.report.build import ReportResult, SectionOutcome, build_report
from headlab.report.section import Part, ReportContext, Section

__all__ = ["build_report", "Part", "ReportResult", "SectionOutcome", "ReportContext", "Section"]
