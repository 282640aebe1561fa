"""Step-async vs streaming rollout at scale, on EMULATED hardware under the REAL control plane (issue 51 item 3).

EMULATION: the engines (``explorer.engine: emulated``, trinity_like/explorer/engines/emulated.py) generate no model's
tokens but take the time a vLLM engine on an H100 would (the ``7b_h100`` cost curve: 5.9 ms + 87 us per sequence a
decode iteration, prefill 25.7 us a token, a load 0.67 s, 256 slots); the trainer (``trainer.type: emulated``,
trinity_like/trainer/emulated.py) sleeps ``tokens / W x 1.15e-4 s`` a step (7B on an H100 at 40% MFU) and publishes
a small state dict. Everything else is the real run: ``trinity_like.launcher.run(cfg)`` on a local Ray instance
started here, the explorer and its rollout drivers, the fleet's routing and per-engine admission, the buffer's
segments and ledger, the Synchronizer, the weight publication and loading (``checkpoint``), the trainer role. So the
figures measure the scheduler and the control plane, never a model or its learning (rewards are meaningless: the
arithmetic scorer on emulated tokens).

Workload: the 7B / 64-GPU layout of bench/simulate.py (``projection_layout``: 256 prompts x 16 samples a step,
prompt 512, responses of mean ~2,000 capped at 8,192) scaled down so that one run fits this 2-core machine:
lengths by 1/10 (prompt 51, mean response 200, max 819: the ``explorer.emulated`` defaults, every ratio kept),
and GPUs and prompts by 1/8 (``--gpus 8``, ``--prompts 32`` x 16 samples = 512 rows a step), which keeps the
7B layout's load per engine (~100 requests per engine per step at E = 5 of 8; at 64 GPUs ~40 engines share
4,096) and its balance (at step-async's best split the trainer is busy most of the step). The G emulated GPUs
are split into E engines and W = G - E trainer workers (``trainer.emulated.workers``; ``allreduce_s`` 0).

Modes, each at ``--bounds`` (``synchronizer.max_staleness``; default 1 2 4), all ``mode: async``:
``step`` (``explorer.rollout: step``), ``finish`` / ``resubmit`` / ``keep`` (``explorer.rollout: stream`` with that
``explorer.stream.on_new_version``; the emulated engine cuts at once, so ``resubmit`` needs no ``chunk_tokens``).
Each mode runs at its own best split: a hill climb over ``--engines`` (default 4 5 6 of 8): the middle value
first, then one neighbour in the direction the run points to (the trainer idle more than 15% of the loop: more
engines; else fewer), and on while rows/s grows; the best run is the mode's figure (the maximum over noisy
runs favours no mode: every mode gets it). To fit ~20 minutes the climb runs at the headline bound (2, run first,
so a grid cut off keeps it) and each mode keeps the split it chose there at the other bounds
(``--climb-every-bound`` climbs at each); then the headline's step and best stream run once more at their splits
(``--repeat-headline``), which measures the noise. About 18 runs of 40-55 s each (set-up 3-15 s, a 6-step loop of
35-50 s).

Per run (from the run's ``metrics.jsonl``, as bench/async_speedup.py reads it): ``rows_s`` = trained rows / the
training loop's wall time (explorer step 0's admission to the last trainer record); realised staleness (the
trainer's ``train/staleness_mean`` averaged over steps, ``train/staleness_max`` max; ``token_staleness`` the
per-token mean); ``dropped`` (the buffer's ``skipped_stale`` rows at the end) and ``cancelled`` groups
(``rollout/cancelled_groups``); ``masked_tokens`` (``train/masked_stale_tokens``, summed); ``engine_busy`` (mean
of ``rollout/engine_busy_frac``: the share of time an engine had a call running, not how full its batch was);
``steady_rows_s`` (beside the headline ``rows_s``: the rows of trainer steps 2..N over the time from step 1's
record to step N's, without the pipeline's fill, which is a large part of a 6-step loop); ``trainer_idle`` (``time/wait_data_s`` summed / loop); and ``cpu_cores``, the
control plane's CPU: the on-CPU seconds during the loop of every process this script started (driver, Ray's
daemons, explorer, trainer, Synchronizer, CheckpointMonitor, emulated engine hosts; bench/async_speedup.py's
``CpuSampler`` over ``/proc/<pid>/task/*/schedstat``) / the loop's wall time. A run whose control plane takes more
than ``--void-cores`` (0.5) of a core is marked ``void=1``: on this shared 2-core machine its timings would be the
scheduler's, not the control plane's (its figures are printed, never the headline).

Noise: a run of ``--steps`` 6 trainer steps includes the pipeline's fill (the first explorer step runs alone) and
its drain, and the emulated engines keep time by sleeping, so a loaded machine (other work on its two cores) makes
them late; the repeat of the headline's two modes (``--repeat-headline``) gives the spread of one figure, and a
ratio of two modes carries about twice it.

``--engines-sweep``: the control plane's own limit. A trainer made fast (``s_per_token`` 1e-6) and the load per
engine kept (``--sweep-prompts-per-engine`` prompts x 16 samples per engine a step), stream ``keep`` at bound 2
(``--sweep-mode``), over ``--sweep-engines`` (8 16 32 64 128) until rows/s stops growing (< 10% over the previous
point); each point reports rows/s, the control plane's cores and the busiest single process (``title:pid``, its
on-CPU share: a process near 1.0 is saturated, Python being single-threaded where it works).

Output: a ``RESULT scale_mode`` line per mode (its best split), ``RESULT scale_engines`` per sweep point, and a final
``RESULT scale`` (stream / step rows/s at each bound, best ``on_new_version`` and each); every run is appended to
``--json`` (default runs/scale/scale-<time>.json) as it ends, so a run cut off keeps what it has.

    .venv/bin/python bench/scale.py [--bounds 1 2 4] [--modes step finish resubmit keep] [--steps 6] [--json F]
    .venv/bin/python bench/scale.py --engines-sweep [--sweep-engines 8 16 32 64 128]
    .venv/bin/python bench/scale.py --smoke     # 2 engines, 2 steps, bound 1, step vs stream finish; make test
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import add_smoke, result_line

RESULT_FIELDS = {
    "scale_mode": ("mode", "bound", "engines", "workers", "rows_s", "staleness_mean", "staleness_max",
                   "token_staleness", "dropped", "cancelled", "masked_tokens", "engine_busy", "trainer_idle",
                   "cpu_cores", "void", "loop_s", "splits"),
    "scale": ("headline_bound", "ratio_headline", "best_stream_headline", "runs", "void_runs", "gpus", "prompts",
              "steps", "bench_s"),
}
"""Fields of the RESULT lines (bench/benchlib.py). ``scale`` also holds ``ratio_b<B>`` (best stream mode / step) and
``ratio_<mode>_b<B>`` for every bound B and stream mode run. ``--engines-sweep`` prints ``RESULT scale_engines``
lines (engines, rows_s, cpu_cores, top_process, top_process_cores, void) and ``RESULT scale_limit`` (its verdict);
the smoke does not run the sweep."""

STREAM_MODES = ("finish", "resubmit", "keep")
TRAINER_IDLE_MORE_ENGINES = 0.15
"""Hill climb: a run whose trainer waited for data more than this share of the loop tries more engines next."""

for _key, _value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false"),
                     ("RAY_USAGE_STATS_ENABLED", "0")):
    os.environ.setdefault(_key, _value)


# ------------------------------------------------------------------------------------------------ one run
def overrides(args: argparse.Namespace, root: Path, model: Path, mode: str, bound: int, engines: int,
              workers: int, name: str, prompts: int | None = None, s_per_token: float | None = None) -> list[str]:
    """The run's config: mode ``step`` or a stream ``on_new_version``, at ``bound``, on E + W emulated GPUs."""
    rollout = (["explorer.rollout=step"] if mode == "step"
               else ["explorer.rollout=stream", f"explorer.stream.on_new_version={mode}"])
    prompts = prompts or args.prompts
    return rollout + [
        f"checkpoint_root_dir={root}", "project=scale", f"name={name}", "mode=async", f"seed={args.seed}",
        f"model.path={model}", "explorer.engine=emulated", f"explorer.num_engines={engines}",
        f"explorer.emulated.curve={args.curve}", f"explorer.emulated.engines_per_actor={args.engines_per_actor}",
        f"explorer.emulated.prompt_tokens={args.prompt_tokens}",
        f"explorer.emulated.mean_response_tokens={args.mean_response}",
        f"explorer.emulated.max_response_tokens={args.max_response}",
        f"explorer.sampling.max_new_tokens={args.max_response}", "explorer.sampling.temperature=1.0",
        f"explorer.batch_size={prompts}", f"explorer.repeat_times={args.samples}",
        f"explorer.taskset.size={max(prompts * (args.steps + bound + 4), 64)}",
        "trainer.type=emulated", f"trainer.emulated.workers={workers}",
        f"trainer.emulated.s_per_token={args.s_per_token if s_per_token is None else s_per_token}",
        f"trainer.emulated.allreduce_s={args.allreduce_s}", f"trainer.total_steps={args.steps}",
        "synchronizer.method=checkpoint", "synchronizer.interval=1", f"synchronizer.max_staleness={bound}",
        "algorithm.adv_estimator=grpo",
    ]


