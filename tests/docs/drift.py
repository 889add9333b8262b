"""What a page says about the code, read back from the code: the prose drift check.

The block checkers (``doc_checks.py``, ``doc_runner.py``) run or parse a page's marked
blocks; a sentence is not a block. This module reads the *prose* of ``README.md`` and
``docs/*.md`` for the things a machine can hold to the code:

- every ``miniverl ...`` command in a code span or a block: the subcommand exists and
  each ``--flag`` is one of its options (``python -m miniverl.teacher_server``: its
  ``build_parser()``);
- every recipe field a page names in a code span (``teacher.tokenizer``,
  ``teachers.NAME.min_success``, ``environments[].weight``): a path through the pydantic
  schema (``common/recipe*.py``);
- every run event a page names (```x` event``, ``event `x` ``) is one the code emits
  (``RunDir.event`` calls under ``common/``, ``student/``, ``cli/``), and the one list of
  events and metric keys (docs/runs.md, "Events and metrics") is the code's, both ways.

Each ``*_problems`` function returns one line per problem (page:line, what, why) and
counts what it checked. It imports the typer app and the schema, never torch.
"""

from __future__ import annotations

import ast
import re
import shlex
import types
import typing
from collections import Counter
from pathlib import Path
from typing import Any

import typer.main
from pydantic import BaseModel

from miniverl.cli.app import app
from miniverl.common.recipe import Recipe

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
# A command ends at a shell separator, a comment or prose inside the span.
ENDS = {"|", "||", "&&", ";", "&", ">", ">>", "2>", "#", "..."}
FILE_SUFFIX = re.compile(r"\.(py|ya?ml|json|jsonl|md|html|sock|log|key|key_secret|txt|toml|"
                         r"parquet|safetensors|pt|bin|gguf|sh|lock|admin-token)$")


def page_lines(page: Path) -> list[tuple[int, str, bool]]:
    """(line number, text, inside a fenced block) for every line of ``page``."""
    out, inside = [], False
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        if FENCE.match(line):
            inside = not inside
            continue
        out.append((number, line, inside))
    return out


def _rel(page: Path) -> str:
    return page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else page.name


# -- commands and flags --------------------------------------------------------------------

def cli_root() -> Any:
    """The typer app as a click group (typer's own click classes: read by duck typing)."""
    return typer.main.get_command(app)


def module_parsers() -> dict[str, set[str]]:
    """Option strings of the ``python -m`` entry point with a ``build_parser()``."""
    from miniverl.teacher_server.__main__ import build_parser

    return {"miniverl.teacher_server": {o for a in build_parser()._actions
                                       for o in a.option_strings}}


def options_of(command: Any) -> set[str]:
    opts = {"--help"}
    for param in command.params:
        opts.update(o for o in (*param.opts, *param.secondary_opts) if o.startswith("-"))
    return opts


def command_texts(page: Path) -> list[tuple[int, str]]:
    """Each ``miniverl`` or ``python -m miniverl.X`` command on the page, with its line:
    from a block line, or from a code span in prose."""
    found = []
    for number, line, inside in page_lines(page):
        pieces = [line] if inside else CODE_SPAN.findall(line)
        for piece in pieces:
            piece = re.sub(r"<[^<>]*>", "PLACEHOLDER", piece)  # `<40-hex sha>` is one word
            for start in re.finditer(r"(?:^|(?<=[\s(`$]))(miniverl|python -m miniverl\.\w+)\b(?![-./\w'])",
                                     piece):
                found.append((number, piece[start.start():]))
    return found


def _words(text: str) -> list[str]:
    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        words = text.split()
    out = []
    for word in words:
        if word in ENDS or word.startswith("#"):
            break
        out.append(word)
    return out


