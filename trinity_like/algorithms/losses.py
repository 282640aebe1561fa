"""Loss aggregation, policy losses, the value loss and KL estimators.

Shapes: ``B`` sequences, ``L`` response tokens. Masks are float or bool with 1 = the token counts; positions
where the mask is 0 never change a result.

Every policy loss in ``POLICY_LOSSES`` has ONE signature::

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
       rollout_is_weights=None) -> (loss, metrics)

``config`` is anything with the attributes (or dict keys) of :class:`PolicyLossConfig`; missing ones take
the defaults. ``rollout_is_weights`` (B, L), when given, multiplies the per-token losses before aggregation
(the off-policy correction of ``trinity_like.algorithms.off_policy``).

Departures from the papers, all as in verl: log-ratios are clamped to [-20, 20] before ``exp``; GSPO's
log sequence ratio is clamped above at 10; DPO reads rows as interleaved (chosen, rejected) pairs with
``old_log_prob`` holding the reference policy's log-probs.

Where Trinity-RFT's code (commit 9051d63) departs from its papers, these follow the papers
(``trinity_like.algorithms.trinity_algorithms`` says which; tests/algorithms/test_trinity_algorithms.py shows each
against Trinity's code): Trinity's DPO sums the log-ratios of every pair of a micro-batch into one logit (here one
logit per pair, the mean over pairs); its MIX scales each micro-batch's terms by its own row counts (here each term
is averaged over the mini-batch's rows of its kind, :func:`mix_policy_loss`); its ``seq-mean-token-sum-norm``
divides the batch's whole sum by L (here the mean over sequences of sum / L, Dr. GRPO's) and its ``seq-*`` modes
count a row without a valid token as a sequence; its k3 is not clamped; its GSPO and CISPO do not clamp the log
ratio (the same wherever |log ratio| < 10).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from trinity_like.algorithms.functional import masked_mean, masked_sum
from trinity_like.common.registry import Registry

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """Aggregate a (B, L) loss matrix into a scalar.

    - ``token-mean``: sum over valid tokens / (number of valid tokens + 1e-8).
    - ``seq-mean-token-sum``: per sequence the sum over its tokens, then the mean over sequences.
    - ``seq-mean-token-mean``: per sequence the mean over its tokens (sum / (count + 1e-8)), then the mean
      over sequences.
    - ``seq-mean-token-sum-norm``: per sequence the sum over its tokens divided by L (the mask's width, a
      constant), then the mean over sequences (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783).
    In the ``seq-*`` modes a fully masked row is not a sequence: it is left out of the mean.
    """
    mask = loss_mask.to(loss_mat.dtype)  # (B, L)
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, mask)
    token_sum = masked_sum(loss_mat, mask, dim=-1)  # (B,)
    token_count = mask.sum(-1)  # (B,)
    if loss_agg_mode == "seq-mean-token-sum":
        seq_loss = token_sum
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_loss = token_sum / (token_count + 1e-8)
    elif loss_agg_mode == "seq-mean-token-sum-norm":
        seq_loss = token_sum / loss_mat.shape[-1]
    else:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid: {', '.join(LOSS_AGG_MODES)}")
    seq_valid = (token_count > 0).to(loss_mat.dtype)  # (B,)
    return masked_sum(seq_loss, seq_valid) / seq_valid.sum().clamp(min=1.0)


# ---------------------------------------------------------------- policy losses

POLICY_LOSSES: Registry = Registry("policy loss")


@dataclass(frozen=True)
class LossNeeds:
    """What a policy loss needs from the trainer besides log-probs and advantages, declared next to the loss so
    that the trainer's step reads these fields and never a loss's name."""

    paired_rows: bool = False
    """Rows come as (chosen, rejected) pairs built from each group: shuffles, data-parallel shards and
    micro-batches keep pairs whole, and a micro-batch weighs by its share of the rows (the loss is a mean over
    pairs, ``loss_agg_mode`` does not apply)."""
    reference_as_old: bool = False
    """Needs the reference model's log-probs, passed as ``old_log_prob``."""

    @property
    def rows_per_unit(self) -> int:
        """Rows that always travel together."""
        return 2 if self.paired_rows else 1


