"""``trinity-like serve``: the recording endpoint as a role of a run.

The server joins the run like an explorer job does (same run directory, config check, Ray namespace
``<project>/<name>``), registers with the Synchronizer as a ``server`` role (shown by ``status``), starts the
explorer's engines (``EngineFleet``: ``hf`` on CPU, ``vllm`` on GPU) and follows the published policy: a
background task waits for each new version and loads it into the engines between requests (an engine never
answers from half-loaded weights), so the version in each answer rises as the trainer publishes.

Committed experiences go straight into the run's buffer folder (``source: agent``), where a trainer job of
the same run reads them like explorer rows (``buffer.mix`` sets their share of each batch).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import signal
import socket
import time
from typing import Any

from trinity_like.common.errors import UserError
from trinity_like.common.logs import RateLimitedLog
from trinity_like.config import Config
from trinity_like.runtime.paths import RunPaths, namespace_of, read_run_id

logger = logging.getLogger(__name__)

API_KEY_ENV = "TRINITY_SERVE_API_KEY"
POLL_S = 1.0
"""How often the server asks the Synchronizer for a newer policy version."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, api_key: str) -> None:
    """Serving beyond this machine without a key would let anyone write training data into the run."""
    if not is_loopback(host) and not api_key:
        raise UserError(f"refusing to serve on {host} without an API key: anyone who reaches it could add "
                        f"training data; pass --api-key KEY (or set {API_KEY_ENV}), or serve on 127.0.0.1")


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything slow starts, so a taken port fails at once and clearly."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno in (98, 48):  # EADDRINUSE (Linux, macOS)
            raise UserError(f"port {port} on {host} is in use; pick another with --port (0 = any free port)") from None
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


class FleetBackend:
    """The app's backend: an ``EngineFleet`` plus a task that loads every version the trainer publishes."""

    def __init__(self, cfg: Config, synchronizer, tokenizer) -> None:
        from trinity_like.explorer.fleet import EngineFleet

        self.cfg, self.synchronizer, self.tokenizer = cfg, synchronizer, tokenizer
        self.fleet = EngineFleet(cfg)
        self._follow: asyncio.Task | None = None
        self.load_error: str | None = None
        """Why the newest published version could not be loaded (None while the newest one serves): ``/health``
        reports it."""
        self._log = RateLimitedLog(logger)

    @property
    def version(self) -> int:
        return self.fleet.version

    async def start(self) -> None:
        await self.fleet.ready()
        info = await self.synchronizer.latest.remote()
        if info.version > 0:
            await self.fleet.update_weights(info)
        self._follow = asyncio.get_running_loop().create_task(self._follow_versions())

    async def _follow_versions(self) -> None:
        """Load each newer published version; a version that fails to load is retried every poll while the
        previous one keeps serving, logged when it first fails (then at most once a minute) and reported by
        ``/health`` until a load succeeds."""
        while True:
            try:
                # polled rather than waited for: a finished trainer is normal here (another job may resume it)
                info = await self.synchronizer.latest.remote()
                if info.version > self.fleet.version:
                    await self.fleet.update_weights(info)
                    logger.info("serving version %d", info.version)
                if self.load_error is not None:
                    logger.info("weight loading recovered: serving version %d", self.fleet.version)
                    self.load_error = None
                    self._log.forget("load")
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a damaged version file, a restarting synchronizer: keep serving
                first = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
                self.load_error = f"could not load the newest policy version (serving version {self.fleet.version}): {first}"
                self._log.log(logging.ERROR, "load", "%s", self.load_error)
            await asyncio.sleep(POLL_S)

    async def generate(self, input_ids: list[int], sampling, seed: int):
        return (await self.fleet.generate([input_ids], sampling, [seed]))[0]

    def engines(self) -> list[tuple[str, int]]:
        """(engine id, version it holds) of each engine, in order (``/metrics``: Trinity's ``model_<i>``)."""
        return [(f"{self.cfg.explorer.engine}-{s.index}", s.version) for s in self.fleet.slots]

    async def stop(self) -> None:
        if self._follow is not None:
            self._follow.cancel()
        self.fleet.kill()


def make_commit(paths: RunPaths):
    """Records -> one buffer segment (source agent), written in a worker thread; returns the segment name."""
    from trinity_like.buffer import BufferWriter

    writer = BufferWriter(paths.buffer_dir, writer_id="serve")

    async def commit(records) -> str:
        exps = [r.to_experience() for r in records]
        info = await asyncio.to_thread(writer.write, exps)
        return info.name

    return commit


def committed_segments(paths: RunPaths) -> int:
    """Segments the run's servers committed into its buffer (their writer id starts with ``serve``)."""
    from trinity_like.buffer.segments import list_segments

    return sum(s.name.split("-", 1)[1].startswith("serve-") for s in list_segments(paths.buffer_dir))