def command_problems(pages: list[Path] | None = None) -> tuple[list[str], Counter]:
    """Every command a page shows exists, with every flag it gives."""
    root, modules = cli_root(), module_parsers()
    problems: list[str] = []
    counts: Counter = Counter()
    seen_commands: set[str] = set()
    for page in pages or PAGES:
        for number, text in command_texts(page):
            where = f"{_rel(page)}:{number}"
            words = _words(text)
            if words[:2] == ["python", "-m"]:
                module = words[2]
                if module not in modules:
                    continue
                name, known, rest = f"python -m {module}", modules[module], words[3:]
            else:
                command = root
                path = ["miniverl"]
                rest = words[1:]
                while hasattr(command, "commands") and rest and not rest[0].startswith("-"):
                    word = rest[0].strip("[]`,.:;)(")
                    if not re.fullmatch(r"[a-z][a-z0-9-]*", word):
                        break  # a placeholder (`miniverl COMMAND`) or prose
                    sub = command.commands.get(word)
                    if sub is None:
                        problems.append(f"{where}: `{' '.join(path)} {word}`: the CLI has no "
                                        f"such command ({', '.join(sorted(command.commands))})")
                        command = None  # type: ignore[assignment]
                        break
                    command, path, rest = sub, [*path, word], rest[1:]
                if command is None or command is root and not rest:
                    continue
                name, known = " ".join(path), options_of(command)
                if command is root:
                    known |= {"--version"}
            seen_commands.add(name)
            counts["command mentions"] += 1
            for word in rest:
                for flag in re.findall(r"(?:^|[\[|(])(--[a-z][a-z0-9-]*)", word):
                    counts["flag mentions"] += 1
                    counts[f"flag {name} {flag}"] += 1
                    if flag not in known:
                        problems.append(f"{where}: `{name}` has no option {flag} "
                                        f"(its options: {', '.join(sorted(known))})")
    counts["commands"] = len(seen_commands)
    counts["flags"] = sum(1 for key in counts if key.startswith("flag miniverl")
                          or key.startswith("flag python"))
    return problems, counts


# -- recipe fields ---------------------------------------------------------------------------

def _unwrap(annotation: Any) -> list[Any]:
    """The types a field may hold, Optional and unions opened."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [a for arg in typing.get_args(annotation) for a in _unwrap(arg)
                if a is not type(None)]
    if typing.get_origin(annotation) is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    return [annotation]


def _resolves(annotation: Any, segments: list[str]) -> bool:
    if not segments:
        return True
    for kind in _unwrap(annotation):
        origin = typing.get_origin(kind)
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            field = kind.model_fields.get(segments[0])
            if field is not None and _resolves(field.annotation, segments[1:]):
                return True
        elif origin is list:
            if _resolves(typing.get_args(kind)[0], segments):
                return True
        elif origin is dict:
            value = typing.get_args(kind)[1]
            if value is Any or _resolves(value, segments[1:]):
                return True  # a free dict (environment.params) takes any key
        elif kind is Any:
            return True
    return False


def field_mentions(page: Path) -> list[tuple[int, str]]:
    """Code spans that name a recipe field: ``section.field[.more]``, optionally
    ``: value`` after it."""
    sections = set(Recipe.model_fields)
    out = []
    for number, line, inside in page_lines(page):
        if inside:
            continue
        for span in CODE_SPAN.findall(line):
            path = re.split(r"[:=\s]", span.strip(), maxsplit=1)[0]
            if "." not in path or FILE_SUFFIX.search(path) or "/" in path or "(" in path:
                continue
            head = re.sub(r"\[[^\]]*\]", "", path.split(".")[0])
            if head in sections and re.fullmatch(r"[a-z_]+(\[[^\]]*\])?(\.[A-Za-z0-9_<>\-]+(\[[^\]]*\])?)+",
                                                 path):
                out.append((number, path))
    return out


# Dotted names that look like a recipe field and are something else, page by page.
NOT_FIELDS = {
    # attributes of the fake teacher object (`teacher = FakeTeacher()`)
    "docs/testing.md": {"teacher.default", "teacher.held", "teacher.silent",
                        "teacher.hello_error", "teacher.checks_tokenizer", "teacher.scores",
                        "teacher.transports", "teacher.transport_factory"},
    # verl's own configuration keys (actor_rollout_ref.rollout.*), not miniverl's
    "docs/verl-bridge.md": {"rollout.name", "rollout.log_prob_micro_batch_size_per_gpu",
                            "rollout.n", "rollout.load_format",
                            "rollout.agent.default_agent_loop", "rollout.prompt_length"},
}


def _module_path(segments: list[str]) -> bool:
    """``student.train.updates.distill_step``: a module of this repository, not a field."""
    folder = ROOT / segments[0]
    return len(segments) > 1 and ((folder / segments[1]).is_dir()
                                  or (folder / f"{segments[1]}.py").is_file())


def field_problems(pages: list[Path] | None = None) -> tuple[list[str], Counter]:
    """Every recipe field a page names is in the schema."""
    problems: list[str] = []
    counts: Counter = Counter()
    fields: set[str] = set()
    for page in pages or PAGES:
        exempt = NOT_FIELDS.get(_rel(page), set())
        for number, path in field_mentions(page):
            segments = [re.sub(r"\[[^\]]*\]", "", s) for s in path.split(".")]
            if _module_path(segments) or path in exempt:
                continue
            counts["field mentions"] += 1
            fields.add(".".join(segments))
            if not _resolves(Recipe, segments):
                problems.append(f"{_rel(page)}:{number}: `{path}` is not a recipe field "
                                "(common/recipe*.py)")
    counts["fields"] = len(fields)
    return problems, counts


# -- events and metrics ------------------------------------------------------------------------

def _constants(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _constants(node.body) + _constants(node.orelse)
    return []


def emitted_events() -> set[str]:
    """Names passed to ``.event(...)`` anywhere the run's writers live."""
    names: set[str] = set()
    for folder in ("common", "student", "cli"):
        for source in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "event" and node.args):
                    names.update(_constants(node.args[0]))
    return names


