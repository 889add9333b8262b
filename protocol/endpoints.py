"""Endpoint rules and CURVE key loading for ``mvl-score/1`` sockets.

:func:`check_bind_endpoint` enforces DESIGN §3's bind rules before a server binds:
``ipc://`` parent directories are created private (0700), ``tcp://`` on anything but
a loopback address is refused unless CURVE is configured, ``inproc://`` is allowed.
:func:`load_curve_server_keys` / :func:`load_curve_client_keys` read ZeroMQ
certificate files (``zmq.auth``); :func:`apply_curve_server` and
:func:`apply_curve_client` set them on a socket. This module does not open or bind
sockets itself.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from miniverl.common.errors import ConfigError

DEFAULT_TCP_ENDPOINT = "tcp://127.0.0.1:5555"
IPC_PATH_MAX = 107  # sun_path is 108 bytes on Linux, one for the NUL


def ipc_endpoint(run_dir: str | os.PathLike) -> str:
    """The teacher endpoint under ``miniverl up``: ``ipc://<run_dir>/teacher.sock``."""
    return f"ipc://{Path(run_dir).resolve() / 'teacher.sock'}"


def _is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_endpoint(endpoint: str) -> str:
    """Reject an endpoint ZeroMQ would misread; returns it unchanged."""
    if not isinstance(endpoint, str) or "://" not in endpoint:
        raise ConfigError(
            f"endpoint {endpoint!r} has no transport; use tcp://HOST:PORT, ipc://PATH or inproc://NAME"
        )
    scheme, rest = endpoint.split("://", 1)
    if scheme not in ("tcp", "ipc", "inproc"):
        raise ConfigError(f"endpoint {endpoint!r}: transport {scheme!r} is not tcp, ipc or inproc")
    if not rest:
        raise ConfigError(f"endpoint {endpoint!r} names no address; e.g. {DEFAULT_TCP_ENDPOINT}")
    if scheme == "tcp":
        host, sep, port = rest.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(
                f"endpoint {endpoint!r} needs tcp://HOST:PORT with a port in 1..65535"
            )
    if scheme == "ipc" and len(rest.encode()) > IPC_PATH_MAX:
        raise ConfigError(
            f"ipc path {rest!r} is {len(rest.encode())} bytes; the OS limit is {IPC_PATH_MAX}; "
            "use a shorter run directory or a tcp:// endpoint"
        )
    return endpoint


def check_bind_endpoint(endpoint: str, curve_configured: bool) -> str:
    """Validate a server bind endpoint and prepare it; returns the endpoint.

    ``ipc://``: the socket's directory is created with mode 0700 when missing (an
    existing directory is left as it is). ``tcp://``: a non-loopback host (``*``,
    ``0.0.0.0``, a LAN address, a host name) needs CURVE keys, else :class:`ConfigError`.
    """
    check_endpoint(endpoint)
    scheme, rest = endpoint.split("://", 1)
    if scheme == "ipc":
        parent = Path(rest).parent
        if not parent.exists():
            parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(parent, 0o700)
    elif scheme == "tcp":
        host = rest.rpartition(":")[0]
        if not _is_loopback(host) and not curve_configured:
            raise ConfigError(
                f"refusing to bind {endpoint}: {host!r} is not a loopback address and CURVE is "
                "not configured; bind tcp://127.0.0.1:PORT or pass a server secret key and an "
                "authorized-clients directory"
            )
    return endpoint


@dataclass(frozen=True)
class CurveServerKeys:
    """A server's CURVE key pair (z85 bytes) and the directory of authorized client keys."""

    public: bytes
    secret: bytes
    authorized_dir: Path


@dataclass(frozen=True)
class CurveClientKeys:
    """A client's CURVE key pair and the server public key it expects (z85 bytes)."""

    public: bytes
    secret: bytes
    server_public: bytes


def _load_certificate(path: str | os.PathLike, need_secret: bool) -> tuple[bytes, bytes | None]:
    import zmq.auth

    file = Path(path)
    if not file.is_file():
        raise ConfigError(
            f"CURVE key file {str(file)!r} does not exist; create keys with "
            "zmq.auth.create_certificates(DIR, NAME)"
        )
    try:
        public, secret = zmq.auth.load_certificate(str(file))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"CURVE key file {str(file)!r} cannot be read: {exc}") from None
    if need_secret and not secret:
        raise ConfigError(
            f"CURVE key file {str(file)!r} holds no secret key; pass the '.key_secret' file"
        )
    return public, secret


def load_curve_server_keys(
    secret_file: str | os.PathLike, authorized_dir: str | os.PathLike
) -> CurveServerKeys:
    """Read the server's secret certificate and check the authorized-clients directory."""
    public, secret = _load_certificate(secret_file, need_secret=True)
    folder = Path(authorized_dir)
    if not folder.is_dir() or not any(folder.glob("*.key")):
        raise ConfigError(
            f"authorized-clients directory {str(folder)!r} holds no '*.key' public keys; "
            "copy each client's public certificate there"
        )
    return CurveServerKeys(public=public, secret=secret, authorized_dir=folder)


def load_curve_client_keys(
    secret_file: str | os.PathLike, server_public_file: str | os.PathLike
) -> CurveClientKeys:
    """Read a client's secret certificate and the server's public certificate."""
    public, secret = _load_certificate(secret_file, need_secret=True)
    server_public, _ = _load_certificate(server_public_file, need_secret=False)
    return CurveClientKeys(public=public, secret=secret, server_public=server_public)


def apply_curve_server(socket, keys: CurveServerKeys) -> None:
    """Make ``socket`` a CURVE server (call before bind). Authentication of client
    keys needs an authenticator on the context: :func:`start_curve_authenticator`."""
    socket.curve_secretkey = keys.secret
    socket.curve_publickey = keys.public
    socket.curve_server = True


def start_curve_authenticator(context, keys: CurveServerKeys):
    """Start a thread authenticator on ``context`` admitting only authorized client keys.

    Returns the authenticator; call its ``stop()`` when the server closes.
    """
    from zmq.auth.thread import ThreadAuthenticator

    auth = ThreadAuthenticator(context)
    auth.start()
    auth.configure_curve(domain="*", location=str(keys.authorized_dir))
    return auth


def apply_curve_client(socket, keys: CurveClientKeys) -> None:
    """Make ``socket`` a CURVE client of the server whose public key is in ``keys``."""
    socket.curve_secretkey = keys.secret
    socket.curve_publickey = keys.public
    socket.curve_serverkey = keys.server_public
