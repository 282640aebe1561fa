"""EMULATION, not a trainer: ``trainer.type: emulated`` takes the time a GPU trainer would take on a batch and
publishes a small state dict through the real weight publisher, for measuring the scheduler and the control plane
at a scale this machine cannot hold (issue 51; bench/scale.py). It learns nothing and never stands in for a real
trainer in a test of the trainer.

A step of a batch of T tokens sleeps

    T / trainer.emulated.workers x trainer.emulated.s_per_token  (+ trainer.emulated.allreduce_s when workers > 1)

measured from the step's start (the few milliseconds of bookkeeping are inside it, not added to it). T counts each
row's response tokens as the row carries them and its prompt as ``explorer.emulated.prompt_tokens``: the prompt
length the emulated engine charged for prefill (the rows carry the task's real prompt ids, a few tokens), so that
the trainer's prompt-to-response ratio is the emulated layout's. Everything
around the step is real: the trainer role reads the batch from the buffer (ledger, staleness bound, drops), the
version is published by ``synchronizer.method``'s publisher (``trinity_like.weights.publish``: ``checkpoint`` writes
a version folder with its manifest and fingerprints, ``memory`` puts the tensors in Ray's object store), the
Synchronizer and CheckpointMonitor see it as any version, and full checkpoints are written and resumed.

The published weights are a few small float32 tensors (``EMULATED_SHAPES``, 17 KB) drawn from a generator seeded
by (``seed``, step), so each version has its own values and fingerprint, and a resumed run publishes the same
bytes for the same step. The step's metrics carry the real trainer's names for what the role and the benchmarks
read (``train/batch_size``, ``time/train_step_s``, ``train/staleness_*``, ``train/token_staleness_mean``,
``train/masked_stale_tokens`` (``synchronizer.train_slack``'s rule, ``common.train_bound``), ``train/reward_mean``)
and the emulation's own under ``emulated/`` (``emulated/tokens``, ``emulated/sleep_s``).

Its weights are no model's: only the EMULATED engine (``explorer.engine: emulated``) takes them, so another engine
is refused at start in one line (a real engine would fail to load every version and the run would wait forever).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from trinity_like.common.errors import UserError
from trinity_like.common.experience import Experience
from trinity_like.common.fs import atomic_publish_dir
from trinity_like.common.train_bound import row_trainable, token_trained
from trinity_like.config import Config
from trinity_like.config.validation import check_emulated_trainer
from trinity_like.runtime.checkpoints import TRAINER_STATE, latest_checkpoint, write_checksums, write_pointer
from trinity_like.runtime.paths import RunPaths
from trinity_like.runtime.schedule import train_slack
from trinity_like.trainer.engine import TRAINERS, PublishesWeights, TrainEngineWrapper
from trinity_like.weights.publish import PUBLISHERS, keep_versions

if TYPE_CHECKING:
    import torch

EMULATED_SHAPES = {"emulated.layer0.weight": (64, 64), "emulated.layer0.bias": (64,), "emulated.head.weight": (4, 64)}
"""The published state dict's tensors (float32): small, so publishing costs the control plane, not the bytes."""

WEIGHTS_FILE = "emulated_weights.safetensors"
"""The state dict inside a full checkpoint's ``model/`` folder."""


def emulated_step_seconds(tokens: int, s_per_token: float, workers: int, allreduce_s: float) -> float:
    """The time the EMULATED trainer takes for a batch of ``tokens`` (prompt + response) tokens."""
    return tokens / workers * s_per_token + (allreduce_s if workers > 1 else 0.0)


def batch_tokens(exps: list[Experience], prompt_tokens: int) -> int:
    """Prompt + response tokens of a batch: each row's response as it carries it, its prompt as ``prompt_tokens``
    (the length the emulated engine charged)."""
    return sum(prompt_tokens + len(e.response_ids) for e in exps)


