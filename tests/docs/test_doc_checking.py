"""What the docs test catches: a documented command, import or recipe that is wrong fails.

These feed the checker and the runner small pages with one mistake each, so the page
tests in test_docs_run.py are known to be able to fail, and the placeholders a synopsis
uses (``runs/<id>``, ``DIR``, ``[--split test]``) are known not to.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.docs import doc_runner
from tests.docs.doc_blocks import Block, Marker
from tests.docs.doc_checks import check_commands, check_python, check_yaml, shell_commands
from tests.docs.doc_runner import PageRunner, missing_needs, page_failures

ROOT = Path(__file__).resolve().parents[2]


def _block(kind: str, text: str, marker: Marker, lang: str = "") -> Block:
    return Block(Path("page.md"), 3, lang or kind, kind, text, marker)


def test_commands_split_like_a_shell_and_read_like_a_synopsis():
    text = (
        "# a comment\n"
        "miniverl teacher serve --model Qwen/Qwen3-1.7B --revision <40-hex sha> \\\n"
        "  --offline &\n"
        "miniverl teacher reload \"$(jq -r .teacher runs/a/sockets.json)\" --model x && "
        "miniverl eval --run runs/<id> [--split test] > out.txt 2>&1\n"
        "BASE=b miniverl teacher shutdown E [--mode drain|abort]\n"
    )
    assert shell_commands(text) == [
        ["miniverl", "teacher", "serve", "--model", "Qwen/Qwen3-1.7B", "--revision",
         "<40-hex-sha>", "--offline"],
        ["miniverl", "teacher", "reload", "$(jq -r .teacher runs/a/sockets.json)", "--model", "x"],
        ["miniverl", "eval", "--run", "runs/<id>", "--split", "test"],
        ["miniverl", "teacher", "shutdown", "E", "--mode", "drain"],
    ]
    listing = "miniverl cache stats DIR [--json]     entries, shards, bytes\n"
    expected = [["miniverl", "cache", "stats", "DIR", "--json"]]
    assert shell_commands(listing, listing=True) == expected


def test_wrong_commands_fail_and_placeholders_pass(tmp_path):
    wrong = {
        "miniverl frobnicate x": "no command 'frobnicate'",
        "miniverl validate --strict recipes/toy_cpu_opd.yaml": "No such option: --strict",
        "miniverl validate": "Missing argument 'RECIPE'",
        "miniverl validate a.yaml b.yaml": "unexpected extra argument",
        "miniverl teacher": "a command group",
        "miniverl inspect FILE --trajectory three": "Invalid value",
        "miniverl teacher serve --revision": "requires an argument",
        "python -m miniverl.teacher_server --model DIR --nope 1": "unrecognized arguments",
        "python -m miniverl.no_such_module": "no such module",
        "python benchmarks/no_such_script.py": "no such file",
        "pip install -e '.[train,no_such_extra]'": "no extra 'no_such_extra'",
        "cd no/such/dir": "no such directory",
    }
    for command, message in wrong.items():
        problems = check_commands(command, ROOT)
        assert len(problems) == 1 and message in problems[0], (command, problems)
    fine = (
        "miniverl report runs/<a> runs/<b> [runs/<c> ...] --out compare.html\n"
        "miniverl inspect FILE -n N --tokenizer ~/.cache/miniverl/toy/qwen3-toy-<hash>\n"
        "miniverl teacher reload tcp://127.0.0.1:5555 --model ~/m [--adapter DIR|ORG/NAME]\n"
        "python -m miniverl.teacher_server --model DIR --scorer sharpen --scorer-option tau=0.5\n"
        "pip install -e '.[train,bridge]' && cd examples/testing && pytest\n"
        "miniverl --version; miniverl teacher --help; miniverl demo --help\n"
    )
    assert check_commands(fine, ROOT) == []


def test_a_named_recipe_must_validate(tmp_path):
    (tmp_path / "bad.yaml").write_text("run: {mode: opd, tempreature: 2}\n", encoding="utf-8")
    problems = check_commands("miniverl up bad.yaml --quiet", tmp_path)
    assert len(problems) == 1 and "miniverl validate bad.yaml exited 1" in problems[0]
    assert "tempreature" in problems[0]
    assert check_commands("miniverl up recipes/toy_cpu_opd.yaml --quiet", ROOT) == []


def test_python_imports_must_resolve():
    check = Marker("check-only", reason="a sketch")
    good = "from miniverl.testing import FakeTeacher\nimport numpy as np\nteacher = FakeTeacher()"
    assert check_python(_block("python", good, check)) == []
    sketch = "from miniverl.testing import FakeTeacher\nfor ... in things:\n    pass"
    assert check_python(_block("python", sketch, check)) == []  # its import lines still count
    for text, message in {
        "from miniverl.testing import NoSuchHelper": "no such name",
        "from miniverl.no_such_room import x": "import miniverl.no_such_room",
        "import no_such_package_anywhere": "not installed",
        "for ... in things:\n    pass": "does not compile",
    }.items():
        problems = check_python(_block("python", text, check))
        assert len(problems) == 1 and message in problems[0], (text, problems)


def test_recipe_blocks_are_validated(tmp_path):
    (tmp_path / "recipes").mkdir()
    base = (ROOT / "recipes" / "toy_cpu_opd.yaml").read_text(encoding="utf-8")
    (tmp_path / "recipes" / "toy_cpu_opd.yaml").write_text(base, encoding="utf-8")
    # Its teacher.prepare beside it: validate checks that a recipe's paths lead somewhere.
    prep = (ROOT / "recipes" / "toy_cpu_opd_teacher.yaml").read_text(encoding="utf-8")
    (tmp_path / "recipes" / "toy_cpu_opd_teacher.yaml").write_text(prep, encoding="utf-8")
    fragment = Marker("recipe-fragment", base="recipes/toy_cpu_opd.yaml")
    good = "loss:\n  top_k: 8\nstudent:\n  model: {toy: {hidden: 64, layers: 2, heads: 4}}"
    assert check_yaml(_block("yaml", good, fragment), tmp_path) == []
    bad = check_yaml(_block("yaml", "loss:\n  top_kay: 8", fragment), tmp_path)
    assert len(bad) == 1 and "top_kay" in bad[0]
    whole = check_yaml(_block("yaml", "run: {mode: sft}", Marker("recipe")), tmp_path)
    assert whole and "exited 1" in whole[0]
    assert check_yaml(_block("yaml", "a: [", Marker("check-only", reason="parses")), tmp_path)


def test_run_blocks_share_a_directory_and_fail_loudly(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "<!-- run -->", "```bash", "echo hello > greeting.txt", "```",
        '<!-- run: expect="hello" -->', "```python",
        "print(open('greeting.txt').read())", "```",
        '<!-- run: expect="bye" -->', "```bash", "cat greeting.txt", "```",
        "<!-- run -->", "```bash", "echo never", "```",
        "<!-- check-only: a wrong command is caught after a failure too -->", "```bash",
        "miniverl validate --nope x", "```", "",
    ]), encoding="utf-8")
    failures = page_failures(page, tmp_path / "scratch")
    assert len(failures) == 3, failures
    assert failures[0].startswith("run page.md:10: output lacks ['bye']")
    assert failures[1] == "run page.md:14: not run, an earlier block of the page failed"
    assert "No such option: --nope" in failures[2]
    failing = tmp_path / "failing.md"
    failing.write_text("<!-- run -->\n```bash\nminiverl validate no-such.yaml\n```\n")
    (result,) = page_failures(failing, tmp_path / "scratch2")
    assert "exited 1" in result and "no-such.yaml" in result  # the output comes along


def test_a_block_needing_a_missing_module_is_not_run_and_named(tmp_path, monkeypatch):
    # The README's install lacks the optional extras: a block that needs one must not
    # fail the page there, and the page's test says which extra would run it.
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "<!-- run: needs=httpx -->", "```bash", "exit 3", "```",
        '<!-- run: expect="still runs" -->', "```bash", "echo still runs", "```", "",
    ]), encoding="utf-8")
    monkeypatch.setattr(doc_runner, "missing", lambda module: None)  # installed
    installed = page_failures(page, tmp_path / "with")  # it runs, and fails the page
    assert installed[0].startswith("run page.md:2: exited 3"), installed
    assert missing_needs(page) == []
    reason = "httpx is not installed; it comes with the 'engine' extra"
    monkeypatch.setattr(doc_runner, "missing", lambda module: reason)
    assert page_failures(page, tmp_path / "without") == []
    assert missing_needs(page) == [f"run page.md:2: {reason}"]


def test_a_block_past_its_limit_is_killed_with_its_children(tmp_path):
    pid_file = tmp_path / "child.pid"
    block = Block(Path("page.md"), 1, "bash", "shell",
                  f"sleep 60 & echo $! > {pid_file}\nsleep 60", Marker("run", timeout_s=1.0))
    with PageRunner(tmp_path) as runner:
        started = time.monotonic()
        failure = runner.run(block)
        assert failure and "after its 1 s limit" in failure
        assert time.monotonic() - started < 10
    assert _gone_soon(int(pid_file.read_text()))


def test_what_a_page_leaves_running_ends_with_the_page(tmp_path):
    pid_file = tmp_path / "server.pid"
    block = Block(Path("page.md"), 1, "bash", "shell",
                  f"sleep 60 >/dev/null 2>&1 & echo $! > {pid_file}", Marker("run"))
    with PageRunner(tmp_path) as runner:
        assert runner.run(block) is None  # returns while the background process runs
        server = int(pid_file.read_text())
        assert _running(server)
    assert _gone_soon(server)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().split()[2] != "Z"  # a zombie is dead, awaiting its parent
    except (ProcessLookupError, FileNotFoundError):
        return False


def _gone_soon(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while _running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
