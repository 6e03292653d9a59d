"""How heads work together (``headlab.circuits``), on two models.

- The induction experiment's trained 2-layer model (the result the experiment's own section computed,
  or the same run), on its circuit pair (``headlab.experiments.induction.induction_pair``): the
  strongest head → head edge by K-composition, path patching, EAP and EAP-IG, and whether each is a
  previous-token head feeding an induction head through its key — the heads as headlab's detectors
  name them in the experiment.
- The report's model on the patching section's pair (``patching.choose_pair``): its composition
  scores against random matrices of the same shapes, and its strongest edges by EAP-IG, confirmed one by
  one by exact edge patching. The EAP-IG scores are shared with the viewer section, whose circuit panel
  lists each head's strongest edges.

Every sentence is generated from the numbers of this run.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from headlab.display import short
from headlab.report.html import Html, escape, link, table
from headlab.report.section import ReportContext, Section

if TYPE_CHECKING:
    from headlab.circuits import CompositionScores, EdgeScores

__all__ = ["SECTION", "STEPS", "TOP", "induction_sentences", "render"]

STEPS = 5  # EAP-IG's integration steps
TOP = 10  # edges confirmed by exact edge patching, and shown
COMPOSITION_TOP = 3  # strongest pairs shown per kind
LEVEL = 0.8  # the faithfulness the smallest circuit named must keep
ASSET_DIR = "assets/circuits"


def induction_sentences(methods: list[tuple[str, str, bool]], previous: list[str], inducing: list[str]) -> list[str]:
    """Sentences on the induction model's circuit.

    Args:
        methods: ``(method, its strongest head → head edge's label, whether it is a previous-token head → an
            induction head through the key)``.
        previous, inducing: the heads headlab's detectors name (labels).
    """
    found = [m for m, _, ok in methods if ok]
    labels = {label for _, label, _ in methods}
    said = [f"In the trained model headlab's detectors find previous-token heads {', '.join(previous) or 'none'} "
            f"and induction heads {', '.join(inducing) or 'none'}."]
    if len(found) == len(methods) and len(labels) == 1:
        said.append(f"Every method — {', '.join(m for m, _, _ in methods)} — names the same strongest edge between "
                    f"heads, {next(iter(labels))}: the previous-token head feeding the induction head through its "
                    "key, the circuit of Elhage et al. (2021) and Olsson et al. (2022).")
    elif len(found) == len(methods):
        said.append("Every method's strongest edge between heads goes from a previous-token head into an induction "
                    "head's key, though they pick different pairs: "
                    + "; ".join(f"{m}: {label}" for m, label, _ in methods) + ".")
    else:
        said.append("Not every method finds a previous-token head feeding an induction head's key as its strongest "
                    "edge: " + "; ".join(f"{m}: {label}{'' if ok else ' (not that circuit)'}"
                                         for m, label, ok in methods) + ".")
    return said


def render(ctx: ReportContext) -> str:
    return Html(_induction(ctx) + _model(ctx))


def _induction(ctx: ReportContext) -> str:
    import headlab
    from headlab.circuits import composition_scores, edge_attribution, path_patching
    from headlab.circuits.graph import receiving
    from headlab.experiments.induction import induction_pair, run_induction
    from headlab.heads import head_label

    result = ctx.memo("experiment:induction", lambda: run_induction(seed=ctx.seed, quick=ctx.quick))
    handle = headlab.attach(result.model)
    pair = induction_pair(result)
    previous = {(layer, head) for layer, head in result.previous_token_heads}
    inducing = {(layer, head) for layer, head in result.induction_heads}
    layer_1 = [(1, h, role) for h in range(handle.n_heads[1]) for role in ("q", "k", "v")]
    scored: list[tuple[str, EdgeScores]] = [
        ("path patching", path_patching(handle, pair.clean, pair.corrupted, pair.metric, receivers=layer_1)),
        ("EAP", edge_attribution(handle, pair.clean, pair.corrupted, pair.metric)),
        (f"EAP-IG ({STEPS} steps)", edge_attribution(handle, pair.clean, pair.corrupted, pair.metric,
                                                     method="eap-ig", steps=STEPS)),
    ]
    composition = composition_scores(handle, kinds="k", seed=ctx.seed)
    best = composition.top("k", 1)[0]
    rows: list[list[str]] = []
    methods: list[tuple[str, str, bool]] = []
    document: dict[str, Any] = {"previous_token_heads": sorted(previous), "induction_heads": sorted(inducing)}
    k_ok = best.sender in previous and best.receiver in inducing
    methods.append(("K-composition", f"{head_label(*best.sender)} → {head_label(*best.receiver)}.k", k_ok))
    rows.append(["K-composition (weights)", methods[-1][1], short(best.score), f"z {short(best.z)}",
                 "no forward", "yes" if k_ok else "no"])
    document["composition"] = composition.to_dict()
    for name, scores in scored:
        edge = _strongest_between_heads(scores)
        ok = edge.sender in previous and edge.role == "k" and receiving(edge.receiver)[:2] in inducing
        methods.append((name, edge.label, ok))
        effect = scores.effects[scores.edges.index(edge)]
        rows.append([name, edge.label, short(scores[edge]), f"effect {short(effect)}",
                     f"{scores.forwards} forwards, {scores.backwards} backwards", "yes" if ok else "no"])
        document[name] = scores.to_dict()
    href = ctx.write_file(f"{ASSET_DIR}/induction.json", json.dumps(document, indent=1, default=_plain) + "\n")
    parts = ["<h3>The induction circuit of the trained 2-layer model</h3>",
             "<p>The clean input repeats a span of random tokens; the corrupted one replaces the span's first copy, "
             "so that copying from it predicts other tokens. Metric: on the second copy, the logit of the token "
             "that follows in the span minus the logit of the token the corrupted first copy puts there.</p>"]
    parts += [f"<p>{escape(s)}</p>" for s in induction_sentences(
        methods, [head_label(*h) for h in sorted(previous)], [head_label(*h) for h in sorted(inducing)])]
    parts.append(table(["method", "strongest edge between heads", "score", "", "cost",
                        "previous-token → induction via the key"], rows))
    parts.append(f'<p class="note">Scores: the metric\'s change when the edge alone carries the clean value into '
                 f"the corrupted run (composition: the weights-only score and its z against random matrices). "
                 f"All of it as JSON: {link(href, href)}.</p>")
    return "".join(parts)


def _model(ctx: ReportContext) -> str:
    from headlab.analysis.importance import spearman
    from headlab.circuits import (
        composition_scores,
        edge_attribution,
        edge_patching,
        faithfulness,
        faithfulness_curve,
        plot_circuit,
        plot_composition,
        plot_faithfulness,
        top_edges,
    )
    from headlab.report.provenance import model_name
    from headlab.report.sections.patching import choose_pair
    from headlab.report.sections.viewer import EDGE_TEXTS, EDGES

    loaded = ctx.load_model()
    name = model_name(loaded.source)
    composition = composition_scores(loaded, seed=ctx.seed)
    plot = plot_composition(composition, ctx.assets_dir / "circuits" / "composition.png")
    pair = choose_pair(loaded)
    estimate = edge_attribution(loaded, pair.clean, pair.corrupted, pair.metric, method="eap-ig", steps=STEPS)
    top = estimate.top(TOP)
    exact = edge_patching(loaded, pair.clean, pair.corrupted, pair.metric, edges=top)
    agreement = spearman([estimate[e] for e in top], [exact[e] for e in top])
    circuit = top_edges(estimate, k=TOP)
    kept = faithfulness(loaded, pair.clean, pair.corrupted, pair.metric, circuit)
    figure = plot_circuit(circuit, ctx.assets_dir / "circuits" / "circuit.png")
    curve = faithfulness_curve(loaded, pair.clean, pair.corrupted, pair.metric, estimate)
    curve_plot = plot_faithfulness(curve, ctx.assets_dir / "circuits" / "faithfulness.png")
    enough = curve.smallest(LEVEL)
    composition_rows = [[kind.upper(), f"{c.sender[0]}.{c.sender[1]} → {c.receiver[0]}.{c.receiver[1]}",
                         short(c.score), short(c.ratio), short(c.z)]
                        for kind in ("q", "k", "v") for c in composition.top(kind, COMPOSITION_TOP)]
    edge_rows = [[e.label, e.role or "output", short(estimate[e]), short(exact[e])] for e in top]
    texts = (loaded.tokenizer.decode(pair.clean[0]), loaded.tokenizer.decode(pair.corrupted[0]))
    ctx.memo(EDGES, lambda: estimate)  # the viewer's circuit panel shows them
    ctx.memo(EDGE_TEXTS, lambda: texts)
    document = {"model": loaded.source, "clean": texts[0], "corrupted": texts[1], "metric": pair.definition,
                "composition": composition.to_dict(), "eap_ig": estimate.to_dict(), "exact": exact.to_dict(),
                "spearman_top": agreement, "circuit": circuit.to_dict(), "faithfulness_curve": curve.to_dict()}
    href = ctx.write_file(f"{ASSET_DIR}/model.json", json.dumps(document, indent=1, default=_plain) + "\n")
    strongest = _strongest(composition)
    said = [f"By the weights alone, the strongest composition in {name} is {strongest}.",
            f"On the patching section's pair ({texts[0]!r} against {texts[1]!r}; {pair.definition}), EAP-IG with "
            f"{STEPS} steps scores all {len(estimate)} edges in {estimate.forwards} forwards and {estimate.backwards} "
            f"backwards; its strongest edge is {top[0].label}. Exact edge patching of its top {len(top)} edges "
            f"({exact.forwards} forwards) ranks them with Spearman {short(agreement)} against the estimate.",
            f"As a circuit, those {len(circuit)} edges keep {short(kept)} of the clean − corrupted gap with every "
            "other edge between heads carrying its corrupted value (faithfulness, one forward); "
            + (f"the smallest circuit of the curve keeping {short(LEVEL)} of it has {enough} edges."
               if enough is not None else f"no circuit of the curve keeps {short(LEVEL)} of it.")]
    parts = [f"<h3>{escape(name)}: composition and the strongest edges</h3>"]
    parts += [f"<p>{escape(s)}</p>" for s in said]
    parts.append(table(["kind", "sender → receiver (layer.head)", "score", "× chance", "z"], composition_rows))
    parts.append(f'<p><img src="{escape(f"{ASSET_DIR}/{plot.name}")}" alt="composition scores: senders by '
                 'receivers, one panel per kind" style="max-width:100%"></p>')
    parts.append(table(["edge", "receiver's input", f"EAP-IG ({STEPS} steps)", "exact"], edge_rows))
    circuit_href, curve_href = (escape(f"{ASSET_DIR}/{path.name}") for path in (figure, curve_plot))
    parts.append(f'<p><img src="{circuit_href}" alt="the circuit: heads by layer, its edges by receiver input and '
                 f'score" style="max-width:48%"> <img src="{curve_href}" alt="faithfulness against the number of '
                 'edges kept" style="max-width:48%"></p>')
    parts.append(f'<p class="note">In a post-norm model such as MiniLM a head\'s output is normalised before later '
                 "layers read it; the edges add it unnormalised (docs/circuits.md). Composition scores ignore "
                 f"norms, positions and biases. All of it as JSON: {link(href, href)}.</p>")
    return "".join(parts)


def _strongest_between_heads(scores: EdgeScores) -> Any:
    from headlab.circuits import INPUT, OUTPUT

    return next(e for e in scores.top(len(scores)) if e.sender != INPUT and e.receiver != OUTPUT)


def _strongest(composition: CompositionScores) -> str:
    best = max((c for kind in ("q", "k", "v") for c in composition.top(kind, 1)), key=lambda c: c.z)
    return (f"{best.kind.upper()}-composition from layer {best.sender[0]} head {best.sender[1]} into layer "
            f"{best.receiver[0]} head {best.receiver[1]} ({short(best.score)}, {short(best.ratio)}× "
            "the score of random matrices of the same shapes)")


def _plain(value: Any) -> Any:
    """numpy numbers and tuples in the JSON documents."""
    return value.item() if hasattr(value, "item") else str(value)


SECTION = Section(id="circuits", title="How heads work together: circuits", render=render)
