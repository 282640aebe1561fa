"""Data-parallel training workers and their placement (the shape of verl's ResourcePoolManager and
RayWorkerGroup).

- ``ResourcePoolManager`` turns named pools (``{"actor": [2, 2]}``: 2 workers on each of 2 nodes) into Ray
  placement groups of one bundle per worker (CPUs, and ``gpus_per_worker`` GPUs, a fraction allowed), packed
  onto few nodes or spread over them, and maps roles to pools; several roles may share a pool (colocation).
- ``RayWorkerGroup`` starts one actor per bundle of a pool and calls a method on all of them, gathering the
  results in rank order.
- ``TrainWorker`` holds one replica of the PPO trainer in a ``torch.distributed`` group (NCCL when every worker
  holds a whole GPU, gloo otherwise: ``trainer.device.dist_backend``) with the policy (and critic) under DDP or FSDP2 (``trainer.strategy``). Every worker receives the whole batch
  and computes the same advantages and weights; each trains on its shard (rows ``rank::world``) of every
  mini-batch, and the loss weights use the whole mini-batch's normaliser times the world size, so the
  averaged gradient equals the single-process one (tested: 1 vs 2 workers agree within 1e-5, both strategies).
  Actor, critic and reference model are colocated in each worker (verl's colocated default); the pool
  manager maps roles to pools, and the trainer places all three in the ``actor`` pool.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

from trinity_like.common.errors import UserError
from trinity_like.config import Config
from trinity_like.trainer.engine import TrainEngineWrapper

logger = logging.getLogger(__name__)


class ResourcePoolManager:
    """Named pools of worker slots as Ray placement groups; roles map to pools (colocation allowed)."""

    def __init__(self, resource_pool_spec: dict[str, list[int]], mapping: dict[str, str] | None = None,
                 cpus_per_worker: float = 1.0, gpus_per_worker: float = 0.0, placement: str = "pack",
                 timeout_s: float = 120.0, node=None) -> None:
        """``node``: a ``NodeConfig`` whose custom resources and labels every bundle asks for (None: any node)."""
        self.spec = resource_pool_spec
        self.mapping = mapping or {}
        self.cpus_per_worker, self.gpus_per_worker = cpus_per_worker, gpus_per_worker
        self.placement, self.timeout_s = placement, timeout_s
        self.node = node
        self._groups: dict[str, Any] = {}

    def create_resource_pools(self) -> None:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        from trinity_like.common.placement import bundle_label_selector
        from trinity_like.config import NodeConfig

        node = self.node or NodeConfig()
        for name, per_node in self.spec.items():
            bundle = {"CPU": self.cpus_per_worker, **({"GPU": self.gpus_per_worker} if self.gpus_per_worker else {}),
                      **node.resources}
            n = sum(per_node)
            pg = placement_group([dict(bundle) for _ in range(n)],
                                 strategy="SPREAD" if len(per_node) > 1 or self.placement == "spread" else "PACK",
                                 bundle_label_selector=bundle_label_selector(node, n))
            try:
                ray.get(pg.ready(), timeout=self.timeout_s)
            except ray.exceptions.GetTimeoutError:
                remove_placement_group(pg)
                raise UserError(f"Ray could not place {sum(per_node)} trainer workers of {bundle} within "
                                f"{self.timeout_s:.0f}s: the cluster lacks those resources (`ray status` shows "
                                "them); lower trainer.num_workers or trainer.gpus_per_worker, or add nodes") from None
            self._groups[name] = pg

    def get_resource_pool(self, role: str):
        return self._groups[self.mapping.get(role, role)]

    def num_workers(self, role: str) -> int:
        return sum(self.spec[self.mapping.get(role, role)])

    def remove(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for pg in self._groups.values():
            remove_placement_group(pg)
        self._groups.clear()


class RayWorkerGroup:
    """``num_workers`` actors of ``worker_cls``, one per bundle of ``pool`` (each taking ``num_gpus`` of its
    bundle's GPUs, so Ray shows it that GPU); ``execute_all`` calls a method on every worker and returns the
    results in rank order."""

    def __init__(self, worker_cls: type, num_workers: int, pool=None, *args: Any, num_gpus: float = 0.0) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        remote_cls = ray.remote(worker_cls)
        self.workers = []
        for rank in range(num_workers):
            options: dict[str, Any] = {"num_cpus": 0, "num_gpus": num_gpus}
            if pool is not None:
                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    placement_group=pool, placement_group_bundle_index=rank)
            self.workers.append(remote_cls.options(**options).remote(*args, rank, num_workers))

    def execute_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        import ray

        return ray.get([getattr(w, method).remote(*args, **kwargs) for w in self.workers])

    def execute_rank_zero(self, method: str, *args: Any, **kwargs: Any) -> Any:
        import ray

        return ray.get(getattr(self.workers[0], method).remote(*args, **kwargs))

    def kill(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)


def free_port() -> int:
    """A TCP port free on every interface of this node."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class TrainWorker:
    """One data-parallel replica of the trainer."""

    def __init__(self, cfg: Config, synchronizer, rank: int, world_size: int) -> None:
        from trinity_like.common.offline import set_offline_env

        set_offline_env()
        self.cfg, self.synchronizer, self.rank, self.world_size = cfg, synchronizer, rank, world_size

    def rendezvous(self) -> tuple[str, int]:
        """The address and a free port of this worker's node, where the process group meets (rank 0's)."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def setup(self, master_addr: str, master_port: int) -> None:
        import torch.distributed as dist

        from trinity_like.trainer.device import dist_backend, resolve_device
        from trinity_like.trainer.engine import TRAINERS
        from trinity_like.trainer.ppo import PPOTrainer  # noqa: F401  (registers trainer.type ppo)

        tr = self.cfg.trainer
        backend = dist_backend(resolve_device(tr.device), tr.gpus_per_worker)
        dist.init_process_group(backend, init_method=f"tcp://{master_addr}:{master_port}", rank=self.rank,
                                world_size=self.world_size)
        self.engine = TRAINERS.get(self.cfg.trainer.type)(self.cfg, self.synchronizer)
        self.engine.prepare()
        self.engine.enable_data_parallel(self.rank, self.world_size)

    def train_step(self, batch_exps):
        return self.engine.train_step(batch_exps)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Any method of the trainer engine (rank 0 writes checkpoints and publishes weights)."""
        return getattr(self.engine, method)(*args, **kwargs)

    def step_num(self) -> int:
        return self.engine.train_step_num

    def device(self) -> str:
        return str(self.engine.device)

    def state_dict(self) -> dict:
        return self.engine.policy_state_dict()


def start_train_workers(cfg: Config, synchronizer=None) -> RayWorkerGroup:
    """``trainer.num_workers`` TrainWorkers in one placement-group pool, joined in one process group."""
    tr = cfg.trainer
    pools = ResourcePoolManager({"actor": [tr.num_workers]}, cpus_per_worker=0.001, gpus_per_worker=tr.gpus_per_worker,
                                placement=tr.placement, timeout_s=cfg.synchronizer.timeout_s, node=tr.node)
    pools.create_resource_pools()
    group = RayWorkerGroup(TrainWorker, tr.num_workers, pools.get_resource_pool("actor"), cfg, synchronizer,
                           num_gpus=tr.gpus_per_worker)
    group.pools = pools
    master, port = group.execute_rank_zero("rendezvous")  # rank 0's node, wherever the trainer role runs
    group.execute_all("setup", master, port)
    return group


class DataParallelTrainer(TrainEngineWrapper):
    """A TrainEngineWrapper over ``trainer.num_workers`` TrainWorkers, each holding the engine ``trainer.type``
    names: every call goes to all of them and rank 0's answer is returned. Weights out and checkpoints too:
    under FSDP2 assembling full tensors is a collective, and rank 0 writes (under DDP the other ranks return
    at once)."""

    def __init__(self, cfg: Config, synchronizer=None) -> None:
        self.cfg, self.synchronizer = cfg, synchronizer
        self._step = 0

    def prepare(self) -> None:
        self.group = start_train_workers(self.cfg, self.synchronizer)
        self.device = self.group.execute_rank_zero("device")
        """Rank 0's device (every worker resolves ``trainer.device`` in its own process)."""

    @property
    def train_step_num(self) -> int:
        return self._step

    def train_step(self, batch_exps) -> dict[str, float]:
        metrics = self.group.execute_all("train_step", batch_exps)[0]
        self._step += 1
        return metrics

    def save_checkpoint(self):
        return self.group.execute_all("call", "save_checkpoint")[0]

    def load_checkpoint(self, path):
        self.group.execute_all("call", "load_checkpoint", path)
        self._step = self.group.execute_rank_zero("step_num")

    def save_state_dict(self):
        return self.group.execute_all("call", "save_state_dict")[0]

    def upload_state_dict(self):
        return self.group.execute_all("call", "upload_state_dict")[0]

    def sync_weight(self) -> dict[str, float]:
        """Every rank publishes (rank 0's metrics come back); when each rank writes a part of the files, the
        bytes written are the sum over ranks."""
        from trinity_like.weights.publish import PUBLISHERS

        results = self.group.execute_all("call", "sync_weight")
        if not PUBLISHERS.get(self.cfg.synchronizer.method).writes_files:
            return results[0]
        return {**results[0], "sync/bytes": sum(r.get("sync/bytes", 0.0) for r in results)}

    def shutdown(self) -> None:
        """Let every rank stop what its publisher started (a broadcaster thread, shared-memory buffers), for at
        most 30 s (a rank may be dead already), then end the workers."""
        import ray

        try:
            ray.get([w.call.remote("shutdown") for w in self.group.workers], timeout=30)
        except Exception as e:  # a dead or hung rank: its process is killed below, its buffers go with the run
            logger.warning("trainer workers did not shut down cleanly: %s", type(e).__name__)
        self.group.kill()
        self.group.pools.remove()
