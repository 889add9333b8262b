"""Endpoint rules and CURVE key loading for ``mvl-score/1`` sockets.

:func:`check_bind_endpoint` enforces the bind rules of docs/protocol.md ("Sockets and
endpoints") before a server binds:
``ipc://`` parent directories are created private (0700), ``tcp://`` on anything but
a loopback address is refused unless CURVE is configured, ``inproc://`` is allowed.
:func:`load_curve_server_keys` / :func:`load_curve_client_keys` read ZeroMQ
certificate files (``zmq.auth``); :func:`apply_curve_server` and
:func:`apply_curve_client` set them on a socket. This module does not open or bind
sockets itself.

The admin token (docs/teacher-server.md, "Who may do what"): without CURVE a teacher proves nothing
about its clients, so admin messages carry a random token the teacher writes at start
to a 0600 file. :func:`admin_token_path` says where (beside an ``ipc://`` socket, beside
``--log`` for ``tcp://``, else a per-user directory), :func:`write_admin_token` and
:func:`read_admin_token` handle the file, :func:`default_admin_token_file` is what the
admin commands and the student read when told nothing.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from miniverl.common.errors import ConfigError
from miniverl.common.names import make_private_dirs

DEFAULT_TCP_ENDPOINT = "tcp://127.0.0.1:5555"
IPC_PATH_MAX = 107  # sun_path is 108 bytes on Linux, one for the NUL
ADMIN_TOKEN_SUFFIX = ".admin-token"


def ipc_endpoint(run_dir: str | os.PathLike) -> str:
    """The teacher endpoint under ``miniverl up``: ``ipc://<run_dir>/teacher.sock``."""
    return f"ipc://{Path(run_dir).resolve() / 'teacher.sock'}"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name, an address, or an address in brackets) is this machine's
    loopback: the one bind that needs no key, on the ZeroMQ and the HTTP side alike."""
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

    ``ipc://``: the socket's missing directories are created with mode 0700 (an existing
    directory is left as it is, its mode included; :func:`make_private_dirs`). ``tcp://``: a non-loopback host (``*``,
    ``0.0.0.0``, a LAN address, a host name) needs CURVE keys, else :class:`ConfigError`.
    """
    check_endpoint(endpoint)
    scheme, rest = endpoint.split("://", 1)
    if scheme == "ipc":
        # Only the folders made here become 0700: an existing one, reached through '..'
        # or not, keeps its mode (a resolved parent's chmod once set the machine's
        # temporary folder to 0700; issue 53).
        make_private_dirs(Path(rest).parent)
    elif scheme == "tcp":
        host = rest.rpartition(":")[0]
        if not is_loopback(host) and not curve_configured:
            raise ConfigError(
                f"refusing to bind {endpoint}: {host!r} is not a loopback address and CURVE is "
                "not configured; bind tcp://127.0.0.1:PORT or pass a server secret key and an "
                "authorized-clients directory"
            )
    return endpoint


def _token_home() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime and Path(runtime).is_dir() else Path.home() / ".cache"
    return base / "miniverl" / "admin-tokens"


def admin_token_path(endpoint: str, log: str | os.PathLike | None = None) -> Path:
    """Where a teacher bound at ``endpoint`` keeps its admin token.

    ``ipc://DIR/NAME.sock`` → ``DIR/NAME.admin-token`` (the socket's private directory);
    ``tcp://`` with a log file → beside the log (``teacher.log`` → ``teacher.admin-token``);
    otherwise a per-user directory (``$XDG_RUNTIME_DIR`` or ``~/.cache``, then
    ``miniverl/admin-tokens/``) keyed by the endpoint, e.g. ``tcp-127.0.0.1-5555.admin-token``.
    """
    scheme, rest = check_endpoint(endpoint).split("://", 1)
    if scheme == "ipc":
        return Path(rest).with_suffix(ADMIN_TOKEN_SUFFIX)
    if log is not None:
        return Path(log).with_suffix(ADMIN_TOKEN_SUFFIX)
    key = re.sub(r"[^A-Za-z0-9.]+", "-", f"{scheme}-{rest}").strip("-")
    return _token_home() / f"{key}{ADMIN_TOKEN_SUFFIX}"


def default_admin_token_file(endpoint: str) -> Path | None:
    """The token file a teacher at ``endpoint`` wrote when given no ``--log``, if it exists
    (``ipc://``: beside the socket; ``tcp://``: the per-user directory); else None."""
    try:
        path = admin_token_path(endpoint)
    except ConfigError:
        return None
    return path if path.is_file() else None


