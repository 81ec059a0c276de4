"""From an API request to an engine request, or to the 4xx that says why not.

Every check runs on the front end before the request reaches the engine loop, so a bad
request never costs the others anything: the model name, one prompt and one choice, token
ids inside the vocabulary, the prompt and `prompt + max_tokens` inside the context, options
servelab does not implement (stop strings, penalties, logprobs), and finally the engine's own
verdict (`Engine.rejection`: a request the KV cache or the step budget can never hold). The
checks only read settings the engine never changes, so they are safe beside a running step.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from servelab.engine.engine import Engine
from servelab.engine.request import Request, SamplingParams
from servelab.harness.serving.errors import APIError
from servelab.harness.serving.protocol import ChatRequest, CompletionRequest, Sampling

COMPLETION_DEFAULT_MAX_TOKENS = 16  # the OpenAI completions API's default


@dataclass(frozen=True)
class ModelCard:
    """The served model as /v1/models lists it."""

    name: str
    max_context: int
    vocab_size: int
    created: int


class Intake:
    def __init__(self, engine: Engine, tokenizer: PreTrainedTokenizerBase, card: ModelCard) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.card = card
        self._seeds = itertools.count()

    def completion(self, body: CompletionRequest, rid: str, arrival: float) -> Request:
        self._common(body)
        for name in ("echo", "logprobs", "best_of"):
            if getattr(body, name) not in (None, False, 1):
                raise APIError(400, f"{name} is not supported by servelab", param=name)
        prompt = self._prompt_ids(body.prompt)
        max_tokens = body.max_tokens or COMPLETION_DEFAULT_MAX_TOKENS
        return self._request(body, rid, arrival, prompt, max_tokens)

    def chat(self, body: ChatRequest, rid: str, arrival: float) -> Request:
        self._common(body)
        if body.logprobs:
            raise APIError(400, "logprobs is not supported by servelab", param="logprobs")
        prompt = self._chat_ids(body)
        self._check_prompt(prompt, "messages")
        limit = body.max_completion_tokens or body.max_tokens
        max_tokens = limit or self.card.max_context - len(prompt)
        return self._request(body, rid, arrival, prompt, max_tokens)

    def _common(self, body: Sampling) -> None:
        if body.model != self.card.name:
            raise APIError(
                404,
                f"The model `{body.model}` does not exist; this server serves `{self.card.name}`",
                param="model",
                code="model_not_found",
            )
        if body.n != 1 and body.stream:
            raise APIError(400, "a stream carries one choice: send n > 1 without stream", "n")
        if body.stop:
            raise APIError(
                400, "stop strings are not supported; use max_tokens or end-of-sequence", "stop"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(body, name) != 0:
                raise APIError(400, f"{name} is not supported by servelab; send 0", param=name)

    def _prompt_ids(self, prompt: str | list[int] | list[str] | list[list[int]]) -> list[int]:
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise APIError(400, "send one prompt per request", param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = self.tokenizer(prompt)["input_ids"] if prompt else []
        else:
            ids = list(prompt)
        self._check_prompt(ids, "prompt")
        return ids

    def _chat_ids(self, body: ChatRequest) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise APIError(400, "this model has no chat template; use /v1/completions", "messages")
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            ids = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        except Exception as exc:  # noqa: BLE001  (the template refuses these messages)
            message = f"the chat template refused the messages: {exc}"
            raise APIError(400, message, "messages") from None
        return list(ids)

    def _check_prompt(self, ids: list[int], param: str) -> None:
        if not ids:
            raise APIError(400, "the prompt is empty", param=param)
        vocab = self.card.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is outside the vocabulary (0..{vocab - 1})", param)
        context = self.card.max_context
        if len(ids) >= context:
            raise APIError(
                400,
                f"This model's maximum context length is {context} tokens; the prompt has "
                f"{len(ids)}. Shorten the prompt.",
                param=param,
                code="context_length_exceeded",
            )

    def _request(
        self, body: Sampling, rid: str, arrival: float, prompt: list[int], max_tokens: int
    ) -> Request:
        context = self.card.max_context
        if len(prompt) + max_tokens > context:
            raise APIError(
                400,
                f"This model's maximum context length is {context} tokens, but {len(prompt)} "
                f"prompt tokens + {max_tokens} max_tokens were requested; lower max_tokens.",
                param="max_tokens",
                code="context_length_exceeded",
            )
        sampling = SamplingParams(
            max_tokens=max_tokens,
            temperature=body.temperature,
            top_k=max(body.top_k, 0),
            top_p=body.top_p,
            ignore_eos=body.ignore_eos,
            seed=body.seed if body.seed is not None else next(self._seeds),
            n=body.n,
        )
        request = Request(rid, prompt, sampling, t_scheduled=arrival, t_send=arrival)
        rejection = self.engine.rejection(request)
        if rejection is not None:
            raise APIError(
                400, f"this server can never serve the request: {rejection.reason}", "max_tokens"
            )
        return request
