"""`backend=openai`: drive any OpenAI-compatible server with the workload, over HTTP.

Before the clock starts the endpoint is checked: its URL, the API key's environment variable
(the key itself is read from the environment and written nowhere), and the server's model
list, which must hold `endpoint.model` (or exactly one model when none is named). The replay
then uses the in-process replay's own `Client` thread, so arrivals are identical: open loop
at the workload's times, closed loop when the same user's previous response was delivered,
plus think time; `t_scheduled` is that arrival, whatever the sender is doing. Each arrival
starts an async streaming request to `/v1/completions` with the prompt as token ids (every
backend sees the identical prompt); `t_send` is when its request headers were written to the
socket. Tokens are stamped as their chunks arrive (`stream_tally`), `t_done` when the stream
ends. A request that fails (an HTTP error status, a broken connection, `endpoint.timeout_s`
passed) is recorded with `finish_reason: error` and its error.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedTokenizerBase

from harness.engine.request import Request
from harness.errors import ConfigError
from harness.measure.rundir import RunWriter, read_requests
from harness.runner.backends.base import Backend, peer_inputs, seeds_of
from harness.runner.backends.stream_tally import ESTIMATED_COUNT, ESTIMATED_TIMES, StreamTally
from harness.runner.replay import Client, fail_in_flight, progress_bar, to_request
from harness.runner.settings import api_key_from_env
from workloads.spec import Workload

PROBE_TIMEOUT_S = 10.0
Clock = Callable[[], float]
HEADERS_SENT = ("http11.send_request_headers.started", "http2.send_request_headers.started")


@dataclass(frozen=True)
class EndpointSettings:
    url: str  # base URL without a trailing /v1
    model: str | None
    label: str | None
    api_key_env: str | None
    timeout_s: float
    max_connections: int
    extra_body: dict[str, Any]


def endpoint_settings(node: DictConfig) -> EndpointSettings:
    url = str(node.get("url") or "").rstrip("/").removesuffix("/v1")
    if not url.startswith(("http://", "https://")):
        raise ConfigError("endpoint.url", f"{url!r} must be an http:// or https:// base URL")
    timeout = node.get("timeout_s")
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
        raise ConfigError("endpoint.timeout_s", f"{timeout!r} must be seconds > 0")
    connections = node.get("max_connections")
    if not isinstance(connections, int) or isinstance(connections, bool) or connections < 1:
        raise ConfigError("endpoint.max_connections", f"{connections!r} must be a positive integer")
    extra = node.get("extra_body") or {}
    extra = OmegaConf.to_container(extra, resolve=True) if isinstance(extra, DictConfig) else extra
    if not isinstance(extra, dict):
        raise ConfigError("endpoint.extra_body", f"{extra!r} must be a mapping of request fields")
    model, label, key_env = node.get("model"), node.get("label"), node.get("api_key_env")
    return EndpointSettings(
        url=url,
        model=None if model is None else str(model),
        label=None if label is None else str(label),
        api_key_env=None if key_env is None else str(key_env),
        timeout_s=float(timeout),
        max_connections=connections,
        extra_body=dict(extra),
    )


def auth_headers(settings: EndpointSettings) -> dict[str, str]:
    key = api_key_from_env(settings.api_key_env, "endpoint.api_key_env")
    return {"Authorization": f"Bearer {key}"} if key else {}


async def server_models(
    settings: EndpointSettings, headers: dict[str, str], tls: ssl.SSLContext
) -> list[str]:
    """The ids GET /v1/models lists; a ConfigError when the server cannot be asked. Asked
    with the async client the replay uses, which also readies that path before the clock."""
    try:
        async with httpx.AsyncClient(headers=headers, verify=tls) as http:
            response = await http.get(f"{settings.url}/v1/models", timeout=PROBE_TIMEOUT_S)
    except httpx.HTTPError as error:
        message = f"cannot reach {settings.url} ({error}); start the server or fix the URL"
        raise ConfigError("endpoint.url", message) from None
    if response.status_code in (401, 403):
        raise ConfigError(
            "endpoint.api_key_env", f"{settings.url} refused the key (HTTP {response.status_code})"
        )
    if response.status_code != 200:
        status = response.status_code
        raise ConfigError("endpoint.url", f"GET /v1/models answered HTTP {status}; check the URL")
    return [str(entry["id"]) for entry in response.json().get("data", [])]


def choose_model(settings: EndpointSettings, models: list[str]) -> str:
    if settings.model is not None:
        if settings.model not in models:
            raise ConfigError(
                "endpoint.model", f"{settings.url} serves {models}, not {settings.model!r}"
            )
        return settings.model
    if len(models) != 1:
        raise ConfigError("endpoint.model", f"{settings.url} serves {models}; name one")
    return models[0]


def request_body(request: Request, model: str, extra: dict[str, Any]) -> dict[str, Any]:
    """What is sent: the prompt as token ids, the sampling, and the extensions servers honour
    (`ignore_eos`, `top_k`, per-chunk `token_ids` and running `usage`)."""
    sampling = request.sampling
    body: dict[str, Any] = {
        "model": model,
        "prompt": request.prompt_ids,
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "seed": sampling.seed,
        "ignore_eos": sampling.ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "return_token_ids": True,
    }
    if sampling.top_k:
        body["top_k"] = sampling.top_k
    body.update(extra)
    return body


class _LoopInbox:
    """The `Client` thread's inbox: each arrival starts a request on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, start: Callable[[Request], None]) -> None:
        self.loop = loop
        self.start = start

    def put(self, request: Request) -> None:
        self.loop.call_soon_threadsafe(self.start, request)