def cpu_by_process(samples: list, start: float, end: float, interval_s: float = 0.25) -> dict[str, float]:
    """On-CPU seconds of each process (``title:pid``) between ``start`` and ``end``, from ``CpuSampler.samples``
    (its ``window`` adds up processes of one title: the emulated engine hosts are several)."""
    inside = [snap for t, snap in samples if start - interval_s <= t <= end + interval_s]
    first: dict[tuple[int, int], int] = {}
    last: dict[tuple[int, int], int] = {}
    names: dict[int, str] = {}
    for snap in inside:
        for pid, (name, threads) in snap.items():
            names[pid] = name
            for tid, (cpu, _) in threads.items():
                first.setdefault((pid, tid), cpu)
                last[pid, tid] = cpu
    out: dict[str, float] = {}
    for (pid, tid), cpu in last.items():
        key = f"{names[pid]}:{pid}"
        out[key] = out.get(key, 0.0) + (cpu - first[pid, tid]) / 1e9
    return out


def run_figures(records: list[dict[str, Any]], stream: bool, cpu: dict[str, tuple[float, float]],
                loop: dict[str, float], per_process: dict[str, float] | None = None) -> dict[str, Any]:
    """The per-run figures of the module docstring from one run's metrics records and the CPU sampler's window
    (``cpu``: by title; ``per_process``: by process, for the busiest single process)."""
    explorer = [r for r in records if r["role"] == "explorer"]
    trainer = [r for r in records if r["role"] == "trainer"]
    cpu_s = sum(c for c, _ in cpu.values())
    per_process = per_process if per_process is not None else {k: c for k, (c, _) in cpu.items()}
    top = max(per_process.items(), key=lambda kv: kv[1]) if per_process else ("none", 0.0)
    loop_s = loop["loop_s"]
    done = sorted(trainer, key=lambda r: r["time"])
    # after the fill: rows of trainer steps 2..N over the time from step 1's record to step N's
    steady = (sum(r["train/batch_size"] for r in done[1:]) / (done[-1]["time"] - done[0]["time"])
              if len(done) >= 3 and done[-1]["time"] > done[0]["time"] else float("nan"))
    return {
        "rows_s": loop["sps"], "steady_rows_s": steady, "loop_s": loop_s, "trained": loop["trained"],
        "staleness_mean": statistics.fmean(r["train/staleness_mean"] for r in trainer),
        "staleness_max": max(r["train/staleness_max"] for r in trainer),
        "token_staleness": statistics.fmean(r.get("train/token_staleness_mean", 0.0) for r in trainer),
        "dropped": max(r.get("buffer/skipped_stale", 0.0) for r in trainer),
        "cancelled": sum(r.get("rollout/cancelled_groups", 0.0) for r in explorer),
        "masked_tokens": sum(r.get("train/masked_stale_tokens", 0.0) for r in trainer),
        "engine_busy": statistics.fmean(r["rollout/engine_busy_frac"] for r in explorer),
        "trainer_idle": sum(r.get("time/wait_data_s", 0.0) for r in trainer) / loop_s,
        "cpu_cores": cpu_s / loop_s,
        "top_process": top[0].replace(" ", "_") or "?", "top_process_cores": top[1] / loop_s,
        "by_title": {k: round(c / loop_s, 3) for k, (c, _) in sorted(cpu.items(), key=lambda kv: -kv[1][0])[:8]},
        "processes": {k: round(c / loop_s, 3) for k, c in sorted(per_process.items(), key=lambda kv: -kv[1])[:8]},
        "len_mean": loop["len_mean"], "len_max": loop["len_max"], "stream": stream,
    }


