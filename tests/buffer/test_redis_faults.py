"""Redis transport under Redis faults, against a real redis-server killed with SIGKILL and started again on the
same port, with and without persistence: every eid reaches the buffer exactly once, an unreachable Redis stops
both ends within ``timeout_s`` with a message naming the address, the wait and the setting, and a run resumed
after that delivers the rest exactly once."""

import asyncio
import socket
import time

import pytest

from trinity_like.buffer import query
from trinity_like.buffer.redis_transport import (
    TIMEOUT_SETTING,
    RedisIngester,
    RedisSender,
    RedisUnavailable,
)
from trinity_like.common.experience import Experience

ROWS = 4


@pytest.fixture(params=["persistent", "volatile"])
def redis_proc(request, redis_server_at):
    """A real redis-server on loopback, with an append-only file fsynced on every write or with no persistence at
    all (a SIGKILL loses everything); started again on the same port after a kill."""
    return redis_server_at(persistent=request.param == "persistent")


def _batch(k: int) -> list[Experience]:
    return [Experience(prompt_ids=[1, 2], response_ids=[3, i], group_id=f"g-{k}", eid=f"e-{k}-{i}",
                       reward=float(i)) for i in range(ROWS)]


def _eids(batches) -> set[str]:
    return {f"e-{k}-{i}" for k in batches for i in range(ROWS)}


def _assert_exactly_once(buffer_dir, batches) -> None:
    eids = query(buffer_dir).column("eid").to_pylist()
    assert len(eids) == len(set(eids)), "a row was stored twice"
    assert set(eids) == _eids(batches)


def test_kill_and_restart_mid_stream_stores_every_eid_once(redis_proc, tmp_path, caplog):
    buf = tmp_path / "buf"

    async def main():
        sender = RedisSender(redis_proc.url, "s", timeout_s=10, poll_s=0.1)
        ingester = RedisIngester(redis_proc.url, "s", buf, timeout_s=10, batch=4)
        await ingester._ensure_group()
        for k in range(8):
            await sender.send(_batch(k))
        assert await ingester.step() == 4  # batches 4..7 are in Redis only when it dies
        redis_proc.kill()
        redis_proc.restart_later(0.5)
        done = asyncio.Event()

        async def produce():
            for k in range(8, 24):
                await sender.send(_batch(k))
                if k == 16:  # a second kill, while the ingester is reading
                    redis_proc.kill()
                    redis_proc.restart_later(0.3)
                await asyncio.sleep(0.01)
            await sender.flush(10)
            done.set()

        await asyncio.wait_for(asyncio.gather(produce(), ingester.run(done)), 20)
        await sender.close()
        await ingester.close()
        return sender, ingester

    sender, ingester = asyncio.run(main())
    _assert_exactly_once(buf, range(24))
    assert sender.unconfirmed == 0 and sender.stats["resent"] >= 4
    assert "retrying" in caplog.text and "restarted" in caplog.text  # the outages were real
    if not redis_proc.persistent:  # the stream and its group were lost with Redis: rebuilt from the re-sent
        assert ingester.stats["group_recreated"] >= 1


def test_an_idle_sender_resends_what_redis_lost(redis_proc, tmp_path):
    """The explorer sent its step and waits (for weights that wait for these rows): its watcher re-sends."""
    buf = tmp_path / "buf"

    async def main():
        sender = RedisSender(redis_proc.url, "s", timeout_s=10, poll_s=0.1)
        for k in range(4):
            await sender.send(_batch(k))
        redis_proc.kill()
        redis_proc.restart_later(0.3)
        await asyncio.sleep(1.0)  # no further send: only the watcher acts
        ingester = RedisIngester(redis_proc.url, "s", buf, timeout_s=10)
        stop = asyncio.Event()
        task = asyncio.create_task(ingester.run(stop))
        await sender.flush(10)
        stop.set()
        await asyncio.wait_for(task, 10)
        await sender.close()
        await ingester.close()
        return sender

    sender = asyncio.run(main())
    _assert_exactly_once(buf, range(4))
    assert sender.stats["resent"] == 4  # Redis restarted (run_id changed): all four went again


def test_a_port_nobody_listens_on_fails_within_the_bound(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    url = f"redis://127.0.0.1:{port}/0"

    async def timed(coro):
        start = time.monotonic()
        with pytest.raises(RedisUnavailable) as e:
            await coro
        return str(e.value), time.monotonic() - start

    async def main():
        sender = RedisSender(url, "s", timeout_s=1.5)
        ingester = RedisIngester(url, "s", tmp_path / "buf", timeout_s=1.5)
        results = await asyncio.gather(timed(sender.send(_batch(0))), timed(ingester.run(asyncio.Event())))
        await sender.close()
        await ingester.close()
        return results

    for message, elapsed in asyncio.run(main()):
        assert 1.5 <= elapsed < 3.5, elapsed
        assert f"Redis at 127.0.0.1:{port} did not answer for 1." in message
        assert f"{TIMEOUT_SETTING}=1.5 bounds the wait" in message
        assert "\n" not in message


def test_redis_down_for_good_stops_both_ends_then_a_resumed_run_delivers_the_rest_once(redis_proc, tmp_path):
    buf = tmp_path / "buf"

    async def main():
        sender = RedisSender(redis_proc.url, "s", timeout_s=1.0, poll_s=0.1)
        ingester = RedisIngester(redis_proc.url, "s", buf, timeout_s=1.0, batch=2)
        await ingester._ensure_group()
        for k in range(6):
            await sender.send(_batch(k))
        assert await ingester.step() == 2  # batches 0 and 1 stored; 2..5 in Redis only
        redis_proc.kill()  # ... and not started again
        for attempt in (sender.send(_batch(6)), ingester.step()):
            start = time.monotonic()
            with pytest.raises(RedisUnavailable, match=f"127.0.0.1:{redis_proc.port}.*{TIMEOUT_SETTING}=1 "):
                await attempt
            assert time.monotonic() - start < 3.0
        await ingester.close()  # the trainer stops on the error
        _assert_exactly_once(buf, range(2))  # what was stored stays

        redis_proc.start()  # Redis is back: the run is started again
        ingester = RedisIngester(redis_proc.url, "s", buf, timeout_s=10)
        stop = asyncio.Event()
        task = asyncio.create_task(ingester.run(stop))
        for k in range(7, 10):  # the explorer that saw the error goes on: it still holds 2..6
            await sender.send(_batch(k))
        redone = RedisSender(redis_proc.url, "s", timeout_s=10)  # a restarted explorer redoes steps 4..5
        for k in (4, 5):
            await redone.send(_batch(k))
        await sender.flush(10)
        await redone.flush(10)
        stop.set()
        await asyncio.wait_for(task, 10)
        for closing in (sender, redone, ingester):
            await closing.close()
        return ingester

    ingester = asyncio.run(main())
    _assert_exactly_once(buf, range(10))
    assert ingester.stats["duplicates"] >= 2 * ROWS  # the redone steps were dropped by eid
