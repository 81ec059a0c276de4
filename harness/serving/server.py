"""`servelab serve`: bind, load, build the engine, and run the app under uvicorn.

Everything that can be wrong with the input (the config, the API key's environment variable,
the address) is found before the model loads. The socket is bound first, so `serve.port=0`
picks a free port, and the line `servelab: serving MODEL (STRATEGY) at http://HOST:PORT` says
which once the server accepts requests. SIGINT or SIGTERM stops accepting, lets requests in
flight finish for `serve.shutdown_grace_s`, then stops the engine loop, which ends every
response still open with an error ("the server is shutting down"), and exits with status 0.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import uvicorn
from omegaconf import DictConfig, OmegaConf

from servelab.base.errors import ConfigError
from servelab.engine.kv_cache import parse_bytes
from servelab.harness.measure.rundir import RunWriter
from servelab.harness.run.loop import EngineDriver
from servelab.harness.run.schema import checked
from servelab.harness.run.settings import api_key_from_env
from servelab.harness.run.spec import engine_spec
from servelab.harness.run.startup import start_engine
from servelab.harness.serving.app import ServerState, create_app
from servelab.harness.serving.engine_loop import EngineLoop
from servelab.harness.serving.intake import Intake, ModelCard

MIN_BODY_BYTES = 1024  # the smallest body bound that still takes an ordinary request
CUT_AFTER_S = 5.0  # after the grace: how long ended responses may flush before a cut

BANNER = "servelab: serving "  # the start of the line printed once it listens


@dataclass(frozen=True)
class ServeSettings:
    host: str
    port: int
    model_name: str | None  # what clients put in `model` (None: the model config's name)
    api_key: str | None  # read from the environment variable `serve.api_key_env`
    record_dir: Path | None
    shutdown_grace_s: float
    max_body_bytes: int  # a body above this is refused with 413 before it is read whole
    max_concurrent: int  # requests in flight at once; one more is refused with 429


def serve_settings(node: DictConfig) -> ServeSettings:
    record = node.get("record_dir")
    name = node.get("model_name")
    return ServeSettings(
        host=str(node.get("host")),
        port=checked(node, "serve.port"),
        model_name=None if name is None else str(name),
        api_key=api_key_from_env(node.get("api_key_env"), "serve.api_key_env"),
        record_dir=None if record is None else Path(str(record)),
        shutdown_grace_s=float(checked(node, "serve.shutdown_grace_s")),
        max_body_bytes=_max_body(node.get("max_body")),
        max_concurrent=checked(node, "serve.max_concurrent_requests"),
    )


def _max_body(value: object) -> int:
    limit = parse_bytes(value, "serve.max_body")  # type: ignore[arg-type]
    if limit < MIN_BODY_BYTES:
        raise ConfigError(
            "serve.max_body", f"{value!r} is below {MIN_BODY_BYTES} bytes; give a size like 1MiB"
        )
    return limit


def bind(host: str, port: int) -> socket.socket:
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as error:
        raise ConfigError(
            "serve.port", f"cannot listen on {host}:{port} ({error}); choose another, or 0"
        ) from None
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server, announcing its address once it accepts requests, and ending the
    responses still open after the shutdown grace properly (an error event, then `[DONE]`)
    by stopping the engine loop, rather than cutting their connections."""

    def __init__(
        self, config: uvicorn.Config, banner: str, engine_loop: EngineLoop, grace_s: float
    ) -> None:
        super().__init__(config)
        self.banner = banner
        self.engine_loop = engine_loop
        self.grace_s = grace_s

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.should_exit:
            print(self.banner, flush=True)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        stopping = asyncio.create_task(super().shutdown(sockets))
        done, _ = await asyncio.wait({stopping}, timeout=self.grace_s)
        if not done:
            await asyncio.to_thread(self.engine_loop.stop)
        await stopping


def _ignore(sig: int, frame: FrameType | None) -> None:
    """What a signal does once uvicorn has shut down on it: nothing more (exit status 0)."""
    del sig, frame


def serve(cfg: DictConfig, progress: bool = True) -> None:
    checked = engine_spec(cfg)
    options = serve_settings(cfg.serve)
    sock = bind(options.host, options.port)
    start = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - start

    started = start_engine(checked, clock, progress)
    engine, tokenizer, served = started.engine, started.tokenizer, started.served
    strategy = started.strategy
    writer = None
    if options.record_dir is not None:
        writer = RunWriter(options.record_dir)
        (options.record_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    config = served.loaded.config
    card = ModelCard(
        name=options.model_name or checked.model.name,
        max_context=config.max_context,
        vocab_size=config.vocab_size,
        created=int(time.time()),
    )
    driver = EngineDriver(engine, writer, started.step_hooks())
    engine_loop = EngineLoop(driver, max_in_flight=options.max_concurrent)
    state = ServerState(
        loop=engine_loop,
        intake=Intake(engine, tokenizer, card),
        tokenizer=tokenizer,
        card=card,
        clock=clock,
        api_key=options.api_key,
        max_body_bytes=options.max_body_bytes,
    )
    host, port = sock.getsockname()[:2]
    server = _Server(
        uvicorn.Config(
            create_app(state),
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=options.shutdown_grace_s + CUT_AFTER_S,
        ),
        banner=f"{BANNER}{card.name} ({strategy.name}) at http://{host}:{port}",
        engine_loop=engine_loop,
        grace_s=options.shutdown_grace_s,
    )
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _ignore)
    try:
        server.run(sockets=[sock])
    finally:
        if writer is not None:
            writer.close()
    print("servelab: stopped", flush=True)
