"""One train step at a real model's size: the memory and time of ``PPOTrainer.train_step`` on a Qwen2.5-0.5B
shape and a long-tailed batch, the current trainer against the one before commit 4462d03 (issue 35, item 6).

Model: Qwen2.5-0.5B's shape (bench/trainer.py's ``SHAPES``: hidden 896, 14 heads, 2 KV heads, intermediate
4,864, the 151,936-token vocabulary, tied output layer) with random weights, ``--layers`` decoder layers of its
24 (fewer on the CPU, where a 24-layer step of this batch takes minutes: the RESULT line says how many; the
hidden size and the vocabulary stay, since the output layer's memory and time are the point). ``--smoke`` uses
the tests' tiny model instead.

Batch: ``--rows`` experiences in GRPO groups of 8, random token ids, random rewards, no behaviour log-probs.
Lengths (seeded, ``sample_lengths``): prompts uniform in ``[--prompt-min, --prompt-max]``; responses long-tailed,
``rows // 8`` rows (at least one, at random places in the batch) uniform in [7/8, 1] x ``--max-response``, the
rest log-normal with median ``--max-response`` / 10 and sigma 0.8, clipped to [8, ``--max-response`` / 2].
``padding_share`` = (padded tokens - real tokens) / real tokens of the whole-batch layout (B x (widest prompt +
widest response)): the share of extra work a pass over the whole padded batch does.

Step: ``algorithm.use_kl_loss`` (a reference pass), ``off_policy.recompute_old_log_probs`` (a proximal pass),
GRPO (``--gae``: a critic, its values pass and its update), ``trainer.micro_batch_size = --micro`` or
``max_token_len_per_micro_batch = --max-tokens``, ``logprob_chunk_tokens = --chunk``, ``trainer.dtype`` and
``gradient_checkpointing`` given explicitly (float32 and off on the CPU, bfloat16 and on with CUDA, unless
``--dtype`` / ``--checkpointing`` say otherwise). Each variant gets a fresh trainer from the same weights, one
warm-up step on 8 rows of 8 + 8 tokens (AdamW's state exists before the measurement) and, with CUDA, one on the
measured batch itself (a variant's first step at a shape pays for CUDA's kernel selection and allocator growth:
on an H200 the first variant's step took 9.2 s, its next 1.4 s; the trimmed micro-batches have more distinct
shapes, so they pay more), then one measured ``train_step``. Inside it each part is timed and its peak memory taken on its own:

- ``prox``: ``_prepare_old_log_probs`` (the proximal log-probs, ``_score_all(scorer, batch, T)``);
- ``ref``: ``_ref_log_probs(batch, T)``;
- ``values`` (``--gae``): the critic's no-grad values pass; ``critic``: the critic's update;
- ``update``: ``_update_policy`` (forward + backward of every micro-batch, the optimizer step);
- ``step``: the whole ``train_step``.

Memory, GB = 1e9 bytes: on the CPU the peak RSS growth of a part over the RSS just before it (``ru_maxrss``
after the high-water mark is reset through ``/proc/self/clear_refs``; free heap memory is handed back with
glibc's ``malloc_trim`` before each part, so a part does not look small by reusing its predecessor's), each
variant in a fresh process of its own (``--one-process`` and the smoke: all in one); ``step_gb`` is the highest
of the parts' peaks and the rest of the step over the RSS before the step. With CUDA,
``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` minus ``memory_allocated`` before, all
variants in one process. Times are one step each (no repeats: a CPU step takes tens of seconds), wall clock, CUDA
synchronised; a step's time includes the few ``malloc_trim`` calls between its parts.

Variants, each a reconstruction of the code before commit 4462d03 made by patching the current code in this
process (for comparison only: nothing in trinity_like/ changes), one change undone at a time and all together:

- ``after``: the code as it is (micro-batches sorted by length and cut to their own widths by ``trim``; no-grad
  passes micro-batch by micro-batch through ``_in_micro_batches``; the output layer over real response tokens).
- ``no-trim``: ``trinity_like.trainer.ppo.trim`` is the identity and ``PPOTrainer._micro_batches`` the old in-order
  slicing (``micro_batch_size`` rows each, or the old token budget that counted real tokens), so every
  micro-batch carries the whole batch's widths (no-grad passes included, as they use the same micro-batches).
- ``whole-batch-no-grad``: ``PPOTrainer._in_micro_batches`` runs its pass over the whole batch at once (the old
  ``_score(scorer, batch, T)`` and critic values under one autocast).
- ``head-all-positions``: ``ResponseScorer.forward`` is the old one, whose output layer and log-softmax run
  over every response position of the (micro-)batch's width, padding included (chunked as now).
- ``before``: all three: the trainer as it was at 4462d03^.

Each variant's gradient norm is printed: the same weights and batch give the same norm in every variant (to
float32 rounding), which checks that the reconstructions compute what the current code computes.

    .venv/bin/python bench/realsize.py [--rows 16] [--layers 4] [--micro 4] [--variants after,before,...]
    python bench/realsize.py --device cuda --layers 24 --rows 32

``--smoke`` (``.venv/bin/python bench/realsize.py --smoke``) runs the same code path on the tiny model in
seconds; ``make test`` runs it and checks its ``RESULT`` line (tests/bench/test_smoke.py), and
tests/bench/test_realsize.py checks the reconstructions against the current code.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from benchlib import add_smoke, result_line
from trainer import save_qwen_shape

from trinity_like.common.experience import Experience
from trinity_like.common.tiny_model import make_tiny_model
from trinity_like.config import load_config
from trinity_like.trainer import batch as batch_module
from trinity_like.trainer import ppo
from trinity_like.trainer.batch import experiences_to_batch, row_widths
from trinity_like.trainer.ppo import PPOTrainer

GROUP = 8
SHAPE = "qwen2.5-0.5b"
RESULT_FIELDS = {"realsize": ("padding_share", "real_tokens", "layout_tokens", "rows", "max_response", "device",
                              "dtype", "checkpointing", "micro", "max_tokens", "chunk", "hidden", "layers", "vocab")}
"""Fields of the RESULT line (bench/benchlib.py); it also holds, for each variant V run (``-`` read as ``_``),
step_s_V, step_gb_V, prox_s_V, prox_gb_V, ref_s_V, ref_gb_V, update_s_V, update_gb_V (and values_s_V,
values_gb_V, critic_s_V, critic_gb_V with --gae), and with both ``after`` and ``before`` run step_speedup and
step_mem_ratio (before / after)."""
CHANGES = {"trim": "micro-batches in order, not cut (old _micro_batches, trim the identity)",
           "no_grad": "no-grad passes over the whole batch",
           "head": "output layer over every response position"}
"""The parts of commit 4462d03 a variant undoes."""
VARIANTS = {"after": (), "no-trim": ("trim",), "whole-batch-no-grad": ("no_grad",),
            "head-all-positions": ("head",), "before": ("trim", "no_grad", "head")}
"""Variant -> the changes of CHANGES it undoes."""
PARTS = ("prox", "ref", "values", "critic", "update")


# ------------------------------------------------------------ the code before 4462d03, for comparison only
def _micro_batches_before(self, mb) -> list[slice]:
    """PPOTrainer._micro_batches at 4462d03^: slices in row order, by ``micro_batch_size`` or packed up to
    ``max_token_len_per_micro_batch`` real tokens."""
    rows = mb.batch_size[0]
    budget = self.cfg.trainer.max_token_len_per_micro_batch
    if not budget:
        size = self.cfg.trainer.micro_batch_size
        return [slice(lo, lo + size) for lo in range(0, rows, size)]
    tokens = mb["attention_mask"].sum(-1).tolist()
    out, lo, used = [], 0, 0
    for i, n in enumerate(tokens):
        if i > lo and used + n > budget:
            out.append(slice(lo, i))
            lo, used = i, 0
        used += n
    out.append(slice(lo, rows))
    return out


def _in_micro_batches_before(self, batch, fn) -> torch.Tensor:
    """The no-grad passes at 4462d03^: ``fn`` over the whole batch at once (``_score(scorer, batch, T)``, and
    ``compute_values(critic, batch)`` under the same autocast)."""
    with self._autocast():
        return fn(batch)


def _forward_before(self, input_ids, attention_mask, position_ids, responses, temperature: float,
                    with_entropy: bool = False):
    """ResponseScorer.forward at 4462d03^: the output layer and log-softmax over every response position of
    the batch's width (B x R), padding included; chunked as now."""
    width_r = responses.shape[1]
    width_p = input_ids.shape[1] - width_r
    if not self.plain_head:
        logits = self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=False).logits[:, width_p - 1:width_p + width_r - 1]  # (B, R, V)
        return batch_module._score(lambda x: x, logits, responses, temperature, with_entropy)
    hidden = self.lm.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                   use_cache=False).last_hidden_state
    hidden = hidden[:, width_p - 1:width_p + width_r - 1]  # (B, R, H)
    head = self.lm.get_output_embeddings()
    rows, n = hidden.shape[0], hidden.shape[0] * width_r
    flat_h, flat_t = hidden.reshape(n, -1), responses.reshape(n)  # (B*R, H), (B*R,)
    if not self.chunk_tokens or n <= self.chunk_tokens:
        out = batch_module._score(head, flat_h, flat_t, temperature, with_entropy)
    else:
        from torch.utils.checkpoint import checkpoint

        parts = []
        for lo in range(0, n, self.chunk_tokens):
            args = (head, flat_h[lo:lo + self.chunk_tokens], flat_t[lo:lo + self.chunk_tokens], temperature,
                    with_entropy)
            parts.append(checkpoint(batch_module._score, *args, use_reentrant=False) if torch.is_grad_enabled()
                         else batch_module._score(*args))
        out = tuple(torch.cat(p) for p in zip(*parts, strict=True)) if with_entropy else torch.cat(parts)
    if with_entropy:
        return out[0].view(rows, width_r), out[1].view(rows, width_r)
    return out.view(rows, width_r)


