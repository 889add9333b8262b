"""Score the positions a student asked about: packed sequences in, log-probabilities out.

This is the teacher's numerical core, a pure function of a frozen causal LM and numpy
arrays. It is reused as the in-process reference by tests and benchmarks, so the wire
must reproduce exactly what :func:`score_positions` returns.

How a request is computed:

1. ``tokens_N`` holds ``B`` sequences packed back to back; ``cu_seqlens_B1`` marks their
   boundaries. A position ``p`` predicts ``tokens[p + 1]`` of its own sequence, so
   ``cu_seqlens[b] <= p < cu_seqlens[b + 1] - 1``.
2. Each sequence is cut after its last requested position (a causal model's hidden state
   at ``p`` depends only on tokens ``<= p``), sequences are sorted by length and run in
   right-padded micro-batches with an attention mask.
3. Only the hidden states at requested positions are gathered; the LM head runs on those
   rows alone, in chunks, so ``[N, V]`` logits are never materialised.
4. Logits are cast to fp32, divided by the temperature and log-softmaxed. ``topk`` returns
   the ``k`` best ids and log-probs, ``tail_logmass`` (log of the mass outside the top-k)
   and ``target_logprobs`` (log-prob of the token actually there); ``exact`` returns the
   whole ``[P, V]`` row, only when ``V <= exact_max_vocab``.
Served, a request reaches :func:`score_requests` already checked, once, by the server
(``protocol/checks.py``'s ``check_score`` on receipt), and its reply is checked, once,
by the batcher before it is sent (``nonfinite_report``, whichever backend computed it);
docs/protocol.md ("Where each check runs") names each place. In process, with no wire in between,
:func:`score_positions` runs both itself: :func:`check_request` first
(:class:`ScoringBadRequest`, :class:`ScoringUnsupported`), then the finite-targets rule
(:class:`ScoringNonFinite`: a NaN or an infinity other than ``tail_logmass = -inf``
when ``k = V``).

It does not parse the wire, queue requests or know about clients: that is
``teacher_server/server.py``, ``batcher.py`` and ``torch_backend.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from miniverl.common.errors import MiniverlError
from miniverl.common.shared_prefix import decoder_hidden
from miniverl.protocol.checks import nonfinite_report
from miniverl.protocol.messages import TEMPERATURE_MAX, TEMPERATURE_MIN

# Upper bound on fp32 elements of one logits chunk ([rows, V]). On an accelerator,
# 2**24 floats (64 MiB) keeps kernels large. On a CPU, buffers above glibc's largest
# mmap threshold (32 MiB) are mapped and unmapped on every use: a 512-position request
# over a 151,669-token vocabulary took 300,000 page faults and half its time in the
# kernel. 2**22 floats (16 MiB) stay in the heap: 30% faster per request there.
HEAD_CHUNK_ELEMENTS = 1 << 24
HEAD_CHUNK_ELEMENTS_CPU = 1 << 22


class ScoringBadRequest(MiniverlError, ValueError):
    """The arrays of a score request break a rule (bad ids, bad positions, bad k)."""


class ScoringUnsupported(MiniverlError, ValueError):
    """A well-formed request this teacher does not serve (exact above the vocabulary limit)."""


class ScoringNonFinite(MiniverlError, ArithmeticError):
    """The model produced a NaN or an infinity for a request; nothing is sent for it."""


@dataclass
class ScoreRequest:
    """One score request: packed sequences, the positions to score and the head to apply."""

    tokens_N: np.ndarray
    cu_seqlens_B1: np.ndarray
    positions_P: np.ndarray
    kind: str = "topk"
    k: int = 16
    temperature: float = 1.0


def vocab_size_of(model) -> int:
    """Width of the model's logits (the ``V`` of every reply)."""
    return int(model.get_output_embeddings().weight.shape[0])


