"""Trainer throughput: ``PPOTrainer.train_step`` against a bare torch loop on the same batch, on CPU or GPU.

Both sides train the same Qwen2 model (loaded from the same folder, same seed) with AdamW at the same learning
rate, on the same device and in the same precision, on the same ``--batch`` experiences (16 prompt +
``--response-len`` response tokens, behaviour log-probs computed once with the initial weights so the PPO
ratio is ~1, rewards varying within groups of 8 so the GRPO advantages are non-zero), split into the same
micro-batches, with the same torch thread count.

- model (``--shape``): ``tiny`` is the tiny model of the tests (``--hidden`` / ``--layers``, 512-token
  vocabulary); ``qwen2.5-0.5b`` and ``qwen2.5-1.5b`` are Qwen2.5's real shapes (151,936-token vocabulary, tied
  output layer) with random weights, written to a temporary folder beside the tiny model's tokenizer, so
  nothing is downloaded.
- precision (``--dtype``): ``bfloat16`` is ``trainer.dtype: bfloat16`` on the trainer side and bf16 autocast
  around the bare loop's forward; both keep float32 weights, AdamW state, log-probs and loss.
- trainer: ``load_config`` + ``PPOTrainer.prepare()``, then ``train_step(exps)``: Experience -> padded batch on
  the device, GRPO advantages, dual-clip PPO loss with its metrics, micro-batch accumulation, clip, AdamW step.
  Its response log-probs go through ``ResponseScorer`` with ``trainer.logprob_chunk_tokens = --chunk``;
  the default 0 (one chunk) makes both sides compute the same full float32 logits, so the ratio measures the
  trainer's overhead and not the chunking (``--chunk 1024`` prices the recomputed output layer).
- bare loop (the floor): the padded tensors and advantages are built ONCE, on the device, before timing; a
  step is zero_grad, per micro-batch forward (output layer over the response positions only,
  ``logits_to_keep``) + float32 log_softmax gather + clipped-ratio * advantage loss (token-mean weighting, the
  same masking) + backward, then clip_grad_norm and the optimizer step.

On CPU the two are timed interleaved (order alternating) after one warm-up step each, so the shared machine's
noise hits both alike, and ``peak_rss_mb`` is the whole process's peak RSS (both models, both optimizers). On
CUDA each side runs alone on the GPU (bare loop first, then freed, then the trainer: the 1.5B shape with its
float32 AdamW state does not fit twice on an 80 GB GPU), every step is bracketed by
``torch.cuda.synchronize()``, and ``peak_gpu_mem_gb`` / ``bare_peak_gpu_mem_gb`` are each side's own
``torch.cuda.max_memory_allocated`` over its warm-up and timed steps. The median of ``--repeats`` steps is
reported. tokens/s counts the real (prompt + response) tokens of the batch. ``vs_bare_loop`` = trainer
tokens/s / bare tokens/s (target >= 0.85).

``mfu`` = model FLOPs per step / step time / the GPU's dense peak, with model FLOPs per step

    6 * N_body * T  +  6 * H * V * T_resp  +  12 * L * H * S * T

(T tokens of the batch, T_resp scored response positions, N_body the parameters other than the embedding and
output layer, H hidden size, V vocabulary, L layers, S = 16 + response_len the row length). The first term is
the forward + backward of the body's matmuls, the second the output layer's (left out of "non-embedding
params" counts, yet 27% of Qwen2.5-0.5B's matmul FLOPs at this vocabulary, so it is counted: it is real
work both sides do), the third the attention scores and values counted over the full S x S square (PaLM,
appendix B; a causal kernel does about half). Recomputation (``--chunk`` > 0, gradient checkpointing) is not
counted: it is overhead, not model FLOPs. Peaks (``PEAK_FLOPS``, by ``torch.cuda.get_device_name()``):
dense bf16 for ``--dtype bfloat16`` and TF32 for ``float32`` -- torch runs float32 matmuls in TF32 only if
``torch.backends.cuda.matmul.allow_tf32`` is set, which neither side does, so a float32 mfu is a fraction
of an unreachable peak. On CPU and on GPUs not in the table ``mfu=nan``.

A split of the trainer's extra time follows (each part timed on its own with the trainer's own objects;
``rest`` is what those parts do not explain).

    .venv/bin/python bench/trainer.py [--batch 64] [--response-len 128] [--micro 8] [--hidden 128 --layers 2]
    python bench/trainer.py --device cuda --dtype bfloat16 --shape qwen2.5-0.5b --batch 64 --micro 8 \\
        --response-len 1008

``--smoke`` (``.venv/bin/python bench/trainer.py --smoke``) runs the same code path on small sizes in seconds;
``make test`` runs it and checks its ``RESULT`` lines (tests/bench/test_smoke.py).
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from benchlib import add_smoke

from trinity_like.algorithms import compute_advantage, get_adv_estimator_fn, masked_mean
from trinity_like.common.experience import Experience
from trinity_like.common.modeling import load_causal_lm
from trinity_like.common.tiny_model import make_tiny_model
from trinity_like.config import load_config
from trinity_like.trainer.batch import compute_log_probs, experiences_to_batch
from trinity_like.trainer.device import autocast, resolve_device
from trinity_like.trainer.ppo import PPOTrainer

PROMPT_LEN = 16
GROUP = 8
TARGET = 0.85
QWEN_VOCAB = 151936
SHAPES = {
    "qwen2.5-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864),
    "qwen2.5-1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         intermediate_size=8960),
}
"""Qwen2.5's published shapes (both tie the output layer to the embedding; 151,936-token vocabulary)."""
PEAK_FLOPS = (
    ("H100 PCIe", {"bfloat16": 756.5e12, "float32": 378.0e12}),
    ("H100", {"bfloat16": 989.4e12, "float32": 494.7e12}),
    ("H200", {"bfloat16": 989.4e12, "float32": 494.7e12}),
    ("A100", {"bfloat16": 312.0e12, "float32": 156.0e12}),
)
"""Dense peak FLOP/s of one GPU by a substring of its name (first match wins): bf16 tensor cores, and TF32
for float32."""
RESULT_FIELDS = {"trainer": ("tokens_per_s", "vs_bare_loop", "mfu", "bare_tokens_per_s", "bare_mfu", "step_ms",
                             "bare_step_ms", "device", "dtype", "shape", "chunk", "batch", "micro", "response_len",
                             "hidden", "layers")}
