"""`servelab serve`: the engine of one strategy behind an OpenAI-compatible HTTP server.

The same configuration tree as a run (`model`, `engine`, `strategy`), plus the `serve` node:
address, the model name clients send, an optional API key, an optional record directory.
"""

from __future__ import annotations

from servelab.harness.run.compose import compose

SUMMARY = "an OpenAI-compatible HTTP server around the engine of one strategy"
USAGE = """usage: servelab serve [strategy=NAME] [model=NAME] [serve.port=8000] [OVERRIDE ...]

Serves /v1/completions and /v1/chat/completions (streaming or not), /v1/models, /health and
/metrics (Prometheus text) on serve.host (127.0.0.1 unless told otherwise) and serve.port
(0: any free port; the line 'servelab: serving ... at URL' names it). serve.api_key_env=VAR
requires the key held by VAR; serve.record_dir=DIR writes what the engine served there
(requests.jsonl, steps.jsonl). SIGINT or SIGTERM stops it cleanly. Measure it, or any other
OpenAI-compatible server, with: servelab backend=openai endpoint.url=URL"""


def main(args: list[str]) -> None:
    from servelab.harness.serving.server import serve

    serve(compose(args))
