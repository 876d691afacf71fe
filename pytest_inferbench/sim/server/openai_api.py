"""OpenAI request bodies -> a validated `GenerationRequest`, or an `ApiError` with a clear message.

Only what the simulator honours is accepted: one prompt (text, or a list of token ids), n = 1,
no logprobs. Every other malformed input is a 4xx with a message naming the field, never a 500.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Literal

from ...loadgen.tokenizer import chat_prompt_tokens, count_tokens, render_chat

Kind = Literal["completion", "chat"]
_ROLES = ("system", "user", "assistant", "tool", "developer")
_MAX_STOP_STRINGS = 4


class ApiError(Exception):
    """A request the server refuses; becomes an OpenAI-style error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, object]:
        kind = {404: "not_found_error", 500: "server_error", 503: "service_unavailable"}
        return {"error": {
            "message": self.message,
            "type": kind.get(self.status, "invalid_request_error"),
            "param": self.param,
            "code": self.code if self.code is not None else self.status,
        }}


@dataclass(frozen=True)
class GenerationRequest:
    kind: Kind
    model: str
    prompt_text: str  # the prompt as the model sees it (chat template applied); "" for token ids
    prompt_tokens: int
    max_tokens: int | None  # as requested; None = the endpoint's default
    stream: bool
    include_usage: bool
    continuous_usage: bool  # vLLM stream_options.continuous_usage_stats: usage in every chunk
    ignore_eos: bool
    temperature: float
    stop: tuple[str, ...]


