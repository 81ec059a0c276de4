"""The HTTP routes: OpenAI's completions, chat completions and models, plus /health and
/metrics, on FastAPI.

A request's arrival is stamped when its headers reach the app, before the body is read, so
the server's own records (and its TTFT) start where a client's transport ends. Each
completion is checked (`intake`), handed to the engine loop, and answered either as server-
sent events, one chunk per engine step that produced tokens (with the step's token ids when
asked), or as one body when the response is delivered. A client that goes away (a closed
stream, or a dropped connection while waiting for a whole body) cancels its request, which
frees its KV before the next step.

Load is bounded before it costs anything: a body larger than `max_body_bytes` is refused
with 413 as soon as its declared length (or, streamed in chunks, its running length) passes
the bound, so no prompt text beyond it is read or tokenised; the prompt and
`prompt + max_tokens` are bounded by the context (`intake`); and a request beyond the engine
loop's `max_in_flight` is refused with 429, which OpenAI clients retry after a pause.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from transformers import PreTrainedTokenizerBase

from servelab.base.records import SUCCESS
from servelab.harness.serving import errors
from servelab.harness.serving.engine_loop import Done, EngineLoop, Stream
from servelab.harness.serving.errors import APIError
from servelab.harness.serving.intake import Intake, ModelCard
from servelab.harness.serving.metrics import Metrics
from servelab.harness.serving.protocol import (
    ChatRequest,
    Choice,
    CompletionRequest,
    Sampling,
    chunk_body,
    response_body,
    usage,
)
from servelab.harness.serving.text import TextStream

ARRIVAL = "servelab.arrival"
MAX_BODY_BYTES = 1 << 20  # unless the server is told otherwise (`serve.max_body`)


@dataclass
class ServerState:
    loop: EngineLoop
    intake: Intake
    tokenizer: PreTrainedTokenizerBase
    card: ModelCard
    clock: Callable[[], float]
    api_key: str | None
    max_body_bytes: int = MAX_BODY_BYTES


class ArrivalStamp:
    """ASGI middleware: the time a request's headers arrived, before anything else runs."""

    def __init__(self, app: ASGIApp, clock: Callable[[], float]) -> None:
        self.app = app
        self.clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[ARRIVAL] = self.clock()
        await self.app(scope, receive, send)


