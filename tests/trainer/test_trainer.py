import math

import pytest
import torch

from trinity_like.algorithms import compute_grpo_outcome_advantage, compute_policy_loss
from trinity_like.common.experience import Experience
from trinity_like.common.modeling import export_state_dict, load_causal_lm
from trinity_like.common.tokenizer import hf_tokenizer
from trinity_like.config import load_config
from trinity_like.explorer.engines.base import WeightUpdate
from trinity_like.explorer.engines.hf_engine import HFEngine
from trinity_like.trainer.batch import compute_log_probs, experiences_to_batch, staleness
from trinity_like.trainer.ppo import PPOTrainer


def _trainer(tmp_path, model_path, *overrides):
    # compared with references computed on the CPU: pinned there (`auto` would take a GPU where there is one)
    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={model_path}", "trainer.device=cpu",
                             "explorer.repeat_times=3", "trainer.optimizer.lr=0.01", *overrides])
    trainer = PPOTrainer(cfg)
    trainer.prepare()
    return trainer


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_result_does_not_depend_on_micro_batch_size(tmp_path, tiny_model_path, batch_exps, mode):
    # one sequence whose tokens are all masked out (e.g. only tool output) must not count as a sequence
    batch_exps = list(batch_exps)
    e = batch_exps[4]
    batch_exps[4] = Experience(**{**e.__dict__, "action_mask": [False] * len(e.response_ids)})
    # SGD isolates the gradient: AdamW's first step is sign-like and would hide a mis-scaled gradient.
    weights = []
    for micro in (1, 5, 12):
        t = _trainer(tmp_path, tiny_model_path, f"trainer.micro_batch_size={micro}", f"algorithm.loss_agg_mode={mode}",
                     "trainer.optimizer.max_grad_norm=0")
        t.optimizer = torch.optim.SGD(t.model.parameters(), lr=1.0)
        metrics = t.train_step(batch_exps)
        weights.append(export_state_dict(t.module))
        assert metrics["actor/grad_norm"] > 0
    # reference: one loss over the whole batch, written out directly
    ref = _trainer(tmp_path, tiny_model_path)
    batch = experiences_to_batch(batch_exps, ref.pad_token_id)
    adv, _ = compute_grpo_outcome_advantage(batch["token_level_rewards"], batch["response_mask"],
                                            index=batch["group_index"].tolist())
    log_prob = compute_log_probs(ref.model, batch, 1.0)
    loss, *_ = compute_policy_loss(batch["old_log_probs"], log_prob, adv, batch["response_mask"], cliprange=0.2,
                                   loss_agg_mode=mode)
    loss.backward()
    with torch.no_grad():
        for p in ref.model.parameters():
            p -= p.grad
    expected = export_state_dict(ref.module)
    for got in weights:
        for k in expected:
            torch.testing.assert_close(got[k], expected[k], rtol=1e-4, atol=1e-6)


def test_first_step_on_fresh_data_is_on_policy(tmp_path, tiny_model_path, batch_exps):
    t = _trainer(tmp_path, tiny_model_path)
    metrics = t.train_step(batch_exps)
    # behaviour log-probs came from the same weights: ratio 1, nothing clipped, no KL between them
    assert abs(metrics["actor/ppo_kl"]) < 1e-5
    assert metrics["actor/pg_clipfrac"] == 0.0
    assert metrics["train/staleness_max"] == 0.0 and t.train_step_num == 1
    assert metrics["train/reward_mean"] == pytest.approx(4 / 12)


def test_missing_behaviour_logprobs_are_recomputed(tmp_path, tiny_model_path, batch_exps):
    t = _trainer(tmp_path, tiny_model_path)
    stripped = [Experience(**{**e.__dict__, "logprobs": None}) for e in batch_exps]
    metrics = t.train_step(stripped)
    assert abs(metrics["actor/ppo_kl"]) < 1e-5


