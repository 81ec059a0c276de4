"""transformers as peers: `hf_static` (generate on padded batches) and `hf_continuous`
(transformers' continuous batching) on the weights servelab serves, producing the same
records. On the tiny model: exact greedy tokens against the cache-free reference (left
padding, own max_tokens, end of sequence), one time per token. Through `run()` on the
dummy model: complete run directories whose outputs equal the in-process engine's."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from servelab.engine.request import Request, SamplingParams
from servelab.harness.measure.rundir import RunWriter, read_requests
from servelab.harness.run.backends.hf_continuous import ContinuousLimits, ContinuousRunner
from servelab.harness.run.backends.hf_model import transformers_model
from servelab.harness.run.backends.hf_static import run_batch
from servelab.harness.run.compose import compose
from servelab.harness.run.run import run
from servelab.models.load import LoadedModel
from servelab.models.model import LlamaModel
from servelab.workloads.spec import RequestSpec, Workload
from tests.tiny import greedy_reference, random_prompts, tiny_model

EOS = (2,)


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models on one thread: on a shared 2-core machine two spinning threads are slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def ours() -> LlamaModel:
    return tiny_model()


@pytest.fixture(scope="module")
def theirs(ours: LlamaModel):
    return transformers_model(LoadedModel(ours, ours.config, None, None, None))


def _clock():
    start = time.perf_counter()
    return lambda: time.perf_counter() - start


def test_static_batches_match_the_reference(ours: LlamaModel, theirs) -> None:
    prompts = random_prompts(4, 3, 17, seed=7)
    counts = [6, 2, 9, 4]
    requests = [
        Request(str(i), p, SamplingParams(max_tokens=n, ignore_eos=True))
        for i, (p, n) in enumerate(zip(prompts, counts, strict=True))
    ]
    run_batch(theirs, requests, _clock(), EOS)
    for request, prompt, count in zip(requests, prompts, counts, strict=True):
        assert request.output_ids == greedy_reference(ours, prompt, count), request.id
        assert request.finish_reason == "length" and len(request.token_times) == count
        assert request.token_times == sorted(request.token_times)
    assert len({r.t_done for r in requests}) == 1  # delivered together, at the batch's end
    assert all(r.t_done >= r.token_times[-1] for r in requests)


def test_static_batch_stops_a_row_at_its_end_of_sequence(ours: LlamaModel, theirs) -> None:
    prompt = random_prompts(1, 9, 9, seed=8)[0]
    greedy = greedy_reference(ours, prompt, 8)
    stop = greedy[3]
    cut = greedy.index(stop) + 1
    stopping = Request("stops", prompt, SamplingParams(max_tokens=8))
    run_batch(theirs, [stopping], _clock(), (stop,))
    assert stopping.output_ids == greedy[:cut] and stopping.finish_reason == "stop"
    assert len(stopping.token_times) == cut


def test_continuous_batching_matches_the_reference(
    ours: LlamaModel, theirs, tmp_path: Path
) -> None:
    prompts = random_prompts(3, 4, 12, seed=9)
    counts = [5, 3, 7]
    specs = tuple(
        RequestSpec(str(i), tuple(p), n, 0.0, ignore_eos=True)
        for i, (p, n) in enumerate(zip(prompts, counts, strict=True))
    )
    workload = Workload("tiny", specs, "hash")
    limits = ContinuousLimits(
        num_blocks=8, page_size=32, max_batch_tokens=128, max_requests_per_batch=4
    )
    first = Request("0", prompts[0], SamplingParams(max_tokens=5, ignore_eos=True))
    runner = ContinuousRunner(theirs, limits, EOS, first)
    runner.start()
    writer = RunWriter(tmp_path)
    runner.replay(workload, _clock(), writer, progress=False)
    writer.close()
    records = {r.id: r for r in read_requests(tmp_path)}
    for index, (prompt, count) in enumerate(zip(prompts, counts, strict=True)):
        record = records[str(index)]
        assert record.output_ids == greedy_reference(ours, prompt, count), index
        assert record.finish_reason == "length" and len(record.token_times) == count
        assert record.t_send <= record.token_times[0] <= record.token_times[-1] <= record.t_done


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["hf_static", "hf_continuous"])
def test_a_transformers_run_equals_the_engine_run(backend: str, tmp_path: Path) -> None:
    common = ["model=dummy-tiny", "engine.dtype=fp32", "engine.kv_budget=4MiB"]
    common.append("telemetry.roofline=false")
    run(compose([*common, "strategy=orca"]), tmp_path / "engine", progress=False)
    summary = run(compose([*common, f"backend={backend}"]), tmp_path / backend, progress=False)
    assert summary["status"] == "complete" and summary["completed"] == 8
    assert summary["strategy"] == {"name": backend, "backend": backend}
    engine = {r.id: r for r in read_requests(tmp_path / "engine")}
    peer = {r.id: r for r in read_requests(tmp_path / backend)}
    assert sorted(peer) == sorted(engine)
    for rid, record in peer.items():
        assert record.output_ids == engine[rid].output_ids, rid
        assert len(record.token_times) == record.output_len == 16