def build_state(cfg: Config, backend, paths: RunPaths, api_key: str):
    from trinity_like.buffer.segments import stored_eids
    from trinity_like.serve.app import Counters, ServeState
    from trinity_like.serve.records import PendingStore

    store = PendingStore(paths.run_dir / "serve" / "pending", stored_eids(paths.buffer_dir))
    return ServeState(cfg=cfg.serve, backend=backend, store=store,
                      model_name=cfg.serve.model_name or namespace_of(cfg), default_sampling=cfg.explorer.sampling,
                      commit=make_commit(paths), api_key=api_key, counters=Counters(commits=committed_segments(paths)))


def _uvicorn_server(app):
    import contextlib

    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):  # the serve command handles SIGINT/SIGTERM itself, to end its role cleanly
            yield

    return Server(uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=5))


async def serve_async(cfg: Config, sock: socket.socket, api_key: str, ready: Any = None,
                      stop: asyncio.Event | None = None) -> None:
    """Run the endpoint on ``sock`` until ``stop`` is set (or the task is cancelled); ``ready(url)`` is called
    once it answers. Requests in flight finish (up to 5 s) before the engines stop."""

    from trinity_like.common.tokenizer import hf_tokenizer
    from trinity_like.serve.app import build_app
    from trinity_like.synchronizer import get_synchronizer
    from trinity_like.synchronizer.synchronizer import Heartbeat

    paths = RunPaths.of(cfg)
    sync = get_synchronizer(namespace_of(cfg), cfg.synchronizer.heartbeat_timeout_s, run_id=read_run_id(paths),
                            run_dir=str(paths.run_dir))
    role_id = f"server-{socket.gethostname()}-{os.getpid()}"
    await sync.register.remote("server", role_id, {"run_dir": str(paths.run_dir), "engines": cfg.explorer.num_engines})
    backend = FleetBackend(cfg, sync, hf_tokenizer(cfg.model.path))
    heartbeat = Heartbeat(sync, role_id, lambda: {"version": backend.version, "state": "running"}).start()
    reason = "finished"
    try:
        await backend.start()
        app = build_app(build_state(cfg, backend, paths, api_key))
        server = _uvicorn_server(app)
        host, port = sock.getsockname()[:2]
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if ready is not None and server.started:
            ready(f"http://{host}:{port}/v1")
        stop = stop or asyncio.Event()
        stopper = asyncio.get_running_loop().create_task(stop.wait())
        try:
            await asyncio.wait([task, stopper], return_when=asyncio.FIRST_COMPLETED)
        finally:
            server.should_exit = True
            stopper.cancel()
            await asyncio.shield(task)
        reason = "stopped" if stop.is_set() else "finished"
    except BaseException as e:
        reason = "stopped" if isinstance(e, (asyncio.CancelledError, KeyboardInterrupt)) else f"failed: {e}"
        raise
    finally:
        heartbeat.stop()
        await backend.stop()
        try:
            await sync.mark_ended.remote("server", reason, role_id)
        except Exception as e:  # the synchronizer may be gone already
            logger.warning("could not report the server's end: %s", type(e).__name__)


def serve(cfg: Config, host: str | None = None, port: int | None = None, api_key: str | None = None,
          address: str | None = None) -> int:
    """``trinity-like serve``: check exposure, bind the port, join the run, serve until SIGINT/SIGTERM."""
    from trinity_like.common.offline import set_offline_env
    from trinity_like.explorer.engines.external import refuse_outside_bench
    from trinity_like.runtime.ray_cluster import check_ray_address, init_ray
    from trinity_like.runtime.run_dir import prepare_run_dir

    refuse_outside_bench(cfg, "serve")  # it records the policy's own tokens and log-probs
    host = host or cfg.serve.host
    port = cfg.serve.port if port is None else port
    api_key = api_key or cfg.serve.api_key or os.environ.get(API_KEY_ENV, "")
    check_exposure(host, api_key)
    sock = bind_socket(host, port)
    set_offline_env()
    check_ray_address(address or os.environ.get("RAY_ADDRESS"))
    prepare_run_dir(cfg, role="serve")
    record = init_ray(cfg, address, role="serve")  # refused when the run's live roles are in another Ray cluster

    def ready(url: str) -> None:
        print(f"serving {cfg.serve.model_name or namespace_of(cfg)} at {url} (recording into "
              f"{RunPaths.of(cfg).run_dir}); stop with Ctrl-C", flush=True)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        start = time.monotonic()
        await serve_async(cfg, sock, api_key, ready, stop)
        print(f"server stopped after {time.monotonic() - start:.0f}s; uncommitted records stay pending in "
              f"{RunPaths.of(cfg).run_dir / 'serve' / 'pending'}", flush=True)

    try:
        asyncio.run(main())
    finally:
        record.close()
    return 0
