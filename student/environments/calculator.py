"""The ``calculator`` environment: arithmetic word-free questions and unit conversions.

Tools:
- ``calculator(expression)``: evaluates arithmetic through an AST whitelist (numbers,
  ``+ - * / // % **``, unary signs, parentheses and ``abs round min max sqrt``).
  It never calls ``eval``; names, attributes, strings, lambdas, comprehensions and
  any other syntax are refused. Every call is cheap by construction: at most 200
  characters and 100 syntax nodes, exponents at most 64, and every value (literal,
  intermediate or result) at most 1e15 in magnitude, checked *before* a power is
  computed, so ``9**9**9`` is an error in microseconds, not a 370-million-digit int.
- ``convert(value, from_unit, to_unit)``: length (km m cm mm), mass (kg g mg),
  time (h min s ms) and temperature (c f k).

Difficulties: ``easy`` is one operation on two 2-digit numbers in a short, regular
prompt (``What is 37 + 48?``) so a tiny model can learn it; ``medium`` is two
operations or a unit conversion; ``hard`` is three operations with parentheses or a
conversion followed by arithmetic. With ``units=False`` the ``convert`` tool and the
conversion tasks are left out.

Faults (``faults``, a share from 0 to 1, default 0): that share of tasks, chosen from
each task's seed, carries one transient tool error (``faults.py``): one of its calls
answers ``error: the calculator tool is temporarily unavailable; call it again`` and the
same call made again works. The oracle calls again, so its trace shows the recovery.
With ``faults=0`` tasks, prompts and tools are exactly those of an environment without
the parameter.

Chains (``chain``, a number of steps from 2 to 6, default 0 = off): every task is a chain
of dependent calls, whatever the difficulty (``Chain: 37 + 48, then * 3, then - 19.``).
Each step's expression starts with the previous step's result, which the model reads
from the last tool response, so one wrong copy derails every step after it: errors
compound. The oracle makes one call per step, then answers the last result.

The verifier compares the last number of the answer with the ground truth (exact
for integers, 1e-6 relative otherwise). This module is torch-free.
"""

from __future__ import annotations

import ast
import math
import random
from fractions import Fraction
from typing import Any

from miniverl.common.trajectory import VerifierResult

from .base import Environment, FinalAnswer, Task, ToolCall, format_number, numeric_result, tool_spec
from .faults import FaultState, check_rate, draw_fault, with_retry

MAX_EXPRESSION_CHARS = 200
MAX_MAGNITUDE = 1e15
MAX_EXPONENT = 64
MAX_NODES = 100
MAX_UNIT_CHARS = 20
MAX_CHAIN_STEPS = 6
_FUNCTIONS = {
    "abs": (1, 1, abs),
    "round": (1, 2, round),
    "min": (2, 8, min),
    "max": (2, 8, max),
    "sqrt": (1, 1, None),
}
_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)

# Factors to each dimension's base unit, as fractions so conversions stay exact.
_UNITS: dict[str, tuple[str, Fraction]] = {
    "km": ("length", Fraction(1000)),
    "m": ("length", Fraction(1)),
    "cm": ("length", Fraction(1, 100)),
    "mm": ("length", Fraction(1, 1000)),
    "kg": ("mass", Fraction(1000)),
    "g": ("mass", Fraction(1)),
    "mg": ("mass", Fraction(1, 1000)),
    "h": ("time", Fraction(3600)),
    "min": ("time", Fraction(60)),
    "s": ("time", Fraction(1)),
    "ms": ("time", Fraction(1, 1000)),
    "c": ("temperature", Fraction(1)),
    "f": ("temperature", Fraction(1)),
    "k": ("temperature", Fraction(1)),
}
_UNIT_ALIASES = {"°c": "c", "°f": "f", "celsius": "c", "fahrenheit": "f", "kelvin": "k"}


class CalcError(ValueError):
    """An expression the whitelist refuses; the message goes back to the model."""


