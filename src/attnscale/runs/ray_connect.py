"""Connect to Ray for ``--executor ray``: a local instance for one command, or a cluster.

The addresses ``--ray-address`` takes, as someone who runs Ray clusters writes them:
- none (or "local"): a Ray instance started for this command and shut down after it;
- ``HOST:PORT``: the head's GCS port (6379 unless ``ray start --head --port`` said
  otherwise); this process becomes a driver of that cluster, so it must be able
  to reach every node and every node must reach it;
- ``ray://HOST:PORT``: Ray Client (the head's client server, 10001 by default), for a
  machine outside the cluster (a laptop, a notebook); needs ``ray[client]`` here;
- ``auto``: the cluster ``ray start`` last started on this machine (or RAY_ADDRESS):
  how one local cluster serves many commands, so its start-up is paid once.

Every Ray process this module starts binds to 127.0.0.1 only, with the dashboard
off and usage statistics off; a cluster on the loopback address is joined the
same way, so nothing of this machine is exposed. An address where nothing answers
is a ConfigError at once (Ray itself would wait minutes). Ray is imported only
here and in ``runs.ray_executor``, when a command asks for it (the extra
``attnscale[ray]``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket

from attnscale.errors import ConfigError

__all__ = ["import_ray", "session", "start_local", "resolve_address", "this_host_only", "LOOPBACK"]

LOOPBACK = ("127.0.0.1", "localhost", "::1")
_START_HINT = "ray start --head --node-ip-address 127.0.0.1 --port 6379 --include-dashboard false --disable-usage-stats"


def import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor ray needs Ray: pip install -e '.[ray]' in the clone") from None
    return ray


@contextlib.contextmanager
def this_host_only():
    """Let a Ray node be 127.0.0.1. Ray turns that address into the host's outward
    one, and then listens on every interface, unless it runs in single-host mode,
    which it keys on RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, read at import into
    ``ray_constants``: both are set while the node starts (its processes inherit
    the variable) or joins, then put back, so a later join of a real cluster is
    untouched. Usage statistics are switched off the same way (RAY_USAGE_STATS_ENABLED=0)."""
    from ray._private import ray_constants

    names = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_USAGE_STATS_ENABLED")
    saved_env = {k: os.environ.get(k) for k in names}
    saved_flag = ray_constants.ENABLE_RAY_CLUSTER
    os.environ.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0")
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _quiet_token_notice():
    # Ray's token authentication stays on; its notice that it is on is not a warning to a user of
    # attnscale, whose stderr carries only progress and errors
    notice = logging.getLogger("ray._private.authentication.authentication_token_setup")
    before = notice.level
    notice.setLevel(logging.ERROR)
    try:
        yield
    finally:
        notice.setLevel(before)


def start_local(num_cpus: int | None = None) -> None:
    """Start a Ray instance on this machine for this process: 127.0.0.1 only, no
    dashboard, no usage statistics; ``num_cpus`` None lets Ray count them."""
    ray = import_ray()
    with _quiet_token_notice(), this_host_only():
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, logging_level=logging.WARNING)


def _host_port(address: str) -> tuple[str, int] | None:
    host, _, port = address.removeprefix("ray://").rpartition(":")
    return (host.strip("[]"), int(port)) if host and port.isdigit() else None


def resolve_address(address: str) -> str:
    """``address`` as Ray is asked to join it: "auto" becomes the HOST:PORT of the
    cluster ``ray start`` last started here (or RAY_ADDRESS's); a ConfigError, at
    once, when that finds none or nothing answers at the address."""
    if address == "auto":
        import_ray()
        from ray._private.services import canonicalize_bootstrap_address

        try:
            found = canonicalize_bootstrap_address("auto")
        except (ConnectionError, ValueError) as e:
            found, why = None, str(e).splitlines()[0] if str(e) else type(e).__name__
        else:
            why = "none was started"
        if not found:
            raise ConfigError(f"--ray-address auto: no Ray cluster runs on this machine ({why}); "
                              f"start one with `{_START_HINT}`, or give its address") from None
        address = found
    where = _host_port(address)
    if where is None:
        raise ConfigError(f"--ray-address {address!r} is not HOST:PORT, ray://HOST:PORT or auto; "
                          "give the head's address, e.g. 127.0.0.1:6379")
    try:
        socket.create_connection(where, timeout=5).close()
    except OSError as e:
        raise ConfigError(f"--ray-address {address}: no Ray cluster answers there ({e.strerror or e}); "
                          f"start its head with `{_START_HINT}` or fix the address") from None
    return address


def _join(address: str) -> None:
    ray = import_ray()
    loopback = _host_port(address)[0] in LOOPBACK
    if address.startswith("ray://"):
        try:
            import grpc  # noqa: F401 - Ray Client's transport; plain Ray Core does not need it
        except ImportError:
            raise ConfigError(f"--ray-address {address}: Ray Client needs its extra here: "
                              "pip install -e '.[ray]' in the clone (which brings 'ray[client]')") from None
    with _quiet_token_notice(), this_host_only() if loopback else contextlib.nullcontext():
        try:
            ray.init(address=address, logging_level=logging.WARNING)
        except ConnectionError as e:  # Ray Client: the head's client server answered but could not serve us
            why = next((line.strip() for line in reversed(str(e).splitlines()) if line.strip()), type(e).__name__)
            raise ConfigError(f"--ray-address {address}: the cluster answered but would not take this driver ({why}); "
                              "see the head's ray_client_server*.err logs") from None


@contextlib.contextmanager
def session(address: str | None = None, num_cpus: int | None = None):
    """Yield the ``ray`` module connected to a cluster: the one this process is
    already connected to (left connected), else the one at ``address`` (see the module
    docstring), else a local instance of ``num_cpus`` CPUs started now (also for
    ``address`` "local"); the last two are let go on exit."""
    ray = import_ray()
    address = None if address == "local" else address
    if address:
        address = resolve_address(address)
    if ray.is_initialized():
        yield ray
        return
    if address:
        _join(address)
    else:
        start_local(num_cpus)
    try:
        yield ray
    finally:
        ray.shutdown()
