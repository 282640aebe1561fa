"""A reward model: a sequence-classification model with one label that scores prompt + response, served in its
own Ray actor beside the explorer's engines (``reward.model``; verl's ``reward_model.model.path``).

What it reads: the conversation rendered by *its own* tokenizer (``trinity_like.common.chat.render_ids``: its
chat template when it has one), the task's chat messages followed by the response as the assistant's turn; a
task with a raw text prompt is read as prompt text + response text. An input longer than
``reward.model.max_length`` keeps its last tokens (the end of the response, where the score is read). Inputs are
right-padded in micro-batches, so every sequence keeps the positions it has alone, and the score is the head's
output at the last real token (Hugging Face's pooling for these models, found through the pad token).

How its score meets the reward function's is the reward manager's part (``reward.model.combine``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trinity_like.common.errors import UserError

if TYPE_CHECKING:
    from trinity_like.common.tasks import Task
    from trinity_like.config import Config

logger = logging.getLogger(__name__)


def reward_input(task: Task) -> dict[str, Any]:
    """What the reward model needs of a task (plain data, sent to its actor): its chat messages, else its
    prompt text."""
    if task.messages:
        return {"messages": [dict(m) for m in task.messages]}
    return {"prompt": task.prompt}


class RewardModel:
    """The model in this process: ``score(inputs, responses) -> list[float]``."""

    def __init__(self, path: str | Path, micro_batch_size: int = 16, max_length: int = 1024, dtype: str = "auto",
                 num_threads: int = 1, device: str = "cpu") -> None:
        import torch
        from transformers import AutoConfig, AutoModelForSequenceClassification
        from transformers.utils import logging as hf_logging

        from trinity_like.common.tokenizer import hf_tokenizer

        path = Path(path)
        if not (path / "config.json").is_file():
            raise UserError(f"reward.model.path '{path}' is not a model folder (no config.json); give a Hugging "
                            "Face sequence-classification model with one label")
        config = AutoConfig.from_pretrained(path)
        if getattr(config, "num_labels", None) != 1:
            raise UserError(f"reward model '{path}' has {getattr(config, 'num_labels', None)} labels; a reward model "
                            "has one (a scalar score per sequence)")
        torch.set_num_threads(num_threads)
        # The device is asked for, never picked up because CUDA happens to be visible: a reward model that holds
        # no GPU share (reward.model.num_gpus 0) would take GPU memory nobody accounted for.
        if device == "cuda" and not torch.cuda.is_available():
            raise UserError("reward.model.num_gpus is above 0 but this process sees no CUDA device; set it to 0 to "
                            "score on the CPU, or run where a GPU is visible")
        self.device = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device(device)
        if dtype == "auto":
            dtype = "bfloat16" if self.device.type == "cuda" else "float32"
        self.tokenizer = hf_tokenizer(path)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        if pad is None:
            raise UserError(f"reward model '{path}': its tokenizer has neither a pad nor an EOS token, so the last "
                            "real token of a padded batch cannot be found; set pad_token in its tokenizer_config.json")
        self.pad_token_id = int(pad)
        config.pad_token_id = self.pad_token_id  # the head pools at the last token that is not this one
        hf_logging.disable_progress_bar()
        self.model = AutoModelForSequenceClassification.from_pretrained(path, config=config, dtype=getattr(torch, dtype))
        self.model.to(self.device).eval()
        self.micro_batch_size = micro_batch_size
        self.max_length = max_length
        self.path = str(path)

    def encode(self, item: dict[str, Any], response: str) -> list[int]:
        """Token ids of one input (see the module docstring), at most ``max_length`` of them (the last ones)."""
        if "messages" in item:
            from trinity_like.common.chat import render_ids

            ids = list(render_ids(item["messages"] + [{"role": "assistant", "content": response}], self.tokenizer,
                                  add_generation_prompt=False))
        else:
            ids = list(self.tokenizer.encode(item["prompt"] + response))
        return ids[-self.max_length:]

    def score(self, items: list[dict[str, Any]], responses: list[str]) -> list[float]:
        """One score per (input, response)."""
        import torch

        if len(items) != len(responses):
            raise ValueError(f"{len(items)} inputs for {len(responses)} responses")
        seqs = [self.encode(item, r) for item, r in zip(items, responses, strict=True)]
        out: list[float] = []
        with torch.inference_mode():
            for start in range(0, len(seqs), self.micro_batch_size):
                chunk = seqs[start:start + self.micro_batch_size]
                width = max(len(s) for s in chunk)
                input_ids = torch.full((len(chunk), width), self.pad_token_id, dtype=torch.long)  # (b, T)
                attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)  # (b, T)
                for i, s in enumerate(chunk):
                    input_ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
                    attention_mask[i, :len(s)] = 1
                logits = self.model(input_ids=input_ids.to(self.device),
                                    attention_mask=attention_mask.to(self.device)).logits  # (b, 1)
                out.extend(logits[:, 0].float().cpu().tolist())
        return out

    def health(self) -> dict[str, Any]:
        return {"path": self.path, "device": str(self.device), "dtype": str(self.model.dtype)}


class RewardModelActor(RewardModel):
    """``RewardModel`` in its own process (a Ray actor; calls run one at a time)."""

    def __init__(self, path: str, micro_batch_size: int, max_length: int, dtype: str, device: str = "cpu") -> None:
        from trinity_like.common.offline import set_offline_env

        set_offline_env()
        super().__init__(path, micro_batch_size, max_length, dtype, device=device)

    def pid(self) -> int:
        import os

        return os.getpid()


class RewardModelClient:
    """The explorer's handle on the reward model's actor: ``await score(task, responses)``."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    async def score(self, task: Task, responses: list[str]) -> list[float]:
        return await self.actor.score.remote([reward_input(task)] * len(responses), list(responses))

    async def ready(self) -> dict[str, Any]:
        return await self.actor.health.remote()

    def stop(self) -> None:
        import ray

        ray.kill(self.actor, no_restart=True)


def start_reward_model(cfg: Config) -> RewardModelClient | None:
    """The reward model's actor for this explorer (placed like the engines, ``explorer.node``); None when
    ``reward.model.path`` is empty. A crashed actor is restarted by Ray; the task scoring at that moment fails
    and is retried like any failed task."""
    rm = cfg.reward.model
    if not rm.path:
        return None
    import ray

    from trinity_like.common.placement import actor_options

    actor_cls = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(RewardModelActor)
    actor = actor_cls.options(num_gpus=rm.num_gpus, **actor_options(cfg.explorer.node)).remote(
        rm.path, rm.micro_batch_size, rm.max_length, rm.dtype, device="cuda" if rm.num_gpus > 0 else "cpu")
    return RewardModelClient(actor)
