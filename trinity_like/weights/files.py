"""The on-disk form of one published policy version (method ``checkpoint``).

    checkpoints/state_dict/version-00000005/
        part-00000-of-00002.safetensors     written by trainer rank 0 (its share of the tensors)
        part-00001-of-00002.safetensors     written by trainer rank 1
        manifest.json                       written last, by the CheckpointMonitor, once every part is in

Every data-parallel rank holds the full weights (DDP replicas, or FSDP2 after its gather), so the tensors are
split by size over the ranks and written in parallel, each part atomically (temp file, rename; no fsync: a
version only carries weights to the engines, and the trainer's checkpoints are the durable copy). A
version exists for readers only once ``manifest.json`` does; it records each part's size and the fingerprint of
each of its tensors (``tensor_fingerprint``: dtype, shape and a checksum of its bytes, taken from the tensors the
writer had in hand). A reader loads a part, then checks the tensors it loaded against those fingerprints before it
hands any of them on: it verifies the bytes it will use, not a file it reads again later, and a torn or corrupted
part is refused (``CorruptWeightsError``) instead of loaded. One pass over the bytes on each side: writing hashes
what it writes, reading hashes what it loaded. Parts are read memory-mapped, as ``safetensors.torch.load_file``
does; a version folder's files are never rewritten in place (temp file, rename), so what was checked is what
stays mapped. Manifests of earlier writers, with the CRC-32 of each 64 MiB chunk of each file and no tensor
fingerprints, are checked by those. A single ``.safetensors`` file is also accepted as a version.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import shutil
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from trinity_like.common.fs import atomic_write_json, atomic_write_with
from trinity_like.runtime.checkpoints import CheckpointPointerError, read_pointer, write_pointer

if TYPE_CHECKING:  # torch only for annotations: the Synchronizer and CheckpointMonitor actors start without it
    import torch

MANIFEST = "manifest.json"
STATE_DICT_DIR = "state_dict"
"""The versions' folder under the run's checkpoint folder."""
CRC_CHUNK = 64 * 2**20

logger = logging.getLogger(__name__)


class CorruptWeightsError(ValueError):
    """A published version's files do not match its manifest (size, fingerprints or CRC-32), or cannot be parsed: the
    bytes are damaged, and reading them again will not help."""


class IncompleteWeightsError(FileNotFoundError):
    """A version folder without its manifest or one of its parts: never completed (its writer died), or
    pruned meanwhile; a newer version will come."""


class WeightsAccessError(OSError):
    """A version's files are there but cannot be read (permissions, an I/O error of the disk or the network
    file system): nothing says the bytes are bad."""


def _access_error(path: Path, e: OSError) -> WeightsAccessError:
    return WeightsAccessError(e.errno, f"{path}: cannot be read ({e.strerror or e}); check the permissions of the "
                                       "run's checkpoints folder and the disk or network file system it is on")


def version_dir(root: str | Path, version: int) -> Path:
    return Path(root) / f"version-{version:08d}"


def version_of(path: str | Path) -> int | None:
    name = Path(path).name
    if not name.startswith("version-"):
        return None
    try:
        return int(name.split("-", 1)[1].split(".")[0])
    except ValueError:
        return None


def split_for_writers(state_dict: dict[str, torch.Tensor], world: int) -> list[list[str]]:
    """The tensor names each of ``world`` writers stores: largest first onto the least-loaded writer, ties
    broken by name, so every rank computes the same split from the same weights."""
    loads = [0] * world
    shares: list[list[str]] = [[] for _ in range(world)]
    for name in sorted(state_dict, key=lambda n: (-state_dict[n].numel() * state_dict[n].element_size(), n)):
        w = min(range(world), key=lambda i: (loads[i], i))
        shares[w].append(name)
        loads[w] += state_dict[name].numel() * state_dict[name].element_size()
    return shares


def file_crc32s(path: str | Path) -> list[int]:
    """CRC-32 of each ``CRC_CHUNK`` bytes of a file, computed in parallel threads (zlib releases the GIL)."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size == 0:
            return []
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
            view = memoryview(m)
            try:
                chunks = [view[lo:lo + CRC_CHUNK] for lo in range(0, size, CRC_CHUNK)]
                with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1, len(chunks))) as pool:
                    out = list(pool.map(zlib.crc32, chunks))
                for c in chunks:
                    c.release()
                return out
            finally:
                view.release()


_SAFETENSORS_DTYPES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64", "int32": "I32",
    "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL", "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2", "uint16": "U16", "uint32": "U32", "uint64": "U64"}
"""torch's dtype names -> the safetensors format's (https://huggingface.co/docs/safetensors, "Format")."""


