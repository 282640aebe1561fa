"""``trinity-like serve`` under load: concurrent agents chat, reward and commit; every commit is stored once.

The server is the real command (``trinity-like serve --port 0`` in a process of its own, with its own local Ray,
one ``hf`` engine on the CPU, the tiny model built offline), on loopback. ``--clients`` asyncio clients (one
``httpx`` connection pool) each run sessions back to back until ``--duration-s`` has passed or they have sent
``--requests-per-client`` requests. A session is what an agent does:

- 1 to 3 turns of ``POST /v1/chat/completions`` (short prompts, ``--max-tokens`` new tokens, the whole history
  sent each turn, so the turns extend one recorded experience), or one ``POST /v1/completions`` (1 session in 4);
- ``POST /v1/feedback`` with a reward for the session;
- ``POST /v1/commit`` of the session (by ``session_id``, or by ``experience_ids`` every other time).

Measured per request kind (chat, completion, feedback, commit): p50 and p99 latency in ms, and errors (a
non-2xx answer or an exception such as a timeout, ``--timeout-s``: a server that stops answering shows here).
Throughput is requests per second over the load phase (all kinds, and chat turns alone). The serve process's
resident memory is read from ``/proc`` before and after the load (``rss_growth_mb``).

Afterwards the buffer is read back with the project's own query (``trinity_like.buffer.sql.query``) and compared
with the experience ids that commits answered: ``lost`` = committed but not stored, ``duplicated`` = stored more
than once, ``unexpected`` = stored but never answered as committed (a commit whose answer was lost is not counted),
``wrong`` = stored with a reward or a turn count other than the client's. The server is then stopped with SIGINT
and must exit 0.

    .venv/bin/python bench/serve_load.py [--clients 16] [--duration-s 60] [--requests-per-client 2000]
        [--max-tokens 8] [--keep DIR]

``--smoke`` (``.venv/bin/python bench/serve_load.py --smoke``): 4 clients for 2 s; like the full run it exits 1
unless errors, lost, duplicated, unexpected and wrong are all 0. ``make test`` runs it (tests/bench/test_smoke.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from benchlib import add_smoke, result_line

RESULT_FIELDS = {"serve_load": ("clients", "duration_s", "requests", "rps", "chat_rps", "chat_p50_ms", "chat_p99_ms",
                                "feedback_p50_ms", "feedback_p99_ms", "commit_p50_ms", "commit_p99_ms", "errors",
                                "committed", "stored", "lost", "duplicated")}
"""Fields of the RESULT line (bench/benchlib.py); it also holds completion_p50_ms/p99, unexpected, wrong, pending
and the serve process's rss_start_mb/rss_end_mb/rss_growth_mb."""

KINDS = ("chat", "completion", "feedback", "commit")
WORDS = ["apple", "river", "seven", "blue", "count", "stone", "light", "green", "table", "quick"]
START_TIMEOUT_S = 180


@dataclass
class Tally:
    """What the clients saw, merged over all of them (one event loop: no lock needed)."""

    latencies_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: Counter = field(default_factory=Counter)
    error_examples: list[str] = field(default_factory=list)
    committed: dict[str, tuple[float, int]] = field(default_factory=dict)
    """experience id -> (reward sent, turns answered) for every id a commit answered as committed."""
    uncertain: set[str] = field(default_factory=set)
    """Ids whose commit got no answer (an error): they may or may not be stored."""
    mismatched_commits: int = 0
    """Commits whose answered ids differ from the session's experience ids."""

    def requests(self) -> int:
        return sum(len(v) for v in self.latencies_ms.values()) + sum(self.errors.values())


class Failed(Exception):
    """A request that got an error; already counted."""


async def call(http: httpx.AsyncClient, tally: Tally, kind: str, path: str, body: dict) -> dict:
    start = time.perf_counter()
    try:
        r = await http.post(path, json=body)
    except httpx.HTTPError as e:
        tally.errors[kind] += 1
        tally.error_examples.append(f"{kind}: {type(e).__name__}: {e}")
        raise Failed from None
    if not r.is_success:
        tally.errors[kind] += 1
        tally.error_examples.append(f"{kind}: {r.status_code} {r.text[:300]}")
        raise Failed
    tally.latencies_ms[kind].append((time.perf_counter() - start) * 1000)
    return r.json()


