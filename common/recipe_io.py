"""Reading recipe YAML and reporting every error with its ``file:line:col``.

The YAML is composed into a node tree (which keeps marks) and loaded with the safe
loader (no tags that build Python objects, no interpolation). Validation errors of the
schema (the pydantic model passed in, :class:`~miniverl.common.recipe.Recipe`) are
mapped back to the node of their field, so the user sees
``recipe.yaml:14:3: train.max_lag: ...`` for each problem, all in one
:class:`ConfigError` with one line per error.

This module does not define the schema; :mod:`miniverl.common.recipe` does, and calls
:func:`load_yaml_model` with it (the schema is a parameter, so the two modules do not
import each other).
"""

from __future__ import annotations

import copy
import difflib
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from .errors import ConfigError

Loc = tuple[str | int, ...]
M = TypeVar("M", bound=BaseModel)


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _locate(root: yaml.Node | None, loc: Loc) -> tuple[int, int] | None:
    """Line and column of the deepest YAML node along ``loc`` (1-based)."""
    if root is None:
        return None
    node = root
    where = _mark(root)
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.value == str(part):
                    # A key's own line reads best for the final element (a nested
                    # section's value node starts on the next line).
                    where = _mark(key_node) if last else _mark(value_node)
                    node = value_node
                    break
            else:
                return where
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if 0 <= part < len(node.value):
                node = node.value[part]
                where = _mark(node)
            else:
                return where
        else:
            return where
    return where


def _duplicate_keys(node: yaml.Node | None, path: Loc = ()) -> list[tuple[Loc, yaml.Node]]:
    """PyYAML keeps the last of two equal keys silently; a recipe must not."""
    found: list[tuple[Loc, yaml.Node]] = []
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = getattr(key_node, "value", None)
            if isinstance(key, str):
                if key in seen:
                    found.append(((*path, key), key_node))
                seen.add(key)
                found.extend(_duplicate_keys(value_node, (*path, key)))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found.extend(_duplicate_keys(item, (*path, i)))
    return found


def _field_models(annotation: Any) -> list[type[BaseModel]]:
    candidates = [annotation, *getattr(annotation, "__args__", ())]
    return [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]


def _model_names(schema: type[BaseModel]) -> frozenset[str]:
    """Class names of ``schema`` and every model reachable through its fields."""
    seen: dict[str, type[BaseModel]] = {}
    todo = [schema]
    while todo:
        model = todo.pop()
        if model.__name__ not in seen:
            seen[model.__name__] = model
            for field in model.model_fields.values():
                todo.extend(_field_models(field.annotation))
    return frozenset(seen)