def write_safetensors(path: str | Path, tensors: dict[str, torch.Tensor]) -> None:
    """``tensors`` as one safetensors file at ``path``, written straight from each tensor's memory (one tensor on
    the host at a time where they live on a GPU). The format's own writer holds the GIL while it writes, which
    kept the writer's fingerprinting from running beside it (0.35 s against 0.31 s at 0.4 GB, bench/sync.py);
    a file write does not. Header: 8 bytes little-endian length, then JSON padded with spaces to 8 bytes."""
    import torch

    names = sorted(tensors)
    header, offset = {}, 0
    for name in names:
        t = tensors[name]
        kind = _SAFETENSORS_DTYPES.get(str(t.dtype).removeprefix("torch."))
        if kind is None:
            raise TypeError(f"tensor '{name}': dtype {t.dtype} has no safetensors name; cast it before publishing")
        size = t.numel() * t.element_size()
        header[name] = {"dtype": kind, "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little") + head)
        for name in names:
            t = tensors[name].detach().to("cpu").contiguous()
            if t.numel():
                f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))


def write_part(vdir: str | Path, rank: int, world: int, tensors: dict[str, torch.Tensor]) -> dict:
    """Write one writer's tensors atomically, fingerprinting them meanwhile in one thread (the write keeps a core:
    0.109 s against 0.103 s for the write alone at 0.4 GB on the 2-core development VM; 0.129 s with two
    fingerprinting threads); return the part's manifest entry."""
    from trinity_like.weights.fingerprint import tensor_fingerprints

    name = f"part-{rank:05d}-of-{world:05d}.safetensors"
    with ThreadPoolExecutor(max_workers=1) as pool:
        fingerprints = pool.submit(tensor_fingerprints, tensors, threads=1)
        path = atomic_write_with(Path(vdir) / name, lambda tmp: write_safetensors(tmp, tensors), durable=False)
        return {"file": name, "bytes": path.stat().st_size, "tensors": sorted(tensors),
                "fingerprints": fingerprints.result()}


def parts_fingerprint(parts: list[dict]) -> str:
    """The version's ``weights_fingerprint``, from the per-tensor fingerprints its writers recorded (empty for
    parts written before fingerprints existed)."""
    from trinity_like.weights.fingerprint import combine_fingerprints

    if not parts or any("fingerprints" not in p for p in parts):
        return ""
    return combine_fingerprints({k: v for p in parts for k, v in p["fingerprints"].items()})


def write_manifest(vdir: str | Path, version: int, parts: list[dict]) -> Path:
    """Complete a version: after this, readers may load it."""
    parts = sorted(parts, key=lambda p: p["file"])
    return atomic_write_json(Path(vdir) / MANIFEST, {
        "version": version, "parts": parts, "bytes": sum(p["bytes"] for p in parts),
        "fingerprint": parts_fingerprint(parts)}, durable=False)


def read_manifest(vdir: str | Path) -> dict:
    path = Path(vdir) / MANIFEST
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise IncompleteWeightsError(f"version folder '{vdir}' has no {MANIFEST}: it was never completed (its "
                                     "writer died) or was pruned; a newer version will be published") from None
    except OSError as e:
        raise _access_error(path, e) from None
    except json.JSONDecodeError as e:
        raise CorruptWeightsError(f"{path}: unreadable manifest ({e})") from None


def tensor_names(path: str | Path) -> list[str]:
    """Names of the tensors of a version (folder with a manifest, or one safetensors file)."""
    path = Path(path)
    if path.is_dir():
        return [n for p in read_manifest(path)["parts"] for n in p["tensors"]]
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return list(f.keys())


def read_weights(path: str | Path, device: str = "cpu") -> tuple[dict[str, torch.Tensor], int]:
    """All tensors of a version and the bytes read, every part's loaded tensors checked against the manifest before
    any is returned."""
    tensors, size, _ = load_version(path, device)
    return tensors, size


