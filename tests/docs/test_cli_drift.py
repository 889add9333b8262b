"""The prose of README.md and docs/ says what the code has (``tests/docs/drift.py``).

A reader types the commands and flags a sentence shows, writes the recipe fields it
names and greps events.jsonl for the events it lists; none of those sits in a checked
block, so each is held to the code here: the CLI (typer app, ``--help``), the recipe
schema (pydantic), the events and metrics the code writes, and the tables that mirror
the code (``up``'s options, the teacher server's options, the ``Trainer`` signature, the
training modes, the table-printing scripts). The synthetic pages show each check fails.
"""

from __future__ import annotations

import pytest

from tests.docs import drift


def _fail(problems):
    assert not problems, "\n".join(problems)


def test_every_command_and_flag_a_page_shows_is_the_clis():
    problems, counts = drift.command_problems()
    _fail(problems)
    # Every page together names these many (so a parser that found none cannot pass).
    assert counts["commands"] >= 25 and counts["flags"] >= 60, counts


def test_every_recipe_field_a_page_names_is_in_the_schema():
    problems, counts = drift.field_problems()
    _fail(problems)
    assert counts["fields"] >= 80, counts


def test_the_one_event_and_metric_list_is_the_codes_and_every_named_event_is_emitted():
    problems, counts = drift.event_problems()
    _fail(problems)
    assert counts["events"] >= 25 and counts["metric keys"] >= 30, counts


def test_tables_that_mirror_the_code():
    problems, _ = drift.option_table_problems()
    _fail(problems + drift.trainer_signature_problems() + drift.modes_problems()
          + drift.table_script_problems())


def test_training_md_links_to_the_one_list_instead_of_keeping_its_own():
    text = (drift.ROOT / "docs/training.md").read_text(encoding="utf-8")
    section = text.split("## Metrics and events", 1)[1].split("\n## ", 1)[0]
    assert "runs.md#events-and-metrics" in section
    assert "`run_started`" not in section and "`time_update_s`" not in section


@pytest.fixture
def page(tmp_path):
    def write(text):
        path = tmp_path / "synthetic.md"
        path.write_text(text, encoding="utf-8")
        return path
    return write


def test_a_page_naming_a_flag_the_cli_lacks_fails(page):
    problems, _ = drift.command_problems([page(
        "Start it with `miniverl up recipes/toy_cpu_opd.yaml --teacher-count 2`.\n\n"
        "<!-- check-only: synthetic -->\n```bash\nminiverl train recipe.yaml --no-such-flag\n```\n"
    )])
    assert problems == [
        "synthetic.md:1: `miniverl up` has no option --teacher-count (its options: "
        + ", ".join(sorted(drift.options_of(drift.cli_root().commands["up"]))) + ")",
        "synthetic.md:5: `miniverl train` has no option --no-such-flag (its options: "
        + ", ".join(sorted(drift.options_of(drift.cli_root().commands["train"]))) + ")",
    ]


def test_a_page_naming_a_command_the_cli_lacks_fails(page):
    problems, _ = drift.command_problems([page(
        "Measure it with `miniverl qualify RECIPE`, or `python -m miniverl.teacher_server "
        "--model DIR --gpu 1`.\n")])
    assert len(problems) == 2
    assert problems[0].startswith("synthetic.md:1: `miniverl qualify`: the CLI has no such command")
    assert "`python -m miniverl.teacher_server` has no option --gpu" in problems[1]


def test_flags_the_cli_has_pass(page):
    problems, counts = drift.command_problems([page(
        "`miniverl up RECIPE --teacher ENDPOINT --quiet`, `miniverl teacher serve --model DIR`,"
        " `miniverl --version` and `python -m miniverl.teacher_server --wait-for-model 30`.\n")])
    assert problems == [] and counts["flag mentions"] == 5


def test_a_page_naming_a_field_the_schema_lacks_fails(page):
    problems, _ = drift.field_problems([page(
        "Set `teacher.tokenizer: other`, `teachers.NAME.min_success`, "
        "`environments[].weight`, `environment.params.chain` and `train.warmup_tokens`.\n")])
    assert problems == ["synthetic.md:1: `train.warmup_tokens` is not a recipe field "
                        "(common/recipe*.py)"]


def test_a_page_naming_an_event_the_code_never_emits_fails(page, tmp_path):
    runs = (drift.ROOT / "docs/runs.md").read_text(encoding="utf-8")
    edited = page(runs.replace("| `warmup_threads` |", "| `warmup_cores` |"))
    problems, _ = drift.event_problems(
        [tmp_path / "x.md"] if (tmp_path / "x.md").write_text(
            "Watch for the `teacher_woke` event.\n", encoding="utf-8") else [],
        runs_page=edited)
    assert "synthetic.md: lists event `warmup_cores`, which the code never emits" in problems
    assert ("synthetic.md: the code emits event `warmup_threads`, which the list leaves out"
            in problems)
    assert "x.md:1: names event `teacher_woke`, which the code never emits" in problems


def test_an_options_table_that_leaves_out_an_option_fails(page):
    up = (drift.ROOT / "docs/up.md").read_text(encoding="utf-8")
    row = next(line for line in up.splitlines() if line.startswith("| `--logger NAME`"))
    problems, _ = drift.option_table_problems(up_page=page(up.replace(row + "\n", "")))
    assert problems == ["synthetic.md: the options table leaves out miniverl up --logger"]


def test_a_trainer_line_that_leaves_out_an_argument_fails(page):
    text = (drift.ROOT / "docs/training.md").read_text(encoding="utf-8")
    assert "recipe_text=None, " in text
    [problem] = drift.trainer_signature_problems(page(text.replace("recipe_text=None, ", "")))
    assert "the Trainer line shows" in problem and "'recipe_text'" in problem
