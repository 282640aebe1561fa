"""The trainer engine: TrainEngineWrapper and the PPO-family trainer behind it.

A training step, in verl's order: experiences -> padded batch; old (proximal) log-probs and off-policy
weights (``_prepare_old_log_probs``); advantages, policy loss and correction from the registries of
``trinity_like.algorithms``; one epoch of micro-batches with gradient accumulation; gradient clipping;
AdamW step. The new weights are version k+1.

Also: ``ppo_epochs`` over seeded shuffled mini-batches (one optimizer update each), micro-batches by count or
token budget, entropy bonus, KL loss against the initial model, in-reward KL with a fixed or adaptive
controller, warm-up + constant/cosine learning rate, gradient checkpointing, a critic (value model with value
clipping) for GAE, SFT and online DPO, LoRA, exact resume from checkpoints, and the hooks data-parallel workers
(``trinity_like.trainer.workers``) use: DDP or FSDP2 (``trinity_like.trainer.parallel``), each rank training on
its rows of every mini-batch.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import torch

from trinity_like.algorithms import (
    agg_loss,
    apply_kl_penalty,
    compute_advantage,
    compute_data_metrics,
    compute_mismatch_metrics,
    compute_throughout_metrics,
    compute_value_loss,
    get_kl_controller,
    get_off_policy_correction_fn,
    get_policy_loss_fn,
    kl_penalty,
    loss_needs,
    masked_mean,
    pessimistic_weights,
)
from trinity_like.common.experience import Experience
from trinity_like.common.modeling import export_state_dict, load_causal_lm
from trinity_like.config import Config
from trinity_like.runtime.checkpoints import latest_checkpoint
from trinity_like.runtime.paths import RunPaths
from trinity_like.runtime.schedule import train_slack
from trinity_like.trainer import parallel
from trinity_like.trainer.batch import (
    ResponseScorer,
    compute_log_probs,
    experiences_to_batch,
    mask_stale_tokens,
    pad_responses,
    row_widths,
    staleness,
    trim,
    widths,
)
from trinity_like.trainer.checkpoint import Checkpointer
from trinity_like.trainer.critic import compute_values
from trinity_like.trainer.device import (
    DTYPES,
    autocast,
    enable_checkpointing,
    resolve_checkpointing,
    resolve_device,
    resolve_dtype,
    resolve_weights_dtype,
    to_host,
)
from trinity_like.trainer.emulated import EmulatedTrainer  # noqa: F401  (registers trainer.type emulated: EMULATION)
from trinity_like.trainer.engine import TRAINERS, PublishesWeights, TrainEngineWrapper
from trinity_like.weights.publish import PUBLISHERS, keep_versions


def preference_pairs(exps: list[Experience]) -> list[Experience]:
    """Experiences as DPO's interleaved (chosen, rejected) rows: each group must hold exactly two, and the one
    with the higher reward is the chosen one."""
    groups: dict[str, list[Experience]] = {}
    for e in exps:
        groups.setdefault(e.group_id or e.eid, []).append(e)
    out: list[Experience] = []
    for gid, rows in groups.items():
        if len(rows) != 2 or rows[0].reward is None or rows[1].reward is None or rows[0].reward == rows[1].reward:
            raise ValueError(f"DPO needs groups of two rewarded responses with different rewards; group {gid!r} "
                             f"has {len(rows)} with rewards {[r.reward for r in rows]}")
        out.extend(sorted(rows, key=lambda e: -e.reward))
    return out


@TRAINERS.register("ppo")
class PPOTrainer(PublishesWeights, TrainEngineWrapper):
    """Single-process PPO/GRPO trainer with a transformers model, on ``trainer.device`` in ``trainer.dtype``."""

    def __init__(self, cfg: Config, synchronizer=None) -> None:
        self.cfg = cfg
        self.paths = RunPaths.of(cfg)
        self.synchronizer = synchronizer
        self._step = 0
        self.dp_rank, self.dp_world = 0, 1
        """Data-parallel position: each rank trains on rows ``rank::world`` of every mini-batch."""
        self._sharded = False
        """FSDP2 shards the policy (set by enable_data_parallel): its MixedPrecisionPolicy casts, not autocast."""
        self.module = None
        """The policy without a DDP wrapper (for no-grad passes and weights); set in ``prepare``."""
        self.monitor = None
        """The run's CheckpointMonitor when running under Ray with a synchronizer."""
        self.publisher = PUBLISHERS.get(cfg.synchronizer.method)(self)
        """Publishes each version by ``synchronizer.method`` (``trinity_like.weights.publish``)."""
        self.checkpointer = Checkpointer(self)

    # ------------------------------------------------------------ setup
    def prepare(self) -> None:
        if self.synchronizer is not None:
            import ray

            from trinity_like.runtime.paths import namespace_of
            from trinity_like.synchronizer import CheckpointMonitor

            self.monitor = CheckpointMonitor.get_actor(namespace_of(self.cfg), checkpoint_dir=str(self.paths.checkpoint_dir),
                                                       keep_state_dicts=keep_versions(self.cfg))
            ctx = ray.get_runtime_context()
            self.monitor.notify_started.remote(f"{ctx.get_node_id()}/pid{os.getpid()}", ctx.get_job_id())
        tr = self.cfg.trainer
        torch.set_num_threads(tr.num_threads)
        torch.manual_seed(self.cfg.seed)
        self.device = resolve_device(tr.device)
        """Where models, batches and optimizer state live (``trainer.device``, resolved in this process)."""
        self.dtype = resolve_dtype(tr.dtype, self.device)
        """The compute precision (``trainer.dtype`` resolved for the device)."""
        ex = self.cfg.explorer
        engines_on_gpus = ex.gpus_per_engine > 0 and ex.device != "cpu"
        engine_dtype = resolve_weights_dtype("auto", ex.dtype, engines_on_gpus)  # the engines' own dtype
        self.weights_dtype = resolve_weights_dtype(tr.weights_dtype, ex.dtype, engines_on_gpus)
        """The dtype of published weights (``trainer.weights_dtype`` resolved: the engines' own)."""
        recompute = self.cfg.algorithm.off_policy.recompute_old_log_probs
        self.recompute_old = recompute if recompute is not None else \
            ex.engine != "hf" or engine_dtype != self.dtype
        """Whether the trainer's own log-probs are the old policy under correction ``none``
        (``algorithm.off_policy.recompute_old_log_probs`` resolved: engines of another kind or dtype)."""
        module = load_causal_lm(self.cfg.model.path, train=True)
        pad = module.config.pad_token_id
        self.pad_token_id = int(pad if pad is not None else module.config.eos_token_id)
        lora = tr.lora
        if lora.enabled:
            from peft import LoraConfig as PeftLoraConfig
            from peft import get_peft_model

            module = get_peft_model(module, PeftLoraConfig(
                r=lora.r, lora_alpha=lora.alpha, target_modules=list(lora.target_modules), lora_dropout=lora.dropout,
                bias="none", task_type="CAUSAL_LM"))
        self.checkpointing = resolve_checkpointing(tr.gradient_checkpointing, self.device)
        """Gradient checkpointing (``trainer.gradient_checkpointing`` resolved), non-reentrant."""
        if self.checkpointing:
            enable_checkpointing(module)
        self.module = module.to(self.device)
        self.scorer = ResponseScorer(self.module, tr.logprob_chunk_tokens)
        """The policy's response log-probs (chunked output layer); what DDP wraps and FSDP2 shards."""
        self.model = self.scorer
        """The training entry: the scorer, or the DDP wrapper around it."""
        algo = self.cfg.algorithm
        self.ref_model = self.ref_scorer = None
        self.needs = loss_needs(algo.policy_loss)
        """What the policy loss needs besides log-probs and advantages (pairs, the reference as old policy)."""
        self.uses_reference = algo.use_kl_loss or algo.use_kl_in_reward or self.needs.reference_as_old
        if self.uses_reference and not lora.enabled:
            # with LoRA the reference is the base model with its adapters disabled: no second copy
            # in the compute dtype: it is only ever run forward, under the same autocast
            self.ref_model = load_causal_lm(self.cfg.model.path, train=False, dtype=DTYPES[self.dtype]) \
                .requires_grad_(False).to(self.device)
            self.ref_scorer = ResponseScorer(self.ref_model, tr.logprob_chunk_tokens)
        self.critic = None
        if algo.adv_estimator == "gae":
            from trinity_like.trainer.critic import ValueModel

            self.critic = self.critic_module = ValueModel(self.cfg.model.path).to(self.device)
        self._build_optimizers()
        ctrl = algo.kl_ctrl
        self.kl_ctrl = get_kl_controller(ctrl.type, ctrl.kl_coef, ctrl.target_kl, ctrl.horizon)
        self.policy_loss_fn = get_policy_loss_fn(self.cfg.algorithm.policy_loss)
        self.correction_fn = get_off_policy_correction_fn(self.cfg.algorithm.off_policy.correction)

    @property
    def train_step_num(self) -> int:
        return self._step

    def _build_optimizers(self) -> None:
        opt = self.cfg.trainer.optimizer
        self.optimizer = torch.optim.AdamW([p for p in self.module.parameters() if p.requires_grad], lr=opt.lr,
                                           betas=(opt.beta1, opt.beta2), eps=opt.eps, weight_decay=opt.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        if self.critic is not None:
            self.critic_optimizer = torch.optim.AdamW(self.critic_module.parameters(), lr=self.cfg.trainer.critic.lr,
                                                      betas=(opt.beta1, opt.beta2), eps=opt.eps)

    def enable_data_parallel(self, rank: int, world_size: int) -> None:
        """Spread training over an initialised torch.distributed group by ``trainer.strategy``: DDP replicas of
        the policy and critic, or FSDP2 shards of the policy, critic and reference model (the optimizers are
        rebuilt over the sharded parameters)."""
        self.dp_rank, self.dp_world = rank, world_size
        if world_size == 1:
            return
        strategy = self.cfg.trainer.strategy
        if strategy == "ddp":
            self.model = parallel.wrap(self.scorer, "ddp")
            if self.critic is not None:
                self.critic = parallel.wrap(self.critic_module, "ddp")
            return
        mesh = parallel.device_mesh(world_size, self.device)
        self._sharded = True
        for module in (self.scorer, self.critic_module if self.critic is not None else None, self.ref_scorer):
            if module is not None:
                parallel.wrap(module, "fsdp2", mesh, self.dtype)
        self._build_optimizers()

    def _updates_per_step(self) -> int:
        mini = self.cfg.trainer.mini_batch_size or self.cfg.train_batch_size
        return self.cfg.trainer.ppo_epochs * math.ceil(self.cfg.train_batch_size / mini)

    def _lr_factor(self, update: int) -> float:
        """Multiplier of the learning rate at optimizer update ``update`` (0-based): linear warm-up, then
        constant or cosine down to ``min_lr_ratio``."""
        opt = self.cfg.trainer.optimizer
        if update < opt.warmup_steps:
            return (update + 1) / opt.warmup_steps
        if opt.lr_schedule == "constant":
            return 1.0
        total = max(self.cfg.trainer.total_steps * self._updates_per_step() - opt.warmup_steps, 1)
        progress = min((update - opt.warmup_steps) / total, 1.0)
        return opt.min_lr_ratio + (1 - opt.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    # ------------------------------------------------------------ the step
    def train_step(self, batch_exps: list[Experience]) -> dict[str, float]:
        start = time.perf_counter()
        algo, temperature = self.cfg.algorithm, self.cfg.explorer.sampling.temperature
        if self.needs.paired_rows:
            batch_exps = preference_pairs(batch_exps)
        batch = experiences_to_batch(batch_exps, self.pad_token_id, sft_sources=algo.sft_sources).to(self.device)
        # async: tokens older than the training bound (synchronizer.train_slack past max_staleness) leave the loss;
        # with slack 0 the reader hands out no row with such a token (it drops them whole), as before
        slack = train_slack(self.cfg)
        masked_stale = (mask_stale_tokens(batch, self._step - self.cfg.synchronizer.max_staleness, slack)
                        if slack > 0 else 0)
        mask = batch["response_mask"]  # (B, R)
        # trained by the weights of version step: each row's staleness is that of its oldest token (B,) (what the
        # staleness bound and the train/staleness_* metrics count), each token's its own (B, R), over the valid ones
        row_staleness = staleness(batch["model_version"], self._step)  # (B,)
        token_staleness = staleness(batch["token_versions"], self._step)  # (B, R)
        valid = mask > 0  # (B, R)
        metrics = self._prepare_old_log_probs(batch, token_staleness[valid], temperature)
        if self.uses_reference:
            batch["ref_log_probs"] = self._ref_log_probs(batch, temperature)  # (B, R)
            if self.needs.reference_as_old:
                batch["old_log_probs"] = batch["ref_log_probs"]
        if algo.use_kl_in_reward:
            batch["token_level_rewards"], kl_metrics = apply_kl_penalty(
                batch["token_level_scores"], batch["old_log_probs"], batch["ref_log_probs"], mask, self.kl_ctrl,
                algo.kl_penalty)
            metrics.update(kl_metrics)
        if self.critic is not None:
            with torch.no_grad():
                batch["values"] = self._in_micro_batches(
                    batch, lambda micro: compute_values(self.critic_module, micro)) * mask  # (B, R)
        compute_advantage(batch, algo.adv_estimator, gamma=algo.gamma, lam=algo.lam,
                          norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo, opmd_baseline=algo.opmd_baseline,
                          tau=algo.tau)  # writes advantages and returns
        advantages = batch["advantages"]  # (B, R)
        negative_cap = algo.off_policy.negative_cap
        if negative_cap > 0 and "rollout_is_weights" in batch:
            batch["rollout_is_weights"], raised = pessimistic_weights(
                batch["rollout_is_weights"], batch.pop("behaviour_log_probs"), batch.pop("proximal_log_probs"),
                advantages, mask, negative_cap, behaviour_known=batch["has_log_probs"])
            metrics.update(raised)
        if self.critic is not None:
            metrics.update(self._update_critic(batch))
        metrics.update(self._update_policy(batch, temperature))
        self._step += 1

        elapsed = time.perf_counter() - start
        response_tokens = float(mask.sum())
        if algo.sft_sources:
            metrics["actor/sft_rows"] = float(batch["sft"].sum())
        # without a prompt limit no prompt is cut: its clip ratio is 0 (the function's default, the batch's padded
        # width, would count every longest prompt as clipped)
        data = compute_data_metrics(batch, use_critic=self.critic is not None,
                                    max_response_length=self.cfg.explorer.sampling.max_new_tokens,
                                    max_prompt_length=self.cfg.explorer.max_prompt_tokens or math.inf)
        if self.critic is not None:  # the names logged before verl's, kept
            metrics.update({"critic/values_mean": data["critic/values/mean"],
                            "critic/returns_mean": data["critic/returns/mean"]})
        return {
            **metrics,
            **data,
            **compute_throughout_metrics(batch, {"step": elapsed}, n_gpus=self.dp_world),
            # a group of one (an agent row, a demonstration without siblings) has zero GRPO advantage: say how many
            "train/singleton_groups": float((torch.bincount(batch["group_index"]) == 1).sum()),
            "train/masked_stale_tokens": float(masked_stale),
            "actor/advantages_mean": data["critic/advantages/mean"],
            "train/reward_mean": float(batch["rewards"].mean()),
            "train/staleness_mean": float(row_staleness.mean()),
            "train/staleness_max": float(row_staleness.max()),
            # the distribution, for `trinity-like plot`: the share of rows k versions stale, for each k present
            **{f"train/staleness_frac/{k}": float(n) / row_staleness.numel()
               for k, n in enumerate(torch.bincount(row_staleness.long()).tolist()) if n},
            "train/token_staleness_mean": float(token_staleness[valid].mean()) if bool(valid.any()) else 0.0,
            "train/batch_size": float(batch.batch_size[0]),
            "train/response_length_mean": response_tokens / batch.batch_size[0],
            "train/tokens_per_s": response_tokens / elapsed,
            "time/train_step_s": elapsed,
        }

    @torch.no_grad()
    def _ref_log_probs(self, batch, temperature: float) -> torch.Tensor:
        if self.ref_scorer is not None:
            return self._score_all(self.ref_scorer, batch, temperature)
        with self.module.disable_adapter():
            return self._score_all(self.scorer, batch, temperature)

    def _autocast(self):
        """Forward passes under ``trainer.dtype`` (bf16 autocast; under FSDP2 the MixedPrecisionPolicy does it)."""
        return autocast(self.device, self.dtype, enabled=not self._sharded)

    def _score(self, scorer, batch, temperature: float, with_entropy: bool = False):
        """Response log-probs (and entropy), float32 (B, R), from ``scorer`` (or the DDP wrapper around it)."""
        with self._autocast():
            return compute_log_probs(scorer, batch, temperature, with_entropy)

    def _in_micro_batches(self, batch, fn) -> torch.Tensor:
        """``fn`` (a no-grad pass giving (b, r) per-response values) over ``batch`` micro-batch by micro-batch,
        each cut to its own widths, under the same budget as training: its memory is a micro-batch's, whatever
        the batch's size. Returns (B, R) in the batch's row order, zeros on padding."""
        _, width_r = widths(batch)
        out = None
        for part in self._micro_batches(batch):
            with self._autocast():
                values = pad_responses(fn(trim(batch[part])), width_r)  # (b, R)
            if out is None:
                out = torch.zeros((batch.batch_size[0], width_r), dtype=values.dtype, device=values.device)
            out[part] = values
        return out

    def _score_all(self, scorer, batch, temperature: float) -> torch.Tensor:
        """Response log-probs (B, R) of the whole batch from ``scorer``, micro-batch by micro-batch (no grad)."""
        return self._in_micro_batches(batch, lambda micro: compute_log_probs(scorer, micro, temperature))

    def plain_policy(self):
        """The policy as a plain transformers model: the module itself, or (LoRA) its base model, whose weights
        ``policy_weights`` gives with the adapters merged in."""
        return self.module.get_base_model() if self.cfg.trainer.lora.enabled else self.module

    def policy_weights(self, copy: bool = True) -> dict[str, torch.Tensor]:
        """The plain policy's full tensors (LoRA adapters merged in, without a copy of the model), on the
        trainer's device; ``copy=False`` may return the model's own tensors. Collective under FSDP2."""
        if not self.cfg.trainer.lora.enabled:
            return export_state_dict(self.module, copy=copy)
        if self._sharded:  # DTensors: PEFT merges on a copy
            import copy as copying

            return export_state_dict(copying.deepcopy(self.module).merge_and_unload())
        from trinity_like.trainer.lora import merged_state_dict

        return merged_state_dict(self.module, copy=copy)

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's weights as the plain model holds them (LoRA adapters merged in), full tensors on the CPU
        in the resolved ``trainer.weights_dtype``. Collective under FSDP2: every rank calls it."""
        return to_host(self.policy_weights(copy=self.device.type == "cpu"), self.weights_dtype)

    def writes(self) -> bool:
        """Whether this rank writes weights and checkpoints (rank 0; the others only join FSDP2's gathers)."""
        return self.dp_rank == 0

    def gathers(self) -> bool:
        """Whether this rank must take part in assembling full weights (FSDP2: all ranks; DDP: rank 0)."""
        return self.writes() or self._sharded

    @staticmethod
    def _clip_and_step(module, optimizer, max_norm: float) -> float:
        """Clip the global gradient norm (0 = no clipping), take the optimizer step, return the norm."""
        norm = torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm if max_norm > 0 else float("inf"))
        optimizer.step()
        return parallel.scalar(norm)

    def _update_policy(self, batch, temperature: float) -> dict[str, float]:
        """``ppo_epochs`` passes over the batch in shuffled mini-batches, one optimizer update each; metrics are
        averaged over the updates that report them (``actor/sft_loss`` only comes from mini-batches with sft
        rows)."""
        tr = self.cfg.trainer
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        updates = 0
        for mb in self._mini_batches_of(batch, salt=0):
            step_metrics = self._accumulate(mb, temperature)
            step_metrics["actor/grad_norm"] = self._clip_and_step(self.model, self.optimizer,
                                                                  tr.optimizer.max_grad_norm)
            self.scheduler.step()
            updates += 1
            for k, v in step_metrics.items():
                sums[k] = sums.get(k, 0.0) + v
                counts[k] = counts.get(k, 0) + 1
        out = {k: v / counts[k] for k, v in sums.items()}
        out["actor/lr"] = float(self.optimizer.param_groups[0]["lr"])
        out["actor/updates"] = float(updates)
        return out

    def _update_critic(self, batch) -> dict[str, float]:
        """The value model's epochs over the same mini/micro-batches: clipped value loss against the returns."""
        tr, algo = self.cfg.trainer, self.cfg.algorithm
        sums: dict[str, float] = {}
        updates = 0
        for mb in self._mini_batches_of(batch, salt=7):
            self.critic_optimizer.zero_grad(set_to_none=True)
            step_metrics: dict[str, float] = {}
            shard = self._shard(mb)
            parts = self._micro_batches(shard)
            for i, part in enumerate(parts):
                micro = trim(shard[part])
                with self._autocast():
                    vpreds = compute_values(self.critic, micro)
                vf_loss, vf_clipfrac = compute_value_loss(vpreds, micro["returns"], micro["values"],
                                                          micro["response_mask"], tr.critic.cliprange_value,
                                                          algo.loss_agg_mode)
                weight = self._micro_weight(micro["response_mask"], mb["response_mask"])
                with parallel.grad_sync(self.critic, enabled=i == len(parts) - 1):
                    (vf_loss * weight * self.dp_world).backward()
                for key, value in (("critic/vf_loss", vf_loss), ("critic/vf_clipfrac", vf_clipfrac)):
                    step_metrics[key] = step_metrics.get(key, 0.0) + float(value.detach()) * weight
            step_metrics["critic/grad_norm"] = self._clip_and_step(self.critic, self.critic_optimizer,
                                                                   tr.critic.max_grad_norm)
            updates += 1
            for k, v in step_metrics.items():
                sums[k] = sums.get(k, 0.0) + v
        return {k: v / updates for k, v in sums.items()}

    def _mini_batches_of(self, batch, salt: int):
        """The mini-batches of ``ppo_epochs`` passes over ``batch``: in order for a single pass over a single
        mini-batch, else reshuffled each epoch with a seed of (seed, step, epoch, salt); DPO shuffles whole
        pairs."""
        tr = self.cfg.trainer
        rows = batch.batch_size[0]
        mini = tr.mini_batch_size or rows
        for epoch in range(tr.ppo_epochs):
            if tr.ppo_epochs == 1 and mini >= rows:
                order = torch.arange(rows)
            else:
                gen = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + self._step * 101 + epoch + salt)
                order = self._rows_of_units(torch.randperm(rows // self.needs.rows_per_unit, generator=gen))
            order = order.to(self.device)
            for lo in range(0, rows, mini):
                yield batch[order[lo:lo + mini]]

    def _shard(self, mb):
        """This rank's rows of a mini-batch (all of them without data parallelism)."""
        if self.dp_world == 1:
            return mb
        units = torch.arange(self.dp_rank, mb.batch_size[0] // self.needs.rows_per_unit, self.dp_world)
        return mb[self._rows_of_units(units).to(self.device)]

    def _rows_of_units(self, units: torch.Tensor) -> torch.Tensor:
        """Row indices of whole units (a unit: one row, or a (chosen, rejected) pair), in the units' order."""
        k = self.needs.rows_per_unit
        return (units.unsqueeze(1) * k + torch.arange(k)).reshape(-1)  # (U * k,)

    def _micro_batches(self, mb) -> list[torch.Tensor]:
        """Row indices of ``mb``'s micro-batches: ``micro_batch_size`` rows each, or as many as fit
        ``max_token_len_per_micro_batch`` counted as the micro-batch will be computed (rows x (its widest prompt
        + its widest response), ``trim``). Rows go in order of length (whole units: a DPO pair stays together),
        so each micro-batch holds rows of like length and little padding; the weights of ``_micro_weight`` make
        the accumulated gradient independent of the split."""
        k = self.needs.rows_per_unit
        units = mb.batch_size[0] // k
        prompt_len, response_len = (w.view(units, k).amax(-1).tolist() for w in row_widths(mb))
        order = sorted(range(units), key=lambda u: (prompt_len[u] + response_len[u], u), reverse=True)
        budget = self.cfg.trainer.max_token_len_per_micro_batch
        groups: list[list[int]] = []
        if not budget:
            size = max(self.cfg.trainer.micro_batch_size // k, 1)
            groups = [order[lo:lo + size] for lo in range(0, units, size)]
        else:
            group, wide_p, wide_r = [], 0, 0
            for u in order:
                p, r = max(wide_p, prompt_len[u]), max(wide_r, max(response_len[u], 1))
                if group and (len(group) + 1) * k * (p + r) > budget:
                    groups.append(group)
                    group, p, r = [], prompt_len[u], max(response_len[u], 1)
                group.append(u)
                wide_p, wide_r = p, r
            groups.append(group)
        return [self._rows_of_units(torch.tensor(sorted(g))).to(mb.device) for g in groups]

    def _accumulate(self, mb, temperature: float) -> dict[str, float]:
        """Gradients of one mini-batch (zeroed first), accumulated over its micro-batches with weights that
        make the result independent of the split; returns the mini-batch's loss metrics.

        The loss of the mini-batch is ``pg_loss(rows not sft) + sft_loss_coef * sft_loss(sft rows)``
        (``algorithm.sft_loss_form`` sum) or ``(1 - mu) * pg_loss(rows not sft) + mu * sft_loss(sft rows)`` with mu =
        ``sft_loss_coef`` (form mix, Trinity-RFT's MIX), plus the KL term over every row and the entropy term over
        every row (form sum) or the rows not sft (form mix, as Trinity's mix entropy). The two parts have their own
        normalisers
        (the policy loss by ``loss_agg_mode`` over the non-sft rows, the SFT NLL a token mean over the sft rows),
        so each micro-batch weighs each part by its share of that part's normaliser in the mini-batch."""
        algo = self.cfg.algorithm
        mask = mb["response_mask"]  # (B, R)
        is_sft = mb["sft"].unsqueeze(-1)  # (B, 1)
        pg_mask, sft_mask = mask * ~is_sft, mask * is_sft  # (B, R) each
        with_sft = bool(is_sft.any())
        mix_form = algo.sft_loss_form == "mix" and bool(algo.sft_sources)
        self.optimizer.zero_grad(set_to_none=True)
        metrics: dict[str, float] = {"actor/pg_loss": 0.0, **({"actor/sft_loss": 0.0} if with_sft else {})}
        shard = self._shard(mb)
        parts = self._micro_batches(shard)
        for i, part in enumerate(parts):
            micro = trim(shard[part])
            m_mask = micro["response_mask"]  # (b, r)
            m_sft = micro["sft"].unsqueeze(-1)  # (b, 1)
            m_pg_mask = m_mask * ~m_sft  # (b, R)
            out = self._score(self.model, micro, temperature, with_entropy=algo.entropy_coeff > 0)
            log_prob, entropy = out if algo.entropy_coeff > 0 else (out, None)
            # Weight each micro-batch so the accumulated gradient equals the one of the whole mini-batch (DDP
            # averages over ranks, hence the world size); DDP all-reduces on the last backward only.
            weight = self._micro_weight(m_mask, mask)
            loss = torch.zeros((), device=log_prob.device)
            weighted: dict[str, tuple[float, float]] = {}
            if not with_sft or m_pg_mask.any():  # a micro-batch of sft rows only has no policy loss to take
                pg_loss, loss_metrics = self.policy_loss_fn(
                    old_log_prob=micro["old_log_probs"], log_prob=log_prob, advantages=micro["advantages"],
                    response_mask=m_pg_mask, loss_agg_mode=algo.loss_agg_mode, config=algo,
                    rollout_is_weights=micro.get("rollout_is_weights", None))
                pg_weight = self._micro_weight(m_pg_mask, pg_mask)  # = weight without sft rows
                loss = pg_loss * pg_weight
                if mix_form:  # (1 - mu) * pg + mu * sft (losses.combine_sft_loss; linear, so each part pre-scaled)
                    loss = (1.0 - algo.sft_loss_coef) * loss
                weighted = {"actor/pg_loss": (float(pg_loss.detach()), pg_weight),
                            **{k: (v, pg_weight) for k, v in loss_metrics.items()}}
            if with_sft:
                m_sft_mask = m_mask * m_sft  # (b, R)
                sft_loss = masked_mean(-log_prob, m_sft_mask)  # token mean of the NLL over the sft rows
                sft_weight = self._micro_weight(m_sft_mask, sft_mask, "token-mean")
                loss = loss + algo.sft_loss_coef * sft_loss * sft_weight  # + coef * sft in either form
                weighted["actor/sft_loss"] = (float(sft_loss.detach()), sft_weight)
            terms = {}
            if entropy is not None and mix_form:  # Trinity's mix entropy: over the policy-gradient rows only
                ent = agg_loss(entropy, m_pg_mask, algo.loss_agg_mode) if m_pg_mask.any() else entropy.sum() * 0.0
                loss = loss - algo.entropy_coeff * ent * self._micro_weight(m_pg_mask, pg_mask)
                terms["actor/entropy"] = float(ent.detach())
            elif entropy is not None:
                ent = agg_loss(entropy, m_mask, algo.loss_agg_mode)
                loss = loss - algo.entropy_coeff * ent * weight
                terms["actor/entropy"] = float(ent.detach())
            if algo.use_kl_loss:
                kl = agg_loss(kl_penalty(log_prob, micro["ref_log_probs"], algo.kl_loss_type), m_mask,
                              algo.loss_agg_mode)
                loss = loss + algo.kl_loss_coef * kl * weight
                terms["actor/kl_loss"] = float(kl.detach())
            with parallel.grad_sync(self.model, enabled=i == len(parts) - 1):
                (loss * self.dp_world).backward()
            weighted.update({k: (v, weight) for k, v in terms.items()})
            for key, (value, w) in weighted.items():
                metrics[key] = metrics.get(key, 0.0) + value * w
        return metrics

    def _prepare_old_log_probs(self, batch, token_staleness: torch.Tensor, temperature: float) -> dict[str, float]:
        """Set ``old_log_probs`` (the PPO ratio's denominator) and, with an off-policy correction, the
        ``rollout_is_weights``; return the correction's and the mismatch's metrics.

        Without a correction the behaviour log-probs stored with each experience are the old policy, so the
        PPO ratio is the importance ratio against the policy that generated the data (rows that carry none
        are recomputed), unless ``recompute_old`` (engines of another kind or dtype): then the trainer's own
        log-probs are. With a correction, the proximal policy (the current weights, before this update) is
        recomputed and the correction weighs pi_prox / pi_behav per token. Every ``mismatch_interval`` steps
        the engines' log-probs of tokens generated by the current weights are compared with the trainer's.
        ``token_staleness``: the staleness of each valid response token (N,), for the correction's metrics."""
        off = self.cfg.algorithm.off_policy
        correction = off.correction
        known = batch["has_log_probs"]  # (B,)
        # (B, R) tokens generated by the weights held now (of rows whose behaviour log-probs are known)
        fresh = known.unsqueeze(-1) & (batch["token_versions"] == self._step) & (batch["response_mask"] > 0)
        measure = off.mismatch_interval > 0 and self._step % off.mismatch_interval == 0 and bool(fresh.any())
        if correction == "none" and not self.recompute_old and bool(known.all()) and not measure:
            return {}
        with torch.no_grad():
            proximal = self._score_all(self.scorer, batch, temperature)  # (B, R)
        metrics: dict[str, float] = {}
        if measure:
            algo = self.cfg.algorithm
            metrics = compute_mismatch_metrics(batch["old_log_probs"], proximal,
                                               batch["response_mask"] * fresh,
                                               algo.clip_ratio_low, algo.clip_ratio_high)
        behaviour = torch.where(known.unsqueeze(-1), batch["old_log_probs"], proximal)
        if correction == "none":
            batch["old_log_probs"] = proximal if self.recompute_old else behaviour
            return metrics
        weights, corrected = self.correction_fn(behaviour, proximal, batch["response_mask"], token_staleness,
                                                off, behaviour_known=known)
        metrics.update(corrected)
        batch["old_log_probs"] = proximal
        batch["rollout_is_weights"] = weights
        if off.negative_cap > 0:
            # for pessimistic_weights, once the advantages are known
            batch["behaviour_log_probs"], batch["proximal_log_probs"] = behaviour, proximal
        return metrics

    def _micro_weight(self, micro_mask: torch.Tensor, mini_mask: torch.Tensor, loss_agg_mode: str | None = None) -> float:
        """The micro-batch's share of the mini-batch's normaliser: its valid tokens (token-mean), its valid
        sequences (seq-* modes) or its rows (a loss over paired rows is a mean over pairs). ``loss_agg_mode`` defaults to the
        configured one (the SFT part of a mixed loss is always a token mean)."""
        if self.needs.paired_rows:
            return micro_mask.shape[0] / mini_mask.shape[0]
        if (loss_agg_mode or self.cfg.algorithm.loss_agg_mode) == "token-mean":
            return float(micro_mask.sum() / mini_mask.sum().clamp(min=1.0))
        return float((micro_mask.sum(-1) > 0).sum() / (mini_mask.sum(-1) > 0).sum().clamp(min=1))

    # ------------------------------------------------------------ weights out (trinity_like.weights.publish)
    def weights_for_export(self, on_device: bool = False) -> dict[str, torch.Tensor]:
        """The plain policy's full tensors on the CPU (on the trainer's device with ``on_device``) in the
        resolved ``trainer.weights_dtype``: not copied when they are already there (FSDP2: gathered, so every
        rank calls it)."""
        return to_host(self.policy_weights(copy=False), self.weights_dtype, self.device if on_device else "cpu")

    # ------------------------------------------------------------ checkpoints (trinity_like.trainer.checkpoint)
    def save_checkpoint(self) -> Path:
        return self.checkpointer.save()

    def latest_checkpoint(self) -> Path | None:
        return latest_checkpoint(self.paths.checkpoint_dir)

    def load_checkpoint(self, path: Path) -> None:
        """Restore everything ``save_checkpoint`` wrote (after ``prepare`` and, with workers,
        ``enable_data_parallel``; under FSDP2 every rank calls it)."""
        self._step = self.checkpointer.load(path)
