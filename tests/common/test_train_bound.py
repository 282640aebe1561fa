"""The training staleness rule (common.train_bound) on hand-made versions at the bounds and slacks."""

import numpy as np
import pytest
import torch

from trinity_like.common.train_bound import row_trainable, token_min_version, token_trained

# bound = step - max_staleness; e.g. step 7, max_staleness 2 -> bound 5


@pytest.mark.parametrize(("oldest", "newest", "slack", "kept"), [
    # slack 0, the rule before: the oldest token decides, whatever the newest
    (5, 5, 0, True), (4, 6, 0, False), (4, 4, 0, False), (6, 9, 0, True),
    # slack 1: trained down to version 4; the row stays while its newest token is >= 4
    (4, 4, 1, True), (3, 4, 1, True), (3, 3, 1, False), (2, 6, 1, True), (0, 3, 1, False),
    # slack 2: down to 3
    (3, 3, 2, True), (2, 2, 2, False), (1, 3, 2, True),
    # version -1 (not this run's policy) is never stale
    (-1, -1, 0, True), (-1, -1, 3, True),
])
def test_a_row_is_dropped_only_when_none_of_its_tokens_is_within_the_bound(oldest, newest, slack, kept):
    assert bool(row_trainable(oldest, newest, 5, slack)) is kept


def test_the_rule_is_the_same_on_arrays_as_on_ints():
    oldest = np.array([5, 4, 3, 3, 2, -1, 0])
    newest = np.array([5, 6, 4, 3, 6, -1, 0])
    for slack in (0, 1, 2):
        got = row_trainable(oldest, newest, 5, slack)
        assert got.tolist() == [bool(row_trainable(int(o), int(n), 5, slack)) for o, n in zip(oldest, newest, strict=True)]
    # slack 0: 5 and -1 only; slack 1: also 4..6 (newest 6), 3..4 and 2..6; slack 2: also 3..3
    assert row_trainable(oldest, newest, 5, 0).tolist() == [True, False, False, False, False, True, False]
    assert row_trainable(oldest, newest, 5, 1).tolist() == [True, True, True, False, True, True, False]
    assert row_trainable(oldest, newest, 5, 2).tolist() == [True, True, True, True, True, True, False]


def test_tokens_older_than_bound_minus_slack_are_masked():
    assert token_min_version(5, 1) == 4 and token_min_version(5, 0) == 5
    versions = torch.tensor([[2, 3, 4, 5, 6], [-1, -1, -1, -1, -1]])
    assert token_trained(versions, 5, 1).tolist() == [[False, False, True, True, True], [True] * 5]
    assert token_trained(versions, 5, 2).tolist() == [[False, True, True, True, True], [True] * 5]
    assert token_trained(np.array([3, 4, 5]), 5, 0).tolist() == [False, False, True]


def test_every_row_kept_keeps_a_token_and_slack_zero_masks_none():
    """Over every (oldest <= newest) pair: a kept row has a trained token (its newest, or it is -1); with a slack a
    row is dropped only when no token is trained; with slack 0 a kept row has no token to mask (its oldest
    passes), while a row whose oldest token is past the bound goes whole."""
    for slack in range(4):
        for oldest in range(-1, 9):
            for newest in (range(oldest, 10) if oldest >= 0 else [-1]):
                if not row_trainable(oldest, newest, 5, slack):
                    assert not token_trained(newest if slack else oldest, 5, slack)
                    continue
                assert token_trained(newest, 5, slack)
                if slack == 0:
                    assert token_trained(oldest, 5, 0)
