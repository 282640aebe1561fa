"""Full checkpoints of a trainer engine: ``checkpoints/step_<k>/`` written atomically, ``checkpoints/latest``
moved to it (by the CheckpointMonitor when there is one), the newest ``trainer.keep_checkpoints`` kept.

A checkpoint holds everything an exact resume needs:

    model/              the weights in Hugging Face format (safetensors + config + tokenizer files) in
                        trainer.weights_dtype, on the CPU: loadable by transformers and vLLM on any machine
    master.safetensors  the float32 weights, when model/ holds another dtype (resume is exact either way)
    adapter/            LoRA adapters (trainer.lora.enabled), the trainable state
    optimizer.pt        AdamW state;  scheduler.pt  learning-rate schedule position
    critic.pt           value model and its optimizer (GAE)
    rng.pt              torch / numpy / random states (and the trainer GPU's)
    checksums.json      size and CRC-32 of every file above: a resume skips a checkpoint that fails them
                        (``trinity_like.runtime.checkpoints.resume_checkpoint``)
    trainer_state.json  step, KL controller coefficient, strategy (written last: marks the checkpoint complete)

Under FSDP2 every rank calls ``save`` and ``load`` (assembling full tensors is collective) and rank 0 writes.
Everything is written from and read to the CPU (``map_location``), so a checkpoint written on a GPU resumes on
a CPU-only machine and the other way round.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from trinity_like.common.errors import UserError
from trinity_like.common.fs import atomic_publish_dir
from trinity_like.common.modeling import export_state_dict
from trinity_like.runtime.checkpoints import TRAINER_STATE, write_checksums, write_pointer
from trinity_like.trainer import parallel
from trinity_like.trainer.device import to_host

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "tokenizer.model", "chat_template.jinja")


MASTER_WEIGHTS = "master.safetensors"


def _load(path: Path):
    """A ``torch.save`` file's content on the CPU (written on any device); optimizers move state to their
    parameters' device when it is loaded into them."""
    return torch.load(path, map_location="cpu", weights_only=False)


