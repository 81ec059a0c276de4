"""A contender's probes on a server the search starts for it (`server=vllm|sglang|llamacpp|
servelab|command` in its item): one server for all of its probes, so that a knee is found on
one engine as it runs, not on a restart per probe.

The server starts before the contender's first run (`servers.managed.running_server`: a free
port, its health path, one warm-up completion, `server.json` and `server.log` in the
contender's `server/` folder); its start-up and each probe's warm-up are off the search's clock
(`OffClock`): a budget buys probes, whatever an engine takes to load. Before every probe but
the first the server gets the run's warm-up again (one short completion). Every probe is cold:
its prompts carry a nonce of their own (`workload.cache_bust`, recorded with the probe), so a
prefix cache finds nothing an earlier probe left; the probe's `warm_cache_share` says whether
it did. A server that exits, or never answers, ends the contender (`ProberGone`, one line)
with the probes it ran. It stops after the contender's last probe (`done`), or, kept for the
search's closing reference run (`keep`), when the search ends, however it ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TypeVar

from omegaconf import DictConfig, open_dict

from servelab.base.records import RequestRecord
from servelab.harness.run.servers.managed import RunningServer, ServerFailed, running_server
from servelab.harness.run.servers.settings import ServerSettings
from servelab.harness.search.probes import (
    REFERENCE,
    Outcome,
    ProberGone,
    ProbeSpec,
    RunFn,
    RunProber,
)

T = TypeVar("T")
SERVER = "server"  # the folder, under a contender's, of its server's log and record


class OffClock:
    """The seconds the search spent on what its budget does not buy (servers starting and
    warming up), and the search's clock less them."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.started: dict[str, float] = {}  # contender -> its server's start-up seconds

    def __call__(self) -> float:
        return time.monotonic() - self.seconds


class ServedProber(RunProber):
    """A contender's runs against the server started for it (see the module's docstring)."""

    def __init__(
        self,
        name: str,
        cfg: DictConfig,
        server: ServerSettings,
        out_dir: Path,
        stop_early: float | None,
        run: RunFn,
        off: OffClock,
        say: Callable[[str], None],
        keep: bool = False,
    ) -> None:
        super().__init__(cfg, out_dir, stop_early, run)
        self.name, self.server, self.off, self.say, self.keep = name, server, off, say, keep
        self.stack = ExitStack()
        self.running: RunningServer | None = None
        self.runs = 0  # runs so far: each probe's nonce is the next

    def config(self, spec: ProbeSpec) -> DictConfig:
        """The probe's run against the running server, its prompts under a nonce of its own."""
        cfg = super().config(spec)  # a copy of the contender's
        assert self.running is not None
        with open_dict(cfg):
            cfg.server.kind = None  # started here, once: the run only measures it
            cfg.endpoint.url = self.running.url
            cfg.endpoint.label = cfg.endpoint.label or self.server.label
            cfg.workload.cache_bust = self.runs
        return cfg

    def run(self, spec: ProbeSpec) -> Outcome:
        return self._served(lambda: super(ServedProber, self).run(spec), spec.name)

    def reference(self, requests: int, name: str = REFERENCE) -> tuple[dict, list[RequestRecord]]:
        return self._served(lambda: super(ServedProber, self).reference(requests, name), name)

    def _served(self, body: Callable[[], T], name: str) -> T:
        """`body` (one run) on the server: started first, or warmed up again; ProberGone
        where it exits or will not start."""
        started = time.monotonic()
        try:
            if self.running is None:
                self.running = self.stack.enter_context(
                    running_server(self.server, self.out_dir / SERVER, self.say)
                )
                self.off.started[self.name] = time.monotonic() - started
            elif self.server.warmup:
                self.running.warm_up()
        except ServerFailed as failed:  # it would not start, or not warm up again
            line = str(failed) if self._alive() else self._exited(name)
            self.done()
            raise ProberGone(line) from failed
        finally:
            self.off.seconds += time.monotonic() - started
        self.runs += 1
        try:
            outcome = body()
        except Exception as error:
            if self._alive():
                raise
            raise ProberGone(self._exited(name)) from error
        if not self._alive():
            raise ProberGone(self._exited(name))
        return outcome

    def _alive(self) -> bool:
        """Whether its server runs (or has not started)."""
        return self.running is None or self.running.exit_status() is None

    def _exited(self, name: str) -> str:
        """The line for a server that exited before or during the run `name`; stopped."""
        assert self.running is not None
        status = self.running.exit_status()
        self.done()
        return f"its server exited (status {status}) by {name}"

    def done(self) -> None:
        """Stop the server, unless kept for the search's end."""
        if not self.keep:
            self.close()

    def close(self) -> None:
        self.stack.close()
