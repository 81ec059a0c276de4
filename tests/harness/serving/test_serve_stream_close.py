"""A streamed response whose client is gone closes its event generator at once.

The ASGI server reports a vanished client only as a failed send (spec 2.4); the event
generator is then suspended at its `yield`. Its `finally` cancels the request and frees its
KV, so it must run when the response ends, not whenever the garbage collector finalises the
generator. Garbage collection is switched off here so that only an explicit close can run it.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator

import pytest
from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse

from servelab.harness.serving.app import ClosingStream

SCOPE = {"type": "http", "asgi": {"spec_version": "2.4"}, "method": "POST", "path": "/"}


def _serve_to_a_vanished_client(response_class: type[StreamingResponse]) -> list[str]:
    events: list[str] = []

    async def chunks() -> AsyncIterator[str]:
        try:
            while True:
                yield "data: token\n\n"
        finally:
            events.append("closed")

    async def receive() -> dict:
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            raise OSError("the client went away")  # what uvicorn's send does then

    async def main() -> None:
        generator = chunks()  # still referred to here, as a traceback holding a frame would
        response = response_class(generator, media_type="text/event-stream")
        with pytest.raises(ClientDisconnect):
            await response(SCOPE, receive, send)
        events.append("response ended")

    gc.disable()
    try:
        asyncio.run(main())
    finally:
        gc.enable()
    return events


def test_the_event_generator_is_closed_when_the_response_ends() -> None:
    assert _serve_to_a_vanished_client(ClosingStream) == ["closed", "response ended"]


def test_a_plain_streamed_response_leaves_it_to_the_garbage_collector() -> None:
    """The mechanism of the intermittent failure: without the explicit close, the generator
    closed only after the response ended (here, when asyncio.run finalised it)."""
    assert _serve_to_a_vanished_client(StreamingResponse)[0] == "response ended"
