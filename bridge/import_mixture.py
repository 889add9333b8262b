"""Importing a bundle of a mixture or of several teachers (``mixture_bundle.py`` wrote it).

On top of one environment's bundle (:mod:`miniverl.bridge.import_bundle`, whose teacher
pool ``distillation.nnodes``, ``n_gpus_per_node`` is :func:`pool_handlers`'s for every
bundle) such a bundle has the routing key
(``distillation.teacher_key: data_source``) and, with several teachers, one
``distillation.teacher_models`` entry per route. Each is understood exactly as the
exporter wrote it, checked against ``provenance/manifest.json`` (itself checked against
``SHA256SUMS``):

- an entry's ``key`` must be the ``data_source`` the manifest gives that entry, and its
  ``model_path`` the route's stand-in (``TEACHER_<ROUTE>_MODEL_DIR``); the route's teacher
  comes back from ``model/base_model.json`` as a teacher of ``teachers:`` (a toy spec, a
  pinned hub id, a prepared teacher in this machine's cache), and each environment names
  it (``environments[].teacher``);
- an adapter route was exported as the merged teacher: it comes back as the base with its
  adapter (``adapters:``) where the adapter is a hub id, and is refused in one line where
  the bundle does not publish it (a local directory);
- the pool, the GPUs per entry (``num_replicas``) and each entry's ``inference`` block (verl's
  own template): informational, at the values the exporter writes; another value is
  refused, since it is a placement miniverl does not run;

and ``finish`` writes ``environments:`` from the manifest's environments (name, params,
difficulty, split seed, weight, train and eval rows; the rest, such as test tasks, comes
from the source recipe with every other field verl has no field for, see
:func:`miniverl.bridge.import_bundle.finish`).
Anything a route was not exported as (an edited key, another model variable) is refused.
"""

from __future__ import annotations

from miniverl.bridge import mixture_bundle
from miniverl.bridge.teacher_source import model_source
from miniverl.common.teacher_routes import SINGLE

ENTRY_TARGET = "verl.workers.config.DistillationTeacherModelConfig"


def _routes(facts) -> dict:
    return (facts.manifest.get("teachers") or {}).get("routes") or {}


def _info(note: str, expected=None, check=None):
    def handler(key, value, result, *_):
        ok = check(value) if check is not None else value == expected
        if ok:
            result.add(key, "informational", value, None, note)
        else:
            wrote = f"{expected!r}" if check is None else "a positive number"
            result.add(key, "refused", value, None,
                       f"the bundle writes {wrote} here (got {value!r}); another value is "
                       "a setup miniverl does not run, restore it")

    return handler


def _entry_key(route: str, expected: str):
    def handler(key, value, result, *_):
        if value == expected:
            result.add(key, "derived", value, f"environments[{expected}].teacher",
                       f"routes {expected} to route {route}")
        else:
            result.add(key, "refused", value, None,
                       f"route {route} was exported keyed by {expected!r}; a teacher keyed by "
                       f"{value!r} is a route miniverl cannot express from this bundle, "
                       "restore the key")

    return handler