"""Fields of the RESULT line (bench/benchlib.py); it also holds peak_rss_mb on the CPU, and peak_gpu_mem_gb and
bare_peak_gpu_mem_gb on CUDA."""


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


def build_model(folder: Path, shape: str, hidden: int, layers: int) -> Path:
    """The model folder for ``--shape``: the tiny model, or a Qwen2.5 shape with random weights and the tiny
    model's tokenizer files (its special ids 0/1 are valid ids of the large vocabulary)."""
    tiny = make_tiny_model(folder / "tiny", hidden=hidden, layers=layers)
    if shape == "tiny":
        return tiny
    return save_qwen_shape(folder, tiny, shape)


def save_qwen_shape(folder: Path, tiny: Path, shape: str, layers: int | None = None) -> Path:
    """``folder/shape``: a Qwen2.5 ``shape`` (of ``SHAPES``; ``layers`` of them when given) with random weights
    (seed 0), the 151,936-token vocabulary and ``tiny``'s tokenizer files and special ids."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    base = json.loads((tiny / "config.json").read_text())
    dims = {**SHAPES[shape], **({"num_hidden_layers": layers} if layers else {})}
    config = Qwen2Config(**dims, vocab_size=QWEN_VOCAB, tie_word_embeddings=True,
                         max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                         bos_token_id=base["bos_token_id"], eos_token_id=base["eos_token_id"],
                         pad_token_id=base["pad_token_id"])
    torch.manual_seed(0)
    out = folder / shape
    Qwen2ForCausalLM(config).save_pretrained(out)
    for f in tiny.iterdir():
        if not f.name.endswith(".safetensors") and f.name not in ("config.json", "generation_config.json"):
            shutil.copy(f, out / f.name)
    return out


def model_flops_per_step(config, module: torch.nn.Module, tokens: int, response_positions: int,
                         row_len: int) -> float:
    """Model FLOPs of one training step (formula in the module docstring)."""
    embed, head = module.get_input_embeddings().weight, module.get_output_embeddings().weight
    body = sum(p.numel() for p in module.parameters() if p is not embed and p is not head)
    hidden, layers = config.hidden_size, config.num_hidden_layers
    return (6 * body * tokens + 6 * head.shape[0] * head.shape[1] * response_positions
            + 12 * layers * hidden * row_len * tokens)


def peak_flops(device: torch.device, dtype: str) -> float:
    """The device's dense peak FLOP/s in ``dtype`` (nan on CPU or on a GPU not in PEAK_FLOPS)."""
    if device.type != "cuda":
        return float("nan")
    name = torch.cuda.get_device_name(device)
    return next((peaks[dtype] for key, peaks in PEAK_FLOPS if key in name), float("nan"))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> float:
    """Seconds ``fn()`` takes, the device's queued work included."""
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


