"""An offline ``Model`` for the Agents SDK: turn 1 makes the scripted tool calls, then it replies."""

from __future__ import annotations

import json
from typing import Any

from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)


class ScriptedModel(Model):
    """No network: the first response calls the tools given, every later one says ``finished``."""

    def __init__(self, *calls: tuple[str, dict[str, Any]]) -> None:
        self.calls = calls
        self.turn = 0

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.turn += 1
        if self.turn == 1:
            output: list[Any] = [
                ResponseFunctionToolCall(type="function_call", id=f"fc_{n}", call_id=f"call_{n}",
                                         name=name, arguments=json.dumps(arguments))
                for n, (name, arguments) in enumerate(self.calls, start=1)
            ]
        else:
            output = [
                ResponseOutputMessage(
                    type="message", id=f"msg_{self.turn}", role="assistant", status="completed",
                    content=[ResponseOutputText(type="output_text", text="finished", annotations=[])],
                )
            ]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any):  # pragma: no cover - not used
        raise NotImplementedError("the tests run non-streamed")
