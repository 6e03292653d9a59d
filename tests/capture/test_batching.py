import pytest
from hypothesis import given
from hypothesis import strategies as st

from headlab.capture import batch_cost, length_groups, naive_batches, padding_stats, plan_batches

lengths_st = st.lists(st.integers(1, 300), min_size=1, max_size=200)
bound_st = st.one_of(st.none(), st.integers(1, 2000))


@given(lengths=lengths_st, batch_tokens=bound_st, max_batch_size=st.one_of(st.none(), st.integers(1, 70)))
def test_every_item_exactly_once_and_bounds_hold(lengths, batch_tokens, max_batch_size):
    if batch_tokens is None and max_batch_size is None:
        max_batch_size = 8
    batches = plan_batches(lengths, batch_tokens=batch_tokens, max_batch_size=max_batch_size)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))  # a partition of the corpus
    for b in batches:
        assert b
        if max_batch_size is not None:
            assert len(b) <= max_batch_size
        if batch_tokens is not None and len(b) > 1:  # only a lone item may exceed the budget
            assert len(b) * max(lengths[i] for i in b) <= batch_tokens
    # Longest first: lengths never increase along the plan.
    seq = [lengths[i] for i in flat]
    assert seq == sorted(seq, reverse=True)
    assert padding_stats(lengths, batches).ratio <= padding_stats(lengths, [flat]).ratio + 1e-12


def _plan_cost(lengths, batches):
    return sum(batch_cost(len(b), max(lengths[i] for i in b)) for b in batches)


@given(lengths=lengths_st, size=st.integers(1, 50))
def test_planned_batches_never_cost_more_than_corpus_order(lengths, size):
    """With the same batch size, the plan costs at most what corpus order does (and pads far less in practice)."""
    planned = plan_batches(lengths, batch_tokens=None, max_batch_size=size)
    naive = naive_batches(len(lengths), batch_size=size)
    assert _plan_cost(lengths, planned) <= _plan_cost(lengths, naive)


@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=8),
       batch_tokens=st.one_of(st.none(), st.integers(1, 120)), max_batch_size=st.one_of(st.none(), st.integers(1, 5)))
def test_plan_is_the_least_cost_cut_of_the_sorted_items(lengths, batch_tokens, max_batch_size):
    if batch_tokens is None and max_batch_size is None:
        max_batch_size = 3
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches = plan_batches(lengths, batch_tokens=batch_tokens, max_batch_size=max_batch_size)

    def allowed(start, stop):
        size, pos = stop - start, lengths[order[start]]
        return size == 1 or ((max_batch_size is None or size <= max_batch_size)
                             and (batch_tokens is None or size * pos <= batch_tokens))

    least = min(_plan_cost(lengths, [order[a:b] for a, b in runs]) for runs in _partitions(len(lengths))
                if all(allowed(a, b) for a, b in runs))  # brute force over every cut that keeps the bounds
    assert _plan_cost(lengths, batches) == least


@given(lengths=lengths_st, bounds=st.sampled_from([(4096, 64), (300, None), (None, 7), (1000, 16)]), data=st.data())
def test_a_run_of_a_plans_batches_re_plans_to_itself(lengths, bounds, data):
    """What a Ray worker relies on: the items of any run of consecutive batches, planned alone, give those batches."""
    batch_tokens, max_batch_size = bounds
    batches = plan_batches(lengths, batch_tokens=batch_tokens, max_batch_size=max_batch_size)
    start = data.draw(st.integers(0, len(batches) - 1))
    stop = data.draw(st.integers(start + 1, len(batches)))
    items = sorted(i for b in batches[start:stop] for i in b)
    local = plan_batches([lengths[i] for i in items], batch_tokens=batch_tokens, max_batch_size=max_batch_size)
    assert [[items[i] for i in b] for b in local] == batches[start:stop]