LOSS_NEEDS: dict[str, LossNeeds] = {}
"""Policy loss name -> what it needs; a loss not listed needs nothing more (``LossNeeds()``)."""


def loss_needs(name: str) -> LossNeeds:
    POLICY_LOSSES.get(name)  # an unknown name fails here, listing the valid ones
    return LOSS_NEEDS.get(name, LossNeeds())


@dataclass
class PolicyLossConfig:
    """Parameters the policy losses read (by attribute or dict key) from their ``config`` argument."""

    clip_ratio: float = 0.2
    """Symmetric PPO clip range; used where ``clip_ratio_low`` / ``clip_ratio_high`` are None."""
    clip_ratio_low: float | None = None
    """Lower clip: the ratio is clipped below at 1 - clip_ratio_low."""
    clip_ratio_high: float | None = None
    """Upper clip: the ratio is clipped above at 1 + clip_ratio_high (DAPO's clip-higher)."""
    clip_ratio_c: float = 3.0
    """Dual-clip bound for negative advantages (> 1)."""
    dpo_beta: float = 0.1
    """DPO inverse temperature."""
    dpo_label_smoothing: float = 0.0
    """Conservative DPO: the assumed probability that a preference label is flipped."""
    tau: float = 1.0
    """OPMD's regularisation strength: the opmd loss is divided by 1 + tau."""


_DEFAULTS = PolicyLossConfig()


def _param(config: Any, name: str) -> Any:
    """``config.name`` or ``config[name]``; the PolicyLossConfig default when absent or None."""
    value = None
    if isinstance(config, dict):
        value = config.get(name)
    elif config is not None:
        value = getattr(config, name, None)
    return getattr(_DEFAULTS, name) if value is None else value


def _clip_range(config: Any) -> tuple[float, float]:
    low, high = _param(config, "clip_ratio_low"), _param(config, "clip_ratio_high")
    base = _param(config, "clip_ratio")
    return (base if low is None else low), (base if high is None else high)


def _ppo_losses(old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high, clip_ratio_c):
    """Per-token dual-clip PPO losses (B, L) and the statistics (clipfrac, ppo_kl, clipfrac_lower)."""
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1.0 for dual-clip PPO, got {clip_ratio_c}")
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)  # (B, L)
    ratio = torch.exp(negative_approx_kl)  # (B, L)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)

    pg_losses1 = -advantages * ratio  # (B, L)
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)  # (B, L)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)  # (B, L)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).to(ratio.dtype), response_mask)

    pg_losses3 = -advantages * clip_ratio_c  # (B, L)
    clip_pg_losses2 = torch.minimum(pg_losses3, clip_pg_losses1)  # (B, L)
    negative = advantages < 0
    pg_clipfrac_lower = masked_mean((torch.gt(clip_pg_losses1, pg_losses3) & negative).to(ratio.dtype),
                                    response_mask)
    pg_losses = torch.where(negative, clip_pg_losses2, clip_pg_losses1)  # (B, L)
    return pg_losses, pg_clipfrac, ppo_kl, pg_clipfrac_lower


