"""The trainer's device, precision and memory-lean log-probs: what can be checked on a CPU (the CUDA side is in
tests/trainer/test_trainer_gpu.py, marked gpu)."""

import json

import pytest
import torch
from safetensors.torch import load_file

from trinity_like.common.errors import UserError
from trinity_like.common.modeling import load_causal_lm, logprobs_from_logits
from trinity_like.config import ConfigError, load_config
from trinity_like.trainer.batch import ResponseScorer
from trinity_like.trainer.device import dist_backend, resolve_device, to_host
from trinity_like.trainer.ppo import PPOTrainer


def _cfg(tmp_path, model_path, *overrides):
    return load_config(None, [f"checkpoint_root_dir={tmp_path}", "project=t", "name=dev", f"model.path={model_path}",
                              "explorer.batch_size=4", "explorer.repeat_times=3", "trainer.micro_batch_size=4",
                              "trainer.optimizer.lr=0.01", "trainer.device=cpu", *overrides])


# ---------------------------------------------------------------- device and backend


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_device_without_a_gpu():
    assert resolve_device("cpu") == resolve_device("auto") == torch.device("cpu")
    with pytest.raises(UserError, match="gpus_per_worker"):
        resolve_device("cuda")


def test_nccl_only_between_ranks_that_each_hold_a_whole_gpu():
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")  # descriptors: no GPU needed
    assert dist_backend(cuda, 1) == dist_backend(cuda, 2) == "nccl"
    assert dist_backend(cuda, 0.5) == "gloo"  # ranks may share the GPU: NCCL cannot join them
    assert dist_backend(cpu, 0) == dist_backend(cpu, 1) == "gloo"  # never NCCL with CPU tensors


def test_to_host_casts_floating_tensors_only():
    sd = {"w": torch.ones(2, dtype=torch.float32), "n": torch.arange(3)}
    out = to_host(sd, "bfloat16")
    assert out["w"].dtype == torch.bfloat16 and out["n"].dtype == torch.long and out["n"].device.type == "cpu"
    assert to_host(sd, "float32")["w"] is sd["w"]  # already there: no copy


@pytest.mark.parametrize("overrides, message", [
    (["trainer.device=cpu", "trainer.gpus_per_worker=1"], "reserves GPUs"),
    (["trainer.device=auto", "trainer.num_workers=2", "trainer.gpus_per_worker=0.5"], "NCCL cannot join"),
])
def test_gpu_settings_that_cannot_work_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["explorer.batch_size=4", *overrides])


# ---------------------------------------------------------------- chunked log-probs


def _inputs(model, rows=3, prompt=5, response=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (rows, prompt + response), generator=gen)
    mask = torch.ones_like(ids)
    return ids, mask, (mask.cumsum(-1) - 1), ids[:, prompt:]


def test_chunked_log_probs_entropy_and_gradients_equal_the_full_logits(tiny_model_path):
    lm = load_causal_lm(tiny_model_path, train=True)
    ids, mask, pos, resp = _inputs(lm)
    width_p = ids.shape[1] - resp.shape[1]
    # the reference: the model's own forward, full (B, L, V) logits, the shared log-prob rule
    logits = lm(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
    logits = logits[:, width_p - 1:-1]
    ref_lp = logprobs_from_logits(logits, resp, 0.7)
    logp_all = torch.log_softmax(logits.float() / 0.7, -1)
    ref_ent = -(logp_all.exp() * logp_all).sum(-1)
    (ref_lp.sum() + ref_ent.sum()).backward()
    ref_grads = [p.grad.clone() for p in lm.parameters()]
    for chunk in (0, 4, 5, 21, 1000):  # 21 = all tokens; 4 and 5 leave a ragged last chunk
        lm.zero_grad()
        lp, ent = ResponseScorer(lm, chunk)(ids, mask, pos, resp, 0.7, with_entropy=True)
        torch.testing.assert_close(lp, ref_lp, rtol=1e-6, atol=2e-6)
        torch.testing.assert_close(ent, ref_ent, rtol=1e-6, atol=2e-6)
        (lp.sum() + ent.sum()).backward()
        for p, g in zip(lm.parameters(), ref_grads, strict=True):
            torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=2e-6)


def test_chunking_bounds_the_largest_tensor_kept_for_the_backward(tiny_model_path):
    """What autograd keeps for the backward is where the (B, L, V) logits would live: in chunks they are
    recomputed in the backward, so no logits-shaped tensor is kept (and at most one chunk's exists at once)."""
    lm = load_causal_lm(tiny_model_path, train=True)
    ids, mask, pos, resp = _inputs(lm, rows=4, response=16)
    vocab, tokens = lm.config.vocab_size, resp.numel()

    weights = {p.data_ptr() for p in lm.parameters()}

    def largest_saved(chunk):
        sizes = [0]

        def keep(t):
            if t.data_ptr() not in weights and t.shape[-1:] == (vocab,):  # logits-shaped activations
                sizes.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            ResponseScorer(lm, chunk)(ids, mask, pos, resp, 1.0, with_entropy=True)
        return max(sizes)

    assert largest_saved(0) >= tokens * vocab  # one chunk: the full logits are kept
    assert largest_saved(8) == 0  # 8-token chunks: recomputed in the backward, none kept