def _entry_model(route: str, spec: dict, identity: dict):
    variable = spec.get("model_dir_variable")

    def handler(key, value, result, *_):
        # teacher.adapters (one teacher): its routes are adapters of teacher:.
        section = (result.recipe.setdefault("teacher", {}) if spec["teacher"] == SINGLE
                   else result.recipe.setdefault("teachers", {}).setdefault(spec["teacher"], {}))
        if value != variable:
            result.add(key, "refused", value, None,
                       f"route {route} loads {variable!r} (its model, model/base_model.json); "
                       "restore it")
            return
        if spec.get("adapter") is not None:
            adapter = identity.get("adapter") or {}
            source, note = model_source(identity.get("base") or {})
            if adapter.get("source") != "hub" or source is None:
                result.add(key, "unsupported", value, f"teachers.{spec['teacher']}.adapters",
                           f"route {route} was exported as its base merged with adapter "
                           f"{adapter.get('name')!r}, which the bundle does not publish (a "
                           "local directory); set the route's teacher and adapters by hand")
                return
            section["model"] = source
            section.setdefault("adapters", {})[spec["adapter"]] = adapter["hub_id"]
            result.add(key, "derived", value, f"teachers.{spec['teacher']}.adapters",
                       f"{note}; adapter {spec['adapter']} ({adapter['hub_id']}), which the "
                       "bundle's verl teacher loads merged")
            return
        source, note = model_source(identity)
        if source is None:
            result.add(key, "unsupported", value, f"teachers.{spec['teacher']}.model", note)
            return
        section["model"] = source
        result.add(key, "derived", value, f"teachers.{spec['teacher']}.model", note)

    return handler


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def pool_handlers() -> dict:
    """The teacher pool every bundle writes (one teacher's too: verl's trainer refuses its
    default pool of 0 GPUs on 0 nodes)."""
    return {
        "distillation.nnodes": _info("the teacher pool's node (export-verl --teacher-gpus)", 1),
        "distillation.n_gpus_per_node": _info(
            "the teacher pool's GPUs (export-verl --teacher-gpus)", None, _count),
    }


def handlers(facts) -> dict:
    """The fields a mixture's bundle adds, each checked against its manifest."""
    routes = _routes(facts)
    out: dict = pool_handlers()
    if not routes:
        return out
    out["distillation.teacher_key"] = _info(
        "each row's environment picks its teacher", mixture_bundle.TEACHER_KEY)
    teachers = facts.base.get("teachers") or {}
    block = mixture_bundle.inference_block(0, 0, 1.0)
    for route, spec in routes.items():
        for entry, data_source in (spec.get("entries") or {}).items():
            prefix = f"distillation.teacher_models.{entry}"
            out[f"{prefix}._target_"] = _info("verl's teacher entry class", ENTRY_TARGET)
            out[f"{prefix}.key"] = _entry_key(route, data_source)
            out[f"{prefix}.model_path"] = _entry_model(route, spec, teachers.get(route) or {})
            out[f"{prefix}.num_replicas"] = _info(
                f"route {route}'s GPUs (export-verl --teacher-gpus)", None, _count)
            for name, value in block.items():
                if name in ("prompt_length", "response_length", "temperature"):
                    out[f"{prefix}.inference.{name}"] = _info(
                        "the student's rollout value, as verl's template resolves it", None,
                        _number)
                else:
                    out[f"{prefix}.inference.{name}"] = _info(
                        "verl's own teacher template (distillation.yaml)", value)
    return out


def finish(result, facts) -> None:
    """``environments:`` (and each environment's teacher) from the bundle's manifest."""
    routes = _routes(facts)
    route_of = {env: (spec["teacher"], spec.get("adapter"))
                for spec in routes.values() for env in spec.get("environments") or ()}
    members = []
    for env in facts.manifest["environments"]:
        member = {
            "name": env["name"], "params": env.get("params") or {},
            "difficulty": env.get("difficulty"), "split_seed": env.get("split_seed"),
            "weight": env.get("weight"),
            "train_tasks": env["rows"]["train"], "eval_tasks": env["rows"]["val"],
        }
        if env["name"] in route_of:
            teacher, adapter = route_of[env["name"]]
            if teacher != SINGLE:
                member["teacher"] = teacher
            if adapter is not None:
                member["adapter"] = adapter
        members.append(member)
    result.recipe["environments"] = members
    if any(spec["teacher"] != SINGLE for spec in routes.values()):
        result.recipe.pop("teacher", None)
    result.add("provenance/manifest.json:environments", "derived",
               [e["name"] for e in facts.manifest["environments"]], "environments",
               "each environment's split, rows and weight (verl reads them as Parquet rows)"
               + ("; each routed to its teacher as the bundle's entries name it"
                  if routes else ""))