def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float | None = None,
    cliprange_low: float | None = None,
    cliprange_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate with asymmetric clip ranges and dual-clip (Schulman et al. 2017,
    arXiv:1707.06347; dual-clip: Ye et al. 2019, arXiv:1912.09729). verl's signature.

        r = exp(clamp(log_prob - old_log_prob, -20, 20))
        L_clip = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))
        L = min(L_clip, -A c)  where A < 0 (dual-clip), else L_clip

    All inputs (B, L). Returns ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``: the aggregated loss;
    the fraction of valid tokens where the clipped term was chosen; the masked mean of ``old - new``
    log-probs; the fraction of valid tokens with A < 0 where the dual clip was active.
    """
    low = cliprange if cliprange_low is None else cliprange_low
    high = cliprange if cliprange_high is None else cliprange_high
    if low is None or high is None:
        raise ValueError("compute_policy_loss needs cliprange, or both cliprange_low and cliprange_high")
    pg_losses, clipfrac, ppo_kl, clipfrac_lower = _ppo_losses(
        old_log_prob, log_prob, advantages, response_mask, low, high, clip_ratio_c)
    return agg_loss(pg_losses, response_mask, loss_agg_mode), clipfrac, ppo_kl, clipfrac_lower


def _scalar(t: torch.Tensor) -> float:
    """A metric value: detached, as a Python float."""
    return float(t.detach())


def _weighted(pg_losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    return pg_losses if rollout_is_weights is None else pg_losses * rollout_is_weights


@POLICY_LOSSES.register("vanilla")
def vanilla_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                        config=None, rollout_is_weights=None):
    """Dual-clip PPO (see :func:`compute_policy_loss`), per-token losses times ``rollout_is_weights``."""
    low, high = _clip_range(config)
    pg_losses, clipfrac, ppo_kl, clipfrac_lower = _ppo_losses(
        old_log_prob, log_prob, advantages, response_mask, low, high, _param(config, "clip_ratio_c"))
    loss = agg_loss(_weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode)
    return loss, {"actor/pg_clipfrac": _scalar(clipfrac), "actor/ppo_kl": _scalar(ppo_kl),
                  "actor/pg_clipfrac_lower": _scalar(clipfrac_lower)}


@POLICY_LOSSES.register("gspo")
def gspo_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                     config=None, rollout_is_weights=None):
    """GSPO (Zheng et al. 2025, arXiv:2507.18071): PPO clipping on the sequence-level ratio

        s_i = exp( sum_t m_t (log_prob - old_log_prob) / |y_i| )      (geometric mean of token ratios)

    applied to every token of sequence i. Written as ``exp(log_prob - sg(log_prob) + sg(log s_i))``: the
    value is s_i on every token and the gradient of each token is s_i * grad log_prob, which aggregated is
    exactly the gradient of s_i. Clip ranges are ``clip_ratio_low/high`` (GSPO uses ~3e-4 / 4e-4).
    """
    low, high = _clip_range(config)
    mask = response_mask.to(log_prob.dtype)
    negative_approx_kl = log_prob - old_log_prob  # (B, L)
    seq_len = mask.sum(-1).clamp(min=1.0)  # (B,)
    log_seq_ratio = masked_sum(negative_approx_kl, mask, dim=-1) / seq_len  # (B,)
    log_token_ratio = log_prob - log_prob.detach() + log_seq_ratio.detach().unsqueeze(-1)  # (B, L)
    seq_ratio = torch.exp(torch.clamp(log_token_ratio, max=10.0))  # (B, L)
    pg_losses1 = -advantages * seq_ratio
    pg_losses2 = -advantages * torch.clamp(seq_ratio, 1.0 - low, 1.0 + high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)  # (B, L)
    loss = agg_loss(_weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode)
    clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).to(log_prob.dtype), mask)
    ppo_kl = masked_mean(-negative_approx_kl, mask)
    return loss, {"actor/pg_clipfrac": _scalar(clipfrac), "actor/ppo_kl": _scalar(ppo_kl)}


@POLICY_LOSSES.register("cispo")
def cispo_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                      config=None, rollout_is_weights=None):
    """CISPO (MiniMax 2025, arXiv:2506.13585): clip the importance weight, stop its gradient, and weight
    the REINFORCE term with it, so clipped tokens still get a gradient:

        L = -sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * log_prob
    """
    low, high = _clip_range(config)
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)  # (B, L)
    ratio = torch.exp(negative_approx_kl)
    clipped = torch.clamp(ratio, 1.0 - low, 1.0 + high).detach()  # (B, L)
    pg_losses = -clipped * advantages * log_prob  # (B, L)
    loss = agg_loss(_weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode)
    clipfrac = masked_mean(torch.ne(ratio, clipped).to(log_prob.dtype), response_mask)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    return loss, {"actor/pg_clipfrac": _scalar(clipfrac), "actor/ppo_kl": _scalar(ppo_kl)}


@POLICY_LOSSES.register("reinforce")
def reinforce_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                          config=None, rollout_is_weights=None):
    """Importance-weighted policy gradient without clipping: L = -A * r with r = exp(log_prob - old),
    whose gradient is -A * r * grad log_prob (REINFORCE when old == log_prob)."""
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)  # (B, L)
    ratio = torch.exp(negative_approx_kl)
    pg_losses = -advantages * ratio
    loss = agg_loss(_weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode)
    return loss, {"actor/ppo_kl": _scalar(masked_mean(-negative_approx_kl, response_mask)),
                  "actor/ratio_max": _scalar(torch.where(response_mask.bool(), ratio, 0).max())}


@POLICY_LOSSES.register("opmd")
def opmd_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                     rollout_is_weights=None):
    """Online policy mirror descent's policy loss (Trinity-RFT, arXiv:2505.17826; its ``opmd`` policy_loss_fn):
    the policy gradient of the current policy with the mirror-descent step's regularisation,

        L = agg(-A * log_prob) / (1 + tau)

    No importance ratio: ``old_log_prob`` is not used (its sample is taken as on-policy); ``tau`` (config) is
    the strength of the KL regularisation towards the policy of the step (the advantages' ``opmd`` estimator
    with its ``logavgexp`` baseline uses the same tau). All inputs (B, L)."""
    tau = _param(config, "tau")
    pg_losses = -advantages * log_prob  # (B, L)
    loss = agg_loss(_weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode) / (1.0 + tau)
    return loss, {"actor/opmd_loss": _scalar(loss)}


@POLICY_LOSSES.register("sft")
def sft_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
             rollout_is_weights=None):
    """Supervised fine-tuning: masked negative log-likelihood of the response tokens. ``old_log_prob`` and
    ``advantages`` are not used."""
    nll = -log_prob  # (B, L)
    loss = agg_loss(_weighted(nll, rollout_is_weights), response_mask, loss_agg_mode)
    return loss, {"actor/sft_nll": _scalar(masked_mean(nll, response_mask))}


SFT_LOSS_FORMS = ("sum", "mix")


def combine_sft_loss(pg_loss: torch.Tensor, sft_loss: torch.Tensor | float, coef: float,
                     form: str = "sum") -> torch.Tensor:
    """The policy loss of the policy-gradient rows and the SFT loss of the demonstration rows as one loss
    (``algorithm.sft_loss_form``):

        sum:  pg_loss + coef * sft_loss
        mix:  (1 - mu) * pg_loss + mu * sft_loss,   mu = coef     (Trinity-RFT's MIX, arXiv:2505.17826)

    Both are scalars, each already averaged over its own rows; linear in both, so the trainer may pass each part
    pre-scaled by its micro-batch's share of its normaliser."""
    if form == "sum":
        return pg_loss + coef * sft_loss
    if form == "mix":
        return (1.0 - coef) * pg_loss + coef * sft_loss
    raise ValueError(f"unknown sft loss form {form!r}; valid: {', '.join(SFT_LOSS_FORMS)}")


def mix_policy_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                    response_mask: torch.Tensor, is_expert: torch.Tensor, mu: float,
                    loss_agg_mode: str = "token-mean", config: Any = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Trinity-RFT's MIX loss on one mini-batch, as its paper writes it (Trinity-RFT, arXiv:2505.17826, the
    ``mix`` algorithm; CHORD, arXiv:2508.11408, with a fixed mu):

        L = (1 - mu) * L_pg(usual rows) + mu * L_sft(expert rows)

    L_pg is dual-clip PPO (``vanilla``) aggregated by ``loss_agg_mode`` over the usual rows' tokens, L_sft the
    token mean of the NLL over the expert rows' tokens; a part with no rows is 0. log-probs, advantages and
    ``response_mask`` (B, L); ``is_expert`` (B,) bool. This is what the trainer's step computes with
    ``algorithm.sft_loss_form: mix`` (mu = ``sft_loss_coef``, expert rows = ``sft_sources``), whatever the
    micro-batches.

    Departure of Trinity's code (``MIXPolicyLossFn``): it computes both parts per micro-batch and scales each by
    that micro-batch's own row count of its kind over ``train_batch_size_usual`` / ``train_batch_size_expert``
    (times the gradient accumulation steps), so a micro-batch's token mean weighs by rows, not tokens, and the
    result equals this one only when the micro-batch is the mini-batch and those sizes are its row counts."""
    expert = is_expert.to(torch.bool).unsqueeze(-1)  # (B, 1)
    mask = response_mask.to(log_prob.dtype)
    usual_mask, expert_mask = mask * ~expert, mask * expert  # (B, L) each
    zero = log_prob.sum() * 0.0
    if bool(usual_mask.any()):
        pg_loss, metrics = vanilla_policy_loss(old_log_prob, log_prob, advantages, usual_mask, loss_agg_mode, config)
    else:
        pg_loss, metrics = zero, {}
    sft_loss = masked_mean(-log_prob, expert_mask) if bool(expert_mask.any()) else zero
    loss = combine_sft_loss(pg_loss, sft_loss, mu, "mix")
    return loss, {**metrics, "actor/pg_loss": _scalar(pg_loss), "actor/sft_loss": _scalar(sft_loss)}


LOSS_NEEDS["dpo"] = LossNeeds(paired_rows=True, reference_as_old=True)


@POLICY_LOSSES.register("dpo")
def dpo_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
             rollout_is_weights=None):
    """DPO (Rafailov et al. 2023, arXiv:2305.18290) on rows interleaved as (chosen, rejected) pairs:
    rows 0, 2, 4, ... are chosen, rows 1, 3, 5, ... rejected; ``old_log_prob`` holds the reference policy.

        h = beta * [(log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l))]     (sequence log-probs)
        L = mean over pairs of  -(1 - eps) log sigmoid(h) - eps log sigmoid(-h)     (eps = label smoothing)

    ``loss_agg_mode`` does not apply (the loss is per pair); ``advantages`` are not used."""
    if log_prob.shape[0] % 2:
        raise ValueError(f"dpo needs an even number of rows (chosen, rejected pairs), got {log_prob.shape[0]}")
    beta, eps = _param(config, "dpo_beta"), _param(config, "dpo_label_smoothing")
    mask = response_mask.to(log_prob.dtype)
    seq = masked_sum(log_prob, mask, dim=-1)  # (B,)
    ref = masked_sum(old_log_prob, mask, dim=-1)  # (B,)
    if rollout_is_weights is not None:
        raise ValueError("dpo does not take rollout_is_weights")
    chosen, rejected = seq[0::2] - ref[0::2], seq[1::2] - ref[1::2]  # (B/2,)
    logits = beta * (chosen - rejected)
    loss = (-(1 - eps) * F.logsigmoid(logits) - eps * F.logsigmoid(-logits)).mean()
    return loss, {"actor/dpo_chosen_reward": _scalar(beta * chosen.mean()),
                  "actor/dpo_rejected_reward": _scalar(beta * rejected.mean()),
                  "actor/dpo_accuracy": _scalar((chosen > rejected).float().mean())}


# ---------------------------------------------------------------- value loss


def compute_value_loss(vpreds: torch.Tensor, returns: torch.Tensor, values: torch.Tensor,
                       response_mask: torch.Tensor, cliprange_value: float,
                       loss_agg_mode: str = "token-mean") -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss (PPO, as in OpenAI baselines):

        v_clip = clamp(vpreds, values - c, values + c)
        L = 0.5 * agg( max((vpreds - R)^2, (v_clip - R)^2) )

    All inputs (B, L). Returns ``(vf_loss, vf_clipfrac)``, the fraction of valid tokens where the clipped
    term was larger."""
    vpredclipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)  # (B, L)
    vf_losses1 = (vpreds - returns) ** 2
    vf_losses2 = (vpredclipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.maximum(vf_losses1, vf_losses2), response_mask, loss_agg_mode)
    vf_clipfrac = masked_mean(torch.gt(vf_losses2, vf_losses1).to(vpreds.dtype), response_mask)
    return vf_loss, vf_clipfrac