class BodyLimit:
    """ASGI middleware: read the request body first, and refuse one above `limit` bytes with
    413 and the OpenAI error body: at once from its content-length header, or as soon as a
    chunked body's running length passes it. The app then reads the buffered body (and,
    after it, the connection's own messages: a client's disconnect)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await self._refuse(scope, send)
            return
        buffered: list[Message] = []
        size = 0
        while True:
            message = await receive()
            buffered.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.limit:
                await self._refuse(scope, send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return buffered.pop(0) if buffered else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, send: Send) -> None:
        refused = APIError(
            413,
            f"the request body is larger than this server accepts ({self.limit} bytes)",
            code="request_too_large",
        )
        response = JSONResponse(refused.body(), status_code=413)

        async def nothing() -> Message:
            return {"type": "http.disconnect"}

        await response(scope, nothing, send)


def create_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        del app
        state.loop.start(asyncio.get_running_loop())
        yield
        await asyncio.to_thread(state.loop.stop)

    app = FastAPI(
        title="servelab", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.add_middleware(BodyLimit, limit=state.max_body_bytes)
    app.add_middleware(ArrivalStamp, clock=state.clock)
    errors.install(app)
    metrics = Metrics(state.loop)

    def authorize(raw: Request) -> None:
        if state.api_key is None:
            return
        given = raw.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), state.api_key.encode()):
            raise APIError(401, "Incorrect API key provided", code="invalid_api_key")

    @app.get("/health")
    async def health() -> Response:
        if state.loop.alive:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "failed", "error": state.loop.error}, status_code=503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/v1/models", dependencies=[Depends(authorize)])
    async def models() -> dict[str, Any]:
        card = state.card
        entry = {
            "id": card.name,
            "object": "model",
            "created": card.created,
            "owned_by": "servelab",
            "max_model_len": card.max_context,
        }
        return {"object": "list", "data": [entry]}

    @app.post("/v1/completions", dependencies=[Depends(authorize)])
    async def completions(body: CompletionRequest, raw: Request) -> Response:
        return await _respond(state, body, raw, chat=False)

    @app.post("/v1/chat/completions", dependencies=[Depends(authorize)])
    async def chat_completions(body: ChatRequest, raw: Request) -> Response:
        return await _respond(state, body, raw, chat=True)

    return app


async def _respond(state: ServerState, body: Sampling, raw: Request, chat: bool) -> Response:
    if not state.loop.alive:
        raise APIError(503, f"the engine loop stopped: {state.loop.error}", kind="server_error")
    rid = raw.headers.get("x-request-id") or f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    arrival = raw.scope.get(ARRIVAL, state.clock())
    if chat:
        assert isinstance(body, ChatRequest)
        request = state.intake.chat(body, rid, arrival)
    else:
        assert isinstance(body, CompletionRequest)
        request = state.intake.completion(body, rid, arrival)
    stream = state.loop.submit(request)
    if stream is None:
        raise APIError(
            429,
            f"the server has {state.loop.max_in_flight} requests in flight, its limit; retry",
            code="rate_limit_exceeded",
            kind="requests",
        )
    if body.stream:
        events = _sse(state, stream, body, chat)
        headers = {"x-request-id": rid}
        return ClosingStream(events, media_type="text/event-stream", headers=headers)
    return await _whole(state, stream, body, chat, raw)


async def _whole(
    state: ServerState, stream: Stream, body: Sampling, chat: bool, raw: Request
) -> Response:
    """Wait for the delivered response; cancel it if the client hangs up meanwhile."""
    watcher = asyncio.create_task(_cancel_on_disconnect(state, stream, raw))
    try:
        while True:
            event = await stream.events.get()
            if isinstance(event, Done):
                break
    finally:
        watcher.cancel()
    if event.finish_reason == "cancelled":
        return Response(status_code=499)  # nobody is listening any more
    if event.finish_reason not in SUCCESS:
        raise APIError(500, f"the request failed: {event.error}", kind="server_error")
    request = stream.request
    choices = [
        Choice(
            state.tokenizer.decode(sample.output_ids, skip_special_tokens=True),
            sample.finish_reason or event.finish_reason,
            sample.output_ids,
        )
        for sample in request.every_sample  # the engine is done with them all
    ]
    payload = response_body(
        chat,
        request.id,
        state.card.name,
        choices,
        body.return_token_ids,
        request.prompt_len,
        request.cached_prompt_tokens,
    )
    return JSONResponse(payload)


async def _cancel_on_disconnect(state: ServerState, stream: Stream, raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass
    state.loop.cancel(stream)


def _event(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


class ClosingStream(StreamingResponse):
    """A streamed response that closes its event generator as soon as it ends, however it
    ends. When the client is gone, the ASGI server reports it only as a failed send (spec
    2.4): the generator is then suspended at its `yield`, and its `finally`, which cancels the
    request and frees its KV, would wait for the garbage collector to finalise it (at once
    when nothing else refers to it, later when an exception's traceback does: the cause of
    test_client_gone_mid_stream_frees_its_kv failing now and then)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()


async def _sse(
    state: ServerState, stream: Stream, body: Sampling, chat: bool
) -> AsyncIterator[str]:
    """Server-sent events: a chunk per step's tokens, the finish, usage, `[DONE]`. Closing
    the generator early (the client went away) cancels the request."""
    rid, model, prompt_len = stream.request.id, state.card.name, stream.request.prompt_len
    text = TextStream(state.tokenizer)
    every = body.usage_every_chunk()
    finished = False

    def counts() -> dict[str, Any]:  # the prefix cache's share is known once admitted
        return usage(prompt_len, len(text.ids), stream.request.cached_prompt_tokens)

    def running() -> dict[str, Any] | None:
        return counts() if every else None

    try:
        if chat:
            role = {"role": "assistant", "content": ""}
            yield _event(chunk_body(chat, rid, model, role, None, running()))
        while True:
            event = await stream.events.get()
            if isinstance(event, Done):
                break
            delta: dict[str, Any] = {"content": text.add(event.ids)}
            if body.return_token_ids:
                delta["token_ids"] = event.ids
            yield _event(chunk_body(chat, rid, model, delta, None, running()))
        finished = True
        if event.finish_reason not in SUCCESS:
            refused = APIError(500, f"the request failed: {event.error}", kind="server_error")
            yield _event(refused.body())
        else:
            last: dict[str, Any] = {"content": text.flush()}
            if body.return_token_ids:
                last["token_ids"] = []
            yield _event(chunk_body(chat, rid, model, last, event.finish_reason, running()))
            if body.usage_at_end():
                yield _event(chunk_body(chat, rid, model, None, None, counts()))
        yield _event("[DONE]")
    finally:
        if not finished:
            state.loop.cancel(stream)