def test_budget_packs_short_items_together():
    lengths = [10] * 8 + [100]
    batches = plan_batches(lengths, batch_tokens=40, max_batch_size=None)
    assert batches == [[8], [0, 1, 2, 3], [4, 5, 6, 7]]
    assert padding_stats(lengths, batches).ratio == 1.0


def test_a_long_item_gets_its_own_batch_rather_than_padding_the_short_ones():
    lengths = [10] * 9 + [100]  # all ten fit the budget together, padded to 100: 900 tokens of padding
    assert plan_batches(lengths, batch_tokens=1000, max_batch_size=None) == [[9], list(range(9))]
    assert batch_cost(1, 100) + batch_cost(9, 10) < batch_cost(10, 100)


def test_tiny_items_share_a_batch_rather_than_pay_one_forward_each():
    lengths = [3, 2, 2, 2]  # one batch pads 4 tokens; three batches would cost two more fixed costs
    assert plan_batches(lengths, batch_tokens=None, max_batch_size=4) == [[0, 1, 2, 3]]


def test_padding_stats_by_hand():
    stats = padding_stats([3, 5, 2], [[0, 1], [2]])
    assert (stats.tokens, stats.padded_tokens) == (10, 12)
    assert stats.ratio == pytest.approx(1.2)
    assert stats.to_dict() == {"tokens": 10, "padded_tokens": 12, "ratio": 1.2}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_tokens": 0}, "batch_tokens=0"),
        ({"max_batch_size": -1}, "max_batch_size=-1"),
        ({"batch_tokens": 2.5}, "batch_tokens=2.5"),
        ({"batch_tokens": True}, "batch_tokens=True"),
        ({"batch_tokens": None, "max_batch_size": None}, "both None"),
    ],
)
def test_bad_bounds(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan_batches([3, 4], **kwargs)


def test_zero_length_item_refused():
    with pytest.raises(ValueError, match=r"\(1, 0\)"):
        plan_batches([3, 0])
    with pytest.raises(ValueError, match="batch_size=0"):
        naive_batches(3, batch_size=0)


def _partitions(n):
    """Every way to cut ``range(n)`` into runs of consecutive items, as lists of (start, end)."""
    if n == 0:
        yield []
        return
    for first in range(n):
        for rest in _partitions(first):
            yield [*rest, (first, n)]


@given(lengths=st.lists(st.integers(1, 60), min_size=0, max_size=8), group_cost=st.integers(0, 5000))
def test_length_groups_cover_the_batch_in_order_at_the_least_cost(lengths, group_cost):
    groups = length_groups(lengths, group_cost=group_cost)
    cuts = [(items.start, items.stop) for items, _ in groups]
    assert [i for start, stop in cuts for i in range(start, stop)] == list(range(len(lengths)))
    assert [pos for _, pos in groups] == [max(lengths[start:stop]) for start, stop in cuts]

    def cost(runs):
        return sum(group_cost + (stop - start) * max(lengths[start:stop]) ** 2 for start, stop in runs)

    assert cost(cuts) == min(cost(runs) for runs in _partitions(len(lengths)))  # brute force over every cut


def test_length_groups_cut_off_a_long_item_and_keep_similar_ones_together():
    assert length_groups([200, 100, 99, 98], group_cost=1000) == [(slice(0, 1), 200), (slice(1, 4), 100)]
    assert length_groups([5, 5, 5], group_cost=0) == [(slice(0, 3), 5)]  # nothing to gain: one run
    assert length_groups([200, 100], group_cost=10**9) == [(slice(0, 2), 200)]  # a run costs more than padding


@pytest.mark.parametrize("kwargs, match", [({"lengths": [3, 0]}, r"\(1, 0\)"),
                                           ({"lengths": [3], "group_cost": -1}, "group_cost=-1"),
                                           ({"lengths": [3], "group_cost": 1.5}, "group_cost=1.5")])
def test_length_groups_refuse_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        length_groups(**kwargs)
