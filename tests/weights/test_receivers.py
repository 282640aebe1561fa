"""The explorer's side: one receiver per method, looked up by the published version's method; every method a
trainer can publish by has one; a message that names only where the weights are gets its method. Each receiver's
calls into a real engine actor run in tests/weights/test_fingerprints.py (every method, through the fleet)."""

import pytest

from trinity_like.weights.messages import BroadcastRound, WeightsInfo
from trinity_like.weights.publish import PUBLISHERS
from trinity_like.weights.receive import RECEIVERS, InitialModel, JoinRound, Load, receiver_for


def test_every_publication_method_has_a_receiver_and_version_0_needs_none():
    assert set(RECEIVERS.names()) == set(PUBLISHERS.names()) | {""}
    assert isinstance(receiver_for(WeightsInfo(version=0)), InitialModel)
    assert isinstance(receiver_for(WeightsInfo(version=3, method="broadcast")), JoinRound)
    for method in ("checkpoint", "memory", "ipc"):
        assert type(receiver_for(WeightsInfo(version=3, method=method))) is Load
    with pytest.raises(KeyError, match="unknown weight receiver 'carrier pigeon'"):
        receiver_for(WeightsInfo(version=3, method="carrier pigeon"))


def test_a_broadcast_may_wait_for_a_round_under_way_the_others_get_the_sync_deadline():
    assert receiver_for(WeightsInfo(version=1, method="broadcast")).deadline_s(120.0) == 250.0
    assert receiver_for(WeightsInfo(version=1, path="/v/1")).deadline_s(120.0) == 120.0


def test_the_method_follows_from_where_the_weights_are_when_not_named():
    assert WeightsInfo(version=1, path="/v/1").method == "checkpoint"
    assert WeightsInfo(version=1, refs=["ref"]).method == "memory"
    assert WeightsInfo(version=1, shared={"kind": "shm"}).method == "ipc"
    assert WeightsInfo(version=0).method == ""
    assert WeightsInfo(version=1, path="/v/1", method="broadcast").method == "broadcast"  # named: kept


def test_a_broadcast_round_crosses_as_plain_data_and_comes_back_the_same():
    import json

    r = BroadcastRound(round=3, version=5, generation=2, world=3, addr="10.0.0.1", port=4242, bucket_bytes=1 << 26,
                       backend="gloo", meta=[{"name": "w", "dtype": "bfloat16", "shape": [2, 3], "offset": 0,
                                              "nbytes": 12}], fingerprint="s1-ab")
    mine = r.for_rank(2)
    assert mine.rank == 2 and r.rank == 0
    wire = json.dumps(mine.plain())  # plain data only: what vLLM's msgpack encoder takes without pickling
    assert BroadcastRound.from_plain(json.loads(wire)) == mine