def parse_json_object(raw: bytes) -> dict[str, object]:
    if not raw.strip():
        raise ApiError(400, "request body is empty; expected a JSON object")
    try:
        body = json.loads(raw)
    except RecursionError:
        raise ApiError(400, "request body is not valid JSON: nested too deeply") from None
    except ValueError as exc:  # bad JSON, bad UTF-8, an integer too long to convert
        raise ApiError(400, f"request body is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"request body must be a JSON object, got {type(body).__name__}")
    return body


def _type_error(field: str, expected: str, value: object) -> ApiError:
    return ApiError(400, f"'{field}' must be {expected}, got {json.dumps(value)[:80]}", param=field)


def _optional_bool(body: dict[str, object], field: str, default: bool) -> bool:
    value = body.get(field, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _type_error(field, "a boolean", value)
    return value


def _optional_int(body: dict[str, object], field: str) -> int | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _type_error(field, "an integer", value)
    if value < 1:
        raise ApiError(400, f"'{field}' must be at least 1, got {value}", param=field)
    return value


def _temperature(body: dict[str, object]) -> float:
    value = body.get("temperature", 1.0)
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _type_error("temperature", "a number", value)
    if not 0.0 <= value <= 2.0:
        raise ApiError(400, f"'temperature' must be within [0, 2], got {value}",
                       param="temperature")
    return float(value)


def _stop(body: dict[str, object]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise _type_error("stop", "a string or a list of strings", value)
    if len(value) > _MAX_STOP_STRINGS:
        raise ApiError(400, f"'stop' may hold at most {_MAX_STOP_STRINGS} strings", param="stop")
    return tuple(s for s in value if s)


def _check_unsupported(body: dict[str, object]) -> None:
    n = body.get("n", 1)
    if n is not None and (isinstance(n, bool) or not isinstance(n, int)):
        raise _type_error("n", "an integer", n)
    if n not in (None, 1):
        raise ApiError(400, f"'n' must be 1 (the simulator returns one choice), got {n}", param="n")
    best_of = body.get("best_of")
    if best_of not in (None, 1):
        raise ApiError(400, f"'best_of' must be 1, got {json.dumps(best_of)}", param="best_of")
    if body.get("logprobs") not in (None, False) or body.get("echo") not in (None, False):
        raise ApiError(400, "logprobs and echo are not supported by the simulator",
                       param="logprobs")


def _completion_prompt(body: dict[str, object]) -> tuple[str, int]:
    if "prompt" not in body:
        raise ApiError(400, "missing required field 'prompt'", param="prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return prompt, count_tokens(prompt)
    if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
        return "", len(prompt)
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, str) for p in prompt):
        raise ApiError(400, "batched prompts are not supported; send one prompt per request",
                       param="prompt")
    raise _type_error("prompt", "a string or a list of non-negative token ids", prompt)


def _message_content(index: int, content: object) -> str:
    field = f"messages[{index}].content"
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise _type_error(field, "a string or a list of {type: text, text} parts", part)
            texts.append(part["text"])
        return " ".join(texts)
    raise _type_error(field, "a string or a list of text parts", content)


def _chat_messages(body: dict[str, object]) -> list[tuple[str, str]]:
    if "messages" not in body:
        raise ApiError(400, "missing required field 'messages'", param="messages")
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise _type_error("messages", "a non-empty list of messages", messages)
    parsed = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _type_error(f"messages[{index}]", "an object with 'role' and 'content'", message)
        role = message.get("role")
        if role not in _ROLES:
            raise ApiError(400, f"'messages[{index}].role' must be one of {', '.join(_ROLES)}, "
                                f"got {json.dumps(role)}", param=f"messages[{index}].role")
        if "content" not in message:
            raise ApiError(400, f"'messages[{index}]' has no 'content'", param=f"messages[{index}]")
        content = message["content"]
        if content is None and role == "assistant":
            content = ""  # an assistant turn that only called tools
        parsed.append((str(role), _message_content(index, content)))
    return parsed


def parse_generation(kind: Kind, body: dict[str, object]) -> GenerationRequest:
    """Validate a completion or chat-completion body (the model name is checked by the caller)."""
    model = body.get("model")
    if model is None:
        raise ApiError(400, "missing required field 'model'", param="model")
    if not isinstance(model, str) or not model:
        raise _type_error("model", "a non-empty string", model)
    _check_unsupported(body)
    if kind == "completion":
        prompt_text, prompt_tokens = _completion_prompt(body)
        max_tokens = _optional_int(body, "max_tokens")
    else:
        messages = _chat_messages(body)
        prompt_text, prompt_tokens = render_chat(messages), chat_prompt_tokens(messages)
        max_tokens = _optional_int(body, "max_completion_tokens")
        if max_tokens is None:
            max_tokens = _optional_int(body, "max_tokens")
    if prompt_tokens == 0:
        raise ApiError(400, "the prompt is empty; it must hold at least one token", param="prompt")
    stream = _optional_bool(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _type_error("stream_options", "an object", options)
    options = options or {}
    if options and not stream:
        raise ApiError(400, "'stream_options' is only allowed when 'stream' is true",
                       param="stream_options")
    return GenerationRequest(
        kind=kind, model=model, prompt_text=prompt_text, prompt_tokens=prompt_tokens,
        max_tokens=max_tokens, stream=stream,
        include_usage=_optional_bool(options, "include_usage", False),
        continuous_usage=_optional_bool(options, "continuous_usage_stats", False),
        ignore_eos=_optional_bool(body, "ignore_eos", False),
        temperature=_temperature(body), stop=_stop(body),
    )


def resolve_max_tokens(request: GenerationRequest, max_model_len: int) -> int:
    """The output budget, or the vLLM-worded 400 when prompt plus output exceed the context."""
    if request.prompt_tokens >= max_model_len:
        raise ApiError(
            400, f"This model's maximum context length is {max_model_len} tokens. However, your "
                 f"prompt has {request.prompt_tokens} tokens, which leaves no room for output. "
                 "Please reduce the length of the prompt.", param="prompt")
    room = max_model_len - request.prompt_tokens
    if request.max_tokens is None:
        # vLLM: completions default to 16 tokens, chat to whatever the context leaves.
        return min(16, room) if request.kind == "completion" else room
    if request.max_tokens > room:
        field = "max_tokens" if request.kind == "completion" else "max_completion_tokens"
        raise ApiError(
            400, f"This model's maximum context length is {max_model_len} tokens. However, you "
                 f"requested {request.prompt_tokens + request.max_tokens} tokens "
                 f"({request.prompt_tokens} in the prompt, {request.max_tokens} in the "
                 "completion). Please reduce the length of the prompt or completion.", param=field)
    return request.max_tokens
