"""Our model against transformers' LlamaForCausalLM loaded from the same GGUF file (fp32).

Two checks on the real embedded model: the logits of a real-text prompt agree to float
rounding, and the greedy continuations of 8 real-text prompts served by the engine (static
batching, contiguous KV, all 8 in one batch) are token-identical to transformers' own
`generate`, one prompt at a time.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from servelab.base.batch import ForwardBatch
from servelab.engine.request import Request, SamplingParams
from servelab.models.load import load_model
from servelab.models.spec import model_spec
from servelab.workloads.text import section_chunks
from tests.tiny import dense_attention, make_engine, serve, strategy

pytestmark = pytest.mark.integration
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def ours(embedded_model_file: Path, tmp_path_factory: pytest.TempPathFactory):
    cfg = OmegaConf.create({"source": "embedded", "name": "smollm2-135m"})
    cache = embedded_model_file.parents[2]
    return load_model(model_spec(cfg, cache), torch.float32, torch.device("cpu"))


@pytest.fixture(scope="module")
def reference(embedded_model_file: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(embedded_model_file.parent), gguf_file=embedded_model_file.name, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    chunks = section_chunks("prompts")
    return [tokenizer.encode(chunk)[: 24 + 8 * i] for i, chunk in enumerate(chunks[:8])]


def test_logits_match_transformers(ours, reference, prompts) -> None:
    ids = torch.tensor(prompts[3])
    batch = ForwardBatch.single(ids, torch.arange(len(ids)))
    layers = ours.config.num_layers
    with torch.inference_mode():
        logits = ours.model(batch, [None] * layers, [None] * layers, dense_attention)
        expected = reference(ids[None]).logits[0]
    difference = (logits - expected).abs().max().item()
    assert difference < 1e-3, f"max abs logit difference {difference}"
    assert torch.equal(logits.argmax(-1), expected.argmax(-1))


def test_engine_greedy_matches_transformers_generate(ours, reference, prompts) -> None:
    requests = [
        Request(str(i), p, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
        for i, p in enumerate(prompts)
    ]
    engine = make_engine(ours.model, strategy(), kv_slots=8 * 200, max_num_seqs=8)
    serve(engine, requests)
    for request, prompt in zip(requests, prompts, strict=True):
        with torch.inference_mode():
            generated = reference.generate(
                torch.tensor([prompt]),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                min_new_tokens=NEW_TOKENS,
                pad_token_id=0,
            )[0, len(prompt) :].tolist()
        assert request.output_ids == generated, f"request {request.id} diverged"
