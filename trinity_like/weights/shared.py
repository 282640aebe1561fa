"""Weights through shared memory (``synchronizer.method: ipc``), for engines on the trainer's node.

Trainer rank 0 packs each version into one flat buffer (the byte layout of the broadcast, ``broadcast.describe``)
that engines on its node map instead of receiving a copy:

- on a GPU, when the engines share the trainer's GPU (``explorer.gpus_per_engine`` below 1): a buffer in the
  trainer's GPU memory, handed over as a CUDA IPC handle; each engine maps it and copies device to device
  (NCCL cannot join two ranks on one GPU);
- otherwise: a file in ``/dev/shm`` (the temp folder where there is none), which engines map read-only
  (``torch.from_file``): the bytes are written once, by the trainer, and read once, by each engine.

A handle (``messages.SharedHandle``, typed; its CUDA IPC part a ``messages.CudaIpcHandle`` of plain fields: it
crosses Ray in ``WeightsInfo.shared`` and, as ``plain()``, vLLM's msgpack encoder into its worker processes) names
the version, the buffer, the tensors' layout, the node (and GPU) it lives on, and the fingerprint. The trainer keeps the newest ``keep`` versions'
buffers and refills the oldest with the next version, so an engine still mapping version v when v+1 is
published reads v intact; an engine asking for a version whose buffer was taken back gets a clear error (its
next load takes the newest version). Whatever the timing, an engine applies only bytes whose fingerprint is the
published one: one that maps a buffer just as it is refilled refuses what it read.

Publishing casts the trainer's tensors to the published dtype as it writes them into the buffer (no converted
copy of the weights first), and each buffer's handle (its file, its CUDA IPC export) is made once, with the
buffer: nothing grows with the number of versions (``_export_cuda`` says what torch keeps per export).

Files of a process killed before it cleaned up are removed by the next ``SharedWeights`` of the same owner
(the run's namespace).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trinity_like.weights.broadcast import TensorMeta, describe, flat_size, unpack
from trinity_like.weights.messages import CudaIpcHandle, SharedHandle


class SharedWeightsUnreachable(RuntimeError):
    """An engine cannot map a shared version: it runs on another node or GPU, or the buffer was dropped."""


def node_identity() -> str:
    """The host this process runs on, as shared memory sees it: its name and the kernel's boot id (the same in
    every process of the host, in Ray or not, e.g. vLLM's worker processes)."""
    import socket

    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "-"
    return f"{socket.gethostname()}:{boot}"


def shared_root() -> Path:
    """Where shared buffers live on the CPU: ``/dev/shm`` (memory), or the temp folder on a system without it."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def _device_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


_CUDA_FIELDS = ("size", "stride", "tensor_offset", "dtype", "storage_device", "storage_handle", "storage_size_bytes",
                "storage_offset_bytes", "requires_grad", "ref_counter_handle", "ref_counter_offset", "event_handle",
                "event_sync_required")
"""The arguments of torch's ``rebuild_cuda_tensor`` but its two classes, by name, in its order (torch 2.x)."""


def cuda_handle_to_plain(args: tuple) -> dict[str, Any]:
    """torch's CUDA IPC handle of a tensor (``reduce_tensor``'s arguments for ``rebuild_cuda_tensor``) as plain data
    (ints, bytes, bools, lists, a dtype's name), which any serializer carries: vLLM's msgpack encoder refuses the
    ``torch.Tensor`` and ``TypedStorage`` classes and the ``torch.dtype`` the handle holds (it would need
    ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``), and on a GPU every call into vLLM's worker processes crosses it."""
    if len(args) != 2 + len(_CUDA_FIELDS):
        raise RuntimeError(f"torch {torch.__version__}: a CUDA IPC handle of {len(args)} fields, expected "
                           f"{2 + len(_CUDA_FIELDS)}; synchronizer.method ipc does not know this torch")
    tensor_cls, size, stride, offset, storage_cls, dtype, *rest = args
    if tensor_cls is not torch.Tensor or storage_cls is not torch.storage.TypedStorage:
        raise RuntimeError(f"torch {torch.__version__}: a CUDA IPC handle of a {tensor_cls.__name__} in a "
                           f"{storage_cls.__name__}, expected a Tensor in a TypedStorage; synchronizer.method ipc "
                           "does not know this torch")
    plain = dict(zip(_CUDA_FIELDS, [list(size), list(stride), int(offset), str(dtype).removeprefix("torch."),
                                    *rest], strict=True))
    plain["storage_device"] = int(plain["storage_device"])
    return plain