class EndpointBackend(Backend):
    def __init__(
        self,
        settings: EndpointSettings,
        model: str,
        models: list[str],
        workload: Workload,
        tokenizer: PreTrainedTokenizerBase,
        model_file: Path | None,
        model_sha256: str | None,
        seeds: dict[str, int],
        tls: ssl.SSLContext,
    ) -> None:
        self.settings = settings
        self.tls = tls
        self.model = model
        self.models = models
        self.workload = workload
        self.tokenizer = tokenizer
        self.model_file = model_file
        self.model_sha256 = model_sha256
        self.seeds = seeds
        self.device = torch.device("cpu")

    @classmethod
    def prepare(cls, cfg: DictConfig) -> EndpointBackend:
        settings = endpoint_settings(cfg.endpoint)
        tls = httpx.create_ssl_context()  # once, before the clock: it takes tens of ms
        models = asyncio.run(server_models(settings, auth_headers(settings), tls))
        model = choose_model(settings, models)
        inputs = peer_inputs(cfg)
        return cls(
            settings,
            model,
            models,
            inputs.workload,
            inputs.tokenizer,
            inputs.model_file,
            inputs.model_sha256,
            seeds_of(cfg),
            tls,
        )

    @property
    def label(self) -> str:
        return self.settings.label or f"openai:{self.model}"

    def describe(self) -> dict[str, Any]:
        sample = request_body(to_request(self.workload.requests[0], 0), self.model, {})
        sample["prompt"] = "<the request's prompt token ids>"
        sample.update(self.settings.extra_body)
        return {
            "strategy": {"name": self.label, "backend": "openai", "model": self.model},
            "backend": {
                "kind": "openai",
                "url": self.settings.url,
                "model": self.model,
                "server_models": self.models,
                "api_key_env": self.settings.api_key_env,
                "request_body": sample,
                "timeout_s": self.settings.timeout_s,
                "max_connections": self.settings.max_connections,
            },
        }

    def replay(
        self, clock: Callable[[], float], writer: RunWriter, run_dir: Path, progress: bool
    ) -> None:
        del run_dir
        asyncio.run(self._replay(clock, writer, progress))

    async def _replay(self, clock: Callable[[], float], writer: RunWriter, progress: bool) -> None:
        requests = [to_request(spec, i) for i, spec in enumerate(self.workload.requests)]
        loop = asyncio.get_running_loop()
        finished: asyncio.Queue[Request] = asyncio.Queue()
        in_flight: dict[Request, asyncio.Task[None]] = {}
        limits = httpx.Limits(
            max_connections=self.settings.max_connections,
            max_keepalive_connections=self.settings.max_connections,
        )
        async with httpx.AsyncClient(
            base_url=self.settings.url,
            headers=auth_headers(self.settings),
            limits=limits,
            timeout=httpx.Timeout(self.settings.timeout_s),
            verify=self.tls,
        ) as http:

            def start(request: Request) -> None:
                task = loop.create_task(self._serve(http, request, clock))
                task.add_done_callback(lambda _: finished.put_nowait(request))
                in_flight[request] = task

            inbox = _LoopInbox(loop, start)
            workload = self.workload
            client = Client(requests, clock, inbox, workload.concurrency, workload.think_s)
            bar = progress_bar(len(requests), progress)
            client.start()
            try:
                for _ in requests:
                    request = await finished.get()
                    del in_flight[request]
                    record = request.record()
                    record.output_len = len(record.token_times)
                    writer.request(record)
                    client.completed(request)
                    bar.update(1)
            except BaseException as exc:
                for task in in_flight.values():
                    task.cancel()
                fail_in_flight(list(in_flight), f"{type(exc).__name__}: {exc}", clock, writer)
                raise
            finally:
                client.stop()
                bar.close()

    async def _serve(self, http: httpx.AsyncClient, request: Request, clock: Clock) -> None:
        """Send one request and read its stream into the request; never raises."""
        try:
            await asyncio.wait_for(self._stream(http, request, clock), self.settings.timeout_s)
        except asyncio.TimeoutError:
            limit = self.settings.timeout_s
            request.finish("error", f"no complete response within endpoint.timeout_s={limit:g}")
        except Exception as exc:  # noqa: BLE001  (recorded with the request, the run goes on)
            request.finish("error", f"{type(exc).__name__}: {exc}")
        if request.t_done is None:
            request.t_done = clock()

    async def _stream(self, http: httpx.AsyncClient, request: Request, clock: Clock) -> None:
        async def trace(event: str, info: dict[str, Any]) -> None:
            del info
            if event in HEADERS_SENT:
                request.t_send = clock()

        body = request_body(request, self.model, self.settings.extra_body)
        tally = StreamTally()
        async with http.stream(
            "POST",
            "/v1/completions",
            json=body,
            headers={"X-Request-Id": request.id},
            extensions={"trace": trace},
        ) as response:
            if response.status_code != 200:
                await response.aread()
                request.finish("error", f"HTTP {response.status_code}: {_message(response)}")
                return
            async for line in response.aiter_lines():
                now = clock()
                data = line.removeprefix("data:").strip() if line.startswith("data:") else None
                if not data:
                    continue
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    request.finish("error", f"the stream reported: {chunk['error']}")
                    return
                tally.add(chunk, now)
        request.t_done = clock()
        settled = tally.settle(self.tokenizer)
        request.output_ids = settled.output_ids
        request.token_times = settled.token_times
        request.counters.update(settled.counters)
        reason = settled.finish_reason
        if reason in ("stop", "length"):
            request.finish(reason)
        else:
            request.finish("error", f"the stream ended with finish_reason {reason!r}")

    def flags(self, run_dir: Path) -> list[str]:
        counters = [record.counters for record in read_requests(run_dir)]
        flags = []
        estimated_times = sum(ESTIMATED_TIMES in str(c.get("token_times_from")) for c in counters)
        if estimated_times:
            flags.append(
                f"{estimated_times} requests: tokens per chunk not reported by the server, "
                "counted as one per chunk"
            )
        retokenised = sum(c.get("token_count_from") == ESTIMATED_COUNT for c in counters)
        if retokenised:
            flags.append(f"{retokenised} requests: no usage from the server, output re-tokenised")
        return flags


def _message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
    except ValueError:
        return response.text[:300]
    if isinstance(error, dict):
        return str(error.get("message"))
    return str(error)