def prompt(rng: random.Random) -> str:
    return f"{' '.join(rng.choices(WORDS, k=rng.randint(2, 6)))}: {rng.randint(0, 9)} + {rng.randint(0, 9)} ="


async def session(http: httpx.AsyncClient, tally: Tally, rng: random.Random, name: str, max_tokens: int,
                  budget: int) -> int:
    """One agent's session: turns, feedback, commit. Returns the requests it sent (at most ``budget``)."""
    sent, eids, turns = 0, set(), Counter()
    sampling = {"max_tokens": max_tokens, "temperature": 1.0, "seed": rng.getrandbits(31), "session_id": name}
    try:
        if rng.random() < 0.25:
            out = await call(http, tally, "completion", "/v1/completions", {"prompt": prompt(rng), **sampling})
            sent += 1
            eids.add(out["experience_id"])
            turns[out["experience_id"]] += 1
        else:
            messages = [{"role": "user", "content": prompt(rng)}]
            for _ in range(min(rng.choice((1, 2, 2, 3)), budget - 2)):
                out = await call(http, tally, "chat", "/v1/chat/completions", {"messages": messages, **sampling})
                sent += 1
                eids.add(out["experience_id"])
                turns[out["experience_id"]] += 1
                messages += [{"role": "assistant", "content": out["choices"][0]["message"]["content"]},
                             {"role": "user", "content": prompt(rng)}]
        reward = round(rng.random(), 3)
        await call(http, tally, "feedback", "/v1/feedback", {"session_id": name, "reward": reward})
        sent += 1
        by_session = rng.random() < 0.5
        commit = {"session_id": name} if by_session else {"experience_ids": sorted(eids)}
        sent += 1
        try:
            out = await call(http, tally, "commit", "/v1/commit", commit)
        except Failed:
            tally.uncertain |= eids
            raise
        if set(out["experience_ids"]) != eids:
            tally.mismatched_commits += 1
        for eid in out["experience_ids"]:
            tally.committed[eid] = (reward, turns[eid])
    except Failed:
        pass
    return sent


async def client(http: httpx.AsyncClient, tally: Tally, index: int, deadline: float, max_requests: int,
                 max_tokens: int, seed: int) -> None:
    rng = random.Random(seed * 1000 + index)
    sent, k = 0, 0
    while time.monotonic() < deadline and sent + 3 <= max_requests:
        sent += await session(http, tally, rng, f"client{index}-session{k}", max_tokens, max_requests - sent)
        k += 1


async def load(url: str, args: argparse.Namespace) -> tuple[Tally, float]:
    tally = Tally()
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(base_url=url.removesuffix("/v1"), timeout=args.timeout_s, limits=limits) as http:
        start = time.monotonic()
        deadline = start + args.duration_s
        await asyncio.gather(*(client(http, tally, i, deadline, args.requests_per_client, args.max_tokens, args.seed)
                               for i in range(args.clients)))
        return tally, time.monotonic() - start