def cuda_handle_from_plain(plain: dict[str, Any], device_index: int) -> tuple:
    """``rebuild_cuda_tensor``'s arguments from ``cuda_handle_to_plain``, for this process's index of the GPU."""
    values = [plain[k] for k in _CUDA_FIELDS]
    size, stride, offset, dtype, _device, *rest = values
    return (torch.Tensor, torch.Size(size), tuple(stride), offset, torch.storage.TypedStorage, getattr(torch, dtype),
            device_index, *rest)


def _import_cuda(cuda: CudaIpcHandle) -> torch.Tensor:
    """Map a buffer exported by ``_export_cuda``, found by its GPU's UUID (Ray may number the GPU differently in
    each process)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    if not torch.cuda.is_available():
        raise SharedWeightsUnreachable(
            "the trainer published this version in GPU memory (CUDA IPC) and this engine sees no GPU: with "
            "synchronizer.method ipc, engines share the trainer's GPU (explorer.gpus_per_engine between 0 and 1); "
            "engines on the CPU or other GPUs take synchronizer.method broadcast or memory")
    local = [i for i in range(torch.cuda.device_count()) if _device_uuid(i) == cuda.device_uuid]
    if not local:
        raise SharedWeightsUnreachable(
            f"the trainer's GPU ({cuda.device_uuid}) is not visible to this engine: CUDA IPC works only on the "
            "same GPU; engines on other GPUs take synchronizer.method broadcast")
    return rebuild_cuda_tensor(*cuda_handle_from_plain(cuda.torch_fields(), local[0]))


def _layout(state_dict: dict[str, torch.Tensor], dtype: torch.dtype | None) -> list[TensorMeta]:
    """The buffer's layout (``broadcast.describe``) for ``state_dict`` published in ``dtype``: floating-point tensors
    take ``dtype`` (``trainer.weights_dtype``), the others keep theirs (as ``trainer.device.to_host`` casts). Worked
    out on meta tensors, which hold no memory."""
    if dtype is None:
        return describe(state_dict)
    return describe({k: torch.empty(t.shape, dtype=dtype if t.is_floating_point() else t.dtype, device="meta")
                     for k, t in state_dict.items()})


def _fill(flat: torch.Tensor, meta: list[TensorMeta], state_dict: dict[str, torch.Tensor]) -> None:
    """Copy every tensor into its place in ``flat``, cast to the place's dtype on the way: ``copy_`` casts (and
    moves between devices) as it writes, so no converted copy of the state dict is made (a tensor that also
    changes device is cast on its own device first, one tensor at a time)."""
    for name, place in unpack(flat, meta).items():
        place.copy_(state_dict[name].detach())


_UNCOUNTED = b"/trinity_like-uncounted-reader"
"""The reference counter file named in the handles the trainer hands out: none exists by that name, so a
receiver's release of its mapping counts nowhere (torch makes those releases best effort and ignores a missing
file)."""


def _export_cuda(flat: torch.Tensor) -> tuple[CudaIpcHandle, tuple[bytes, int]]:
    """A CUDA IPC handle of ``flat`` as handed out, made once per buffer (``SharedWeights``), and the counter slot
    torch keeps for the export.

    Each ``reduce_tensor`` wraps the storage's memory in one more of torch's ``CudaIPCSentData`` (a slot in a
    ``/dev/shm/torch_<pid>_*`` counter file and an interprocess CUDA event), held until the buffer is freed: an
    export per publication grows that bookkeeping with every version. And torch counts one reader per export: the
    counter starts at 1, each receiver's mapping takes 1 off when it closes, and torch frees the memory only at 0
    (the counter is unsigned: past 0 it never frees it before the process ends). A buffer that several engines
    map, version after version, cannot be counted so; the trainer decides instead (it keeps the newest ``keep``
    versions, and engines check what they copied against the fingerprint), so the handle it hands out names no
    counter (``_UNCOUNTED``) and ``_release_cuda`` takes the export's 1 off when the buffer is dropped.

    Receivers are told not to wait on the export's CUDA event either: the trainer synchronizes after each refill
    before handing the handle out, and an event recorded at the export predates every later refill anyway."""
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(flat)
    counted = cuda_handle_to_plain(args)
    handed_out = CudaIpcHandle(**{**counted, "ref_counter_handle": _UNCOUNTED, "ref_counter_offset": 0,
                                  "event_sync_required": False}, device_uuid=_device_uuid(flat.device.index or 0))
    return handed_out, (counted["ref_counter_handle"], counted["ref_counter_offset"])


def _release_cuda(buffer: _Buffer) -> None:
    """Free a dropped GPU buffer: take the export's count off while torch still holds its slot (so that it reaches
    exactly 0), drop the tensor (torch frees memory whose count is 0), and let ``ipc_collect`` close torch's
    counter file once no export uses it."""
    torch.UntypedStorage._release_ipc_counter_cuda(*buffer.counter)
    buffer.flat = None
    torch.cuda.ipc_collect()


@dataclass(eq=False)
class _Buffer:
    """One of the trainer's shared buffers, refilled with version after version."""

    version: int
    flat: torch.Tensor | None
    path: Path | None = None
    """Its file in shared memory (on the CPU); None in GPU memory."""
    cuda: CudaIpcHandle | None = None
    """Its CUDA IPC handle as handed out (``_export_cuda``), exported when the buffer was made (in GPU memory)."""
    counter: tuple[bytes, int] | None = None
    """torch's reference counter slot of that export (file name, offset)."""