def test_state_dict_and_checkpoint_files(tmp_path, tiny_model_path, batch_exps):
    t = _trainer(tmp_path, tiny_model_path)
    t.train_step(batch_exps)
    path = t.save_state_dict()
    assert path.name == "version-00000001" and (path / "manifest.json").is_file()
    engine = HFEngine(tiny_model_path, device="cpu")
    engine.update_weights(WeightUpdate(version=1, path=str(path)))
    trained = export_state_dict(t.module)
    for k, v in export_state_dict(engine.model).items():
        assert torch.equal(v, trained[k])
    ckpt = t.save_checkpoint()
    assert ckpt.name == "step_1" and t.latest_checkpoint() == ckpt
    assert sorted(p.name for p in ckpt.iterdir()) == ["checksums.json", "model", "optimizer.pt", "rng.pt",
                                                      "scheduler.pt", "trainer_state.json"]
    assert not [p for p in ckpt.parent.iterdir() if p.name.startswith(".")]  # no temp folders left
    # the checkpoint's model loads in plain transformers, with its tokenizer, and holds the trained weights
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(ckpt / "model")
    for k, v in export_state_dict(plain).items():
        assert torch.equal(v, trained[k])
    assert hf_tokenizer(str(ckpt / "model")).encode("1+2=") == hf_tokenizer(tiny_model_path).encode("1+2=")


def test_resume_is_exact(tmp_path, tiny_model_path, batch_exps):
    # 4 steps straight == 2 steps, checkpoint, a fresh trainer resumes, 2 more steps
    cfg = ["trainer.total_steps=4", "trainer.optimizer.warmup_steps=2", "trainer.optimizer.lr_schedule=cosine",
           "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive", "trainer.ppo_epochs=2",
           "trainer.mini_batch_size=6"]
    straight = _trainer(tmp_path / "a", tiny_model_path, *cfg)
    for _ in range(4):
        straight.train_step(batch_exps)
    first = _trainer(tmp_path / "b", tiny_model_path, *cfg)
    for _ in range(2):
        first.train_step(batch_exps)
    first.save_checkpoint()
    resumed = _trainer(tmp_path / "b", tiny_model_path, *cfg)
    resumed.load_checkpoint(resumed.latest_checkpoint())
    assert resumed.train_step_num == 2
    for _ in range(2):
        resumed.train_step(batch_exps)
    a, b = export_state_dict(straight.module), export_state_dict(resumed.module)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.kl_ctrl.value == straight.kl_ctrl.value
    assert resumed.optimizer.param_groups[0]["lr"] == straight.optimizer.param_groups[0]["lr"]


def test_only_the_newest_checkpoints_are_kept(tmp_path, tiny_model_path, batch_exps):
    t = _trainer(tmp_path, tiny_model_path, "trainer.keep_checkpoints=2")
    for _ in range(3):
        t.train_step(batch_exps)
        t.save_checkpoint()
    assert sorted(p.name for p in t.paths.checkpoint_dir.glob("step_*")) == ["step_2", "step_3"]
    assert (t.paths.checkpoint_dir / "latest").read_text().strip() == "3"


@pytest.mark.parametrize("estimator", ["dapo", "gae", "grpo", "rloo", "opmd", "reinforce_plus_plus", "reinforce_plus_plus_baseline"])
@pytest.mark.parametrize("loss", ["vanilla", "gspo", "cispo", "reinforce", "sft"])
def test_every_registered_estimator_and_loss_trains(tmp_path, tiny_model_path, batch_exps, estimator, loss):
    t = _trainer(tmp_path, tiny_model_path, f"algorithm.adv_estimator={estimator}", f"algorithm.policy_loss={loss}")
    before = export_state_dict(t.module)
    metrics = t.train_step(batch_exps)
    assert all(isinstance(v, float) and v == v for v in metrics.values())  # finite numbers, no NaN
    after = export_state_dict(t.module)
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_remax_trains_on_greedy_baselines_and_fails_clearly_without_one(tmp_path, tiny_model_path, batch_exps):
    # the explorer stores each task's greedy reward as info["reward_baseline"]; here .5 for every row. The reward
    # sits on the last token, so each valid token's return is R and its advantage R - .5
    with_baseline = [Experience(**{**e.__dict__, "info": {"reward_baseline": 0.5}}) for e in batch_exps]
    t = _trainer(tmp_path, tiny_model_path, "algorithm.adv_estimator=remax")
    before = export_state_dict(t.module)
    metrics = t.train_step(with_baseline)
    lengths = [len(e.response_ids) for e in batch_exps]
    expected = sum(n * (e.reward - 0.5) for n, e in zip(lengths, batch_exps, strict=True)) / sum(lengths)
    assert metrics["critic/advantages/mean"] == pytest.approx(expected, abs=1e-6)
    after = export_state_dict(t.module)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # one row without a baseline (imported, or from another workflow): a clear error, not a silent baseline
    with pytest.raises(ValueError, match=r"remax needs a reward baseline for every row, 1 of 12 rows have none"):
        t.train_step(with_baseline[:11] + [batch_exps[11]])