@contextlib.contextmanager
def undone(changes: tuple[str, ...]):
    """The current code with ``changes`` (keys of CHANGES) reverted to 4462d03^ while the context lasts."""
    with contextlib.ExitStack() as stack:
        if "trim" in changes:
            stack.enter_context(mock.patch.object(ppo, "trim", lambda batch: batch))
            stack.enter_context(mock.patch.object(PPOTrainer, "_micro_batches", _micro_batches_before))
        if "no_grad" in changes:
            stack.enter_context(mock.patch.object(PPOTrainer, "_in_micro_batches", _in_micro_batches_before))
        if "head" in changes:
            stack.enter_context(mock.patch.object(batch_module.ResponseScorer, "forward", _forward_before))
        yield


# ------------------------------------------------------------ the batch
def sample_lengths(rows: int, max_response: int, prompt_min: int, prompt_max: int,
                   seed: int = 0) -> tuple[list[int], list[int]]:
    """Prompt and response lengths of ``rows`` rows (the distribution of the module docstring), seeded."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(prompt_min, prompt_max + 1, rows)
    short = np.exp(rng.normal(np.log(max_response / 10), 0.8, rows))
    responses = np.clip(np.round(short), 8, max_response // 2).astype(int)
    n_long = max(1, rows // 8)
    long_rows = rng.choice(rows, n_long, replace=False)
    responses[long_rows] = rng.integers(max_response * 7 // 8, max_response + 1, n_long)
    return prompts.tolist(), responses.tolist()


def padding_share(prompts: list[int], responses: list[int]) -> tuple[float, int, int]:
    """(padded - real) / real tokens of the whole-batch layout, and the real and layout token counts."""
    real = sum(prompts) + sum(responses)
    layout = len(prompts) * (max(prompts) + max(responses))
    return (layout - real) / real, real, layout


def make_experiences(prompts: list[int], responses: list[int], vocab: int, seed: int = 0) -> list[Experience]:
    """One experience per length pair, in GRPO groups of GROUP, random ids (never the special ids 0/1) and
    rewards, no behaviour log-probs."""
    rng = np.random.default_rng(seed + 1)
    return [Experience(prompt_ids=rng.integers(2, vocab, p), response_ids=rng.integers(2, vocab, r),
                       group_id=f"g{i // GROUP}", task_id=f"t{i // GROUP}", reward=float(rng.random()),
                       model_version=0)
            for i, (p, r) in enumerate(zip(prompts, responses, strict=True))]


def build_model(folder: Path, layers: int, smoke: bool) -> Path:
    """The tiny model (``smoke``), or Qwen2.5-0.5B's shape with ``layers`` layers and random weights beside the
    tiny model's tokenizer files (as bench/trainer.py's ``build_model``, with the layer count open)."""
    tiny = make_tiny_model(folder / "tiny", hidden=64, layers=layers)
    if smoke:
        return tiny
    return save_qwen_shape(folder, tiny, SHAPE, layers)


# ------------------------------------------------------------ memory and time of a step's parts
class HostMemory:
    """The process's resident memory: in use = VmRSS, peak = ``ru_maxrss`` since the last reset."""

    def __init__(self) -> None:
        try:
            self._trim = ctypes.CDLL("libc.so.6").malloc_trim
        except OSError:  # not glibc: free heap memory stays resident, and later parts may read low
            self._trim = None

    def sync(self) -> None:
        pass

    def settle(self) -> None:
        """Hand free heap memory back, so that RSS is the memory in use."""
        if self._trim is not None:
            self._trim(0)

    def in_use(self) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("/proc/self/status has no VmRSS")

    def reset_peak(self) -> None:
        Path("/proc/self/clear_refs").write_text("5")  # the high-water mark ru_maxrss reads drops to the RSS

    def peak(self) -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class CudaMemory:
    """The CUDA caching allocator's bytes: in use = ``memory_allocated``, peak = ``max_memory_allocated``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)

    def settle(self) -> None:
        self.sync()

    def in_use(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)


class StepRecorder:
    """Seconds and peak memory growth of each named part of one ``train_step`` (its methods wrapped), and of the
    whole step: the highest peak seen over the parts and the rest, above the memory in use before the step."""

    def __init__(self, memory) -> None:
        self.memory = memory
        self.parts: dict[str, tuple[float, int]] = {}
        self._active: str | None = None
        self._highest = 0

    def wrap(self, name: str, fn):
        def measured(*args, **kwargs):
            if self._active is not None:  # a pass inside a measured part is counted in it
                return fn(*args, **kwargs)
            self._highest = max(self._highest, self.memory.peak())  # the step's peak so far, before the reset
            self.memory.settle()
            before = self.memory.in_use()
            self.memory.reset_peak()
            self._active, start = name, time.perf_counter()
            try:
                out = fn(*args, **kwargs)
                self.memory.sync()
            finally:
                self._active = None
            seconds, peak = time.perf_counter() - start, self.memory.peak()
            self._highest = max(self._highest, peak)
            self.parts[name] = (seconds, peak - before)
            return out

        return measured

    def step(self, fn, *args):
        """Run the whole step ``fn(*args)``: its seconds, peak growth and result."""
        gc.collect()
        self.memory.settle()
        before = self.memory.in_use()
        self.memory.reset_peak()
        self._highest, start = 0, time.perf_counter()
        out = fn(*args)
        self.memory.sync()
        seconds = time.perf_counter() - start
        return seconds, max(self._highest, self.memory.peak()) - before, out


def computed_tokens(trainer: PPOTrainer, batch, changes: tuple[str, ...]) -> dict[str, int]:
    """Tokens the decoder and positions the output layer compute in the update and in each no-grad pass, under
    the micro-batches and widths of the variant (patched in by the caller)."""
    def counts(parts) -> tuple[int, int]:
        tokens = head = 0
        for part in parts:
            micro = ppo.trim(batch[part])
            b, width = micro["input_ids"].shape
            tokens += b * width
            head += micro["responses"].numel() if "head" in changes else int(row_widths(micro)[1].sum())
        return tokens, head

    update = counts(trainer._micro_batches(batch))
    no_grad = counts([slice(None)]) if "no_grad" in changes else update
    return {"update_tokens": update[0], "update_head": update[1], "no_grad_tokens": no_grad[0],
            "no_grad_head": no_grad[1]}


# ------------------------------------------------------------ one variant
def config_for(args, model_path: Path, tmp: str):
    """The step's config (module docstring), every knob the bench sets given explicitly."""
    return load_config(None, [
        f"checkpoint_root_dir={tmp}/runs", f"model.path={model_path}", "explorer.repeat_times=8",
        f"trainer.batch_size={args.rows}", f"trainer.micro_batch_size={args.micro}",
        f"trainer.max_token_len_per_micro_batch={args.max_tokens}", f"trainer.num_threads={args.threads}",
        f"trainer.device={args.device}", f"trainer.dtype={args.dtype}",
        f"trainer.gradient_checkpointing={args.checkpointing}", f"trainer.logprob_chunk_tokens={args.chunk}",
        "algorithm.use_kl_loss=true", "algorithm.off_policy.recompute_old_log_probs=true",
        "algorithm.off_policy.mismatch_interval=0", f"algorithm.adv_estimator={'gae' if args.gae else 'grpo'}",
    ])


