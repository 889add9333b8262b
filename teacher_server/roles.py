"""Who may do what on a teacher (docs/teacher-server.md, "Who may do what"): admin admission.

Scoring clients may ``HELLO``, ``SCORE``, ``PING`` and ``STATUS``. The admin messages
``RELOAD``, ``PARK``, ``WAKE`` and ``SHUTDOWN`` need proof, decided once at bind time
(:func:`setup`) and checked per message (:func:`refusal`) before anything else looks at
the message, so a refused one changes nothing and learns nothing (not the teacher's
state, not whether a path exists):

- **CURVE** configured: the connection's key must be an admin key (``--curve-admin-dir``);
  ZeroMQ's authenticator names the key of every message (the ZAP ``User-Id``). The token
  is not accepted: over CURVE the key is the identity.
- **no CURVE** (``ipc://``, loopback ``tcp://``): the header field ``auth`` must equal a
  random token (``secrets.token_hex(32)``) the server wrote at start to a 0600 file
  (``protocol/endpoints.py``: beside the socket or the log); compared in constant time.
- ``inproc://`` without a configured token: only this process can connect; no proof.

This module does not read the socket or run the lifecycle (``server.py``, ``lifecycle.py``).
"""

from __future__ import annotations

import contextlib
import hmac
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from miniverl.protocol import messages as m
from miniverl.protocol.endpoints import (
    CurveServerKeys,
    admin_token_path,
    write_admin_token,
)
from miniverl.teacher_server.server_state import ServerState, log

SCORING_TYPES = frozenset({"HELLO", "SCORE", "PING", "STATUS"})


@dataclass(frozen=True)
class AdminRule:
    """The proof admin messages need on this server (see the module docstring)."""

    curve: bool = False
    admin_ids: frozenset[str] = frozenset()  # CURVE: z85 public keys of admin keys
    token: str | None = None  # no CURVE: what ``auth`` must carry
    token_file: Path | None = None  # where the token was written (removed at stop)
    open: bool = False  # inproc without a configured token: this process only


def setup(srv: ServerState, curve: CurveServerKeys | None) -> AdminRule:
    """Decide the rule for the bound server; writes the token file when there is one."""
    cfg = srv.config
    if curve is not None:
        rule = AdminRule(curve=True, admin_ids=curve.admin_ids)
        log(srv, "info", "admin_keys", count=len(curve.admin_ids),
            admin_dir=str(curve.admin_dir) if curve.admin_dir else None)
        return rule
    if cfg.admin_token is None and (srv.endpoint or cfg.endpoint).startswith("inproc://"):
        return AdminRule(open=True)
    token = cfg.admin_token or secrets.token_hex(32)
    path = None
    if cfg.admin_token_file is not None or not (srv.endpoint or "").startswith("inproc://"):
        path = write_admin_token(cfg.admin_token_file or admin_token_path(srv.endpoint), token)
        log(srv, "info", "admin_token", path=str(path))
    return AdminRule(token=token, token_file=path)


def close(rule: AdminRule | None) -> None:
    """Remove the token file if it still holds this server's token (a teacher restarted
    at the same endpoint may have replaced it)."""
    if rule is None or rule.token_file is None:
        return
    with contextlib.suppress(OSError):
        if rule.token_file.read_text(encoding="ascii").strip() == rule.token:
            rule.token_file.unlink()


def user_id(frame: Any) -> str | None:
    """The ZAP ``User-Id`` of a received frame (the z85 public key under CURVE), or None."""
    try:
        value = frame.get("User-Id")
    except (zmq.ZMQError, AttributeError, TypeError):
        return None
    return value or None


def refusal(rule: AdminRule | None, msg: m.Message, sender: str | None) -> str | None:
    """None when ``msg`` may be handled; else the ``UNAUTHORIZED`` message (the same for a
    missing and a wrong proof, and it names no path or state)."""
    if msg.t not in m.ADMIN_TYPES:
        return None
    if rule is not None and rule.open:
        return None
    if rule is not None and rule.curve:
        if sender is not None and sender in rule.admin_ids:
            return None
        return (
            f"{msg.t} needs an admin CURVE key and this connection's key is not one; "
            "connect with a key from the teacher's --curve-admin-dir; nothing was changed"
        )
    supplied = getattr(msg, "auth", None)
    if (
        rule is not None
        and rule.token is not None
        and supplied is not None
        and hmac.compare_digest(supplied.encode("utf-8"), rule.token.encode("utf-8"))
    ):
        return None
    return (
        f"{msg.t} needs the teacher's admin token in the header field 'auth' "
        f"(`miniverl teacher {msg.t.lower()} --admin-token FILE` sends it); nothing was changed"
    )