def run_once(args, root: Path, model: Path, mode: str, bound: int, engines: int, workers: int, **kw) -> dict:
    from async_speedup import CpuSampler, loop_figures

    from trinity_like.config import load_config
    from trinity_like.launcher import run
    from trinity_like.runtime.paths import RunPaths

    name = f"{mode}-b{bound}-e{engines}w{workers}-{time.strftime('%H%M%S')}-{os.getpid()}"
    cfg = load_config(None, overrides(args, root, model, mode, bound, engines, workers, name, **kw))
    started = time.time()
    with CpuSampler() as sampler:
        summary = run(cfg)
    if summary["exit_reason"] != "completed":
        raise SystemExit(f"run {name} ended with {summary['exit_reason']}")
    records = [json.loads(line) for line in RunPaths.of(cfg).metrics.read_text().splitlines() if line.strip()]
    stream = mode != "step"
    loop = loop_figures(records, stream)
    out = run_figures(records, stream, sampler.window(loop["loop_start"], loop["loop_end"]), loop,
                      cpu_by_process(sampler.samples, loop["loop_start"], loop["loop_end"], sampler.interval_s))
    out.update({"mode": mode, "bound": bound, "engines": engines, "workers": workers, "name": name,
                "void": int(out["cpu_cores"] > args.void_cores), "setup_s": loop["loop_start"] - started,
                "run_s": time.time() - started, "load_avg": os.getloadavg()[0]})
    return out