def rss_mb(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", text).group(1)) / 1024


def start_server(root: Path, model: Path) -> tuple[subprocess.Popen, str]:
    """``trinity-like serve`` on a free loopback port; returns the process and the ``/v1`` URL it printed."""
    config = root / "serve.yaml"
    config.write_text("mode: async\n")
    cli = str(Path(sys.executable).parent / "trinity-like")
    cmd = [cli, "serve", "--port", "0", str(config), "project=bench", "name=serve_load",
           f"checkpoint_root_dir={root / 'runs'}", f"model.path={model}", "explorer.num_engines=1",
           "explorer.taskset.size=8", "serve.max_tokens=64"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    seen = []
    deadline = time.monotonic() + START_TIMEOUT_S
    for line in proc.stdout:
        seen.append(line)
        m = re.search(r"at (http://\S+/v1)", line)
        if m:
            return proc, m.group(1)
        if time.monotonic() > deadline:
            break
    os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit(f"serve did not start (exit {proc.poll()}):\n{''.join(seen)[-3000:]}")


def stop_server(proc: subprocess.Popen) -> int:
    """SIGINT (the server's clean stop), SIGKILL to its process group after 60 s. Returns its exit status."""
    proc.send_signal(signal.SIGINT)
    try:
        rc = proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait(30)
    proc.stdout.read()
    return rc


def check_stored(buffer_dir: Path, tally: Tally) -> dict[str, int]:
    """Compare the buffer's agent rows with what the commits answered."""
    from trinity_like.buffer.sql import query

    rows = query(buffer_dir, "source = 'agent'").select(["eid", "reward", "info"]).to_pylist()
    counts = Counter(r["eid"] for r in rows)
    wrong = 0
    for r in rows:
        if r["eid"] in tally.committed:
            reward, turns = tally.committed[r["eid"]]
            if abs(r["reward"] - reward) > 1e-6 or json.loads(r["info"])["turns"] != turns:
                wrong += 1
    return {"stored": len(counts), "lost": len(set(tally.committed) - set(counts)),
            "duplicated": sum(1 for n in counts.values() if n > 1),
            "unexpected": len(set(counts) - set(tally.committed) - tally.uncertain), "wrong": wrong}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients")
    parser.add_argument("--duration-s", type=float, default=60.0, help="no client starts a session after this")
    parser.add_argument("--requests-per-client", type=int, default=2000, help="most requests one client sends")
    parser.add_argument("--max-tokens", type=int, default=8, help="max_tokens of each completion")
    parser.add_argument("--timeout-s", type=float, default=60.0, help="a request unanswered this long is an error")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", metavar="DIR", help="keep the run directory under DIR (default: a temp dir)")
    add_smoke(parser, "4 clients for 2 s, at most 40 requests each")
    args = parser.parse_args(argv)
    if args.smoke:
        args.clients, args.duration_s, args.requests_per_client, args.timeout_s = 4, 2.0, 40, 30.0
    if args.clients < 1 or args.requests_per_client < 3:
        parser.error("--clients must be >= 1 and --requests-per-client >= 3 (a session is at least 3 requests)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from trinity_like.common.tiny_model import make_tiny_model

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        model = make_tiny_model(Path(tmp) / "model", seed=0)
        proc, url = start_server(root, model)
        start_s = time.perf_counter() - started
        try:
            rss_start = rss_mb(proc.pid)
            tally, load_s = asyncio.run(load(url, args))
            rss_end = rss_mb(proc.pid)
            pending = len(httpx.get(url + "/pending", timeout=args.timeout_s).json()["data"])
            alive = proc.poll() is None
        finally:
            stopping = time.perf_counter()
            rc = stop_server(proc)
            stop_s = time.perf_counter() - stopping
        stored = check_stored(root / "runs" / "bench" / "serve_load" / "buffer", tally)

    for line in tally.error_examples[:5]:
        print(f"error: {line}", flush=True)
    out: dict[str, object] = {"clients": args.clients, "duration_s": f"{load_s:.1f}", "requests": tally.requests(),
                              "rps": f"{tally.requests() / load_s:.1f}",
                              "chat_rps": f"{len(tally.latencies_ms['chat']) / load_s:.1f}"}
    for kind in KINDS:
        for q in (50, 99):
            out[f"{kind}_p{q}_ms"] = f"{percentile(tally.latencies_ms[kind], q):.1f}"
    out.update({"errors": sum(tally.errors.values()), **{f"errors_{k}": tally.errors[k] for k in KINDS},
                "committed": len(tally.committed), **stored, "mismatched_commits": tally.mismatched_commits,
                "pending": pending, "rss_start_mb": f"{rss_start:.0f}", "rss_end_mb": f"{rss_end:.0f}",
                "rss_growth_mb": f"{rss_end - rss_start:.0f}", "server_exit": rc, "start_s": f"{start_s:.0f}",
                "stop_s": f"{stop_s:.0f}",
                "bench_s": f"{time.perf_counter() - started:.0f}"})
    print(result_line("serve_load", out), flush=True)
    bad = {k: out[k] for k in ("errors", "lost", "duplicated", "unexpected", "wrong", "mismatched_commits")
           if out[k]}
    if bad or rc != 0 or not alive or not tally.committed:
        print(f"FAILED: {bad or ''} server exit {rc}{'' if alive else ' (died under load)'}"
              f"{'' if tally.committed else ', nothing committed'}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
