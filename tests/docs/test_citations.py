"""What the code and the pages cite is in the repository, and is where they say.

A clone has only this repository, so a comment that points elsewhere (a design or style
file that lived beside an earlier checkout) sends its reader nowhere. Three checks:

- no file of the package, the tests, the benchmarks, the examples or the recipes cites a
  ``DESIGN``/``STYLE`` file or a path above the repository;
- every ``docs/PAGE.md`` those files name exists, and a section they name after it in
  quotes (``docs/protocol.md, "Staleness rule"``) is a heading of that page;
- every relative link of README.md and docs/*.md reaches a file, and an ``#anchor`` on
  an ``.md`` target is one of its headings (a renamed page or section breaks here, not
  for a reader).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("common", "protocol", "teacher_server", "student", "bridge", "cli", "testing",
           "tests", "benchmarks", "examples", "recipes")
SUFFIXES = (".py", ".yaml", ".yml", ".sh", ".md", ".toml")
# Built from parts so this file does not match itself.
OUTSIDE = re.compile(r"\b" + "DESIGN" + r"\b|\b" + "STYLE" + r"\b|\.\./" + "shared/")
CITATION = re.compile(r"docs/([\w.-]+\.md)(?:#([\w-]+))?(?:,?\s*\(?\"([^\"]+)\")?")
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def sources(root: Path = ROOT) -> list[Path]:
    return [
        f
        for folder in FOLDERS
        for f in sorted((root / folder).rglob("*"))
        if f.suffix in SUFFIXES and f.is_file() and f != Path(__file__).resolve()
    ]


def joined(text: str) -> str:
    """The text with line breaks (and the comment marks that continue a line) as spaces,
    so a citation wrapped over two comment lines reads as one."""
    return re.sub(r"\n\s*(?:#|\*)?\s*", " ", text)


def headings(page: Path) -> list[str]:
    """The page's headings as text (backticks and emphasis dropped, code blocks skipped)."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return [re.sub(r"[`*]", "", line.lstrip("#").strip())
            for line in text.splitlines() if line.startswith("#")]


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def outside_citations(files: list[Path], root: Path = ROOT) -> list[str]:
    return [
        f"{f.relative_to(root)}:{n}: {line.strip()}"
        for f in files
        for n, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]


def broken_citations(files: list[Path], root: Path = ROOT) -> list[str]:
    bad = []
    for f in files:
        for m in CITATION.finditer(joined(f.read_text(encoding="utf-8", errors="replace"))):
            page = root / "docs" / m[1]
            where = f"{f.relative_to(root)} cites docs/{m[1]}"
            if not page.is_file():
                bad.append(f"{where}: no such page")
                continue
            names = headings(page)
            if m[2] and m[2] not in {anchor(h) for h in names}:
                bad.append(f"{where}#{m[2]}: no such heading")
            # A quoted name that starts in upper case names a section ("Staleness rule");
            # a lower-case quote is a phrase of the sentence, not a section.
            if m[3] and m[3][0].isupper() and not any(m[3] in h for h in names):
                bad.append(f"{where}, {m[3]!r}: no heading of that page holds it")
    return bad


def broken_links(pages: list[Path], root: Path = ROOT) -> list[str]:
    bad = []
    for page in pages:
        for m in LINK.finditer(FENCE.sub("", page.read_text(encoding="utf-8"))):
            target = m[1]
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, frag = target.partition("#")
            dest = (page.parent / path) if path else page
            where = f"{page.relative_to(root)} links {target}"
            if not dest.exists():
                bad.append(f"{where}: no such file")
            elif frag and dest.suffix == ".md" and frag not in {anchor(h) for h in headings(dest)}:
                bad.append(f"{where}: no such heading")
    return bad


def test_nothing_cites_a_file_outside_the_repository():
    bad = outside_citations(sources())
    assert not bad, "cite a page of docs/ instead (docs/design.md holds the design):\n" + \
        "\n".join(bad)


def test_every_cited_page_and_section_exists():
    bad = broken_citations(sources())
    assert not bad, "\n".join(bad)


def test_every_link_between_pages_resolves():
    bad = broken_links([ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    assert not bad, "\n".join(bad)


def test_the_checks_find_what_they_are_for(tmp_path):
    # Guards the checkers: each kind of broken reference is reported.
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Staleness rule\n\n[b](b.md) [s](#nope)\n")
    code = tmp_path / "x.py"
    code.write_text("# see DESIGN §3\n"
                    "# docs/a.md, \"Staleness\n# rule\" and docs/a.md, \"Framing\"\n"
                    "# docs/gone.md and docs/a.md#staleness-rule and docs/a.md#framing\n")
    assert len(outside_citations([code], tmp_path)) == 1
    bad = broken_citations([code], tmp_path)
    assert [b.split(": ", 1)[1] for b in bad] == [
        "no heading of that page holds it", "no such page", "no such heading"]
    assert [b.split(": ", 1)[1] for b in broken_links([tmp_path / "docs" / "a.md"], tmp_path)] \
        == ["no such file", "no such heading"]
