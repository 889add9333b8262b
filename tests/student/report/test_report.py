"""The run report: built from hand-made run directories, complete, partial and corrupted."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from miniverl.common.errors import MiniverlError
from miniverl.common.hashing import seal
from miniverl.student.report.build import build_report
from miniverl.student.report.load import load_run
from miniverl.student.report.markdown import render_markdown
from tests.student.report.report_runs import make_run, toy_sft_recipe

# Anything that would make the browser fetch something: src/href/action to a URL or a
# protocol-relative one, CSS url() and @import, <link>, <script src>, <iframe>, <img>.
EXTERNAL = [
    re.compile(
        r"""(?:src|href|action|poster|data)\s*=\s*["']?\s*(?:[a-z][a-z0-9+.-]*:)?//""", re.I
    ),
    re.compile(r"url\(", re.I),
    re.compile(r"@import", re.I),
    re.compile(r"<link\b", re.I),
    re.compile(r"<script\b[^>]*\bsrc\b", re.I),
    re.compile(r"<(?:iframe|img|object|embed)\b", re.I),
    re.compile(r"https?://", re.I),
]


def external_refs(html: str) -> list[str]:
    return [m.group(0) for pattern in EXTERNAL for m in pattern.finditer(html)]


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return make_run(tmp_path / "toy-opd-0001")


def test_complete_run_has_every_section(run: Path, tmp_path: Path) -> None:
    # A user reads mode, on-policy status, success before -> after and the teachers at a glance.
    md = tmp_path / "summary.md"
    out = build_report(run, markdown=md)
    assert out == run / "report.html"
    html = out.read_text(encoding="utf-8")
    for heading in (
        "Summary",
        "Learning curves",
        "Where the time went",
        "Token provenance",
        "Teacher timeline",
        "Per-token divergence",
        "Stop reasons and verifier failures",
        "Resolved recipe",
    ):
        assert f"<h2>{heading}</h2>" in html
    assert html.count("<svg") >= 6 and "<polyline" in html
    assert "5.0% (v0, n=20) → 45.0% (v12, n=20)" in html
    assert "yes (every update trained on its own version" in html
    assert "reload: toy-teacher" in html and "restart: toy-teacher" in html
    assert "Missing or unreadable inputs" not in html
    text = md.read_text(encoding="utf-8")
    assert "| mode | opd |" in text and "## Token provenance" in text


def test_report_is_self_contained(run: Path) -> None:
    # The page must open offline and never phone home.
    html = build_report(run).read_text(encoding="utf-8")
    assert external_refs(html) == []
    assert "<script" not in html


def test_token_text_comes_from_the_recorded_tokenizer(run: Path) -> None:
    html = build_report(run).read_text(encoding="utf-8")
    data = load_run(run)
    assert data.token_text_note.startswith("token text decoded")
    assert ">c</span>" in html  # characters, not ids
    # Without a tokenizer the strip falls back to ids and says so.
    manifest = json.loads((run / "manifest.json").read_text())
    del manifest["tokenizer_dir"]
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert "shown as ids" in load_run(run).token_text_note


def test_strip_without_targets_cache_says_why(run: Path) -> None:
    data = load_run(run)
    assert data.targets == {}
    assert "span colours only" in data.targets_note
    assert len(data.strip) == 4


