"""Weight sync: each method of the synchronizer against the bare operation it is built on, same bytes, same run.

Two weight sets: the tiny model's and a ~100M-parameter Qwen2-shaped state dict (random weights, float32,
~0.4 GB; ``--large-hidden``/``--large-layers`` change it). For each:

- checkpoint: trainer side ``write_part`` (safetensors bytes written with the tensors' fingerprints taken
  meanwhile, atomic write: temp file and rename, no fsync, since a version is not the durable copy) by one
  writer, ``complete_version`` (manifest, pointer; the pruning of older versions follows the timed part, as the
  CheckpointMonitor prunes after it announced the version), then the explorer side ``read_weights`` (map, parse,
  size and fingerprint check of the loaded tensors). Raw: a bare ``safetensors.torch.save_file`` + ``load_file``
  of the same tensors (no fsync, no checks; the two newest files kept, as the versions are). ``vs_raw`` = our
  seconds / raw seconds (target <= 1.5). ``load_file`` maps the file and reads none of it, while ours reads every
  byte to check it; ``vs_raw_into_weights`` times both up to the loaded tensors copied into an engine's weights.
- broadcast (gloo on this CPU machine): the trainer's ``WeightBroadcaster`` and ``--receivers`` engines as Ray
  actors, each running the engine's ``WeightReceiver`` inside a Synchronizer round; timed is the transfer
  as the broadcaster records it (group reused from a warm-up round, all slices of ``--bucket-mb``, from the
  moment the round is fixed, so the receivers' arrival is included), after the snapshot copy, which is
  reported on its own. Raw: one ``broadcast`` of a single flat tensor of the same bytes in a bare gloo group
  among the same processes, timed on the sender with every receiver already waiting (its best case). ``vs_raw`` = our bandwidth / raw bandwidth (target
  >= 0.8). The baseline design, one broadcast per parameter, is timed too.
- memory: ``ray.put`` of the state dict and ``ray.get`` in each receiver actor (no raw counterpart).
- ipc: the trainer's ``SharedWeights.publish`` (pack into a shared buffer: a /dev/shm file on the CPU, GPU memory
  exported as a CUDA IPC handle with ``--device cuda``), then each receiver actor maps it (``open_shared``) and
  copies every tensor into its own weights, as an engine does. Raw: a bare copy of the same bytes from one buffer
  to another on the same device, in the receiver. ``vs_copy`` = raw seconds / (publish + receive) seconds, the
  whole delivery to an engine (target >= 0.5: two copies against one); ``vs_copy_receive`` counts the engine's
  side only.

gbps is gigabytes per second (1e9 B/s) of weights delivered to one receiver. Medians of ``--repeats``.

    .venv/bin/python bench/sync.py [--receivers 2] [--bucket-mb 64] [--repeats 3] [--skip-large]
        [--methods checkpoint,broadcast,memory,ipc,fingerprint] [--device cpu|cuda]

``--smoke`` (``.venv/bin/python bench/sync.py --smoke``) runs the same code path on small sizes in seconds;
``make test`` runs it and checks its ``RESULT`` lines (tests/bench/test_smoke.py).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import tempfile
import time
from pathlib import Path

import ray
import torch
import torch.distributed as dist
from benchlib import add_smoke

RESULT_FIELDS = {"sync": ("model", "method", "seconds", "gbps")}
"""Fields every ``RESULT sync`` line holds (bench/benchlib.py): one line per model and method, each with more
fields of its own (vs_raw, the ipc split, ...)."""


def qwen2_like(hidden: int, layers: int, vocab: int, inter: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    sd = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=g), "model.norm.weight": torch.ones(hidden)}
    kv = hidden // 4
    for i in range(layers):
        p = f"model.layers.{i}."
        for name, shape in (("self_attn.q_proj.weight", (hidden, hidden)), ("self_attn.k_proj.weight", (kv, hidden)),
                            ("self_attn.v_proj.weight", (kv, hidden)), ("self_attn.o_proj.weight", (hidden, hidden)),
                            ("mlp.gate_proj.weight", (inter, hidden)), ("mlp.up_proj.weight", (inter, hidden)),
                            ("mlp.down_proj.weight", (hidden, inter))):
            sd[p + name] = torch.randn(*shape, generator=g) * 0.02
        for name, n in (("self_attn.q_proj.bias", hidden), ("self_attn.k_proj.bias", kv), ("self_attn.v_proj.bias", kv)):
            sd[p + name] = torch.zeros(n)
        sd[p + "input_layernorm.weight"] = torch.ones(hidden)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(hidden)
    return sd


def nbytes(sd: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in sd.values())


# ------------------------------------------------------------------ checkpoint
def bench_checkpoint(sd: dict[str, torch.Tensor], folder: Path, repeats: int) -> dict[str, float]:
    from safetensors.torch import load_file, save_file

    from trinity_like.weights.files import complete_version, prune_versions, read_weights, write_part

    weights = {k: torch.empty_like(v) for k, v in sd.items()}  # an engine's own weights, filled from what it loaded

    def into_weights(loaded: dict[str, torch.Tensor]) -> None:
        for k, t in weights.items():
            t.copy_(loaded[k])

    out: dict[str, list[float]] = {"ours": [], "raw": [], "ours_into": [], "raw_into": []}
    for r in range(-2, repeats):  # rounds -2 and -1 untimed: until two files of each kind are kept, the kernel
        # hands out fresh pages (0.3-0.4 s a write here), later it reuses those of the files deleted
        for order in ((0, 1) if r % 2 == 0 else (1, 0)):
            start = time.perf_counter()
            if order == 0:
                part = write_part(folder / f"version-{r + 3:08d}", 0, 1, sd)
                vdir = complete_version(folder, r + 3, [part], keep=2, prune=False)
                loaded, _ = read_weights(vdir)
                out["ours"].append(time.perf_counter() - start)
                into_weights(loaded)
                out["ours_into"].append(time.perf_counter() - start)
                prune_versions(folder, 2, r + 3)  # as the CheckpointMonitor does: after the version is announced
            else:
                path = folder / f"raw-{r}.safetensors"
                save_file(sd, str(path))
                loaded = load_file(str(path))
                out["raw"].append(time.perf_counter() - start)
                into_weights(loaded)
                out["raw_into"].append(time.perf_counter() - start)
                (folder / f"raw-{r - 2}.safetensors").unlink(missing_ok=True)  # two kept, like the versions
            assert len(loaded) == len(sd)
    for path in folder.glob("raw-*"):
        path.unlink()
    return {k: statistics.median(v[2:]) for k, v in out.items()}


def bench_fingerprint(sd: dict[str, torch.Tensor], device: str, repeats: int) -> dict[str, float]:
    """One version's fingerprint where ``device`` holds the weights, in each scheme: ``s1`` (two integer
    reductions on the device; what a trainer on a GPU publishes) and ``crc`` (a copy to the host and zlib's
    CRC-32; what a trainer on the CPU publishes, and every fingerprint did before ``s1``)."""
    from trinity_like.weights.fingerprint import combine_fingerprints, tensor_fingerprints

    on = {k: v.to(device) for k, v in sd.items()}
    out = {}
    for scheme in ("s1", "crc"):
        run = lambda scheme=scheme: combine_fingerprints(tensor_fingerprints(on, scheme=scheme))  # noqa: E731
        run()  # warm-up (kernels, page faults)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        out[scheme] = statistics.median(times)
    return out


# ------------------------------------------------------------------ broadcast (gloo) and memory
@ray.remote(num_cpus=0)
class Receiver:
    def __init__(self, namespace: str, key: str) -> None:
        from trinity_like.weights.broadcast import WeightReceiver

        self.namespace, self.key = namespace, key
        self.receiver = WeightReceiver(timeout_s=300)

    def round(self, min_version: int) -> float:
        from trinity_like.weights.messages import SYNCHRONIZER_NAME
        sync = ray.get_actor(SYNCHRONIZER_NAME, namespace=self.namespace)
        spec = ray.get(sync.collective_ready.remote(self.key, min_version, 300))
        start = time.perf_counter()
        _, size = self.receiver.receive(spec, device="cpu")
        return time.perf_counter() - start

    def join_raw(self, addr: str, port: int, rank: int, world: int) -> None:
        store = dist.TCPStore(addr, port, is_master=False, timeout=datetime.timedelta(seconds=300))
        self.raw = dist.ProcessGroupGloo(dist.PrefixStore("raw", store), rank, world, datetime.timedelta(seconds=300))

    def raw_flat(self, size: int) -> None:
        buf = torch.empty(size, dtype=torch.uint8)
        self.raw.broadcast(buf, 0).wait()

    def raw_per_param(self, shapes: list[tuple[int, ...]]) -> None:
        for shape in shapes:
            self.raw.broadcast(torch.empty(shape), 0).wait()

    def memory(self, refs: list) -> int:
        sd = ray.get(refs[0])
        return len(sd)


def bench_broadcast(sd, receivers: int, bucket_mb: float, repeats: int, namespace: str) -> dict[str, float]:
    from trinity_like.synchronizer import get_synchronizer
    from trinity_like.weights.broadcast import WeightBroadcaster

    sync = get_synchronizer(namespace)
    broadcaster = WeightBroadcaster(sync, bucket_mb, timeout_s=300)
    actors = [Receiver.remote(namespace, f"engine-{i}") for i in range(receivers)]
    # the bare group among the same processes
    raw_store = dist.TCPStore(broadcaster.addr, 0, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=300))
    joins = [a.join_raw.remote(broadcaster.addr, raw_store.port, i + 1, receivers + 1) for i, a in enumerate(actors)]
    raw_pg = dist.ProcessGroupGloo(dist.PrefixStore("raw", raw_store), 0, receivers + 1, datetime.timedelta(seconds=300))
    ray.get(joins)
    size = nbytes(sd)
    flat = torch.empty(size, dtype=torch.uint8)
    names = sorted(sd)
    out: dict[str, list[float]] = {"ours": [], "raw": [], "per_param": [], "snapshot": [], "round": [], "memory": []}
    try:
        for r in range(repeats + 1):  # round 0 forms the group (a new generation): warm-up, not timed
            start = time.perf_counter()
            broadcaster.offer(r + 1, sd)
            snapshot = time.perf_counter() - start
            start = time.perf_counter()
            ray.get([a.round.remote(r + 1) for a in actors])
            round_s = time.perf_counter() - start
            # the receivers can return before the sending thread has recorded its round
            deadline = time.monotonic() + 60
            while broadcaster.rounds + broadcaster.failures < r + 1 and time.monotonic() < deadline:
                time.sleep(0.001)
            if broadcaster.last_round.get("sync/version") != r + 1:
                raise RuntimeError(f"round {r + 1} was not recorded by the broadcaster ({broadcaster.failures} failed)")
            ours = broadcaster.last_round["sync/seconds"]
            # raw: the receivers are already waiting in the broadcast when the sender starts (best case)
            works = [a.raw_flat.remote(size) for a in actors]
            time.sleep(0.3)
            start = time.perf_counter()
            raw_pg.broadcast(flat, 0).wait()
            raw = time.perf_counter() - start
            ray.get(works)
            works = [a.raw_per_param.remote([tuple(sd[n].shape) for n in names]) for a in actors]
            time.sleep(0.3)
            start = time.perf_counter()
            for n in names:
                raw_pg.broadcast(sd[n], 0).wait()
            per_param = time.perf_counter() - start
            ray.get(works)
            start = time.perf_counter()
            ref = ray.put(sd)
            ray.get([a.memory.remote([ref]) for a in actors])
            memory = time.perf_counter() - start
            del ref
            if r == 0:
                continue
            for key, value in (("ours", ours), ("raw", raw), ("per_param", per_param), ("snapshot", snapshot),
                               ("round", round_s), ("memory", memory)):
                out[key].append(value)
        assert broadcaster.failures == 0
    finally:
        broadcaster.close()
        for a in actors:
            ray.kill(a)
        ray.kill(sync)
    return {k: statistics.median(v) for k, v in out.items()}


# ------------------------------------------------------------------ ipc
@ray.remote(num_cpus=0)
class Mapper:
    """An engine's side of method ipc: its own copy of the weights, filled from the trainer's shared buffer."""

    def __init__(self, sd_shapes: dict, device: str) -> None:
        torch.set_num_threads(1)
        self.device = torch.device(device, torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
        self.own = {k: torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
                    for k, (shape, dtype) in sd_shapes.items()}

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def receive(self, handle) -> float:
        from trinity_like.weights.shared import open_shared

        self._sync()
        start = time.perf_counter()
        mapped = open_shared(handle)
        for k, t in mapped.items():
            self.own[k].copy_(t)
        self._sync()
        seconds = time.perf_counter() - start
        del mapped
        return seconds

    def raw_copy(self, size: int) -> float:
        """A bare copy of ``size`` bytes between two buffers on this device (after a warm-up copy)."""
        src = torch.ones(size, dtype=torch.uint8, device=self.device)
        dst = torch.empty_like(src)
        dst.copy_(src)
        self._sync()
        start = time.perf_counter()
        dst.copy_(src)
        self._sync()
        return time.perf_counter() - start


def bench_ipc(sd, receivers: int, repeats: int, device: str) -> dict[str, float]:
    from trinity_like.weights.shared import SharedWeights

    if device == "cuda":
        sd = {k: v.cuda() for k, v in sd.items()}
    shapes = {k: (tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in sd.items()}
    gpu_share = 0.9 / receivers if device == "cuda" else 0
    actors = [Mapper.options(num_gpus=gpu_share).remote(shapes, device) for _ in range(receivers)]
    shared = SharedWeights(f"bench-sync-{os.getpid()}", keep=2)
    out: dict[str, list[float]] = {"publish": [], "receive": [], "raw": []}
    try:
        for r in range(repeats + 1):  # round 0 maps and touches everything once: warm-up, not timed
            start = time.perf_counter()
            handle = shared.publish(r + 1, sd)
            publish = time.perf_counter() - start
            receive = max(ray.get([a.receive.remote(handle) for a in actors]))
            raw = statistics.median(ray.get([a.raw_copy.remote(handle.size) for a in actors]))
            assert handle.kind == ("cuda" if device == "cuda" else "shm")
            if r:
                out["publish"].append(publish)
                out["receive"].append(receive)
                out["raw"].append(raw)
    finally:
        shared.close()
        for a in actors:
            ray.kill(a)
    return {k: statistics.median(v) for k, v in out.items()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--receivers", type=int, default=2)
    parser.add_argument("--bucket-mb", type=float, default=64.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--large-hidden", type=int, default=768)
    parser.add_argument("--large-layers", type=int, default=12)
    parser.add_argument("--skip-large", action="store_true")
    parser.add_argument("--methods", default="checkpoint,broadcast,memory,ipc,fingerprint",
                        help="comma-separated subset of checkpoint,broadcast,memory,ipc,fingerprint (broadcast and memory run "
                             "together; fingerprint: one version's fingerprint where --device holds it)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where method ipc keeps the trainer's buffer and the engines' weights")
    add_smoke(parser, "the tiny model only, one timed round of each method")
    args = parser.parse_args(argv)
    if args.smoke:
        args.skip_large, args.repeats = True, 1
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    methods = set(args.methods.split(","))

    from trinity_like.common.modeling import export_state_dict, load_causal_lm
    from trinity_like.common.tiny_model import make_tiny_model

    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    sets, lines = [], []
    with tempfile.TemporaryDirectory() as tmp:
        sets.append(("tiny", export_state_dict(load_causal_lm(str(make_tiny_model(Path(tmp) / "tiny", seed=0))))))
        if not args.skip_large:
            sets.append(("100m", qwen2_like(args.large_hidden, args.large_layers, vocab=32000, inter=2048)))
        for name, sd in sets:
            size = nbytes(sd)
            params = sum(t.numel() for t in sd.values())
            gb = size / 1e9
            print(f"{name}: {params / 1e6:.1f}M params, {size / 2**20:.1f} MiB")
            if "checkpoint" in methods:
                ck = bench_checkpoint(sd, Path(tmp) / f"ck-{name}", args.repeats)
                print(f"  checkpoint  ours {ck['ours']:.3f}s  raw save+load {ck['raw']:.3f}s  into an engine's weights: "
                      f"ours {ck['ours_into']:.3f}s  raw {ck['raw_into']:.3f}s")
                lines.append(f"RESULT sync model={name} method=checkpoint seconds={ck['ours']:.4f} "
                             f"gbps={gb / ck['ours']:.3f} vs_raw={ck['ours'] / ck['raw']:.3f} "
                             f"into_weights_seconds={ck['ours_into']:.4f} "
                             f"vs_raw_into_weights={ck['ours_into'] / ck['raw_into']:.3f}")
            if methods & {"broadcast", "memory"}:
                bc = bench_broadcast(sd, args.receivers, args.bucket_mb, args.repeats,
                                     f"bench-sync-{name}-{os.getpid()}")
                print(f"  broadcast(gloo)  transfer {bc['ours']:.3f}s  raw flat broadcast {bc['raw']:.3f}s  "
                      f"one-param-at-a-time {bc['per_param']:.3f}s  snapshot copy {bc['snapshot']:.3f}s  whole "
                      f"round from ready {bc['round']:.3f}s")
                print(f"  memory      put + get in {args.receivers} actors {bc['memory']:.3f}s")
                lines.append(f"RESULT sync model={name} method=broadcast seconds={bc['ours']:.4f} "
                             f"gbps={gb / bc['ours']:.3f} vs_raw={bc['raw'] / bc['ours']:.3f} "
                             f"per_param_seconds={bc['per_param']:.4f} vs_per_param={bc['per_param'] / bc['ours']:.2f} "
                             f"snapshot_seconds={bc['snapshot']:.4f} round_seconds={bc['round']:.4f}")
                lines.append(f"RESULT sync model={name} method=memory seconds={bc['memory']:.4f} "
                             f"gbps={gb / bc['memory']:.3f}")
            if "ipc" in methods:
                ipc = bench_ipc(sd, args.receivers, args.repeats, args.device)
                whole = ipc["publish"] + ipc["receive"]
                print(f"  ipc({args.device})    publish {ipc['publish']:.3f}s  map + copy in {args.receivers} "
                      f"receivers {ipc['receive']:.3f}s  bare copy {ipc['raw']:.3f}s")
                lines.append(f"RESULT sync model={name} method=ipc device={args.device} seconds={whole:.4f} "
                             f"gbps={gb / whole:.3f} publish_seconds={ipc['publish']:.4f} "
                             f"receive_seconds={ipc['receive']:.4f} copy_seconds={ipc['raw']:.4f} "
                             f"vs_copy={ipc['raw'] / whole:.3f} vs_copy_receive={ipc['raw'] / ipc['receive']:.3f}")
            if "fingerprint" in methods:
                fp = bench_fingerprint(sd, args.device, args.repeats)
                print(f"  fingerprint({args.device})  s1 {fp['s1']:.3f}s  crc (host copy + zlib) {fp['crc']:.3f}s")
                lines.append(f"RESULT sync model={name} method=fingerprint device={args.device} "
                             f"seconds={fp['s1']:.4f} gbps={gb / fp['s1']:.3f} s_per_gb={fp['s1'] / gb:.4f} "
                             f"crc_seconds={fp['crc']:.4f} vs_crc={fp['crc'] / fp['s1']:.2f}")
    ray.shutdown()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
