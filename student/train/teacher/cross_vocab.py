"""Targets across vocabularies: a student and a teacher that tokenize differently.

Over the groups of :mod:`miniverl.common.alignment` (student and teacher positions that
cover the same bytes) this module computes three per-group signals
(docs/cross-tokenizer.md says when each applies):

* **exact**: where a group is one token on each side and both tokens stand for the same
  bytes, the teacher's top-k distribution is carried into the student's vocabulary by
  a :class:`VocabMap` (built once per tokenizer pair from the tokens' byte strings,
  cached on disk under both tokenizer fingerprints) and trained by forward KL;
* **ULD** (Boizard et al. 2024, "Towards Cross-Tokenizer Distillation: the Universal
  Logit Distillation Loss"): the L1 distance between the two sides' probability vectors
  sorted in decreasing order, which needs no map; over a multi-token group the
  probabilities are merged as TRL 1.16's GOLD trainer merges them (the distribution at
  one position times the probabilities of the group's other actual tokens; from a
  teacher's top-k and its actual tokens' log-probs alike). The hybrid
  of TRL (JSD on the tokens both vocabularies share, sorted L1 on the rest) is here too;
* **sampled token**: the teacher's log-prob of the bytes of a group (the sum of its
  tokens' log-probs) against the student's, the group-level reverse-KL estimate, given
  to each student position of the group as its advantage.

Pure tensor maps with shapes in their suffixes (``_G`` groups, ``_V`` student vocab,
``_W`` teacher vocab, ``_K`` top-k, ``_T`` positions); where TRL 1.16 has the same
function, tests/student/train/test_cross_vocab_trl.py checks it against TRL on random
inputs. This module does not align (``common/alignment.py``), fetch teacher targets or
compose an objective (``objectives/``); which logit predicts which token (index
``j - 1`` predicts token ``j``) is the caller's gather.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from miniverl.common.alignment import Alignment
from miniverl.common.atomic import atomic_write_bytes
from miniverl.common.errors import ConfigError
from miniverl.common.tokenizer_id import fingerprint_tokenizer
from miniverl.common.toy import cache_root

VOCAB_MAP_FORMAT = 1
_BYTE_FALLBACK_RE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# Below this a probability is zero for a logarithm; TRL's GOLD uses the same clamp.
PROB_EPS = 1e-8


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-to-character table that byte-level BPE vocabularies are written in."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
          *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


_UNICODE_TO_BYTE = {ch: b for b, ch in _bytes_to_unicode().items()}


def token_bytes(tokenizer: Any) -> list[bytes]:
    """The byte string each token id stands for (``b""`` for an unused id).

    Byte-level BPE pieces are read through GPT-2's byte table, ``<0xNN>`` byte-fallback
    pieces are one byte, SentencePiece's ``▁`` is a space, added tokens are their text.
    """
    backend = tokenizer.backend_tokenizer
    byte_level = "ByteLevel" in repr(backend.pre_tokenizer) or "ByteLevel" in repr(backend.decoder)
    added = {i: t.content for i, t in backend.get_added_tokens_decoder().items()}
    out: list[bytes] = []
    for i in range(backend.get_vocab_size(with_added_tokens=True)):
        piece = backend.id_to_token(i)
        if piece is None:
            out.append(b"")
        elif i in added:
            out.append(added[i].encode("utf-8"))
        elif byte_level and all(ch in _UNICODE_TO_BYTE for ch in piece):
            out.append(bytes(_UNICODE_TO_BYTE[ch] for ch in piece))
        elif m := _BYTE_FALLBACK_RE.fullmatch(piece):
            out.append(bytes([int(m.group(1), 16)]))
        else:
            out.append(piece.replace("\u2581", " ").encode("utf-8"))
    return out


@dataclass(frozen=True)
class VocabMap:
    """Student id -> teacher id for tokens standing for equal bytes (``-1``: none).

    ``teacher_to_student_W`` is the inverse on the mapped ids. Where one side holds
    several ids for the same bytes the smallest id is taken, so the map is the same on
    every build.
    """

    student_fingerprint: str
    teacher_fingerprint: str
    student_to_teacher_V: np.ndarray
    teacher_to_student_W: np.ndarray

    def coverage(self) -> dict[str, float | int]:
        """How much of each vocabulary the map reaches."""
        v, w = self.student_to_teacher_V.size, self.teacher_to_student_W.size
        mapped = int((self.student_to_teacher_V >= 0).sum())
        return {
            "student_vocab": v,
            "teacher_vocab": w,
            "mapped": mapped,
            "student_share": mapped / max(v, 1),
            "teacher_share": int((self.teacher_to_student_W >= 0).sum()) / max(w, 1),
        }


def build_vocab_map(student_tokenizer: Any, teacher_tokenizer: Any) -> VocabMap:
    """The :class:`VocabMap` of two fast tokenizers, from their tokens' byte strings."""
    s_bytes, t_bytes = token_bytes(student_tokenizer), token_bytes(teacher_tokenizer)
    first_teacher: dict[bytes, int] = {}
    for i, b in enumerate(t_bytes):
        if b:
            first_teacher.setdefault(b, i)
    s_to_t = np.full(len(s_bytes), -1, dtype=np.int64)
    t_to_s = np.full(len(t_bytes), -1, dtype=np.int64)
    for i, b in enumerate(s_bytes):
        j = first_teacher.get(b, -1) if b else -1
        if j >= 0 and t_to_s[j] < 0:
            s_to_t[i] = j
            t_to_s[j] = i
    return VocabMap(fingerprint_tokenizer(student_tokenizer),
                    fingerprint_tokenizer(teacher_tokenizer), s_to_t, t_to_s)


