"""Requests that missed the SLO at every load a search tried: a sign that the SLO measures their
length, not the load.

A knee search reads each rate probe as a share of requests meeting the SLO. A request that
misses in every completed rate probe, down to the lowest rate, misses whatever the load (its
prompt alone takes longer than a limit scaled from shorter requests' medians, say): every
probe of the same requests then meets the SLO for one fewer at most, and a probe of 48 at a
0.9 target with 95% confidence, which is a clear pass only at 48 of 48, can never pass
clearly. The search names such requests so that the user can see why no rate passed and
loosen the limit or change the workload, instead of reading a knee that the length set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from servelab.harness.measure.metrics import request_latency
from servelab.harness.measure.rundir import read_requests
from servelab.harness.measure.slo import SLO


@dataclass(frozen=True)
class AlwaysMissed:
    """A request that missed the SLO in each of the `probes` completed rate probes of its
    workload seed."""

    request_id: str
    prompt_len: int
    probes: int
    lowest_rate: float  # req/s: the lowest rate it was probed at
    ttft_at_lowest: float | None  # its TTFT there (None: it failed)


def always_missed(rate_probes: Sequence[tuple[float, Path]]) -> list[AlwaysMissed]:
    """The requests that met the SLO in none of `rate_probes` ((rate, run directory) of each
    completed rate probe) and were counted in every one drawn from the same workload seed
    (a repeat at the knee draws other requests under the same ids), in order of id."""
    probes_of_seed: dict[int, int] = {}
    seen: dict[tuple[int, str], int] = {}
    missed: dict[tuple[int, str], int] = {}
    lowest: dict[tuple[int, str], tuple[float, int, float | None]] = {}
    for rate, run_dir in rate_probes:
        cfg = OmegaConf.load(run_dir / "config.yaml")
        seed = int(cfg.workload.seed)
        probes_of_seed[seed] = probes_of_seed.get(seed, 0) + 1
        slo = SLO.of_config(cfg)
        for record in read_requests(run_dir):
            if record.excluded:
                continue
            key = (seed, record.id)
            latency = request_latency(record)
            seen[key] = seen.get(key, 0) + 1
            missed[key] = missed.get(key, 0) + (not slo.meets(latency))
            if key not in lowest or rate < lowest[key][0]:
                ttft = None if latency is None else latency.ttft
                lowest[key] = (rate, record.prompt_len, ttft)
    everywhere = [k for k, n in missed.items() if n == seen[k] == probes_of_seed[k[0]]]
    found = []
    for seed, request_id in sorted(everywhere, key=lambda k: (k[0], len(k[1]), k[1])):
        rate, prompt_len, ttft = lowest[(seed, request_id)]
        found.append(AlwaysMissed(request_id, prompt_len, probes_of_seed[seed], rate, ttft))
    return found


def always_missed_line(found: Sequence[AlwaysMissed]) -> str:
    """One paragraph naming them and what follows; '' for none."""
    if not found:
        return ""
    named = ", ".join(
        f"{m.request_id} ({m.prompt_len} prompt tokens"
        + (f", TTFT {m.ttft_at_lowest:.3g} s" if m.ttft_at_lowest is not None else ", failed")
        + f" at {m.lowest_rate:.3g} req/s)"
        for m in found
    )
    return (
        f"missed the SLO in all {found[0].probes} completed rate probes, whatever the load: "
        f"request {named}. A probe of n such requests meets the SLO for at most "
        f"n - {len(found)}, so near the target its verdict reads their length, not the load; "
        "a looser limit (search.slo_scale) or a workload without them separates the two."
    )
