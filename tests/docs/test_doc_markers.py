"""The marker rules of the docs test: a runnable block cannot slip through unmarked.

A page that adds a bash, python or yaml block (or an untagged list of commands) without
saying how it is checked, or with a marker the test cannot honour, must fail, with a
line that names the page, the line and the fix.
"""

from __future__ import annotations

from pathlib import Path

from tests.docs.doc_blocks import DEFAULT_TIMEOUT_S, parse_page


def _page(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "page.md"
    path.write_text(text, encoding="utf-8")
    return path


def _problems(tmp_path: Path, text: str) -> list[str]:
    return parse_page(_page(tmp_path, text)).problems


def test_unmarked_runnable_blocks_are_problems(tmp_path):
    text = "\n".join([
        "# t", "", "```bash", "miniverl --help", "```", "",
        "```python", "print(1)", "```", "",
        "```yaml", "run: {mode: sft}", "```", "",
        "```", "miniverl validate recipes/x.yaml", "```", "",
    ])
    problems = _problems(tmp_path, text)
    assert [p.split(":")[1] for p in problems] == ["3", "7", "11", "15"]
    assert "unmarked ```bash shell block" in problems[0]
    assert "<!-- run -->" in problems[0] and "<!-- skip: REASON -->" in problems[0]
    assert "listing" in problems[3] and "<!-- run -->" not in problems[3]


def test_output_blocks_need_no_marker(tmp_path):
    text = "\n".join([
        "```text", "miniverl up x", "```", "```console", "$ miniverl up x", "```",
        "```json", "{}", "```", "```", "runs/x/", "  manifest.json", "```", "",
    ])
    page = parse_page(_page(tmp_path, text))
    assert page.problems == []
    assert [b.kind for b in page.blocks] == ["output"] * 4


def test_markers_are_read_with_their_options(tmp_path):
    text = "\n".join([
        "<!-- run -->", "```bash", "true", "```",
        '<!-- run: timeout=5 expect="10 passed" expect=ok needs=httpx -->', "```python",
        "print(1)", "```",
        "<!-- check-only: needs a GPU -->", "```bash", "miniverl up x.yaml", "```",
        "<!-- skip: a diagram, not commands -->", "```", "miniverl up x   a box", "```",
        "<!-- recipe -->", "```yaml", "run: {}", "```",
        "- a list item", "  <!-- recipe-fragment: recipes/toy_cpu_opd.yaml -->", "  ```yaml",
        "  loss:", "    top_k: 8", "  ```", "",
    ])
    page = parse_page(_page(tmp_path, text))
    assert page.problems == []
    run, run_opts, check, skip, recipe, fragment = page.blocks
    assert run.marker.kind == "run" and run.marker.timeout_s == DEFAULT_TIMEOUT_S
    assert run_opts.marker.timeout_s == 5 and run_opts.marker.expect == ("10 passed", "ok")
    assert run_opts.marker.needs == ("httpx",) and run.marker.needs == ()
    assert check.marker.reason == "needs a GPU" and skip.kind == "listing"
    assert recipe.marker.kind == "recipe"
    assert fragment.marker.base == "recipes/toy_cpu_opd.yaml"
    assert fragment.text == "loss:\n  top_k: 8"  # the list item's indentation is gone


def test_bad_markers_are_problems(tmp_path):
    cases = {
        "<!-- runn -->": "unknown marker",
        "<!-- skip -->": "needs a reason",
        "<!-- skip: gpu -->": "needs a reason",
        "<!-- check-only: -->": "needs a reason",
        "<!-- run: timeout=600 -->": "a longer block is check-only",
        "<!-- run: timeout=soon -->": "must be a number",
        "<!-- run: quietly -->": "unknown option",
        "<!-- run: needs=numpy -->": "is not an optional module",
        "<!-- recipe: recipes/x.yaml -->": "takes nothing",
        "<!-- recipe-fragment -->": "needs the base recipe's path",
        "<!-- TODO check this -->": "unknown marker",
    }
    for marker, message in cases.items():
        problems = _problems(tmp_path, f"{marker}\n```bash\ntrue\n```\n")
        assert len(problems) == 1 and message in problems[0], (marker, problems)


def test_a_marker_must_fit_its_block(tmp_path):
    wrong_kind = _problems(tmp_path, "<!-- recipe -->\n```bash\ntrue\n```\n")
    assert "does not apply to a shell block" in wrong_kind[0]
    listing_run = _problems(tmp_path, "<!-- run -->\n```\nminiverl --help\n```\n")
    assert "does not apply to a listing block" in listing_run[0]
    on_output = _problems(tmp_path, "<!-- run -->\n```text\nhello\n```\n")
    assert "is output and is never checked" in on_output[0]


def test_a_marker_away_from_a_fence_is_a_problem(tmp_path):
    text = "<!-- run -->\n\n```bash\ntrue\n```\n"  # a blank line between: marks nothing
    problems = _problems(tmp_path, text)
    assert any("not on the line right above a fence" in p for p in problems)
    assert any("unmarked ```bash" in p for p in problems)


def test_an_unclosed_fence_is_a_problem(tmp_path):
    problems = _problems(tmp_path, "<!-- run -->\n```bash\ntrue\n")
    assert problems == ["page.md:2: the fence is never closed"]