def check_request(req: ScoreRequest, vocab_size: int, exact_max_vocab: int) -> None:
    """Raise :class:`ScoringBadRequest` / :class:`ScoringUnsupported` for a request that
    cannot be scored; return quietly otherwise."""
    tokens, cu, pos = req.tokens_N, req.cu_seqlens_B1, req.positions_P
    if tokens.ndim != 1 or cu.ndim != 1 or pos.ndim != 1:
        raise ScoringBadRequest("tokens, cu_seqlens and positions must be 1-D arrays")
    if cu.size < 2 or int(cu[0]) != 0 or int(cu[-1]) != tokens.size:
        raise ScoringBadRequest(
            f"cu_seqlens must start at 0 and end at len(tokens)={tokens.size}; "
            f"got {cu[:1].tolist()}..{cu[-1:].tolist()} with {cu.size} entries"
        )
    if np.any(np.diff(cu.astype(np.int64)) < 0):
        raise ScoringBadRequest("cu_seqlens must be non-decreasing")
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise ScoringBadRequest(
            f"token ids must lie in [0, {vocab_size}); got range "
            f"[{int(tokens.min())}, {int(tokens.max())}]"
        )
    if pos.size:
        seq = np.searchsorted(cu, pos, side="right") - 1
        seq = np.clip(seq, 0, cu.size - 2)
        ok = (pos >= cu[seq]) & (pos < cu[seq + 1] - 1)
        if not bool(np.all(ok)):
            bad = int(pos[np.argmin(ok)])
            raise ScoringBadRequest(
                f"position {bad} does not predict a token of its own sequence "
                "(rule: cu_seqlens[b] <= p < cu_seqlens[b+1] - 1)"
            )
    if req.kind not in ("topk", "exact"):
        raise ScoringBadRequest(f"kind must be 'topk' or 'exact'; got {req.kind!r}")
    if req.kind == "topk" and not 1 <= int(req.k) <= vocab_size:
        raise ScoringBadRequest(f"k must lie in [1, {vocab_size}]; got {req.k}")
    if req.kind == "exact" and vocab_size > exact_max_vocab:
        raise ScoringUnsupported(
            f"exact scoring is limited to vocabularies of at most exact_max_vocab="
            f"{exact_max_vocab} tokens; this teacher has {vocab_size}; use kind='topk'"
        )
    if not TEMPERATURE_MIN <= float(req.temperature) <= TEMPERATURE_MAX:  # NaN fails too
        raise ScoringBadRequest(
            f"temperature must lie in [{TEMPERATURE_MIN}, {TEMPERATURE_MAX}]; got "
            f"{req.temperature} (docs/protocol.md says why)"
        )


