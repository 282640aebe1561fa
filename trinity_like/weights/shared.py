"""Weights through shared memory (``synchronizer.method: ipc``), for engines on the trainer's node.

Trainer rank 0 packs each version into one flat buffer (the byte layout of the broadcast, ``broadcast.describe``)
that engines on its node map instead of receiving a copy:

- on a GPU, when the engines share the trainer's GPU (``explorer.gpus_per_engine`` below 1): a buffer in the
  trainer's GPU memory, handed over as a CUDA IPC handle; each engine maps it and copies device to device
  (NCCL cannot join two ranks on one GPU);
- otherwise: a file in ``/dev/shm`` (the temp folder where there is none), which engines map read-only
  (``torch.from_file``): the bytes are written once, by the trainer, and read once, by each engine.

A handle (plain data only, the CUDA IPC handle included: it crosses Ray in ``WeightsInfo.shared`` and vLLM's
msgpack encoder into its worker processes) names the version, the buffer, the tensors'
layout, the node (and GPU) it lives on, and the fingerprint. The trainer keeps the newest ``keep`` versions'
buffers and refills the oldest with the next version, so an engine still mapping version v when v+1 is
published reads v intact; an engine asking for a version whose buffer was taken back gets a clear error (its
next load takes the newest version). Whatever the timing, an engine applies only bytes whose fingerprint is the
published one: one that maps a buffer just as it is refilled refuses what it read.

Files of a process killed before it cleaned up are removed by the next ``SharedWeights`` of the same owner
(the run's namespace).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from trinity_like.weights.broadcast import TensorMeta, describe, flat_size, pack, unpack


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


def _export_cuda(flat: torch.Tensor) -> dict[str, Any]:
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(flat)
    return {"handle": cuda_handle_to_plain(args), "device_uuid": _device_uuid(flat.device.index or 0)}


def _import_cuda(cuda: dict[str, Any]) -> torch.Tensor:
    """Map a buffer exported by ``_export_cuda``, found by its GPU's UUID (Ray may number the GPU differently in
    each process)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    if not torch.cuda.is_available():
        raise SharedWeightsUnreachable(
            "the trainer published this version in GPU memory (CUDA IPC) and this engine sees no GPU: with "
            "synchronizer.method ipc, engines share the trainer's GPU (explorer.gpus_per_engine between 0 and 1); "
            "engines on the CPU or other GPUs take synchronizer.method broadcast or memory")
    local = [i for i in range(torch.cuda.device_count()) if _device_uuid(i) == cuda["device_uuid"]]
    if not local:
        raise SharedWeightsUnreachable(
            f"the trainer's GPU ({cuda['device_uuid']}) is not visible to this engine: CUDA IPC works only on the "
            "same GPU; engines on other GPUs take synchronizer.method broadcast")
    return rebuild_cuda_tensor(*cuda_handle_from_plain(cuda["handle"], local[0]))


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
        self._kept: list[tuple[int, Any, torch.Tensor]] = []
        """(version, its file path or None on a GPU, the flat buffer), oldest first."""
        self.last_bytes = 0

    def publish(self, version: int, state_dict: dict[str, torch.Tensor], fingerprint: str = "") -> dict[str, Any]:
        """Pack ``state_dict`` as version ``version`` into a shared buffer (in GPU memory when its tensors are on
        a GPU, else a shared-memory file) and return its handle. Once ``keep`` versions are out, the oldest's
        buffer is reused: its file is renamed away first (engines asking for that version from then on are
        told it is gone), refilled under that temporary name, and renamed to the new version whole, so an
        engine never maps a half-written version and the trainer's pages are not allocated anew each time."""
        if not state_dict:
            raise ValueError("no weights to publish")
        meta = describe(state_dict)
        size = flat_size(meta)
        device = next(iter(state_dict.values())).device
        handle: dict[str, Any] = {"version": version, "meta": [m.__dict__ for m in meta], "size": size,
                                  "node": self.node, "fingerprint": fingerprint}
        reuse = None
        if len(self._kept) >= self.keep:
            reuse = self._kept.pop(0)
            if reuse[2].numel() != size or reuse[2].device != device:
                self._drop(reuse[1])
                reuse = None
        if device.type == "cuda":
            flat = pack(state_dict, meta, device, out=None if reuse is None else reuse[2])
            torch.cuda.current_stream(device).synchronize()  # the bytes are in place before anyone maps them
            handle.update(kind="cuda", cuda=_export_cuda(flat))
            self._kept.append((version, None, flat))
        else:
            path = self.folder / f"version-{version:08d}"
            tmp = path.with_name(path.name + ".tmp")
            if reuse is None:
                flat = torch.from_file(str(tmp), shared=True, size=size, dtype=torch.uint8)
            else:
                os.replace(reuse[1], tmp)  # the old version is gone from here on; the mapping stays
                flat = reuse[2]
            pack(state_dict, meta, out=flat)
            os.replace(tmp, path)
            handle.update(kind="shm", path=str(path))
            self._kept.append((version, path, flat))
        self.last_bytes = size
        return handle

    @staticmethod
    def _drop(path: Path | None) -> None:
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # engines that mapped it keep their mapping until they let go

    def close(self) -> None:
        """Drop every buffer (GPU memory is freed once the engines let go of their mappings)."""
        self._kept.clear()
        shutil.rmtree(self.folder, ignore_errors=True)


def open_shared(handle: dict[str, Any], copy: bool = False) -> dict[str, torch.Tensor]:
    """The tensors of a shared version: views into the trainer's buffer, or with ``copy`` views into this
    process's own copy of it, taken in one pass (on the buffer's device). An engine loads from a copy: the trainer
    refills its oldest buffer in place, so bytes checked in the buffer may change before they are loaded, while
    a copy checked against the fingerprint stays what was checked (copy, then verify, then load). Raises
    ``SharedWeightsUnreachable`` when this process is on another node or GPU, or the buffer was dropped for a
    newer version."""
    if handle["node"] != node_identity():
        raise SharedWeightsUnreachable(
            f"version {handle['version']} is in shared memory on node {handle['node']}, not on this engine's node "
            f"({node_identity()}): synchronizer.method ipc needs the engines on the trainer's node; engines on "
            "other nodes take synchronizer.method broadcast or memory")
    meta = [TensorMeta.from_plain(m) for m in handle["meta"]]
    if handle["kind"] == "cuda":
        flat = _import_cuda(handle["cuda"])
    else:
        try:
            if not os.path.exists(handle["path"]):
                raise FileNotFoundError(handle["path"])
            flat = torch.from_file(handle["path"], shared=False, size=handle["size"], dtype=torch.uint8)
        except (OSError, RuntimeError) as e:  # taken back for a newer version (perhaps just now)
            raise SharedWeightsUnreachable(
                f"the shared buffer of version {handle['version']} ({handle['path']}) is gone: the trainer keeps "
                "only the newest versions (or stopped); load the newest one") from e
    return unpack(flat.clone() if copy else flat, meta)
