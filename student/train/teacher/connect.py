"""The student's teacher: connect, qualify, retarget, and how the two share one device.

The functions here change a run's :class:`~miniverl.student.train.teacher.link.TeacherSide`
(client, endpoint, link, identity, memory strategy). The client is a
:class:`~miniverl.protocol.scoring_client.ScoringClient`: the ``SyncTeacherClient`` made
here from the run's endpoint, or one the trainer was handed.

- :func:`start_handshake` / :func:`check_handshake`: say ``HELLO`` before the SFT
  warm-up and gate the teacher as soon as it answers, so a teacher the run would refuse
  (another tokenizer, below ``teacher.min_success``) stops it before the warm-up is
  spent; a teacher still loading (or being prepared by ``up``) answers in the background
  while the warm-up runs.
- :func:`connect`: handshake, the competence gate (``teacher.min_success``), the view
  the teacher is shown (``teacher.mode: privileged_context``), how long an update waits
  out a teacher that refuses its SCOREs (``link.Patience``), the memory strategy.
- :func:`vet_endpoint`: handshake with another teacher on a throwaway client and gate
  it, so the control socket refuses a ``RETARGET`` the run would refuse at once.
- :func:`apply_retarget`: a ``RETARGET`` from the control socket, at an update boundary;
  a teacher that fails the gate is refused and training goes on with the old one.
- :func:`memory_strategy`: ``resident`` keeps the teacher's weights on the device;
  ``swap`` asks the teacher to ``PARK`` before each update and ``WAKE`` before scoring;
  ``auto`` picks from measured free memory and says why (docs/up.md, "Memory strategies
  on one device"). On CPU there is
  no device memory to share, so ``auto`` is ``resident`` there. PARK and WAKE are admin
  messages: :func:`park` and :func:`wake` send them with the admin token (the file ``up``
  names, else the one beside the teacher's socket) or an admin CURVE key; a teacher that
  answers ``UNAUTHORIZED`` (an attached student without the token) stays resident, and
  the run says so once (event ``memory_swap_refused``) and goes on.
- :func:`client_proof`: the CURVE keys (flags, else ``teacher.curve_*``) and the token
  file a client is built with.

This module does not score trajectories (``link.py``) or train.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_for
from dataclasses import dataclass
from functools import partial
from typing import Any, TypedDict

import numpy as np

from miniverl.common.errors import (
    AdapterNotServed,
    ConfigError,
    MiniverlError,
    TeacherError,
    TeacherUnavailable,
    TokenizerMismatch,
    Unauthorized,
)
from miniverl.common.manifest import record_teacher, update_manifest
from miniverl.common.memory_plan import GIB, check_recipe, read_shape
from miniverl.common.modeling import load_tokenizer
from miniverl.common.qualification import TeacherNotQualified, require_qualified
from miniverl.common.recipe_sections import EnvironmentConfig
from miniverl.common.teacher_routes import require_route_qualified
from miniverl.common.tokenizer_id import fingerprint_tokenizer
from miniverl.common.trajectory import Trajectory
from miniverl.protocol.endpoints import load_curve_client_keys
from miniverl.protocol.engine_client import EngineTeacherClient, is_engine_endpoint
from miniverl.protocol.scoring_client import ScoringClient
from miniverl.protocol.sync_client import SyncTeacherClient
from miniverl.student.rollout.privileged import PrivilegedViews, task_lookup
from miniverl.student.train.objectives.table import teacher_kind
from miniverl.student.train.state import TrainState
from miniverl.student.train.teacher.cross_vocab import VocabMap, vocab_map
from miniverl.student.train.teacher.link import (
    Patience,
    PrivilegedLink,
    TeacherLink,
    teacher_identity,
)
from miniverl.student.train.teacher.routed import RouteSide, apply_route_retarget, connect_routes
from miniverl.student.train.teacher.xvocab import XvocabLink, XvocabRequests, sends_xvocab

# The student's update needs roughly this many times its weight bytes free
# (weights + grads + AdamW moments + activations) to keep the teacher resident.
UPDATE_HEADROOM = 4.0


# A READY teacher answers HELLO within milliseconds: the warm-up waits this long for
# it, so an attached teacher is gated before the first warm-up step; a teacher still
# loading or being prepared answers in the background instead, and is gated then.
HANDSHAKE_GRACE_S = 2.0
# How long a `teacher use NAME` of one route waits for the new teacher's handshake, at
# the update boundary (the control socket has already probed it).
RETARGET_HANDSHAKE_S = 10.0

# Answers that will not change by waiting: the run stops on them at once. Anything
# else from an early handshake (a teacher not up yet) is left to connect(), which tries
# again after the warm-up with its own timeout.
REFUSALS = (TokenizerMismatch, TeacherNotQualified)

# Teacher failures raised between updates (while scoring, at a handshake): the
# parameters sit at an update boundary then, so the loop checkpoints before failing.
TEACHER_FAILURES = (*REFUSALS, TeacherUnavailable, TeacherError)


@dataclass
class Handshake:
    """A handshake said before the SFT warm-up (:func:`start_handshake`)."""

    future: Future | None  # the client's connect(); None once looked at
    checked: dict[str, Any] | None = None  # the identity that passed the gate


def new_client(state: TrainState, endpoint: str | None = None, *,
               timeout_s: float | None = None, suffix: str = "", teacher: Any = None,
               adapter: str | None = None) -> ScoringClient:
    """A client of ``endpoint`` (default: the run's) with the run's tokenizer and proof:
    an :class:`EngineTeacherClient` for an http(s) server, else a ``SyncTeacherClient``.
    ``teacher`` is the teacher section it reaches (default: the recipe's ``teacher``;
    a route's own under ``teachers:``), ``adapter`` the served adapter it scores with."""
    rt = state.recipe.runtime
    endpoint = endpoint or state.teacher.endpoint
    teacher = teacher or state.recipe.teacher
    if endpoint is None:
        raise ConfigError("the run has no teacher endpoint (teacher.endpoint is null); set "
                          "it in the recipe, pass --teacher ENDPOINT, or start the run with "
                          "`miniverl up`, which launches the teacher")
    if is_engine_endpoint(endpoint):
        return engine_client(state, endpoint, timeout_s=timeout_s, teacher=teacher)
    return SyncTeacherClient(
        endpoint,
        tokenizer_fp=state.policy.tokenizer_fp,
        vocab_size=state.policy.vocab_size,
        client_name=f"student:{state.run.id}{suffix}",
        heartbeat_ms=rt.heartbeat_ms,
        request_timeout_s=timeout_s or rt.request_timeout_s,
        unavailable_timeout_s=max(timeout_s or 0.0, rt.unavailable_timeout_s),
        # teacher.tokenizer: other announces xvocab in HELLO (docs/cross-tokenizer.md).
        xvocab=teacher is not None and teacher.tokenizer == "other",
        **({"adapter": adapter} if adapter is not None else {}),
        **client_proof(state, teacher),
    )


def engine_client(state: TrainState, endpoint: str, *, timeout_s: float | None = None,
                  teacher: Any = None) -> EngineTeacherClient:
    """A client of the vLLM or SGLang server at ``endpoint`` (docs/engine-teachers.md).

    The run's own engine (``teacher.endpoint``) serves ``teacher.model`` under its path
    or hub id and speaks ``teacher.api``; another one (``miniverl teacher use``) speaks
    the same API and is taken with the one model it serves, gated like any teacher.
    """
    teacher, policy, loss = teacher or state.recipe.teacher, state.policy, state.recipe.loss
    kind = teacher_kind(teacher, loss)
    if kind != "topk" or loss.temperature != 1.0:
        # Refused here, at the handshake: before the warm-up and any rollout.
        raise ConfigError(
            f"an engine teacher ({endpoint}) returns top-k prompt log-probs at temperature "
            f"1 only; this run asks for {kind} targets at temperature "
            f"{loss.temperature}: use a top-k objective with loss.temperature: 1.0, or "
            "serve the teacher with `miniverl teacher serve`")
    own = endpoint == teacher.endpoint and teacher.api is not None
    tokenizer = policy.tokenizer
    return EngineTeacherClient(
        endpoint, flavour=teacher.api if own else "auto",
        model=(teacher.model.path or teacher.model.hub_id) if own else None,
        tokenize=lambda text: tokenizer.encode(text, add_special_tokens=False),
        tokenizer_fp=policy.tokenizer_fp, vocab_size=policy.vocab_size,
        tokenizer_name=f"the student's tokenizer {tokenizer.name_or_path!r}",
        bos_id=getattr(tokenizer, "bos_token_id", None),
        api_key_env=teacher.api_key_env,
        request_timeout_s=timeout_s or state.recipe.runtime.request_timeout_s,
    )


def start_handshake(state: TrainState) -> Handshake:
    """Say HELLO now, without waiting for a teacher that is not up yet (see above)."""
    side = state.teacher
    if side.routes is not None:
        # Several teachers: a route with a competence gate (its teacher's min_success or
        # min_recovery) is checked before the warm-up, so every route connects now;
        # without one, each route handshakes, and checks its tokenizer, at connect.
        if any(r.route.config.min_success is not None or r.route.config.min_recovery
               is not None for r in side.routes.values()):
            connect_routed(state)
        return Handshake(None)
    if side.client is None:
        side.client = new_client(state)
    future = side.client.connect_soon(state.recipe.runtime.teacher_startup_timeout_s)
    handshake = Handshake(future)
    wait_for([future], timeout=HANDSHAKE_GRACE_S)
    check_handshake(state, handshake)
    return handshake


def check_handshake(state: TrainState, handshake: Handshake) -> None:
    """Gate the teacher once its early handshake has ended; raise a refusal."""
    future = handshake.future
    if future is None or not future.done():
        return
    handshake.future = None
    error = None if future.cancelled() else future.exception()
    if error is not None:
        if isinstance(error, REFUSALS):
            raise error
        return
    client = state.teacher.client
    assert client is not None  # the handshake's future is this client's connect
    identity = teacher_identity(client)
    check_qualified(state, identity)
    handshake.checked = identity


def connect(state: TrainState, handshake: Handshake | None = None) -> None:
    """Handshake with the teacher, refuse an unqualified one, bind a link, pick memory."""
    recipe, side = state.recipe, state.teacher
    if side.routes is not None:
        if not side.connected:  # else connected (and gated) before the warm-up
            connect_routed(state)
        return
    if side.client is None:
        side.client = new_client(state)
    if handshake is not None and handshake.future is not None:
        wait_for([handshake.future])  # bounded by its own timeout
        check_handshake(state, handshake)
    side.client.connect(recipe.runtime.teacher_startup_timeout_s)
    require_xvocab(state, side.client)
    require_serves(state, side.client)
    identity = teacher_identity(side.client)
    if handshake is None or handshake.checked != identity:
        check_qualified(state, identity)

    def changed(new: dict, version: int, how: str) -> None:
        teacher_changed(state, new, version, how)

    side.link = teacher_link(state, side.client, changed)
    side.identity = identity
    state.run.event("teacher_connected", teacher=identity, version=state.version,
                    endpoint=side.endpoint)
    record_teacher(state.run, state.version, identity, how="connect")
    side.memory = choose_memory(state)
    side.park, side.wake = partial(park, state), partial(wake, state)


def connect_routed(state: TrainState) -> None:
    """Several teachers (docs/several-teachers.md): connect each route's teacher (its
    own client, the adapter it scores with) and bind the run's routed link. Every route
    stays resident (the recipe refuses ``memory: swap`` for a routed teacher)."""
    side = state.teacher

    def client_of(route: RouteSide) -> ScoringClient:
        return new_client(state, route.endpoint, teacher=route.route.config,
                          adapter=route.route.adapter, suffix=f":{route.route.name}")

    def link_of(client: ScoringClient, changed: Callable, route: Any) -> TeacherLink:
        require_xvocab(state, client, route.config)
        require_serves(state, client, route.config, route.adapter, route.name)
        return teacher_link(state, client, changed, route)

    side.link = connect_routes(state, client_of, link_of)
    side.identity = side.link.identity()
    side.memory = "resident"
    state.run.event("memory_strategy", wanted="resident", chosen="resident",
                    reason="several teachers stay resident")


class LinkSettings(TypedDict):
    """What every link of a run is made with besides its client (:func:`teacher_link`)."""

    kind: str
    k: int
    temperature: float
    on_teacher_changed: Callable[[dict, int, str], None]
    deterministic: bool
    patience: Patience


def teacher_link(state: TrainState, client: ScoringClient,
                 changed: Callable[[dict, int, str], None], route: Any = None) -> TeacherLink:
    """The link this run (or one ``route`` of it) scores through, picked once: the
    trajectory's own tokens, the privileged teacher's view of them (``teacher.mode:
    privileged_context``), or the rendered messages of a teacher with another tokenizer
    (``teacher.tokenizer: other``), each episode with its own environment's tools."""
    recipe = state.recipe
    section = recipe.teacher if route is None else route.config
    common: LinkSettings = {
        "kind": teacher_kind(section, recipe.loss), "k": recipe.loss.top_k,
        "temperature": recipe.loss.temperature, "on_teacher_changed": changed,
        "deterministic": recipe.run.deterministic, "patience": patience(state, route)}
    if common["kind"] == "xvocab":
        if not sends_xvocab(client):
            raise ConfigError(f"teacher.tokenizer: other needs xvocab SCOREs, which the "
                              f"{type(client).__name__} does not send; serve the teacher with "
                              "`miniverl teacher serve`")
        environments: Sequence[EnvironmentConfig] = recipe.environments or [recipe.environment]
        return XvocabLink(client, **common,
                          xvocab=XvocabRequests(state.policy.tokenizer, {
                              env.name: env.params for env in environments}),
                          cross_vocab=recipe.loss.cross_vocab or "sampled_token",
                          vocab_map=teacher_vocab_map(state, client, section,
                                                      None if route is None else route.name),
                          on_too_large=partial(too_large, state, route))
    view = teacher_view(state) if route is None else route_views(state, route)
    if view is not None:
        return PrivilegedLink(client, **common, view=view)
    return TeacherLink(client, **common)


def patience(state: TrainState, route: Any = None) -> Patience:
    """How an update waits out a teacher that refuses its SCOREs (``link.Patience``): up to
    ``runtime.unavailable_timeout_s``, its events naming ``route`` when there is one (a
    routed update waits only when no other route has episodes to train on)."""
    named = {} if route is None else {"route": route.name}

    def event(name: str, **fields: Any) -> None:
        state.run.event(name, **fields, **named)

    return Patience(state.recipe.runtime.unavailable_timeout_s, event, state.stop_event)


def too_large(state: TrainState, route: Any, why: str) -> None:
    """Record an episode the client refused to send, over the teacher's limits (event
    ``xvocab_too_large``, ``why`` the refusal's line)."""
    state.run.event("xvocab_too_large", why=why, version=state.version,
                    **({} if route is None else {"route": route.name}))


def require_xvocab(state: TrainState, client: ScoringClient, section: Any = None,
                   link: Any = None) -> None:
    """teacher.tokenizer: other asks for xvocab targets: refuse a teacher whose HELLO_OK
    does not advertise the kind (at connect, before any rollout; and a RETARGET to one),
    as a teacher with another tokenizer is refused (docs/cross-tokenizer.md). With
    ``loss.cross_vocab: hybrid``, a RETARGET to a teacher whose tokenizer is not the one
    the link's vocabulary map was built for is refused too. ``section`` is the teacher
    section the client reaches (default: ``teacher:``; a route's own under
    ``teachers:``), ``link`` the link it would score for (default: the run's)."""
    hello = client.hello
    kind = teacher_kind(section or state.recipe.teacher, state.recipe.loss)
    vmap = getattr(state.teacher.link if link is None else link, "vocab_map", None)
    if (kind == "xvocab" and hello is not None and vmap is not None
            and hello.tokenizer_fp != vmap.teacher_fingerprint):
        raise TokenizerMismatch(
            f"loss.cross_vocab: hybrid maps the vocabulary of tokenizer "
            f"{vmap.teacher_fingerprint[:19]}, but teacher {hello.teacher.name!r} has "
            f"{hello.tokenizer_fp[:19]}; retarget to a teacher with that tokenizer or start a "
            "run for this one")
    if kind != "xvocab" or hello is None or hello.kinds.xvocab is not None:
        return
    raise TokenizerMismatch(
        f"tokenizer: other asks for xvocab targets, but teacher {hello.teacher.name!r} "
        "does not serve them (its HELLO_OK has no kinds.xvocab): serve it with `miniverl "
        "teacher serve` from a model directory with a tokenizer and chat template, or set "
        "that teacher's tokenizer: same")


def require_serves(state: TrainState, client: ScoringClient, section: Any = None,
                   adapter: str | None = None, route: str | None = None) -> None:
    """Refuse a teacher that could not serve this run's (or ``route``'s) requests, from
    its HELLO_OK, before any request is sent: a teacher serving only named adapters to a
    route that names none (every SCORE would be refused ``UNSUPPORTED``), or one without
    the target kind, the top-k or the vocabulary the run's loss asks. A RETARGET to such a
    teacher was once accepted and the run then ended on its refused SCOREs (issue 53).
    ``section`` and ``adapter``: the teacher section and the adapter the client scores
    for (default: ``teacher:``, none)."""
    hello = client.hello
    if hello is None:
        return
    who = f"teacher {hello.teacher.name!r}" + (f" (route {route})" if route else "")
    served = [info.name for info in hello.adapters or ()]
    if adapter is None and served:
        raise AdapterNotServed(
            f"{who} serves only named adapters ({', '.join(served)}), and "
            f"{'this route' if route else 'this run'} names none: every SCORE would be "
            "refused; point it at a teacher serving the plain model, or route an "
            "environment to one of its adapters (environments[].adapter)")
    loss = state.recipe.loss
    kind = teacher_kind(section or state.recipe.teacher, loss)
    if kind == "topk" and hello.kinds.topk.k_max < loss.top_k:
        raise TeacherError(
            f"{who} serves top-k up to {hello.kinds.topk.k_max}, and loss.top_k is "
            f"{loss.top_k}: every SCORE would be refused; use a teacher that serves k >= "
            f"{loss.top_k}, or lower loss.top_k")
    if kind == "exact" and (hello.kinds.exact is None
                            or hello.kinds.exact.max_vocab < state.policy.vocab_size):
        served_vocab = "no exact targets" if hello.kinds.exact is None else \
            f"exact targets up to a vocabulary of {hello.kinds.exact.max_vocab}"
        raise TeacherError(
            f"{who} serves {served_vocab}, and loss.objective exact_full_vocab asks all "
            f"{state.policy.vocab_size} log-probs: every SCORE would be refused; use a "
            "teacher that serves them, or loss.objective: bucketed_topk_tail")


def teacher_vocab_map(state: TrainState, client: ScoringClient, section: Any = None,
                      route: str | None = None) -> VocabMap | None:
    """``loss.cross_vocab: hybrid``: the :class:`VocabMap` of the student's tokenizer and
    the teacher's, read from the teacher section's ``model.path`` (``section``, default
    ``teacher:``) and checked against the fingerprint in the teacher's ``HELLO_OK``
    (built once per pair, cached: ``cross_vocab.vocab_map``); its coverage is the run's
    ``vocab_map`` event (naming the ``route`` of a run of several teachers). None for the
    other targets."""
    recipe = state.recipe
    section = section or recipe.teacher
    if teacher_kind(section, recipe.loss) != "xvocab" or recipe.loss.cross_vocab != "hybrid":
        return None
    source = section.model
    if source.path is None:
        raise ConfigError(
            f"loss.cross_vocab: hybrid maps the two vocabularies, so the student reads the "
            f"teacher's tokenizer from its model.path, but that teacher's model is "
            f"{source.describe()}; give the teacher's model directory as its model.path "
            "or set loss.cross_vocab: uld")
    tokenizer = load_tokenizer(source.path)
    fingerprint = fingerprint_tokenizer(tokenizer)
    hello = client.hello
    if hello is not None and hello.tokenizer_fp != fingerprint:
        raise TokenizerMismatch(
            f"model.path {source.path!r} holds tokenizer {fingerprint[:19]}, but "
            f"teacher {hello.teacher.name!r} has {hello.tokenizer_fp[:19]}; point that "
            "teacher's model.path at the served model's directory")
    vmap = vocab_map(state.policy.tokenizer, tokenizer)
    state.run.event("vocab_map", student=vmap.student_fingerprint,
                    teacher=vmap.teacher_fingerprint, **vmap.coverage(),
                    **({"route": route} if route is not None else {}))
    return vmap


def client_proof(state: TrainState, teacher: Any = None) -> dict[str, Any]:
    """``curve`` keys and ``admin_token_file`` for the client of ``teacher`` (default:
    the recipe's teacher section; docs/protocol.md, "Admin")."""
    side, teacher = state.teacher, teacher or state.recipe.teacher
    files = side.curve
    if files is None and teacher is not None and teacher.curve_secret_key is not None:
        files = (teacher.curve_secret_key, teacher.curve_server_key)
    curve = load_curve_client_keys(*files) if files is not None else None
    # Without a file named here the client reads the one beside the teacher's socket.
    return {"curve": curve, "admin_token_file": side.admin_token_file}


def park(state: TrainState) -> None:
    """Swap: move the teacher's weights off the device before the update."""
    _swap_call(state, "park")


def wake(state: TrainState) -> None:
    """Swap: bring the teacher's weights back before scoring, after the student has handed
    its cached free blocks back to the device: the update's activations are free but
    still held by this process's allocator, and the teacher's copy back would otherwise
    run out of memory in exactly the case swap exists for."""
    if state.policy.device.type == "cuda":
        import torch

        torch.cuda.empty_cache()
    _swap_call(state, "wake")


def _swap_call(state: TrainState, what: str) -> None:
    side = state.teacher
    assert side.client is not None  # bound at connect, before any update
    try:
        side.client.park() if what == "park" else side.client.wake()
    except Unauthorized as exc:
        # Not an admin of this teacher (an attached student without its token): the
        # teacher stays resident; the update may then need more memory than measured.
        side.memory = "resident"
        reason = f"{what.upper()} refused ({exc}); the teacher stays resident"
        state.run.event("memory_swap_refused", reason=reason, version=state.version)
        teacher = state.recipe.teacher
        assert teacher is not None  # swap: one teacher section
        update_manifest(state.run, memory={"wanted": teacher.memory,
                                           "chosen": "resident", "reason": reason})


def check_qualified(state: TrainState, identity: dict) -> None:
    """The competence gate (teacher.min_success, teacher.min_recovery): refuse an
    unqualified teacher."""
    teacher = state.recipe.teacher
    if teacher is None or (teacher.min_success is None and teacher.min_recovery is None):
        return
    record = require_qualified(state.recipe, identity)
    assert record is not None  # a gate is set: it returns the record that passed it
    state.run.event("teacher_qualified", teacher=identity, success=record["success"],
                    split=record["split"], n=record["n"], date=record["date"],
                    min_success=teacher.min_success, version=state.version,
                    **({"recovery": record.get("recovery"), "min_recovery": teacher.min_recovery}
                       if teacher.min_recovery is not None else {}))


def teacher_view(state: TrainState) -> PrivilegedViews | None:
    """teacher.mode privileged_context: the view hook (rollout/privileged.py), else None."""
    recipe = state.recipe
    if recipe.teacher is None or recipe.teacher.mode != "privileged_context":
        return None
    env = recipe.environment
    sizes = {"train": env.train_tasks, "eval": env.eval_tasks, "test": env.test_tasks}
    policy = state.policy
    return PrivilegedViews(
        policy.tokenizer, tokenizer_fp=policy.tokenizer_fp, env_name=env.name,
        env_params=env.params,
        task_of=task_lookup(env.name, env.params, env.difficulty, env.split_seed, sizes,
                            known=state.tasks.all),
    )


def route_views(state: TrainState, route: Any) -> Callable | None:
    """A routed teacher with ``mode: privileged_context``: the view hook of each
    environment it scores (its own params, splits and tasks), picked by the
    trajectory's environment; None for a standard teacher."""
    if route.config is None or route.config.mode != "privileged_context":
        return None
    policy, mixture, members = state.policy, state.tasks.mixture, state.recipe.environments
    assert mixture is not None and members is not None  # routes split a mixture's environments
    views = {}
    for member in members:
        if member.name not in route.environments:
            continue
        sizes = {"train": member.train_tasks, "eval": member.eval_tasks,
                 "test": member.test_tasks}
        mine = [t for t in state.tasks.all if mixture.environment_of[t.id] == member.name]
        views[member.name] = PrivilegedViews(
            policy.tokenizer, tokenizer_fp=policy.tokenizer_fp, env_name=member.name,
            env_params=member.params,
            task_of=task_lookup(member.name, member.params, member.difficulty,
                                member.split_seed, sizes, known=mine))

    def view(traj: Trajectory, positions_P: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if traj.environment not in views:
            raise ConfigError(
                f"trajectory {traj.id} is from environment {traj.environment!r}, which route "
                f"{route.name} does not score ({', '.join(views)}); route each environment "
                "to one teacher")
        return views[traj.environment](traj, positions_P)

    return view


def teacher_changed(state: TrainState, new: dict, version: int, how: str) -> None:
    """A reload or restart the link noticed: gate the new teacher and record it."""
    side = state.teacher
    if new == side.identity:  # already recorded: a retarget records itself
        return
    check_qualified(state, new)
    prev = side.identity
    side.identity = new
    state.run.event("teacher_changed", how=how, old=prev, new=new, version=version)
    record_teacher(state.run, version, new, how=how)


def vet_endpoint(state: TrainState, endpoint: str, timeout_s: float) -> dict[str, Any]:
    """The identity of the teacher at ``endpoint`` if this run would accept it.

    Handshakes on a throwaway client (the run's tokenizer and proof) and applies the
    gate; raises ``TokenizerMismatch`` (also for a teacher without the xvocab kind the
    run asks for), ``TeacherNotQualified`` or
    ``TeacherUnavailable`` (no handshake within ``timeout_s``). Safe off the training
    thread: it touches nothing the loop uses.
    """
    probe = new_client(state, endpoint, timeout_s=timeout_s, suffix=":vet")
    try:
        probe.connect(timeout_s)
        require_xvocab(state, probe)
        require_serves(state, probe)
        identity = teacher_identity(probe)
    finally:
        probe.close()
    require_qualified(state.recipe, identity)
    return identity


def vet_route(state: TrainState, route: RouteSide, endpoint: str) -> dict[str, Any]:
    """The identity of the teacher at ``endpoint`` if ``route`` would accept it: the
    run's tokenizer, the route's adapter served, the route's gate passed
    (:func:`vet_endpoint` for one route)."""
    probe = new_client(state, endpoint, teacher=route.route.config, adapter=route.route.adapter,
                       timeout_s=RETARGET_HANDSHAKE_S, suffix=f":{route.route.name}:vet")
    try:
        probe.connect(RETARGET_HANDSHAKE_S)
        require_xvocab(state, probe, route.route.config, route.link)
        require_serves(state, probe, route.route.config, route.route.adapter, route.route.name)
        identity = teacher_identity(probe)
    finally:
        probe.close()
    require_route_qualified(state.recipe, route.route, identity)
    return identity


def apply_retarget(state: TrainState) -> None:
    """Switch to the endpoint a ``RETARGET`` asked for, if any (an update boundary)."""
    side = state.teacher
    for route in (side.routes or {}).values():
        apply_route_retarget(state, route, lambda r, endpoint: vet_route(state, r, endpoint))
    endpoint, side.pending_endpoint = side.pending_endpoint, None
    if endpoint is None or side.client is None:
        return
    old = dict(side.identity)
    try:
        if is_engine_endpoint(endpoint) or isinstance(side.client, EngineTeacherClient):
            _switch_client(state, endpoint)
        else:
            side.client.retarget(endpoint)
            try:
                check_qualified(state, teacher_identity(side.client))
            except MiniverlError:
                if side.endpoint is not None:  # a client handed in names no endpoint
                    side.client.retarget(side.endpoint)  # back to the qualified teacher
                raise
    except Exception as exc:  # a refused swap keeps training on the old teacher
        state.run.event("teacher_swap_refused", endpoint=endpoint, reason=str(exc),
                        version=state.version)
        return
    side.endpoint = endpoint
    side.identity = teacher_identity(side.client)
    state.run.event("teacher_changed", how="retarget", old=old, new=side.identity,
                    version=state.version, endpoint=endpoint)
    record_teacher(state.run, state.version, side.identity, how="retarget")


def _switch_client(state: TrainState, endpoint: str) -> None:
    """A retarget to or from an engine server: another client, connected and gated
    before it replaces the old one (at an update boundary; the old one is closed)."""
    side = state.teacher
    client = new_client(state, endpoint)
    try:
        client.connect(state.recipe.runtime.teacher_startup_timeout_s)
        check_qualified(state, teacher_identity(client))
    except BaseException:
        client.close()
        raise
    old, side.client = side.client, client
    assert old is not None  # apply_retarget switches a connected client only
    if isinstance(side.link, TeacherLink):  # one teacher's link: it binds the new client
        side.link.client, side.link.binding = client, None
    old.close()


def choose_memory(state: TrainState) -> str:
    """resident or swap for this run (docs/up.md), recorded as an event and in the manifest."""
    assert state.recipe.teacher is not None  # one teacher (several stay resident)
    wanted = state.recipe.teacher.memory
    strategy, reason = memory_strategy(state.recipe, state.policy.device)
    state.run.event("memory_strategy", wanted=wanted, chosen=strategy, reason=reason)
    update_manifest(state.run, memory={"wanted": wanted, "chosen": strategy, "reason": reason})
    return strategy


def _planned_memory(recipe: Any, total: int) -> tuple[str, str] | None:
    """``teacher.memory: auto`` from the memory plan (common/memory_plan.py): resident
    when the plan fits the device with the teacher resident, else swap; None when a
    model's config.json cannot be read here."""
    try:
        student = read_shape(recipe.student.model)
        _, chosen, _ = check_recipe(recipe, total, student=student)
    except (ConfigError, OSError):
        return None
    peak = f"{chosen.plan.peak / GIB:.1f} GiB of {total / GIB:.1f} GiB"
    if not chosen.fits:  # up and train refuse such a plan before they ask
        return chosen.plan.memory, (f"the memory plan needs {peak} and does not fit "
                                    "(miniverl validate --device-memory shows it)")
    if chosen.plan.memory == "swap":
        return "swap", f"the memory plan fits {peak} only with the teacher parked during updates"
    return "resident", f"the memory plan fits {peak} with the teacher resident"


def memory_strategy(recipe: Any, device: Any) -> tuple[str, str]:
    """``(strategy, reason)`` for the recipe's ``teacher.memory`` on ``device``."""
    wanted = recipe.teacher.memory
    # swap parks the TEACHER's weights; the student's (4-bit or not) never move.
    if wanted != "auto":
        return wanted, f"set by the recipe (teacher.memory: {wanted})"
    if getattr(device, "type", "cpu") != "cuda":
        return "resident", "student on CPU: no accelerator memory to share"
    import torch

    free, total = torch.cuda.mem_get_info(device)
    planned = _planned_memory(recipe, total)
    if planned is not None:
        return planned
    # No config.json to plan from (a teacher model this machine never saw): the old rule.
    used_by_student = torch.cuda.memory_allocated(device)
    needed = UPDATE_HEADROOM * used_by_student
    if free >= needed:
        return "resident", (
            f"{free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB covers the update's "
            f"~{needed / 2**30:.1f} GiB with the teacher resident"
        )
    return "swap", (
        f"only {free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB; the update needs "
        f"~{needed / 2**30:.1f} GiB, so the teacher parks during updates"
    )
