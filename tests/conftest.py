"""Shared fixtures: one tiny model and one Ray instance per test session."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# cuBLAS reads its workspace setting when CUDA starts; deterministic tests on a GPU need this one (no effect on CPU)
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
# Tests start the Ray instances they use and never join one they did not start: "local" is Ray's own word for a new
# private instance (ray.init and init_ray read it, in this process and in the processes tests start), so a `ray start`
# cluster on the machine, its address file (/tmp/ray/ray_current_cluster, stale or not) and a RAY_ADDRESS exported
# by the shell change nothing. Tests of a cluster name it (RayCluster.env).
os.environ["RAY_ADDRESS"] = "local"


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> str:
    from trinity_like.common.tiny_model import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0))


@pytest.fixture(scope="session")
def batch_exps(tiny_model_path):
    """12 experiences (4 prompts x 3 samples, one group each) sampled from the tiny model, with rewards."""
    from trinity_like.common.experience import Experience
    from trinity_like.common.tokenizer import hf_tokenizer
    from trinity_like.config import SamplingConfig
    from trinity_like.explorer.engines.hf_engine import HFEngine

    tok = hf_tokenizer(tiny_model_path)
    engine = HFEngine(tiny_model_path, device="cpu")
    prompts = [tok.encode(p) for p in ["1+2=", "3+4=", "5+1=", "2+2="] for _ in range(3)]
    samples = engine.generate(prompts, SamplingConfig(temperature=1.0, max_new_tokens=5), list(range(len(prompts))))
    return [Experience(prompt_ids=p, response_ids=s.response_ids, logprobs=s.logprobs, group_id=f"g{i // 3}",
                       reward=float(i % 3 == 0), model_version=0)
            for i, (p, s) in enumerate(zip(prompts, samples, strict=True))]


@pytest.fixture(scope="session")
def ray_session():
    """A real local Ray instance shared by every test that needs one. It declares one GPU: on a machine without
    one that is a fake (Ray hands it out as a resource, CUDA stays unavailable, so `trainer.device: auto` trains
    on the CPU), which lets tests check that actors ask Ray for GPUs; on a GPU machine it is the real one."""
    ray = start_test_ray()
    yield ray
    ray.shutdown()


def start_test_ray():
    """Start the test session's own Ray instance (``ray_session``): always a new one (``address="local"``),
    whatever cluster or address file the machine has."""
    import ray

    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False,
             namespace="pytest", configure_logging=False)
    return ray


CUSTOM_REWARD = ("def compute_score(responses, ground_truths, **kwargs):\n"
                 "    # reward short responses; fail loudly on an empty one to exercise the failure path\n"
                 "    out = []\n"
                 "    for r in responses:\n"
                 "        if r == '':\n"
                 "            raise ValueError('empty response')\n"
                 "        out.append(1.0 / len(r))\n"
                 "    return out\n")


def e2e_config(tmp_path, model_path, name, *overrides):
    """The config of the end-to-end runs (tests/e2e/test_e2e.py): 3 steps of 2 tasks x 4 samples of up to 4
    tokens, one trainer batch of 8 per step, under ``tmp_path``, project ``e2e``; then ``overrides``."""
    from trinity_like.config import load_config

    return load_config(None, [
        f"checkpoint_root_dir={tmp_path}", "project=e2e", f"name={name}", f"model.path={model_path}",
        "explorer.batch_size=2", "explorer.repeat_times=4", "explorer.sampling.max_new_tokens=4",
        "explorer.taskset.size=16", "explorer.taskset.max_operand=9",
        "trainer.total_steps=3", "trainer.micro_batch_size=3", "trainer.optimizer.lr=0.01", *overrides,
    ])


@pytest.fixture(scope="session")
def async_run(tmp_path_factory, tiny_model_path, ray_session):
    """One async run of 3 steps that several tests read (each run is ~20 worker-seconds of start-up; what they
    assert differs, not the run): bound 1 (the explorer needs a new version within the 3 steps), the decoupled
    correction, a reward function that fails on empty responses (scored ``reward.failure_value``), the `memory`
    synchronizer, and a trainer that asks Ray for half a GPU (a fake one on a machine without one). Tests that
    use it carry ``xdist_group("e2e_async_run")``, so that one xdist worker makes it. Returns (config, summary)."""
    from trinity_like.launcher import run

    tmp_path = tmp_path_factory.mktemp("async-run")
    reward_file = tmp_path / "my_reward.py"
    reward_file.write_text(CUSTOM_REWARD)
    cfg = e2e_config(tmp_path, tiny_model_path, "async", "mode=async", "synchronizer.max_staleness=1",
                     "trainer.gpus_per_worker=0.5", "algorithm.off_policy.correction=decoupled",
                     f"reward.function_path={reward_file}", "reward.failure_value=-1", "synchronizer.method=memory",
                     "reward.max_failure_frac=1")  # failures below the stop (all of a step's samples) are trained
    return cfg, run(cfg)


class RedisServer:
    """A real redis-server on a free loopback port (never 6379, Ray's default), with an append-only file
    fsynced on every write, so that a restart (even after SIGKILL) keeps every acknowledged entry; or, not
    ``persistent``, with no AOF and no RDB, so that a SIGKILL loses everything. ``start`` again after ``kill``
    comes back on the same port."""

    def __init__(self, workdir, host: str = "127.0.0.1", persistent: bool = True) -> None:
        """``host``: the address it listens on; on another than loopback (for roles on other nodes) it asks for
        a password, as a server reachable from the network must (protected mode refuses the others)."""
        import secrets
        import socket

        with socket.socket() as s:
            s.bind((host, 0))
            self.port = s.getsockname()[1]
        self.workdir, self.host, self.persistent = workdir, host, persistent
        self.password = "" if host == "127.0.0.1" else secrets.token_hex(16)
        self.proc = None

    @property
    def url(self) -> str:
        return f"redis://{':' + self.password + '@' if self.password else ''}{self.host}:{self.port}/0"

    def start(self) -> None:
        import subprocess
        import time

        import redis

        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", self.host, "--dir", str(self.workdir),
             "--appendonly", "yes" if self.persistent else "no", "--appendfsync", "always", "--save", "", "--protected-mode", "yes",
             *(["--requirepass", self.password] if self.password else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)
        for _ in range(100):
            try:
                if client.ping():
                    return
            except redis.exceptions.RedisError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def kill(self, sig=9) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=10)

    def restart_later(self, delay_s: float) -> None:
        """Start again after ``delay_s``, off the running event loop (so its clients see a real outage)."""
        import asyncio

        loop = asyncio.get_running_loop()
        loop.call_later(delay_s, lambda: loop.run_in_executor(None, self.start))


@pytest.fixture
def redis_server_at(tmp_path):
    """Starts real redis-servers: ``redis_server_at(host)`` listens on ``host``; all are killed at the end. Skips
    without redis-server installed (fails in CI, whose .ci/run installs it)."""
    import shutil

    if shutil.which("redis-server") is None:
        reason = "redis-server is not installed (apt-get install redis-server); .ci/run installs it"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    servers = []

    def start(host: str = "127.0.0.1", persistent: bool = True) -> RedisServer:
        server = RedisServer(tmp_path / f"redis-{len(servers)}", host=host, persistent=persistent)
        server.workdir.mkdir()
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.kill()


@pytest.fixture
def redis_server(redis_server_at):
    """One real redis-server on loopback."""
    return redis_server_at()


class RayCluster:
    """A real Ray cluster started with `ray start --head` on loopback, with every port chosen free (the
    defaults, e.g. 6379 and the dashboard agent's 52365, may be taken by another instance on the machine)
    and its own temp dir and auth token (Ray 2.60 turns token auth on, and `ray start` finds no token in a
    fresh home: only a local `ray.init()` writes ~/.ray/auth_token); stopped by killing its process group, never by `ray stop` (which would kill every
    Ray instance of the machine, the test session's own included)."""

    def __init__(self, node_ip: str = "127.0.0.1", head_resources: dict[str, float] | None = None) -> None:
        """``node_ip``: the address its nodes take; loopback serves one node only (a node joining at 127.0.0.1
        is told the machine's address instead), ``machine_ip()`` several (``add_node``)."""
        import secrets
        import tempfile

        self.token = secrets.token_hex(32)
        self.temp_dir = tempfile.mkdtemp(prefix="tlray-", dir="/tmp")  # short: Ray's socket paths are limited
        self.ports = _free_ports(9)
        self.node_ip, self.head_resources = node_ip, head_resources or {}
        self.address = f"{node_ip}:{self.ports[0]}"
        self.dashboard = f"http://127.0.0.1:{self.ports[1]}"
        self.proc = None
        self.nodes: list = []
        """Processes of the nodes ``add_node`` started, with their temp dirs."""

    @property
    def env(self) -> dict[str, str]:
        """Environment of a process that talks to this cluster (drivers, the job CLI)."""
        return {**os.environ, "RAY_ADDRESS": self.address, "RAY_API_SERVER_ADDRESS": self.dashboard,
                "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "PYTHONUNBUFFERED": "1"}

    def start(self) -> None:
        import subprocess
        import sys
        import time
        from pathlib import Path

        p = self.ports
        ray_bin = str(Path(sys.executable).parent / "ray")
        env = {k: v for k, v in self.env.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
        self.proc = subprocess.Popen(
            [ray_bin, "start", "--head", "--block", f"--node-ip-address={self.node_ip}", f"--port={p[0]}",
             "--dashboard-host=127.0.0.1", f"--dashboard-port={p[1]}", f"--dashboard-agent-listen-port={p[2]}",
             f"--dashboard-agent-grpc-port={p[3]}", f"--metrics-export-port={p[4]}",
             f"--runtime-env-agent-port={p[5]}", f"--node-manager-port={p[6]}", f"--object-manager-port={p[7]}",
             f"--ray-client-server-port={p[8]}", f"--temp-dir={self.temp_dir}", "--num-cpus=2",
             f"--resources={json.dumps(self.head_resources)}", "--disable-usage-stats"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 120
        while not self._jobs_api_up():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("ray start --head did not come up")
            time.sleep(0.2)

    def add_node(self, resources: dict[str, float], labels: dict[str, str], num_cpus: int = 2) -> str:
        """Start a second node of this cluster on this machine (`ray start --address`, its own ports and temp
        dir) with custom ``resources`` and ``labels``; return its node id once the cluster shows it alive."""
        import subprocess
        import sys
        import tempfile
        import time
        from pathlib import Path

        p = _free_ports(6)
        temp_dir = tempfile.mkdtemp(prefix="tlray2-", dir="/tmp")
        # Ray refuses a second node unless multi-node is on (the env of this class turns it off for the head)
        env = {**{k: v for k, v in self.env.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")},
               "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"}
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "ray"), "start", f"--address={self.address}", "--block",
             f"--node-ip-address={self.node_ip}", f"--dashboard-agent-listen-port={p[0]}",
             f"--dashboard-agent-grpc-port={p[1]}", f"--metrics-export-port={p[2]}", f"--runtime-env-agent-port={p[3]}",
             f"--node-manager-port={p[4]}", f"--object-manager-port={p[5]}", f"--temp-dir={temp_dir}",
             f"--num-cpus={num_cpus}", f"--resources={json.dumps(resources)}",
             "--labels=" + ",".join(f"{k}={v}" for k, v in labels.items()), "--disable-usage-stats"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.nodes.append((proc, temp_dir))
        deadline = time.monotonic() + 120
        while True:
            found = self._node_with(resources)
            if found:
                return found
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("ray start --address (a second node) did not come up")
            time.sleep(1.0)

    def _node_with(self, resources: dict[str, float]) -> str | None:
        """The id of a live node that has ``resources``, asked of the cluster by a short driver process."""
        import subprocess
        import sys

        script = ("import json, ray; ray.init(log_to_driver=False); print(json.dumps([(n['NodeID'], n['Resources']) "
                  "for n in ray.nodes() if n['Alive']]))")
        out = subprocess.run([sys.executable, "-c", script], env=self.env, capture_output=True, text=True,
                             timeout=120)
        if out.returncode != 0:
            return None
        for node_id, have in json.loads(out.stdout.strip().splitlines()[-1]):
            if all(have.get(k, 0) >= v for k, v in resources.items()):
                return node_id
        return None

    def _jobs_api_up(self) -> bool:
        """The job API answers (what `ray job list` asks, without starting a Python process each time)."""
        import urllib.error
        import urllib.request

        request = urllib.request.Request(f"{self.dashboard}/api/jobs/",
                                         headers={"Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def stop(self) -> None:
        import shutil

        for proc, temp_dir in [*self.nodes, (self.proc, self.temp_dir)]:
            _end_group(proc)
            shutil.rmtree(temp_dir, ignore_errors=True)


def _end_group(proc) -> None:
    """End a `ray start --block` process and the processes of its node (its own process group)."""
    import signal
    import subprocess

    if proc is None or proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, 5), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait_s)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def machine_ip() -> str:
    """This machine's address on its default route (what Ray's nodes would take), without sending anything."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def _free_ports(n: int) -> list[int]:
    import socket

    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture(scope="session")
def ray_cluster():
    """A `ray start --head` cluster on loopback for tests of independent Ray jobs."""
    cluster = RayCluster()
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark what needs Ray (``make test-fast`` leaves it out), keep every test of the shared `ray start`
    cluster on one xdist worker (one cluster per session, not one per worker), and skip ``gpu`` tests on a
    machine without CUDA. Runs first: xdist's own hook reads the ``xdist_group`` marks to group the tests."""
    import torch

    cuda = torch.cuda.is_available()
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & {"ray_session", "ray_cluster"} or "/e2e/" in str(item.path):
            item.add_marker(pytest.mark.ray)
        if "ray_cluster" in fixtures:
            item.add_marker(pytest.mark.xdist_group("ray_cluster"))
        if item.get_closest_marker("gpu") and not cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (gpu marker)"))


def write_verl_data(path, n=6, split="train", data_source="arithmetic"):
    """A data file in verl's format (as verl's examples/data_preprocess/gsm8k.py writes it) of ``n`` arithmetic
    tasks: chat-message prompts, ``data_source``, ``reward_model.ground_truth``, ``extra_info``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"data_source": data_source,
             "prompt": [{"role": "system", "content": "Answer with a number."},
                        {"role": "user", "content": f"{i}+{i + 1}="}],
             "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(2 * i + 1)},
             "extra_info": {"split": split, "index": i, "question": f"{i}+{i + 1}"}} for i in range(n)]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


VERL_SCRIPTS = Path(__file__).parent / "config" / "verl_scripts"
"""Override lists of verl's own example scripts (tests/config/verl_scripts/README.md)."""


def read_verl_script(name):
    """(entry point, overrides) of a script in ``VERL_SCRIPTS``, as the script passes them."""
    entry, overrides = None, []
    for line in (VERL_SCRIPTS / f"{name}.txt").read_text().splitlines():
        if line.startswith("# entry:"):
            entry = line.split(":", 1)[1].strip()
        elif line and not line.startswith("#"):
            overrides.append(line)
    return entry, overrides


VERL_ON_THE_TINY_MODEL = (
    "data.train_batch_size=2", "data.max_prompt_length=256", "data.max_response_length=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=2048", "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.rollout.name=hf", "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.device=cpu",
    "trainer.total_training_steps=3", "trainer.logger=[console]", "trainer.test_freq=-1", "trainer.save_freq=-1",
)
"""What a verl script's overrides need after them to run on this machine in seconds: the tiny model's sizes, the
CPU (the hf engine, one trainer worker and one engine), three steps, console logging."""


def _data_files(key, given, overrides):
    """``data.train_files``/``val_files`` as the script's override gets them: one file (``given`` a path: the
    script's list, if any, replaced by that file), or a list of files (``given`` a list, as long as the script's
    list)."""
    if not isinstance(given, (list, tuple)):
        return str(given)
    import yaml

    script = next((o.partition("=")[2] for o in overrides if o.partition("=")[0].lstrip("+") == key), None)
    listed = yaml.safe_load(script) if script is not None else None
    if not isinstance(listed, list) or len(listed) != len(given):
        raise ValueError(f"{key}: {len(given)} files given for the script's {script!r}")
    return f"[{','.join(str(f) for f in given)}]"


def verl_script_on_the_tiny_model(name, tmp_path, tiny_model_path, train, val):
    """A verl script's (entry, overrides) with its data and model paths replaced (``train``/``val``, the tiny
    model), then ``VERL_ON_THE_TINY_MODEL`` and the run directory under ``tmp_path``; every other override as the
    script gives it. ``train``/``val``: one file (a list in the script becomes that file), or a list of files that
    replaces the script's list of as many (gsm8k + MATH: two real training files)."""
    entry, overrides = read_verl_script(name)
    replaced = {"data.train_files": _data_files("data.train_files", train, overrides),
                "data.val_files": _data_files("data.val_files", val, overrides),
                "actor_rollout_ref.model.path": str(tiny_model_path), "critic.model.path": str(tiny_model_path),
                "trainer.default_local_dir": str(tmp_path / "run")}
    out = []
    for item in overrides:
        key = item.partition("=")[0].lstrip("+")
        out.append(f"{item.partition('=')[0]}={replaced[key]}" if key in replaced else item)
    out += [f"{k}={v}" for k, v in replaced.items() if not any(o.partition("=")[0].lstrip("+") == k for o in out)]
    extra = list(VERL_ON_THE_TINY_MODEL)
    if any(o.startswith("data.gen_batch_size=") for o in out):
        # DAPO: generate 4 prompts a step, train on 2 kept; its overlong buffer within the 4 tokens
        # (4 samples per prompt: groups of 2 are too often all right or all wrong for the tiny model)
        extra += ["data.gen_batch_size=4", "reward_model.overlong_buffer.len=2", "actor_rollout_ref.rollout.n=4"]
    return entry, out + extra


class SmallDisk:
    """A tmpfs of ``size`` mounted at ``path`` (needs root; tests skip where mounting is refused)."""

    FILLER = ".filler"

    def __init__(self, path, size: str = "4m") -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True)
        if done.returncode:
            pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip() or 'mount refused'}): the disk-full "
                        "tests need root")

    def fill(self, leave: int = 0) -> None:
        """Fill the disk until at most ``leave`` bytes (rounded to blocks) are free."""
        with open(self.path / self.FILLER, "ab", buffering=0) as f:
            chunk = 1 << 16
            while chunk >= 4096:
                st = os.statvfs(self.path)
                if st.f_bavail * st.f_frsize <= leave:
                    return
                try:
                    f.write(b"\0" * chunk)
                except OSError:
                    chunk //= 2

    def free(self) -> None:
        (self.path / self.FILLER).unlink(missing_ok=True)

    def remount(self, *options: str) -> None:
        subprocess.run(["mount", "-o", ",".join(("remount", *options)), str(self.path)], check=True)

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], check=False)


@pytest.fixture
def small_disk_of(tmp_path):
    """``small_disk_of(size)``: a real tmpfs of ``size`` (e.g. "24m") at ``tmp_path/disk`` (then ``disk1``, ...),
    unmounted after the test."""
    made: list[SmallDisk] = []

    def make(size: str = "4m") -> SmallDisk:
        made.append(SmallDisk(tmp_path / ("disk" if not made else f"disk{len(made)}"), size))
        return made[-1]
    yield make
    for disk in made:
        disk.unmount()


@pytest.fixture
def small_disk(small_disk_of):
    """A real 4 MB tmpfs (the disk-full tests: tests/common/test_disk_full.py)."""
    return small_disk_of("4m")