def median_time(fn, repeats: int, device: torch.device) -> float:
    return statistics.median(timed(fn, device) for _ in range(repeats))


class BareLoop:
    """The floor: a plain model and AdamW doing a PPO step on pre-built device tensors (see module docstring)."""

    def __init__(self, model_path: Path, cfg, device: torch.device, micro: int) -> None:
        opt, algo = cfg.trainer.optimizer, cfg.algorithm
        torch.manual_seed(cfg.seed)
        self.model = load_causal_lm(model_path, train=True).to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=opt.lr, betas=(opt.beta1, opt.beta2),
                                           eps=opt.eps, weight_decay=opt.weight_decay)
        self.device, self.dtype, self.micro = device, cfg.trainer.dtype, micro
        self.max_grad_norm = opt.max_grad_norm
        self.low, self.high = 1.0 - algo.clip_ratio_low, 1.0 + algo.clip_ratio_high
        temperature = cfg.explorer.sampling.temperature
        self.t_scale = temperature if temperature > 0 else 1.0
        self.batch = self.advantages = None

    def behaviour_log_probs(self, batch, temperature: float) -> torch.Tensor:
        """Log-probs (B, R) under the initial weights, one micro-batch at a time (a whole batch of float32
        logits at Qwen's vocabulary would not fit), on the CPU."""
        rows = batch.batch_size[0]
        with torch.no_grad(), autocast(self.device, self.dtype):
            parts = [compute_log_probs(self.model, batch[lo:lo + self.micro], temperature).float().cpu()
                     for lo in range(0, rows, self.micro)]
        return torch.cat(parts)

    def step(self) -> float:
        """One optimizer step over ``self.batch``; returns the gradient norm before clipping."""
        b = self.batch
        ids, attn, pos = b["input_ids"], b["attention_mask"], b["position_ids"]
        responses, mask, old_lp, adv = b["responses"], b["response_mask"], b["old_log_probs"], self.advantages
        width_r = responses.shape[1]
        total_tokens = mask.sum().clamp(min=1.0)
        self.optimizer.zero_grad(set_to_none=True)
        for lo in range(0, b.batch_size[0], self.micro):
            s = slice(lo, lo + self.micro)
            with autocast(self.device, self.dtype):
                # the last R + 1 positions; all but the last score the R response tokens
                logits = self.model(input_ids=ids[s], attention_mask=attn[s], position_ids=pos[s], use_cache=False,
                                    logits_to_keep=width_r + 1).logits[:, :-1]  # (b, R, V)
            logp = torch.log_softmax(logits.float() / self.t_scale, -1).gather(-1, responses[s, :, None])[..., 0]
            ratio = torch.exp(logp - old_lp[s])  # (b, R)
            per_token = torch.maximum(-adv[s] * ratio, -adv[s] * ratio.clamp(self.low, self.high))
            ((per_token * mask[s]).sum() / total_tokens).backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        return float(norm)


def time_alone(name: str, step, repeats: int, device: torch.device) -> tuple[float, list[float], float]:
    """Warm-up step (its gradient norm), ``repeats`` timed steps, and the peak GPU memory (GB) over them."""
    torch.cuda.reset_peak_memory_stats(device)
    grad_norm = step()
    times = [timed(step, device) for _ in range(repeats)]
    print(f"{name}: warm-up grad_norm {grad_norm:.6f}", flush=True)
    return grad_norm, times, torch.cuda.max_memory_allocated(device) / 1e9


