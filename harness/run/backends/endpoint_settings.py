"""What `backend=openai` is told (the `endpoint` node, checked) and what it sends.

Every request goes to `/v1/completions` with the prompt as token ids, so every backend sees
the identical prompt, streamed, with the extensions servers honour where they know them
(`ignore_eos`, `top_k`, per-chunk `token_ids`, running `usage`) and `endpoint.extra_body`.
The API key is read from the environment variable the config names, never from the config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from servelab.base.errors import ConfigError
from servelab.engine.request import Request
from servelab.harness.run.schema import checked
from servelab.harness.run.settings import api_key_from_env


@dataclass(frozen=True)
class EndpointSettings:
    url: str  # base URL without a trailing /v1
    model: str | None
    label: str | None
    api_key_env: str | None
    timeout_s: float
    max_connections: int
    extra_body: dict[str, Any]
    workers: int | str  # processes sending the schedule, or "auto" (`endpoint_workers`)
    metrics_period_s: float | None  # scrape the server's /metrics this often; None: never


def endpoint_settings(node: DictConfig) -> EndpointSettings:
    url = str(node.get("url") or "").rstrip("/").removesuffix("/v1")
    if not url.startswith(("http://", "https://")):
        raise ConfigError("endpoint.url", f"{url!r} must be an http:// or https:// base URL")
    period = checked(node, "endpoint.metrics_period_s")
    model, label, key_env = node.get("model"), node.get("label"), node.get("api_key_env")
    return EndpointSettings(
        url=url,
        model=None if model is None else str(model),
        label=None if label is None else str(label),
        api_key_env=None if key_env is None else str(key_env),
        timeout_s=float(checked(node, "endpoint.timeout_s")),
        max_connections=checked(node, "endpoint.max_connections"),
        extra_body=checked(node, "endpoint.extra_body", {}),
        workers=checked(node, "endpoint.workers", "auto"),
        metrics_period_s=None if period is None else float(period),
    )


def auth_headers(settings: EndpointSettings) -> dict[str, str]:
    key = api_key_from_env(settings.api_key_env, "endpoint.api_key_env")
    return {"Authorization": f"Bearer {key}"} if key else {}


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
