"""What ``analyze`` found, in sentences: every number taken from the measured results
(``AnalysisResult.sentences()`` calls ``analysis_sentences`` with its parts).

Statistics that cannot vary for the model's kind (``headlab.analysis.surface.head_statistics``) are
never cited; the dependency headline names one of the ``TABLE_RELATIONS`` most frequent relations
(those the tables show); a pruning curve that does not move says so instead of reading as a result.
The sinks have their own sentences (``headlab.analysis.sinks.sink_sentences``), as the report has a
section for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from headlab.analysis.surface import head_statistics
from headlab.analysis.taxonomy import class_shares
from headlab.heads import HeadTable, head_label

if TYPE_CHECKING:
    from headlab.analysis.importance import PruningCurve
    from headlab.analysis.syntax import SyntaxResult

__all__ = ["FIDELITY_METRIC", "LM_METRIC", "METRIC_FORMATS", "RETRIEVAL_METRIC", "TABLE_RELATIONS",
           "analysis_sentences", "pruning_sentence"]

# The pruning curves' metrics (``AnalysisResult.pruning``'s keys), and how a value of each is written.
FIDELITY_METRIC = "embedding cosine to the unpruned model"
RETRIEVAL_METRIC = "pair-retrieval accuracy"
LM_METRIC = "next-token loss"
METRIC_FORMATS = {FIDELITY_METRIC: "{:.3f}", RETRIEVAL_METRIC: "{:.0%}", LM_METRIC: "{:.2f} nats"}
TABLE_RELATIONS = 12  # dependency relations shown in tables (most frequent first); the headline picks among them


def analysis_sentences(*, surface: HeadTable, roles: Mapping[tuple[int, int], tuple[str, ...]],
                       classes: Mapping[tuple[int, int], str], syntax: SyntaxResult | None,
                       pruning: Mapping[str, PruningCurve], causal: bool) -> list[str]:
    """A few sentences about what the heads do.

    Args:
        surface: ``SurfaceStats``' table.
        roles, classes: labels and the pattern class per captured head.
        syntax: ``SyntaxAccuracy``'s result, or None.
        pruning: ``{metric name: curve}``.
        causal: the model's attention is causal (``to_next`` is never cited then).

    Returns:
        The pattern classes and sinks, the neighbour heads and entropy, the dependency headline (when
        syntax ran), then one sentence per pruning curve.
    """
    shares = class_shares(dict(classes))
    top = sorted(shares.items(), key=lambda kv: -kv[1])
    out = [f"Of the {len(surface)} heads analysed, " + ", ".join(f"{share:.0%} are {name}" for name, share in top)
           + f" (pattern classes, docs/analysis.md); {sum('special' in v for v in roles.values())} send over half "
           "their attention to the special tokens ([CLS]/[SEP], BOS/EOS)."]
    prev = surface.top("to_prev", 1)[0]
    neighbours = (f"Head {head_label(*prev)} sends {surface.value('to_prev', *prev):.0%} of its attention to the "
                  "previous token")
    if "to_next" in head_statistics(causal=causal):  # a causal head never sees the next token
        nxt = surface.top("to_next", 1)[0]
        neighbours += f" and head {head_label(*nxt)} {surface.value('to_next', *nxt):.0%} to the next one"
    out.append(neighbours + f", while the mean head's entropy is {np.mean(surface['entropy']):.2f} nats.")
    if syntax is not None and syntax.relations:
        shown = syntax.relations[:TABLE_RELATIONS]
        rel = max(shown, key=lambda r: r.best[2] - r.baseline_accuracy)
        direction, (layer, head), accuracy = rel.best
        start, target = (("dependent", "syntactic head") if direction == "dep_to_head"
                         else ("syntactic head", "dependent"))
        gain = accuracy - rel.baseline_accuracy
        headline = (f"{rel.relation} gains most over a fixed offset" if gain > 0 else
                    f"no relation beats its positional baseline; {rel.relation} comes closest")
        out.append(f"Of the {len(shown)} most frequent dependency relations, {headline}: reading from the {start} "
                   f"word of each of its {rel.count} arcs, attention head {head_label(layer, head)} puts its largest "
                   f"weight on the {target} word {accuracy:.0%} of the time, against {rel.baseline_accuracy:.0%} for "
                   f"the best fixed offset ({rel.baseline_offset:+d} "
                   f"{'word' if abs(rel.baseline_offset) == 1 else 'words'}).")
    out += [pruning_sentence(metric, curve) for metric, curve in pruning.items()]
    return out


def pruning_sentence(metric: str, curve: PruningCurve) -> str:
    """One sentence on a pruning curve: where the metric goes as heads are masked, or that it does not move."""
    fmt = METRIC_FORMATS.get(metric, "{:.3g}").format
    first, last = curve.values[0], curve.values[-1]
    if curve.flat():
        low, high = fmt(min(curve.values)), fmt(max(curve.values))
        return (f"The {metric} stays at {fmt(first)}{'' if low == high else f' (between {low} and {high})'} from no "
                f"head masked to {curve.fractions[-1]:.0%} of them: this task cannot tell the heads apart, so its "
                "pruning curve says nothing about which heads matter.")
    middle = len(curve.values) // 2
    return (f"Masking heads least important first (gradient importance), the {metric} goes from {fmt(first)} with "
            f"every head to {fmt(curve.values[middle])} with {curve.fractions[middle]:.0%} masked and {fmt(last)} with "
            f"{curve.fractions[-1]:.0%} masked.")
