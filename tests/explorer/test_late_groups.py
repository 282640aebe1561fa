"""Streaming rollout's late groups (issue 51 item 4, the explorer's side): which running groups are cancelled when a
version is published, and the ``rollout/group_latency_versions`` of written groups; values worked by hand."""

import pytest

from trinity_like.common.experience import Experience
from trinity_like.explorer.stream import group_latency_versions, late_groups


def test_under_finish_a_group_is_cancelled_when_no_token_of_it_could_be_trained():
    # published 7, max_staleness 2, train_slack 1: every row left is trained at version >= 7, bound >= 5, so a
    # token older than 5 - 1 = 4 is masked; a group whose latest call ran on 3 or older has no token left
    running = {"a": 2, "b": 3, "c": 4, "d": 6, "e": 7}
    assert late_groups(running, 7, 2, 1, "finish") == ["a", "b"]
    # train_slack 0: rows are kept or dropped whole at bound 5, so a group on 4 is dropped too
    assert late_groups(running, 7, 2, 0, "finish") == ["a", "b", "c"]
    # a looser slack keeps more: 7 - 2 - 3 = 2
    assert late_groups(running, 7, 2, 3, "finish") == []
    # bound 1, slack 1, published 3: only version 0 is out of reach (3 - 1 - 1 = 1)
    assert late_groups({(0, 1): 0, (1, 0): 1}, 3, 1, 1, "finish") == [(0, 1)]
    assert late_groups({}, 9, 1, 1, "finish") == []


@pytest.mark.parametrize("policy", ["resubmit", "keep"])
def test_under_resubmit_and_keep_no_group_is_cancelled(policy):
    # tokens after a load carry the new version, so a running group always has tokens that can be trained
    assert late_groups({"a": 0, "b": 1}, 10, 1, 1, policy) == []


def _row(group: str, version: int) -> Experience:
    e = Experience(prompt_ids=[1], response_ids=[2], reward=0.0, model_version=version)
    e.group_id = group
    return e


def test_group_latency_is_the_fleet_version_when_written_less_the_version_started_on():
    # g1 started on 3 (its oldest row), g2 on 5; written at fleet version 6: 3 and 1 versions late
    rows = [_row("g1", 4), _row("g1", 3), _row("g2", 5), _row("g2", 5)]
    assert sorted(group_latency_versions(rows, 6)) == [1, 3]
    assert group_latency_versions([], 6) == []