def measure(args, variant: str, cfg, exps: list[Experience], memory) -> dict:
    """A fresh trainer under ``variant``: a warm-up step, then one measured step."""
    changes = VARIANTS[variant]
    with undone(changes):
        trainer = PPOTrainer(cfg)
        trainer.prepare()
        torch.set_num_threads(args.threads)
        vocab = trainer.module.config.vocab_size
        trainer.train_step(make_experiences([8] * GROUP, [8] * GROUP, vocab, seed=args.seed + 7))  # AdamW's state
        if isinstance(memory, CudaMemory):
            trainer.train_step(exps)  # this batch's shapes once: kernel selection and allocator growth
        tokens = computed_tokens(trainer, experiences_to_batch(exps, trainer.pad_token_id), changes)
        recorder = StepRecorder(memory)
        for name, method in (("prox", "_prepare_old_log_probs"), ("ref", "_ref_log_probs"),
                             ("values", "_in_micro_batches"), ("critic", "_update_critic"),
                             ("update", "_update_policy")):
            setattr(trainer, method, recorder.wrap(name, getattr(trainer, method)))
        seconds, peak, metrics = recorder.step(trainer.train_step, exps)
    del trainer
    gc.collect()
    if isinstance(memory, CudaMemory):
        torch.cuda.empty_cache()
    return {"variant": variant, "step": (seconds, peak), "parts": recorder.parts, "tokens": tokens,
            "grad_norm": metrics["actor/grad_norm"]}


