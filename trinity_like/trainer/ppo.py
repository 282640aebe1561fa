"""The trainer engine: TrainEngineWrapper and the PPO-family trainer behind it.

A training step, in verl's order: experiences -> padded batch; old (proximal) log-probs and off-policy
weights (``_prepare_old_log_probs``); advantages, policy loss and correction from the registries of
``trinity_like.algorithms``; one epoch of micro-batches with gradient accumulation; gradient clipping;
AdamW step. The new weights are version k+1.

Still minimal (the trainer part deepens it): one epoch, one mini-batch; no KL, critic or entropy terms.
"""

from __future__ import annotations

import abc
import json
import time
from pathlib import Path

import torch

from trinity_like.algorithms import (
    get_adv_estimator_fn,
    get_off_policy_correction_fn,
    get_policy_loss_fn,
    masked_mean,
)
from trinity_like.common.experience import Experience
from trinity_like.common.fs import atomic_publish_dir, atomic_write_with
from trinity_like.common.modeling import export_state_dict, load_causal_lm
from trinity_like.config import Config, RunPaths
from trinity_like.trainer.batch import compute_log_probs, experiences_to_batch

STATE_DICT_DIR = "state_dict"


class TrainEngineWrapper(abc.ABC):
    """What the trainer role needs from a training engine (the shape of Trinity-RFT's wrapper)."""

    @abc.abstractmethod
    def prepare(self) -> None:
        """Load the model and optimizer; resume from the latest checkpoint if there is one."""

    @property
    @abc.abstractmethod
    def train_step_num(self) -> int:
        """Trainer steps done; also the version of the weights held now."""

    @abc.abstractmethod
    def train_step(self, batch_exps: list[Experience]) -> dict[str, float]:
        """Train one step on ``batch_exps``; return metrics with namespaced keys."""

    @abc.abstractmethod
    def save_checkpoint(self, block_until_saved: bool = False, save_as_hf: bool = False) -> Path:
        """Write a full checkpoint (weights, optimizer, step)."""

    @abc.abstractmethod
    def save_state_dict(self) -> Path:
        """Write the weights of the current version for the synchronizer."""

    @abc.abstractmethod
    def upload_state_dict(self) -> object:
        """Hand the current weights to the synchronizer without a file (method ``memory``)."""

    @abc.abstractmethod
    def sync_weight(self) -> None:
        """Publish the current weights by the configured synchronizer method."""


