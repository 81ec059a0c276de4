"""`servelab step-errors SEARCH_DIR`: where the simulator's error arises, for a search that
predicted its knees (`make run` does): each strategy's real steps against the step-cost
model's prediction for the same counts, by kind of step (`harness.run.simulate.step_errors`)."""

from __future__ import annotations

from pathlib import Path

from servelab.base.errors import ConfigError

SUMMARY = "a search's real steps against its step-cost model, per strategy and kind of step"
USAGE = """usage: servelab step-errors SEARCH_DIR

For each strategy of the search (its search.json names the step-cost model its prediction
simulated), every probe's steps predicted from their counts and set beside their measured
time, by kind: prefill, decode, mixed (prompt chunks beside decode rows), padded; the
median, 90th-percentile and total error, the loop's own time inside a step and between
steps, measured and modelled. Writes SEARCH_DIR/step_errors.json."""


def main(args: list[str]) -> None:
    from servelab.harness.run.simulate.step_errors import (
        render,
        search_step_errors,
        write_step_errors,
    )

    if len(args) != 1:
        raise ConfigError("step-errors", USAGE.splitlines()[0])
    search_dir = Path(args[0])
    errors = search_step_errors(search_dir)
    print(render(errors))
    print(f"written to {write_step_errors(search_dir, errors)}")
