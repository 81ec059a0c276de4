"""The load generator's own limit on this machine: servelab's endpoint client
(`backend=openai`) against the fake server (`harness/serving/fake_server.py`, which streams
its tokens the moment it is asked), at Poisson rates doubling from --start until the send
lag's p99 passes --lag-ms or --max is reached. Prints the send lag's percentiles at every
rate tried and the highest rate the client held; a run's achieved rate beside its target.

    python -m scripts.client_bench [--start 50] [--max 3200] [--seconds 10] [--tokens 8]
                                   [--lag-ms 5] [--workers 1|N|auto] [--out runs/client-bench]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from servelab.harness.run.compose import compose
from servelab.harness.run.run import run
from servelab.harness.serving.process import start_fake_server
from servelab.reports.run_report import reported


@dataclass(frozen=True)
class RateResult:
    rate: float  # configured, req/s
    achieved: float  # completed requests / the run's duration
    requests: int
    lag_p50_ms: float
    lag_p95_ms: float
    lag_p99_ms: float

    def held(self, lag_ms: float) -> bool:
        return self.lag_p99_ms <= lag_ms


def at_rate(
    url: str, rate: float, seconds: float, tokens: int, out: Path, workers: int | str = 1
) -> RateResult:
    """One run of the client (in `workers` processes) at `rate` for about `seconds`, against
    the server at `url`."""
    requests = max(20, round(rate * seconds))
    cfg = compose([
        "backend=openai", f"endpoint.url={url}", "model=dummy-tiny", "workload=random",
        "workload.input_len.dist=fixed", "workload.input_len.value=8",
        f"workload.output_len.value={tokens}", "workload.arrival.process=poisson",
        f"workload.arrival.rate={rate}", f"workload.num_requests={requests}",
        "telemetry.roofline=false", f"endpoint.workers={workers}",
    ])  # fmt: skip
    summary = reported(partial(run, progress=False))(cfg, out / f"rate-{rate:g}")
    lag = summary["send_lag"]
    return RateResult(
        rate, summary["request_throughput"], summary["completed"],
        lag["p50"] * 1e3, lag["p95"] * 1e3, lag["p99"] * 1e3,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start", type=float, default=50.0)
    parser.add_argument("--max", type=float, default=3200.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--lag-ms", type=float, default=5.0)
    parser.add_argument("--out", default="runs/client-bench")
    parser.add_argument("--workers", default="1", help="client processes (endpoint.workers)")
    args = parser.parse_args()
    workers = args.workers if args.workers == "auto" else int(args.workers)
    if args.start <= 0 or args.max < args.start or args.seconds <= 0 or args.tokens < 1:
        raise SystemExit(
            "client_bench: --start > 0, --max >= --start, --seconds > 0, --tokens >= 1"
        )
    server = start_fake_server(args.tokens)
    print(f"the fake server at {server.url}, {args.tokens} tokens a response; the client's "
          f"send lag (sent - scheduled) at each Poisson rate, {args.seconds:g} s each, "
          f"endpoint.workers={workers}")  # fmt: skip
    print(f"{'rate':>8} {'achieved':>9} {'requests':>8} {'lag p50 ms':>10} {'p95 ms':>8} "
          f"{'p99 ms':>8}")  # fmt: skip
    held = None
    try:
        rate = args.start
        while rate <= args.max:
            result = at_rate(server.url, rate, args.seconds, args.tokens, Path(args.out), workers)
            print(f"{result.rate:8g} {result.achieved:9.1f} {result.requests:8d} "
                  f"{result.lag_p50_ms:10.2f} {result.lag_p95_ms:8.2f} {result.lag_p99_ms:8.2f}",
                  flush=True)  # fmt: skip
            if not result.held(args.lag_ms):
                break
            held = rate
            rate *= 2
    finally:
        server.stop()
    if held is None:
        print(f"the client held no rate tried with send lag p99 <= {args.lag_ms:g} ms")
    else:
        print(f"the client holds {held:g} req/s with send lag p99 <= {args.lag_ms:g} ms "
              "(the highest rate tried that held)")  # fmt: skip


if __name__ == "__main__":
    main()