# ---------------------------------------------------------------- precision


def test_bf16_step_keeps_float32_master_weights_and_stays_close_to_float32(tmp_path, tiny_model_path, batch_exps):
    results = {}
    for dtype in ("float32", "bfloat16"):
        t = PPOTrainer(_cfg(tmp_path / dtype, tiny_model_path, f"trainer.dtype={dtype}", "trainer.logprob_chunk_tokens=7"))
        t.prepare()
        metrics = t.train_step(batch_exps)
        assert all(p.dtype == torch.float32 for p in t.module.parameters())  # master weights
        assert all(s.dtype == torch.float32 for st in t.optimizer.state.values() for s in st.values() if s.dim())
        results[dtype] = (metrics, t.policy_state_dict())
    (m32, w32), (m16, w16) = results["float32"], results["bfloat16"]
    # bf16 keeps 8 mantissa bits: the loss and gradient norm agree to about a percent, and the first Adam step
    # (about lr x the gradient's sign per weight) goes the same way for nearly every weight that moved (where
    # the float32 gradient is near zero, bf16 may flip its sign)
    assert m16["actor/pg_loss"] == pytest.approx(m32["actor/pg_loss"], abs=2e-2)
    assert m16["actor/grad_norm"] == pytest.approx(m32["actor/grad_norm"], rel=5e-2)
    start = load_causal_lm(tiny_model_path).state_dict()
    moved = same = 0
    for k, w in w32.items():
        d32, d16 = w - start[k], w16[k] - start[k]
        big = d32.abs() > 0.005  # lr 0.01: moved at least half a step
        moved += int(big.sum())
        same += int((torch.sign(d32) == torch.sign(d16))[big].sum())
    assert moved > 1000 and same / moved > 0.95


def test_weights_dtype_is_what_leaves_the_trainer_and_resume_stays_exact(tmp_path, tiny_model_path, batch_exps):
    cfg = _cfg(tmp_path, tiny_model_path, "trainer.weights_dtype=bfloat16")
    t = PPOTrainer(cfg)
    t.prepare()
    t.train_step(batch_exps)
    assert {v.dtype for v in t.weights_for_export().values()} == {torch.bfloat16}
    path = t.save_checkpoint()
    hf = load_causal_lm(path / "model")  # an HF checkpoint in bf16 that transformers loads (here as float32)
    exported = {k: v.float() for k, v in t.policy_state_dict().items()}
    for name, p in hf.state_dict().items():
        if name in exported:
            torch.testing.assert_close(p, exported[name], rtol=0, atol=0)
    assert {v.dtype for v in load_file(str(path / "model" / "model.safetensors")).values()} == {torch.bfloat16}
    master = load_file(str(path / "master.safetensors"))
    assert {v.dtype for v in master.values()} == {torch.float32}

    after_one = {k: v.clone() for k, v in t.module.state_dict().items()}
    m2 = t.train_step(batch_exps)
    resumed = PPOTrainer(cfg)
    resumed.prepare()
    resumed.load_checkpoint(path)
    for k, v in resumed.module.state_dict().items():  # the float32 master weights, not their bf16 copy
        torch.testing.assert_close(v, after_one[k], rtol=0, atol=0)
    assert resumed.train_step(batch_exps)["actor/pg_loss"] == m2["actor/pg_loss"]
    assert json.loads((path / "trainer_state.json").read_text())["step"] == 1



# ---------------------------------------------------------------- Ray resources


def test_workers_ask_ray_for_their_gpus_and_an_impossible_request_fails_fast(ray_session):
    from trinity_like.trainer.workers import RayWorkerGroup, ResourcePoolManager

    class _Probe:  # defined here so Ray ships it by value (the workers cannot import test modules)
        """Stands in for a TrainWorker in a placement group: reports what Ray gave its process."""

        def __init__(self, rank: int, world: int) -> None:
            self.rank = rank

        def gpus(self) -> float:
            import ray

            return ray.get_runtime_context().get_assigned_resources().get("GPU", 0.0)

    pools = ResourcePoolManager({"actor": [2]}, cpus_per_worker=0.001, gpus_per_worker=0.5, placement="spread")
    pools.create_resource_pools()
    group = RayWorkerGroup(_Probe, 2, pools.get_resource_pool("actor"), num_gpus=0.5)
    try:
        assert group.execute_all("gpus") == [0.5, 0.5]  # two workers share the session's one GPU
    finally:
        group.kill()
        pools.remove()
    too_many = ResourcePoolManager({"actor": [2]}, cpus_per_worker=0.001, gpus_per_worker=1, timeout_s=2)
    with pytest.raises(UserError, match="could not place 2 trainer workers"):
        too_many.create_resource_pools()