def _model_at(schema: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    """The pydantic model that owns the field at ``loc`` (for did-you-mean hints)."""
    model: Any = schema
    for part in loc:
        if not isinstance(part, str):
            return None
        field = model.model_fields.get(part)
        if field is None:
            return None
        model = next(iter(_field_models(field.annotation)), None)
        if model is None:
            return None
    return model


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _describe(schema: type[BaseModel], err: ErrorDetails) -> list[tuple[Loc, str]]:
    """One or more (location, message) pairs for a pydantic error dict."""
    loc: Loc = tuple(err["loc"])
    kind = err["type"]
    ctx = err.get("ctx") or {}
    if kind == "miniverl_rule" and "issues" in ctx:
        return [((*loc, *sub), msg) for sub, msg, _ in ctx["issues"]]
    if kind == "extra_forbidden":
        key = str(loc[-1])
        owner = _model_at(schema, loc[:-1])
        hint = ""
        if owner is not None:
            close = difflib.get_close_matches(key, list(owner.model_fields), n=1)
            hint = (
                f"; did you mean {close[0]!r}?"
                if close
                else (f"; allowed: {', '.join(owner.model_fields)}")
            )
        return [(loc, f"unknown field {key!r}{hint}")]
    if kind == "missing":
        return [(loc, "required field is missing; add it")]
    message = err["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    if "input" in err and kind not in ("model_type", "dict_type"):
        message = f"{message} (got {_short(err['input'])})"
    return [(loc, message)]


def _dotted(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<recipe>"


def _strip_union_tags(loc: Loc, names: frozenset[str]) -> Loc:
    # A union of models adds the member's class name (e.g. "TeacherConfig") to the loc;
    # user keys are never dropped, so `Run:` is still reported as an unknown field.
    return tuple(p for p in loc if not (isinstance(p, str) and p in names))


def _rule_involves_removed(
    err: ErrorDetails, sub: list, involves: list, removed: set, names: frozenset[str]
) -> bool:
    base = _strip_union_tags(tuple(err["loc"]), names)
    paths = [(*base, *sub), *((*base, name) for name in involves if not name.startswith("/"))]
    if any(path[: i + 1] in removed for path in paths for i in range(len(path))):
        return True
    # "/teacher": a section read from the root; any field removed under it counts.
    roots = [tuple(name[1:].split(".")) for name in involves if name.startswith("/")]
    return any(loc[: len(root)] == root for root in roots for loc in removed)


def _delete(data: Any, loc: Loc) -> bool:
    node = data
    for part in loc[:-1]:
        in_dict = isinstance(node, dict) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if not (in_dict or in_list):
            return False
        node = node[part]
    if isinstance(node, dict) and loc and loc[-1] in node:
        del node[loc[-1]]
        return True
    return False


def _validate_all(
    schema: type[M], data: dict[str, Any]
) -> tuple[M | None, list[tuple[Loc, str]]]:
    """Validate, then re-validate with the broken fields removed to surface later errors.

    Pydantic stops a section at its first broken field, so a rule of that section (say
    ``max_total_tokens > max_new_tokens_per_turn``) would only appear after the user
    fixed the typo. Removing reported fields and validating again shows both at once;
    a rule that reads a removed field is skipped, since it would judge a default.
    """
    names = _model_names(schema)
    work = copy.deepcopy(data)
    removed: set[Loc] = set()
    problems: list[tuple[Loc, str]] = []
    seen: set[tuple[Loc, str]] = set()
    for _ in range(4):
        try:
            recipe = schema.model_validate(work)
        except ValidationError as exc:
            progress = False
            for err in exc.errors(include_url=False):
                ctx = err.get("ctx") or {}
                if err["type"] == "miniverl_rule" and "issues" in ctx:
                    pairs = []
                    for sub, msg, involves in ctx["issues"]:
                        if not _rule_involves_removed(err, sub, involves, removed, names):
                            pairs.append(((*tuple(err["loc"]), *sub), msg))
                else:
                    pairs = _describe(schema, err)
                for loc, message in pairs:
                    loc = _strip_union_tags(loc, names)
                    if (loc, message) in seen or loc in removed:
                        continue
                    seen.add((loc, message))
                    problems.append((loc, message))
                loc = _strip_union_tags(tuple(err["loc"]), names)
                repairable = err["type"] not in ("miniverl_rule", "missing")
                if repairable and loc not in removed and _delete(work, loc):
                    removed.add(loc)
                    progress = True
            if not progress:
                break
        else:
            return (None if problems else recipe), problems
    return None, problems


def loads_yaml_model(text: str, source: str, schema: type[M]) -> M:
    """Validate recipe YAML text against ``schema``; raise one ConfigError, a line per problem."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML: {problem}; fix the syntax") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}:1:1: a recipe is a YAML mapping with sections run, student, ...; "
            f"got {type(data).__name__}"
        )
    problems: list[tuple[Loc, str]] = [
        (path, f"duplicate key {path[-1]!r}; keep one") for path, _ in _duplicate_keys(root)
    ]
    recipe, errors = _validate_all(schema, data)
    problems.extend(errors)
    if problems:
        located = [(_locate(root, loc) or (0, 0), loc, message) for loc, message in problems]
        located.sort(key=lambda item: item[0])  # file order reads best
        lines = [
            f"{source}:{line}:{col}: {_dotted(loc)}: {message}"
            for (line, col), loc, message in located
        ]
        raise ConfigError("\n".join(lines))
    assert recipe is not None  # no problems means validation succeeded
    return recipe


def load_yaml_model(path: str | Path, schema: type[M]) -> M:
    """Read and validate a recipe file against ``schema`` (see :func:`loads_yaml_model`)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"recipe {path} does not exist; check the path") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"recipe {path} is not UTF-8 text (byte {exc.start}); pass a recipe YAML file"
        ) from None
    except OSError as exc:
        raise ConfigError(f"recipe {path} cannot be read: {exc}") from None
    return loads_yaml_model(text, str(path), schema)
