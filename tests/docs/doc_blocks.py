"""Find the code blocks of a Markdown page and the marker that says how each is checked.

A marker is an HTML comment on the line right above a fence, so a reader of the page
source sees how the block is checked, and a rendered page hides it:

    <!-- run -->                           run it (bash or python), 30 s limit
    <!-- run: timeout=20 expect="10 passed" -->   options: limit (s), text the output shows
    <!-- run: needs=httpx -->               runs where that optional module imports, else
                                            the page's test skips naming its extra
    <!-- check-only: needs a GPU -->        commands and options parse, recipes validate,
                                            Python compiles and its imports resolve
    <!-- skip: why -->                      not checked at all (the reason is required)
    <!-- recipe -->                        a whole recipe: `miniverl validate` must pass
    <!-- recipe-fragment: recipes/x.yaml --> merged into that recipe, then validated

Which blocks need one: ``bash``/``sh``/``shell``, ``python`` and ``yaml`` blocks, and an
untagged block whose lines are commands (``miniverl ...``, ``python ...``): a *listing*,
which may be checked but not run. Everything else (``text``, ``console``, ``json``,
untagged trees and diagrams) is output and never checked. An unmarked block that needs
a marker, an unknown marker, a marker without its reason or a marker that is not right
above a fence is a problem: new pages cannot slip through unchecked.

This module only reads pages; ``doc_checks`` checks blocks and ``doc_runner`` runs them.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tests.extras import OPTIONAL

SHELL_LANGS = frozenset({"bash", "sh", "shell", "zsh"})
PYTHON_LANGS = frozenset({"python", "py", "python3"})
YAML_LANGS = frozenset({"yaml", "yml"})
# The first word of a line that makes an untagged block a command listing.
LISTING_WORDS = frozenset({"miniverl", "python", "python3", "pip", "pytest", "bash", "sh", "cd"})

# Which markers each kind of block accepts.
ALLOWED = {
    "shell": ("run", "check-only", "skip"),
    "python": ("run", "check-only", "skip"),
    "yaml": ("recipe", "recipe-fragment", "check-only", "skip"),
    "listing": ("check-only", "skip"),
}
KINDS_WITH_REASON = ("check-only", "skip")
MIN_REASON_CHARS = 8
DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 60.0

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*?)[ \t]*$")
COMMENT = re.compile(r"^[ \t]*<!--(?P<body>.*?)-->[ \t]*$")
MARKER = re.compile(r"^(?P<kind>[a-z][a-z-]*)[ \t]*(?::(?P<rest>.*))?$", re.S)
MARKER_WORDS = ("run", "check-only", "skip", "recipe", "recipe-fragment")


@dataclass(frozen=True)
class Marker:
    """How one block is checked: ``kind`` plus its reason or options."""

    kind: str
    reason: str = ""
    timeout_s: float = DEFAULT_TIMEOUT_S
    expect: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()  # run: optional modules (tests/extras.OPTIONAL) it imports
    base: str = ""  # recipe-fragment: the recipe the block is merged into


@dataclass(frozen=True)
class Block:
    """One fenced block of a page; ``line`` is the fence's 1-based line number."""

    page: Path
    line: int
    lang: str
    kind: str  # shell | python | yaml | listing | output
    text: str
    marker: Marker | None = None

    @property
    def where(self) -> str:
        return f"{self.page.name}:{self.line}"


@dataclass
class Page:
    """The blocks of one page and what is wrong with its markers."""

    path: Path
    blocks: list[Block] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def block_kind(lang: str, text: str) -> str:
    """``shell``, ``python``, ``yaml``, ``listing`` (untagged commands) or ``output``."""
    lang = lang.lower()
    if lang in SHELL_LANGS:
        return "shell"
    if lang in PYTHON_LANGS:
        return "python"
    if lang in YAML_LANGS:
        return "yaml"
    if not lang and any(_first_word(line) in LISTING_WORDS for line in text.splitlines()):
        return "listing"
    return "output"


def _first_word(line: str) -> str:
    """The command word of a shell line: after a ``$ `` prompt and ``VAR=value`` pairs."""
    words = line.strip().removeprefix("$ ").split()
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words.pop(0)
    return words[0] if words else ""


def parse_marker(body: str) -> tuple[Marker | None, str | None]:
    """The marker in an HTML comment's ``body``, or ``(None, problem)``."""
    match = MARKER.match(body.strip())
    if not match or match["kind"] not in MARKER_WORDS:
        return None, (
            f"unknown marker <!--{body}-->; use one of "
            + ", ".join(f"<!-- {word} -->" for word in MARKER_WORDS)
        )
    kind, rest = match["kind"], (match["rest"] or "").strip()
    if kind in KINDS_WITH_REASON:
        if len(rest) < MIN_REASON_CHARS:
            return None, f"<!-- {kind}: ... --> needs a reason a reader understands, got {rest!r}"
        return Marker(kind, reason=rest), None
    if kind == "recipe":
        if rest:
            return (
                None,
                "<!-- recipe --> takes nothing (a fragment is "
                f"<!-- recipe-fragment: BASE -->), got {rest!r}",
            )
        return Marker(kind), None
    if kind == "recipe-fragment":
        if not re.fullmatch(r"[\w./-]+\.ya?ml", rest):
            return (
                None,
                f"<!-- recipe-fragment: BASE --> needs the base recipe's path, got {rest!r}",
            )
        return Marker(kind, base=rest), None
    return _run_marker(rest)