def write_admin_token(path: str | os.PathLike, token: str) -> Path:
    """Write ``token`` to ``path``, readable by this user only (0600; directory 0700 when
    created). Written under a temporary name and renamed, so a reader sees one token."""
    file = Path(path)
    if not file.parent.exists():
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = file.with_name(f".{file.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, token.encode("ascii") + b"\n")
    finally:
        os.close(fd)
    os.replace(tmp, file)
    return file


def read_admin_token(path: str | os.PathLike) -> str:
    """The token in ``path``; :class:`ConfigError` naming the file when it cannot be used."""
    file = Path(path)
    try:
        token = file.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = "does not exist" if isinstance(exc, FileNotFoundError) else f"cannot be read ({exc})"
        raise ConfigError(
            f"admin token file {str(file)!r} {reason}; pass the file the teacher wrote at start "
            "(its log line 'admin_token' names it) with --admin-token FILE"
        ) from None
    if not token or len(token) > 256:
        raise ConfigError(
            f"admin token file {str(file)!r} holds no token; restart the teacher to write a new one"
        )
    return token


@dataclass(frozen=True)
class CurveServerKeys:
    """A server's CURVE key pair (z85 bytes), the directory of authorized client keys and
    the admin keys (their z85 public keys: the ZAP user ids of admin connections)."""

    public: bytes
    secret: bytes
    authorized_dir: Path
    admin_dir: Path | None = None
    admin_ids: frozenset[str] = frozenset()


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
            "`miniverl teacher keys DIR`"
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


def _public_keys(folder: Path, what: str) -> frozenset[str]:
    import zmq.auth

    if not folder.is_dir() or not any(folder.glob("*.key")):
        raise ConfigError(
            f"{what} directory {str(folder)!r} holds no '*.key' public keys; copy each "
            "client's public certificate there (`miniverl teacher keys DIR` makes them)"
        )
    return frozenset(key.decode("ascii") for key in zmq.auth.load_certificates(str(folder)))


def load_curve_server_keys(
    secret_file: str | os.PathLike,
    authorized_dir: str | os.PathLike,
    admin_dir: str | os.PathLike | None = None,
) -> CurveServerKeys:
    """Read the server's secret certificate and check the authorized-clients directory
    (scoring clients) and, when given, the admin directory (keys that may also send
    RELOAD, PARK, WAKE, SHUTDOWN; they may connect without being listed twice)."""
    public, secret = _load_certificate(secret_file, need_secret=True)
    assert secret is not None  # need_secret: a certificate without one was refused
    folder = Path(authorized_dir)
    _public_keys(folder, "authorized-clients")
    admins = Path(admin_dir) if admin_dir is not None else None
    admin_ids = _public_keys(admins, "admin-keys") if admins is not None else frozenset()
    return CurveServerKeys(public=public, secret=secret, authorized_dir=folder,
                           admin_dir=admins, admin_ids=admin_ids)


def load_curve_client_keys(
    secret_file: str | os.PathLike, server_public_file: str | os.PathLike
) -> CurveClientKeys:
    """Read a client's secret certificate and the server's public certificate."""
    public, secret = _load_certificate(secret_file, need_secret=True)
    assert secret is not None  # need_secret: a certificate without one was refused
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
    import zmq.auth
    from zmq.auth.thread import ThreadAuthenticator

    auth = ThreadAuthenticator(context)
    auth.start()
    auth.configure_curve(domain="*", location=str(keys.authorized_dir))
    if keys.admin_dir is not None:  # admin keys connect too; they are not listed twice
        auth.certs["*"].update(zmq.auth.load_certificates(str(keys.admin_dir)))
    return auth


def apply_curve_client(socket, keys: CurveClientKeys) -> None:
    """Make ``socket`` a CURVE client of the server whose public key is in ``keys``."""
    socket.curve_secretkey = keys.secret
    socket.curve_publickey = keys.public
    socket.curve_serverkey = keys.server_public


def create_curve_keys(folder: str | os.PathLike) -> dict[str, Path]:
    """Create a teacher's CURVE certificates in ``folder`` (0700 when created here) and
    return their paths.

    ``server.key_secret`` (the teacher's), ``server.key`` (its public key: every client
    needs it), ``student.key_secret`` and ``admin.key_secret`` (the clients'), and the
    teacher's lists: ``authorized/student.key`` (scoring clients) and ``admins/admin.key``.
    Secret files are 0600. Existing key files are never overwritten (:class:`ConfigError`).
    """
    import zmq.auth

    root = Path(folder)
    paths = {
        "server_secret": root / "server.key_secret",
        "server_public": root / "server.key",
        "student_secret": root / "student.key_secret",
        "admin_secret": root / "admin.key_secret",
        "authorized_dir": root / "authorized",
        "admin_dir": root / "admins",
    }
    taken = [str(p) for p in (*list(paths.values())[:4], root / "authorized" / "student.key",
                              root / "admins" / "admin.key") if p.exists()]
    if taken:
        raise ConfigError(
            f"{taken[0]} already exists; keys are never overwritten: pick an empty "
            "directory or remove the old keys first"
        )
    for folder_path in (root, paths["authorized_dir"], paths["admin_dir"]):
        make_private_dirs(folder_path)  # an existing folder keeps its mode
    zmq.auth.create_certificates(str(root), "server")
    for name, listed in (("student", "authorized_dir"), ("admin", "admin_dir")):
        zmq.auth.create_certificates(str(root), name)
        os.replace(root / f"{name}.key", paths[listed] / f"{name}.key")
    for key in ("server_secret", "student_secret", "admin_secret"):
        os.chmod(paths[key], 0o600)
    return paths


def curve_key_files(secret: str | None, server: str | None) -> tuple[str, str] | None:
    """``(secret key file, server public key file)`` from a pair of flags; None when
    neither is given, :class:`ConfigError` when only one is."""
    if not secret and not server:
        return None
    if not (secret and server):
        raise ConfigError(
            "CURVE needs both --curve-secret-key FILE (this client's secret key) and "
            "--curve-server-key FILE (the teacher's server.key); `miniverl teacher keys DIR` "
            "makes them"
        )
    return str(secret), str(server)
