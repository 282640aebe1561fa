"""The explorer role: setup -> run -> shutdown. Each step samples ``batch_size`` tasks x ``repeat_times``
responses, scores them, stamps the policy version and writes one buffer segment.

Admission (AReaL's rule): explorer step j feeds trainer step ``c(j) = floor(j * rows_per_step /
train_batch_size)``; it may start only once the published version is >= ``c(j) - max_staleness``, so no row it
writes can be staler than the bound when trained. Weights are swapped only at a step boundary, so one step's
samples all come from one version.
"""

from __future__ import annotations

import math
import random
import time
from concurrent.futures import ThreadPoolExecutor

from trinity_like.algorithms.rewards import load_reward_manager
from trinity_like.buffer import BufferWriter
from trinity_like.common.experience import Experience
from trinity_like.common.metrics import MetricsWriter
from trinity_like.common.modeling import set_offline_env
from trinity_like.common.tasks import Task, load_taskset
from trinity_like.config import Config, RunPaths, namespace_of, redis_stream
from trinity_like.explorer.engines.hf_engine import Sample


def explore_steps_needed(cfg: Config) -> int:
    """Explorer steps whose output covers ``trainer.total_steps`` trainer batches."""
    rows_per_step = cfg.explorer.batch_size * cfg.explorer.repeat_times
    return math.ceil(cfg.trainer.total_steps * cfg.train_batch_size / rows_per_step)