@pytest.mark.parametrize("correction", ["tis", "seq_tis", "icepop", "seq_mis", "geo_mask", "decoupled"])
def test_off_policy_corrections_on_stale_rows(tmp_path, tiny_model_path, batch_exps, correction):
    # pretend the rows came from an older policy: shift their behaviour log-probs, and drop them for two rows
    stale = []
    for i, e in enumerate(batch_exps):
        shift = 0.3 if i % 2 else -0.3  # rows alternately more and less likely under the behaviour policy
        logprobs = None if i < 2 else [lp + shift for lp in e.logprobs]
        stale.append(Experience(**{**e.__dict__, "logprobs": logprobs, "model_version": 0}))
    t = _trainer(tmp_path, tiny_model_path, f"algorithm.off_policy.correction={correction}",
                 "algorithm.off_policy.cap=1.2", "algorithm.off_policy.low=0.8", "algorithm.off_policy.high=1.2")
    metrics = t.train_step(stale)
    assert 0 < metrics["off_policy/ess"] <= 1.0
    assert metrics["off_policy/unknown_behaviour_frac"] == pytest.approx(2 / 12)
    # behaviour differs from the proximal policy by exp(-+0.3) = 0.74 / 1.35 per token: weights are not all 1
    assert metrics["off_policy/weight_max"] != 1.0 or metrics["off_policy/masked_frac"] > 0
    assert abs(metrics["actor/ppo_kl"]) < 1e-5  # the PPO ratio is against the recomputed proximal policy


def test_negative_cap_raises_weights_the_correction_cut_on_negative_advantages(tmp_path, tiny_model_path,
                                                                               batch_exps):
    # behaviour 0.7 nats below the proximal policy on every token: rho = 2.01 > cap 1.2, so tis truncates all
    stale = [Experience(**{**e.__dict__, "logprobs": [lp - 0.7 for lp in e.logprobs], "model_version": 0})
             for e in batch_exps]
    raised = {}
    for negative_cap in (0.0, 1.5):
        t = _trainer(tmp_path, tiny_model_path, "algorithm.off_policy.correction=tis", "algorithm.off_policy.cap=1.2",
                     f"algorithm.off_policy.negative_cap={negative_cap}")
        raised[negative_cap] = t.train_step(stale)
    assert "off_policy/negative_raised_frac" not in raised[0.0]
    assert 0 < raised[1.5]["off_policy/negative_raised_frac"] < 1  # the tokens with a negative advantage
    assert raised[1.5]["actor/pg_loss"] != raised[0.0]["actor/pg_loss"]


def test_token_budget_micro_batches_give_the_same_update(tmp_path, tiny_model_path, batch_exps):
    weights = []
    for overrides in (["trainer.micro_batch_size=12"], ["trainer.max_token_len_per_micro_batch=25"]):
        t = _trainer(tmp_path, tiny_model_path, "trainer.optimizer.max_grad_norm=0", *overrides)
        t.optimizer = torch.optim.SGD(t.model.parameters(), lr=1.0)
        t.train_step(batch_exps)
        weights.append(export_state_dict(t.module))
    assert len(t._micro_batches(experiences_to_batch(batch_exps, t.pad_token_id))) > 1  # really split
    for k in weights[0]:
        torch.testing.assert_close(weights[1][k], weights[0][k], rtol=1e-4, atol=1e-6)


def test_epochs_and_mini_batches_are_seeded_updates(tmp_path, tiny_model_path, batch_exps):
    runs = []
    for _ in range(2):
        t = _trainer(tmp_path, tiny_model_path, "trainer.ppo_epochs=2", "trainer.mini_batch_size=6")
        metrics = t.train_step(batch_exps)
        runs.append(export_state_dict(t.module))
        assert metrics["actor/updates"] == 4.0 and t.train_step_num == 1  # 2 epochs x 2 mini-batches, one version
    one = _trainer(tmp_path, tiny_model_path)
    one.train_step(batch_exps)
    single = export_state_dict(one.module)
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in single)  # same seed, same shuffles
    assert any(not torch.equal(runs[0][k], single[k]) for k in single)  # four updates moved further


