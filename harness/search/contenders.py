"""What a search compares: contenders of every kind in one list (`search.strategies`), each
composed into its own config and named once for the reports and its folder.

An item is a strategy preset served in this process (`vllm`), or the overrides that make a
contender of any other kind, quoted as one item: a server the search starts (`server=vllm
server.strategy=orca`, `server=llamacpp server.flags=[--parallel,8]`, `server=servelab
server.strategy=vllm`), servelab's engine under other settings (`strategy=vllm
engine.max_batch_size=8`), or a server someone else runs (`backend=openai
endpoint.url=http://host:8000`). A contender's name is `endpoint.label` where given, else its
server's label (kind, preset, flags: `vllm:orca --max-num-seqs 8`), else the item as written.
Every config is composed and checked here, before any probe: a contender that cannot run
(an unknown preset, a server not installed) is one line, naming the item, before any work. A
contender served over HTTP waits its idle spans (`replay.skip_idle` is off for it: a server's
clock runs as the machine's does). `reference_of` picks the contender whose floor run scales
the SLO (`search.reference`, else the first).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from hydra.errors import HydraException
from omegaconf import DictConfig

from servelab.base.errors import ConfigError
from servelab.harness.run.backends import KINDS, backend_of
from servelab.harness.run.servers.settings import ServerSettings
from servelab.harness.run.spec import run_spec

PRESET = re.compile(r"[\w.-]+")  # an item that is a preset's name alone
WORD = re.compile(r"""(?:[^\s'"]|'[^']*'|"[^"]*")+""")  # an override: quotes kept for Hydra
FOLDER_UNSAFE = re.compile(r"[^\w.+-]+")  # in a name, what its folder's name replaces with _


@dataclass(frozen=True)
class Contender:
    """One thing the search finds a knee of: its name, its composed config, and the server the
    search starts for it (None: served in this process, or by a server already running)."""

    name: str  # in the reports, the progress lines and search.json
    item: str  # as `search.strategies` gives it
    cfg: DictConfig
    server: ServerSettings | None

    @property
    def folder(self) -> str:
        """Its probes' folder under the search's out_dir: the name, made a path's part."""
        return FOLDER_UNSAFE.sub("_", self.name).strip("_") or "contender"

    @property
    def backend(self) -> str:
        return backend_of(self.cfg)

    def to_json(self) -> dict:
        """As `search.json` records it: what was asked, and where its probes are."""
        server = self.server
        return {"name": self.name, "item": self.item, "folder": self.folder,
                "backend": self.backend,
                "server": None if server is None else server.label}  # fmt: skip

    @property
    def in_process(self) -> bool:
        """Whether servelab's engine serves it in this process (what a prediction simulates)."""
        return self.backend == "inprocess"


def overrides_of(item: str) -> list[str]:
    """The overrides an item stands for: `strategy=NAME` for a preset's name, else its words."""
    if PRESET.fullmatch(item):
        return [f"strategy={item}"]
    words = WORD.findall(item)
    if not words or not all("=" in word for word in words):
        raise ConfigError(
            "search.strategies",
            f"{item!r} is neither a strategy preset nor overrides (KEY=VALUE ...), e.g. "
            "'server=vllm server.strategy=orca'",
        )
    return words


def contenders_of(
    items: tuple[str, ...], overrides: list[str], compose: Callable[[list[str]], DictConfig]
) -> list[Contender]:
    """Each item composed over the search's `overrides` and checked, named and in order; one
    line for the first item at fault, or for two items of one name."""
    contenders: list[Contender] = []
    for item in items:
        words = overrides_of(item)
        try:
            cfg = compose([*overrides, *words])
            if not KINDS[backend_of(cfg)].runs_engine:
                cfg.replay.skip_idle = False  # a server's clock runs as the machine's does
            spec = run_spec(cfg.copy())  # every field checked, the server's executable too
        except ConfigError as error:
            raise ConfigError(error.field, f"{error.message} (contender {item!r})") from error
        except HydraException as error:  # an override Hydra cannot read
            reason = str(error).splitlines()[0]
            raise ConfigError("search.strategies", f"{item!r}: {reason}") from error
        label = spec.endpoint.label if spec.endpoint is not None else None
        name = label or (spec.server.label if spec.server is not None else item)
        contender = Contender(name, item, cfg, spec.server)
        if any(c.name == name or c.folder == contender.folder for c in contenders):
            raise ConfigError(
                "search.strategies",
                f"two contenders are named {name!r}: name one (endpoint.label=NAME in its item)",
            )
        contenders.append(contender)
    return contenders


def reference_of(contenders: list[Contender], given: str | None) -> Contender:
    """The contender named or written `given` (None: the first); one line where none is."""
    if given is None:
        return contenders[0]
    for contender in contenders:
        if given in (contender.name, contender.item):
            return contender
    names = ", ".join(repr(c.name) for c in contenders)
    raise ConfigError("search.reference", f"{given!r} is none of the contenders: {names}")
