"""The event loop and HTTP client one `backend=openai` run uses, opened before its clock.

The client is aiohttp's: its connection pool hands out connections in constant time, where
httpx's scans every connection per request, which made a burst of arrivals hundreds of
milliseconds late on a loaded machine. Setting up the client, the first pass through the
async stack and each TCP connection cost milliseconds; paid during the replay they would
make the first arrivals late. So the session is opened while the run is prepared: it asks
the server for its model list through the same client, and opens as many keep-alive
connections as requests are due at once when the replay starts (the offline burst, or the
closed loop's users), up to `endpoint.max_connections`. A trace hook stamps each request's
`t_send` when its headers are written.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, TypeVar

import aiohttp

from servelab.base.errors import ConfigError
from servelab.engine.request import Request
from servelab.harness.run.backends.endpoint_settings import EndpointSettings, auth_headers

PROBE_TIMEOUT_S = 10.0
READ_BUFFER = 1 << 20  # longest streamed line accepted (a chunk with timings and usage)
T = TypeVar("T")


@dataclass(frozen=True)
class SendStamp:
    """What the trace hook needs to stamp a request's `t_send`."""

    request: Request
    clock: Callable[[], float]


async def _headers_sent(
    session: aiohttp.ClientSession, context: SimpleNamespace, params: object
) -> None:
    del session, params
    stamp = context.trace_request_ctx
    if isinstance(stamp, SendStamp):
        stamp.request.t_send = stamp.clock()


class HTTPSession:
    def __init__(self, settings: EndpointSettings) -> None:
        self.settings = settings
        self.loop = asyncio.new_event_loop()
        self.client = self.run(self._open())

    async def _open(self) -> aiohttp.ClientSession:
        trace = aiohttp.TraceConfig()
        trace.on_request_headers_sent.append(_headers_sent)
        return aiohttp.ClientSession(
            headers=auth_headers(self.settings),
            connector=aiohttp.TCPConnector(limit=self.settings.max_connections),
            timeout=aiohttp.ClientTimeout(total=None),
            trace_configs=[trace],
            read_bufsize=READ_BUFFER,
        )

    def url(self, path: str) -> str:
        return f"{self.settings.url}{path}"

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(work)

    def close(self) -> None:
        self.run(self.client.close())
        self.run(self.loop.shutdown_asyncgens())
        self.loop.close()

    def models(self) -> list[str]:
        """The ids GET /v1/models lists; a ConfigError when the server cannot be asked."""
        url = self.settings.url
        try:
            status, body = self.run(self._get_models())
        except (TimeoutError, aiohttp.ClientError) as error:
            reason = f"{type(error).__name__}: {error}"
            message = f"cannot reach {url} ({reason}); start the server or fix the URL"
            raise ConfigError("endpoint.url", message) from None
        if status in (401, 403):
            raise ConfigError("endpoint.api_key_env", f"{url} refused the key (HTTP {status})")
        if status != 200:
            message = f"GET /v1/models answered HTTP {status}; check the URL"
            raise ConfigError("endpoint.url", message)
        return [str(entry["id"]) for entry in json.loads(body).get("data", [])]

    async def _get_models(self) -> tuple[int, str]:
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
        async with self.client.get(self.url("/v1/models"), timeout=timeout) as response:
            return response.status, await response.text()

    def open_connections(self, count: int) -> None:
        """Open `count` keep-alive connections (as many concurrent GET /v1/models)."""
        count = min(count, self.settings.max_connections)

        async def probe() -> None:
            await asyncio.gather(*(self._get_models() for _ in range(count)))

        self.run(probe())