class SharedWeights:
    """Trainer rank 0's side: publishes versions as shared buffers and keeps the newest ``keep`` of them."""

    def __init__(self, owner: str, keep: int = 2, root: Path | None = None) -> None:
        """``owner``: a name unique to the run (its namespace); its folder is cleared of buffers that an earlier
        process of the same run left behind."""
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.keep = keep
        self.folder = (root or shared_root()) / f"trinity_like-{owner}"
        shutil.rmtree(self.folder, ignore_errors=True)  # buffers of a killed predecessor
        self.folder.mkdir(parents=True, exist_ok=True)
        self.node = node_identity()
        self._kept: list[_Buffer] = []
        """The buffers of the newest versions, oldest first: at most ``keep``."""
        self.buffers_made = 0
        """Buffers made so far, each with its one handle (a file, a CUDA IPC export): ``keep`` while the weights
        keep their size, however many versions go out (tests count it)."""
        self.last_bytes = 0

    def publish(self, version: int, state_dict: dict[str, torch.Tensor], fingerprint: str | None = "", *,
                dtype: torch.dtype | None = None, device: str | torch.device | None = None) -> SharedHandle:
        """Put ``state_dict`` as version ``version`` in a shared buffer on ``device`` (the tensors' own by
        default): in GPU memory on a GPU, else a shared-memory file. With ``dtype``, floating-point tensors are
        cast to it as they are written into the buffer (no converted copy of the weights is made first).
        ``fingerprint``: the version's, as given; None: computed from the buffer's bytes once written (where the
        buffer is), which is what a caller that casts passes. Returns the handle.

        Once ``keep`` versions are out, the oldest's buffer is reused, with the handle it was made with: its file
        is renamed away first (engines asking for that version from then on are told it is gone), refilled under
        that temporary name, and renamed to the new version whole, so an engine never maps a half-written
        version, and neither pages nor handles are made anew each time."""
        if not state_dict:
            raise ValueError("no weights to publish")
        meta = _layout(state_dict, dtype)
        if fingerprint and any(m.dtype != str(state_dict[m.name].dtype).removeprefix("torch.") for m in meta):
            raise ValueError("a fingerprint was given for weights that are cast as they are published: pass "
                             "fingerprint=None to fingerprint the published bytes")
        size = flat_size(meta)
        device = torch.device(device) if device is not None else next(iter(state_dict.values())).device
        buffer = self._buffer_for(size, device)
        _fill(buffer.flat, meta, state_dict)
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()  # the bytes are in place before anyone maps them
        if fingerprint is None:
            from trinity_like.weights.fingerprint import weights_fingerprint

            fingerprint = weights_fingerprint(unpack(buffer.flat, meta))
        where: dict[str, Any]
        if buffer.cuda is not None:
            where = {"kind": "cuda", "cuda": buffer.cuda}
        else:
            path = self.folder / f"version-{version:08d}"
            os.replace(buffer.path, path)
            buffer.path = path
            where = {"kind": "shm", "path": str(path)}
        handle = SharedHandle(version=version, size=size, node=self.node, fingerprint=fingerprint,
                              meta=[dict(m.__dict__) for m in meta], **where)
        buffer.version = version
        self._kept.append(buffer)
        self.last_bytes = size
        return handle

    def _buffer_for(self, size: int, device: torch.device) -> _Buffer:
        """The buffer the next version goes into, out of ``_kept``: the oldest one once ``keep`` are out and it
        fits (its file renamed to a temporary name: from here on its version is gone), else a new one."""
        if len(self._kept) >= self.keep:
            oldest = self._kept.pop(0)
            if oldest.flat.numel() == size and oldest.flat.device == device:
                if oldest.path is not None:
                    tmp = oldest.path.with_name(oldest.path.name + ".tmp")
                    os.replace(oldest.path, tmp)  # the old version is gone from here on; the mapping stays
                    oldest.path = tmp
                return oldest
            self._drop(oldest)
        self.buffers_made += 1
        if device.type == "cuda":
            flat = torch.empty(size, dtype=torch.uint8, device=device)
            cuda, counter = _export_cuda(flat)
            return _Buffer(-1, flat, cuda=cuda, counter=counter)
        tmp = self.folder / f"buffer-{self.buffers_made:08d}.tmp"
        return _Buffer(-1, torch.from_file(str(tmp), shared=True, size=size, dtype=torch.uint8), path=tmp)

    @staticmethod
    def _drop(buffer: _Buffer) -> None:
        if buffer.path is not None:
            with contextlib.suppress(FileNotFoundError):
                buffer.path.unlink()  # engines that mapped it keep their mapping until they let go
        if buffer.cuda is not None:
            _release_cuda(buffer)
        buffer.flat = None

    def live_buffers(self) -> int:
        """Buffers (and their handles) held now: at most ``keep``."""
        return len(self._kept)

    def torch_counters(self) -> set[tuple[bytes, int]]:
        """torch's reference counter slots held for the exports of the GPU buffers held now (one per buffer)."""
        return {b.counter for b in self._kept if b.counter is not None}

    def close(self) -> None:
        """Drop every buffer (GPU memory is freed once the engines let go of their mappings)."""
        while self._kept:
            self._drop(self._kept.pop())
        shutil.rmtree(self.folder, ignore_errors=True)