def staleness_metrics(exps: list[Experience], step: int, bound: int | None = None,
                      train_slack: int = 0) -> dict[str, float]:
    """The real trainer's staleness metrics (trinity_like.trainer.ppo), from the rows as they are: each row's
    staleness ``step - model_version`` (0 for version -1 and for versions past ``step``, as
    ``trinity_like.trainer.batch.staleness``), its distribution, and the mean and max over the trained response
    tokens of each token's (``token_versions``; a row without them is all of ``model_version``). With ``bound``
    (async: ``step - max_staleness``) and ``train_slack`` > 0, the tokens older than ``bound - train_slack`` in a
    row the rule trains are masked as the real trainer masks them (``common.train_bound``; counted in
    ``train/masked_stale_tokens``) and left out of the token figures."""
    def stale(v: np.ndarray) -> np.ndarray:
        return np.where(v < 0, 0, np.clip(step - v, 0, None))

    versions = np.array([e.model_version for e in exps], dtype=np.int64)
    rows = stale(versions)
    tokens, masked = [], 0
    for e in exps:
        v = (np.asarray(e.token_versions, dtype=np.int64) if e.token_versions is not None
             else np.full(len(e.response_ids), e.model_version, dtype=np.int64))
        if bound is not None and train_slack > 0 and v.size and bool(
                row_trainable(e.model_version, int(v.max()), bound, train_slack)):
            keep = token_trained(v, bound, train_slack)
            masked += int((~keep).sum())
            v = v[keep]
        tokens.append(stale(v))
    tokens_all = np.concatenate(tokens) if tokens else np.zeros(0, dtype=np.int64)
    counts = np.bincount(rows) if rows.size else np.zeros(0, dtype=np.int64)
    return {
        "train/staleness_mean": float(rows.mean()) if rows.size else 0.0,
        "train/staleness_max": float(rows.max()) if rows.size else 0.0,
        **{f"train/staleness_frac/{k}": float(n) / rows.size for k, n in enumerate(counts.tolist()) if n},
        "train/token_staleness_mean": float(tokens_all.mean()) if tokens_all.size else 0.0,
        "train/masked_stale_tokens": float(masked),
    }