def load_version(path: str | Path, device: str = "cpu") -> tuple[dict[str, torch.Tensor], int, str]:
    """``read_weights``, plus the fingerprint of the tensors as checked: the manifest's, combined from the
    per-tensor fingerprints the loaded tensors matched ("" where none were checked: a single file, an earlier
    writer's manifest). A receiver that compares with the published fingerprint need not hash them again."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_dir():
        if not path.is_file():
            raise FileNotFoundError(f"no weights at '{path}'")
        try:
            return load_file(str(path), device=device), path.stat().st_size, ""
        except OSError as e:
            raise _access_error(path, e) from None
        except Exception as e:  # safetensors raises its own error type for a bad header
            raise CorruptWeightsError(f"{path}: {e}") from None
    manifest = read_manifest(path)
    out: dict[str, torch.Tensor] = {}
    total = 0
    for part in manifest["parts"]:
        file = path / part["file"]
        try:
            size = file.stat().st_size
        except FileNotFoundError:
            raise IncompleteWeightsError(f"{file}: listed in the manifest but missing; the version was pruned or "
                                         "its folder damaged, and is refused") from None
        if size != part["bytes"]:
            raise CorruptWeightsError(f"{file}: {size} bytes, the manifest says {part['bytes']}; the file is "
                                      "damaged and this version is refused")
        if "fingerprints" not in part:  # an earlier writer's manifest: CRC-32 of the file's chunks, before loading
            _check_chunk_crcs(file, part["crc32"])
        try:
            tensors = load_file(str(file), device=device)
        except OSError as e:
            raise _access_error(file, e) from None
        except Exception as e:  # the size matched the manifest, yet the bytes do not parse
            raise CorruptWeightsError(f"{file}: {e}; the file is damaged and this version is refused") from None
        if "fingerprints" in part:
            _check_loaded(file, tensors, part["fingerprints"])
        out.update(tensors)
        total += size
    return out, total, parts_fingerprint(manifest["parts"])


def _check_chunk_crcs(file: Path, expected: list[int]) -> None:
    try:
        crcs = file_crc32s(file)
    except OSError as e:
        raise _access_error(file, e) from None
    if crcs != expected:
        bad = next(i for i, (a, b) in enumerate(zip(crcs, expected, strict=True)) if a != b)
        raise CorruptWeightsError(f"{file}: the CRC-32 of bytes {bad * CRC_CHUNK}.. is {crcs[bad]:#010x}, the "
                                  f"manifest says {expected[bad]:#010x}; the file is damaged and this version is "
                                  "refused")


def _check_loaded(file: Path, tensors: dict[str, torch.Tensor], expected: dict[str, str]) -> None:
    """The tensors loaded from ``file`` are exactly those its writer fingerprinted (names, dtypes, shapes, bytes)."""
    from trinity_like.weights.fingerprint import scheme_of, tensor_fingerprints

    if set(tensors) != set(expected):
        odd = sorted(set(tensors) ^ set(expected))[:3]
        raise CorruptWeightsError(f"{file}: holds other tensors than the manifest lists (e.g. {', '.join(odd)}); "
                                  "the file is damaged and this version is refused")
    schemes = {scheme_of(v) for v in expected.values()}  # one scheme per writer: its code's
    got = tensor_fingerprints(tensors, scheme=schemes.pop() if len(schemes) == 1 else "s1")
    bad = [n for n in sorted(expected) if got[n] != expected[n]]
    if bad:
        raise CorruptWeightsError(f"{file}: tensor '{bad[0]}' loaded as {got[bad[0]]}, the manifest says "
                                  f"{expected[bad[0]]} ({len(bad)} of {len(expected)} tensors differ); the file is "
                                  "damaged and this version is refused")


def version_pointer_or_0(root: Path) -> int:
    """``state_dict/latest``, written without fsync like the versions it names (``write_part``): after a power
    loss it may be empty. It is then read as 0, since the versions are made again (a resumed trainer publishes
    its checkpoint's step), unlike the checkpoints' pointer, whose damage the user must see."""
    try:
        return read_pointer(root / "latest") or 0
    except CheckpointPointerError as e:
        logger.warning("%s; taken as no version (versions are published again)", e)
        return 0


def write_version_pointer(root: Path, version: int) -> None:
    """Point ``state_dict/latest`` at ``version``: atomic, not durable (see ``version_pointer_or_0``)."""
    write_pointer(root / "latest", version, durable=False)


def prune_versions(root: Path, keep: int, latest: int) -> None:
    """Keep the newest ``keep`` complete versions under ``root``; delete older ones, and incomplete folders
    older than ``latest`` (left by a writer that died)."""
    complete, partial = [], []
    for d in root.glob("version-*"):
        v = version_of(d)
        if v is not None:
            (complete if (d / MANIFEST).is_file() or d.is_file() else partial).append((v, d))
    complete.sort()
    for _, d in complete[:-keep] + [(v, d) for v, d in partial if v < latest]:
        if d.is_dir():
            shutil.rmtree(d, ignore_errors=True)
        else:
            d.unlink(missing_ok=True)


def complete_version(root: Path, version: int, parts: list[dict], keep: int, prune: bool = True) -> Path:
    """Make a version visible: its manifest, then the ``latest`` pointer, then (``prune``) the pruning of older
    versions. Returns its folder."""
    vdir = version_dir(root, version)
    write_manifest(vdir, version, parts)
    if version >= version_pointer_or_0(root):
        write_version_pointer(root, version)
    if prune:
        prune_versions(root, keep, version)
    return vdir
