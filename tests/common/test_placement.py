"""Placement of a part's actors by the custom resources and labels of ``*.node``, on the real Ray instance of
the session (one node: its labels are Ray's own, ``ray.io/node-id``)."""

from __future__ import annotations

import pytest

from trinity_like.common.errors import RunError
from trinity_like.common.placement import actor_options, bundle, bundle_label_selector, check_placeable
from trinity_like.config import NodeConfig


def test_options_and_bundles_carry_the_resources_and_labels_asked_for():
    node = NodeConfig(resources={"rollout_node": 0.01}, labels={"pool": "rollout"})
    assert actor_options(node) == {"resources": {"rollout_node": 0.01}, "label_selector": {"pool": "rollout"}}
    assert actor_options(NodeConfig()) == {}
    assert bundle(node, {"CPU": 1, "GPU": 1}) == {"CPU": 1, "GPU": 1, "rollout_node": 0.01}
    assert bundle_label_selector(node, 2) == [{"pool": "rollout"}, {"pool": "rollout"}]
    assert bundle_label_selector(NodeConfig(resources={"x": 1}), 2) is None


def test_a_placement_no_live_node_offers_is_refused_naming_what_the_nodes_have(ray_session):
    with pytest.raises(RunError) as err:
        check_placeable(NodeConfig(resources={"rollout_node": 0.01}), "explorer.node")
    msg = str(err.value)
    assert "explorer.node" in msg and "resource rollout_node>=0.01" in msg and "custom resources: none" in msg
    assert "ray start --address" in msg
    with pytest.raises(RunError, match="label pool=rollout"):
        check_placeable(NodeConfig(labels={"pool": "rollout"}), "trainer.node")


def test_an_actor_pinned_by_label_runs_on_the_node_that_carries_it(ray_session):
    ray = ray_session
    node_id = ray.get_runtime_context().get_node_id()
    node = NodeConfig(labels={"ray.io/node-id": node_id})
    check_placeable(node, "trainer.node")  # the node carries the label: no error

    @ray.remote(num_cpus=0)
    def where() -> str:
        return ray.get_runtime_context().get_node_id()

    assert ray.get(where.options(**actor_options(node)).remote(), timeout=60) == node_id
