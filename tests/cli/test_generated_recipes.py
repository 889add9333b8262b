"""Generated recipes through `miniverl validate`: a verdict, never a traceback, and nothing
touched outside the test's own folder (issue 53).

What a user relies on (docs/recipes.md, "Names", "Paths"): `validate` reads a recipe and
answers, whatever the recipe holds: several teachers, mixtures, adapters, routes, and
hostile strings (``../../../../etc``, ``a=b``, ``/``, NUL, 1,000 characters, ``~``) in
every name and path field. It never raises, and it creates or changes no file or folder:
the sandbox the recipes point into, the current directory and the machine's temporary
folder are the same before and after.

CI runs ``RECIPE_EXAMPLES`` examples (default 40); the issue's figure was measured with
``RECIPE_EXAMPLES=5000 pytest -q -n0 tests/cli/test_generated_recipes.py``.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from miniverl.cli.app import app

EXAMPLES = int(os.environ.get("RECIPE_EXAMPLES", "40"))
HOSTILE = ["../../../../etc", "../../../../s", "a=b", "a/b", "/", "/tmp", "~", "~/x", ".", "..",
           "", " ", "x" * 1000, "a\x00b", "calc\n", "-x", ".hidden", "ad/x", "ad", "afile",
           "tcp://127.0.0.1:1", "C:\\x", "\u00e9t\u00e9", "$HOME", "%s", "{x}", "*"]
PLAIN = ["calc", "nav", "x", "y", "t.1", "A-b_c"]
HOSTILE_TEXT = st.sampled_from(HOSTILE) | st.text(max_size=20)
GOOD_PATHS = ["ad/x", "ad/y"]
TOY = {"toy": {}}


def sometimes_hostile(draw, good):
    """Mostly a value from ``good`` (so some recipes are valid), one time in five a
    hostile string."""
    return draw(HOSTILE_TEXT) if draw(st.integers(0, 4)) == 0 else draw(good)


@st.composite
def teacher_sections(draw, adapter_names):
    model = TOY if draw(st.integers(0, 3)) else {"path": sometimes_hostile(
        draw, st.sampled_from(["model", "missing"]))}
    section: dict = {"model": model, "device": "cpu"}
    if adapter_names:
        section["adapters"] = {name: sometimes_hostile(draw, st.sampled_from(GOOD_PATHS))
                               for name in adapter_names}
    elif draw(st.integers(0, 3)) == 0:
        section["adapter"] = sometimes_hostile(draw, st.sampled_from(GOOD_PATHS))
    if draw(st.integers(0, 3)) == 0:
        section["prepare"] = sometimes_hostile(draw, st.just("prep.yaml"))
    if draw(st.integers(0, 5)) == 0:
        section["endpoint"] = draw(st.sampled_from(["tcp://127.0.0.1:5555", "ipc:///tmp/x.sock",
                                                    "http://127.0.0.1:8000"]))
    return section


@st.composite
def recipes(draw):
    plain = st.sampled_from(PLAIN)
    teacher_names = list(dict.fromkeys(sometimes_hostile(draw, plain)
                                       for _ in range(draw(st.integers(0, 3)))))
    adapters = {name: list(dict.fromkeys(sometimes_hostile(draw, plain)
                                         for _ in range(draw(st.integers(0, 2)))))
                for name in teacher_names}
    teachers = {name: draw(teacher_sections(adapters[name])) for name in teacher_names}
    environments = []
    for env in draw(st.lists(st.sampled_from(["calculator", "jsonnav", "sqlite"]), min_size=1,
                             max_size=3, unique=True)):
        member: dict = {"name": env if draw(st.integers(0, 9)) else "nope",
                        "weight": draw(st.sampled_from([1, 0.5, 0]))}
        if teacher_names and len(teacher_names) > 1 or draw(st.integers(0, 4)) == 0:
            member["teacher"] = sometimes_hostile(draw, st.sampled_from(teacher_names or PLAIN))
        served = adapters.get(member.get("teacher") or (teacher_names or [""])[0]) or []
        if served or draw(st.integers(0, 4)) == 0:
            member["adapter"] = sometimes_hostile(draw, st.sampled_from(served or PLAIN))
        environments.append(member)
    recipe: dict = {"schema_version": 1,
                    "run": {"name": "gen", "mode": draw(st.sampled_from(["opd", "opd", "sft"])),
                            "output_dir": sometimes_hostile(draw, st.just("runs"))},
                    "student": {"model": TOY if draw(st.integers(0, 3)) else {
                        "path": sometimes_hostile(draw, st.just("model"))},
                                "device": "cpu", "dtype": "float32"}}
    if len(teachers) == 1 and draw(st.booleans()):
        recipe["teacher"] = next(iter(teachers.values()))
        for member in environments:
            member.pop("teacher", None)
    elif teachers:
        recipe["teachers"] = teachers
    if len(environments) > 1 or draw(st.booleans()):
        recipe["environments"] = environments
    else:
        recipe["environment"] = {"name": environments[0]["name"]}
    return recipe


def snapshot(*roots: Path, deep: bool) -> dict[str, tuple]:
    """Every entry under ``roots`` (or only their own entries), with mode, size and
    modification time."""
    found = {}
    for root in roots:
        entries = ([Path(w) / n for w, dirs, files in os.walk(root) for n in (*dirs, *files)]
                   if deep else list(root.iterdir()))
        for path in (root, *entries):
            try:
                st_ = os.lstat(path)
            except FileNotFoundError:  # gone while listed (another process's file)
                continue
            found[str(path)] = (stat.S_IMODE(st_.st_mode), st_.st_size, st_.st_mtime_ns)
    return found


@pytest.mark.slow  # seconds at 40 examples; minutes at 5,000
def test_validate_gives_a_verdict_and_touches_nothing(tmp_path, monkeypatch):
    sandbox = tmp_path / "sandbox" / "a" / "b" / "c" / "d"  # room for ../../../..
    for name in ("x", "y"):
        (sandbox / "ad" / name).mkdir(parents=True)
        (sandbox / "ad" / name / "adapter_config.json").write_text("{}")
    (sandbox / "afile").write_text("a file")
    (sandbox / "prep.yaml").write_text("schema_version: 1\n")
    (sandbox / "model").mkdir()
    (sandbox / "model" / "config.json").write_text("{}")
    out = tmp_path / "out"  # the one folder the test writes: the recipes
    out.mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    # This process's temporary folder is the test's own (the machine's is shared with
    # other processes that create and change their entries meanwhile).
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    shared_temp = Path("/tmp")
    runner = CliRunner()
    verdicts = {0: 0, 1: 0}
    runner.invoke(app, ["validate", str(sandbox / "prep.yaml")])  # warm caches first
    before = (snapshot(tmp_path / "sandbox", cwd, temp, deep=True),
              snapshot(shared_temp, deep=False))

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(recipe=recipes())
    def one(recipe):
        path = out / "recipe.yaml"
        path.write_text(yaml.safe_dump(recipe, allow_unicode=True))
        # The recipe sits beside the sandbox's files: its relative paths lead there.
        beside = sandbox / "recipe.yaml"
        os.replace(path, beside)
        try:
            result = runner.invoke(app, ["validate", str(beside)])
        finally:
            os.replace(beside, path)
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            f"{type(result.exception).__name__}: {result.exception}\n{result.output}")
        assert result.exit_code in (0, 1), result.output
        assert "Traceback" not in result.output
        verdicts[result.exit_code] += 1

    one()
    after = (snapshot(tmp_path / "sandbox", cwd, temp, deep=True),
             snapshot(shared_temp, deep=False))
    sandbox_before, sandbox_after = before[0], after[0]
    # The recipe file moved in and out of the sandbox: its own entries are the test's.
    for state in (sandbox_before, sandbox_after):
        state.pop(str(sandbox / "recipe.yaml"), None)
        state.pop(str(sandbox), None)  # its mtime moves with the recipe file
    assert sandbox_after == sandbox_before
    # The shared /tmp: nothing a run of these recipes would name (its entries' modes are
    # other processes' to change; /tmp's own mode is checked).
    created = sorted(set(after[1]) - set(before[1]))
    assert not [p for p in created if Path(p).name.startswith(("teacher-", "gen-", "runs"))]
    assert after[1][str(shared_temp)][0] == before[1][str(shared_temp)][0]
    print(f"generated recipes: {sum(verdicts.values())} ({verdicts[0]} valid, {verdicts[1]} "
          "refused), 0 tracebacks, 0 changes outside the output folder")
    assert sum(verdicts.values()) == EXAMPLES