def open_shared(handle: SharedHandle, copy: bool = False) -> dict[str, torch.Tensor]:
    """The tensors of a shared version: views into the trainer's buffer, or with ``copy`` views into this
    process's own copy of it, taken in one pass (on the buffer's device). An engine loads from a copy: the trainer
    refills its oldest buffer in place, so bytes checked in the buffer may change before they are loaded, while
    a copy checked against the fingerprint stays what was checked (copy, then verify, then load). Raises
    ``SharedWeightsUnreachable`` when this process is on another node or GPU, or the buffer was dropped for a
    newer version."""
    if handle.node != node_identity():
        raise SharedWeightsUnreachable(
            f"version {handle.version} is in shared memory on node {handle.node}, not on this engine's node "
            f"({node_identity()}): synchronizer.method ipc needs the engines on the trainer's node; engines on "
            "other nodes take synchronizer.method broadcast or memory")
    meta = [TensorMeta.from_plain(m) for m in handle.meta]
    if handle.kind == "cuda":
        flat = _import_cuda(handle.cuda)
    else:
        try:
            if not os.path.exists(handle.path):
                raise FileNotFoundError(handle.path)
            flat = torch.from_file(handle.path, shared=False, size=handle.size, dtype=torch.uint8)
        except (OSError, RuntimeError) as e:  # taken back for a newer version (perhaps just now)
            raise SharedWeightsUnreachable(
                f"the shared buffer of version {handle.version} ({handle.path}) is gone: the trainer keeps "
                "only the newest versions (or stopped); load the newest one") from e
    return unpack(flat.clone() if copy else flat, meta)
