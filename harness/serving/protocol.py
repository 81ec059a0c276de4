"""The OpenAI request bodies servelab accepts, and the response bodies and chunks it sends.

Bodies are pydantic models, so malformed JSON and values out of range become 400 errors
before any work (see `errors`). Fields servers commonly add and servelab honours:
`ignore_eos` and `top_k` (vLLM and llama.cpp read them too), `return_token_ids` (each choice
then carries the token ids, as vLLM's option of that name does), and
`stream_options.continuous_usage_stats` (every chunk carries the running `usage`). Unknown
fields are ignored, as most OpenAI-compatible servers do. Only what servelab can serve
faithfully is accepted: one prompt per request, `n` choices of it (parallel sampling) in a
whole response but one in a stream, no stop strings, no penalties, no logprobs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False  # a last chunk with `usage` and no choices
    continuous_usage_stats: bool = False  # `usage` on every chunk (running totals)


class Sampling(BaseModel):
    """What both endpoints share: the sampling fields and their ranges."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)  # 0 and -1: off
    seed: int | None = None
    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    ignore_eos: bool = False
    return_token_ids: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    def usage_every_chunk(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)

    def usage_at_end(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """The token counts, with the prompt tokens served from the prefix cache as vLLM and the
    OpenAI API report them (`prompt_tokens_details.cached_tokens`)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


@dataclass(frozen=True)
class Choice:
    """One sample of a whole response: its text, why it ended, its token ids."""

    text: str
    finish_reason: str
    token_ids: list[int]


def _choice(chat: bool, index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
    content: dict[str, Any] = (
        {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
    )
    return {"index": index, **content, "logprobs": None, "finish_reason": finish_reason}


def response_body(
    chat: bool,
    rid: str,
    model: str,
    choices: list[Choice],
    return_token_ids: bool,
    prompt_tokens: int,
    cached_tokens: int,
) -> dict[str, Any]:
    """A whole (non-streaming) completion or chat completion: one choice per sample, the
    prompt counted once and every sample's tokens in `completion_tokens`."""
    bodies = []
    for index, choice in enumerate(choices):
        body = _choice(chat, index, choice.text, choice.finish_reason)
        if return_token_ids:
            body["token_ids"] = choice.token_ids
        bodies.append(body)
    return {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": bodies,
        "usage": usage(prompt_tokens, sum(len(c.token_ids) for c in choices), cached_tokens),
    }


def chunk_body(
    chat: bool,
    rid: str,
    model: str,
    delta: dict[str, Any] | None,
    finish_reason: str | None = None,
    running_usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One streamed chunk. `delta`: the choice's new `text` or chat `content` (and any
    `role`, `token_ids`); None for the usage-only chunk at the end, which has no choices."""
    choices: list[dict[str, Any]] = []
    if delta is not None:
        if chat:
            choice = {"index": 0, "delta": {k: v for k, v in delta.items() if k != "token_ids"}}
        else:
            choice = {"index": 0, "text": delta.get("content", "")}
        if "token_ids" in delta:
            choice["token_ids"] = delta["token_ids"]
        choice["logprobs"] = None
        choice["finish_reason"] = finish_reason
        choices.append(choice)
    body: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
    }
    if running_usage is not None:
        body["usage"] = running_usage
    return body