# ------------------------------------------------------------------------------------------------ the grid
def best_split(args, root: Path, model: Path, mode: str, bound: int, log,
               only: int | None = None) -> tuple[dict, list[dict]]:
    """The mode's best run over ``args.engines`` by the hill climb of the module docstring; ``only``: one run at
    that engine count (the split the climb chose at the headline bound)."""
    if only is not None:
        r = run_once(args, root, model, mode, bound, only, args.gpus - only)
        log(r)
        return r, [r]
    choices = sorted(set(args.engines))
    i = len(choices) // 2
    runs = {}

    def at(j: int) -> dict:
        if j not in runs:
            e = choices[j]
            runs[j] = run_once(args, root, model, mode, bound, e, args.gpus - e)
            log(runs[j])
        return runs[j]

    best = at(i)
    step = 1 if best["trainer_idle"] > TRAINER_IDLE_MORE_ENGINES else -1
    j = i + step
    while 0 <= j < len(choices):
        r = at(j)
        if r["rows_s"] <= best["rows_s"]:
            break
        best, j = r, j + step
    return best, [runs[k] for k in sorted(runs)]


def mode_fields(r: dict, splits: list[dict]) -> dict[str, object]:
    return {"mode": r["mode"], "bound": r["bound"], "engines": r["engines"], "workers": r["workers"],
            "rows_s": f"{r['rows_s']:.2f}", "steady_rows_s": f"{r.get('steady_rows_s', float('nan')):.2f}",
            "staleness_mean": f"{r['staleness_mean']:.2f}",
            "staleness_max": f"{r['staleness_max']:.0f}", "token_staleness": f"{r['token_staleness']:.2f}",
            "dropped": f"{r['dropped']:.0f}", "cancelled": f"{r['cancelled']:.0f}",
            "masked_tokens": f"{r['masked_tokens']:.0f}", "engine_busy": f"{r['engine_busy']:.3f}",
            "trainer_idle": f"{r['trainer_idle']:.3f}", "cpu_cores": f"{r['cpu_cores']:.3f}", "void": r["void"],
            "loop_s": f"{r['loop_s']:.1f}",
            "splits": ",".join(f"{s['engines']}:{s['rows_s']:.1f}{'v' if s['void'] else ''}" for s in splits),
            "top_process": r["top_process"], "len_mean": f"{r['len_mean']:.0f}"}


def summary_fields(args, best: dict[tuple[str, int], dict], n_runs: int, n_void: int, bench_s: float) -> dict:
    bounds = [b for b in args.bounds if ("step", b) in best]
    headline = 2 if 2 in bounds else (bounds[0] if bounds else args.bounds[0])
    out: dict[str, object] = {}
    for b in bounds:
        step = best[("step", b)]["rows_s"]
        streams = {m: best[(m, b)] for m in STREAM_MODES if (m, b) in best}
        for m, r in streams.items():
            out[f"ratio_{m}_b{b}"] = f"{r['rows_s'] / step:.3f}"
        if streams:
            m, r = max(streams.items(), key=lambda kv: kv[1]["rows_s"])
            out[f"ratio_b{b}"] = f"{r['rows_s'] / step:.3f}"
            out[f"best_stream_b{b}"] = m
    return {"headline_bound": headline, "ratio_headline": out.get(f"ratio_b{headline}", "nan"),
            "best_stream_headline": out.get(f"best_stream_b{headline}", "none"), **out, "runs": n_runs,
            "void_runs": n_void, "gpus": args.gpus, "prompts": args.prompts, "steps": args.steps,
            "bench_s": f"{bench_s:.0f}"}