def metric_keys() -> set[str]:
    """Keys of a metrics row: ``log_cycle``'s row and every mode's ``extra``."""
    keys: set[str] = {"ts"}
    state = ast.parse((ROOT / "student/train/state.py").read_text(encoding="utf-8"))
    [log_cycle] = [n for n in ast.walk(state) if isinstance(n, ast.FunctionDef)
                   and n.name == "log_cycle"]
    [row] = [n.value for n in ast.walk(log_cycle) if isinstance(n, ast.Assign)
             and isinstance(n.targets[0], ast.Name) and n.targets[0].id == "row"]
    for key, value in zip(row.keys, row.values, strict=True):
        if key is not None:
            keys.update(_constants(key))
            continue
        for comp in ast.walk(value):  # **{k: ... for k in ("by_teacher", "held_back")}
            if isinstance(comp, ast.DictComp):
                for gen in comp.generators:
                    if isinstance(gen.iter, ast.Tuple):
                        keys.update(c for e in gen.iter.elts for c in _constants(e))
    for source in (ROOT / "student/train/modes").glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            extra = None
            if (isinstance(node, ast.keyword) and node.arg == "extra") or (
                    isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id == "extra"):
                extra = node.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "update" and isinstance(node.func.value, ast.Name)
                  and node.func.value.id == "extra"):
                keys.update(k.arg for k in node.keywords if k.arg)
            if isinstance(extra, ast.Dict):
                keys.update(c for k in extra.keys if k is not None for c in _constants(k))
    return keys


def runs_page_lists(page: Path) -> tuple[list[str], list[str]]:
    """The events (first column of the events table) and the metric keys (the metric-rows
    paragraph) of docs/runs.md's "Events and metrics" section."""
    text = page.read_text(encoding="utf-8")
    section = text.split("## Events and metrics", 1)[1].split("\n## ", 1)[0]
    events = [name for row in section.splitlines() if row.startswith("| `")
              for name in re.findall(r"`([a-z_]+)`", row.split(" | ")[0])]
    metrics_text = section.split("Metric rows", 1)[1]
    metrics = [name for name in re.findall(r"`([a-z_]+)`", metrics_text)
               if name not in ("train", "sft_warmup", "name", "instance", "gen", "dpo")]
    return events, ["ts", *metrics]


EVENT_MENTION = re.compile(r"`([a-z]+(?:_[a-z]+)+)` events?\b|\bevents? `([a-z]+(?:_[a-z]+)+)`")


def event_problems(pages: list[Path] | None = None,
                   runs_page: Path = ROOT / "docs/runs.md") -> tuple[list[str], Counter]:
    """The runs page's list is the code's, both ways; every event a page names is emitted."""
    emitted, metrics = emitted_events(), metric_keys()
    problems: list[str] = []
    counts: Counter = Counter()
    listed, listed_metrics = runs_page_lists(runs_page)
    where = _rel(runs_page)
    for name in sorted(set(listed) - emitted):
        problems.append(f"{where}: lists event `{name}`, which the code never emits")
    for name in sorted(emitted - set(listed)):
        problems.append(f"{where}: the code emits event `{name}`, which the list leaves out")
    for name in sorted(set(listed_metrics) - metrics):
        problems.append(f"{where}: lists metric `{name}`, which no metrics row has")
    for name in sorted(metrics - set(listed_metrics)):
        problems.append(f"{where}: metrics rows have `{name}`, which the list leaves out")
    counts["events"] = len(set(listed))
    counts["metric keys"] = len(set(listed_metrics))
    for page in pages or PAGES:
        for number, line, inside in page_lines(page):
            if inside:
                continue
            for match in EVENT_MENTION.finditer(line):
                name = match[1] or match[2]
                counts["event mentions"] += 1
                if name not in emitted:
                    problems.append(f"{_rel(page)}:{number}: names event `{name}`, which the "
                                    "code never emits")
    return problems, counts


# -- tables that mirror the code -----------------------------------------------------------------