def test_learning_rate_schedule_by_hand(tmp_path, tiny_model_path):
    t = _trainer(tmp_path, tiny_model_path, "trainer.total_steps=3", "trainer.optimizer.warmup_steps=2",
                 "trainer.optimizer.lr_schedule=cosine", "trainer.optimizer.min_lr_ratio=0.1")
    # one update per step, 3 updates: warm-up 1/2, 2/2; then cosine over the 1 update left: 1.0 -> 0.1
    assert [t._lr_factor(u) for u in range(4)] == pytest.approx([0.5, 1.0, 1.0, 0.1])


def test_kl_loss_entropy_and_in_reward_kl(tmp_path, tiny_model_path, batch_exps):
    t = _trainer(tmp_path, tiny_model_path, "algorithm.use_kl_loss=true", "algorithm.kl_loss_coef=0.1",
                 "algorithm.entropy_coeff=0.01", "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive",
                 "algorithm.kl_ctrl.kl_coef=0.2", "algorithm.kl_ctrl.target_kl=0.01", "algorithm.kl_ctrl.horizon=100",
                 "trainer.optimizer.lr=0.05")
    first = t.train_step(batch_exps)
    assert abs(first["actor/kl_loss"]) < 1e-6  # the policy still equals the reference model
    assert abs(first["actor/reward_kl_penalty"]) < 1e-6 and first["actor/reward_kl_penalty_coeff"] == 0.2
    assert first["actor/entropy"] > 0
    # KL 0 is below the 0.01 target: error clipped to -0.2, beta *= 1 - 0.2 * 12 / 100 = 0.976
    assert t.kl_ctrl.value == pytest.approx(0.2 * 0.976)
    second = t.train_step(batch_exps)
    assert second["actor/kl_loss"] > 1e-6  # the update moved the policy away from the reference


def test_gradient_checkpointing_gives_the_same_step(tmp_path, tiny_model_path, batch_exps):
    weights = []
    for flag in ("false", "true"):
        t = _trainer(tmp_path, tiny_model_path, f"trainer.gradient_checkpointing={flag}")
        t.train_step(batch_exps)
        weights.append(export_state_dict(t.module))
    for k in weights[0]:
        torch.testing.assert_close(weights[1][k], weights[0][k], rtol=1e-5, atol=1e-7)


def _nll(model, exps, pad):
    batch = experiences_to_batch(exps, pad)
    with torch.no_grad():
        lp = compute_log_probs(model, batch, 1.0)
    return float(-(lp * batch["response_mask"]).sum() / batch["response_mask"].sum())


def test_sft_lowers_the_nll_of_its_data(tmp_path, tiny_model_path, batch_exps):
    t = _trainer(tmp_path, tiny_model_path, "algorithm.policy_loss=sft", "trainer.optimizer.lr=0.01")
    before = _nll(t.model, batch_exps, t.pad_token_id)
    for _ in range(5):
        metrics = t.train_step(batch_exps)
    after = _nll(t.model, batch_exps, t.pad_token_id)
    assert after < before - 0.5  # nats per token
    assert metrics["actor/sft_nll"] < before


def test_dpo_raises_the_chosen_minus_rejected_margin(tmp_path, tiny_model_path, batch_exps):
    # pairs: two responses per group, the higher reward is the chosen one
    pairs = [Experience(**{**e.__dict__, "group_id": f"p{i // 2}", "reward": float(i % 2 == 0)})
             for i, e in enumerate(batch_exps)]
    t = _trainer(tmp_path, tiny_model_path, "algorithm.policy_loss=dpo", "explorer.repeat_times=2",
                 "trainer.micro_batch_size=4", "trainer.ppo_epochs=2", "trainer.mini_batch_size=6",
                 "algorithm.dpo_beta=0.5", "trainer.optimizer.lr=0.01")

    def margin():
        batch = experiences_to_batch(pairs, t.pad_token_id)  # chosen rows are the even ones here
        with torch.no_grad():
            seq = (compute_log_probs(t.model, batch, 1.0) * batch["response_mask"]).sum(-1)
        return float((seq[0::2] - seq[1::2]).mean())

    before = margin()
    first = t.train_step(pairs)
    for _ in range(3):
        last = t.train_step(pairs)
    assert margin() > before + 0.5
    assert last["actor/dpo_accuracy"] >= first["actor/dpo_accuracy"] and last["actor/dpo_accuracy"] > 0.5
    with pytest.raises(ValueError, match="groups of two"):
        t.train_step(pairs[:3])


