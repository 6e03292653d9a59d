"""Head analyses over captured batches: accumulators with ``update(batch)``, ``merge(other)``, ``result()``.

    surface.py    SurfaceStats: attention to [CLS]/[SEP]/punctuation/self/neighbours, entropy,
                  distance, confidence per head (Clark et al. 2019; Voita et al. 2019)
    roles.py      label_heads from surface statistics; duplicate-token and induction probes
    taxonomy.py   TaxonomyStats, classify: Kovaleva et al. 2019 pattern classes
    syntax.py     SyntaxAccuracy: per dependency relation, the best head vs a fixed-offset baseline
                  (Clark et al. 2019 §4.2; needs the `syntax` extra: spaCy and a pipeline)
"""

from headlab.analysis.roles import ProbeScores, duplicate_token_scores, induction_scores, label_heads, role_labels
from headlab.analysis.surface import STATISTICS, SurfaceResult, SurfaceStats, surface_stats
from headlab.analysis.syntax import (
    DEFAULT_PIPELINE, Parse, RelationAccuracy, SyntaxAccuracy, SyntaxResult, load_pipeline, parse_texts,
    syntax_accuracy,
)
from headlab.analysis.taxonomy import CLASSES, TaxonomyResult, TaxonomyStats, class_shares, classify, taxonomy_stats

__all__ = [
    "CLASSES", "DEFAULT_PIPELINE", "STATISTICS", "Parse", "ProbeScores", "RelationAccuracy", "SurfaceResult",
    "SurfaceStats", "SyntaxAccuracy", "SyntaxResult", "TaxonomyResult", "TaxonomyStats", "class_shares", "classify",
    "duplicate_token_scores", "induction_scores", "label_heads", "load_pipeline", "parse_texts", "role_labels",
    "surface_stats", "syntax_accuracy", "taxonomy_stats",
]
