"""Patterns in row blocks (headlab.capture.blocks, headlab.layer.pattern_rows): every block-reading accumulator gives
the whole-pattern path's result, on every kind of mask; what cannot read blocks is refused before any forward."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import headlab
from headlab.analysis import sweep as sweep_module
from headlab.analysis.norms import ValueWeighted
from headlab.analysis.similarity import HeadSimilarity
from headlab.analysis.sinks import SinkShare
from headlab.analysis.surface import SurfaceStats, is_causal
from headlab.analysis.taxonomy import TaxonomyStats
from headlab.capture import capture
from headlab.capture.blocks import pattern_budget, whole_pattern_bytes
from headlab.layer.pattern_rows import PatternRows
from headlab.models import HeadedModel
from tests.support.text import TEXTS, word_piece_tokenizer
from tests.support.tiny import build

# each a different mask: bidirectional with padding (an additive mask), causal without padding (the kernel's own causal
# mask and log-sum-exp), causal with padding, grouped-query heads, a sliding window shorter than the texts, soft-capped
# logits (patterns formed whole by the model: the rows are sliced from them)
KINDS = {
    "bert": {},
    "llama": dict(num_key_value_heads=2, head_dim=8),
    "gpt2": dict(n_embd=32, n_layer=2, n_head=4, n_positions=64),
    "mistral": dict(num_key_value_heads=1, head_dim=8, sliding_window=4),
    "gemma2": dict(num_key_value_heads=2, head_dim=8, sliding_window=4, attn_logit_softcapping=5.0),
}
ONE_TEXT = [TEXTS[5]]  # a single text: no padding, the causal kernel's own mask
SMALL = 3000  # bytes: a few rows per block


@functools.cache
def _model(kind: str, dtype: torch.dtype) -> HeadedModel:
    tok = word_piece_tokenizer()
    ids = dict(vocab_size=len(tok), pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
               eos_token_id=tok.eos_token_id)
    implementation = "eager" if kind == "gemma2" else "sdpa"  # transformers has no sdpa for soft-capped logits
    model = build(kind, attn_implementation=implementation, **ids, **KINDS[kind]).to(dtype)
    return HeadedModel(model=headlab.attach(model).model, tokenizer=tok, source=f"tiny random {kind}")


def _accumulators(model: HeadedModel) -> list:
    return [SurfaceStats(causal=is_causal(model)), SinkShare.from_model(model), ValueWeighted.from_model(model),
            HeadSimilarity(row_fraction=0.5)]


def _results(model: HeadedModel, texts: list[str], budget: int | None) -> tuple[list, object]:
    accumulators = _accumulators(model)
    run = capture(model, corpus=texts, take=("pattern", "v"), consumers=accumulators, max_pattern_memory=budget,
                  progress=False)
    return [a.result() for a in accumulators], run


def _columns(result: object) -> dict[str, np.ndarray]:
    if hasattr(result, "distances"):
        return {"distances": np.asarray(result.distances)}
    table = getattr(result, "table", result)
    out = {name: np.asarray(table[name], dtype=float) for name in table.columns}
    for name in ("raw", "weighted"):  # a sink result's per-bin shares
        if getattr(result, name, None) is not None:
            out[f"{name} bins"] = np.asarray(getattr(result, name), dtype=float)
    return out


@pytest.mark.parametrize("sweep_rows", [None, 1], ids=["one sweep block", "a sweep block per row"])
@pytest.mark.parametrize("texts", [TEXTS, ONE_TEXT], ids=["padded batch", "one text"])
@pytest.mark.parametrize("kind", KINDS)
def test_blocks_equal_whole_patterns(kind: str, texts: list[str], sweep_rows: int | None, monkeypatch) -> None:
    """In float64, so that only the order of the sums differs: 1e-9 relative (the similarity's distances, square roots
    of divergences that are ~0 on rows every head gives to one key, to 1e-8: √(1e-16) is that). The sweep's blocks
    (``headlab.analysis.sweep``) hold every row at once, or one row each."""
    if sweep_rows is not None:
        monkeypatch.setattr(sweep_module, "SWEEP_BYTES", 1)
        monkeypatch.setattr(sweep_module, "SWEEP_ROWS", sweep_rows)
    model = _model(kind, torch.float64)
    whole, run_whole = _results(model, texts, None)
    blocked, run = _results(model, texts, SMALL)
    assert run_whole.blocked == 0 and run.blocked == run.batches and run.pattern_memory == SMALL
    assert "row blocks" in str(run) and "whole" in str(run_whole)
    for a, b in zip(whole, blocked):
        for name, x in _columns(a).items():
            np.testing.assert_allclose(_columns(b)[name], x, rtol=1e-9, atol=1e-8 if name == "distances" else 1e-12,
                                       err_msg=f"{type(a).__name__} {name}")


def test_blocks_in_float32_equal_to_its_rounding() -> None:
    model = _model("llama", torch.float32)
    whole, _ = _results(model, TEXTS, None)
    blocked, _ = _results(model, TEXTS, SMALL)
    for a, b in zip(whole, blocked):
        for name, x in _columns(a).items():
            np.testing.assert_allclose(_columns(b)[name], x, rtol=1e-4, atol=1e-6, err_msg=f"{type(a).__name__} {name}")


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_pattern_rows_in_blocks_rebuild_the_whole_patterns(kind: str) -> None:
    """Past the budget a consumer gets PatternRows (no whole pattern); its blocks of rows, each within the bytes asked
    for, put back together are the whole patterns (a causal layer's rows cut to the keys they see, 0 past them); the
    log of the rows is what their exp was taken of."""
    model = _model(kind, torch.float64)
    whole: dict[int, torch.Tensor] = {}
    kept: dict[int, PatternRows] = {}

    class Keep:
        READS_ROW_BLOCKS = True

        def update(self, batch) -> None:
            for layer, taken in batch.layers.items():
                if taken.pattern is not None:
                    whole[layer] = taken.pattern.clone()
                else:
                    kept[layer] = taken.pattern_rows

    capture(model, corpus=ONE_TEXT, consumers=[Keep()], progress=False)
    run = capture(model, corpus=ONE_TEXT, consumers=[Keep()], progress=False, max_pattern_memory=SMALL)
    assert run.blocked == 1 and set(kept) == set(whole)
    budget = 2000
    for layer, pattern in whole.items():
        rows, rebuilt, start, blocks = kept[layer], torch.zeros_like(pattern), 0, 0
        while start < pattern.shape[2]:
            stop = start + rows.block_rows(start, budget)
            block = rows.rows(start, stop)
            assert stop - start == 1 or block.numel() * block.element_size() <= budget
            if kind == "llama":
                assert block.shape[-1] == stop  # causal: the keys the block's last row sees
            torch.testing.assert_close(rows.log_rows(start, stop).exp(), block, rtol=0, atol=0)
            rebuilt[:, :, start:stop, :block.shape[-1]] = block
            start, blocks = stop, blocks + 1
        assert blocks > 2
        torch.testing.assert_close(rebuilt, pattern, rtol=0, atol=1e-14)


def test_a_consumer_that_needs_whole_patterns_is_refused_before_any_forward() -> None:
    model = _model("bert", torch.float32)
    calls = []
    hook = model.model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(ValueError, match=r"over the budget of .* TaxonomyStats cannot read"):
            capture(model, corpus=TEXTS, consumers=[TaxonomyStats(causal=False)], max_pattern_memory=SMALL,
                    progress=False)
        assert calls == []
        # within the budget it reads whole patterns as ever
        run = capture(model, corpus=TEXTS, consumers=[TaxonomyStats(causal=False)], max_pattern_memory=10**9,
                      progress=False)
    finally:
        hook.remove()
    assert run.blocked == 0 and len(calls) == run.batches


def test_budget_and_sizes() -> None:
    assert whole_pattern_bytes(2, 10, {0: [0, 1], 3: [2]}, 4) == 2 * 3 * 100 * 4
    assert pattern_budget(123, torch.device("cpu")) == 123
    assert pattern_budget(None, torch.device("cpu")) > 0  # a share of what is free
    for bad in (0, -1, 1.5, True, "1GiB"):
        with pytest.raises(ValueError, match="max_pattern_memory"):
            pattern_budget(bad, torch.device("cpu"))  # type: ignore[arg-type]


def test_similarity_forms_its_rows_of_pattern_rows_in_blocks_of_at_most_block_bytes(monkeypatch) -> None:
    import headlab.analysis.similarity as similarity

    model = _model("llama", torch.float32)
    sizes = []
    rows = PatternRows.rows

    def spy(self, start, stop):
        block = rows(self, start, stop)
        sizes.append(block.numel() * block.element_size())
        return block

    monkeypatch.setattr(PatternRows, "rows", spy)
    monkeypatch.setattr(similarity, "BLOCK_BYTES", 1000)
    run = capture(model, corpus=ONE_TEXT, consumers=[HeadSimilarity()], max_pattern_memory=5000, progress=False)
    assert run.blocked == 1 and len(sizes) > 4 and max(sizes) <= 1000


def test_the_progress_bar_counts_the_rows_formed(capsys: pytest.CaptureFixture[str]) -> None:
    """A long text is one batch of the capture's bar: a line below it counts the rows formed from PatternRows."""
    model = _model("llama", torch.float32)
    capture(model, corpus=ONE_TEXT, consumers=[SurfaceStats(causal=True)], max_pattern_memory=SMALL, progress=True)
    shown = capsys.readouterr()
    said = shown.err + shown.out
    n_rows = len(model.tokenizer(ONE_TEXT[0])["input_ids"])
    layers = len(model.sites)
    assert "rows formed" in said and f"{n_rows * layers}/?" in said.replace(",", "")
    capture(model, corpus=ONE_TEXT, consumers=[SurfaceStats(causal=True)], progress=True)
    assert "rows formed" not in capsys.readouterr().err  # whole patterns: nothing formed a block at a time