def test_gae_with_a_critic_trains_20_steps_without_nans_and_resumes(tmp_path, tiny_model_path, batch_exps):
    cfg = ["algorithm.adv_estimator=gae", "algorithm.gamma=0.99", "algorithm.lam=0.95", "trainer.critic.lr=0.01",
           "trainer.total_steps=20"]
    t = _trainer(tmp_path, tiny_model_path, *cfg)
    losses = []
    for _ in range(20):
        m = t.train_step(batch_exps)
        assert all(math.isfinite(v) for v in m.values())
        losses.append(m["critic/vf_loss"])
    assert losses[0] > 0 and min(losses[-5:]) < losses[0] / 2  # the critic learns the returns of its data
    assert m["critic/values_mean"] != 0.0
    path = t.save_checkpoint()
    assert (path / "critic.pt").is_file()
    again = _trainer(tmp_path, tiny_model_path, *cfg)
    again.load_checkpoint(path)
    for k, v in again.critic.state_dict().items():
        assert torch.equal(v, t.critic.state_dict()[k])


def test_lora_step_changes_only_adapter_weights(tmp_path, tiny_model_path, batch_exps):
    pytest.importorskip("peft")
    t = _trainer(tmp_path, tiny_model_path, "trainer.lora.enabled=true", "trainer.lora.r=4",
                 "algorithm.use_kl_loss=true", "trainer.optimizer.lr=0.05")
    before = {k: v.clone() for k, v in t.module.state_dict().items()}
    merged_before = t.policy_state_dict()
    first = t.train_step(batch_exps)
    assert abs(first["actor/kl_loss"]) < 1e-6  # reference = base with adapters off = the policy before training
    t.train_step(batch_exps)
    after = t.module.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora_" in k for k in changed)  # only adapter weights moved
    merged = t.policy_state_dict()
    assert merged.keys() == merged_before.keys() == export_state_dict(load_causal_lm(tiny_model_path)).keys()
    assert any(not torch.equal(merged[k], merged_before[k]) for k in merged)  # what explorers get moved
    engine = HFEngine(tiny_model_path, device="cpu")
    from trinity_like.explorer.engines.base import WeightsMismatch
    from trinity_like.weights.fingerprint import weights_fingerprint

    # the version's fingerprint is of the merged weights: weights whose adapters were never applied (the base
    # alone) do not verify, and the engine keeps the version it has
    with pytest.raises(WeightsMismatch, match="refused"):
        engine.update_weights(WeightUpdate(version=2, state_dict=merged_before, fingerprint=weights_fingerprint(merged)))
    assert engine.model_version == 0
    # the merged weights fit the plain model and verify
    engine.update_weights(WeightUpdate(version=2, state_dict=merged, fingerprint=weights_fingerprint(merged)))
    assert engine.verified and engine.fingerprint == weights_fingerprint(merged)
    path = t.save_checkpoint()
    again = _trainer(tmp_path, tiny_model_path, "trainer.lora.enabled=true", "trainer.lora.r=4",
                     "algorithm.use_kl_loss=true", "trainer.optimizer.lr=0.05")
    again.load_checkpoint(path)
    assert all(torch.equal(v, again.policy_state_dict()[k]) for k, v in merged.items())


def two_workers_match_one(tmp_path, model_path, exps, overrides: list[str]) -> dict[str, float]:
    """Train one step on ``exps`` with one trainer and with two data-parallel workers; assert the weights
    agree (and the replicas are identical); return rank 0's metrics."""
    from trinity_like.trainer.workers import start_train_workers

    single = _trainer(tmp_path / "one", model_path, *overrides)
    single.train_step(exps)
    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path / 'two'}", f"model.path={model_path}",
                             "trainer.device=cpu", "explorer.device=cpu",
                             "explorer.repeat_times=3", "trainer.optimizer.lr=0.01", "trainer.num_workers=2",
                             *overrides])
    group = start_train_workers(cfg)
    try:
        metrics = group.execute_all("train_step", exps)
        rank0, rank1 = group.execute_all("state_dict")
    finally:
        group.kill()
        group.pools.remove()
    expected = single.policy_state_dict()
    for k in expected:
        torch.testing.assert_close(rank0[k], expected[k], rtol=1e-5, atol=1e-5)
        assert torch.equal(rank0[k], rank1[k])  # the replicas stay identical
    return metrics[0]


