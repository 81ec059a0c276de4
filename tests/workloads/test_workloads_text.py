"""The real-text sections: deterministic, disjoint, covering the text, assigned by content."""

from __future__ import annotations

import ast
import hashlib
import os
import subprocess
import sys
from pydoc_data.topics import topics

from servelab.workloads.text import SECTIONS, section_chunks, section_of, text_section


def in_another_process(expression: str) -> object:
    """`expression` (over `SECTIONS`, `section_of`, `text_section`) evaluated in a fresh Python
    with another string-hash seed: what must not depend on this process."""
    code = (
        "import hashlib; from servelab.workloads.text import SECTIONS, section_of, "
        f"text_section; print(repr({expression}))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "4321"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, check=True)  # fmt: skip
    return ast.literal_eval(done.stdout.strip())


DIGESTS = "{n: hashlib.sha256(text_section(n).encode()).hexdigest() for n in SECTIONS}"


def test_sections_are_the_same_in_every_process() -> None:
    here = {n: hashlib.sha256(text_section(n).encode()).hexdigest() for n in SECTIONS}
    assert in_another_process(DIGESTS) == here
    for name in SECTIONS:
        assert text_section(name) == "\n\n".join(section_chunks(name))


def test_sections_are_disjoint_and_sized() -> None:
    chunks = {name: set(section_chunks(name)) for name in SECTIONS}
    assert not chunks["calibration"] & chunks["evaluation"]
    assert not chunks["calibration"] & chunks["prompts"]
    assert not chunks["evaluation"] & chunks["prompts"]
    paragraphs = {name: text_section(name).split("\n\n") for name in SECTIONS}
    seen: set[str] = set()
    for name in SECTIONS:
        assert len(set(paragraphs[name])) == len(paragraphs[name])
        assert not seen & set(paragraphs[name])
        seen |= set(paragraphs[name])
    sizes = {name: len(text_section(name)) for name in SECTIONS}
    total = sum(len(text) for text in topics.values())
    assert sizes["prompts"] > sizes["calibration"] > 50_000
    assert sizes["evaluation"] > 50_000
    assert sum(sizes.values()) > 0.7 * total  # repeated paragraphs are kept once


def test_every_chunk_is_in_the_section_its_hash_names() -> None:
    for name in SECTIONS:
        assert all(section_of(chunk) == name for chunk in section_chunks(name))


def test_assignment_depends_on_the_chunk_text_only() -> None:
    texts = [f"paragraph {i}" for i in range(50)]
    assert in_another_process(f"[section_of(t) for t in {texts!r}]") == [
        section_of(t) for t in texts
    ]
    assert {section_of(f"paragraph {i}") for i in range(200)} == set(SECTIONS)
    # pinned: a chunk's section never changes with the Python version or the other chunks
    assert [section_of(f"paragraph {i}") for i in range(3)] == [
        "prompts",
        "calibration",
        "calibration",
    ]
