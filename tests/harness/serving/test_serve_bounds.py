"""The server's bounds on what one client can make it do, in process on the tiny model: the
loopback default, the body size (413), the prompt and `prompt + max_tokens` against the
context and `max_tokens` itself (400), and requests in flight at once (429), each answered
with the status and error body OpenAI clients expect while the server keeps serving."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from servelab.base.errors import ConfigError
from servelab.harness.run.compose import compose
from servelab.harness.run.loop import EngineDriver
from servelab.harness.serving.app import ServerState, create_app
from servelab.harness.serving.engine_loop import EngineLoop
from servelab.harness.serving.intake import Intake, ModelCard
from servelab.harness.serving.server import serve_settings
from tests.tiny import make_engine, strategy, tiny_model

MODEL = "tiny"
CONTEXT = 512  # the tiny shape's
BODY_LIMIT = 4096
IN_FLIGHT = 1


class LetterTokenizer:
    """Enough of a tokenizer for token-id prompts: ids decode to letters."""

    chat_template = None

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        del skip_special_tokens
        return "".join(chr(97 + i % 26) for i in ids)

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) % 26 + 3 for c in text]}


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[TestClient, EngineLoop]]:
    engine = make_engine(tiny_model(), strategy("iteration", "paged"), kv_slots=1024)
    loop = EngineLoop(EngineDriver(engine), max_in_flight=IN_FLIGHT, wait_s=0.01)
    card = ModelCard(MODEL, CONTEXT, engine.runner.model.config.vocab_size, 0)
    tokenizer = LetterTokenizer()
    state = ServerState(
        loop=loop,
        intake=Intake(engine, tokenizer, card),  # type: ignore[arg-type]
        tokenizer=tokenizer,  # type: ignore[arg-type]
        card=card,
        clock=time.perf_counter,
        api_key=None,
        max_body_bytes=BODY_LIMIT,
    )
    with TestClient(create_app(state)) as client:
        yield client, loop


def _ok(client: TestClient) -> None:
    body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 2


def _error(response, status: int, param: str | None, code: str | None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, code)
    assert error["message"] and error["type"]


def test_binds_loopback_unless_told() -> None:
    assert serve_settings(compose([]).serve).host == "127.0.0.1"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("serve.max_body=huge", "serve.max_body: 'huge' is not a size; write e.g. 256MiB, 2GB"),
        ("serve.max_body=0.9", "serve.max_body: 0.9 is below 1024 bytes"),
        ("serve.max_concurrent_requests=0", "serve.max_concurrent_requests: 0 must be a positive"),
    ],
)
def test_bounds_are_checked_before_any_work(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        serve_settings(compose([override]).serve)
    assert str(refused.value).startswith(message)


def test_body_over_the_limit_is_refused_whole_or_chunked(
    server: tuple[TestClient, EngineLoop],
) -> None:
    client, _ = server
    big = {"model": MODEL, "prompt": "x" * BODY_LIMIT, "max_tokens": 2}
    _error(client.post("/v1/completions", json=big), 413, None, "request_too_large")

    def chunks() -> Iterator[bytes]:  # no content-length: the running length decides
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(BODY_LIMIT // 512 + 1):
            yield b"y" * 512
        yield b'"}'

    headers = {"content-type": "application/json"}
    chunked = client.post("/v1/completions", content=chunks(), headers=headers)
    _error(chunked, 413, None, "request_too_large")
    _ok(client)


@pytest.mark.parametrize(
    ("what", "prompt", "max_tokens", "param", "code"),
    [
        ("prompt fills the context", [5] * CONTEXT, 1, "prompt", "context_length_exceeded"),
        ("prompt + max_tokens past it", [5] * 10, CONTEXT, "max_tokens", "context_length_exceeded"),
        ("max_tokens of 0", [5] * 10, 0, "max_tokens", None),
        ("max_tokens negative", [5] * 10, -3, "max_tokens", None),
    ],
)
def test_prompt_and_max_tokens_are_bounded(
    server: tuple[TestClient, EngineLoop],
    what: str,
    prompt: list[int],
    max_tokens: int,
    param: str,
    code: str | None,
) -> None:
    client, _ = server
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}
    response = client.post("/v1/completions", json=body)
    _error(response, 400, param, code)
    assert response.json()["error"]["type"] == "invalid_request_error", what


def test_requests_beyond_the_in_flight_bound_get_429(
    server: tuple[TestClient, EngineLoop],
) -> None:
    client, loop = server
    long = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 500, "ignore_eos": True}
    answers = []
    first = threading.Thread(
        target=lambda: answers.append(client.post("/v1/completions", json=long))
    )
    first.start()
    deadline = time.monotonic() + 30
    while loop.in_flight < IN_FLIGHT:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    refused = client.post("/v1/completions", json={**long, "max_tokens": 2})
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    first.join(60)
    assert answers[0].status_code == 200
    assert answers[0].json()["usage"]["completion_tokens"] == 500
    assert loop.in_flight == 0
    _ok(client)