# ---------------------------------------------------------------- KL

KL_PENALTIES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_LOSS_TYPES = (*KL_PENALTIES, "k1+", "k3+", "low_var_kl+")
"""The KL loss may also use the straight-through forms (``+``: value of the estimator, gradient of k2)."""


def kl_penalty_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimators between the policy and the reference (Schulman, "Approximating KL
    divergence", 2020), with d = logprob - ref_logprob:

    - ``kl`` / ``k1``: d
    - ``abs``: |d|
    - ``mse`` / ``k2``: 0.5 * d^2
    - ``low_var_kl`` / ``k3``: exp(-d') + d' - 1 with d' = clamp(d, -20, 20), the result clamped to [-10, 10]
    """
    diff = logprob - ref_logprob
    if kl_penalty in ("kl", "k1"):
        return diff
    if kl_penalty == "abs":
        return diff.abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * diff.square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = torch.clamp(ref_logprob - logprob, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(kl) - kl - 1.0, min=-10.0, max=10.0)
    valid = ", ".join(KL_PENALTIES + tuple(k + "+" for k in KL_PENALTIES))
    raise ValueError(f"unknown kl_penalty {kl_penalty!r}; valid: {valid}")


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """KL estimator ``kl_penalty`` (see :func:`kl_penalty_forward`); a ``+`` suffix (e.g. ``k3+``) gives the
    straight-through form: the value of the named estimator with the gradient of k2, whose gradient is the
    unbiased gradient of the KL (k1 and k3 are unbiased in value, not in gradient)."""
    name = kl_penalty[:-1] if kl_penalty.endswith("+") else kl_penalty
    forward = kl_penalty_forward(logprob, ref_logprob, name)
    if not kl_penalty.endswith("+") or name in ("mse", "k2"):
        return forward
    backward = 0.5 * (logprob - ref_logprob).square()
    return backward - backward.detach() + forward.detach()


class FixedKLController:
    """A constant KL coefficient."""

    def __init__(self, kl_coef: float) -> None:
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, arXiv:1909.08593):

        e = clip(current_kl / target_kl - 1, -0.2, 0.2);   value *= 1 + e * n_steps / horizon
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if target_kl <= 0 or horizon <= 0:
            raise ValueError(f"AdaptiveKLController needs target_kl > 0 and horizon > 0, got {target_kl}, {horizon}")
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon


_kl_estimator = kl_penalty  # apply_kl_penalty's `kl_penalty` argument (verl's name) is the estimator's name


def apply_kl_penalty(token_level_scores: torch.Tensor, old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor,
                     response_mask: torch.Tensor, kl_ctrl, kl_penalty: str = "kl") -> tuple[torch.Tensor, dict[str, float]]:
    """In-reward KL (verl's ``apply_kl_penalty``; Ziegler et al. 2019, arXiv:1909.08593): each response token's
    reward is its score minus beta times the KL estimate ``kl_penalty`` between the policy that generated the
    data and the reference,

        kld_t = kl(old_log_prob_t, ref_log_prob_t) * m_t;     r_t = s_t - beta * kld_t

    then the controller sees this batch's KL, the mean over sequences of each sequence's masked token mean:
    ``kl_ctrl.update(current_kl, n_steps=B)``. Beta is the controller's value before that update.

    token_level_scores, old_log_prob, ref_log_prob, response_mask (B, L); ``kl_ctrl`` anything with ``value``
    and ``update(current_kl, n_steps)`` (``FixedKLController``, ``AdaptiveKLController``). Masked positions keep
    their score. Returns the token-level rewards (B, L) and ``actor/reward_kl_penalty`` (the current KL) and
    ``actor/reward_kl_penalty_coeff`` (beta).

    Departure from verl: tensors in and out rather than a DataProto it updates."""
    mask = response_mask.to(token_level_scores.dtype)  # (B, L)
    kld = _kl_estimator(old_log_prob, ref_log_prob, kl_penalty) * mask  # (B, L)
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = float(masked_mean(kld, mask, dim=-1).mean())  # per-sequence means, then the batch mean
    kl_ctrl.update(current_kl, n_steps=token_level_scores.shape[0])
    return token_level_rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
