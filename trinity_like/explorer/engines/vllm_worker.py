"""What runs inside vLLM's workers: the worker extension (``WeightSyncExtension``, vLLM's ``worker_extension_cls``)
that loads each weight version in place, with its checks. The engine (``vllm_engine``) calls its methods through
``collective_rpc``; on a GPU they run in vLLM's worker processes, behind vLLM's msgpack serializer, so every
argument is plain data (bytes, numbers, a ``WeightsInfo.plain()``: a path, or a shared buffer's handle with its
CUDA IPC part in plain form). Which source a version is read from is ``weights.receive``'s (``read_weights``).

vLLM is not imported here at module level: the engine names this class to vLLM by its import path.
"""

from __future__ import annotations

from trinity_like.weights.files import (
    CorruptWeightsError,
    IncompleteWeightsError,
    WeightsAccessError,
)
from trinity_like.weights.messages import BroadcastRound, WeightsInfo
from trinity_like.weights.receive import read_weights
from trinity_like.weights.shared import SharedWeightsUnreachable

REFUSALS = (CorruptWeightsError, IncompleteWeightsError, WeightsAccessError, SharedWeightsUnreachable,
             FileNotFoundError)
"""Why a worker may refuse a version's source (damaged or pruned files, a buffer gone): the worker returns the
reason and the engine raises it again as its own type. Raised in a vLLM worker process, any exception reaches the
engine as a bare ``Exception`` with the text only, and the fleet, which tells these apart, would not know it."""


class WeightSyncExtension:
    """Methods added to vLLM's worker class (``worker_extension_cls``); they run inside each worker, where
    ``self`` is the worker. Called through ``LLM.collective_rpc``."""

    def trinity_stage(self, offset: int, total: int, chunk: bytes) -> int:
        """Receive ``chunk``, bytes ``offset``.. of a ``total``-byte safetensors image that the next
        ``trinity_load_weights(staged=True)`` loads; return the bytes staged so far. Offset 0 starts a new image."""
        staged = getattr(self, "_trinity_staged", None)
        if offset == 0 or staged is None or len(staged[0]) != total:
            staged = self._trinity_staged = [bytearray(total), 0]
        if staged[1] != offset or offset + len(chunk) > total:
            raise ValueError(f"staged weights out of order: chunk at {offset} after {staged[1]} of {total} bytes")
        staged[0][offset:offset + len(chunk)] = chunk
        staged[1] = offset + len(chunk)
        return staged[1]

    def trinity_load_weights(self, source: dict | None = None, data: bytes | None = None,
                             tied: bool = False, fingerprint: str = "", staged: bool = False,
                             commit: bool = True) -> dict:
        """Load new weights (Hugging Face names) in place, from a version the worker reads itself (``source``, a
        ``WeightsInfo.plain()``: a version's files, or a shared buffer on this node that it maps, method ``ipc``:
        CUDA IPC on the trainer's GPU, a shared-memory file on the CPU), the bytes of a safetensors file, or bytes
        staged before, if their fingerprint is ``fingerprint`` (when given); return
        ``{"fingerprint", "applied", "tensors"}``.

        Uses the worker's ``reload_weights``: layers whose weights vLLM repacked after the first load (the CPU
        backend's linear layers, quantised layers) are put back into checkpoint form, loaded through the
        model's ``load_weights`` (which fuses q/k/v and gate/up and skips a tied ``lm_head``), then processed
        again. A tied ``lm_head`` receives no weight of its own, so the reload leaves it alone; on the CPU
        backend it keeps a packed copy of the old embedding for its matmul (measured: log-probs off by tens of
        nats after an update), so it is processed again here from the new, shared weight."""
        checked = ""
        if source is not None:
            try:
                received = read_weights(WeightsInfo.from_plain(source))  # typed again here
                state_dict, checked = received.state_dict, received.checked
            except REFUSALS as e:  # returned, not raised: vLLM's worker processes pass on only a message
                return {"refused": {"type": type(e).__name__, "message": str(e)}, "applied": False,
                        "fingerprint": "", "tensors": 0}
        elif staged:
            from safetensors.torch import load

            image, done = getattr(self, "_trinity_staged", (b"", -1))
            self._trinity_staged = None
            if done != len(image):
                raise ValueError(f"staged weights incomplete: {done} of {len(image)} bytes")
            state_dict = load(bytes(image))
        else:
            from safetensors.torch import load

            state_dict = load(data)
        return self._trinity_apply(state_dict, tied, fingerprint, commit, checked)

    def trinity_commit(self) -> dict:
        """Apply the version the last ``trinity_load_weights(commit=False)`` checked and kept."""
        pending, self._trinity_pending = getattr(self, "_trinity_pending", None), None
        if pending is None:
            raise RuntimeError("no checked version is waiting to be applied")
        state_dict, tied, got = pending
        self._trinity_reload(state_dict, tied)
        return {"fingerprint": got, "applied": True, "tensors": len(state_dict)}

    def trinity_drop(self) -> None:
        """Forget a checked version that another worker of the engine refused."""
        self._trinity_pending = None

    def trinity_receive_weights(self, spec: dict, tied: bool = False, timeout_s: float = 600.0) -> dict:
        """Method ``broadcast``: join the round ``spec`` (``BroadcastRound.plain()``) from this worker process
        (NCCL into GPU memory where the round runs over NCCL, else gloo into host memory), receive the whole version into a staging buffer, then load it if it has the round's
        fingerprint; return ``trinity_load_weights``'s dict plus the bytes."""
        import torch

        from trinity_like.weights.broadcast import WeightReceiver

        receiver = getattr(self, "_trinity_receiver", None)
        if receiver is None:
            receiver = self._trinity_receiver = WeightReceiver(timeout_s)
        round_ = BroadcastRound.from_plain(spec)  # plain data across vLLM's serializer, typed again here
        device = "cuda" if round_.backend == "nccl" and torch.cuda.is_available() else "cpu"
        state_dict, size = receiver.receive(round_, device=device)
        return {**self._trinity_apply(state_dict, tied, round_.fingerprint), "bytes": size}

    def _trinity_apply(self, state_dict, tied: bool, fingerprint: str, commit: bool = True,
                       checked: str = "") -> dict:
        """Apply ``state_dict`` unless its fingerprint differs from the published one (then nothing changes).
        With ``commit`` False, only check it and keep it for ``trinity_commit``: an engine over several workers
        (tensor parallel) applies a version only once every worker has checked its copy, so that no worker
        serves a version another refused. ``checked``: the fingerprint these very tensors were already checked
        against as they were read (``load_version``); they are not hashed a second time when it is in the
        published fingerprint's scheme."""
        from trinity_like.weights.fingerprint import received_fingerprint

        if not state_dict:
            raise ValueError("no weights given")
        got = received_fingerprint(state_dict, fingerprint, checked)
        if fingerprint and got != fingerprint:
            return {"fingerprint": got, "applied": False, "tensors": len(state_dict)}
        if not commit:
            self._trinity_pending = (state_dict, tied, got)
            return {"fingerprint": got, "applied": False, "pending": True, "tensors": len(state_dict)}
        self._trinity_reload(state_dict, tied)
        return {"fingerprint": got, "applied": True, "tensors": len(state_dict)}

    def _trinity_reload(self, state_dict, tied: bool) -> None:
        self.reload_weights(weights_iterator=iter(state_dict.items()), is_checkpoint_format=True)
        head = getattr(self.get_model(), "lm_head", None)
        method = getattr(head, "quant_method", None)
        if tied and method is not None and getattr(head, "weight", None) is not None:
            method.process_weights_after_loading(head)
