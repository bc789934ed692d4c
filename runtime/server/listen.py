"""The listening sockets of `pagoda serve`, bound before anything slow happens.

Why first: a port in use or a host that is not this machine's must fail in a fraction of a
second with one line, not after the model has loaded (uvicorn binds only once its lifespan has
started, which starts the engine). The sockets are bound at once, which finds a port another
server listens on, but they `listen` only after the other start-up checks (`start_listening`):
until then a client is refused rather than left waiting on a server that may still exit 2.
The same sockets are handed to uvicorn, so no other process can take the port in between
(short of one that also sets SO_REUSEADDR and listens first, which `start_listening` reports).

Torch-free: `server/cli.py` calls this before importing the engine.
"""

from __future__ import annotations

import contextlib
import errno
import socket

BACKLOG = 2048  # uvicorn's default


def bind_sockets(host: str, port: int) -> list[socket.socket]:
    """Listening TCP sockets for every address `host` resolves to (as asyncio's
    `create_server(host=...)` would bind); ValueError with one readable line otherwise."""
    try:
        infos = socket.getaddrinfo(
            host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
        )
    except (socket.gaierror, UnicodeError) as e:
        raise ValueError(f"host {host!r} is not an address or a name this machine resolves "
                         f"({_reason(e)})") from e  # fmt: skip
    sockets: list[socket.socket] = []
    seen: set[tuple] = set()
    try:
        for family, kind, proto, _, addr in infos:
            if (family, addr[:2]) in seen:
                continue
            seen.add((family, addr[:2]))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # restart over TIME_WAIT
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # v4 binds its own
            try:
                sock.bind(addr)
            except OSError as e:
                raise ValueError(_bind_error(host, port, addr, e)) from e
            sock.set_inheritable(True)
            if port == 0:  # one ephemeral port for every address, as asyncio does
                port = sock.getsockname()[1]
    except BaseException:
        close_all(sockets)
        raise
    return sockets


def start_listening(sockets: list[socket.socket], host: str) -> None:
    """Accept connections from now on; ValueError (one line) if another server took the port."""
    for sock in sockets:
        try:
            sock.listen(BACKLOG)
        except OSError as e:
            addr = sock.getsockname()
            raise ValueError(_bind_error(host, addr[1], addr, e)) from e


FD_MARGIN = 256  # model files, the engine's threads, the probe reserve (32), a burst of accepts


def ensure_fd_limit(max_connections: int, *, adjustable: bool = False) -> int:
    """Raise this process's soft open-file limit (up to the hard one) so that
    `max_connections` sockets fit with room to spare, and return the cap to use: the same, or
    (`adjustable`: the flag was left at its default) what the hard limit allows. ValueError
    (one line) when an explicit cap cannot fit."""
    try:
        import resource
    except ImportError:  # not POSIX
        return max_connections
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2 * max_connections + FD_MARGIN  # accepted connections wait a moment before eviction
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY or soft >= max_connections + FD_MARGIN:
        return max_connections
    if adjustable and soft >= 2 * FD_MARGIN:
        return soft - FD_MARGIN
    raise ValueError(
        f"--max-connections {max_connections} needs at least {max_connections + FD_MARGIN} "
        f"open files, and this process may open {soft} (ulimit -n); lower --max-connections "
        "or raise the limit"
    )


def close_all(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.close()


def bound_port(sockets: list[socket.socket]) -> int:
    """The port the sockets listen on (the ephemeral one when `--port 0`)."""
    return sockets[0].getsockname()[1]


def _bind_error(host: str, port: int, addr: tuple, e: OSError) -> str:
    where = f"{host}:{port}" if host == addr[0] else f"{host}:{port} ({addr[0]})"
    if e.errno == errno.EADDRINUSE:
        return f"port {port} is already in use on {where}; stop the other server or pick --port"
    if e.errno == errno.EADDRNOTAVAIL:
        return f"host {host!r} is not an address of this machine ({addr[0]}); use --host"
    if e.errno == errno.EACCES:
        return (f"permission denied to bind {where} (ports below 1024 need root or "
                "CAP_NET_BIND_SERVICE)")  # fmt: skip
    return f"cannot listen on {where}: {_reason(e)}"


def _reason(e: BaseException) -> str:
    return e.strerror if isinstance(e, OSError) and e.strerror else str(e)
