"""An OpenAI-compatible server that answers at once: every completion streams a fixed number of
tokens the moment it is asked, so that a run against it measures the client alone (its send
lag, the rate it holds), never a model. For the load generator's self-benchmark
(`scripts/client_bench.py`) and the tests; it serves nothing a user would want to read.

    python -m servelab.harness.serving.fake_server [--port 0] [--tokens 8]

prints `fake server: streaming N tokens at http://127.0.0.1:PORT` once it listens.
"""

from __future__ import annotations

import argparse
import json
import socket

from aiohttp import web

MODEL = "fake"
BANNER = "fake server: streaming "


def chunk(index: int, last: bool) -> bytes:
    """One `data:` line of the stream: token `index`, with the running usage."""
    choice = {"index": 0, "text": " x", "token_ids": [index + 1],
              "finish_reason": "length" if last else None}  # fmt: skip
    body = {"object": "text_completion", "model": MODEL, "choices": [choice],
            "usage": {"completion_tokens": index + 1}}  # fmt: skip
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def make_app(tokens: int) -> web.Application:
    """The app: `/v1/models` and a streamed `/v1/completions` of `tokens` tokens."""
    stream = b"".join(chunk(i, i == tokens - 1) for i in range(tokens)) + b"data: [DONE]\n\n"

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(stream)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args()
    if args.tokens < 1:
        raise SystemExit("fake server: --tokens must be 1 or more")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(4096)  # connections wait in the backlog until the loop accepts them
    host, port = sock.getsockname()[:2]
    print(f"{BANNER}{args.tokens} tokens at http://{host}:{port}", flush=True)
    web.run_app(make_app(args.tokens), sock=sock, print=None, access_log=None)


if __name__ == "__main__":
    main()
