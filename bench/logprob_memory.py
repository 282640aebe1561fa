"""Peak memory of the response log-probs, chunked against unchunked: one forward + backward of ``ResponseScorer``.

A small Qwen2 body (``--hidden`` / ``--layers``) with the real 151,936-token vocabulary and a tied output layer
(as Qwen2.5 0.5B / 1.5B), seeded so every variant has the same weights, scores ``--batch`` rows of 16 prompt +
``--response-len`` response tokens (random ids); the loss is the mean response log-prob, and its backward
fills every parameter's gradient. Each ``--chunks`` value (``trainer.logprob_chunk_tokens``; 0 = one chunk,
nothing recomputed) runs in its own subprocess, so its peak is its own:

- CPU: ``pass`` is the peak RSS during the forward + backward minus the RSS just before it (the high-water
  mark is reset there through ``/proc/self/clear_refs``); ``peak`` is the process's ``ru_maxrss`` (torch,
  the model and its inputs included).
- CUDA (``--device cuda``): ``pass`` is ``torch.cuda.max_memory_allocated`` minus the memory allocated just
  before the pass; ``peak`` is ``max_memory_allocated``.

``pass_ratio_<c>`` = pass of chunk c / pass of chunk 0. ``full_logits_gb`` is B x R x V x 4 bytes, one float32
copy of the logits the unchunked path materialises (it holds several at once: the output layer's logits, the
temperature-scaled copy, the log-softmax saved for the backward, and their gradients). The log-probs and the
gradients of every variant are compared with those of chunk 0 (max abs difference; chunking only changes
the order of float32 sums). Memory in GB = 1e9 bytes.

    .venv/bin/python bench/logprob_memory.py [--batch 4] [--response-len 1024] [--chunks 0,1024,512]
    python bench/logprob_memory.py --device cuda --dtype bfloat16 --batch 8 --response-len 2048

``--smoke`` (``.venv/bin/python bench/logprob_memory.py --smoke``) runs the same code path on small sizes in seconds;
``make test`` runs it and checks its ``RESULT`` lines (tests/bench/test_smoke.py).
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from benchlib import add_smoke

from trinity_like.trainer.batch import ResponseScorer
from trinity_like.trainer.device import autocast, resolve_device

RESULT_FIELDS = {"logprob_memory": ("full_logits_gb", "device", "dtype", "batch", "response_len", "vocab", "hidden",
                                    "layers")}
"""Fields of the RESULT line (bench/benchlib.py); it also holds pass_gb_chunkC and peak_gb_chunkC for every chunk
C of --chunks, and pass_ratio_chunkC, logprob_diff_chunkC and grad_diff_chunkC for all but the first."""

PROMPT_LEN = 16
QWEN_VOCAB = 151936


def _rss_kb(field: str) -> int:
    """A ``Vm*`` line of /proc/self/status, in kB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure(args) -> None:
    """The worker: one forward + backward with ``args.chunk``; writes log-probs, gradients and memory to
    ``args.out``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    config = Qwen2Config(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=3 * args.hidden, vocab_size=QWEN_VOCAB,
                         tie_word_embeddings=True, max_position_embeddings=32768)
    torch.manual_seed(0)
    scorer = ResponseScorer(Qwen2ForCausalLM(config).to(device).train(), args.chunk)
    gen = torch.Generator().manual_seed(1)
    input_ids = torch.randint(2, QWEN_VOCAB, (args.batch, PROMPT_LEN + args.response_len), generator=gen)
    attention_mask = torch.ones_like(input_ids)
    position_ids = torch.arange(input_ids.shape[1]).expand_as(input_ids)
    input_ids, attention_mask, position_ids = (t.to(device) for t in (input_ids, attention_mask, position_ids))
    responses = input_ids[:, PROMPT_LEN:]

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    else:
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS high-water mark (VmHWM)
        before = _rss_kb("VmRSS") * 1024
    start = time.perf_counter()
    with autocast(device, args.dtype):
        log_prob = scorer(input_ids, attention_mask, position_ids, responses, args.temperature)  # (B, R)
    (-log_prob.mean()).backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        pass_peak, peak = torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_allocated(device)
    else:
        pass_peak, peak = _rss_kb("VmHWM") * 1024, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    seconds = time.perf_counter() - start
    torch.save({
        "log_prob": log_prob.detach().float().cpu(),
        "grads": {n: p.grad.float().cpu() for n, p in scorer.lm.named_parameters()},
        "pass_bytes": pass_peak - before, "peak_bytes": peak, "seconds": seconds,
    }, args.out)


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--response-len", type=int, default=1024)
    ap.add_argument("--chunks", default="0,1024,512", help="logprob_chunk_tokens values, the first the reference")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk", type=int, help=argparse.SUPPRESS)  # worker: the variant to measure
    ap.add_argument("--out", help=argparse.SUPPRESS)  # worker: where to write its measurement
    add_smoke(ap, "1 x (16 + 64) tokens, hidden 64, chunks 0 and 32")
    args = ap.parse_args(argv)
    if args.smoke:
        args.batch, args.response_len, args.chunks, args.hidden = 1, 64, "0,32", 64
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.out:
        measure(args)
        return

    chunks = [int(c) for c in args.chunks.split(",")]
    full_logits_gb = args.batch * args.response_len * QWEN_VOCAB * 4 / 1e9
    print(f"device {args.device} dtype {args.dtype}: {args.batch} x ({PROMPT_LEN} + {args.response_len}) tokens, "
          f"vocabulary {QWEN_VOCAB}, body hidden {args.hidden} x {args.layers} layers; one float32 copy of the "
          f"response logits = {full_logits_gb:.2f} GB", flush=True)
    shared = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("chunks", "chunk", "out", "smoke")]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for c in chunks:
            out = f"{tmp}/chunk{c}.pt"
            subprocess.run([sys.executable, __file__, *shared, f"--chunk={c}", f"--out={out}"], check=True)
            results[c] = torch.load(out)
            r = results[c]
            print(f"chunk {c:5d}: pass {r['pass_bytes'] / 1e9:6.2f} GB  peak {r['peak_bytes'] / 1e9:6.2f} GB  "
                  f"forward+backward {r['seconds']:6.1f} s", flush=True)
        ref = results[chunks[0]]
        fields = []
        for c in chunks:
            r = results[c]
            fields.append(f"pass_gb_chunk{c}={r['pass_bytes'] / 1e9:.2f} peak_gb_chunk{c}={r['peak_bytes'] / 1e9:.2f}")
        for c in chunks[1:]:
            r = results[c]
            lp_diff = float((r["log_prob"] - ref["log_prob"]).abs().max())
            grad_diff = max_abs_diff(r["grads"], ref["grads"])
            grad_scale = max(float(g.abs().max()) for g in ref["grads"].values())
            print(f"chunk {c} vs chunk {chunks[0]}: log-prob max abs diff {lp_diff:.2e}, gradient max abs diff "
                  f"{grad_diff:.2e} (largest gradient entry {grad_scale:.2e})", flush=True)
            fields.append(f"pass_ratio_chunk{c}={r['pass_bytes'] / ref['pass_bytes']:.3f} "
                          f"logprob_diff_chunk{c}={lp_diff:.1e} grad_diff_chunk{c}={grad_diff:.1e}")
    print(f"RESULT logprob_memory {' '.join(fields)} full_logits_gb={full_logits_gb:.2f} device={args.device} "
          f"dtype={args.dtype} batch={args.batch} response_len={args.response_len} vocab={QWEN_VOCAB} "
          f"hidden={args.hidden} layers={args.layers}", flush=True)


if __name__ == "__main__":
    main()
