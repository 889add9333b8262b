"""The ``jsonnav`` environment: answer questions about a seeded JSON document.

Each task carries a small document in ``task.data["document"]``: ``people`` and
``items`` keyed by short ids (``p123``, ``k372``) and ``cities`` keyed by name.

Tools (paths are dot-separated keys and list indices, ``""`` is the root):
- ``get(path)``: the JSON value at ``path``.
- ``keys(path)``: the keys of the object at ``path`` (or the index range of a list).
- ``find(key)``: every path whose last part is ``key`` (at most 50).

Difficulties: ``easy`` names the full path (``Get items.k372.price.``); ``medium``
names a record by its ``name`` field (``What is the price of the blue lamp?``);
``hard`` needs two hops (``What is the population of the city where Maria Lopez
lives?``). Tool calls are bounded: paths and keys are at most 300 characters, ``find``
returns at most 50 paths, results are cut at 2,000 characters. The verifier is an
exact match after trimming whitespace, quotes, a trailing period and case. This
module is torch-free.
"""

from __future__ import annotations

import json
import random
from typing import Any

from miniverl.common.trajectory import VerifierResult

from .base import Environment, FinalAnswer, Task, ToolCall, normalize_text, tool_spec

_FIRST = [
    "Maria", "Ana", "Luis", "Omar", "Lena", "Ivan", "Sara", "Tom", "Nina", "Paul", "Eva",
    "Hugo", "Mila", "Karl", "Rosa", "Jon", "Ada", "Leo", "Ines", "Max", "Zoe", "Ali", "Mia",
    "Noah", "Lea", "Sam", "Iris", "Finn", "Yara", "Ben",
]
_LAST = [
    "Lopez", "Smith", "Chen", "Novak", "Rossi", "Berg", "Kim", "Silva", "Costa", "Meyer",
    "Dubois", "Sato", "Khan", "Ortiz", "Nagy", "Weber", "Moreau", "Olsen", "Park", "Ivanova",
    "Garcia", "Jensen", "Horvat", "Mendes", "Fischer", "Lund", "Tanaka", "Reyes", "Varga", "Keller",
    "Bianchi", "Dahl", "Marin", "Pavel", "Haas", "Ruiz", "Costin", "Wolf", "Lindqvist", "Popov",
]
_ADJ = [
    "blue", "red", "green", "black", "white", "small", "large", "old", "new", "bright", "soft",
    "heavy", "light", "round", "square", "tall",
]
_NOUN = [
    "lamp", "chair", "table", "mug", "clock", "pen", "bag", "hat", "book", "shelf", "rug",
    "vase", "desk", "fan", "box", "bowl",
]
_CITIES = {
    "Lyon": "France", "Porto": "Portugal", "Graz": "Austria", "Turin": "Italy",
    "Leeds": "England", "Bergen": "Norway", "Gdansk": "Poland", "Bilbao": "Spain",
    "Malmo": "Sweden", "Ghent": "Belgium", "Cork": "Ireland", "Basel": "Switzerland",
}  # fmt: skip
_MAX_FIND = 50
MAX_PATH_CHARS = 300  # the longest real path is ~25 characters


class PathError(ValueError):
    """A path that does not exist in the document; the message goes back to the model."""


def _resolve(document: Any, path: str) -> Any:
    if len(path) > MAX_PATH_CHARS:
        raise PathError(f"path is longer than {MAX_PATH_CHARS} characters")
    node = document
    path = path.strip().strip(".")
    if not path:
        return node
    walked: list[str] = []
    for part in path.split("."):
        if isinstance(node, dict):
            if part not in node:
                where = ".".join(walked) or "the root"
                raise PathError(f"no key {part!r} at {where}; try keys")
            node = node[part]
        elif isinstance(node, list):
            if not (part.isascii() and part.isdigit()) or not 0 <= int(part) < len(node):
                raise PathError(f"index {part!r} is not in 0..{len(node) - 1}")
            node = node[int(part)]
        else:
            raise PathError(f"{'.'.join(walked)} is a value, not an object or list")
        walked.append(part)
    return node


def _find(node: Any, key: str, prefix: str, out: list[str]) -> None:
    if len(out) >= _MAX_FIND:
        return
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, child in children:
        path = f"{prefix}.{k}" if prefix else str(k)
        if str(k) == key:
            out.append(path)
        _find(child, key, path, out)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


