"""One exception hierarchy for miniverl.

Every error a user can cause derives from :class:`MiniverlError` and also from the
stdlib error it replaces, so ``except ValueError`` still catches a bad config.
Messages say what went wrong, the rule it broke and what to run next; the CLI prints
them as one line and exits 1.
"""

from __future__ import annotations


class MiniverlError(Exception):
    """Root of every error miniverl raises on purpose."""


class ConfigError(MiniverlError, ValueError):
    """A recipe or a command-line value breaks a rule."""


class ProtocolError(MiniverlError, ValueError):
    """A message on the wire is malformed or breaks ``mvl-score/1``."""


class TokenizerMismatch(MiniverlError, ValueError):
    """Student and teacher tokenizers differ; cross-tokenizer distillation is refused."""


class TeacherUnavailable(MiniverlError, ConnectionError):
    """The teacher did not answer within the recipe's unavailable timeout."""


class TeacherError(MiniverlError, RuntimeError):
    """The teacher answered a request with a non-retryable ``ERROR``."""


class Unauthorized(TeacherError):
    """The teacher refused an admin message (``ERROR UNAUTHORIZED``): no admin proof."""


class TeacherRefusing(TeacherUnavailable, TeacherError):
    """The teacher answered a SCORE with a non-retryable ``ERROR`` (it cannot serve this
    request: an adapter it no longer serves, a kind it does not give). The run treats it
    as an unavailable teacher, not as a protocol error: a route of several is held back
    for that update, and the run goes on with the others (docs/several-teachers.md)."""


class AdapterNotServed(TeacherError):
    """The teacher does not serve the adapter this client scores with: it refused the
    ``HELLO`` naming it, or its ``HELLO_OK`` does not list it (docs/protocol.md, "Adapters")."""


class StaleTargetError(MiniverlError, RuntimeError):
    """A target belongs to another student version or teacher generation than asked."""


class ProvenanceError(MiniverlError, ValueError):
    """A trajectory, mask, cache entry or checksum does not match what was recorded."""


class RunLockedError(MiniverlError, RuntimeError):
    """Another process holds the run directory's lock."""


class DiskFullError(MiniverlError, OSError):
    """A write failed because the disk (or quota) is full; names the path and free space."""

    def __str__(self) -> str:
        # OSError's own str() would prefix "[Errno 28]" to the one-line message.
        return str(self.strerror)


class MissingExtraError(MiniverlError, ImportError):
    """An optional dependency group is not installed."""

    def __init__(self, package: str, extra: str):
        super().__init__(
            f"{package} is not installed; it comes with the '{extra}' extra: "
            f'pip install -e ".[{extra}]"'
        )
        self.package = package
        self.extra = extra


def require(module: str, extra: str):
    """Import ``module`` or raise :class:`MissingExtraError` naming the extra to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError(module, extra) from exc
