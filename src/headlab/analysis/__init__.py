"""Head analyses over captured batches: accumulators with ``update(batch)``, ``merge(other)``, ``result()``.
Every per-head number is a ``headlab.heads.HeadTable`` (the result itself, or its ``table``).

    accumulator.py  Accumulator / Mergeable: the protocol every accumulator follows (update / merge / result)
    per_head.py   the accumulators' shared sums
    reductions.py one read of a batch's patterns shared by surface, taxonomy and similarity
    scratch.py    reusable work buffers of the accumulators
    surface.py    SurfaceStats: attention to [CLS]/[SEP]/punctuation/self/neighbours, entropy,
                  distance, confidence per head (Clark et al. 2019; Voita et al. 2019)
    roles.py      label_heads from surface statistics; duplicate-token and induction probes
    taxonomy.py   TaxonomyStats, classify: Kovaleva et al. 2019 pattern classes
    similarity.py HeadSimilarity: Jensen–Shannon distances between heads; metric MDS (Clark et al. 2019)
    importance.py gradient (Michel et al. 2019) and exact ablation importance, Spearman, pruning curves
    patching.py   activation patching and attribution patching (AtP; Kramár et al. 2024) per head
    positions.py  what patching patches: positions (together or each: a head × position grid), z/q/k/v/pattern
    norms.py      ValueWeighted: raw vs value-weighted (‖α f(x)‖) attention on the sink tokens (Kobayashi et al. 2020)
    sinks.py      SinkShare: each head's share on the first tokens by query position (Xiao et al. 2023)
    flow.py       rollout and exact attention flow of one text (Abnar & Zuidema 2020)
    retrieval.py  retrieval scores of a causal LM's heads on copies of corpus spans (Wu et al. 2024)
    streaming.py  each head restricted to sinks + a window of W keys: loss change, conversions (DuoAttention)
    context_heads.py  retrieval and streaming heads of one model, sized to fit it (analyze, the report)
    parses.py     dependency parses from any installed spaCy pipeline
    syntax.py     SyntaxAccuracy: per dependency relation, the best head vs a fixed-offset baseline
                  (Clark et al. 2019 §4.2; needs the `syntax` extra: spaCy and a pipeline)
    capture_pass.py  PassAccumulators: analyze's capture-pass accumulators by name; AnalysisAccumulators makes them
    result.py     AnalysisResult: what analyze measured, its per-head rows, summary and JSON document
    patches.py    PatchStats: a vision transformer's heads on images: distance attended on the patch grid, share on
                  [CLS] and the registers, entropy; image roles (Dosovitskiy et al. 2020; Darcet et al. 2024)
    images.py     analyze_images: analyze on images (the capture pass, a mirror-image importance task, the skips)
    frames.py     AudioStats: an audio encoder-decoder's heads on recordings: time attended, cross-attention's spread,
                  shares on the first frame and on the padding, entropy; audio roles
    audio.py      analyze_audio: analyze on recordings (the capture pass, the skips)
    sentences.py  what analyze found, in sentences
    files.py      heads.json, heads.csv, relations.csv
    plots.py      analyze's PNG plots
    analyze.py    analyze: every analysis of one model in one run
"""

from headlab.analysis.accumulator import Accumulator, Mergeable
from headlab.analysis.capture_pass import AnalysisAccumulators, PassAccumulators
from headlab.analysis.flow import (
    FLOW_MAX_LENGTH,
    MaxFlow,
    TextFlow,
    attention_flow,
    max_flow,
    mixed_attention,
    rollout,
    text_flow,
)
from headlab.analysis.frames import AUDIO_STATISTICS, AudioStats, audio_roles
from headlab.analysis.importance import (
    ImportanceResult,
    PruningCurve,
    ablation_importance,
    causal_lm_loss,
    embed,
    fidelity_metric,
    gradient_importance,
    lm_batches,
    pair_batches,
    paraphrase_loss,
    plot_pruning_curve,
    pruning_curve,
    retrieval_metric,
    spearman,
)
from headlab.analysis.norms import ValueWeighted, plot_value_weighted, value_norms, value_weighted, weighted_pattern
from headlab.analysis.parses import DEFAULT_PIPELINE, Parse, load_pipeline, parse_texts
from headlab.analysis.patches import PATCH_STATISTICS, PatchStats, patch_roles
from headlab.analysis.patching import (
    PatchingResult,
    activation_patching,
    attribution_patching,
    embedding_similarity,
    logit_difference,
    plot_patching,
)
from headlab.analysis.positions import PositionGrid, plot_positions
from headlab.analysis.retrieval import CopyCase, RetrievalResult, RetrievalScores, copy_cases, retrieval_scores
from headlab.analysis.roles import ProbeScores, duplicate_token_scores, induction_scores, label_heads, role_labels
from headlab.analysis.similarity import (
    MAX_JS_DISTANCE,
    HeadSimilarity,
    MDSResult,
    SimilarityResult,
    js_distance,
    mds,
    plot_mds,
)
from headlab.analysis.sinks import SinkResult, SinkShare, plot_sink_share, sink_share
from headlab.analysis.streaming import (
    Conversion,
    StreamingChanges,
    StreamingResult,
    StreamingStats,
    streaming_simulation,
)
from headlab.analysis.surface import STATISTICS, SurfaceStats, head_statistics, surface_stats
from headlab.analysis.syntax import RelationAccuracy, SyntaxAccuracy, SyntaxResult, syntax_accuracy
from headlab.analysis.taxonomy import CLASSES, TaxonomyStats, class_shares, classify, taxonomy_stats

__all__ = [
    "Accumulator", "AnalysisAccumulators", "Mergeable", "PassAccumulators",
    "MAX_JS_DISTANCE", "HeadSimilarity", "ImportanceResult", "MDSResult", "PruningCurve", "SimilarityResult",
    "ablation_importance", "causal_lm_loss", "embed", "fidelity_metric", "gradient_importance", "js_distance",
    "lm_batches", "mds", "pair_batches", "paraphrase_loss", "plot_mds", "plot_pruning_curve", "pruning_curve",
    "retrieval_metric", "spearman",
    "PatchingResult", "activation_patching", "attribution_patching", "embedding_similarity", "logit_difference",
    "plot_patching", "PositionGrid", "plot_positions",
    "head_statistics",
    "CLASSES", "DEFAULT_PIPELINE", "STATISTICS", "Parse", "ProbeScores", "RelationAccuracy", "SurfaceStats",
    "SyntaxAccuracy", "SyntaxResult", "TaxonomyStats", "class_shares", "classify",
    "duplicate_token_scores", "induction_scores", "label_heads", "load_pipeline", "parse_texts", "role_labels",
    "surface_stats", "syntax_accuracy", "taxonomy_stats",
    "CopyCase", "RetrievalResult", "RetrievalScores", "copy_cases", "retrieval_scores",
    "Conversion", "StreamingChanges", "StreamingResult", "StreamingStats", "streaming_simulation",
    "FLOW_MAX_LENGTH", "MaxFlow", "TextFlow", "attention_flow", "max_flow", "mixed_attention", "rollout", "text_flow",
    "ValueWeighted", "plot_value_weighted", "value_norms", "value_weighted", "weighted_pattern",
    "SinkResult", "SinkShare", "plot_sink_share", "sink_share",
    "PATCH_STATISTICS", "PatchStats", "patch_roles",
    "AUDIO_STATISTICS", "AudioStats", "audio_roles",
]