@TRAINERS.register("emulated")
class EmulatedTrainer(PublishesWeights, TrainEngineWrapper):
    """EMULATION (``trainer.type: emulated``): sleeps a GPU trainer's step time and publishes a small state dict
    through the real publisher; see the module docstring."""

    def __init__(self, cfg: Config, synchronizer=None) -> None:
        check_emulated_trainer(cfg)  # also at config load; here for a trainer built from a config not validated
        self.cfg = cfg
        self.paths = RunPaths.of(cfg)
        self.synchronizer = synchronizer
        self._step = 0
        self.dp_rank, self.dp_world = 0, 1
        """One process: the emulated workers (``trainer.emulated.workers``) only divide the step time."""
        self.monitor = None
        """The run's CheckpointMonitor when running under Ray with a synchronizer."""
        self.weights_dtype = "float32"
        self.device = None
        """torch.device("cpu"), set in ``prepare`` (torch is imported there, not where the launcher imports)."""
        self._weights: dict[str, torch.Tensor] = {}
        self.publisher = PUBLISHERS.get(cfg.synchronizer.method)(self)

    # ------------------------------------------------------------ setup
    def prepare(self) -> None:
        import torch

        if self.synchronizer is not None:
            import ray

            from trinity_like.runtime.paths import namespace_of
            from trinity_like.synchronizer import CheckpointMonitor

            self.monitor = CheckpointMonitor.get_actor(namespace_of(self.cfg),
                                                       checkpoint_dir=str(self.paths.checkpoint_dir),
                                                       keep_state_dicts=keep_versions(self.cfg))
            ctx = ray.get_runtime_context()
            self.monitor.notify_started.remote(f"{ctx.get_node_id()}/pid{os.getpid()}", ctx.get_job_id())
        self.device = torch.device("cpu")
        self._weights = self._weights_of(0)

    def _weights_of(self, step: int) -> dict[str, torch.Tensor]:
        """The emulated weights of version ``step``: seeded by (seed, step), so each version differs and a resumed
        run publishes the same bytes."""
        import torch

        gen = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + step)
        return {name: torch.randn(shape, generator=gen) for name, shape in EMULATED_SHAPES.items()}

    @property
    def train_step_num(self) -> int:
        return self._step

    # ------------------------------------------------------------ the step
    def train_step(self, batch_exps: list[Experience]) -> dict[str, float]:
        start = time.perf_counter()
        em = self.cfg.trainer.emulated
        tokens = batch_tokens(batch_exps, self.cfg.explorer.emulated.prompt_tokens)
        target_s = emulated_step_seconds(tokens, em.s_per_token, em.workers, em.allreduce_s)
        sc = self.cfg.synchronizer
        bound = self._step - sc.max_staleness if self.cfg.mode == "async" else None
        # trained by the weights of version step
        metrics = staleness_metrics(batch_exps, self._step, bound, train_slack(self.cfg))
        rewards = [e.reward for e in batch_exps if e.reward is not None]
        response_tokens = sum(len(e.response_ids) for e in batch_exps)
        self._weights = self._weights_of(self._step + 1)
        # the emulated compute: sleep to the step's end (the bookkeeping above is inside it, not added)
        time.sleep(max(0.0, target_s - (time.perf_counter() - start)))
        self._step += 1
        elapsed = time.perf_counter() - start
        rows = max(len(batch_exps), 1)
        return {
            **metrics,
            "train/batch_size": float(len(batch_exps)),
            "train/reward_mean": float(np.mean(rewards)) if rewards else 0.0,
            "train/response_length_mean": response_tokens / rows,
            "train/tokens_per_s": response_tokens / elapsed if elapsed > 0 else math.inf,
            "time/train_step_s": elapsed,
            "emulated/tokens": float(tokens),
            "emulated/sleep_s": target_s,
        }

    # ------------------------------------------------------------ weights out (trinity_like.weights.publish)
    def writes(self) -> bool:
        return True

    def gathers(self) -> bool:
        return True

    def policy_weights(self, copy: bool = False) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self._weights.items()} if copy else dict(self._weights)

    def weights_for_export(self, on_device: bool = False) -> dict[str, torch.Tensor]:
        return dict(self._weights)

    # ------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        """``checkpoints/step_<k>/`` (atomic): ``model/emulated_weights.safetensors``, checksums, then
        ``trainer_state.json``; the pointer moved by the CheckpointMonitor when there is one."""
        from safetensors.torch import save_file

        step = self._step
        path = self.paths.checkpoint_dir / f"step_{step}"
        weights = dict(self._weights)

        def fill(tmp: Path) -> None:
            (tmp / "model").mkdir()
            save_file(weights, str(tmp / "model" / WEIGHTS_FILE), metadata={"format": "pt"})
            write_checksums(tmp)
            (tmp / TRAINER_STATE).write_text(json.dumps({"step": step, "emulated": True}) + "\n")

        atomic_publish_dir(path, fill)
        if self.monitor is not None:
            import ray

            ray.get(self.monitor.register_thread_count.remote(step, checkpoint_thread_count=1))
            ray.get(self.monitor.notify_finished.remote(step))
        else:
            write_pointer(self.paths.checkpoint_dir / "latest", step)
        keep = self.cfg.trainer.keep_checkpoints
        root = self.paths.checkpoint_dir
        steps = sorted(int(p.name.split("_")[1]) for p in root.glob("step_*") if p.is_dir())
        for old in steps[:-keep] if keep else []:
            shutil.rmtree(root / f"step_{old}", ignore_errors=True)
        return path

    def latest_checkpoint(self) -> Path | None:
        return latest_checkpoint(self.paths.checkpoint_dir)

    def load_checkpoint(self, path: Path) -> None:
        from safetensors.torch import load_file

        meta = json.loads((Path(path) / TRAINER_STATE).read_text())
        if not meta.get("emulated"):
            raise UserError(f"checkpoint {path} was written by a real trainer; an emulated trainer "
                            "(trainer.type: emulated) resumes only its own checkpoints: use another run directory")
        self._weights = load_file(str(Path(path) / "model" / WEIGHTS_FILE))
        self._step = int(meta["step"])