def _run_marker(rest: str) -> tuple[Marker | None, str | None]:
    """``run`` with optional ``timeout=S`` (at most 60), ``expect=TEXT`` and ``needs=MODULE``
    (both repeatable)."""
    timeout, expect, needs = DEFAULT_TIMEOUT_S, [], []
    try:
        words = shlex.split(rest)
    except ValueError as exc:
        return None, f"<!-- run: {rest} -->: {exc}"
    for word in words:
        key, _, value = word.partition("=")
        if key == "timeout":
            try:
                timeout = float(value)
            except ValueError:
                timeout = -1.0
            if not 0 < timeout <= MAX_TIMEOUT_S:
                return None, (
                    f"<!-- run: {rest} -->: timeout {value!r} must be a number of seconds in "
                    f"(0, {MAX_TIMEOUT_S:g}]; a longer block is check-only"
                )
        elif key == "expect" and value:
            expect.append(value)
        elif key == "needs" and value in OPTIONAL:
            needs.append(value)
        elif key == "needs":
            return None, (f"<!-- run: {rest} -->: needs={value} is not an optional module; "
                          f"use one of {', '.join(OPTIONAL)} (tests/extras.py)")
        else:
            return (
                None,
                f"<!-- run: {rest} -->: unknown option {word!r}; use timeout=S, expect=TEXT "
                "or needs=MODULE",
            )
    return Marker("run", timeout_s=timeout, expect=tuple(expect), needs=tuple(needs)), None


def parse_page(path: Path) -> Page:
    """Every fenced block of ``path`` with its marker, and every marker problem."""
    page = Page(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            _stray_marker(page, lines, i)
            i += 1
            continue
        close = re.compile(
            rf"^[ \t]*{re.escape(fence['fence'][0])}{{{len(fence['fence'])},}}[ \t]*$"
        )
        end = i + 1
        while end < len(lines) and not close.match(lines[end]):
            end += 1
        if end == len(lines):
            page.problems.append(f"{path.name}:{i + 1}: the fence is never closed")
        indent = len(fence["indent"])
        # A fence indented in a list item: its lines lose that indentation, no more.
        text = "\n".join(
            line[indent:] if not line[:indent].strip() else line.lstrip()
            for line in lines[i + 1 : end]
        )
        lang = (fence["info"].split() or [""])[0]
        page.blocks.append(_block(page, lines, i, lang, text))
        i = end + 1
    return page


def _block(page: Page, lines: list[str], i: int, lang: str, text: str) -> Block:
    """The block whose fence is ``lines[i]``, with the marker on the line above it."""
    kind = block_kind(lang, text)
    where = f"{page.path.name}:{i + 1}"
    comment = COMMENT.match(lines[i - 1]) if i > 0 else None
    marker = None
    if comment:
        marker, problem = parse_marker(comment["body"])
        if problem:
            page.problems.append(f"{where}: {problem}")
    if marker is not None and kind == "output":
        page.problems.append(
            f"{where}: a ```{lang or ''} block is output and is never checked; remove the "
            f"marker <!-- {marker.kind} --> or tag the block bash, python or yaml"
        )
        marker = None
    elif marker is not None and marker.kind not in ALLOWED[kind]:
        page.problems.append(
            f"{where}: <!-- {marker.kind} --> does not apply to a {kind} block; use one of "
            + ", ".join(ALLOWED[kind])
        )
        marker = None
    elif marker is None and kind != "output" and not comment:
        page.problems.append(
            f"{where}: unmarked ```{lang} {kind} block; put one of "
            + ", ".join(
                f"<!-- {k}{': REASON' if k in KINDS_WITH_REASON else ''} -->" for k in ALLOWED[kind]
            )
            + " on the line right above the fence (see tests/docs/doc_blocks.py)"
        )
    return Block(page.path, i + 1, lang, kind, text, marker)


def _stray_marker(page: Page, lines: list[str], i: int) -> None:
    """A marker comment that is not right above a fence does nothing: say so."""
    comment = COMMENT.match(lines[i])
    if not comment:
        return
    word = MARKER.match(comment["body"].strip())
    next_is_fence = i + 1 < len(lines) and FENCE.match(lines[i + 1])
    if word and word["kind"] in MARKER_WORDS and not next_is_fence:
        page.problems.append(
            f"{page.path.name}:{i + 1}: marker <!--{comment['body']}--> is not on the line "
            "right above a fence, so it marks nothing; move it there"
        )


def main() -> None:
    """``python -m tests.docs.doc_blocks [PAGE...]``: marker problems and counts per page."""
    root = Path(__file__).resolve().parents[2]
    paths = [Path(p) for p in sys.argv[1:]] or [
        root / "README.md",
        *sorted((root / "docs").glob("*.md")),
    ]
    total: Counter[str] = Counter()
    for path in paths:
        page = parse_page(path)
        counts = Counter(
            b.marker.kind if b.marker else "unmarked" for b in page.blocks if b.kind != "output"
        )
        total.update(counts)
        print(f"{path.name}: " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))
        for problem in page.problems:
            print(f"  {problem}")
    print("total: " + ", ".join(f"{k} {n}" for k, n in sorted(total.items())))


if __name__ == "__main__":
    main()
