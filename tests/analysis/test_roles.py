"""Roles: labels from surface statistics, and the duplicate-token / induction probes."""

from __future__ import annotations

import pytest
import torch

from headlab.analysis import SurfaceStats, duplicate_token_scores, induction_scores, label_heads
from headlab.analysis.roles import duplicate_token_score, induction_score, probe_patterns, repeated_tokens
from tests.support.analysis import make_batch, patterns_of, sentence


def test_labels_of_hand_built_heads():
    n = 10
    kinds = ["previous", "next", "identity", "cls", "uniform", "punct"]
    p = torch.stack([patterns_of(k, n) for k in kinds])[None]  # (1, head, q, k)
    stats = SurfaceStats()
    stats.update(make_batch([sentence(n)], {3: p}))
    labels = label_heads(stats.result())
    assert labels == {
        (3, 0): ("previous_token",), (3, 1): ("next_token",), (3, 2): ("self",), (3, 3): ("special",),
        (3, 4): ("broad",), (3, 5): ("punctuation",),
    }


def test_several_labels_or_none():
    n = 10
    both = 0.5 * patterns_of("cls", n) + 0.5 * patterns_of("sep", n)  # all on [CLS]+[SEP]
    half = 0.4 * patterns_of("previous", n) + 0.6 * patterns_of("uniform", n)
    stats = SurfaceStats()
    stats.update(make_batch([sentence(n)], {0: torch.stack([both, half])[None]}))
    labels = label_heads(stats.result())
    assert labels[(0, 0)] == ("special",)
    assert labels[(0, 1)] == ()


def repeated(length: int, n_seqs: int = 2) -> torch.Tensor:
    return repeated_tokens(n_seqs=n_seqs, length=length, vocab_size=50, bos_id=1, exclude={0, 2}, seed=3)


def test_repeated_tokens():
    ids = repeated(6, 4)
    assert ids.shape == (4, 13) and (ids[:, 0] == 1).all()
    assert torch.equal(ids[:, 1:7], ids[:, 7:])
    assert all(len(set(row[1:7].tolist())) == 6 and not {0, 1, 2} & set(row[1:].tolist()) for row in ids)
    with pytest.raises(ValueError, match="distinct tokens"):
        repeated_tokens(n_seqs=1, length=60, vocab_size=50, bos_id=1)


def test_scores_of_forced_patterns():
    """Patterns that put all mass on the duplicate (or on the token after it) score exactly 1 and 0."""
    length, n_pos = 5, 11
    duplicate = torch.zeros(n_pos, n_pos)
    shifted = torch.zeros(n_pos, n_pos)
    for i in range(n_pos):
        duplicate[i, i - length if i > length else 0] = 1
        shifted[i, i - length + 1 if i > length else 0] = 1
    p = torch.stack([duplicate, shifted])[None].expand(3, -1, -1, -1)  # (batch, head, q, k)
    assert duplicate_token_score(p, length).tolist() == [1.0, 0.0]
    assert induction_score(p, length).tolist() == [0.0, 1.0]


@pytest.fixture(scope="module")
def gpt2():
    pytest.importorskip("transformers")
    import headlab
    from tests.support.tiny import build

    return headlab.attach(build("gpt2")).model


def test_probes_on_tiny_gpt2(gpt2):
    length = 7
    duplicate = duplicate_token_scores(gpt2, n_seqs=3, length=length, seed=0)
    induction = induction_scores(gpt2, n_seqs=3, length=length, seed=0)
    for probe in (duplicate, induction):
        scores = probe.table[probe.name]
        assert probe.table.heads == [(layer, h) for layer in range(2) for h in range(4)]
        assert ((scores >= 0) & (scores <= 1)).all()
        document = probe.to_dict()
        assert len(document["rows"]) == 8 and document["length"] == length
        assert document["rows"][5] == {"layer": 1, "head": 1, probe.name: probe.table.value(probe.name, 1, 1)}
        middle = float(scores.mean())
        above = [(layer, h) for layer in range(2) for h in range(4) if probe.table.value(probe.name, layer, h) > middle]
        assert 0 < len(above) < 8 and probe.heads_above(middle) == above
        assert document["heads"] == [list(h) for h in probe.heads_above()]
    # the same numbers by plain loops over the tapped patterns
    ids = repeated_tokens(n_seqs=3, length=length, vocab_size=100, bos_id=1, exclude={0, 2}, seed=0)
    patterns = probe_patterns(gpt2, ids)
    for layer, p in enumerate(patterns):
        for head in range(4):
            second = range(length + 1, 2 * length + 1)
            dup = sum(p[b, head, i, i - length].item() for b in range(3) for i in second) / (3 * length)
            ind = sum(p[b, head, i, i - length + 1].item() for b in range(3) for i in second) / (3 * length)
            assert duplicate.table.value("duplicate_token", layer, head) == pytest.approx(dup, rel=1e-6)
            assert induction.table.value("induction", layer, head) == pytest.approx(ind, rel=1e-6)


def test_probes_refuse_sequences_longer_than_the_model_takes(gpt2):
    # the tiny GPT-2 has 64 positions: [BOS] + 2 × 32 = 65 tokens do not fit
    with pytest.raises(ValueError, match=r"length=32 .* 65 tokens .* at most 64; use length ≤ 31"):
        induction_scores(gpt2, n_seqs=1, length=32)
    assert induction_scores(gpt2, n_seqs=1, length=31).length == 31


def test_probes_refuse_a_non_causal_model():
    from tests.support.minilm import minilm

    with pytest.raises(ValueError, match="need a causal model"):
        induction_scores(minilm(), n_seqs=1, length=4)


def test_gpt2_reads_as_causal(gpt2):
    from headlab.analysis.surface import is_causal

    assert is_causal(gpt2)
