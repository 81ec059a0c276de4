"""Soak tests: does servelab hold a long load without leaking memory, KV or requests?

Two modes, each printing a summary (and writing it as JSON with `--json PATH`):

- `engine`: N requests (2,000 by default) through one engine in this process, under a
  strategy (`vllm` by default) on the tiny model, `--in-flight` requests at a time with
  random prompt and output lengths and shared prefixes (so the prefix cache is used).
  Resident memory is sampled every `--sample-every` completed requests.
- `serve`: `servelab serve` on the tiny model as a subprocess, driven for `--minutes` by
  `--clients` closed-loop clients over HTTP (random lengths, streamed or whole bodies), of
  which a share `--cancel` hang up mid-response (provoked cancellations) and a share
  `--bad` send a request the server must refuse (provoked 400s). The server's resident
  memory is sampled every `--rss-period` seconds.

Both report resident memory growth after warm-up (the first `--warmup` share of the
samples) as the last sample minus the first sample after warm-up, and as the slope of a
least-squares line through the samples after it; whether the KV pool ends full (no block
or slot allocated once every request has ended: the engine's own accounting, or /metrics);
and every error beyond the provoked ones. Run it niced on a shared machine:
`nice -n 19 python scripts/soak.py serve --minutes 30`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
MODEL = "dummy-tiny"
VOCAB_LOW, VOCAB_HIGH = 17, 49151  # above the special ids of the tiny model's vocabulary
MIB = 1 << 20


@dataclass
class MemorySeries:
    """Resident memory samples: (seconds since start, bytes)."""

    samples: list[tuple[float, int]] = field(default_factory=list)

    def add(self, t: float, rss: int) -> None:
        self.samples.append((t, rss))

    def growth(self, warmup: float) -> dict[str, float | int]:
        """Growth after the first `warmup` share of the samples: last minus first, and the
        least-squares slope (MiB per hour) through the samples after warm-up."""
        start = min(int(len(self.samples) * warmup), len(self.samples) - 1)
        after = self.samples[start:]
        t0, rss0 = after[0]
        t1, rss1 = after[-1]
        slope = 0.0
        if len(after) > 1:
            ts = [t for t, _ in after]
            ys = [r / MIB for _, r in after]
            mean_t, mean_y = sum(ts) / len(ts), sum(ys) / len(ys)
            var = sum((t - mean_t) ** 2 for t in ts)
            if var > 0:
                cov = sum((t - mean_t) * (y - mean_y) for t, y in zip(ts, ys, strict=True))
                slope = cov / var * 3600
        return {
            "samples": len(self.samples),
            "warmup_samples": start,
            "rss_start_mib": round(self.samples[0][1] / MIB, 1),
            "rss_after_warmup_mib": round(rss0 / MIB, 1),
            "rss_end_mib": round(rss1 / MIB, 1),
            "rss_peak_mib": round(max(r for _, r in self.samples) / MIB, 1),
            "growth_after_warmup_mib": round((rss1 - rss0) / MIB, 2),
            "slope_mib_per_hour": round(slope, 2),
            "window_s": round(t1 - t0, 1),
        }


def random_prompt(rng: random.Random, prefixes: list[list[int]], low: int, high: int) -> list[int]:
    tail = [rng.randint(VOCAB_LOW, VOCAB_HIGH) for _ in range(rng.randint(low, high))]
    return (rng.choice(prefixes) if rng.random() < 0.5 else []) + tail


def soak_engine(args: argparse.Namespace) -> dict:
    """N requests through one in-process engine, `in_flight` at a time."""
    import torch

    from servelab.engine.request import Request, SamplingParams
    from servelab.harness.run.compose import compose
    from servelab.harness.run.loop import EngineDriver, NothingScheduled
    from servelab.harness.run.spec import engine_spec
    from servelab.harness.run.startup import start_engine

    torch.set_num_threads(1)
    cfg = compose([f"model={MODEL}", f"strategy={args.strategy}", *args.overrides])
    start = time.perf_counter()
    started = start_engine(engine_spec(cfg), lambda: time.perf_counter() - start, progress=False)
    engine, strategy = started.engine, started.strategy
    driver = EngineDriver(engine, hooks=started.step_hooks())
    process = psutil.Process()
    rng = random.Random(args.seed)
    prefixes = [[rng.randint(VOCAB_LOW, VOCAB_HIGH) for _ in range(48)] for _ in range(4)]
    memory = MemorySeries()
    reasons: Counter[str] = Counter()
    errors: list[str] = []
    added = done = steps = 0
    in_flight: set[Request] = set()
    memory.add(0.0, process.memory_info().rss)
    while done < args.requests:
        while added < args.requests and len(in_flight) < args.in_flight:
            prompt = random_prompt(rng, prefixes, 4, 160)
            sampling = SamplingParams(max_tokens=rng.randint(1, 96), ignore_eos=True)
            request = Request(str(added), prompt, sampling, t_scheduled=time.perf_counter())
            added += 1
            if driver.admit(request):
                in_flight.add(request)
            else:
                reasons["rejected"] += 1
                errors.append(f"request {request.id} rejected: {request.error}")
                done += 1
        steps += 1
        try:
            result = driver.step()
        except NothingScheduled:
            errors.append(f"step {steps}: nothing ran with {len(in_flight)} requests in flight")
            break
        for request in result.delivered:
            in_flight.discard(request)
            reasons[request.finish_reason or "none"] += 1
            if request.finish_reason != "length" or len(request.output_ids) != (
                request.sampling.max_tokens
            ):
                errors.append(f"request {request.id}: {request.finish_reason} {request.error}")
            done += 1
            if done % args.sample_every == 0:
                memory.add(time.perf_counter() - start, process.memory_info().rss)
    kv = engine.kv
    stats = kv.stats()
    kv.check_integrity()
    pool = getattr(kv, "pool", None)
    return {
        "mode": "engine",
        "strategy": strategy.name,
        "requests": args.requests,
        "steps": steps,
        "duration_s": round(time.perf_counter() - start, 1),
        "finish_reasons": dict(reasons),
        "errors": errors[:20],
        "error_count": len(errors),
        "kv_total_slots": stats.total_slots,
        "kv_allocated_slots_at_end": stats.allocated_slots,
        "blocks_used_at_end": pool.num_used if pool is not None else None,
        "blocks_free_plus_cached_at_end": (
            pool.num_free + pool.num_cached if pool is not None else None
        ),
        "pool_full_at_end": stats.allocated_slots == 0 and (pool is None or pool.num_used == 0),
        "memory": memory.growth(args.warmup),
    }


class Server:
    """`servelab serve` on a free loopback port."""

    def __init__(self, overrides: list[str]) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        env.setdefault("OMP_NUM_THREADS", "1")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "servelab", "serve", "serve.port=0", *overrides],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.output: list[str] = []
        self.url = ""
        ready = threading.Event()

        def read() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                self.output.append(line)
                if line.startswith("servelab: serving ") and not self.url:
                    self.url = line.rsplit(" at ", 1)[1].strip()
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(300) or not self.url:
            self.process.kill()
            raise RuntimeError("servelab serve did not start:\n" + "".join(self.output))

    def stop(self) -> int:
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(120)


def metrics(client: httpx.Client) -> dict[str, float]:
    values = {}
    for line in client.get("/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


@dataclass
class Tally:
    """What the clients saw (under `lock`)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    outcomes: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

    def count(self, outcome: str, error: str | None = None) -> None:
        with self.lock:
            self.outcomes[outcome] += 1
            if error is not None:
                self.errors.append(error)