def measure_all(args, model: Path, variants: list[str]) -> list[dict]:
    """Measure ``variants`` one after another in this process."""
    from trinity_like.trainer.device import resolve_device

    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    memory = CudaMemory(device) if device.type == "cuda" else HostMemory()
    prompts, responses = sample_lengths(args.rows, args.max_response, args.prompt_min, args.prompt_max, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config_for(args, model, tmp)
        vocab = json.loads((model / "config.json").read_text())["vocab_size"]
        exps = make_experiences(prompts, responses, vocab, args.seed)
        return [measure(args, v, cfg, exps, memory) for v in variants]


# ------------------------------------------------------------ the run
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), help="trainer.dtype (float32 on cpu, bf16 on cuda)")
    ap.add_argument("--checkpointing", choices=("true", "false"),
                    help="trainer.gradient_checkpointing (false on cpu, true on cuda)")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers of Qwen2.5-0.5B's 24")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--max-response", type=int, default=1024)
    ap.add_argument("--prompt-min", type=int, default=50)
    ap.add_argument("--prompt-max", type=int, default=200)
    ap.add_argument("--micro", type=int, default=4, help="trainer.micro_batch_size")
    ap.add_argument("--max-tokens", type=int, default=0, help="trainer.max_token_len_per_micro_batch (0 = by count)")
    ap.add_argument("--chunk", type=int, default=1024, help="trainer.logprob_chunk_tokens")
    ap.add_argument("--gae", action="store_true", help="a critic too: its values pass and update are measured")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--one-process", action="store_true",
                    help="every variant in one process (always with CUDA; on the CPU later variants' RSS peaks may "
                         "read low)")
    ap.add_argument("--model", help=argparse.SUPPRESS)  # worker: the model folder
    ap.add_argument("--variant", help=argparse.SUPPRESS)  # worker: the variant to measure
    ap.add_argument("--out", help=argparse.SUPPRESS)  # worker: where to write the results
    add_smoke(ap, "the tiny model, 8 rows of up to 24 + 64 tokens, micro-batches of 2, every variant in one process, "
                  "with gae")
    args = ap.parse_args(argv)
    if args.smoke:
        args.layers, args.rows, args.max_response, args.prompt_min, args.prompt_max = 2, 8, 64, 8, 24
        args.micro, args.chunk, args.gae, args.one_process = 2, 32, True, True
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    args.checkpointing = args.checkpointing or ("true" if args.device == "cuda" else "false")
    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; valid: {', '.join(VARIANTS)}")
    if args.rows % GROUP:
        ap.error(f"--rows must be a multiple of {GROUP} (the group size)")
    return args