def test_values_from_files_are_escaped(run: Path) -> None:
    # A verifier reason or recipe comment is data, never markup.
    payload = "<script>alert(1)</script>"
    with (run / "recipe.resolved.yaml").open("a") as fh:
        fh.write(f"# {payload}\n")
    rows = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    rows[0]["verifier"] = {"success": False, "score": 0.0, "reason": payload}
    rows[0] = seal(rows[0])  # as a run would have written it
    (run / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    html = build_report(run).read_text(encoding="utf-8")
    assert payload not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


@pytest.mark.parametrize(
    "missing, mentioned",
    [
        ("metrics.jsonl", "metrics.jsonl is missing"),
        ("events.jsonl", "events.jsonl is missing"),
        ("manifest.json", "manifest.json is missing"),
        ("status.json", "status.json is missing"),
        ("trajectories.jsonl", "trajectories.jsonl is missing"),
        ("recipe.resolved.yaml", "recipe.resolved.yaml is missing"),
    ],
)
def test_missing_file_is_reported_not_fatal(run: Path, missing: str, mentioned: str) -> None:
    (run / missing).unlink()
    html = build_report(run).read_text(encoding="utf-8")
    assert "Missing or unreadable inputs" in html
    assert mentioned in html
    assert "<h2>Summary</h2>" in html


def test_empty_run_dir_still_renders(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    html = build_report(empty).read_text(encoding="utf-8")
    data = load_run(empty)
    assert len(data.problems) >= 7
    assert "no loss recorded" in html and external_refs(html) == []
    assert "Run report: empty" in render_markdown(data)


def test_corrupted_lines_are_skipped_and_counted(run: Path) -> None:
    # A crash mid-write leaves a torn last line; a hand edit breaks a mask. Neither stops the report.
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 99, "loss": 1.0\n[1, 2]\n')
    lines = (run / "trajectories.jsonl").read_text().splitlines()
    bad_mask = json.loads(lines[1])
    bad_mask["loss_mask"] = "1" * len(bad_mask["tokens"])
    lines[1] = json.dumps(seal(bad_mask))
    lines.insert(3, "not json at all")
    (run / "trajectories.jsonl").write_text("\n".join(lines) + "\n")
    (run / "eval" / "broken.json").write_text("{")
    (run / "status.json").write_text("\x00\x01garbage")
    data = load_run(run)
    text = "\n".join(data.problems)
    assert "metrics.jsonl: 2 corrupted line(s) skipped (line 13, 14)" in text
    assert "trajectories.jsonl: 2 bad line(s) skipped (line 2, 4)" in text
    assert "does not match the mask" in text
    assert "eval/broken.json is not valid JSON" in text
    assert "status.json is not valid JSON" in text
    assert data.steps == 12 and data.n_trajectories == 15
    html = build_report(run).read_text(encoding="utf-8")
    assert "<polyline" in html


def test_wrong_shapes_do_not_crash(run: Path) -> None:
    # Valid JSON of the wrong shape (strings where numbers go, lists where dicts go).
    (run / "metrics.jsonl").write_text(
        '{"step": "x", "loss": "high", "teacher": [1], "time_rollout_s": null}\n{"version": 3}\n'
    )
    (run / "events.jsonl").write_text(
        '{"event": "teacher_changed", "old": 5, "new": null}\n"str"\n'
    )
    (run / "manifest.json").write_text("[1, 2]")
    (run / "recipe.resolved.yaml").write_text("run: [unclosed\n")
    html = build_report(run).read_text(encoding="utf-8")
    assert "manifest.json is not a JSON object" in html
    assert "recipe is not valid YAML" in html


def test_unreadable_tokenizer_falls_back_to_ids(run: Path) -> None:
    tok = Path(json.loads((run / "manifest.json").read_text())["tokenizer_dir"])
    (tok / "tokenizer.json").write_text("{not a tokenizer")
    data = load_run(run)
    assert "ids shown" in data.token_text_note
    assert "#" in build_report(run).read_text(encoding="utf-8")


def test_missing_run_dir_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(MiniverlError, match="does not exist"):
        build_report(tmp_path / "nope")


def test_out_and_markdown_paths(run: Path, tmp_path: Path) -> None:
    out = build_report(run, out=tmp_path / "a" / "r.html", markdown=tmp_path / "b" / "r.md")
    assert out.is_file() and (tmp_path / "b" / "r.md").is_file()
    # Without eval/ the success curve still comes from the eval events.
    shutil.rmtree(run / "eval")
    assert [e["version"] for e in load_run(run).evals] == [0, 6, 12]


@pytest.mark.slow
def test_report_from_a_real_toy_sft_run(tmp_path: Path) -> None:
    # The trainer writes report.html at the end of a real run; nothing in it is missing.
    pytest.importorskip("torch")
    from miniverl.common.recipe import Recipe
    from miniverl.student.train.trainer import Trainer

    recipe = Recipe.model_validate(toy_sft_recipe(tmp_path / "runs"))
    with Trainer(recipe, show_progress=False) as trainer:
        result = trainer.train()
    run = Path(result.run_dir)
    html = (run / "report.html").read_text(encoding="utf-8")
    data = load_run(run)
    assert data.mode == "sft" and data.steps >= 2
    # SFT logs no rollouts: the only note is that eval trajectories stand in for them.
    assert len(data.problems) == 1 and "show eval/" in data.problems[0], data.problems
    assert data.n_trajectories > 0
    assert html.count("<svg") >= 5 and external_refs(html) == []
    assert data.token_text_note.startswith("token text decoded")


def test_a_row_holding_a_line_separator_character_is_one_row(tmp_path):
    # json.dumps(ensure_ascii=False) leaves U+2028 raw inside a string: one row still.
    from miniverl.student.report.data import ReportData
    from miniverl.student.report.load import _read_jsonl

    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps({"event": "x", "text": "a\u2028b"}, ensure_ascii=False)
                    + "\n" + json.dumps({"event": "y"}) + "\n", encoding="utf-8")
    data = ReportData(run_dir=tmp_path)
    rows = _read_jsonl(path, data, "the events")
    assert [r["event"] for r in rows] == ["x", "y"] and data.problems == []
