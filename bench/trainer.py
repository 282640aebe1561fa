"""Trainer throughput: ``PPOTrainer.train_step`` against a bare torch loop on the same batch.

Both sides train the same tiny Qwen2 model (freshly loaded from the same folder, same seed) with AdamW at the
same learning rate, on the same ``--batch`` experiences (16 prompt + ``--response-len`` response tokens,
behaviour log-probs computed once with the initial weights so the PPO ratio is ~1, rewards varying within
groups of 8 so the GRPO advantages are non-zero), split into the same micro-batches, with the same torch
thread count.

- trainer: ``load_config`` + ``PPOTrainer.prepare()``, then ``train_step(exps)``: Experience -> padded batch,
  GRPO advantages, dual-clip PPO loss with its metrics, micro-batch accumulation, clip, AdamW step.
- bare loop (the floor): the padded tensors and advantages are built ONCE before timing; a step is zero_grad,
  per micro-batch forward + log_softmax gather + clipped-ratio * advantage loss (token-mean weighting, the
  same masking) + backward, then clip_grad_norm and the optimizer step.

The two are timed interleaved (order alternating) after one warm-up step each, so machine noise hits both
alike; the median of ``--repeats`` steps is reported. tokens/s counts the real (prompt + response) tokens of
the batch. ``vs_bare_loop`` = trainer tokens/s / bare tokens/s (target >= 0.85). ``peak_rss_mb`` is the whole
process's peak RSS (both models, both optimizers). A split of the trainer's extra time follows (each part timed
on its own with the trainer's own objects; ``rest`` is what those parts do not explain).

    .venv/bin/python bench/trainer.py [--batch 64] [--response-len 128] [--micro 8] [--hidden 128 --layers 2]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time

import numpy as np
import torch

from trinity_like.algorithms import masked_mean
from trinity_like.common.experience import Experience
from trinity_like.common.modeling import load_causal_lm
from trinity_like.common.tiny_model import make_tiny_model
from trinity_like.config import load_config
from trinity_like.trainer.batch import compute_log_probs, experiences_to_batch
from trinity_like.trainer.ppo import PPOTrainer

PROMPT_LEN = 16
GROUP = 8
TARGET = 0.85


def make_experiences(n: int, response_len: int, vocab: int, seed: int = 0) -> list[Experience]:
    """``n`` experiences in groups of GROUP, random tokens (never the special ids 0/1), rewards varying in
    each group; no log-probs yet."""
    rng = np.random.default_rng(seed)
    exps = []
    for i in range(n):
        g = i // GROUP
        exps.append(Experience(
            prompt_ids=rng.integers(2, vocab, PROMPT_LEN), response_ids=rng.integers(2, vocab, response_len),
            group_id=f"g{g}", task_id=f"t{g}", reward=float(rng.random()), model_version=0))
    return exps


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--response-len", type=int, default=128)
    ap.add_argument("--micro", type=int, default=8, help="trainer.micro_batch_size")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.batch % GROUP:
        ap.error(f"--batch must be a multiple of {GROUP} (the group size)")
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        model_path = make_tiny_model(f"{tmp}/model", hidden=args.hidden, layers=args.layers)
        cfg = load_config(None, [
            f"checkpoint_root_dir={tmp}/runs", f"model.path={model_path}", "explorer.repeat_times=8",
            f"trainer.batch_size={args.batch}", f"trainer.micro_batch_size={args.micro}",
            f"trainer.num_threads={args.threads}",
        ])
        trainer = PPOTrainer(cfg)
        trainer.prepare()
        torch.set_num_threads(args.threads)
        pad = trainer.pad_token_id
        temperature = cfg.explorer.sampling.temperature
        exps = make_experiences(args.batch, args.response_len, trainer.model.config.vocab_size)

        # Behaviour log-probs from the initial weights (ratio ~1 on the first step).
        with torch.no_grad():
            behaviour = compute_log_probs(trainer.model, experiences_to_batch(exps, pad), temperature)
        for e, lp in zip(exps, behaviour, strict=True):
            e.logprobs = lp[:len(e.response_ids)].numpy()

        # ---------------------------------------------------------------- bare loop inputs, built once
        algo, opt = cfg.algorithm, cfg.trainer.optimizer
        batch = experiences_to_batch(exps, pad)
        ids, attn, pos = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
        responses, mask, old_lp = batch["responses"], batch["response_mask"], batch["old_log_probs"]
        adv, _ = trainer.adv_fn(token_level_rewards=batch["token_level_rewards"], response_mask=mask,
                                index=batch["group_index"].tolist(), norm_adv_by_std_in_grpo=True)
        width_r = responses.shape[1]
        width_p = ids.shape[1] - width_r
        tokens = int(attn.sum())
        total_tokens = mask.sum().clamp(min=1.0)
        low, high = 1.0 - algo.clip_ratio_low, 1.0 + algo.clip_ratio_high
        t_scale = temperature if temperature > 0 else 1.0
        torch.manual_seed(cfg.seed)
        bare_model = load_causal_lm(model_path, train=True)
        bare_opt = torch.optim.AdamW(bare_model.parameters(), lr=opt.lr, betas=(opt.beta1, opt.beta2),
                                     eps=opt.eps, weight_decay=opt.weight_decay)
        params = list(bare_model.parameters())

        def bare_step() -> float:
            bare_opt.zero_grad(set_to_none=True)
            for lo in range(0, args.batch, args.micro):
                s = slice(lo, lo + args.micro)
                logits = bare_model(input_ids=ids[s], attention_mask=attn[s], position_ids=pos[s],
                                    use_cache=False).logits[:, width_p - 1:width_p + width_r - 1]
                logp = torch.log_softmax(logits.float() / t_scale, -1).gather(-1, responses[s, :, None])[..., 0]
                ratio = torch.exp(logp - old_lp[s])
                a = adv[s]
                per_token = torch.maximum(-a * ratio, -a * ratio.clamp(low, high))
                ((per_token * mask[s]).sum() / total_tokens).backward()
            norm = torch.nn.utils.clip_grad_norm_(params, opt.max_grad_norm)
            bare_opt.step()
            return float(norm)

        def trainer_step() -> float:
            return trainer.train_step(exps)["actor/grad_norm"]

        # Warm-up; both start from the same weights, so the first gradient norms must agree.
        g_trainer, g_bare = trainer_step(), bare_step()
        print(f"warm-up grad_norm: trainer {g_trainer:.6f}  bare {g_bare:.6f}  "
              f"(same weights, same batch: should agree)", flush=True)
        times: dict[str, list[float]] = {"trainer": [], "bare": []}
        runs = [("trainer", trainer_step), ("bare", bare_step)]
        for r in range(args.repeats):
            for name, fn in runs if r % 2 == 0 else runs[::-1]:
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
        step = {name: statistics.median(v) for name, v in times.items()}
        tps = {name: tokens / s for name, s in step.items()}
        ratio = tps["trainer"] / tps["bare"]
        for name in ("trainer", "bare"):
            print(f"{name:8s} {tps[name]:9.0f} tokens/s  median step {1e3 * step[name]:8.1f} ms  "
                  f"(steps: {', '.join(f'{1e3 * t:.0f}' for t in times[name])} ms)", flush=True)

        # ---------------------------------------------------------------- where the extra time goes
        n_micro = -(-args.batch // args.micro)
        with torch.no_grad():
            micro_lp = compute_log_probs(trainer.model, batch[: args.micro], temperature)
        micro_lp.requires_grad_(True)  # a leaf: the loss timings below include the loss graph's backward
        micro_old, micro_adv, micro_mask = old_lp[: args.micro], adv[: args.micro], mask[: args.micro]

        def advantages() -> None:
            trainer.adv_fn(token_level_rewards=batch["token_level_rewards"], response_mask=mask,
                           index=batch["group_index"].tolist(), values=None, reward_baselines=None,
                           gamma=algo.gamma, lam=algo.lam, norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
                           opmd_baseline=algo.opmd_baseline, tau=algo.tau)

        def slicing() -> None:
            mb = batch[torch.arange(args.batch)]  # the trainer's mini-batch gather (one epoch, one update)
            for lo in range(0, args.batch, args.micro):
                mb[lo:lo + args.micro]

        def ppo_loss() -> None:
            for _ in range(n_micro):
                loss, _ = trainer.policy_loss_fn(old_log_prob=micro_old, log_prob=micro_lp, advantages=micro_adv,
                                                 response_mask=micro_mask, loss_agg_mode=algo.loss_agg_mode,
                                                 config=algo)
                (loss * float(micro_mask.sum() / total_tokens)).backward()
                float(loss.detach())

        def bare_loss() -> None:
            for _ in range(n_micro):
                r_ = torch.exp(micro_lp - micro_old)
                ((torch.maximum(-micro_adv * r_, -micro_adv * r_.clamp(low, high)) * micro_mask).sum()
                 / total_tokens).backward()

        def metrics() -> None:
            float(masked_mean(adv, mask))
            float(batch["rewards"].mean())
            staleness = (trainer.train_step_num - batch["model_version"]).float()
            float(staleness.mean()), float(staleness.max()), float(mask.sum())

        k = max(args.repeats, 5)
        t_batch = median_time(lambda: experiences_to_batch(exps, pad), k)
        parts = {
            "experiences_to_batch": t_batch,
            "advantages (grpo)": median_time(advantages, k),
            "TensorDict mini/micro slicing": median_time(slicing, k),
            "ppo loss+metrics - bare loss (fwd+bwd)": median_time(ppo_loss, k) - median_time(bare_loss, k),
            "step metrics": median_time(metrics, k),
        }
        extra = step["trainer"] - step["bare"]
        parts["rest (per-step python, noise)"] = extra - sum(parts.values())
        flag = "below" if ratio < TARGET else "meets"
        print(f"train_step extra time over the bare loop: {1e3 * extra:.1f} ms per step "
              f"({100 * extra / step['trainer']:.1f}% of the step; ratio {ratio:.3f} {flag} target {TARGET})",
              flush=True)
        for name, t in parts.items():
            print(f"  {name:40s} {1e3 * t:8.2f} ms", flush=True)

    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"RESULT trainer tokens_per_s={tps['trainer']:.0f} vs_bare_loop={ratio:.3f} peak_rss_mb={peak_rss_mb:.0f} "
          f"bare_tokens_per_s={tps['bare']:.0f} step_ms={1e3 * step['trainer']:.1f} "
          f"bare_step_ms={1e3 * step['bare']:.1f} batch={args.batch} micro={args.micro} "
          f"response_len={args.response_len} hidden={args.hidden} layers={args.layers}", flush=True)


if __name__ == "__main__":
    main()
