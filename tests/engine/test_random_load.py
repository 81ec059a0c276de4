"""Property tests: every scheduler and both KV managers under random load on the tiny model.

Hypothesis draws strategies (speculative decoding among them), limits and timelines of
arrivals, cancellations and rollbacks (`tests/random_load.py`); the driver checks after every
event and step that KV is conserved, no request is lost or duplicated, nothing ended holds
KV, and every delivered response has exactly the reference's greedy tokens; at the end the
cache is whole. Examples are drawn deterministically (the `servelab` profile in
conftest.py) so a failure reproduces; shrunk failures found here are kept as explicit
regression tests below.
"""

from __future__ import annotations

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from servelab.models.model import LlamaModel
from tests.random_load import (
    VOCAB,
    Arrival,
    Driver,
    Outcome,
    References,
    Rollback,
    Scenario,
    scenarios,
)
from tests.tiny import tiny_model

COMBINATIONS = [
    ("iteration", "paged"),
    ("iteration", "contiguous"),
    ("static", "paged"),
    ("static", "contiguous"),
]

MODEL = tiny_model(vocab_size=VOCAB)
REFERENCES = References(MODEL)


def play(model: LlamaModel, scenario: Scenario) -> Outcome:
    return Driver(model, scenario, REFERENCES).run()


def tally(outcome: Outcome) -> None:
    """What the example exercised (`--hypothesis-show-statistics` shows the shares)."""
    for happened, what in (
        (outcome.preemptions, "preempted"),
        (outcome.rollbacks, "rolled back"),
        (outcome.drafts_rejected, "drafts rejected"),
        (outcome.cancelled, "cancelled"),
        (outcome.rejected, "rejected"),
        (outcome.prefix_hits, "prefix hit"),
    ):
        event(what if happened else f"not {what}")


@pytest.mark.parametrize(("batching", "kv"), COMBINATIONS)
@given(data=st.data())
def test_random_load_keeps_every_invariant(batching: str, kv: str, data: st.DataObject) -> None:
    tally(play(MODEL, data.draw(scenarios(batching, kv))))


def test_a_lone_request_that_preempts_itself_starts_over_in_the_same_step() -> None:
    """Shrunk: two blocks of 8, prefix caching; a rolled-back request must copy its
    registered first block before writing into it, which needs both blocks, so it preempts
    itself. The step then ran nothing (`Engine.step` returned None with work unfinished, which
    stops the server's engine loop); now it re-admits the request from its cached prefix."""
    options = {
        "block_size": 8,
        "chunked_prefill": False,
        "policy": "fcfs",
        "preemption": "recompute",
        "prefix_caching": True,
    }
    outcome = play(
        MODEL,
        Scenario(
            batching="iteration",
            kv="paged",
            options=tuple(sorted(options.items())),
            kv_slots=16,
            max_num_seqs=1,
            max_num_batched_tokens=8,
            prefixes=((3, 3, 3),),
            arrivals=(Arrival(0, 0, (3,), 1, False), Arrival(11, 0, (3,) * 5, 3, False)),
            cancels=(),
            rollbacks=(Rollback(step=13, target=0, back=2),),
        ),
    )
    assert outcome.preemptions == 1 and len(outcome.delivered) == 2
