"""Plugins: in-process registration, entry-point discovery and the runnable example."""

from __future__ import annotations

import sys
import types
from importlib import metadata
from pathlib import Path

import pytest

from miniverl.common.errors import ConfigError
from miniverl.student.environments import (
    ENTRY_POINT_GROUP,
    CalculatorEnv,
    FinalAnswer,
    ToolCall,
    get_environment,
    list_environments,
    make_tasks,
    refresh_plugins,
    register,
    registry,
    unregister,
)

EXAMPLE_DIR = Path(__file__).resolve().parents[3] / "examples" / "custom_environment"


class EchoEnv(CalculatorEnv):
    """A calculator under another name, enough to exercise the registry."""

    name = "echo"


@pytest.fixture
def clean_registry():
    refresh_plugins()
    yield
    for name in ("echo", "fake-plugin", "broken", "lettercount"):
        unregister(name)
    refresh_plugins()


def test_register_and_get(clean_registry):
    register("echo", EchoEnv)
    assert "echo" in list_environments()
    a, b = get_environment("echo"), get_environment("echo")
    assert isinstance(a, EchoEnv) and a is not b  # a fresh instance per episode
    assert make_tasks("echo", "train", 3, "easy", 0)[0].id.startswith("echo-train-")


def test_register_rejects_bad_input(clean_registry):
    with pytest.raises(ConfigError, match="invalid"):
        register("Bad Name", EchoEnv)
    with pytest.raises(ConfigError, match="not callable"):
        register("echo", 3)
    with pytest.raises(ConfigError, match="built in"):
        register("calculator", EchoEnv)
    register("calculator", CalculatorEnv)  # the same factory again is fine
    register("echo", lambda: object())
    with pytest.raises(ConfigError, match="lacks"):
        get_environment("echo")


def test_unknown_environment_names_the_fix():
    with pytest.raises(ConfigError, match="unknown environment 'nope'.*register"):
        get_environment("nope")


def _fake_entry_points(monkeypatch, *eps):
    def entry_points(group=None, **kw):
        assert group == ENTRY_POINT_GROUP
        return list(eps)

    monkeypatch.setattr(registry.metadata, "entry_points", entry_points)
    refresh_plugins()


def test_entry_point_discovery_is_lazy(clean_registry, monkeypatch):
    module = types.ModuleType("fake_env_plugin")
    module.loaded = 0

    def factory(**params):
        module.loaded += 1
        return EchoEnv(**params)

    module.factory = factory
    monkeypatch.setitem(sys.modules, "fake_env_plugin", module)
    ep = metadata.EntryPoint(name="fake-plugin", value="fake_env_plugin:factory", group=ENTRY_POINT_GROUP)
    _fake_entry_points(monkeypatch, ep)
    assert "fake-plugin" in list_environments()
    assert module.loaded == 0  # listing does not import or call the plugin
    env = get_environment("fake-plugin", units=False)
    assert module.loaded == 1 and env.units is False
    task = make_tasks("fake-plugin", "eval", 2, "easy", 0)[0]
    env.reset(task)
    actions = env.oracle_actions(task)
    assert isinstance(actions[0], ToolCall) and isinstance(actions[-1], FinalAnswer)


def test_broken_plugin_is_a_config_error(clean_registry, monkeypatch):
    ep = metadata.EntryPoint(name="broken", value="no_such_module_xyz:Env", group=ENTRY_POINT_GROUP)
    _fake_entry_points(monkeypatch, ep)
    with pytest.raises(ConfigError, match="plugin 'broken'.*failed to load"):
        get_environment("broken")


def test_bad_params_are_a_config_error():
    with pytest.raises(ConfigError, match="rejected params"):
        get_environment("sqlite", rows=3)


def test_example_plugin_runs(clean_registry, monkeypatch, capsys):
    # examples/custom_environment is documented as runnable; keep it so.
    monkeypatch.syspath_prepend(str(EXAMPLE_DIR))
    sys.modules.pop("run_example", None)
    import run_example

    assert run_example.main(n=3) == 1.0
    assert "oracle solved 9/9" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="max_syllables"):
        get_environment("lettercount", max_syllables=99)
    sys.modules.pop("run_example", None)
    sys.modules.pop("lettercount_env", None)


def test_example_declares_the_entry_point():
    text = (EXAMPLE_DIR / "pyproject.toml").read_text()
    assert f'[project.entry-points."{ENTRY_POINT_GROUP}"]' in text
    assert 'lettercount = "lettercount_env:LetterCountEnv"' in text


@pytest.mark.slow
def test_package_is_torch_free():
    # The bridge and verl reward functions import environments without torch installed.
    import subprocess

    code = (
        "import sys, miniverl.student.environments as e; e.make_tasks('sqlite', 'train', 2, 'mixed', 0); "
        "sys.exit(int('torch' in sys.modules or 'transformers' in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