def split_extra_time(trainer: PPOTrainer, exps, batch, adv, micro: int, repeats: int) -> dict[str, float]:
    """Seconds per step of the parts of ``train_step`` the bare loop does not do, each timed on its own."""
    algo, device, pad = trainer.cfg.algorithm, trainer.device, trainer.pad_token_id
    temperature = trainer.cfg.explorer.sampling.temperature
    rows = batch.batch_size[0]
    mask, old_lp = batch["response_mask"], batch["old_log_probs"]
    total_tokens = mask.sum().clamp(min=1.0)
    low, high = 1.0 - algo.clip_ratio_low, 1.0 + algo.clip_ratio_high
    n_micro = -(-rows // micro)
    with torch.no_grad(), autocast(device, trainer.cfg.trainer.dtype):
        micro_lp = compute_log_probs(trainer.model, batch[:micro], temperature).float()
    micro_lp.requires_grad_(True)  # a leaf: the loss timings below include the loss graph's backward
    micro_old, micro_adv, micro_mask = old_lp[:micro], adv[:micro], mask[:micro]

    def advantages() -> None:  # the trainer's call, on the keys it reads (compute_advantage writes two more)
        compute_advantage({k: batch[k] for k in ("token_level_rewards", "response_mask", "group_index")},
                          algo.adv_estimator, gamma=algo.gamma, lam=algo.lam,
                          norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo, opmd_baseline=algo.opmd_baseline,
                          tau=algo.tau)

    def slicing() -> None:
        mb = batch[torch.arange(rows, device=device)]  # the trainer's mini-batch gather (one epoch, one update)
        for lo in range(0, rows, micro):
            mb[lo:lo + micro]

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

    k = max(repeats, 5)
    return {
        "experiences_to_batch (+ to device)": median_time(lambda: experiences_to_batch(exps, pad).to(device), k,
                                                          device),
        "advantages (grpo)": median_time(advantages, k, device),
        "TensorDict mini/micro slicing": median_time(slicing, k, device),
        "ppo loss+metrics - bare loss (fwd+bwd)": median_time(ppo_loss, k, device) - median_time(bare_loss, k,
                                                                                                  device),
        "step metrics": median_time(metrics, k, device),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--shape", choices=("tiny", *SHAPES), default="tiny")
    ap.add_argument("--chunk", type=int, default=0, help="trainer.logprob_chunk_tokens (0 = one chunk)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--response-len", type=int, default=128)
    ap.add_argument("--micro", type=int, default=8, help="trainer.micro_batch_size")
    ap.add_argument("--hidden", type=int, default=128, help="--shape tiny only")
    ap.add_argument("--layers", type=int, default=2, help="--shape tiny only")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--checkpointing", choices=("false", "true", "auto"), default="false",
                    help="trainer.gradient_checkpointing; false (default) does the bare loop's work, so the ratio "
                         "is the wrapper's overhead (auto turns it on with CUDA: an H200 step at 1.5B took 1.64x "
                         "the bare loop's with it, 41.5 vs 72.4 GB)")
    add_smoke(ap, "the tiny shape, 8 x (16 + 16) tokens, micro-batches of 4, one timed step")
    args = ap.parse_args(argv)
    if args.smoke:
        args.shape, args.batch, args.response_len, args.micro, args.repeats = "tiny", GROUP, 16, 4, 1
    if args.batch % GROUP:
        ap.error(f"--batch must be a multiple of {GROUP} (the group size)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    alone = device.type == "cuda"

    with tempfile.TemporaryDirectory() as tmp:
        model_path = build_model(Path(tmp), args.shape, args.hidden, args.layers)
        cfg = load_config(None, [
            f"checkpoint_root_dir={tmp}/runs", f"model.path={model_path}", "explorer.repeat_times=8",
            f"trainer.batch_size={args.batch}", f"trainer.micro_batch_size={args.micro}",
            f"trainer.num_threads={args.threads}", f"trainer.device={args.device}", f"trainer.dtype={args.dtype}",
            f"trainer.logprob_chunk_tokens={args.chunk}",
            f"trainer.gradient_checkpointing={'' if args.checkpointing == 'auto' else args.checkpointing}",
        ])
        algo, temperature = cfg.algorithm, cfg.explorer.sampling.temperature
        bare = BareLoop(model_path, cfg, device, args.micro)
        model_cfg = bare.model.config
        pad = int(model_cfg.pad_token_id if model_cfg.pad_token_id is not None else model_cfg.eos_token_id)
        exps = make_experiences(args.batch, args.response_len, model_cfg.vocab_size)
        # Behaviour log-probs from the initial weights (ratio ~1 on the first step).
        behaviour = bare.behaviour_log_probs(experiences_to_batch(exps, pad).to(device), temperature)
        for e, lp in zip(exps, behaviour, strict=True):
            e.logprobs = lp[:len(e.response_ids)].numpy()
        batch = experiences_to_batch(exps, pad).to(device)
        adv, _ = get_adv_estimator_fn(algo.adv_estimator)(
            token_level_rewards=batch["token_level_rewards"], response_mask=batch["response_mask"],
            index=batch["group_index"].tolist(), norm_adv_by_std_in_grpo=True)
        bare.batch, bare.advantages = batch, adv
        tokens = int(batch["attention_mask"].sum())
        flops = model_flops_per_step(model_cfg, bare.model, tokens, batch["responses"].numel(),
                                     PROMPT_LEN + args.response_len)
        print(f"device {device} dtype {args.dtype} shape {args.shape}: {args.batch} x ({PROMPT_LEN} + "
              f"{args.response_len}) tokens, micro-batches of {args.micro}, trainer.logprob_chunk_tokens "
              f"{args.chunk} (bare loop: full logits), {flops / 1e12:.1f} model TFLOP per step", flush=True)

        def make_trainer() -> PPOTrainer:
            trainer = PPOTrainer(cfg)
            trainer.prepare()
            torch.set_num_threads(args.threads)
            return trainer

        peak_gb: dict[str, float] = {}
        times: dict[str, list[float]] = {"trainer": [], "bare": []}
        if alone:  # each side alone on the GPU, the bare loop first and then freed
            g_bare, times["bare"], peak_gb["bare"] = time_alone("bare", bare.step, args.repeats, device)
            del bare
            gc.collect()
            torch.cuda.empty_cache()
            trainer = make_trainer()
            g_trainer, times["trainer"], peak_gb["trainer"] = time_alone(
                "trainer", lambda: trainer.train_step(exps)["actor/grad_norm"], args.repeats, device)
        else:  # interleaved, order alternating, after one warm-up step each
            trainer = make_trainer()
            runs = [("trainer", lambda: trainer.train_step(exps)["actor/grad_norm"]), ("bare", bare.step)]
            g_trainer, g_bare = runs[0][1](), runs[1][1]()
            for r in range(args.repeats):
                for name, fn in runs if r % 2 == 0 else runs[::-1]:
                    times[name].append(timed(fn, device))
        print(f"warm-up grad_norm: trainer {g_trainer:.6f}  bare {g_bare:.6f}  "
              f"(same weights, same batch: should agree{', to bf16 rounding' if args.dtype == 'bfloat16' else ''})",
              flush=True)
        step = {name: statistics.median(v) for name, v in times.items()}
        tps = {name: tokens / s for name, s in step.items()}
        mfu = {name: flops / s / peak_flops(device, args.dtype) for name, s in step.items()}
        ratio = tps["trainer"] / tps["bare"]
        for name in ("trainer", "bare"):
            print(f"{name:8s} {tps[name]:9.0f} tokens/s  median step {1e3 * step[name]:8.1f} ms  mfu {mfu[name]:.3f}"
                  f"  (steps: {', '.join(f'{1e3 * t:.0f}' for t in times[name])} ms)", flush=True)

        parts = split_extra_time(trainer, exps, batch, adv, args.micro, args.repeats)
        extra = step["trainer"] - step["bare"]
        parts["rest (per-step python, noise)"] = extra - sum(parts.values())
        flag = "below" if ratio < TARGET else "meets"
        print(f"train_step extra time over the bare loop: {1e3 * extra:.1f} ms per step "
              f"({100 * extra / step['trainer']:.1f}% of the step; ratio {ratio:.3f} {flag} target {TARGET})",
              flush=True)
        for name, t in parts.items():
            print(f"  {name:40s} {1e3 * t:8.2f} ms", flush=True)

    if alone:
        memory = f"peak_gpu_mem_gb={peak_gb['trainer']:.2f} bare_peak_gpu_mem_gb={peak_gb['bare']:.2f}"
    else:
        memory = f"peak_rss_mb={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}"
    print(f"RESULT trainer tokens_per_s={tps['trainer']:.0f} vs_bare_loop={ratio:.3f} mfu={mfu['trainer']:.3f} "
          f"{memory} bare_tokens_per_s={tps['bare']:.0f} bare_mfu={mfu['bare']:.3f} "
          f"step_ms={1e3 * step['trainer']:.1f} bare_step_ms={1e3 * step['bare']:.1f} device={device.type} "
          f"dtype={args.dtype} shape={args.shape} checkpointing={args.checkpointing} chunk={args.chunk} batch={args.batch} micro={args.micro} "
          f"response_len={args.response_len} hidden={model_cfg.hidden_size} layers={model_cfg.num_hidden_layers}",
          flush=True)


if __name__ == "__main__":
    main()
