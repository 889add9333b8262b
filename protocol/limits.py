"""Size limits for ``mvl-score/1`` messages, checked by the codec before any array is built.

A :class:`Limits` says how large a header, a frame or a request may be. The codec
applies it while decoding (``decode(frames, limits)``); the server builds one from its
configuration and advertises ``max_tokens``/``max_positions``/``max_inflight`` and
``k_max`` in ``HELLO_OK``; the client narrows its own copy to what the teacher
advertised (:meth:`Limits.from_hello`). Once a model is loaded the server bounds its
limits by the model's context (:meth:`Limits.for_context`): no sequence longer than
the context, and ``max_tokens`` defaults to it. This module holds numbers only: it does
not decode, validate semantics or talk to sockets.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MAX_HEADER_BYTES = 65536
"""docs/protocol.md, "Framing": the msgpack header (frame 0) is at most 64 KiB."""
CONTROL_MESSAGES = 16
"""Room in a socket's receive queue beyond the SCOREs and their resends: HELLO, PING,
STATUS, admin messages and their replies (:meth:`Limits.receive_hwm`)."""


class Limits(BaseModel):
    """Caps applied while decoding a message; every cap is an inclusive maximum."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_header_bytes: int = Field(
        MAX_HEADER_BYTES, ge=64, le=MAX_HEADER_BYTES, description="Bytes in frame 0 (msgpack)."
    )
    max_str_len: int = Field(
        8192, ge=16, le=MAX_HEADER_BYTES, description="Bytes in one msgpack string."
    )
    max_array_len: int = Field(
        256, ge=4, le=4096, description="Items in one msgpack list (not a data array)."
    )
    max_map_len: int = Field(128, ge=8, le=4096, description="Keys in one msgpack map.")
    max_arrays: int = Field(8, ge=1, le=64, description="Data arrays (frames 1..n) per message.")
    max_dims: int = Field(4, ge=1, le=8, description="Dimensions of one data array.")
    max_array_bytes: int = Field(
        2**32, ge=1, le=2**40, description="Bytes in one data frame (a [P, V] fp32 block)."
    )
    max_tokens: int = Field(
        262144, ge=1,
        description="Packed tokens N in one SCORE; a server defaults it to its model's context.",
    )
    max_seq_len: int | None = Field(
        None, ge=1, description="Tokens in one sequence (the teacher model's context); not "
        "on the wire: a server sets it, a longer sequence is TOO_LARGE.",
    )
    max_sequences: int = Field(65536, ge=1, description="Sequences B in one SCORE.")
    max_positions: int = Field(65536, ge=1, description="Scored positions P in one SCORE.")
    max_inflight: int = Field(64, ge=1, description="SCORE requests one client may have open.")
    max_k: int = Field(1024, ge=1, description="Largest top-k a SCORE may ask for.")
    max_exact_vocab: int = Field(
        262144, ge=1, description="Largest vocabulary an exact [P, V] reply may carry."
    )
    max_episode_bytes: int = Field(
        1 << 20, ge=1, description="Largest episode (UTF-8 JSON) an xvocab SCORE may carry."
    )

    @classmethod
    def from_hello(cls, hello: Any, base: Limits | None = None) -> Limits:
        """Narrow ``base`` (default limits) to what a teacher advertised in ``HELLO_OK``.

        ``hello`` is a :class:`miniverl.protocol.messages.HelloOk`. A client decodes
        replies with these limits, so a reply larger than the teacher itself promised
        is a protocol error rather than a memory spike.
        """
        base = base or cls()
        fields = base.model_dump()
        fields["max_tokens"] = min(base.max_tokens, hello.limits.max_tokens)
        fields["max_positions"] = min(base.max_positions, hello.limits.max_positions)
        fields["max_inflight"] = min(base.max_inflight, hello.limits.max_inflight)
        fields["max_k"] = min(base.max_k, hello.kinds.topk.k_max)
        if hello.kinds.exact is not None:
            fields["max_exact_vocab"] = min(base.max_exact_vocab, hello.kinds.exact.max_vocab)
        xvocab = getattr(hello.kinds, "xvocab", None)
        if xvocab is not None:
            fields["max_k"] = min(base.max_k, max(hello.kinds.topk.k_max, xvocab.k_max))
            fields["max_episode_bytes"] = min(base.max_episode_bytes, xvocab.max_episode_bytes)
        return cls(**fields)

    def receive_hwm(self) -> int:
        """Messages a socket queues unread from one peer before ZeroMQ stops reading that
        peer's connection until the queue drains (``RCVHWM``): every SCORE a client may
        have open (``max_inflight``), a resend of each, and :data:`CONTROL_MESSAGES`
        more. With frames bounded by the socket's cap, this bounds what one peer can
        make the other buffer (docs/protocol.md, "`xvocab`: a teacher with another
        tokenizer", its frame sizes)."""
        return 2 * self.max_inflight + CONTROL_MESSAGES

    def for_context(self, context: int | None) -> Limits:
        """These limits for a model that attends over ``context`` tokens (None: unknown).

        Every sequence must fit the context (``max_seq_len``), and ``max_tokens``
        becomes the context too unless it was set explicitly (``--max-tokens``): the
        cost of a sequence grows with the square of its length, and a model scores
        positions past its context silently wrong.
        """
        return self if context is None else _for_context(self, int(context))


@lru_cache(maxsize=16)
def _for_context(limits: Limits, context: int) -> Limits:
    fields = limits.model_dump()
    fields["max_seq_len"] = min(limits.max_seq_len or context, context)
    if "max_tokens" not in limits.model_fields_set:
        fields["max_tokens"] = context
    return Limits(**fields)
