"""Load the tokenizer that belongs to a model file, offline.

`transformers.AutoTokenizer` reads a GGUF file's embedded vocabulary and chat template, or a
Hugging Face folder's tokenizer files. The hub is never contacted: `HF_HUB_OFFLINE` is set
before transformers is imported anywhere in the process.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from transformers import AutoTokenizer, PreTrainedTokenizerBase  # noqa: E402


def load_tokenizer(model_path: Path) -> PreTrainedTokenizerBase:
    """A tokenizer from a `.gguf` file or a Hugging Face checkpoint folder."""
    if model_path.is_dir():
        return AutoTokenizer.from_pretrained(str(model_path), local_files_only=True)
    return AutoTokenizer.from_pretrained(
        str(model_path.parent), gguf_file=model_path.name, local_files_only=True
    )
