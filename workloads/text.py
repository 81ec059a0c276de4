"""Real English prose from Python's own documentation, split into three fixed sections.

`pydoc_data.topics.topics` ships with every Python (about 465k characters). Its paragraphs
are taken once each (several topics repeat the same paragraphs), grouped into chunks of
about 4,000 characters that never cross a topic, and each chunk goes to one section by the
sha256 of its own text: the split needs no state, no download and no random numbers, and
a chunk lands in the same section whatever else the Python version ships:

- `calibration` (about 20%): activations for weight quantisation (AWQ).
- `evaluation` (about 20%): perplexity, kept away from calibration.
- `prompts` (about 60%): the text prompts of workloads.

No paragraph is in two sections.
"""

from __future__ import annotations

import hashlib
from pydoc_data.topics import topics

SECTIONS = ("calibration", "evaluation", "prompts")
_SHARES = (0.2, 0.2, 0.6)
CHUNK_CHARS = 4000


def _paragraphs() -> list[list[str]]:
    """Each topic's paragraphs (topics sorted by key), each distinct paragraph kept once."""
    seen: set[str] = set()
    kept = []
    for key in sorted(topics):
        fresh = []
        for paragraph in (p.strip() for p in topics[key].split("\n\n")):
            if paragraph and paragraph not in seen:
                seen.add(paragraph)
                fresh.append(paragraph)
        kept.append(fresh)
    return kept


def _chunks(paragraphs: list[str]) -> list[str]:
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for paragraph in paragraphs:
        current.append(paragraph)
        size += len(paragraph)
        if size >= CHUNK_CHARS:
            chunks.append("\n\n".join(current))
            current, size = [], 0
    if current:
        chunks.append("\n\n".join(current))
    return chunks


def section_of(chunk: str) -> str:
    """The section a chunk of text belongs to, from its sha256 alone."""
    digest = hashlib.sha256(chunk.encode("utf-8")).digest()
    point = int.from_bytes(digest[:8], "big") / 2.0**64
    bound = 0.0
    for name, share in zip(SECTIONS, _SHARES, strict=True):
        bound += share
        if point < bound:
            return name
    return SECTIONS[-1]


def section_chunks(name: str) -> tuple[str, ...]:
    """The chunks of one section, in topic order (topics sorted by key)."""
    if name not in SECTIONS:
        raise ValueError(f"unknown text section {name!r}; use one of {', '.join(SECTIONS)}")
    return tuple(
        chunk
        for paragraphs in _paragraphs()
        for chunk in _chunks(paragraphs)
        if section_of(chunk) == name
    )


def text_section(name: str) -> str:
    """One section (`calibration`, `evaluation` or `prompts`) as one string."""
    return "\n\n".join(section_chunks(name))