def vocab_map(student_tokenizer: Any, teacher_tokenizer: Any,
              cache_dir: str | Path | None = None) -> VocabMap:
    """:func:`build_vocab_map`, cached in ``cache_dir`` (default ``<cache>/vocab_maps``)
    under a hash of both fingerprints; a file for another pair or format is rebuilt."""
    s_fp, t_fp = fingerprint_tokenizer(student_tokenizer), fingerprint_tokenizer(teacher_tokenizer)
    key = hashlib.sha256(f"{VOCAB_MAP_FORMAT}|{s_fp}|{t_fp}".encode()).hexdigest()[:24]
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "vocab_maps"
    path = root / f"{key}.npz"
    if path.is_file():
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            if meta == {"format": VOCAB_MAP_FORMAT, "student": s_fp, "teacher": t_fp}:
                return VocabMap(s_fp, t_fp, data["student_to_teacher"], data["teacher_to_student"])
    built = build_vocab_map(student_tokenizer, teacher_tokenizer)
    buf = io.BytesIO()
    meta = json.dumps({"format": VOCAB_MAP_FORMAT, "student": s_fp, "teacher": t_fp})
    np.savez(buf, meta=np.asarray(meta), student_to_teacher=built.student_to_teacher_V,
             teacher_to_student=built.teacher_to_student_W)
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buf.getvalue())
    return built


# ---------------------------------------------------------------- exact matching


def exact_groups_G(alignment: Alignment, student_ids_T: np.ndarray, teacher_ids_T: np.ndarray,
                   vmap: VocabMap) -> np.ndarray:
    """``[G]`` bool: trainable groups of one token per side whose tokens map to each other."""
    a = alignment
    one = (a.student_end_G - a.student_start_G == 1) & (a.teacher_end_G - a.teacher_start_G == 1)
    one &= a.trainable_G
    s_id = np.where(one, student_ids_T[np.minimum(a.student_start_G, len(student_ids_T) - 1)], 0)
    t_id = np.where(one, teacher_ids_T[np.minimum(a.teacher_start_G, len(teacher_ids_T) - 1)], 0)
    return one & (vmap.student_to_teacher_V[s_id] == t_id)