class JsonNavEnv(Environment):
    """Navigate a JSON document with get / keys / find."""

    name = "jsonnav"

    def system_prompt(self) -> str:
        return "Use the get, keys and find tools to read the JSON document. Reply with only the answer."

    def tool_specs(self) -> list[dict]:
        path = {"type": "string", "description": "dot path, e.g. people.p123.age"}
        return [
            tool_spec("get", "Return the JSON value at a path.", {"path": path}),
            tool_spec("keys", "List the keys at a path.", {"path": path}),
            tool_spec("find", "List the paths that end with a key.", {"key": {"type": "string"}}),
        ]

    def run_tool(self, name: str, arguments: dict[str, Any]) -> str:
        document = self.task.data["document"]
        if name == "find":
            if len(arguments["key"]) > MAX_PATH_CHARS:
                raise PathError(f"key is longer than {MAX_PATH_CHARS} characters")
            out: list[str] = []
            _find(document, arguments["key"].strip(), "", out)
            return _dumps(out) if out else f"no path ends with {arguments['key']!r}"
        node = _resolve(document, arguments["path"])
        if name == "get":
            return _dumps(node)
        if isinstance(node, dict):
            return _dumps(list(node))
        if isinstance(node, list):
            return f"a list of {len(node)} items, indices 0..{len(node) - 1}"
        raise PathError(f"{arguments['path']!r} is a value, not an object; use get")

    def check_answer(self, task: Task, answer: str) -> VerifierResult:
        got, want = normalize_text(answer), normalize_text(task.answer)
        if got == want:
            return VerifierResult(success=True, score=1.0, reason="exact match")
        return VerifierResult(success=False, score=0.0, reason=f"expected {task.answer!r}"[:200])

    def oracle_actions(self, task: Task) -> list:
        calls = [ToolCall("get", {"path": p}) for p in task.data["paths"]]
        return [*calls, FinalAnswer(task.answer)]

    def privileged_context(self, task: Task) -> str:
        return f"The answer is at {task.data['paths'][-1]}: {task.answer}."

    def generate_task(self, seed: int, split: str, difficulty: str) -> Task:
        rng = random.Random(f"jsonnav:{int(seed)}:{difficulty}")
        doc = _document(rng)
        people, items = doc["people"], doc["items"]
        if difficulty == "easy":
            coll = rng.choice(["people", "items"])
            rid = rng.choice(sorted(doc[coll]))
            fld = rng.choice(["age", "city"] if coll == "people" else ["price", "stock"])
            path = f"{coll}.{rid}.{fld}"
            prompt, paths = f"Get {path}.", [path]
        elif difficulty == "medium":
            if rng.random() < 0.5:
                rid = rng.choice(sorted(people))
                fld = rng.choice(["age", "city"])
                what = "age" if fld == "age" else "city"
                prompt = f"What is the {what} of {people[rid]['name']}?"
                paths = ["people", f"people.{rid}.{fld}"]
            else:
                rid = rng.choice(sorted(items))
                fld = rng.choice(["price", "stock"])
                prompt = f"What is the {fld} of the {items[rid]['name']}?"
                paths = ["items", f"items.{rid}.{fld}"]
        elif difficulty == "hard":
            rid = rng.choice(sorted(people))
            fld = rng.choice(["population", "country"])
            city = people[rid]["city"]
            prompt = f"What is the {fld} of the city where {people[rid]['name']} lives?"
            paths = ["people", f"people.{rid}.city", f"cities.{city}.{fld}"]
        else:
            raise ValueError(f"difficulty {difficulty!r} is not easy, medium or hard")
        value = _resolve(doc, paths[-1])
        answer = value if isinstance(value, str) else _dumps(value)
        return self.make_task(seed, split, difficulty, prompt, answer, {"document": doc, "paths": paths})


def _document(rng: random.Random) -> dict[str, Any]:
    cities = rng.sample(sorted(_CITIES), 3)
    names = rng.sample([f"{f} {last}" for f in _FIRST for last in _LAST], 4)
    people = {
        f"p{pid}": {"name": n, "age": rng.randint(18, 90), "city": rng.choice(cities)}
        for pid, n in zip(rng.sample(range(100, 1000), 4), names, strict=True)
    }
    things = rng.sample([f"{a} {n}" for a in _ADJ for n in _NOUN], 4)
    items = {
        f"k{kid}": {"name": t, "price": rng.randint(2, 300), "stock": rng.randint(0, 60)}
        for kid, t in zip(rng.sample(range(100, 1000), 4), things, strict=True)
    }
    city_table = {
        c: {"country": _CITIES[c], "population": rng.randint(50, 900) * 1000} for c in cities
    }
    return {"people": people, "items": items, "cities": city_table}
