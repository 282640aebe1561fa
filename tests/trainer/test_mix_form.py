"""``algorithm.sft_loss_form: mix`` (Trinity-RFT's MIX): the step's update is the gradient of
``(1 - mu) * pg_loss(other rows) + mu * sft_loss(sft_sources rows)`` over the whole mini-batch, mu = sft_loss_coef,
whatever the micro-batches; the default form ``sum`` stays ``pg + coef * sft`` (tests/trainer/test_mix_loss.py)."""

import pytest
import torch
from test_mix_loss import _assert_same_weights, _step_by_hand, _trainer, _with_demonstrations

from trinity_like.algorithms import compute_grpo_outcome_advantage
from trinity_like.algorithms.losses import mix_policy_loss
from trinity_like.common.modeling import export_state_dict
from trinity_like.trainer.batch import compute_log_probs, experiences_to_batch

MU = 0.25


def _mix_step_by_hand(trainer, exps, mu: float, entropy_coeff: float = 0.0, entropy_rows: str = "usual"):
    """One SGD step (lr 1) on losses.mix_policy_loss over the whole batch: (1 - mu) * PPO over the non-human rows
    + mu * token-mean NLL over the human rows, minus entropy_coeff times the token-mean entropy over the non-human
    rows (``entropy_rows`` "all": over every row); returns (weights after, pg_loss, sft_loss)."""
    batch = experiences_to_batch(exps, trainer.pad_token_id)
    human = torch.tensor([e.source == "human" for e in exps])  # (B,)
    mask = batch["response_mask"]  # (B, R)
    adv, _ = compute_grpo_outcome_advantage(batch["token_level_rewards"], mask, index=batch["group_index"].tolist())
    log_prob, entropy = compute_log_probs(trainer.model, batch, 1.0, with_entropy=True)  # (B, R) each
    old = torch.where(batch["has_log_probs"].unsqueeze(-1), batch["old_log_probs"], log_prob.detach())
    loss, metrics = mix_policy_loss(old, log_prob, adv, mask, human, mu, "token-mean", {"clip_ratio": 0.2})
    if entropy_coeff:
        rows = mask * ~human.unsqueeze(-1) if entropy_rows == "usual" else mask
        loss = loss - entropy_coeff * (entropy * rows).sum() / rows.sum()
    loss.backward()
    with torch.no_grad():
        for p in trainer.model.parameters():
            if p.grad is not None:
                p -= p.grad
    return export_state_dict(trainer.module), metrics["actor/pg_loss"], metrics["actor/sft_loss"]


@pytest.mark.parametrize("micro", [1, 5, 12])
def test_mix_form_is_one_minus_mu_pg_plus_mu_sft_whatever_the_micro_batches(tmp_path, tiny_model_path, batch_exps,
                                                                            micro):
    exps = _with_demonstrations(batch_exps)
    t = _trainer(tmp_path, tiny_model_path, "algorithm.sft_sources=[human]", f"algorithm.sft_loss_coef={MU}",
                 "algorithm.sft_loss_form=mix", f"trainer.micro_batch_size={micro}")
    metrics = t.train_step(exps)
    expected, pg_loss, sft_loss = _mix_step_by_hand(_trainer(tmp_path / "ref", tiny_model_path), exps, MU)
    _assert_same_weights(export_state_dict(t.module), expected)
    assert metrics["actor/pg_loss"] == pytest.approx(pg_loss, rel=1e-4, abs=1e-7)
    assert metrics["actor/sft_loss"] == pytest.approx(sft_loss, rel=1e-5)


def test_mix_form_differs_from_sum_form_by_the_pg_weight(tmp_path, tiny_model_path, batch_exps):
    # (1 - mu) * pg + mu * sft is (1 - mu) times pg + mu / (1 - mu) * sft: the sum form with that coefficient,
    # under an SGD step of lr (1 - mu). The hand-written sum step with coef mu / (1 - mu), scaled by (1 - mu):
    exps = _with_demonstrations(batch_exps)
    ref = _trainer(tmp_path / "ref", tiny_model_path)
    before = {k: v.clone() for k, v in export_state_dict(ref.module).items()}
    after_sum, _, _ = _step_by_hand(ref, exps, coef=MU / (1 - MU))
    expected = {k: before[k] + (1 - MU) * (after_sum[k] - before[k]) for k in before}
    t = _trainer(tmp_path, tiny_model_path, "algorithm.sft_sources=[human]", f"algorithm.sft_loss_coef={MU}",
                 "algorithm.sft_loss_form=mix", "trainer.micro_batch_size=5")
    t.train_step(exps)
    _assert_same_weights(export_state_dict(t.module), expected)
    # and it is not the sum form with coef mu (the update would be larger by 1 / (1 - mu) on the pg part)
    s = _trainer(tmp_path / "sum", tiny_model_path, "algorithm.sft_sources=[human]", f"algorithm.sft_loss_coef={MU}",
                 "trainer.micro_batch_size=5")
    s.train_step(exps)
    got, other = export_state_dict(t.module), export_state_dict(s.module)
    assert any(not torch.allclose(got[k], other[k], rtol=1e-4, atol=1e-6) for k in got)


def test_mix_form_takes_the_entropy_bonus_over_the_policy_gradient_rows(tmp_path, tiny_model_path, batch_exps):
    exps = _with_demonstrations(batch_exps)
    t = _trainer(tmp_path, tiny_model_path, "algorithm.sft_sources=[human]", f"algorithm.sft_loss_coef={MU}",
                 "algorithm.sft_loss_form=mix", "algorithm.entropy_coeff=0.5", "trainer.micro_batch_size=5")
    t.train_step(exps)
    got = export_state_dict(t.module)
    usual, _, _ = _mix_step_by_hand(_trainer(tmp_path / "ref", tiny_model_path), exps, MU, entropy_coeff=0.5)
    _assert_same_weights(got, usual)  # Trinity's mix entropy: the demonstrations' entropy is not rewarded
    every, _, _ = _mix_step_by_hand(_trainer(tmp_path / "all", tiny_model_path), exps, MU, entropy_coeff=0.5,
                                    entropy_rows="all")
    assert any(not torch.allclose(got[k], every[k], rtol=1e-4, atol=1e-6) for k in got)