def engines_sweep(args, root: Path, model: Path, log) -> None:
    """rows/s against the number of emulated engines with a fast trainer, until rows/s stops growing."""
    points: list[dict] = []
    for engines in args.sweep_engines:
        r = run_once(args, root, model, args.sweep_mode, args.sweep_bound, engines, 1,
                     prompts=max(1, round(engines * args.sweep_prompts_per_engine)), s_per_token=1e-6)
        r["sweep"] = True
        log(r)
        points.append(r)
        print(result_line("scale_engines", {
            "engines": engines, "rows_s": f"{r['rows_s']:.2f}", "cpu_cores": f"{r['cpu_cores']:.3f}",
            "top_process": r["top_process"], "top_process_cores": f"{r['top_process_cores']:.3f}",
            "engine_busy": f"{r['engine_busy']:.3f}", "trainer_idle": f"{r['trainer_idle']:.3f}",
            "void": r["void"]}), flush=True)
        print(f"  cores by process: {r['processes']}\n  by title: {r['by_title']}", flush=True)
        if len(points) >= 2 and r["rows_s"] < 1.10 * points[-2]["rows_s"]:
            break
    peak = max(points, key=lambda p: p["rows_s"])
    grew = len(points) >= 2 and points[-1]["rows_s"] >= 1.10 * points[-2]["rows_s"]
    print(result_line("scale_limit", {
        "limit_engines": "none_reached" if grew else peak["engines"], "peak_rows_s": f"{peak['rows_s']:.2f}",
        "peak_cpu_cores": f"{peak['cpu_cores']:.3f}", "saturated": peak["top_process"],
        "saturated_cores": f"{peak['top_process_cores']:.3f}", "points": len(points)}), flush=True)


