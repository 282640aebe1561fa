"""The explorer's side: one receiver per method, looked up by the published version's method; every method a
trainer can publish by has one; a message that names only where the weights are gets its method. Each receiver's
calls into a real engine actor run in tests/weights/test_fingerprints.py (every method, through the fleet).
Engines read a version through one source per method (``read_weights``), the same for hf and vLLM."""

import pytest

from trinity_like.weights.messages import BroadcastRound, SharedHandle, WeightsInfo
from trinity_like.weights.publish import PUBLISHERS
from trinity_like.weights.receive import (
    RECEIVERS,
    SOURCES,
    InitialModel,
    JoinRound,
    Load,
    read_weights,
    receiver_for,
    weight_source,
)


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


def test_every_method_an_engine_reads_itself_has_one_source_and_an_update_names_exactly_one():
    import torch

    assert set(SOURCES.names()) == {m for m in PUBLISHERS.names() if type(receiver_for(WeightsInfo(1, method=m)))
                                    is Load}
    sd = {"w": torch.ones(2, 3)}
    got = read_weights(WeightsInfo(version=1, state_dict=sd))
    assert got.state_dict is sd and got.bytes == 24 and got.checked == ""
    assert weight_source(WeightsInfo(version=1, path="/v/1")).by_reference
    assert not weight_source(WeightsInfo(version=1, state_dict=sd)).by_reference
    with pytest.raises(ValueError, match=r"exactly one of path, state_dict and shared, got \['path', 'state_dict'\]"):
        read_weights(WeightsInfo(version=1, path="/v/1", state_dict=sd))
    with pytest.raises(ValueError, match="got none"):
        read_weights(WeightsInfo(version=1))
    with pytest.raises(KeyError, match="unknown weight source 'broadcast'; valid names: checkpoint, ipc, memory"):
        read_weights(WeightsInfo(version=1, state_dict=sd, method="broadcast"))
    with pytest.raises(ValueError, match="method 'ipc' is read from shared, this update names path"):
        read_weights(WeightsInfo(version=1, path="/v/1", method="ipc"))


def test_a_shared_handle_is_typed_checks_its_kind_and_crosses_as_plain_data():
    import json

    handle = SharedHandle(version=2, kind="shm", size=12, node="host:boot", fingerprint="s1-ab", path="/dev/shm/v2",
                          meta=[{"name": "w", "dtype": "float32", "shape": [3], "offset": 0, "nbytes": 12}])
    info = WeightsInfo(version=2, shared=handle, fingerprint="s1-ab")
    assert info.method == "ipc" and handle.names() == ["w"]
    assert WeightsInfo.from_plain(json.loads(json.dumps(info.plain()))) == info
    with pytest.raises(ValueError, match="unknown shared buffer kind 'gpu'; valid kinds: cuda, shm"):
        SharedHandle(version=2, kind="gpu", size=12, node="n", fingerprint="", meta=[], path="/p")
    with pytest.raises(ValueError, match="kind cuda needs a CUDA IPC handle"):
        SharedHandle(version=2, kind="cuda", size=12, node="n", fingerprint="", meta=[], path="/p")
