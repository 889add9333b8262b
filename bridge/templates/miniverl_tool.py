"""verl tool class that runs a miniverl environment's tools, shipped in miniverl bundles.

``recipe/tool_config.yaml`` names ``miniverl_tool.MiniverlTool`` once per tool; the launch
script puts this folder on ``PYTHONPATH``. Each trajectory's ``create`` receives the row's
``extra_info.tools_kwargs[<tool>].create_kwargs`` (environment name, params and task as
JSON), builds a fresh environment, resets it on the task and answers calls with
``env.step`` — the same code that produced the tool results miniverl trained on. Errors
come back as tool text, never as exceptions. Needs verl and the torch-free ``miniverl``
package; it is not imported by miniverl itself.
"""

from __future__ import annotations

import json
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse


class MiniverlTool(BaseTool):
    """One tool of a miniverl environment, one environment instance per trajectory."""

    def __init__(self, config: dict, tool_schema):
        super().__init__(config, tool_schema)
        self._envs: dict = {}

    async def create(self, instance_id=None, create_kwargs=None, **kwargs):
        from miniverl.student.environments import Task, get_environment

        instance_id = instance_id or uuid4().hex
        spec = create_kwargs or {}
        try:
            env = get_environment(
                spec["environment"], **json.loads(spec.get("params_json") or "{}")
            )
            task_dict = json.loads(spec["task_json"])
            from_dict = getattr(Task, "from_dict", None)
            env.reset(from_dict(task_dict) if callable(from_dict) else Task(**task_dict))
            self._envs[instance_id] = env
        except Exception as exc:  # reported to the model on use, like any tool error
            self._envs[instance_id] = f"error: tool {self.name} could not start: {exc}"
        return instance_id, ToolResponse()

    async def execute(self, instance_id, parameters, **kwargs):
        env = self._envs.get(instance_id)
        if env is None:
            return ToolResponse(text=f"error: tool {self.name} was not created"), 0.0, {}
        if isinstance(env, str):
            return ToolResponse(text=env), 0.0, {}
        arguments = parameters if isinstance(parameters, dict) else {}
        return ToolResponse(text=str(env.step(self.name, arguments))), 0.0, {}

    async def release(self, instance_id, **kwargs):
        self._envs.pop(instance_id, None)
