"""The calculator evaluates arithmetic only, within bounds, and reports everything else."""

from __future__ import annotations

import pytest

from miniverl.student.environments import get_environment, make_tasks
from miniverl.student.environments.calculator import CalcError, convert, evaluate


@pytest.fixture
def env():
    e = get_environment("calculator")
    e.reset(make_tasks("calculator", "train", 1, "easy", 0)[0])
    return e


@pytest.mark.parametrize(
    "expr, value",
    [
        ("37 + 48", 85), ("2 * (3 + 4)", 14), ("-5 + 2", -3), ("7 / 2", 3.5), ("7 // 2", 3),
        ("7 % 4", 3), ("2 ** 10", 1024), ("2^3", 8), ("abs(-3)", 3), ("round(2.567, 2)", 2.57),
        ("min(4, 2, 9)", 2), ("max(4, 2)", 4), ("sqrt(16)", 4.0), ("1.5 * 4", 6.0),
    ],
)  # fmt: skip
def test_arithmetic(expr, value):
    assert evaluate(expr) == value


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os').system('true')", "x + 1", "(1).real", "open('f')", "print(1)",
        "lambda: 1", "[i for i in range(3)]", "'a' * 3", "'abc'", "2 ** 10000", "10 ** 16",
        "9 ** 9 ** 9", "99999999999999999999", "1 / 0", "5 // 0", "5 % 0", "0 ** -1",
        "sqrt(-1)", "(-8) ** 0.5", "True + 1", "1 if 1 else 2", "[1, 2]", "{1: 2}", "1 < 2",
        "a.b", "abs(x=1)", "max(1)", "round(1.5, 99)", "1j", "1e308 * 10", "",
        "1 +" , "1" + " + 1" * 120, "(" * 150 + "1" + ")" * 150, "f'{1}'", "not 1",
        "getattr(1, 'real')", "min(*[1, 2])",
    ],
)  # fmt: skip
def test_anything_but_arithmetic_is_refused(expr):
    with pytest.raises(CalcError):
        evaluate(expr)


def test_refusals_come_back_as_error_text(env):
    assert env.step("calculator", {"expression": "__import__('os')"}).startswith("error:")
    assert env.step("calculator", {"expression": "1 / 0"}) == "error: division by zero"
    assert env.step("calculator", {"expression": "2 ** 999"}).startswith("error: exponent")
    assert env.step("calculator", {"expression": 12}).startswith("error: argument 'expression'")
    assert env.step("calculator", {}).startswith("error: missing argument")
    assert env.step("calculator", {"expression": "1", "x": 2}).startswith("error: unexpected")
    assert env.step("calculator", {"expression": "37 + 48"}) == "85"


@pytest.mark.parametrize(
    "value, src, dst, out",
    [
        (3, "km", "m", 3000), (3.5, "km", "m", 3500), (250, "cm", "km", 0.0025), (2, "h", "min", 120),
        (1500, "g", "kg", 1.5), (100, "c", "f", 212), (32, "F", "C", 0), (0, "c", "k", 273.15),
    ],
)  # fmt: skip
def test_convert(value, src, dst, out):
    assert convert(value, src, dst) == pytest.approx(out)


def test_convert_errors(env):
    assert env.step("convert", {"value": 1, "from_unit": "km", "to_unit": "kg"}).startswith(
        "error: cannot convert length"
    )
    assert "unknown unit" in env.step("convert", {"value": 1, "from_unit": "ly", "to_unit": "m"})
    assert env.step("convert", {"value": "1", "from_unit": "km", "to_unit": "m"}).startswith(
        "error: argument 'value'"
    )
    assert env.step("convert", {"value": True, "from_unit": "km", "to_unit": "m"}).startswith("error:")
    assert env.step("convert", {"value": 1e300, "from_unit": "km", "to_unit": "mm"}).startswith(
        "error: result exceeds"
    )


# Chains: every step's expression starts with the previous step's result, so the oracle's
# trace is what the task promises (errors compound) and the answer is the last result.
@pytest.mark.parametrize("steps", [2, 3, 6])
def test_chain_tasks_depend_on_the_last_result(steps):
    env = get_environment("calculator", units=False, chain=steps)
    for task in make_tasks("calculator", "train", 8, "easy", 0, {"units": False, "chain": steps}):
        env.reset(task)
        results = []
        for action in env.oracle_actions(task)[:-1]:
            if results:
                assert action.arguments["expression"].startswith(results[-1] + " ")
            obs = env.step(action.name, action.arguments)
            results.append(obs)
        assert len(results) == steps
        assert env.oracle_actions(task)[-1].text == results[-1] == task.answer
        assert task.prompt.startswith("Chain: ") and task.prompt.count(", then ") == steps - 1


def test_chain_tasks_are_seeded_and_off_by_default():
    plain = make_tasks("calculator", "train", 4, "easy", 0, {"units": False})
    assert all(not t.prompt.startswith("Chain") for t in plain)
    a = make_tasks("calculator", "eval", 4, "easy", 0, {"units": False, "chain": 3})
    b = make_tasks("calculator", "eval", 4, "easy", 0, {"units": False, "chain": 3})
    assert [t.prompt for t in a] == [t.prompt for t in b]


@pytest.mark.parametrize("bad", [1, 7, -2, 2.5, True, "3"])
def test_chain_length_is_checked(bad):
    with pytest.raises(ValueError, match="chain .* must be 0 .* from 2 to 6"):
        get_environment("calculator", units=False, chain=bad)