def client_loop(
    url: str, seed: int, deadline: float, args: argparse.Namespace, tally: Tally
) -> None:
    """One closed-loop client: a request, its whole answer (or a provoked hang-up or a
    provoked bad request), the next at once."""
    rng = random.Random(seed)
    prefixes = [[rng.randint(VOCAB_LOW, VOCAB_HIGH) for _ in range(32)] for _ in range(3)]
    with httpx.Client(base_url=url, timeout=120) as client:
        while time.monotonic() < deadline:
            body = {
                "model": MODEL,
                "prompt": random_prompt(rng, prefixes, 4, 120),
                "max_tokens": rng.randint(1, 64),
                "temperature": 0,
                "ignore_eos": True,
            }
            roll = rng.random()
            try:
                if roll < args.bad:
                    bad = client.post("/v1/completions", json={**body, "max_tokens": 0})
                    ok = bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
                    tally.count("provoked_400" if ok else "error", None if ok else bad.text)
                elif roll < args.bad + args.cancel:
                    hang_up(client, body, rng, tally)
                elif rng.random() < 0.5:
                    whole(client, body, tally)
                else:
                    streamed(client, body, tally)
            except httpx.HTTPError as error:
                tally.count("error", f"{type(error).__name__}: {error}")


def whole(client: httpx.Client, body: dict, tally: Tally) -> None:
    response = client.post("/v1/completions", json=body)
    if response.status_code != 200:
        tally.count("error", f"{response.status_code}: {response.text[:200]}")
        return
    used = response.json()["usage"]["completion_tokens"]
    if used != body["max_tokens"]:
        tally.count("error", f"whole body: {used} of {body['max_tokens']} tokens")
        return
    tally.count("ok")


