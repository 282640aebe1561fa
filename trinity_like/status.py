"""``trinity-like status``: what a run is doing now, from its Synchronizer and its run directory.

Roles alive (kind, id, state, policy version, seconds since the last heartbeat), the latest published
version, the global explorer step sequence, and the buffer: rows written, rows the trainer has not consumed
yet, and how stale those would be if trained now (trainer version - model_version). Works without a Ray
cluster too (then only the run directory is read). ``--watch`` redraws it every few seconds.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trinity_like.common.errors import UserError


def _connect(address: str | None, namespace: str, run_dir: Path | None = None) -> str | None:
    """Join the cluster (``address``, RAY_ADDRESS, the one `ray start` started on this node, else the one the run
    directory records for the run's live roles) and say which on stderr; the error text when there is none."""
    import ray

    if ray.is_initialized():
        return None
    from trinity_like.common.errors import RunError
    from trinity_like.runtime.ray_cluster import check_ray_address, live_roles, ray_target
    target, source = ray_target(address)
    if target is None and run_dir is not None:
        gcs = sorted({r["gcs"] for r in live_roles(run_dir) if r.get("gcs")})
        if gcs:
            target, source = gcs[0], "where the run directory's live roles are"
    if target is None:
        return f"no Ray cluster ({source})"
    try:
        check_ray_address(target)  # a closed port fails in seconds; ray.init would retry for a minute
    except RunError:
        return f"no Ray cluster reachable at '{target}' (connection refused)"
    try:
        ray.init(address="auto" if source.startswith("the `ray start`") else target, namespace=namespace,
                 log_to_driver=False, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        return f"no Ray cluster reachable at '{target}' ({str(e).splitlines()[0][:100]})"
    print(f"Ray: joined the cluster at {target} ({source})", file=sys.stderr, flush=True)
    return None


def _synchronizer_status(namespace: str) -> dict[str, Any] | None:
    import ray

    from trinity_like.weights.messages import SYNCHRONIZER_NAME
    try:
        actor = ray.get_actor(SYNCHRONIZER_NAME, namespace=namespace)
        return ray.get(actor.status.remote(), timeout=30)
    except (ValueError, ray.exceptions.RayError):
        return None


def buffer_status(buffer_dir: Path, trainer_version: int | None) -> dict[str, Any]:
    """Rows written and rows the trainer has not consumed (committed or pending), per source too; the model
    versions of the untrained rows made by this run's policy and their staleness (imported rows, version -1,
    are never stale); rows the trainer quarantined as untrainable count apart, not as untrained. From the buffer
    catalog and the trainer's ledger (``catalog.consumer_summary``): segments are not read, except ones partly
    consumed that mix sources or versions."""
    from trinity_like.buffer.catalog import consumer_summary

    summary = consumer_summary(buffer_dir, "trainer")
    per_source = summary.by_source
    out: dict[str, Any] = {"rows": sum(r["rows"] for r in per_source.values()),
                           "unconsumed": sum(r["unconsumed"] for r in per_source.values()),
                           "quarantined": sum(r["quarantined"] for r in per_source.values()),
                           "by_source": {s: {"rows": r["rows"], "unconsumed": r["unconsumed"]}
                                         for s, r in per_source.items()}}
    if summary.versions is not None:
        lo, hi = summary.versions
        out["unconsumed_versions"] = [lo, hi]
        if trainer_version is not None:
            out["unconsumed_staleness"] = [max(0, trainer_version - hi), max(0, trainer_version - lo)]
    return out


def _last_trainer_record(metrics: Path) -> dict[str, Any] | None:
    from trinity_like.common.metrics import read_metrics

    if not metrics.is_file():
        return None
    records, _ = read_metrics(metrics, 0)
    trainer = [r for r in records if r["role"] == "trainer"]
    return trainer[-1] if trainer else None


def gather_status(config: str | None, namespace: str | None, address: str | None,
                  overrides: list[str] | None = None) -> dict[str, Any]:
    from trinity_like.config import load_config
    from trinity_like.runtime.paths import RunPaths, namespace_of
    paths = None
    total = None
    if config:
        cfg = load_config(config, overrides or [])
        namespace = namespace or namespace_of(cfg)
        paths, total = RunPaths.of(cfg), cfg.trainer.total_steps
    if not namespace:
        raise UserError("status needs the run's CONFIG file or --namespace <project>/<name>")
    report: dict[str, Any] = {"namespace": namespace}
    error = _connect(address, namespace, paths.run_dir if paths is not None else None)
    sync = None if error else _synchronizer_status(namespace)
    report["cluster"] = error or "connected"
    report["synchronizer"] = sync is not None
    roles = (sync or {}).get("roles", {})
    report["roles"] = [{"role_id": rid, **r} for rid, r in roles.items()]
    if sync is not None:
        report["latest_version"] = sync["latest_version"]
        report["latest_method"] = sync.get("latest_method", "")
        report["latest_transport"] = sync.get("latest_transport", "")
        report["explore_steps"] = sync.get("explore_steps")
        report["staleness"] = sync.get("staleness")
    if paths is None:  # --namespace only: the roles say where the run directory is
        run_dirs = {r.get("run_dir") for r in roles.values() if r.get("run_dir")}
        if len(run_dirs) == 1:
            from trinity_like.config import Config

            run_dir = Path(run_dirs.pop())
            paths = RunPaths.of(Config(checkpoint_root_dir=str(run_dir.parent.parent), project=run_dir.parent.name,
                                       name=run_dir.name))
    last = _last_trainer_record(paths.metrics) if paths is not None else None
    trainer_version = None
    trainers = [r for r in roles.values() if r["kind"] == "trainer" and r["state"] != "dead"]
    if trainers:
        trainer_version = max(r["version"] for r in trainers)
    elif last is not None:
        trainer_version = int(last["trainer/version"])
    elif sync is not None:  # no trainer yet: the version the explorers generate from
        trainer_version = sync["latest_version"]
    report["trainer_version"] = trainer_version
    if paths is not None:
        report["run_dir"] = str(paths.run_dir)
        report["buffer"] = buffer_status(paths.buffer_dir, trainer_version)
        if last is not None:
            report["last_trainer_step"] = {"step": last["step"], "total_steps": total,
                                           "reward_mean": last.get("train/reward_mean"),
                                           "staleness_mean": last.get("train/staleness_mean")}
    return report


def _engine_line(e: dict[str, Any]) -> str:
    """One engine of an explorer: its version and whether its weights match the published fingerprint."""
    check = {True: "fingerprint matches", False: "FINGERPRINT MISMATCH", None: "fingerprint not checked"}[e["verified"]]
    refused = f", {e['mismatches']} load(s) refused by the check" if e.get("mismatches") else ""
    stalled = "; STALLED: out of service until it answers" if e.get("stalled") else ""
    return f"    engine {e['engine']:<3}version {e['version']:<6}{check} ({e['fingerprint'] or '-'}){refused}{stalled}"


def format_status(report: dict[str, Any]) -> str:
    lines = [f"namespace {report['namespace']}" + (f"   run dir {report['run_dir']}" if "run_dir" in report else "")]
    if report["cluster"] != "connected":
        lines.append(report["cluster"])
    elif not report["synchronizer"]:
        lines.append("no synchronizer in this namespace: no role of this run is running")
    if report["roles"]:
        lines.append("roles:")
        for r in sorted(report["roles"], key=lambda r: (r["kind"], r["role_id"])):
            lines.append(f"  {r['kind']:<9}{r['role_id']:<36}{r['state']:<14}version {r['version']:<6}"
                         f"heartbeat {r['seconds_since_heartbeat']:.1f}s ago"
                         + (f"   groups in flight {r['groups_in_flight']}" if r.get("groups_in_flight") is not None
                            else ""))
            lines.extend(_engine_line(e) for e in r.get("engine_versions") or [])
    if "latest_version" in report:
        steps = report.get("explore_steps") or {}
        how = report.get("latest_method") or ""
        if how and report.get("latest_transport"):
            how += f" over {report['latest_transport']}"
        lines.append(f"latest published version {report['latest_version']}{f' (by {how})' if how else ''}   "
                     "explorer steps handed out "
                     f"{steps.get('next', 0)}, running {steps.get('claimed', [])}, to redo {steps.get('returned', [])}")
    st = report.get("staleness")
    if st:  # max_staleness: auto
        last_change = st["history"][-1]
        lines.append(f"staleness bound {st['bound']} (auto, within [{st['min']}, {st['max']}]); last change at "
                     f"trainer step {last_change['step']}: {last_change['reason']}")
    b = report.get("buffer")
    if b is not None:
        text = f"buffer: {b['rows']} rows, {b['unconsumed']} not yet trained"
        if len(b.get("by_source", {})) > 1:
            text += " (" + ", ".join(f"{src} {v['rows']}/{v['unconsumed']}" for src, v in b["by_source"].items()) + \
                ": rows/untrained)"
        if "unconsumed_versions" in b:
            lo, hi = b["unconsumed_versions"]
            text += f" (model versions {lo}-{hi}"
            if "unconsumed_staleness" in b:
                s_lo, s_hi = b["unconsumed_staleness"]
                text += f", staleness {s_lo}-{s_hi} at trainer version {report['trainer_version']}"
            text += ")"
        lines.append(text)
        if b.get("quarantined"):
            lines.append(f"  {b['quarantined']} row(s) quarantined as untrainable, never trained (see the trainer's "
                         "log, or `buffer query DIR \"SELECT * FROM quarantine\"`)")
    last = report.get("last_trainer_step")
    if last is not None:
        total = f"/{last['total_steps']}" if last["total_steps"] else ""
        lines.append(f"last trainer step {last['step']}{total}: reward {last['reward_mean']:.3f}, "
                     f"staleness mean {last['staleness_mean']:.2f}")
    return "\n".join(lines)


def _bar(done: int, total: int, width: int = 24) -> str:
    filled = round(width * min(done / total, 1.0)) if total else 0
    return "[" + "#" * filled + "-" * (width - filled) + f"] {done}/{total}"


def format_watch(report: dict[str, Any], interval_s: float) -> str:
    """The compact live view: a header with the time and the trainer's progress, then the status."""
    header = f"{time.strftime('%H:%M:%S')}  refreshed every {interval_s:g}s (Ctrl-C to stop)"
    last = report.get("last_trainer_step")
    if last is not None and last.get("total_steps"):
        header += f"   trainer {_bar(last['step'], last['total_steps'])}"
    return header + "\n" + format_status(report)


def watch_status(gather: Callable[[], dict[str, Any]], interval_s: float, as_json: bool = False, stream=None,
                 live: bool | None = None, iterations: int | None = None) -> None:
    """Show ``gather()`` every ``interval_s`` seconds until Ctrl-C (or ``iterations`` times): redrawn in place
    on a terminal, else appended (a blank line between reports; one JSON object per line with ``as_json``)."""
    stream = stream or sys.stdout
    live = stream.isatty() and not as_json if live is None else live
    display = None
    if live:
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        display = Live(console=Console(file=stream, force_terminal=True), auto_refresh=False, transient=False)
        display.start()
    n = 0
    try:
        while iterations is None or n < iterations:
            if n:
                time.sleep(interval_s)
            report = gather()
            n += 1
            if as_json:
                print(json.dumps(report), file=stream, flush=True)
            elif display is not None:
                display.update(Text(format_watch(report, interval_s)), refresh=True)
            else:
                print(("\n" if n > 1 else "") + format_watch(report, interval_s), file=stream, flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        if display is not None:
            display.stop()