@pytest.mark.slow
@pytest.mark.parametrize("estimator,strategy", [("grpo", "ddp"), ("gae", "ddp"), ("gae", "fsdp2")])
def test_one_and_two_data_parallel_workers_agree(tmp_path, tiny_model_path, batch_exps, ray_session, estimator,
                                                 strategy):
    # At the default learning rate: Adam's first update lr * g / (|g| + eps) turns float-summation noise on
    # gradients near eps into differences of ~lr * 0.5%, which a large lr would push past the tolerance.
    overrides = [f"algorithm.adv_estimator={estimator}", "trainer.micro_batch_size=2", "trainer.optimizer.lr=1e-4",
                 "trainer.critic.lr=1e-4", f"trainer.strategy={strategy}"]
    metrics = two_workers_match_one(tmp_path, tiny_model_path, batch_exps, overrides)
    assert metrics["train/batch_size"] == 12.0


@pytest.mark.slow
def test_fsdp2_checkpoint_resumes_exactly_and_loads_in_transformers(tmp_path, tiny_model_path, batch_exps,
                                                                    ray_session):
    from transformers import AutoModelForCausalLM

    from trinity_like.common.errors import UserError
    from trinity_like.trainer.workers import DataParallelTrainer
    from trinity_like.weights.files import read_weights

    overrides = ["algorithm.adv_estimator=gae", "trainer.micro_batch_size=2", "trainer.num_workers=2",
                 "trainer.strategy=fsdp2", "trainer.optimizer.warmup_steps=3"]
    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={tiny_model_path}",
                             "trainer.device=cpu", "explorer.device=cpu",
                             "name=fsdp2",
                             "explorer.repeat_times=3", "trainer.optimizer.lr=0.01", *overrides])
    import ray

    from trinity_like.runtime.paths import namespace_of
    from trinity_like.synchronizer import CheckpointMonitor, get_synchronizer

    synchronizer = get_synchronizer(namespace_of(cfg))
    straight = DataParallelTrainer(cfg, synchronizer)
    straight.prepare()
    try:
        straight.train_step(batch_exps)
        after_one = straight.group.execute_all("state_dict")[0]
        path = straight.save_checkpoint()
        straight.train_step(batch_exps)
        after_two = straight.group.execute_all("state_dict")[0]
        version = straight.save_state_dict()
        assert ray.get(CheckpointMonitor.get_actor(namespace_of(cfg)).monitor_step.remote(2, True, 60))
        published, _ = read_weights(version)
        assert ray.get(synchronizer.latest.remote()).version == 2  # the monitor published it
    finally:
        straight.shutdown()
    # both ranks wrote a share of the tensors; the monitor completed the version
    assert sorted(p.name for p in version.iterdir()) == [
        "manifest.json", "part-00000-of-00002.safetensors", "part-00001-of-00002.safetensors"]
    assert published.keys() == after_two.keys()
    assert all(torch.equal(published[k], after_two[k]) for k in after_two)  # the gathered shards, whole

    plain = export_state_dict(AutoModelForCausalLM.from_pretrained(path / "model"))
    assert plain.keys() == after_one.keys()
    assert all(torch.equal(plain[k], after_one[k]) for k in plain)
    initial = export_state_dict(load_causal_lm(tiny_model_path))
    assert any(not torch.equal(plain[k], initial[k]) for k in plain)

    resumed = DataParallelTrainer(cfg, synchronizer)
    resumed.prepare()
    try:
        resumed.load_checkpoint(path)
        assert resumed.train_step_num == 1
        resumed.train_step(batch_exps)  # uses the restored optimizer moments, schedule and critic
        again = resumed.group.execute_all("state_dict")[0]
    finally:
        resumed.shutdown()
        ray.kill(CheckpointMonitor.get_actor(namespace_of(cfg)))
        ray.kill(synchronizer)
    for k in after_two:
        torch.testing.assert_close(again[k], after_two[k], rtol=0, atol=1e-6)

    single = _trainer(tmp_path / "single", tiny_model_path, "algorithm.adv_estimator=gae")
    with pytest.raises(UserError, match="written by a 'fsdp2' trainer"):
        single.load_checkpoint(path)