# ------------------------------------------------------------------------------------------------ program
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=8, help="emulated GPUs G, split into E engines + W trainer workers")
    parser.add_argument("--engines", type=int, nargs="+", default=[4, 5, 6], help="engine counts E the climb may try")
    parser.add_argument("--prompts", type=int, default=32, help="prompts per explorer step")
    parser.add_argument("--samples", type=int, default=16, help="samples per prompt")
    parser.add_argument("--steps", type=int, default=6, help="trainer steps per run")
    parser.add_argument("--bounds", type=int, nargs="+", default=[1, 2, 4], help="synchronizer.max_staleness values")
    parser.add_argument("--modes", nargs="+", default=["step", *STREAM_MODES], choices=["step", *STREAM_MODES])
    parser.add_argument("--curve", default="7b_h100", help="explorer.emulated.curve")
    parser.add_argument("--prompt-tokens", type=int, default=51)
    parser.add_argument("--mean-response", type=float, default=200.0)
    parser.add_argument("--max-response", type=int, default=819)
    parser.add_argument("--s-per-token", type=float, default=1.15e-4, help="trainer.emulated.s_per_token per worker")
    parser.add_argument("--allreduce-s", type=float, default=0.0)
    parser.add_argument("--engines-per-actor", type=int, default=16)
    parser.add_argument("--void-cores", type=float, default=0.5,
                        help="a run whose control plane takes more cores than this is void")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--climb-every-bound", action="store_true",
                        help="climb each mode's split at every bound (default: at the headline bound 2 only, the "
                             "split it chose kept at the others: the grid then fits ~20 min)")
    parser.add_argument("--repeat-headline", type=int, default=1,
                        help="run the headline bound's step and best stream mode again this many times (noise)")
    parser.add_argument("--engines-sweep", action="store_true",
                        help="instead of the grid: rows/s vs emulated engines with a fast trainer")
    parser.add_argument("--sweep-engines", type=int, nargs="+", default=[8, 16, 32, 64, 128])
    parser.add_argument("--sweep-prompts-per-engine", type=float, default=4.0)
    parser.add_argument("--sweep-mode", default="keep", choices=["step", *STREAM_MODES])
    parser.add_argument("--sweep-bound", type=int, default=2)
    parser.add_argument("--json", metavar="FILE", help="where every run is appended as it ends "
                                                       "(default runs/scale/scale-<time>.json)")
    parser.add_argument("--keep", metavar="DIR", help="keep the run directories under DIR (default: a temp dir)")
    add_smoke(parser, "2 emulated engines + 1 trainer worker, 2 prompts x 4 samples of mean 16 tokens, 2 steps, "
                      "bound 1, step vs stream finish")
    args = parser.parse_args(argv)
    if args.smoke:
        args.gpus, args.engines, args.prompts, args.samples, args.steps = 3, [2], 2, 4, 2
        args.bounds, args.modes, args.mean_response, args.max_response = [1], ["step", "finish"], 16.0, 48
        args.engines_sweep, args.void_cores, args.repeat_headline = False, 10.0, 0  # start-up dominates: never void
    if any(e < 1 or e >= args.gpus for e in args.engines):
        parser.error(f"--engines must each be between 1 and --gpus - 1 ({args.gpus - 1}): one GPU at least trains")
    if "step" not in args.modes and not args.engines_sweep:
        parser.error("--modes needs step: every ratio is against it")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import ray

    from trinity_like.common.tiny_model import make_tiny_model

    started = time.perf_counter()
    out_path = Path(args.json) if args.json else Path("runs/scale") / f"scale-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    runs: list[dict] = []

    def log(r: dict) -> None:
        runs.append(r)
        from trinity_like.common.fs import atomic_write_json

        atomic_write_json(out_path, {"args": vars(args), "runs": runs}, durable=False)
        print(f"[{r['mode']} b{r['bound']} E{r['engines']}+W{r['workers']}] rows/s {r['rows_s']:.1f} (steady "
              f"{r['steady_rows_s']:.1f})  loop "
              f"{r['loop_s']:.1f}s  staleness {r['staleness_mean']:.2f}/{r['staleness_max']:.0f}  dropped "
              f"{r['dropped']:.0f}  cancelled {r['cancelled']:.0f}  masked {r['masked_tokens']:.0f}  engine busy "
              f"{r['engine_busy']:.2f}  trainer idle {r['trainer_idle']:.2f}  cpu {r['cpu_cores']:.2f} cores "
              f"(top {r['top_process']} {r['top_process_cores']:.2f}){'  VOID' if r['void'] else ''}  len "
              f"{r['len_mean']:.0f}/{r['len_max']:.0f}  (set-up {r['setup_s']:.0f}s, run {r['run_s']:.0f}s, load "
              f"avg {r['load_avg']:.1f})", flush=True)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False, namespace="scale")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(args.keep) if args.keep else Path(tmp)
            root.mkdir(parents=True, exist_ok=True)
            model = make_tiny_model(Path(tmp) / "model", seed=0)  # its tokenizer and vocabulary: no weights load
            if args.engines_sweep:
                engines_sweep(args, root, model, log)
                return
            best: dict[tuple[str, int], dict] = {}
            headline = 2 if 2 in args.bounds else args.bounds[0]
            chosen: dict[str, int] = {}
            # the headline bound first (a run cut off keeps it), where each mode's split is climbed for
            for bound in [headline] + [b for b in args.bounds if b != headline]:
                for mode in args.modes:
                    only = None if args.climb_every_bound or bound == headline else chosen[mode]
                    r, splits = best_split(args, root, model, mode, bound, log, only)
                    best[(mode, bound)] = r
                    chosen.setdefault(mode, r["engines"])
                    print(result_line("scale_mode", mode_fields(r, splits)), flush=True)
            for _ in range(args.repeat_headline):  # the noise: the headline's step and best stream once more
                step = best[("step", headline)]
                streams = [best[(m, headline)] for m in STREAM_MODES if (m, headline) in best]
                for r in [step] + ([max(streams, key=lambda x: x["rows_s"])] if streams else []):
                    again = run_once(args, root, model, r["mode"], headline, r["engines"], r["workers"])
                    again["repeat_of"] = r["name"]
                    log(again)
                    print(f"  repeat of {r['mode']} b{headline} E{r['engines']}: rows/s {r['rows_s']:.1f} then "
                          f"{again['rows_s']:.1f} ({100 * (again['rows_s'] / r['rows_s'] - 1):+.1f}%)", flush=True)
    finally:
        ray.shutdown()
    print(f"results: {out_path}")
    print(result_line("scale", summary_fields(args, best, len(runs), sum(r["void"] for r in runs),
                                              time.perf_counter() - started)), flush=True)


if __name__ == "__main__":
    main()
