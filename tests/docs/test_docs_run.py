"""The README and every page in docs/ work as written: their marked blocks run or check.

A reader copies commands from the pages; a command that fails for them must fail CI
first. Each page (``README.md`` and every ``docs/*.md`` present when the tests are
collected, so a page added later is covered when it lands) gets two tests:

- its markers are complete: every bash, python and yaml block and every command listing
  says how it is checked (``tests/docs/doc_blocks.py`` lists the markers);
- its blocks pass: ``run`` blocks execute in page order in one scratch working copy,
  each within its limit (``doc_runner``); ``check-only`` blocks parse, validate and
  import (``doc_checks``); recipes pass ``miniverl validate``. ``skip`` blocks carry
  their reason in the page. A ``run: needs=MODULE`` block runs only where that optional
  module imports; without it the others still run, then the test skips naming the extra
  (so the README's install alone passes).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.doc_blocks import parse_page
from tests.docs.doc_runner import missing_needs, page_failures

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PAGE_IDS = [page.relative_to(ROOT).as_posix() for page in PAGES]


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_block_is_marked(page):
    problems = parse_page(page).problems
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
@pytest.mark.slow
def test_page_blocks_pass(page, tmp_path):
    failures = page_failures(page, tmp_path)
    assert not failures, "\n\n".join(failures)
    not_run = missing_needs(page)
    if not_run:
        pytest.skip("; ".join(not_run))