def project_topk(teacher_ids_PK: torch.Tensor, teacher_logprobs_PK: torch.Tensor,
                 teacher_to_student_W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's top-k in the student's vocabulary: ``(student_ids_PK, logprobs_PK)``.

    An entry whose teacher token has no student twin gets id 0 and log-prob ``-inf``
    (no mass); the rest keep the teacher's log-probs, not renormalised.
    """
    s_ids_PK = teacher_to_student_W.to(teacher_ids_PK.device)[teacher_ids_PK]
    mapped_PK = s_ids_PK >= 0
    return (torch.where(mapped_PK, s_ids_PK, torch.zeros_like(s_ids_PK)),
            torch.where(mapped_PK, teacher_logprobs_PK,
                        torch.full_like(teacher_logprobs_PK, float("-inf"))))


def exact_forward_kl_P(student_logits_P_V: torch.Tensor, student_ids_PK: torch.Tensor,
                       teacher_logprobs_PK: torch.Tensor) -> torch.Tensor:
    """``[P]`` forward KL on the projected top-k, both sides renormalised over it.

    ``KL(T~ ‖ S~) = Σ_k T~_k (log T~_k - log S~_k)`` with ``T~``, ``S~`` the teacher's
    and the student's probabilities on the ``K`` mapped ids, each renormalised to sum
    to one: a position's mass outside the mapped ids carries no signal either way.
    An entry with log-prob ``-inf`` (unmapped) takes no part.
    """
    s_logp_P_V = torch.log_softmax(student_logits_P_V.float(), dim=-1)
    live_PK = torch.isfinite(teacher_logprobs_PK)
    s_PK = torch.where(live_PK, s_logp_P_V.gather(-1, student_ids_PK),
                       torch.full_like(teacher_logprobs_PK, float("-inf"), dtype=torch.float32))
    t_PK = teacher_logprobs_PK.float()
    t_norm_PK = t_PK - torch.logsumexp(t_PK, dim=-1, keepdim=True)
    s_norm_PK = s_PK - torch.logsumexp(s_PK, dim=-1, keepdim=True)
    term_PK = torch.where(live_PK, t_norm_PK.exp() * (t_norm_PK - s_norm_PK),
                          torch.zeros_like(t_PK))
    return term_PK.sum(-1)


# ---------------------------------------------------------------- ULD


def _group_rows(rows_T_X: torch.Tensor, log_actual_T: torch.Tensor, starts_G: torch.Tensor,
                ends_G: torch.Tensor, strategy: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The row each group of positions ``[s, e)`` keeps and the factor it is scaled by:
    ``observed``: row ``s`` and the actual tokens' probabilities at ``s+1 .. e-1``;
    ``bayesian``: row ``e-1`` and those at ``s .. e-2``."""
    if strategy not in ("observed", "bayesian"):
        raise ConfigError(f"merge strategy {strategy!r} is not one of observed, bayesian")
    csum = torch.cat([log_actual_T.new_zeros(1), log_actual_T.cumsum(0)])
    if strategy == "observed":
        base_G = starts_G
        log_scale_G = csum[ends_G] - csum[torch.minimum(starts_G + 1, ends_G)]
    else:
        base_G = ends_G - 1
        log_scale_G = csum[torch.maximum(ends_G - 1, starts_G)] - csum[starts_G]
    rows_G_X = rows_T_X[base_G.clamp(0, max(rows_T_X.shape[0] - 1, 0))]
    # A one-token group keeps its row exactly (a product of no factors, not exp(0.0)).
    scale_G = torch.where(ends_G - starts_G > 1, log_scale_G.exp(), torch.ones_like(log_scale_G))
    return rows_G_X, scale_G


def merge_group_probs(probs_T_V: torch.Tensor, token_ids_T: torch.Tensor,
                      starts_G: torch.Tensor, ends_G: torch.Tensor,
                      strategy: str = "observed") -> torch.Tensor:
    """``[G, V]``: one (unnormalised) distribution per group of positions.

    Row ``t`` of ``probs_T_V`` is the distribution the position holding ``token_ids_T[t]``
    was scored with. For a group of positions ``[s, e)``: ``observed`` takes row ``s``
    times the probabilities of the actual tokens at ``s+1 .. e-1``; ``bayesian`` takes
    row ``e-1`` times those at ``s .. e-2`` (the chain rule read from the other end);
    both as TRL 1.16's ``ULDLoss._merge_probabilities_with_alignment_groups``. An empty
    group is a zero row.
    """
    actual_T = probs_T_V.gather(-1, token_ids_T[:, None].long()).squeeze(-1).clamp_min(PROB_EPS)
    starts_G, ends_G = starts_G.long(), ends_G.long()
    empty_G = ends_G <= starts_G
    rows_G_V, scale_G = _group_rows(probs_T_V, actual_T.log(), starts_G, ends_G, strategy)
    merged = rows_G_V * scale_G[:, None].to(rows_G_V.dtype)
    return torch.where(empty_G[:, None], torch.zeros_like(merged), merged)


def merge_group_topk(topk_probs_T_K: torch.Tensor, actual_logprob_T: torch.Tensor,
                     starts_G: torch.Tensor, ends_G: torch.Tensor,
                     strategy: str = "observed") -> torch.Tensor:
    """``[G, K]``: :func:`merge_group_probs` for a teacher that sent only its top-k.

    The merge needs the full row at one position and the probability of the actual
    token at the others; a teacher that sends its top-k probabilities and the log-prob
    of each actual token (``actual_logprob_T``) gives exactly that. With ``K`` the whole
    vocabulary it is :func:`merge_group_probs`.
    """
    log_actual_T = actual_logprob_T.to(topk_probs_T_K.dtype).clamp_min(float(np.log(PROB_EPS)))
    starts_G, ends_G = starts_G.long(), ends_G.long()
    rows_G_K, scale_G = _group_rows(topk_probs_T_K, log_actual_T, starts_G, ends_G, strategy)
    merged = rows_G_K * scale_G[:, None]
    return torch.where((ends_G <= starts_G)[:, None], torch.zeros_like(merged), merged)


def _pad_to(x: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[-1])) if x.shape[-1] < width else x