class PPOTrainer(TrainEngineWrapper):
    """Single-process PPO/GRPO trainer on CPU with a transformers model."""

    def __init__(self, cfg: Config, synchronizer=None) -> None:
        self.cfg = cfg
        self.paths = RunPaths.of(cfg)
        self.synchronizer = synchronizer
        self._step = 0

    # ------------------------------------------------------------ setup
    def prepare(self) -> None:
        torch.set_num_threads(self.cfg.trainer.num_threads)
        torch.manual_seed(self.cfg.seed)
        self.model = load_causal_lm(self.cfg.model.path, train=True)
        pad = self.model.config.pad_token_id
        self.pad_token_id = int(pad if pad is not None else self.model.config.eos_token_id)
        opt = self.cfg.trainer.optimizer
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=opt.lr, betas=(opt.beta1, opt.beta2),
                                           eps=opt.eps, weight_decay=opt.weight_decay)
        self.adv_fn = get_adv_estimator_fn(self.cfg.algorithm.adv_estimator)
        self.policy_loss_fn = get_policy_loss_fn(self.cfg.algorithm.policy_loss)
        self.correction_fn = get_off_policy_correction_fn(self.cfg.algorithm.off_policy.correction)

    @property
    def train_step_num(self) -> int:
        return self._step

    # ------------------------------------------------------------ the step
    def train_step(self, batch_exps: list[Experience]) -> dict[str, float]:
        start = time.perf_counter()
        algo, temperature = self.cfg.algorithm, self.cfg.explorer.sampling.temperature
        batch = experiences_to_batch(batch_exps, self.pad_token_id)
        mask = batch["response_mask"]  # (B, R)
        staleness = (self._step - batch["model_version"]).float()  # (B,) trained by the weights of version step
        metrics = self._prepare_old_log_probs(batch, staleness, temperature)
        advantages, _ = self.adv_fn(
            token_level_rewards=batch["token_level_rewards"], response_mask=mask,
            index=batch["group_index"].tolist(), values=None, reward_baselines=None, gamma=algo.gamma,
            lam=algo.lam, norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
            opmd_baseline=algo.opmd_baseline, tau=algo.tau)
        batch["advantages"] = advantages

        total_tokens = mask.sum().clamp(min=1.0)
        total_seqs = (mask.sum(-1) > 0).sum().clamp(min=1)
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        micro = self.cfg.trainer.micro_batch_size
        for lo in range(0, batch.batch_size[0], micro):
            mb = batch[lo:lo + micro]
            log_prob = compute_log_probs(self.model, mb, temperature)  # (b, R)
            pg_loss, loss_metrics = self.policy_loss_fn(
                old_log_prob=mb["old_log_probs"], log_prob=log_prob, advantages=mb["advantages"],
                response_mask=mb["response_mask"], loss_agg_mode=algo.loss_agg_mode, config=algo,
                rollout_is_weights=mb.get("rollout_is_weights", None))
            # Weight each micro-batch so the accumulated gradient equals the one of the whole batch.
            weight = self._micro_weight(mb["response_mask"], total_tokens, total_seqs)
            (pg_loss * weight).backward()
            loss_sum += float(pg_loss.detach()) * weight
            for key, value in loss_metrics.items():
                metrics[key] = metrics.get(key, 0.0) + value * weight
        metrics["actor/pg_loss"] = loss_sum
        max_norm = self.cfg.trainer.optimizer.max_grad_norm
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                                   max_norm if max_norm > 0 else float("inf"))
        self.optimizer.step()
        self._step += 1

        elapsed = time.perf_counter() - start
        response_tokens = float(mask.sum())
        return {
            **metrics,
            "actor/grad_norm": float(grad_norm),
            "actor/lr": float(self.optimizer.param_groups[0]["lr"]),
            "actor/advantages_mean": float(masked_mean(advantages, mask)),
            "train/reward_mean": float(batch["rewards"].mean()),
            "train/staleness_mean": float(staleness.mean()),
            "train/staleness_max": float(staleness.max()),
            "train/batch_size": float(batch.batch_size[0]),
            "train/response_length_mean": response_tokens / batch.batch_size[0],
            "train/tokens_per_s": response_tokens / elapsed,
            "time/train_step_s": elapsed,
        }

    def _prepare_old_log_probs(self, batch, staleness: torch.Tensor, temperature: float) -> dict[str, float]:
        """Set ``old_log_probs`` (the PPO ratio's denominator) and, with an off-policy correction, the
        ``rollout_is_weights``; return the correction's metrics.

        Without a correction the behaviour log-probs stored with each experience are the old policy, so the
        PPO ratio is the importance ratio against the policy that generated the data (rows that carry none
        are recomputed). With a correction, the proximal policy (the current weights, before this update) is
        recomputed and the correction weighs pi_prox / pi_behav per token."""
        correction = self.cfg.algorithm.off_policy.correction
        known = batch["has_log_probs"]  # (B,)
        if correction == "none" and bool(known.all()):
            return {}
        with torch.no_grad():
            proximal = compute_log_probs(self.model, batch, temperature)  # (B, R)
        behaviour = torch.where(known.unsqueeze(-1), batch["old_log_probs"], proximal)
        if correction == "none":
            batch["old_log_probs"] = behaviour
            return {}
        weights, metrics = self.correction_fn(behaviour, proximal, batch["response_mask"], staleness,
                                              self.cfg.algorithm.off_policy, behaviour_known=known)
        batch["old_log_probs"] = proximal
        batch["rollout_is_weights"] = weights
        return metrics

    def _micro_weight(self, micro_mask: torch.Tensor, total_tokens: torch.Tensor, total_seqs: torch.Tensor) -> float:
        """The micro-batch's share of the batch normaliser of ``agg_loss``: its valid tokens (token-mean) or
        its valid sequences (seq-* modes)."""
        if self.cfg.algorithm.loss_agg_mode == "token-mean":
            return float(micro_mask.sum() / total_tokens)
        return float((micro_mask.sum(-1) > 0).sum() / total_seqs)

    # ------------------------------------------------------------ weights out
    def save_state_dict(self) -> Path:
        from safetensors.torch import save_file

        sd = export_state_dict(self.model)
        path = self.paths.checkpoint_dir / STATE_DICT_DIR / f"version-{self._step:08d}.safetensors"
        atomic_write_with(path, lambda tmp: save_file(sd, str(tmp), metadata={"version": str(self._step)}))
        self._prune_state_dicts(keep=self.cfg.synchronizer.max_staleness + 2)
        return path

    def _prune_state_dicts(self, keep: int) -> None:
        """Delete old version files; an explorer only ever loads one of the newest few."""
        files = sorted((self.paths.checkpoint_dir / STATE_DICT_DIR).glob("version-*.safetensors"))
        for old in files[:-keep]:
            old.unlink(missing_ok=True)

    def upload_state_dict(self):
        import ray

        return ray.put(export_state_dict(self.model))

    def sync_weight(self) -> None:
        import ray

        from trinity_like.synchronizer import WeightsInfo

        if self.synchronizer is None:
            raise RuntimeError("sync_weight needs a synchronizer actor")
        if self.cfg.synchronizer.method == "memory":
            info = WeightsInfo(version=self._step, refs=[self.upload_state_dict()])
        else:
            info = WeightsInfo(version=self._step, path=str(self.save_state_dict()))
        ray.get(self.synchronizer.publish.remote(info))

    # ------------------------------------------------------------ checkpoints
    def save_checkpoint(self, block_until_saved: bool = False, save_as_hf: bool = False) -> Path:
        """Write ``checkpoints/step-<k>/`` atomically. Always blocks for now (the write is small on CPU)."""
        from safetensors.torch import save_file

        step = self._step

        def fill(tmp: Path) -> None:
            if save_as_hf:
                self.model.save_pretrained(tmp / "hf", safe_serialization=True)
            save_file(export_state_dict(self.model), str(tmp / "model.safetensors"))
            torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
            (tmp / "trainer_state.json").write_text(json.dumps({"step": step}) + "\n")

        return atomic_publish_dir(self.paths.checkpoint_dir / f"step-{step:08d}", fill)