def table_flags(page: Path, header: str) -> dict[str, str]:
    """The first table after the line ``header`` on ``page``: each ``--flag`` of a row's
    first cell, mapped to the row."""
    lines = page.read_text(encoding="utf-8").split(header, 1)[1].splitlines()
    rows: dict[str, str] = {}
    started = False
    for line in lines:
        if line.startswith("|"):
            started = True
            for flag in re.findall(r"`(--[a-z][a-z0-9-]*)", line.split(" | ")[0]):
                rows[flag] = line
        elif started:
            break
    return rows


def option_table_problems(up_page: Path = ROOT / "docs/up.md",
                          server_page: Path = ROOT / "docs/teacher-server.md"
                          ) -> tuple[list[str], Counter]:
    """docs/up.md's table holds every option of ``miniverl up``; docs/teacher-server.md's
    every option of ``python -m miniverl.teacher_server``, and marks ``python -m`` only
    exactly those ``miniverl teacher serve`` lacks."""
    root = cli_root()
    problems: list[str] = []
    up_options = options_of(root.commands["up"]) - {"--help"}
    up_rows = table_flags(up_page, "miniverl up recipes/toy_cpu_opd.yaml --output-dir")
    serve = options_of(root.commands["teacher"].commands["serve"]) - {"--help"}
    module = module_parsers()["miniverl.teacher_server"] - {"--help", "-h"}
    server_rows = table_flags(server_page, "takes every option below")
    for what, page, rows, options in (("miniverl up", up_page, up_rows, up_options),
                                      ("python -m miniverl.teacher_server", server_page,
                                       server_rows, module)):
        for flag in sorted(options - set(rows)):
            problems.append(f"{_rel(page)}: the options table leaves out {what} {flag}")
        for flag in sorted(set(rows) - options):
            problems.append(f"{_rel(page)}: the options table lists {flag}, which {what} lacks")
    marked = {flag for flag, row in server_rows.items() if "`python -m` only" in row}
    for flag in sorted(marked ^ (module - serve)):
        problems.append(f"{_rel(server_page)}: {flag} is "
                        f"{'not ' if flag in marked else ''}`python -m` only, the table says "
                        f"{'it is' if flag in marked else 'it is not'}")
    return problems, Counter({"up options": len(up_options), "teacher options": len(module)})


def trainer_signature_problems(page: Path = ROOT / "docs/training.md") -> list[str]:
    """The ``Trainer(...)`` line of docs/training.md is the constructor's signature (read
    from student/train/trainer.py's source: no torch, no import of the trainer)."""
    text = " ".join(page.read_text(encoding="utf-8").split())
    match = re.search(r"`Trainer\((recipe, \*,[^`]*)\)`", text)
    if match is None:
        return [f"{_rel(page)}: no `Trainer(recipe, *, ...)` line"]

    def params(args: ast.arguments) -> list[tuple[str, Any]]:
        return [(a.arg, None) for a in args.args if a.arg != "self"] + [
            (a.arg, None if d is None else ast.literal_eval(d))
            for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]

    shown = params(ast.parse(f"def f({match[1]}): pass").body[0].args)  # type: ignore[attr-defined]
    source = ast.parse((ROOT / "student/train/trainer.py").read_text(encoding="utf-8"))
    [init] = [n for c in source.body if isinstance(c, ast.ClassDef) and c.name == "Trainer"
              for n in c.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    real = params(init.args)
    if shown != real:
        return [f"{_rel(page)}: the Trainer line shows {shown}; the code has {real}"]
    return []


def modes_problems(page: Path = ROOT / "docs/architecture.md") -> list[str]:
    """docs/architecture.md's ``modes/`` list is the files in student/train/modes/."""
    match = re.search(r"`modes/` \(([^:]*):", page.read_text(encoding="utf-8"))
    if match is None:
        return [f"{_rel(page)}: no `modes/` (...) list"]
    shown = set(re.findall(r"`([a-z_]+)`", match[1]))
    real = {p.stem for p in (ROOT / "student/train/modes").glob("*.py")} - {"__init__"}
    if shown != real:
        return [f"{_rel(page)}: the modes list shows {sorted(shown)}; "
                f"student/train/modes/ has {sorted(real)}"]
    return []


def table_script_problems(page: Path = ROOT / "docs/development.md") -> list[str]:
    """Every script a page's table annotation runs is in docs/development.md's list."""
    listed = page.read_text(encoding="utf-8").split("The scripts that print tables this way:",
                                                    1)[1].split("\n\n", 1)[0]
    used = {m for p in PAGES for m in re.findall(r"<!--\s*table:.*? by python (\S+)",
                                                 p.read_text(encoding="utf-8"))}
    return [f"{_rel(page)}: the list of table-printing scripts leaves out {script}"
            for script in sorted(used) if f"`{script}" not in listed]