def test_rows_not_generated_by_this_run_have_no_staleness(tmp_path, tiny_model_path, batch_exps):
    import copy

    t = _trainer(tmp_path, tiny_model_path)
    t.train_step(batch_exps)
    t.train_step(batch_exps)  # the trainer is at version 2 now
    assert t.train_step(batch_exps)["train/staleness_max"] == 2.0  # generated by version 0
    imported = [copy.copy(e) for e in batch_exps]
    for e in imported:
        e.model_version = -1  # demonstrations, imported rows: not this run's policy
    metrics = t.train_step(imported)
    assert metrics["train/staleness_max"] == 0.0 and metrics["train/staleness_mean"] == 0.0


def _versioned_rows() -> list[Experience]:
    """Four rows for a trainer at version 2 (worked by hand below): per-token versions, one masked token, a row of
    one older version, an imported row and a fresh one."""
    def row(gid, i, response, version, **kw):
        return Experience(prompt_ids=[5, 6, 7], response_ids=response, group_id=gid, eid=f"{gid}-{i}",
                          reward=float(i), model_version=version, **kw)

    return [row("a", 0, [11, 12, 13], 0, token_versions=[0, 1, 2]),  # token staleness 2, 1, 0
            row("a", 1, [14, 15], 1, action_mask=[True, False]),  # 1 and a masked token
            row("b", 0, [16], -1),  # imported: 0
            row("b", 1, [17, 18], 2)]  # fresh: 0, 0


def test_a_batch_carries_each_tokens_version():
    batch = experiences_to_batch(_versioned_rows(), pad_token_id=0)
    # padding columns take the row's model_version (every mask leaves them out)
    assert batch["token_versions"].tolist() == [[0, 1, 2], [1, 1, 1], [-1, -1, -1], [2, 2, 2]]
    assert staleness(batch["token_versions"], 2).tolist() == [[2, 1, 0], [1, 1, 1], [0, 0, 0], [0, 0, 0]]
    assert staleness(batch["model_version"], 2).tolist() == [2, 1, 0, 0]
    assert staleness(torch.tensor([3]), 2).tolist() == [0]  # replayed from a run further on: never negative


def test_staleness_is_per_token_and_the_row_metrics_keep_the_oldest(tmp_path, tiny_model_path, batch_exps):
    t = _trainer(tmp_path, tiny_model_path, "algorithm.off_policy.correction=tis")
    t.train_step(batch_exps)
    t.train_step(batch_exps)  # the trainer is at version 2 now
    metrics = t.train_step(_versioned_rows())
    # rows: oldest versions 0, 1, -1, 2 -> staleness 2, 1, 0, 0
    assert metrics["train/staleness_mean"] == 0.75 and metrics["train/staleness_max"] == 2.0
    assert metrics["train/staleness_frac/0"] == 0.5 and metrics["train/staleness_frac/2"] == 0.25
    # valid tokens: 2, 1, 0 | 1 (its second token is masked) | 0 | 0, 0 -> 4 / 7
    assert metrics["train/token_staleness_mean"] == pytest.approx(4 / 7)
    assert metrics["off_policy/staleness_mean"] == pytest.approx(4 / 7)
    assert metrics["off_policy/staleness_max"] == 2.0


def test_prompt_clip_ratio_counts_prompts_at_the_limit_and_is_zero_without_one(tmp_path, tiny_model_path, batch_exps):
    # the last group's prompts one token shorter (their first token dropped), so lengths differ
    batch_exps = [e if i < 9 else Experience(**{**e.__dict__, "prompt_ids": e.prompt_ids[1:]})
                  for i, e in enumerate(batch_exps)]
    longest = max(len(e.prompt_ids) for e in batch_exps)
    at_longest = sum(len(e.prompt_ids) == longest for e in batch_exps) / len(batch_exps)
    assert 0 < at_longest < 1
    no_limit = _trainer(tmp_path, tiny_model_path).train_step(batch_exps)
    assert no_limit["prompt_length/clip_ratio"] == 0.0  # nothing is cut without explorer.max_prompt_tokens
    limited = _trainer(tmp_path, tiny_model_path, f"explorer.max_prompt_tokens={longest}").train_step(batch_exps)
    assert limited["prompt_length/clip_ratio"] == pytest.approx(at_longest)
