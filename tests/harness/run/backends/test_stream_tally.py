"""Token counts and times from streamed chunks, with every source a server may offer: token
ids per chunk (servelab, vLLM), a running usage (vLLM), neither (one per chunk, reconciled
with the final usage), nothing at all (the text re-tokenised, and said so)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from servelab.engine.request import Request, SamplingParams
from servelab.harness.run.backends.endpoint_settings import request_body
from servelab.harness.run.backends.stream_tally import StreamTally


@pytest.fixture(scope="module")
def words() -> PreTrainedTokenizerFast:
    """A real (if tiny) tokenizer: one token per whitespace-separated word."""
    vocab = {"[UNK]": 0, "a": 1, "b": 2, "c": 3}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def _text(text: str, finish: str | None = None, **extra) -> dict:
    return {"choices": [{"index": 0, "text": text, "finish_reason": finish, **extra}]}


def _tally(chunks: list[tuple[dict, float]]) -> StreamTally:
    tally = StreamTally()
    for chunk, now in chunks:
        tally.add(chunk, now)
    return tally


def test_token_ids_per_chunk(words) -> None:
    tally = _tally(
        [
            (_text("a b", token_ids=[1, 2]), 1.0),
            (_text(" c", token_ids=[3]), 2.0),
            (_text("", "length", token_ids=[]), 3.0),
            ({"choices": [], "usage": {"completion_tokens": 3}}, 3.1),
        ]
    )
    settled = tally.settle(words)
    assert (settled.output_ids, settled.token_times, settled.finish_reason) == (
        [1, 2, 3],
        [1.0, 1.0, 2.0],
        "length",
    )
    assert settled.counters == {
        "token_times_from": "token_ids",
        "token_count_from": "usage",
        "output_ids_from": "token_ids",
        "cached_tokens_from": None,  # the server said nothing of its prefix cache
    }


@pytest.mark.parametrize(
    ("chunk", "cached", "source"),
    [
        ({"usage": {"completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 32}}},
         32, "usage"),
        ({"timings": {"cache_n": 16}}, 16, "timings"),  # llama.cpp
        ({"usage": {"completion_tokens": 1}}, None, None),
    ],
)  # fmt: skip
def test_the_cached_prompt_tokens_come_from_what_the_server_reports(
    words, chunk: dict, cached: int | None, source: str | None
) -> None:
    tally = _tally([(_text("a", "length", token_ids=[1]), 1.0), (chunk, 1.1)])
    settled = tally.settle(words)
    assert settled.cached_prompt_tokens == cached
    assert settled.counters["cached_tokens_from"] == source


def test_running_usage_counts_a_chunk_of_two(words) -> None:
    usage = [{"completion_tokens": n} for n in (1, 3, 3)]
    tally = _tally(
        [
            ({**_text("a"), "usage": usage[0]}, 1.0),
            ({**_text(" b c"), "usage": usage[1]}, 2.0),
            ({**_text("", "stop"), "usage": usage[2]}, 2.5),
        ]
    )
    settled = tally.settle(words)
    assert (settled.output_ids, settled.token_times, settled.finish_reason) == (
        [1, 2, 3],
        [1.0, 2.0, 2.0],
        "stop",
    )
    assert settled.counters["token_times_from"] == "usage"
    assert settled.counters["output_ids_from"] == "retokenised"


def test_one_per_chunk_reconciled_with_the_final_usage(words) -> None:
    tally = _tally(
        [
            (_text("a"), 1.0),
            (_text(" b"), 2.0),
            (_text(" c", "length"), 3.0),
            ({"choices": [], "usage": {"completion_tokens": 4}}, 3.2),
        ]
    )
    settled = tally.settle(words)
    assert settled.token_times == [1.0, 2.0, 3.0, 3.0]  # the fourth stamped at the last chunk
    assert settled.counters["token_times_from"] == "chunks"
    assert settled.counters["tokens_unaccounted"] == 1
    assert settled.counters["token_count_from"] == "usage"


def test_usage_only_on_the_last_chunk_is_a_total_not_a_growth(words) -> None:
    """llama.cpp's shape: one token per text chunk, `usage` only on the chunk that finishes;
    a token whose text the server held back is stamped at that chunk."""
    tally = _tally(
        [
            (_text("a"), 1.0),
            (_text(" b"), 2.0),
            ({**_text("", "length"), "usage": {"completion_tokens": 3}}, 3.0),
        ]
    )
    settled = tally.settle(words)
    assert settled.token_times == [1.0, 2.0, 3.0]
    assert settled.counters["token_times_from"] == "chunks+usage"
    assert "tokens_unaccounted" not in settled.counters
    whole = _tally(
        [
            (_text("a"), 1.0),
            (_text(" b"), 2.0),
            ({**_text("", "length"), "usage": {"completion_tokens": 2}}, 3.0),
        ]
    ).settle(words)
    assert whole.token_times == [1.0, 2.0]
    assert whole.counters["token_times_from"] == "chunks"
    assert "tokens_unaccounted" not in whole.counters


def test_no_usage_at_all_retokenises_the_text(words) -> None:
    settled = _tally([(_text("a b"), 1.0), (_text(" c", "length"), 2.0)]).settle(words)
    assert (settled.output_ids, settled.token_times) == ([1, 2, 3], [1.0, 2.0, 2.0])
    assert settled.counters["token_count_from"] == "retokenised"


def test_request_body_sends_ids_sampling_and_extensions() -> None:
    request = Request("r", [5, 6], SamplingParams(max_tokens=3, top_k=0, ignore_eos=True, seed=9))
    body = request_body(request, "m", {"min_tokens": 3})
    assert body == {
        "model": "m",
        "prompt": [5, 6],
        "max_tokens": 3,
        "temperature": 0.0,
        "top_p": 1.0,
        "seed": 9,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "return_token_ids": True,
        "min_tokens": 3,
    }
    sampled = Request("s", [5], SamplingParams(max_tokens=1, temperature=0.7, top_k=40))
    assert request_body(sampled, "m", {})["top_k"] == 40
