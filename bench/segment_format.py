"""Why buffer segments are Arrow IPC: write and scan speed of the candidate segment formats.

Writes the same rows (default 5,000 experiences of 256 response tokens with behaviour log-probs) as one file
per format, fsynced, and scans the metadata columns the consumer needs (eid, group_id, model_version) with a
staleness filter through DuckDB. Conversion from Experience objects is left out: it is the same for all.

    .venv/bin/python bench/segment_format.py [--rows N]

``--smoke`` (``.venv/bin/python bench/segment_format.py --smoke``) runs the same code path on small sizes in seconds;
``make test`` runs it and checks its ``RESULT`` lines (tests/bench/test_smoke.py).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
from benchlib import add_smoke

from trinity_like.common.experience import Experience, experiences_to_table


def _rows(n: int) -> pa.Table:
    rng = np.random.default_rng(0)
    exps = [Experience(prompt_ids=rng.integers(0, 500, 32).tolist(), response_ids=rng.integers(0, 500, 256).tolist(),
                       logprobs=(-rng.random(256)).tolist(), reward=1.0, group_id=f"g{i // 8}",
                       model_version=i // 500) for i in range(n)]
    return experiences_to_table(exps)


def _fsync(path: str) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def _write_ipc(path: str, table: pa.Table, compression: str | None = None) -> None:
    with pa.OSFile(path, "wb") as sink, ipc.new_file(sink, table.schema,
                                                     options=ipc.IpcWriteOptions(compression=compression)) as w:
        w.write_table(table)


def _scan_ipc(path: str) -> int:
    con = duckdb.connect()
    con.register("t", ipc.open_file(pa.memory_map(path)).read_all())
    n = con.sql("SELECT eid, group_id, model_version FROM t WHERE model_version >= 5").to_arrow_table().num_rows
    con.close()
    return n


def _scan_parquet(path: str) -> int:
    con = duckdb.connect()
    n = con.sql(f"SELECT eid, group_id, model_version FROM read_parquet('{path}') "
                "WHERE model_version >= 5").to_arrow_table().num_rows
    con.close()
    return n


RESULT_FIELDS = {"segment_format": (
    "arrow_ipc_write_eps", "arrow_ipc_scan_ms", "arrow_ipc_mb", "arrow_ipc_lz4_write_eps",
    "arrow_ipc_lz4_scan_ms", "arrow_ipc_lz4_mb", "parquet_snappy_write_eps", "parquet_snappy_scan_ms",
    "parquet_snappy_mb", "parquet_none_write_eps", "parquet_none_scan_ms", "parquet_none_mb",
    "ipc_vs_parquet_snappy_write",
)}
"""Fields of the RESULT line (bench/benchlib.py)."""

FORMATS = {
    "arrow_ipc": (lambda p, t: _write_ipc(p, t), _scan_ipc),
    "arrow_ipc_lz4": (lambda p, t: _write_ipc(p, t, "lz4"), _scan_ipc),
    "parquet_snappy": (lambda p, t: pq.write_table(t, p), _scan_parquet),
    "parquet_none": (lambda p, t: pq.write_table(t, p, compression="none"), _scan_parquet),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=5000)
    add_smoke(ap, "200 rows")
    args = ap.parse_args(argv)
    if args.smoke:
        args.rows = 200
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    table = _rows(args.rows)
    results = {}
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        for name, (write, scan) in FORMATS.items():
            path = os.path.join(d, name)
            best_w, best_s = float("inf"), float("inf")
            for _ in range(3):
                t = time.perf_counter()
                write(path, table)
                _fsync(path)
                best_w = min(best_w, time.perf_counter() - t)
                t = time.perf_counter()
                scan(path)
                best_s = min(best_s, time.perf_counter() - t)
            results[name] = (args.rows / best_w, best_s * 1000, os.path.getsize(path) / 1e6)
            print(f"{name:16s} write {results[name][0]:>9.0f} rows/s  scan {results[name][1]:6.1f} ms  "
                  f"size {results[name][2]:6.1f} MB", flush=True)
    ipc_w = results["arrow_ipc"][0]
    print("RESULT segment_format " + " ".join(
        f"{k}_write_eps={v[0]:.0f} {k}_scan_ms={v[1]:.1f} {k}_mb={v[2]:.1f}" for k, v in results.items())
        + f" ipc_vs_parquet_snappy_write={ipc_w / results['parquet_snappy'][0]:.2f}")


if __name__ == "__main__":
    main()
