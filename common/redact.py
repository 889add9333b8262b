"""Redaction of secrets and local paths from anything meant to be shared.

``redact(obj)`` walks dicts, lists and strings and returns a copy in which access
tokens (Hugging Face, OpenAI-style, GitHub, AWS keys, bearer headers, credentials in
URLs), values stored under secret-looking keys (``token``, ``password``,
``api_key``, ...) and local paths (home directories, other absolute paths) are
replaced by placeholders. It is a last line of defence for reports, bundles and
shared manifests, not a guarantee: it cannot know every secret format.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

SECRET = "<redacted>"
HOME = "~"

_SECRET_PATTERNS = [
    re.compile(r"\bhf_[A-Za-z0-9]{16,}"),  # Hugging Face
    re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"),  # OpenAI-style keys
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),  # GitHub
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"),
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),  # Slack
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),  # AWS access key id
    re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S),
]
# key=value / key: value pairs inside free text, e.g. "password=hunter2".
_ASSIGNMENT = re.compile(
    r"(?i)\b((?:api[_-]?key|access[_-]?key|secret[_-]?key|secret|token|password|passwd|pwd)"
    r"\s*[=:]\s*)([^\s,;'\"]+)"
)
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@")
_SECRET_KEYS = re.compile(
    r"(?i)(^|_|-)(token|secret|password|passwd|api_?key|access_?key|private_?key|"
    r"authorization|credentials?|cookie)($|_|-)"
)
# Home directories of any user, on Linux, macOS and Windows.
_HOME_DIRS = [
    re.compile(r"/home/[^/\s'\"]+"),
    re.compile(r"/Users/[^/\s'\"]+"),
    re.compile(r"(?<![\w/])/root(?=/|\b)"),
    re.compile(r"(?i)\b[A-Z]:\\Users\\[^\\\s'\"]+"),
]
# Any other absolute path of two or more components (not inside a URL: the
# lookbehind rejects "scheme://host/path", "Qwen/Qwen3" and "km/h").
_IPC_PATH = re.compile(r"ipc://(/[^\s'\"]+)")
_ABS_PATH = re.compile(r"(?<![\w:/.~<>-])(/[\w.@+-]+(?:/[\w.@+-]+)+)/?")


def _redact_path(match: re.Match[str]) -> str:
    return "<path>/" + match.group(1).rstrip("/").rsplit("/", 1)[-1]


def redact_text(text: str, paths: bool = True) -> str:
    """Redact secrets (and local paths unless ``paths=False``) inside one string."""
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(SECRET, text)
    text = _ASSIGNMENT.sub(lambda m: m.group(1) + SECRET, text)
    text = _URL_CREDENTIALS.sub(lambda m: m.group(1) + SECRET + "@", text)
    if paths:
        home = str(Path.home())
        if len(home) > 1:
            text = text.replace(home, HOME)
        for pattern in _HOME_DIRS:
            text = pattern.sub(HOME, text)
        text = _IPC_PATH.sub(lambda m: "ipc://<path>/" + m.group(1).rsplit("/", 1)[-1], text)
        text = _ABS_PATH.sub(_redact_path, text)
    return text


def is_secret_key(key: str) -> bool:
    """True for mapping keys whose values are secrets by name (``hf_token``, ``password``)."""
    return bool(_SECRET_KEYS.search(key))


def redact(obj: Any, paths: bool = True) -> Any:
    """A redacted copy of ``obj`` (dicts, lists, tuples, strings; other values unchanged)."""
    if isinstance(obj, str):
        return redact_text(obj, paths)
    if isinstance(obj, os.PathLike):
        return redact_text(os.fspath(obj), paths)
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            if isinstance(key, str) and is_secret_key(key) and value not in (None, "", False):
                out[key] = SECRET
            else:
                out[key] = redact(value, paths)
        return out
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact(item, paths) for item in obj)
    return obj
