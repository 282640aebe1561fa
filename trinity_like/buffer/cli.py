"""``trinity-like buffer {stats,ingest,export,query,verify}``: parse arguments, call one function, print."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _buffer_dir(path: str) -> Path:
    """Accept a buffer folder or a run directory holding ``buffer/``."""
    p = Path(path)
    if (p / "buffer" / "segments").is_dir():
        return p / "buffer"
    if not p.is_dir():
        raise FileNotFoundError(f"buffer directory '{path}' does not exist")
    return p


def _print(obj: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(obj, indent=2, default=str))
        return
    for key, value in obj.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for k, v in value.items():
                print(f"  {k}: {v}")
        elif isinstance(value, list):
            print(f"{key}: {len(value)}")
            for item in value:
                print(f"  - {item}")
        else:
            print(f"{key}: {value}")


def _stats(args) -> int:
    from trinity_like.buffer.maintenance import buffer_stats

    _print(buffer_stats(_buffer_dir(args.dir)), args.json)
    return 0


def _verify(args) -> int:
    from trinity_like.buffer.maintenance import verify_buffer

    report = verify_buffer(_buffer_dir(args.dir), move=not args.dry_run)
    _print(report, args.json)
    return 1 if report["bad"] or report["groups_not_trained_once"] else 0


def _ingest(args) -> int:
    from trinity_like.buffer.ingest import ingest_files

    for f in args.files:
        if not Path(f).is_file():
            raise FileNotFoundError(f"input file '{f}' does not exist")
    buffer_dir = Path(args.buffer)
    buffer_dir.mkdir(parents=True, exist_ok=True)
    report = ingest_files([Path(f) for f in args.files], buffer_dir, args.source, args.tokenizer, args.strict)
    _print(report.to_dict(), args.json)
    return 1 if report.rejected else 0


def _export(args) -> int:
    from trinity_like.buffer.ingest import export

    n = export(_buffer_dir(args.dir), Path(args.out), args.where)
    print(f"exported {n} rows to {args.out}")
    return 0


def _query(args) -> int:
    from trinity_like.buffer.sql import read_only_sql

    table = read_only_sql(_buffer_dir(args.dir), args.sql)
    rows = table.to_pylist()
    if args.json:
        print(json.dumps(rows, default=str))
    else:
        names = table.column_names
        print("\t".join(names))
        for r in rows:
            print("\t".join(str(r[n]) for n in names))
    return 0


def add_buffer_commands(sub) -> None:
    p = sub.add_parser("buffer", help="inspect, import, export, query and verify an experience buffer")
    bsub = p.add_subparsers(dest="buffer_command", required=True)

    q = bsub.add_parser("stats", help="rows by source and version, consumption per consumer, size")
    q.add_argument("dir", help="buffer folder or run directory")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=_stats)

    q = bsub.add_parser("ingest", help="import JSONL/Parquet Experience rows, chat records (demonstrations, agent "
                        "trajectories with tool calls) or preference pairs (prompt, chosen, rejected)")
    q.add_argument("files", nargs="+", metavar="FILE")
    q.add_argument("--buffer", required=True, help="buffer folder to write into")
    q.add_argument("--source", default=None, choices=["human", "agent", "import"],
                   help="source of the rows (a record's own 'source' wins); default: import, and human for "
                        "preference pairs")
    q.add_argument("--tokenizer", help="tokenizer folder: checks token ids and tokenises chat records")
    q.add_argument("--strict", action="store_true", help="take nothing if any record is bad")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=_ingest)

    q = bsub.add_parser("export", help="write rows to Parquet or JSONL")
    q.add_argument("dir")
    q.add_argument("out", help="OUT.parquet or OUT.jsonl")
    q.add_argument("--where", help="SQL filter over the experiences view")
    q.set_defaults(func=_export)

    q = bsub.add_parser("query", help="read-only SQL over the views experiences and consumption")
    q.add_argument("dir")
    q.add_argument("sql")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=_query)

    q = bsub.add_parser("verify", help="check checksums; move bad segments to quarantine/")
    q.add_argument("dir")
    q.add_argument("--dry-run", action="store_true", help="report only, move nothing")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=_verify)


