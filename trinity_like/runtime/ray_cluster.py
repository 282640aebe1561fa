"""The Ray connection of a job: join the cluster it names or the `ray start` cluster of this node, else start a
private instance; fail in one line when the named cluster cannot be reached or the run's live roles are in
another cluster."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from trinity_like.common.errors import RunError
from trinity_like.common.fs import atomic_write_json
from trinity_like.config import Config
from trinity_like.runtime.paths import RunPaths, namespace_of


def ray_target(address: str | None = None) -> tuple[str | None, str]:
    """Where a job's Ray is, found as Ray's own ``ray.init()`` finds it: ``address`` (--address), else
    ``RAY_ADDRESS``, else the cluster that `ray start` started on this node (the address file it writes,
    ``<RAY_TMPDIR or /tmp>/ray/ray_current_cluster``) when something answers there. Returns the address to join
    (None: start a private instance; ``local`` asks for one) and where it came from, for the one line that says."""
    from ray._common.utils import get_ray_address_file

    for given, source in ((address, "--address"), (os.environ.get("RAY_ADDRESS"), "RAY_ADDRESS")):
        if given == "local":
            return None, f"{source}=local"
        if given:
            return given, source
    path = get_ray_address_file(None)
    try:
        found = Path(path).read_text().strip()
    except OSError:
        return None, "no RAY_ADDRESS and no `ray start` cluster on this node"
    if found and _answers(found):
        return found, f"the `ray start` cluster of this node, from {path}"
    return None, f"{path} names {found or 'nothing'}, where no cluster answers: a stale file (`ray stop` removes it)"


def init_ray(cfg: Config, address: str | None = None, role: str | None = None) -> RoleRecord | None:
    """Join the Ray cluster that ``ray_target`` finds (``ray job submit`` sets RAY_ADDRESS for its jobs), else
    start a private instance for this job, and say which in one line. A test session's instance is reused as
    it is. With ``role``, record this process in the run directory as a live role of that Ray cluster
    (``register_role``; a role of the run alive in another cluster refuses it); ``close()`` the record at the end."""
    import ray

    if not ray.is_initialized():
        target, source = ray_target(address)
        kwargs = dict(namespace=namespace_of(cfg), log_to_driver=False, configure_logging=False)
        if target is None:
            ray.init(address="local", include_dashboard=False, **kwargs)
            print(f"Ray: started a private instance ({source}); jobs of this run on other Ray instances cannot "
                  "meet it: start them all after `ray start --head`, or give --address", file=sys.stderr, flush=True)
        else:
            check_ray_address(target)
            try:  # "auto" for the `ray start` cluster: Ray then reads its file and token as ray.init() would
                ray.init(address="auto" if source.startswith("the `ray start`") else target, **kwargs)
            except (ConnectionError, RuntimeError) as e:
                raise RunError(f"cannot reach the Ray cluster at '{target}' ({str(e).splitlines()[0][:120]}); "
                               "start one with `ray start --head` or give its address with --address / "
                               "RAY_ADDRESS") from None
            print(f"Ray: joined the cluster at {target} ({source})", file=sys.stderr, flush=True)
    if role is None:
        return None
    return register_role(RunPaths.of(cfg).run_dir, role, ray.get_runtime_context().gcs_address)


ROLES_DIR = "ray_roles"
"""Folder of the run directory with one record per live role (``register_role``)."""
ENDED_DIR = "ended"
"""Sub-folder of ``ROLES_DIR``: the last record of each kind of role that ended (``RoleRecord.close``)."""
HEARTBEAT_S = 5.0
STALE_S = 30.0
"""A record not refreshed for this long is a role that is gone (one on this node: also when its pid is gone)."""


class RoleRecord:
    """This process's record in ``<run_dir>/ray_roles``: its role, Ray cluster (GCS address), node and pid,
    rewritten atomically every ``HEARTBEAT_S`` by a daemon thread; ``close()`` removes it."""

    def __init__(self, path: Path, record: dict) -> None:
        import threading

        self.path, self.record = path, record
        self._stop = threading.Event()
        self._write()
        self._thread = threading.Thread(target=self._beat, name="role-record", daemon=True)
        self._thread.start()

    def _write(self) -> None:
        atomic_write_json(self.path, {**self.record, "at": time.time()}, durable=False)

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._write()
            except OSError:
                pass  # a full or gone disk: the run's own writes say so

    def close(self, outcome: str = "ended") -> None:
        """Stop the heartbeat, remove the live record and leave ``ended/<role>.json`` (when, how) for
        ``role_status``."""
        self._stop.set()
        self.path.unlink(missing_ok=True)
        try:
            atomic_write_json(self.path.parent / ENDED_DIR / f"{self.record['role']}.json",
                              {**self.record, "at": time.time(), "outcome": outcome}, durable=False)
        except OSError:
            pass  # a full or gone disk: the run's own writes say so


def live_roles(run_dir: Path) -> list[dict]:
    """The records of the run's roles that are alive (``RoleRecord``), unreadable ones left out."""
    import json
    import socket

    out, now, host = [], time.time(), socket.gethostname()
    for path in sorted((Path(run_dir) / ROLES_DIR).glob("*.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if now - rec.get("at", 0) > STALE_S or (rec.get("host") == host and not _pid_alive(rec.get("pid", 0))):
            continue
        out.append(rec)
    return out


def register_role(run_dir: Path, role: str, gcs_address: str) -> RoleRecord:
    """Refuse, in one line, a role joining the run from another Ray cluster than its live roles (they would
    never meet: the Synchronizer is a named actor of one cluster); else record this one."""
    import socket

    host, pid = socket.gethostname(), os.getpid()
    for rec in live_roles(run_dir):
        if rec.get("gcs") != gcs_address and rec.get("pid") != pid:
            raise RunError(f"this {role} is in the Ray cluster at {gcs_address}, the run's live {rec.get('role')} "
                           f"(pid {rec.get('pid')} on {rec.get('host')}) in the one at {rec.get('gcs')}: roles of "
                           f"one run must share a cluster; start this one with --address {rec.get('gcs')}")
    path = Path(run_dir) / ROLES_DIR / f"{role}-{host}-{pid}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / ENDED_DIR / f"{role}.json").unlink(missing_ok=True)  # this role runs again
    return RoleRecord(path, {"role": role, "gcs": gcs_address, "host": host, "pid": pid})


def role_status(run_dir: Path, role: str, gcs_address: str | None = None) -> str:
    """What the run directory shows of ``role`` (``trainer``, ``explorer``, ``serve``), for the one line of a
    role that waits for it: alive (in this Ray cluster or in another, ``gcs_address`` being this one's), ended
    (when, how), or never started with this run directory."""
    import json

    now = time.time()
    live = [r for r in live_roles(run_dir) if r.get("role") == role]
    if live:
        r = live[0]
        where = ("in another Ray cluster, at " + str(r.get("gcs")) if gcs_address and r.get("gcs") != gcs_address
                 else "in Ray cluster " + str(r.get("gcs")))
        return (f"a live {role} (pid {r.get('pid')} on {r.get('host')}, {where}, heard {now - r.get('at', now):.0f}s "
                "ago)")
    try:
        ended = json.loads((Path(run_dir) / ROLES_DIR / ENDED_DIR / f"{role}.json").read_text())
    except (OSError, ValueError):
        ended = None
    gone = []  # records left behind by a role that never closed them: SIGKILLed, crashed, its node lost
    for path in (Path(run_dir) / ROLES_DIR).glob(f"{role}-*.json"):
        try:
            gone.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    gone = max(gone, key=lambda r: r.get("at", 0), default=None)
    if gone and (not ended or gone.get("at", 0) > ended.get("at", 0)):
        article = "an" if role[0] in "aeiou" else "a"
        return (f"{article} {role} that stopped without ending (pid {gone.get('pid')} on {gone.get('host')}, last heard "
                f"{now - gone.get('at', now):.0f}s ago: killed or crashed)")
    if ended:
        return (f"the {role} ended {now - ended.get('at', now):.0f}s ago ({ended.get('outcome', 'ended')}; pid "
                f"{ended.get('pid')} on {ended.get('host')})")
    return f"no {role} was ever started with this run directory"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError, TypeError):
        return True
    return True


def _answers(address: str, timeout_s: float = 1.0) -> bool:
    """Something accepts connections at ``host:port``."""
    import socket

    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return False
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def check_ray_address(address: str | None, timeout_s: float = 3.0) -> None:
    """Fail at once when the Ray cluster at ``address`` (``host:port`` or ``ray://host:port``) does not accept
    connections: ``ray.init`` would retry for a minute or more before saying so. ``auto``, ``local`` and
    forms this does not parse are left to ``ray.init``."""
    import socket

    if not address or address in ("auto", "local"):
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or "/" in host:
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as e:
        source = "" if address != os.environ.get("RAY_ADDRESS") else " (from RAY_ADDRESS)"
        raise RunError(f"cannot reach the Ray cluster at '{address}'{source}: {e.strerror or str(e) or type(e).__name__}; "
                       "start one with `ray start --head` (it prints its address) or give the right one with "
                       "--address / RAY_ADDRESS (leave both unset to join the `ray start` cluster of this node, or run on "
                       "a private Ray instance without one)") from None
