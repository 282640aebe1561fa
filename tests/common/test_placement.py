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


# ---------------------------------------------------------------- device: auto follows the GPUs Ray assigned
# The session's Ray declares one GPU; on this machine it is a fake (a resource Ray hands out, no CUDA), and
# ``fake_gpu_visible`` stands in for what the GPU machines showed: CUDA visible in every actor of the node,
# whatever share it asked for (Ray leaves CUDA_VISIBLE_DEVICES alone at num_gpus=0).


def _device_seen_by_an_actor(ray, num_gpus: float, setting: str = "auto"):
    @ray.remote(num_cpus=0, num_gpus=num_gpus)
    class Worker:
        def device(self, setting: str):
            from trinity_like.common.errors import UserError
            from trinity_like.common.placement import device_kind, ray_gpu_ids, resolve_device

            def fake_gpu_visible() -> bool:
                return True

            ids = ray_gpu_ids()
            try:
                kind = device_kind(setting, "trainer", ids, fake_gpu_visible())
            except UserError as e:
                kind = f"UserError: {e}"
            resolved = str(resolve_device(setting, "trainer", fake_gpu_visible)) if kind == "cpu" else None
            return ids, kind, resolved

    actor = Worker.remote()
    try:
        return ray.get(actor.device.remote(setting), timeout=60)
    finally:
        ray.kill(actor)


def test_auto_inside_an_actor_follows_the_gpu_ids_ray_assigned_not_what_cuda_shows(ray_session):
    """An actor that asked for no GPU computes on the CPU though CUDA is visible to it (on the H100/H200 a vLLM
    engine and the reward model at 0 GPUs took GPU memory beside the trainer); one given a share uses it."""
    ids, kind, resolved = _device_seen_by_an_actor(ray_session, 0)
    assert (ids, kind, resolved) == ([], "cpu", "cpu")
    ids, kind, _ = _device_seen_by_an_actor(ray_session, 0.5)
    assert (ids, kind) == (["0"], "cuda")
    # `cuda` in an actor Ray gave no GPU: refused naming the key that asks for one
    _, kind, _ = _device_seen_by_an_actor(ray_session, 0, "cuda")
    assert kind.startswith("UserError: trainer.device is cuda but this trainer worker was given no GPU by Ray")
    assert "trainer.gpus_per_worker" in kind


def test_outside_ray_auto_is_what_the_process_sees(ray_session):
    """The driver (a bench, a test, the launcher) is no Ray worker: no ids, so it uses what CUDA shows."""
    from trinity_like.common.errors import UserError
    from trinity_like.common.placement import device_kind, ray_gpu_ids

    assert ray_gpu_ids() is None
    assert device_kind("auto", "explorer", None, cuda_visible=True) == "cuda"
    assert device_kind("auto", "explorer", None, cuda_visible=False) == "cpu"
    assert device_kind("cpu", "explorer", ["0"], cuda_visible=True) == "cpu"
    with pytest.raises(UserError, match="explorer.device is cuda but this rollout engine sees no GPU.*"
                                        "explorer.gpus_per_engine"):
        device_kind("cuda", "explorer", None, cuda_visible=False)
    with pytest.raises(ValueError, match="device must be auto, cpu or cuda"):
        device_kind("gpu", "trainer", [], cuda_visible=True)


def test_the_trainer_and_the_hf_engine_resolve_their_device_by_this_one_helper():
    from trinity_like.common import placement
    from trinity_like.explorer.engines import hf_engine
    from trinity_like.trainer import device

    assert hf_engine.resolve_device is placement.resolve_device
    assert device.resolve_process_device is placement.resolve_device