def _micro_batches(lengths: list[int], max_batch_tokens: int) -> list[list[int]]:
    """Group sequence indices (sorted by length) so rows * longest <= max_batch_tokens."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # Sorted ascending, so the newest member is the longest of the group.
        if current and (len(current) + 1) * lengths[i] > max_batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def gather_hidden(
    model, seqs: list[tuple[np.ndarray, np.ndarray]], max_batch_tokens: int = 8192,
    prefix_cache=None,
):
    """Run the decoder over ``seqs`` (each ``(tokens_T, local_positions_Q)``) and return the
    final hidden states at the requested positions, concatenated in input order: ``[sum Q, H]``.
    ``prefix_cache`` (a :class:`~miniverl.teacher_server.prefix_cache.PrefixCache`) reuses
    a system block computed for an earlier request.
    """
    import torch

    decoder = model.get_decoder()
    device = model.get_output_embeddings().weight.device
    # Truncate after the last requested position: later tokens cannot change earlier states.
    lengths = [int(local.max()) + 1 if local.size else 0 for _, local in seqs]
    out: list = [None] * len(seqs)
    hidden_size = model.get_output_embeddings().weight.shape[1]
    dtype = model.get_output_embeddings().weight.dtype
    live = [i for i, n in enumerate(lengths) if n > 0]
    for group in _micro_batches([lengths[i] for i in live], max_batch_tokens):
        members = [live[j] for j in group]
        width = max(lengths[i] for i in members)
        ids = torch.zeros((len(members), width), dtype=torch.long)  # host: moved below
        mask = torch.zeros((len(members), width), dtype=torch.long)  # host: moved below
        for row, i in enumerate(members):
            n = lengths[i]
            ids[row, :n] = torch.from_numpy(seqs[i][0][:n].astype(np.int64))  # host:
            mask[row, :n] = 1
        # The system block the rows share is computed once (common/shared_prefix.py),
        # or not at all when an earlier request left it in the prefix cache.
        rows_lengths = [lengths[i] for i in members]
        if prefix_cache is not None:
            hidden = prefix_cache.hidden(decoder, ids.to(device), mask.to(device), rows_lengths)
        else:
            hidden = decoder_hidden(decoder, ids.to(device), mask.to(device), rows_lengths)
        for row, i in enumerate(members):
            local = torch.from_numpy(seqs[i][1].astype(np.int64)).to(device)
            out[i] = hidden[row].index_select(0, local)
    for i, n in enumerate(lengths):
        if n == 0:
            out[i] = torch.zeros((0, hidden_size), dtype=dtype, device=device)
    # A request of no positions at all: its empty rows on the model's device too (they
    # were made on the CPU, and met the device's tensors on CUDA).
    return torch.cat(out, dim=0) if out else torch.zeros((0, hidden_size), dtype=dtype,
                                                           device=device)


def _logprobs_fp32(model, hidden_R_H, temperature: float):
    """LM head on the given rows only; the logits in fp32 (computed in fp32 when the
    loader installed the fp32 head, ``TeacherSpec.fp32_head``; widened after otherwise)."""
    import torch

    logits = model.get_output_embeddings()(hidden_R_H).float()
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)


def head(model, hidden_P_H, targets_P: np.ndarray, kind: str, k: int, temperature: float):
    """Turn gathered hidden states into the reply arrays of one request (numpy, fp32/int32)."""
    import torch

    vocab = vocab_size_of(model)
    n_pos = int(hidden_P_H.shape[0])
    budget = HEAD_CHUNK_ELEMENTS_CPU if hidden_P_H.device.type == "cpu" else HEAD_CHUNK_ELEMENTS
    rows = max(1, budget // vocab)
    targets = torch.from_numpy(targets_P.astype(np.int64)).to(hidden_P_H.device)
    target_lp = np.empty((n_pos,), dtype=np.float32)
    if kind == "exact":
        full = np.empty((n_pos, vocab), dtype=np.float32)
    else:
        ids = np.empty((n_pos, k), dtype=np.int32)
        top_lp = np.empty((n_pos, k), dtype=np.float32)
        tail = np.empty((n_pos,), dtype=np.float32)
    for start in range(0, n_pos, rows):
        end = min(n_pos, start + rows)
        lp = _logprobs_fp32(model, hidden_P_H[start:end], temperature)
        target_lp[start:end] = lp.gather(1, targets[start:end, None])[:, 0].cpu().numpy()
        if kind == "exact":
            full[start:end] = lp.cpu().numpy()
            continue
        top_vals, top_ids = torch.topk(lp, k, dim=-1, sorted=True)
        ids[start:end] = top_ids.to(torch.int32).cpu().numpy()
        top_lp[start:end] = top_vals.cpu().numpy()
        if k >= vocab:
            tail[start:end] = -np.inf
        else:
            # Mathematically tail = log1mexp(logsumexp(top-k)). Summing the excluded entries
            # directly is the stable form: when the top-k holds all but ~1e-8 of the mass,
            # logsumexp(top-k) rounds to 0 in fp32 and log1mexp would return -inf instead
            # of the true (small, finite) tail.
            # In place: this chunk's log-probs are not read again (saves a [rows, V] copy).
            lp.scatter_(1, top_ids, float("-inf"))
            tail[start:end] = torch.logsumexp(lp, dim=-1).cpu().numpy()
    if kind == "exact":
        return {"logprobs": full, "target_logprobs": target_lp}
    return {"ids": ids, "logprobs": top_lp, "tail_logmass": tail, "target_logprobs": target_lp}


def _split(req: ScoreRequest) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per sequence: (tokens, local positions, their indices into ``positions_P``)."""
    cu = req.cu_seqlens_B1.astype(np.int64)
    pos = req.positions_P.astype(np.int64)
    seq_of = np.searchsorted(cu, pos, side="right") - 1
    parts = []
    for b in range(cu.size - 1):
        idx = np.flatnonzero(seq_of == b)
        parts.append((req.tokens_N[cu[b] : cu[b + 1]], pos[idx] - cu[b], idx))
    return parts