def run_variants(args, model: Path, tmp: str) -> list[dict]:
    """On the CPU one process per variant (a process's peak RSS is its own); with CUDA or ``--one-process``
    all in this one."""
    variants = args.variants.split(",")
    if args.device == "cuda" or args.one_process:
        results = measure_all(args, model, variants)
        for r in results:
            report(r)
        return results
    shared = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
              if k not in ("variants", "variant", "out", "model", "smoke", "gae", "one_process") and v is not None]
    results = []
    for v in variants:
        out = f"{tmp}/{v}.json"
        subprocess.run([sys.executable, __file__, *shared, *(["--gae"] if args.gae else []), f"--model={model}",
                        f"--variant={v}", f"--out={out}"], check=True)
        results.append(json.loads(Path(out).read_text()))
        report(results[-1])
    return results


def report(r: dict) -> None:
    seconds, peak = r["step"]
    parts = "  ".join(f"{name} {s:6.1f} s {b / 1e9:5.2f} GB" for name, (s, b) in r["parts"].items())
    t = r["tokens"]
    print(f"{r['variant']:20s} step {seconds:6.1f} s {peak / 1e9:5.2f} GB | {parts} | grad_norm {r['grad_norm']:.6f}\n"
          f"{'':20s} decoder tokens: update {t['update_tokens']}, each no-grad pass {t['no_grad_tokens']}; "
          f"output-layer positions: update {t['update_head']}, each no-grad pass {t['no_grad_head']}", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.out:  # a worker process: one variant
        Path(args.out).write_text(json.dumps(measure_all(args, Path(args.model), [args.variant])[0]))
        return
    prompts, responses = sample_lengths(args.rows, args.max_response, args.prompt_min, args.prompt_max, args.seed)
    share, real, layout = padding_share(prompts, responses)
    print(f"device {args.device} dtype {args.dtype} checkpointing {args.checkpointing}: {args.rows} rows, "
          f"prompts {args.prompt_min}-{args.prompt_max}, responses (in batch order) {responses}; real tokens {real}, "
          f"whole-batch layout {args.rows} x ({max(prompts)} + {max(responses)}) = {layout}, padding share "
          f"{share:.2f}; micro-batches of {args.micro} rows (token budget {args.max_tokens}), logprob chunk "
          f"{args.chunk}", flush=True)
    for v in args.variants.split(","):
        print(f"  {v}: {'; '.join(CHANGES[c] for c in VARIANTS[v]) or 'the current code'}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp), args.layers, args.smoke)
        config = json.loads((model / "config.json").read_text())
        results = run_variants(args, model, tmp)
    norms = [r["grad_norm"] for r in results]
    print(f"gradient norms {', '.join(f'{n:.6f}' for n in norms)} (same weights, same batch: should agree)",
          flush=True)
    fields: dict[str, object] = {}
    by_name = {r["variant"]: r for r in results}
    for name, r in by_name.items():
        key = name.replace("-", "_")
        fields[f"step_s_{key}"], fields[f"step_gb_{key}"] = f"{r['step'][0]:.2f}", f"{r['step'][1] / 1e9:.2f}"
        for part in PARTS:
            if part in r["parts"]:
                s, b = r["parts"][part]
                fields[f"{part}_s_{key}"], fields[f"{part}_gb_{key}"] = f"{s:.2f}", f"{b / 1e9:.2f}"
    if "after" in by_name and "before" in by_name:
        after, before = by_name["after"]["step"], by_name["before"]["step"]
        fields["step_speedup"] = f"{before[0] / after[0]:.2f}"
        fields["step_mem_ratio"] = f"{before[1] / max(after[1], 1):.2f}"
    fields.update(padding_share=f"{share:.2f}", real_tokens=real, layout_tokens=layout, rows=args.rows,
                  max_response=args.max_response, device=args.device, dtype=args.dtype,
                  checkpointing=args.checkpointing, micro=args.micro, max_tokens=args.max_tokens, chunk=args.chunk,
                  gae=args.gae, hidden=config["hidden_size"], layers=config["num_hidden_layers"],
                  vocab=config["vocab_size"])
    print(result_line("realsize", fields), flush=True)


if __name__ == "__main__":
    main()