def streamed(client: httpx.Client, body: dict, tally: Tally) -> None:
    ended = finished = False
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        if response.status_code != 200:
            tally.count("error", f"{response.status_code}: {response.read()[:200]!r}")
            return
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                ended = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                tally.count("error", f"stream error event: {chunk['error']}")
                return
            if chunk.get("choices") and chunk["choices"][0].get("finish_reason"):
                finished = True
    if ended and finished:
        tally.count("ok")
    else:
        tally.count("error", f"stream ended without {'a finish' if ended else '[DONE]'}")


def hang_up(client: httpx.Client, body: dict, rng: random.Random, tally: Tally) -> None:
    """A client that goes away: a stream closed after a few chunks, or a whole-body request
    abandoned after a short wait."""
    body = {**body, "max_tokens": 64}
    if rng.random() < 0.5:
        with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
            for index, _ in enumerate(response.iter_lines()):
                if index >= rng.randint(1, 6):
                    break
    else:
        with contextlib.suppress(httpx.TimeoutException):
            client.post("/v1/completions", json=body, timeout=rng.uniform(0.01, 0.3))
    tally.count("provoked_cancel")


def soak_serve(args: argparse.Namespace) -> dict:
    overrides = [
        f"model={MODEL}",
        f"strategy={args.strategy}",
        "engine.dtype=fp32",
        "engine.kv_budget=512KiB",  # 1,024 slots: eight clients preempt one another
        *args.overrides,
    ]
    server = Server(overrides)
    process = psutil.Process(server.process.pid)
    start = time.monotonic()
    deadline = start + args.minutes * 60
    tally = Tally()
    clients = [
        threading.Thread(
            target=client_loop, args=(server.url, args.seed + i, deadline, args, tally)
        )
        for i in range(args.clients)
    ]
    for thread in clients:
        thread.start()
    memory = MemorySeries()
    while time.monotonic() < deadline:
        memory.add(time.monotonic() - start, process.memory_info().rss)
        time.sleep(min(args.rss_period, max(0.0, deadline - time.monotonic())))
    for thread in clients:
        thread.join(300)
    memory.add(time.monotonic() - start, process.memory_info().rss)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        settle = time.monotonic() + 60
        values = metrics(client)
        while (
            values.get("servelab_requests_in_flight", 0) or values["servelab_kv_slots_allocated"]
        ) and time.monotonic() < settle:
            time.sleep(0.5)
            values = metrics(client)
    status = server.stop()
    finished = {
        name.split('"')[1]: int(value)
        for name, value in values.items()
        if name.startswith("servelab_requests_finished_total{")
    }
    return {
        "mode": "serve",
        "strategy": args.strategy,
        "overrides": overrides,
        "duration_s": round(time.monotonic() - start, 1),
        "clients": args.clients,
        "client_outcomes": dict(tally.outcomes),
        "errors": tally.errors[:20],
        "error_count": tally.outcomes.get("error", 0),
        "server_finished": finished,
        "server_steps": int(values.get("servelab_steps_total", 0)),
        "kv_total_slots": int(values["servelab_kv_slots_total"]),
        "kv_allocated_slots_at_end": int(values["servelab_kv_slots_allocated"]),
        "requests_in_flight_at_end": int(values.get("servelab_requests_in_flight", -1)),
        "pool_full_at_end": values["servelab_kv_slots_allocated"] == 0,
        "exit_status": status,
        "memory": memory.growth(args.warmup),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("engine", "serve"))
    parser.add_argument("overrides", nargs="*", help="config overrides (engine.kv_budget=...)")
    parser.add_argument("--strategy", default="vllm")
    parser.add_argument("--requests", type=int, default=2000, help="engine: how many")
    parser.add_argument("--in-flight", type=int, default=16, help="engine: at a time")
    parser.add_argument("--sample-every", type=int, default=50, help="engine: RSS every N")
    parser.add_argument("--minutes", type=float, default=30.0, help="serve: how long")
    parser.add_argument("--clients", type=int, default=8, help="serve: closed-loop clients")
    parser.add_argument("--cancel", type=float, default=0.1, help="serve: share hanging up")
    parser.add_argument("--bad", type=float, default=0.02, help="serve: share refused")
    parser.add_argument("--rss-period", type=float, default=10.0, help="serve: seconds")
    parser.add_argument("--warmup", type=float, default=0.2, help="share of samples skipped")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args()
    summary = soak_engine(args) if args.mode == "engine" else soak_serve(args)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    clean = summary["error_count"] == 0 and summary["pool_full_at_end"]
    sys.exit(0 if clean else 1)


if __name__ == "__main__":
    main()