def uld_distance_G(student_probs_G_V: torch.Tensor, teacher_probs_G_W: torch.Tensor) -> torch.Tensor:
    """``[G]`` ULD: the L1 distance between the two rows sorted in decreasing order (the
    shorter vocabulary padded with zeros)."""
    width = max(student_probs_G_V.shape[-1], teacher_probs_G_W.shape[-1])
    s = _pad_to(student_probs_G_V.sort(dim=-1, descending=True).values, width)
    t = _pad_to(teacher_probs_G_W.sort(dim=-1, descending=True).values, width)
    return (s - t).abs().sum(-1)


def uld_loss(student_probs_G_V: torch.Tensor, teacher_probs_G_W: torch.Tensor) -> torch.Tensor:
    """The mean of :func:`uld_distance_G` over the groups: TRL 1.16's ULD term for one
    sequence (its L1 sum divided by the number of groups)."""
    return uld_distance_G(student_probs_G_V, teacher_probs_G_W).sum() / student_probs_G_V.shape[0]


def uld_topk_distance_G(student_probs_G_V: torch.Tensor,
                        teacher_topk_probs_G_K: torch.Tensor,
                        teacher_tail_G: torch.Tensor | None = None) -> torch.Tensor:
    """``[G]`` ULD from the teacher's top-k only.

    The L1 distance over the ``K`` largest entries of each side, plus the two tails
    (the mass outside each side's top ``K``) compared as one bucket. The triangle
    inequality makes it a lower bound of the full :func:`uld_distance_G`, equal to it
    when ``K`` covers the teacher's support. The teacher's tail is ``1 - Σ top-k``
    unless ``teacher_tail_G`` gives it (a row merged over a group sums to less than 1).
    """
    k = teacher_topk_probs_G_K.shape[-1]
    s_sorted = student_probs_G_V.sort(dim=-1, descending=True).values
    s_top = _pad_to(s_sorted[..., :k], k)
    t_top = teacher_topk_probs_G_K.sort(dim=-1, descending=True).values
    s_tail = (student_probs_G_V.sum(-1) - s_top.sum(-1)).clamp_min(0)
    t_tail = (1.0 - teacher_topk_probs_G_K.sum(-1)).clamp_min(0) if teacher_tail_G is None \
        else teacher_tail_G.to(teacher_topk_probs_G_K.dtype)
    return (s_top - t_top).abs().sum(-1) + (s_tail - t_tail).abs()


def generalized_jsd_probs(student_probs_R_N: torch.Tensor, teacher_probs_R_N: torch.Tensor,
                          beta: float) -> torch.Tensor:
    """Generalised JSD summed over entries and averaged over rows, on probabilities.

    ``beta = 0``: ``KL(T ‖ S)``; ``beta = 1``: ``KL(S ‖ T)``; between: ``beta · KL(T ‖ M)
    + (1 - beta) · KL(S ‖ M)`` with ``M = beta · T + (1 - beta) · S`` (the mixture
    weights as TRL 1.16's ``GOLDTrainer.generalized_jsd_loss``). Log-probs are
    clamped at ``PROB_EPS``, as there, since the rows are sub-distributions.
    """
    s_lp = student_probs_R_N.clamp_min(PROB_EPS).log()
    t_lp = teacher_probs_R_N.clamp_min(PROB_EPS).log()
    if beta == 0:
        div = t_lp.exp() * (t_lp - s_lp)
    elif beta == 1:
        div = s_lp.exp() * (s_lp - t_lp)
    else:
        b = torch.tensor(beta, dtype=s_lp.dtype, device=s_lp.device)
        m_lp = torch.logsumexp(torch.stack([s_lp + torch.log1p(-b), t_lp + torch.log(b)]), dim=0)
        div = b * t_lp.exp() * (t_lp - m_lp) + (1 - b) * s_lp.exp() * (s_lp - m_lp)
    return div.sum() / max(student_probs_R_N.shape[0], 1)


