"""Redis transport against a real redis-server: ingest, duplicates, a dead ingester, a Redis restart."""

import asyncio
import signal
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from trinity_like.buffer import count_rows, query
from trinity_like.buffer.redis_transport import GROUP, RedisIngester, RedisSender, from_bytes, to_bytes
from trinity_like.common.experience import Experience, experiences_to_table


def _batch(tag: str, k: int, n: int = 4) -> list[Experience]:
    return [Experience(prompt_ids=[1, 2], response_ids=[3, i], group_id=f"{tag}-{k}", eid=f"{tag}-{k}-{i}",
                       reward=float(i)) for i in range(n)]


async def _drain(ingester: RedisIngester, rows: int, tmp_path, timeout_s: float = 30.0) -> None:
    await ingester._ensure_group()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while count_rows(tmp_path / "buf") < rows:
        assert loop.time() < deadline, f"only {count_rows(tmp_path / 'buf')} of {rows} rows arrived"
        await ingester.step(block_ms=100)


def test_arrow_bytes_round_trip():
    exps = _batch("x", 0)
    assert from_bytes(to_bytes(exps)).column("eid").to_pylist() == [e.eid for e in exps]


def test_an_entry_of_another_schema_version_is_refused_in_one_sentence():
    table = experiences_to_table(_batch("x", 0))
    for version in (b"1", b"3"):
        sink = pa.BufferOutputStream()
        old = table.replace_schema_metadata({b"trinity_like.schema_version": version})
        with ipc.new_stream(sink, old.schema) as writer:
            writer.write_table(old)
        with pytest.raises(ValueError) as e:
            from_bytes(sink.getvalue().to_pybytes())
        assert str(e.value).count(". ") == 0 and "\n" not in str(e.value)
        assert f"schema version {version.decode()} and this ingester reads only version 2" in str(e.value)


def test_send_ingest_and_drop_duplicates(redis_server, tmp_path):
    async def main():
        sender = RedisSender(redis_server.url, "s1")
        for k in range(3):
            await sender.send(_batch("a", k))
        await sender.send(_batch("a", 1))  # sent twice: the second copy is dropped by eid
        ingester = RedisIngester(redis_server.url, "s1", tmp_path / "buf")
        await _drain(ingester, 12, tmp_path)
        for _ in range(3):
            await ingester.step(block_ms=50)
        pending = await ingester._redis.xpending(ingester.stream, GROUP)
        await sender.close()
        await ingester.close()
        return ingester.stats, pending

    stats, pending = asyncio.run(main())
    assert stats == {"entries": 4, "rows": 12, "duplicates": 4, "group_recreated": 0}
    assert pending["pending"] == 0  # every entry acknowledged
    eids = query(tmp_path / "buf").column("eid").to_pylist()
    assert len(eids) == len(set(eids)) == 12


def test_entries_of_a_dead_ingester_are_reclaimed(redis_server, tmp_path):
    async def send():
        sender = RedisSender(redis_server.url, "s2")
        for k in range(2):
            await sender.send(_batch("b", k))
        await sender.close()

    asyncio.run(send())
    # a real ingester process takes both entries with XREADGROUP and is SIGKILLed before it acknowledges
    dead = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import redis, time
        r = redis.Redis(port={redis_server.port})
        try:
            r.xgroup_create("s2", "{GROUP}", id="0", mkstream=True)
        except redis.ResponseError:
            pass
        got = r.xreadgroup("{GROUP}", "dead", {{"s2": ">"}}, count=10)
        print(len(got[0][1]), flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    assert dead.stdout.readline().strip() == "2"
    dead.send_signal(signal.SIGKILL)
    dead.wait()

    async def recover():
        ingester = RedisIngester(redis_server.url, "s2", tmp_path / "buf", name="live", claim_idle_ms=100)
        await asyncio.sleep(0.2)
        await _drain(ingester, 8, tmp_path)
        pending = await ingester._redis.xpending("s2", GROUP)
        await ingester.close()
        return pending

    assert asyncio.run(recover())["pending"] == 0
    assert count_rows(tmp_path / "buf") == 8


def test_redis_restart_mid_stream_loses_nothing(redis_server, tmp_path, caplog):
    batches = 24

    async def main():
        sender = RedisSender(redis_server.url, "s3", timeout_s=30)
        ingester = RedisIngester(redis_server.url, "s3", tmp_path / "buf", timeout_s=30)
        await ingester._ensure_group()
        done = asyncio.Event()

        async def produce():
            for k in range(batches):
                await sender.send(_batch("c", k))
                if k == batches // 2:
                    redis_server.kill(signal.SIGKILL)  # Redis dies mid-stream ...
                    asyncio.get_running_loop().call_later(1.0, redis_server.start)  # ... and comes back
            done.set()

        await asyncio.gather(produce(), ingester.run(done))
        await _drain(ingester, batches * 4, tmp_path)
        await sender.close()
        await ingester.close()

    asyncio.run(main())
    assert "retrying" in caplog.text  # the outage was real: commands failed and were retried
    eids = query(tmp_path / "buf").column("eid").to_pylist()
    assert len(eids) == len(set(eids)) == batches * 4
    assert set(eids) == {f"c-{k}-{i}" for k in range(batches) for i in range(4)}
