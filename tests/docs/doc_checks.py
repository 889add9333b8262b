"""Check a documented block without running it: commands parse, recipes validate, Python
compiles and imports what it names.

For a ``check-only`` shell block or command listing, each command (split at ``&&``,
``||``, ``;``, ``&`` and ``|``; ``VAR=value`` prefixes dropped) is checked by its first word:

- ``miniverl ...``: the subcommand exists and click's own parser accepts its options,
  arguments and choices; a placeholder value (``runs/<id>``, ``DIR``, ``sha256:…``,
  ``$(...)``) stands for any value, and a path need not exist. ``[optional]`` parts of a
  synopsis are included and ``a|b`` alternatives take the first. A recipe the command
  names that exists is checked with ``miniverl validate``; a benchmark config is loaded.
- ``python -m MODULE``: the module exists, and its ``build_parser()`` (if any) accepts
  the arguments; ``python FILE.py``: the file exists.
- ``pip install -e '.[extras]'``: every extra is declared in ``pyproject.toml``.
- ``cd DIR``: the directory exists (later commands resolve paths from it).

A ``check-only`` Python block must compile (a sketch with ``...`` in place of code is
checked on its import lines) and every ``import`` must resolve: a module of this
project is imported and each name it gives must exist; another package must be
installed. A YAML block marked ``recipe`` / ``recipe-fragment`` is validated with
``miniverl validate`` (a fragment after a deep merge into its base recipe).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.metadata
import importlib.util
import io
import re
import shlex
from pathlib import Path
from typing import Any

import typer.main
import yaml

from miniverl.cli.app import app, run
from miniverl.student.benchmark.config import load_benchmark_config
from tests.docs.doc_blocks import Block

try:
    import tomllib  # Python 3.11+
except ImportError:
    tomllib = None

ROOT = Path(__file__).resolve().parents[2]
SEPARATORS = frozenset({"&&", "||", ";", "&", "|"})
PROJECT_MODULES = ("miniverl", "benchmarks", "examples", "tests")
PLACEHOLDER = re.compile(r"<[^>]*>|…|\.\.\.|\$|^[A-Z][A-Z0-9_]*(/[A-Z][A-Z0-9_]*)*$")


def is_placeholder(value: str) -> bool:
    """True for ``runs/<id>``, ``DIR``, ``ORG/NAME``, ``sha256:…``, ``...``, ``$(cmd)``."""
    return bool(PLACEHOLDER.search(value))


def shell_commands(text: str, *, listing: bool = False) -> list[list[str]]:
    """The commands of a shell block as word lists (comments and continuations joined).

    In a ``listing`` (an untagged block of commands) three or more spaces end the command:
    what follows describes it (``miniverl cache stats DIR    entries, shards, ...``).
    """
    joined = re.sub(r"\\\n", " ", text)
    commands: list[list[str]] = []
    for line in joined.splitlines():
        if listing:
            line = re.split(r" {3,}", line.strip(), maxsplit=1)[0]
        # `<40-hex sha>` is one placeholder, not two words.
        line = re.sub(r"<[^<>]*>", lambda m: m[0].replace(" ", "-"), line)
        words = _without_redirections(shlex.split(line, comments=True))
        current: list[str] = []
        for word in words:
            if word in SEPARATORS:
                commands.append(current)
                current = []
                continue
            if word.endswith(";"):
                current.append(word[:-1])
                commands.append(current)
                current = []
                continue
            current.append(word)
        commands.append(current)
    return [_synopsis(command) for command in commands if command]


def _without_redirections(words: list[str]) -> list[str]:
    """Drop ``> file``, ``2>&1``, ``<in`` and the like: they are the shell's, not the command's."""
    out, skip_next = [], False
    for word in words:
        if skip_next:
            skip_next = False
            continue
        redirect = re.fullmatch(r"\d*(>>?|<|&>)(.*)", word)
        if redirect and not re.fullmatch(r"<[^<>]*>\S*", word):  # `<id>` is a placeholder
            skip_next = not redirect[2]
            continue
        out.append(word)
    return out


def _synopsis(words: list[str]) -> list[str]:
    """Drop ``VAR=value`` prefixes and ``[ ]`` of optional parts; ``a|b`` -> ``a``."""
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words = words[1:]
    out = []
    for word in words:
        if word.startswith("["):
            word = word[1:]
        if word.endswith("]") and "[" not in word:
            word = word[:-1]
        if "|" in word and "://" not in word and not is_placeholder(word):
            word = word.split("|")[0]
        if word:
            out.append(word)
    return out


def check_commands(text: str, cwd: Path, *, listing: bool = False) -> list[str]:
    """Problems with the commands of a check-only shell block, run from ``cwd``."""
    try:
        commands = shell_commands(text, listing=listing)
    except ValueError as exc:
        return [f"the block does not split into shell words: {exc}"]
    problems: list[str] = []
    here = cwd
    for words in commands:
        head, args = words[0], words[1:]
        if head == "miniverl":
            problems += check_miniverl(args, here)
        elif head in ("python", "python3"):
            problems += _check_python_command(args, here)
        elif head == "pip":
            problems += _check_pip(args)
        elif head == "cd" and args and not is_placeholder(args[0]):
            here = here / Path(args[0]).expanduser()
            if not here.is_dir():
                problems.append(f"cd {args[0]}: no such directory")
    return problems


def _root_command() -> Any:
    return typer.main.get_command(app)


def check_miniverl(args: list[str], cwd: Path) -> list[str]:
    """Problems with ``miniverl ARGS`` as click would parse it (nothing is run)."""
    shown = "miniverl " + " ".join(args)
    command, rest = _root_command(), list(args)
    ctx = command.make_context("miniverl", ["--help"], resilient_parsing=True)
    while hasattr(command, "get_command") and rest and not rest[0].startswith("-"):
        sub = command.get_command(ctx, rest[0])
        if sub is None:
            return [f"{shown}: no command {rest[0]!r} (see `miniverl --help`)"]
        if hasattr(sub, "get_command"):  # a group (`teacher`, `cache`): descend
            ctx = sub.make_context(rest[0], ["--help"], parent=ctx, resilient_parsing=True)
        command, rest = sub, rest[1:]
    if "--help" in rest or rest == ["--version"]:
        return []
    if hasattr(command, "get_command"):
        return [f"{shown}: a command group; name one of its commands"]
    try:
        params = _parse(command, ctx, rest)
    except Exception as exc:  # click's UsageError (typer vendors click: match by shape)
        if not hasattr(exc, "format_message"):
            raise
        return [f"{shown}: {exc.format_message()}"]
    return _validate_named_files(shown, command, params, cwd)


def _parse(command: Any, parent: Any, args: list[str]) -> dict[str, Any]:
    """Click's parser on ``args``; a placeholder or a path value is taken as given.

    This is ``Command.parse_args`` without the command: options and arity from click's
    parser, then each parameter's conversion and required check, then extra arguments.
    """
    ctx = command.context_class(command, info_name=command.name, parent=parent)
    with ctx.scope(cleanup=False):
        opts, rest, _ = command.make_parser(ctx).parse_args(args=list(args))
        for param in command.get_params(ctx):
            raw = opts.get(param.name)
            values = raw if isinstance(raw, (list, tuple)) else [raw]
            lenient = any(
                isinstance(v, str) and (is_placeholder(v) or _is_path(param)) for v in values
            )
            if lenient:
                ctx.params[param.name] = raw
                continue
            _, rest = param.handle_parse_result(ctx, opts, rest)
        if rest and not ctx.allow_extra_args:
            ctx.fail(f"Got unexpected extra argument(s) ({' '.join(rest)})")
    return dict(ctx.params)


def _is_path(param: Any) -> bool:
    """A parameter typed as a path (its existence is the reader's business)."""
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    if annotation is not None:
        return "Path" in str(annotation)
    return type(getattr(param, "type", None)).__name__ == "Path"


def _validate_named_files(shown: str, command: Any, params: dict[str, Any], cwd: Path) -> list[str]:
    """``miniverl validate`` on a named recipe that exists; a benchmark config loads."""
    problems = []
    for name in ("recipe", "recipe_path", "gate"):
        value = params.get(name)
        if isinstance(value, (str, Path)) and (cwd / value).is_file():
            problems += validate_recipe_file(cwd / value)
    config = params.get("config")
    if command.name == "benchmark" and isinstance(config, (str, Path)) and (cwd / config).is_file():
        try:
            load_benchmark_config(cwd / config)
        except Exception as exc:  # ConfigError and friends: one line for the report
            problems.append(f"{shown}: {config}: {exc}")
    return [f"{shown}: {p}" if not p.startswith(shown) else p for p in problems]


def validate_recipe_file(path: Path) -> list[str]:
    """``miniverl validate PATH`` in this process: its error lines, or none."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run(["validate", str(path)])
    if code == 0:
        return []
    lines = [line for line in (err.getvalue() + out.getvalue()).splitlines() if line.strip()]
    return [f"miniverl validate {path.name} exited {code}: " + " | ".join(lines[-6:])]


def _check_python_command(args: list[str], cwd: Path) -> list[str]:
    """``python -m MODULE ...`` (module exists, its parser accepts) or ``python FILE``."""
    if args[:1] == ["-m"] and len(args) > 1:
        module = args[1]
        spec = importlib.util.find_spec(module)
        if spec is None:
            return [f"python -m {module}: no such module"]
        if module.split(".")[0] not in PROJECT_MODULES:
            return []
        entry = f"{module}.__main__" if spec.submodule_search_locations else module
        build = getattr(importlib.import_module(entry), "build_parser", None)
        if build is None:
            return []
        with contextlib.redirect_stderr(io.StringIO()) as err:
            try:
                build().parse_args(args[2:])
            except SystemExit as exc:
                if exc.code:
                    last = (err.getvalue().strip().splitlines() or ["rejected"])[-1]
                    return [f"python -m {module} {' '.join(args[2:])}: {last}"]
        return []
    script = args[0] if args and args[0].endswith(".py") else None
    if script and not is_placeholder(script) and not (cwd / script).is_file():
        return [f"python {script}: no such file"]
    return []


def _declared_extras() -> set[str]:
    """The extras ``pyproject.toml`` declares (installed metadata may predate an edit)."""
    if tomllib is None:  # Python 3.10: what the installed metadata says
        return set(importlib.metadata.metadata("miniverl").get_all("Provides-Extra") or [])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return set(project.get("optional-dependencies", {}))


def _check_pip(args: list[str]) -> list[str]:
    """Every extra in ``pip install -e '.[a,b]'`` is one this project declares."""
    extras = _declared_extras()
    problems = []
    for word in args:
        match = re.fullmatch(r"\.\[([\w,-]+)\]", word)
        for extra in match[1].split(",") if match else []:
            if extra not in extras:
                problems.append(
                    f"pip install {word}: no extra {extra!r} in pyproject.toml "
                    "(pip would warn and skip it)"
                )
    return problems


def check_python(block: Block) -> list[str]:
    """The block compiles (or, for a sketch, its import lines do) and its imports resolve."""
    try:
        tree = ast.parse(block.text)
    except SyntaxError as exc:
        imports = "\n".join(
            line
            for line in block.text.splitlines()
            if re.match(r"^(from \S+ import [^(]+|import \S.*)$", line)
        )
        if not imports:
            return [f"does not compile ({exc.msg}, line {exc.lineno}) and imports nothing"]
        tree = ast.parse(imports)
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            problems += [p for alias in node.names for p in _check_import(alias.name, [])]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            problems += _check_import(node.module, [alias.name for alias in node.names])
    return problems


def _check_import(module: str, names: list[str]) -> list[str]:
    """A project module is imported and must give ``names``; another must be installed."""
    if module.split(".")[0] not in PROJECT_MODULES:
        found = importlib.util.find_spec(module.split(".")[0]) is not None
        return [] if found else [f"import {module}: not installed"]
    try:
        loaded = importlib.import_module(module)
    except ImportError as exc:
        return [f"import {module}: {exc}"]
    missing = [
        name
        for name in names
        if name != "*"
        and not hasattr(loaded, name)
        and importlib.util.find_spec(f"{module}.{name}") is None
    ]
    return [f"from {module} import {name}: no such name" for name in missing]


def check_yaml(block: Block, cwd: Path) -> list[str]:
    """``recipe``/``recipe-fragment``: ``miniverl validate``; ``check-only``: it parses."""
    try:
        data = yaml.safe_load(block.text)
    except yaml.YAMLError as exc:
        return [f"not YAML: {exc}"]
    if block.marker is None or block.marker.kind == "check-only":
        return []
    if block.marker.kind == "recipe-fragment":
        base_path = cwd / block.marker.base
        if not base_path.is_file():
            return [f"recipe-fragment: no base recipe {block.marker.base}"]
        data = deep_merge(yaml.safe_load(base_path.read_text(encoding="utf-8")), data)
        folder = base_path.parent
    else:
        folder = cwd / "recipes"
    out = folder / f"_docs_{block.page.stem}_{block.line}.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return validate_recipe_file(out)


MODEL_SOURCES = frozenset({"path", "hub_id", "gguf", "toy"})


def deep_merge(base: Any, fragment: Any) -> Any:
    """``fragment`` over ``base``: mappings merge key by key, anything else replaces.

    A model has exactly one source, so a fragment naming one (``model: {gguf: ...}``)
    replaces the base's (``toy: ...``), as a reader editing the recipe would.
    """
    if isinstance(base, dict) and isinstance(fragment, dict):
        if MODEL_SOURCES & fragment.keys():
            base = {k: v for k, v in base.items() if k not in MODEL_SOURCES}
        merged = dict(base)
        for key, value in fragment.items():
            merged[key] = deep_merge(base.get(key), value)
        return merged
    return fragment