class ExplorerRole:
    """Runs as a Ray actor holding ``explorer.num_engines`` engines, each on its own thread."""

    def __init__(self, cfg: Config) -> None:
        set_offline_env()
        self.cfg = cfg
        self.paths = RunPaths.of(cfg)
        self.explore_step_num = 0

    def setup(self) -> None:
        from trinity_like.common.tokenizer import hf_tokenizer
        from trinity_like.explorer.engines.hf_engine import HFEngine
        from trinity_like.synchronizer import get_synchronizer

        self.synchronizer = get_synchronizer(namespace_of(self.cfg))
        self.tokenizer = hf_tokenizer(self.cfg.model.path)
        self.engines = [HFEngine(self.cfg.model.path, engine_id=f"hf-{i}", num_threads=self.cfg.explorer.num_threads)
                        for i in range(self.cfg.explorer.num_engines)]
        self.pool = ThreadPoolExecutor(max_workers=len(self.engines), thread_name_prefix="engine")
        self.tasks = load_taskset(self.paths.taskset)
        self.reward_manager = load_reward_manager(self.cfg, self.tokenizer)
        self.writer = BufferWriter(self.paths.buffer_dir, writer_id="explorer", capacity=self.cfg.buffer.capacity)
        self.sender = None
        if self.cfg.buffer.transport == "redis":
            from trinity_like.buffer.redis_transport import RedisSender

            self.sender = RedisSender(self.cfg.buffer.redis_url, redis_stream(self.cfg),
                                      timeout_s=self.cfg.synchronizer.timeout_s)
        self.metrics = MetricsWriter(self.paths.metrics, role="explorer")
        self._order: list[int] = []
        self._epoch = -1

    # ------------------------------------------------------------ weights
    def _admit_and_sync(self, step: int) -> float:
        """Wait until this step is within the staleness bound, load the newest weights; return seconds waited."""
        import ray

        start = time.perf_counter()
        if self.cfg.mode == "sync":
            info = ray.get(self.synchronizer.latest.remote())
        else:
            rows_per_step = self.cfg.explorer.batch_size * self.cfg.explorer.repeat_times
            consumer_step = step * rows_per_step // self.cfg.train_batch_size
            need = max(0, consumer_step - self.cfg.synchronizer.max_staleness)
            info = ray.get(self.synchronizer.wait_for_version.remote(need, self.cfg.synchronizer.timeout_s))
        if info.version > self.engines[0].model_version:
            state_dict = ray.get(info.refs[0]) if info.refs else None
            for engine in self.engines:
                if state_dict is not None:
                    engine.load_state_dict(state_dict, info.version)
                else:
                    engine.load_weights_file(info.path, info.version)
        return time.perf_counter() - start

    # ------------------------------------------------------------ tasks
    def _tasks_for_step(self, step: int) -> list[Task]:
        """Tasks in a seeded random order, reshuffled each pass over the task set."""
        n, bs = len(self.tasks), self.cfg.explorer.batch_size
        out = []
        for k in range(step * bs, (step + 1) * bs):
            epoch, pos = divmod(k, n)
            if epoch != self._epoch:
                self._order = list(range(n))
                random.Random(self.cfg.seed * 1_000_003 + epoch).shuffle(self._order)
                self._epoch = epoch
            out.append(self.tasks[self._order[pos]])
        return out

    # ------------------------------------------------------------ the step
    def _generate(self, prompts: list[list[int]], step: int) -> list[tuple[object, Sample]]:
        """(engine, sample) per prompt, in prompt order. Prompt r goes to engine r % n, each engine on its own
        thread with its own seed, so the result never depends on thread timing."""
        n = len(self.engines)
        futures = [self.pool.submit(engine.generate, prompts[i::n], self.cfg.explorer.sampling,
                                    self.cfg.seed * 1_000_003 + step * 101 + i)
                   for i, engine in enumerate(self.engines) if prompts[i::n]]
        results = [fut.result() for fut in futures]
        return [(self.engines[r % n], results[r % n][r // n]) for r in range(len(prompts))]

    def step(self) -> dict[str, float]:
        step = self.explore_step_num
        wait_s = self._admit_and_sync(step)
        start = time.perf_counter()
        repeat = self.cfg.explorer.repeat_times
        tasks = self._tasks_for_step(step)
        requests = [(t, self.tokenizer.encode(t.prompt)) for t in tasks for _ in range(repeat)]
        version = self.engines[0].model_version
        samples = self._generate([p for _, p in requests], step)
        texts = [self.tokenizer.decode(s.response_ids.tolist(), skip_special_tokens=True) for _, s in samples]
        rewards, reward_info = self.reward_manager.score(
            texts, [t.answer for t, _ in requests], [t.data_source or "math" for t, _ in requests],
            [len(s.response_ids) for _, s in samples])
        exps: list[Experience] = []
        for r, ((task, prompt_ids), (engine, sample)) in enumerate(zip(requests, samples, strict=True)):
            exps.append(Experience(
                prompt_ids=prompt_ids, response_ids=sample.response_ids, logprobs=sample.logprobs,
                group_id=f"s{step}-{task.task_id}-{r // repeat}", task_id=task.task_id, source="explorer",
                reward=rewards[r], model_version=version, engine_id=engine.engine_id,
                truncated=sample.finish_reason == "length", prompt_text=task.prompt, response_text=texts[r],
                info={"ground_truth": task.answer, "data_source": task.data_source, "explore_step": step,
                      **({"reward_failed": True} if reward_info["reward_failed"][r] else {})},
            ))
        if self.sender is not None:
            buffer_wait_s = 0.0
            self.sender.send_sync(exps)
        else:
            buffer_wait_s = self.writer.wait_for_room(self.cfg.synchronizer.timeout_s)
            self.writer.write(exps)
        elapsed = time.perf_counter() - start - buffer_wait_s
        rewards = [e.reward for e in exps]
        metrics = {
            "rollout/reward_mean": sum(rewards) / len(rewards),
            "rollout/accuracy": sum(r == 1.0 for r in rewards) / len(rewards),
            "rollout/response_length_mean": sum(len(e.response_ids) for e in exps) / len(exps),
            "rollout/truncated_frac": sum(e.truncated for e in exps) / len(exps),
            "rollout/reward_failed": float(sum(reward_info["reward_failed"])),
            "rollout/model_version": float(version),
            "rollout/experiences": float(len(exps)),
            "time/explore_step_s": elapsed,
            "time/wait_weights_s": wait_s,
            "time/wait_buffer_s": buffer_wait_s,
        }
        self.explore_step_num += 1
        self.metrics.write(self.explore_step_num, metrics)
        return metrics

    def run(self, num_steps: int | None = None) -> int:
        """Explore until enough data for the trainer's steps, or until the trainer ends; return steps done."""
        import ray

        total = explore_steps_needed(self.cfg) if num_steps is None else num_steps
        try:
            while self.explore_step_num < total:
                if "trainer" in ray.get(self.synchronizer.ended.remote()):
                    break
                self.step()
        except BaseException as e:
            ray.get(self.synchronizer.mark_ended.remote("explorer", f"failed: {type(e).__name__}: {e}"))
            raise
        ray.get(self.synchronizer.mark_ended.remote("explorer", "finished"))
        return self.explore_step_num

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True)