def score_requests(
    model,
    requests: list[ScoreRequest],
    *,
    max_batch_tokens: int = 8192,
    prefix_cache=None,
) -> list[dict[str, np.ndarray]]:
    """Score several requests with one decoder pass over all their sequences (coalescing).

    Returns, per request and in order, its reply arrays. The requests must be valid
    (the server checked them; :func:`score_positions` checks its own) and the arrays are
    not checked here (the batcher checks every reply before it is sent).
    """
    import torch

    results: list[dict[str, np.ndarray]] = [None] * len(requests)  # type: ignore[list-item]
    seqs: list[tuple[np.ndarray, np.ndarray]] = []
    owners: list[tuple[int, list[np.ndarray]]] = []  # (request index, P-indices per sequence)
    for r, req in enumerate(requests):
        parts = _split(req)
        owners.append((r, [idx for _, _, idx in parts]))
        seqs.extend((tokens, local) for tokens, local, _ in parts)
    if not owners:
        return results
    with torch.inference_mode():
        hidden = gather_hidden(model, seqs, max_batch_tokens=max_batch_tokens,
                               prefix_cache=prefix_cache)
        start = 0
        for r, index_parts in owners:
            req = requests[r]
            n_pos = sum(idx.size for idx in index_parts)
            # Rows come out grouped by sequence; put them back in the order of positions_P.
            order = np.concatenate(index_parts) if index_parts else np.zeros(0, np.int64)
            rows = torch.empty((n_pos, hidden.shape[1]), dtype=hidden.dtype, device=hidden.device)
            rows[torch.from_numpy(order).to(hidden.device)] = hidden[start : start + n_pos]
            start += n_pos
            targets = req.tokens_N.astype(np.int64)[req.positions_P.astype(np.int64) + 1]
            results[r] = head(model, rows, targets, req.kind, int(req.k),
                              float(req.temperature))
    return results


def score_positions(
    model,
    tokens_N: np.ndarray,
    cu_seqlens: np.ndarray,
    positions_P: np.ndarray,
    kind: str = "topk",
    k: int = 16,
    temperature: float = 1.0,
    exact_max_vocab: int = 32768,
) -> dict[str, np.ndarray]:
    """Score one request in process: the reference for everything sent over the wire.

    Shapes: ``tokens_N`` int, ``cu_seqlens`` int ``[B+1]``, ``positions_P`` int.
    Returns for ``topk``: ``ids i4[P,k]``, ``logprobs f4[P,k]`` (descending),
    ``tail_logmass f4[P]`` (``-inf`` when k = V), ``target_logprobs f4[P]``;
    for ``exact``: ``logprobs f4[P,V]``, ``target_logprobs f4[P]``.
    Raises :class:`ScoringBadRequest`, :class:`ScoringUnsupported` (the request) or
    :class:`ScoringNonFinite` (the reply), the checks the server and the batcher run
    on the wire.
    """
    req = ScoreRequest(
        np.asarray(tokens_N), np.asarray(cu_seqlens), np.asarray(positions_P), kind, k, temperature
    )
    vocab = vocab_size_of(model)
    check_request(req, vocab, exact_max_vocab)
    (result,) = score_requests(model, [req])
    problem = nonfinite_report(result, kind=kind, k=int(k), vocab_size=vocab)
    if problem is not None:
        raise ScoringNonFinite(
            f"the teacher computed non-finite values ({problem}) at temperature "
            f"{temperature}; check the teacher's weights and dtype"
        )
    return result