def test_a_run_asking_for_more_gpus_than_the_cluster_has_is_refused_at_once(tmp_path, tiny_model_path, ray_session):
    from trinity_like.common.errors import RunError
    from trinity_like.launcher import run

    cfg = _cfg(tmp_path, tiny_model_path, "trainer.device=auto", "trainer.gpus_per_worker=2")
    with pytest.raises(RunError, match="asks Ray for 2 GPUs but the cluster has 1"):
        run(cfg)
    # engines count with the trainer: half a GPU for the trainer and half for each of two engines is 1.5
    cfg = _cfg(tmp_path, tiny_model_path, "name=gpus2", "trainer.device=auto", "trainer.gpus_per_worker=0.5",
               "explorer.num_engines=2",
               "explorer.gpus_per_engine=0.5")
    with pytest.raises(RunError, match=r"trainer.gpus_per_worker x trainer.num_workers \+ explorer.gpus_per_engine x "
                                       r"explorer.num_engines asks Ray for 1.5 GPUs but the cluster has 1"):
        run(cfg)


def test_engines_ask_ray_for_their_gpu_share_and_an_hf_engine_without_a_visible_gpu_runs_on_the_cpu(
        tmp_path, tiny_model_path, ray_session):
    """The session's GPU is a fake on a machine without one: Ray grants the fraction, CUDA stays invisible, so the
    engine serves on the CPU in float32 (``explorer.dtype: auto``)."""
    import asyncio

    from trinity_like.explorer.fleet import EngineFleet

    cfg = _cfg(tmp_path, tiny_model_path, "explorer.gpus_per_engine=0.5")

    async def main():
        fleet = EngineFleet(cfg)
        try:
            await fleet.ready()
            actor = fleet.slots[0].actor
            granted = await actor.__ray_call__.remote(
                lambda self: __import__("ray").get_runtime_context().get_assigned_resources().get("GPU", 0.0))
            health = await actor.health.remote()
            return granted, health
        finally:
            fleet.kill()

    granted, health = asyncio.run(main())
    assert granted == 0.5
    assert (health["device"], health["dtype"]) == (("cuda:0", "bfloat16") if torch.cuda.is_available() else
                                                   ("cpu", "float32"))


def test_gpus_per_engine_above_one_is_vllm_tensor_parallelism_with_rules(tmp_path, tiny_model_path):
    from trinity_like.config import ConfigError

    base = ["explorer.engine=vllm", "synchronizer.method=memory"]
    with pytest.raises(ConfigError, match="gpus_per_engine=1.5: above 1 an engine takes whole GPUs"):
        _cfg(tmp_path, tiny_model_path, *base, "explorer.gpus_per_engine=1.5")
    with pytest.raises(ConfigError, match="explorer.gpus_per_engine=2 with explorer.engine=hf: only vLLM"):
        _cfg(tmp_path, tiny_model_path, "explorer.gpus_per_engine=2")
    for method in ("broadcast", "ipc"):
        with pytest.raises(ConfigError, match=f"synchronizer.method={method}: .*use synchronizer.method checkpoint"):
            _cfg(tmp_path, tiny_model_path, "explorer.engine=vllm", f"synchronizer.method={method}",
                 "explorer.gpus_per_engine=2")
    assert _cfg(tmp_path, tiny_model_path, *base, "explorer.gpus_per_engine=4").explorer.gpus_per_engine == 4


def test_a_tensor_parallel_engine_runs_in_a_placement_group_of_one_gpu_per_bundle(tmp_path, tiny_model_path,
                                                                                  ray_session):
    """The placement group an engine of 2 GPUs gets (the session's one GPU is a fake, so it stays pending: what is
    checked is what it asks for and where the engine would run, not vLLM's workers)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from trinity_like.explorer.fleet import engine_actor_options

    assert engine_actor_options(_cfg(tmp_path, tiny_model_path, "explorer.gpus_per_engine=0.5")) == (
        {"num_gpus": 0.5}, None)
    cfg = _cfg(tmp_path, tiny_model_path, "explorer.engine=vllm", "synchronizer.method=memory",
               "explorer.gpus_per_engine=2")
    options, group = engine_actor_options(cfg)
    try:
        assert group.bundle_specs == [{"GPU": 1.0, "CPU": 0.01}, {"GPU": 1.0}]
        strategy = options["scheduling_strategy"]
        assert isinstance(strategy, PlacementGroupSchedulingStrategy) and strategy.placement_group is group
        assert strategy.placement_group_bundle_index == 0 and strategy.placement_group_capture_child_tasks
        assert options["num_gpus"] == 0  # the engine's workers hold the GPUs, one per bundle
    finally:
        ray_session.util.remove_placement_group(group)