def _checked(value: Any) -> int | float:
    if isinstance(value, float) and not math.isfinite(value):
        raise CalcError("result is not a finite number")
    if abs(value) > MAX_MAGNITUDE:
        raise CalcError(f"result exceeds {MAX_MAGNITUDE:.0e} in magnitude")
    return value


def _eval_node(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _eval_node(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise CalcError("only numbers are allowed")
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval_node(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, _BINOPS):
        left, right = _eval_node(node.left), _eval_node(node.right)
        return _checked(_binop(node.op, left, right))
    if isinstance(node, ast.Call):
        return _checked(_call(node))
    raise CalcError(f"{type(node).__name__} is not allowed; use numbers and + - * / // % **")


def _binop(op: ast.operator, left, right):
    if isinstance(op, ast.Add):
        return left + right
    if isinstance(op, ast.Sub):
        return left - right
    if isinstance(op, ast.Mult):
        return left * right
    if isinstance(op, ast.Pow):
        if abs(right) > MAX_EXPONENT:
            raise CalcError(f"exponent {format_number(right)} is larger than {MAX_EXPONENT}")
        if left == 0 and right < 0:
            raise CalcError("division by zero")
        # Checked before computing, for small bases with negative exponents too
        # (0.5 ** -64): the power is what a model uses to ask for huge numbers.
        if left != 0 and right * math.log10(abs(left)) > 15:
            raise CalcError(f"result exceeds {MAX_MAGNITUDE:.0e} in magnitude")
        try:
            result = left**right
        except OverflowError:
            raise CalcError(f"result exceeds {MAX_MAGNITUDE:.0e} in magnitude") from None
        if isinstance(result, complex):
            raise CalcError("result is not a real number")
        return result
    if right == 0:
        raise CalcError("division by zero")
    if isinstance(op, ast.Div):
        return left / right
    if isinstance(op, ast.FloorDiv):
        return left // right
    return left % right


def _call(node: ast.Call):
    if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS:
        raise CalcError(f"only the functions {', '.join(_FUNCTIONS)} are allowed")
    if node.keywords:
        raise CalcError("keyword arguments are not allowed")
    low, high, fn = _FUNCTIONS[node.func.id]
    if not low <= len(node.args) <= high:
        raise CalcError(f"{node.func.id} takes {low} to {high} arguments")
    args = [_eval_node(a) for a in node.args]
    if node.func.id == "sqrt":
        if args[0] < 0:
            raise CalcError("sqrt of a negative number")
        return math.sqrt(args[0])
    if node.func.id == "round" and len(args) == 2 and not (
        isinstance(args[1], int) and 0 <= args[1] <= 12
    ):
        raise CalcError("round digits must be an integer from 0 to 12")
    return fn(*args)


def evaluate(expression: str) -> int | float:
    """Evaluate ``expression`` through the whitelist; raises :class:`CalcError`."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalcError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters")
    if not expression.strip():
        raise CalcError("expression is empty")
    try:
        tree = ast.parse(expression.strip().replace("^", "**"), mode="eval")
    except SyntaxError as exc:
        raise CalcError(f"invalid expression: {exc.msg}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalcError(f"expression has more than {MAX_NODES} parts")
    return _eval_node(tree)


def _unit(name: str) -> str:
    if len(name) > MAX_UNIT_CHARS:
        raise CalcError(f"unit name is longer than {MAX_UNIT_CHARS} characters")
    key = name.strip().lower()
    key = _UNIT_ALIASES.get(key, key)
    if key not in _UNITS:
        raise CalcError(f"unknown unit {name!r}; known: {', '.join(_UNITS)}")
    return key


def convert(value: float, from_unit: str, to_unit: str) -> int | float:
    """Convert ``value`` between two units of the same dimension."""
    src, dst = _unit(from_unit), _unit(to_unit)
    _checked(value)  # a huge or non-finite value is refused before any arithmetic
    if _UNITS[src][0] != _UNITS[dst][0]:
        raise CalcError(f"cannot convert {_UNITS[src][0]} ({src}) to {_UNITS[dst][0]} ({dst})")
    amount = Fraction(repr(float(value))) if isinstance(value, float) else Fraction(value)
    if _UNITS[src][0] == "temperature":
        celsius = {"c": amount, "f": (amount - 32) * Fraction(5, 9), "k": amount - Fraction("273.15")}[src]
        result = {"c": celsius, "f": celsius * Fraction(9, 5) + 32, "k": celsius + Fraction("273.15")}[dst]
    else:
        result = amount * _UNITS[src][1] / _UNITS[dst][1]
    return _checked(int(result) if result.denominator == 1 else float(result))


# Conversions used by generated tasks, chosen so answers stay short.
_TASK_CONVERSIONS = [
    ("km", "m"), ("m", "cm"), ("cm", "mm"), ("m", "km"), ("kg", "g"), ("g", "kg"),
    ("h", "min"), ("min", "s"), ("s", "ms"), ("c", "f"),
]  # fmt: skip


class CalculatorEnv(Environment):
    """Arithmetic and unit conversion through two tools."""

    name = "calculator"

    def __init__(self, units: bool = True, faults: float = 0.0, chain: int = 0) -> None:
        super().__init__()
        self.units = bool(units)
        self.faults = check_rate(faults)
        if isinstance(chain, bool) or not isinstance(chain, int) or not (
            chain == 0 or 2 <= chain <= MAX_CHAIN_STEPS
        ):
            raise ValueError(
                f"chain {chain!r} must be 0 (off) or a whole number of steps from 2 to "
                f"{MAX_CHAIN_STEPS}; fix environment.params.chain"
            )
        self.chain = chain
        self._fault = FaultState(None)

    def on_reset(self, task: Task) -> None:
        self._fault = FaultState(task.data.get("fault"))

    def system_prompt(self) -> str:
        if self.units:
            return "Use the calculator and convert tools. Reply with only the final number."
        return "Use the calculator tool. Reply with only the final number."

    def tool_specs(self) -> list[dict]:
        specs = [
            tool_spec(
                "calculator",
                "Evaluate an arithmetic expression.",
                {"expression": {"type": "string", "description": "e.g. 37 + 48"}},
            )
        ]
        if self.units:
            specs.append(
                tool_spec(
                    "convert",
                    "Convert a value between units (km m cm mm kg g mg h min s ms c f k).",
                    {
                        "value": {"type": "number"},
                        "from_unit": {"type": "string"},
                        "to_unit": {"type": "string"},
                    },
                )
            )
        return specs

    def run_tool(self, name: str, arguments: dict[str, Any]) -> str:
        failure = self._fault.trip(name)
        if failure is not None:
            raise CalcError(failure)
        return self._compute(name, arguments)

    def _compute(self, name: str, arguments: dict[str, Any]) -> str:
        if name == "calculator":
            return format_number(evaluate(arguments["expression"]))
        return format_number(convert(arguments["value"], arguments["from_unit"], arguments["to_unit"]))

    def check_answer(self, task: Task, answer: str) -> VerifierResult:
        return numeric_result(task.answer, answer)

    def oracle_actions(self, task: Task) -> list:
        actions: list = [ToolCall(s["tool"], dict(s["arguments"])) for s in task.data["plan"]]
        return [*with_retry(actions, task.data.get("fault")), FinalAnswer(task.answer)]

    def privileged_context(self, task: Task) -> str:
        steps = "; ".join(
            f"{s['tool']}({', '.join(f'{k}={v}' for k, v in s['arguments'].items())})"
            for s in task.data["plan"]
        )
        fault = task.data.get("fault")
        retry = f" Call {fault['call'] + 1} fails once: make it again." if fault else ""
        return f"Plan: {steps}.{retry} The answer is {task.answer}."

    def generate_task(self, seed: int, split: str, difficulty: str) -> Task:
        rng = random.Random(f"calculator:{int(seed)}:{difficulty}")
        if difficulty not in ("easy", "medium", "hard"):
            raise ValueError(f"difficulty {difficulty!r} is not easy, medium or hard")
        if self.chain:
            prompt, plan = self._chain(rng, self.chain)
        elif difficulty == "easy":
            prompt, plan = self._arith(rng, 1)
        elif difficulty == "medium":
            if self.units and rng.random() < 0.5:
                prompt, plan = self._conversion(rng)
            else:
                prompt, plan = self._arith(rng, 2)
        else:
            if self.units and rng.random() < 0.5:
                prompt, plan = self._conversion_sum(rng)
            else:
                prompt, plan = self._arith(rng, 3)
        answer = self._replay(plan)
        data: dict[str, Any] = {"plan": plan}
        if self.faults > 0:
            data["fault"] = draw_fault(self.name, seed, self.faults, len(plan))
        return self.make_task(seed, split, difficulty, prompt, answer, data)

    def _replay(self, plan: list[dict]) -> str:
        result = ""
        for step in plan:
            result = self._compute(step["tool"], step["arguments"])
        return result

    @staticmethod
    def _arith(rng: random.Random, ops: int) -> tuple[str, list[dict]]:
        if ops == 1:
            expr = f"{rng.randint(10, 99)} {rng.choice('+-*')} {rng.randint(10, 99)}"
        elif ops == 2:
            a, b, c = rng.randint(2, 99), rng.randint(2, 30), rng.randint(2, 99)
            expr = f"{a} {rng.choice('+-*')} {b} {rng.choice('+-')} {c}"
        else:
            a, b, c, d = (rng.randint(2, 60) for _ in range(4))
            expr = f"({a} {rng.choice('+-')} {b}) * {rng.randint(2, 12)} {rng.choice('+-')} {c + d}"
        return f"What is {expr}?", [{"tool": "calculator", "arguments": {"expression": expr}}]

    @staticmethod
    def _chain(rng: random.Random, steps: int) -> tuple[str, list[dict]]:
        """``steps`` calls, each on the last one's result: ``a op b``, then ``op c``, ..."""
        first = f"{rng.randint(10, 99)} {rng.choice('+-')} {rng.randint(10, 99)}"
        ops = [
            f"* {rng.randint(2, 9)}" if rng.random() < 0.3 else f"{rng.choice('+-')} {rng.randint(10, 99)}"
            for _ in range(steps - 1)
        ]
        plan = [{"tool": "calculator", "arguments": {"expression": first}}]
        value = evaluate(first)
        for op in ops:
            expr = f"{format_number(value)} {op}"
            plan.append({"tool": "calculator", "arguments": {"expression": expr}})
            value = evaluate(expr)
        return f"Chain: {first}, then {', then '.join(ops)}.", plan

    @staticmethod
    def _conversion(rng: random.Random) -> tuple[str, list[dict]]:
        src, dst = rng.choice(_TASK_CONVERSIONS)
        value: int | float = rng.randint(1, 99)
        if src == "c":
            value = 5 * rng.randint(-8, 20)
        elif rng.random() < 0.3:
            value = value + 0.5
        prompt = f"Convert {format_number(value)} {src} to {dst}."
        plan = [{"tool": "convert", "arguments": {"value": value, "from_unit": src, "to_unit": dst}}]
        return prompt, plan

    def _conversion_sum(self, rng: random.Random) -> tuple[str, list[dict]]:
        big, small = rng.choice([("km", "m"), ("m", "cm"), ("kg", "g"), ("h", "min"), ("min", "s")])
        a, b = rng.randint(2, 30), rng.randint(1, 59)
        converted = self._compute("convert", {"value": a, "from_unit": big, "to_unit": small})
        expr = f"{converted} + {b}"
        prompt = f"What is {a} {big} + {b} {small} in {small}?"
        plan = [
            {"tool": "convert", "arguments": {"value": a, "from_unit": big, "to_unit": small}},
            {"tool": "calculator", "arguments": {"expression": expr}},
        ]
        return prompt, plan
