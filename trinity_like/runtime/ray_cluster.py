"""The Ray connection of a job: join the cluster it names, or start a local instance; fail in one line when the
named cluster cannot be reached."""

from __future__ import annotations

import os

from trinity_like.common.errors import RunError
from trinity_like.config import Config
from trinity_like.runtime.paths import namespace_of


def init_ray(cfg: Config, address: str | None = None) -> None:
    """Join the Ray cluster at ``address`` (or ``RAY_ADDRESS``, which ``ray job submit`` sets for its jobs);
    without one, start a local instance for this job. A test session's instance is reused as it is."""
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    kwargs = dict(namespace=namespace_of(cfg), log_to_driver=False, configure_logging=False)
    if not address or address == "local":  # "local": Ray's word for a new private instance (the tests set it)
        ray.init(address="local", include_dashboard=False, **kwargs)
        return
    check_ray_address(address)
    try:
        ray.init(address=address, **kwargs)
    except (ConnectionError, RuntimeError) as e:
        raise RunError(f"cannot reach the Ray cluster at '{address}' ({str(e).splitlines()[0][:120]}); start one "
                       "with `ray start --head` or give its address with --address / RAY_ADDRESS") from None



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
                       "--address / RAY_ADDRESS (leave both unset to run on a local Ray instance)") from None