class Checkpointer:
    """Writes and restores the full state of a PPO-family engine (its module, optimizers, scheduler, critic,
    KL controller and step)."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def save(self) -> Path:
        """Write ``checkpoints/step_<k>/`` atomically (k = the engine's step), then move ``checkpoints/latest``
        to it and prune. Always blocks: the trainer role commits its buffer ledger right before."""
        e = self.engine
        step = e.train_step_num
        path = e.paths.checkpoint_dir / f"step_{step}"
        if not e.gathers():
            return path
        plain = e.plain_policy()
        # straight to the host: no copy of the model on its GPU first (on the CPU these are the model's own
        # tensors, written out below before anything changes them)
        master = to_host(e.policy_weights(copy=False), "float32")
        dtype = e.weights_dtype
        weights = master if dtype == "float32" else to_host(master, dtype)
        optimizer = parallel.optimizer_state(e.module, e.optimizer)
        critic = None
        if e.critic is not None:
            critic = {"model": to_host(export_state_dict(e.critic_module, copy=False), "float32"),
                      "optimizer": parallel.optimizer_state(e.critic_module, e.critic_optimizer)}
        if not e.writes():
            return path

        def fill(tmp: Path) -> None:
            from safetensors.torch import save_file

            if e.cfg.trainer.lora.enabled:
                e.module.save_pretrained(tmp / "adapter")  # the trainable state, for resume
                # the base model still wears PEFT's wrappers: its config, and the merged weights as they are
                (tmp / "model").mkdir()
                plain.config.save_pretrained(tmp / "model")
                if getattr(plain, "generation_config", None) is not None:
                    plain.generation_config.save_pretrained(tmp / "model")
                save_file(weights, str(tmp / "model" / "model.safetensors"), metadata={"format": "pt"})
            else:
                plain.save_pretrained(tmp / "model", state_dict=weights, safe_serialization=True)
                if weights is not master:
                    save_file(master, str(tmp / MASTER_WEIGHTS))
            for name in TOKENIZER_FILES:
                src = Path(e.cfg.model.path) / name
                if src.is_file():
                    (tmp / "model" / name).write_bytes(src.read_bytes())
            torch.save(optimizer, tmp / "optimizer.pt")
            torch.save(e.scheduler.state_dict(), tmp / "scheduler.pt")
            rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "random": random.getstate()}
            if e.device.type == "cuda":
                rng["cuda"] = torch.cuda.get_rng_state(e.device)
            torch.save(rng, tmp / "rng.pt")
            if critic is not None:
                torch.save(critic, tmp / "critic.pt")
            write_checksums(tmp)
            (tmp / TRAINER_STATE).write_text(json.dumps(
                {"step": step, "kl_coef": e.kl_ctrl.value, "strategy": self._strategy()}) + "\n")

        atomic_publish_dir(path, fill)
        if e.monitor is not None:  # the run's CheckpointMonitor moves the pointer
            import ray

            ray.get(e.monitor.register_thread_count.remote(step, checkpoint_thread_count=1))
            ray.get(e.monitor.notify_finished.remote(step))
        else:
            write_pointer(e.paths.checkpoint_dir / "latest", step)
        self._prune()
        return path

    def load(self, path: Path) -> int:
        """Restore everything ``save`` wrote into the engine (after its ``prepare`` and, with workers,
        ``enable_data_parallel``); return the step it was written at. The files are not checked against their
        checksums here (every data-parallel rank loads): a resume picks ``path`` with ``resume_checkpoint``."""
        from safetensors.torch import load_file

        e = self.engine
        meta = json.loads((path / TRAINER_STATE).read_text())
        saved = meta.get("strategy", "single")
        if (saved == "fsdp2") != (self._strategy() == "fsdp2"):
            raise UserError(f"checkpoint {path} was written by a '{saved}' trainer and cannot resume a "
                            f"'{self._strategy()}' one (their optimizer states differ in layout); resume with "
                            "the trainer.strategy and trainer.num_workers it was written with")
        if e.cfg.trainer.lora.enabled:
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(e.module, load_file(str(path / "adapter" / "adapter_model.safetensors")))
        else:
            files = [path / MASTER_WEIGHTS] if (path / MASTER_WEIGHTS).is_file() else \
                sorted((path / "model").glob("*.safetensors"))
            state: dict[str, torch.Tensor] = {}
            for f in files:
                state.update({k: t.float() if t.is_floating_point() else t for k, t in load_file(str(f)).items()})
            parallel.load_full_state_dict(e.module, state)
        parallel.load_optimizer_state(e.module, e.optimizer, _load(path / "optimizer.pt"))
        e.scheduler.load_state_dict(_load(path / "scheduler.pt"))
        rng = _load(path / "rng.pt")
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and e.device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"], e.device)
        np.random.set_state(rng["numpy"])
        random.setstate(rng["random"])
        if e.critic is not None:
            critic = _load(path / "critic.pt")
            parallel.load_full_state_dict(e.critic_module, critic["model"])
            parallel.load_optimizer_state(e.critic_module, e.critic_optimizer, critic["optimizer"])
        e.kl_ctrl.value = float(meta["kl_coef"])
        return int(meta["step"])

    def _strategy(self) -> str:
        e = self.engine
        return "single" if e.dp_world == 1 else e.cfg.trainer.strategy

    def _prune(self) -> None:
        root, keep = self.engine.paths.checkpoint_dir, self.engine.cfg.trainer.keep_checkpoints
        steps = sorted(int(p.name.split("_")[1]) for p in root.glob("step_*") if p.is_dir())
        for old in steps[:-keep] if keep else []:
            shutil.rmtree(root / f"step_{old}", ignore_errors=True)