def hybrid_uld_loss(student_probs_G_V: torch.Tensor, teacher_probs_G_W: torch.Tensor,
                    student_matched_M: torch.Tensor, teacher_matched_M: torch.Tensor, *,
                    beta: float = 1.0, matched_weight: float | None = None,
                    unmatched_weight: float | None = None) -> torch.Tensor:
    """TRL 1.16's hybrid: JSD on the ``M`` matched id pairs, sorted L1 on the rest.

    ``student_matched_M[m]`` and ``teacher_matched_M[m]`` are one token in the two
    vocabularies. Without weights the matched term weighs ``M / W`` (the share of the
    teacher vocabulary matched) and the sorted term ``1 - M / W``, as in TRL.
    """
    n_groups, v = student_probs_G_V.shape
    w = teacher_probs_G_W.shape[-1]
    matched = generalized_jsd_probs(student_probs_G_V[:, student_matched_M],
                                    teacher_probs_G_W[:, teacher_matched_M], beta)
    s_rest = torch.ones(v, dtype=torch.bool, device=student_probs_G_V.device)
    t_rest = torch.ones(w, dtype=torch.bool, device=teacher_probs_G_W.device)
    s_rest[student_matched_M] = False
    t_rest[teacher_matched_M] = False
    unmatched = student_probs_G_V.new_zeros(())
    if s_rest.any() and t_rest.any():
        unmatched = uld_distance_G(student_probs_G_V[:, s_rest], teacher_probs_G_W[:, t_rest])
        unmatched = unmatched.sum() / n_groups
    if matched_weight is None:
        matched_weight = student_matched_M.numel() / max(w, 1)
        unmatched_weight = 1.0 - matched_weight
    return matched_weight * matched + (unmatched_weight or 0.0) * unmatched


# ---------------------------------------------------------------- sampled token


def group_logprob_G(logprob_T: torch.Tensor, starts_G: torch.Tensor,
                    ends_G: torch.Tensor) -> torch.Tensor:
    """``[G]``: the log-prob of each group's bytes, the sum of its positions' log-probs
    (the chain rule over the group's tokens; 0 for an empty group)."""
    csum = torch.cat([logprob_T.new_zeros(1), logprob_T.cumsum(0)])
    return csum[ends_G.long()] - csum[starts_G.long()]


def sampled_token_advantage_T(student_logprob_T: torch.Tensor, teacher_logprob_T: torch.Tensor,
                              alignment: Alignment) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantage_Ts, valid_Ts)`` of the sampled-token reverse-KL estimator across
    vocabularies.

    For group ``g``, ``log T(bytes_g) - log S(bytes_g)``: the teacher's log-prob of the
    group's bytes (its tokens' log-probs summed) minus the student's. Every student
    position of a trainable group gets its group's value: ``Σ_j ∇log S(y_j)`` over the
    group is ``∇log S(bytes_g)``, so the REINFORCE step on the group is the step on each
    of its positions with the group's advantage. With one token per side per group
    (the same tokenizer) it is ``log T(y) - log S(y)`` per position. Positions of
    untrainable groups get 0 and ``valid`` false. Detached.
    """
    a = alignment
    dev = student_logprob_T.device
    as_t = lambda x: torch.as_tensor(x, device=dev)  # noqa: E731
    s_lp_G = group_logprob_G(student_logprob_T.detach(), as_t(a.student_start_G), as_t(a.student_end_G))
    t_lp_G = group_logprob_G(teacher_logprob_T.to(dev).to(student_logprob_T.dtype),
                             as_t(a.teacher_start_G), as_t(a.teacher_end_G))
    trainable_G = as_t(a.trainable_G)
    adv_G = torch.where(trainable_G, t_lp_G - s_lp_G, torch.zeros_like(s_lp_G))
    group_T = as_t(a.student_group_T())
    return adv_G[group_T], trainable_G[group_T]
