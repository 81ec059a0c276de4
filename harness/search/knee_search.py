"""The knee search as a whole: settings read once, the SLO fixed before the first probe, every
contender's knee found (`strategy_search.find_knees`) on runs of its config (`contenders`:
servelab's strategies in this process, servers the search starts, servers already running;
`probes`, `served`), each in-process one first placed by its prediction (`predict`, with
`search.predict`), the machine's speed drift measured around them, and `search.json` written.
A server starts once for all its contender's probes, off the budget's clock, and is stopped
after its last, or when the search ends however it ends (SIGTERM as Ctrl-C).

The SLO is `slo.*` as given, or scaled from one request at a time on this machine
(`search.slo_scale`, `slo.scaled`: the first contender's reference floor run before any
probe), or an earlier search's (`search.slo_from`, `slo.earlier_run`), so a repeat judges against
the same limits. Either of the last two runs the reference floor again after the last probe;
the speed drift between the two widens every knee's interval. Over simulated runs the budget
is in the seconds they simulate (`probes.SimulatedClock`). `servelab search` prints what this
returns; `servelab plan` and `scripts/simulation_accuracy.py` call it on simulated runs.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

from omegaconf import DictConfig

from servelab.base.errors import ConfigError
from servelab.harness.measure.flags import BUSY_MACHINE, ESTIMATED
from servelab.harness.measure.slo.earlier_run import SourceSLO, judged_record, read_source, with_slo
from servelab.harness.measure.slo.limits import LIMITS, SLO
from servelab.harness.measure.slo.scaled import limits_line, scaled_keys, scaled_limits, speed_drift
from servelab.harness.measure.slo.sources import one_source_each
from servelab.harness.run.backends import backend_of
from servelab.harness.run.schema import checked
from servelab.harness.run.servers.managed import sigterm_exits
from servelab.harness.run.settings import device_line, engine_settings
from servelab.harness.search.contenders import Contender, contenders_of, reference_of
from servelab.harness.search.policy import Prediction, ProbePolicy
from servelab.harness.search.predict import Predictor
from servelab.harness.search.probe_ratios import fewest_requests
from servelab.harness.search.probes import RunFn, RunProber, SimulatedClock
from servelab.harness.search.result import StrategyResult
from servelab.harness.search.served import OffClock, ServedProber
from servelab.harness.search.strategy_search import ProbeSeen, find_knees, widened_for_drift

# flags a probe's run may carry that the search says at its end: (code, search.json's key, what)
FLAGGED = (
    (BUSY_MACHINE, "busy_probes", "other processes shared the machine: requests ran slower than "
     "this machine runs alone"),
    (ESTIMATED, "estimated_probes", "a server did not report its tokens (counts or times "
     "estimated from its text: see the run's summary)"),
)  # fmt: skip
Say = Callable[[str], None]  # a line for the person watching, as the search goes


@dataclass(frozen=True)
class SearchSettings:
    strategies: tuple[str, ...]
    budget_s: float
    out_dir: Path
    policy: ProbePolicy
    slo_scale: dict[str, float]  # limit -> multiple of one request at a time (`slo.scaled`)
    slo_from: (
        SourceSLO | None
    )  # an earlier search's SLO, judged against instead (`slo.earlier_run`)
    predict: bool = False  # place the first rate probes where the simulator says they decide
    # (the engine in this process only: a simulation needs none, a peer's steps are not
    # profiled; harness/search/predict.py)
    reference: str | None = None  # the contender whose floor scales the SLO (None: the first)

    @property
    def measures_speed(self) -> bool:
        """Whether the reference floor runs before the first probe and after the last."""
        return bool(self.slo_scale) or self.slo_from is not None

    @classmethod
    def of(cls, cfg: DictConfig) -> SearchSettings:
        node = cfg.search
        scales = (node.get("slo_scale") or {}).items()
        slo_scale = {str(k): v for k, v in scales if v is not None}
        for key, value in slo_scale.items():
            if key not in LIMITS:
                raise ConfigError(f"search.slo_scale.{key}", f"not a limit; one of {LIMITS}")
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"search.slo_scale.{key}", f"{value!r} must be positive")
        slo = SLO.of_config(cfg)
        given = node.get("slo_from")
        one_source_each(slo_scale, cfg.slo, given)
        slo_from = None if given is None else read_source(str(given), slo.attainment)
        if not slo.configured and not slo_scale and slo_from is None:
            raise ConfigError(
                "slo", "search needs at least one limit, e.g. slo.ttft_s=2 or slo.tpot_s=0.1"
            )
        strategies = checked(node, "search.strategies")
        if not strategies:
            raise ConfigError("search.strategies", "name at least one strategy preset")
        numbers = {
            key: float(checked(node, f"search.{key}"))
            for key in ("budget_s", "resolution", "confidence")
        }
        spans = {key: float(checked(node, f"search.{key}", 0)) for key in ("span", "warmup")}
        keys = ("requests", "max_requests", "floor_requests", "ceiling_requests")
        counts = {key: checked(node, f"search.{key}") for key in keys}
        if counts["max_requests"] < counts["requests"]:
            raise ConfigError(
                "search.max_requests",
                f"{counts['max_requests']} must be at least search.requests ({counts['requests']})",
            )
        least = fewest_requests(slo.attainment, numbers["confidence"])
        if counts["requests"] < least:
            raise ConfigError(
                "search.requests",
                f"{counts['requests']} requests cannot bound their {slo.attainment:g}-quantile "
                f"at {numbers['confidence']:.0%} confidence; give at least {least}",
            )
        policy = ProbePolicy(
            target=slo.attainment,
            resolution=numbers["resolution"],
            requests=counts["requests"],
            max_requests=counts["max_requests"],
            floor_requests=counts["floor_requests"],
            ceiling_requests=counts["ceiling_requests"],
            confidence=numbers["confidence"],
            skip_idle=checked(cfg.replay, "replay.skip_idle"),
            span=spans["span"],
            warmup=spans["warmup"],
        )
        predict = checked(node, "search.predict", False)
        reference = None if node.get("reference") is None else str(node.reference)
        return cls(strategies, numbers["budget_s"], Path(str(node.out_dir)), policy,
                   {key: float(value) for key, value in slo_scale.items()}, slo_from,
                   predict, reference)  # fmt: skip

    def plan_line(self, contenders: list[Contender]) -> str:
        """What the search will do, said before its first run."""
        policy = self.policy
        return (
            f"search: {', '.join(c.name for c in contenders)}; {self.budget_s:.0f} s in all, "
            "shared (servers' start-up outside it); "
            f"{policy.ceiling_requests} requests at once for the ceiling, {policy.requests} a rate "
            f"probe (up to {policy.max_requests} near the knee); the knee where the "
            f"{policy.target:g}-quantile of the requests' SLO ratios crosses 1, within "
            f"{policy.resolution:.0%} at {policy.confidence:.0%} confidence; probes under "
            f"{self.out_dir}"
            + (
                f"; the SLO of {self.slo_from.path}"
                if self.slo_from is not None
                else ("; the SLO scaled from a reference floor run" if self.slo_scale else "")
            )
            + (
                f"; a rate probe spans at least {policy.span:g} requests served alone"
                if policy.span
                else ""
            )
            + (
                f", its first {policy.warmup:g} a warm-up left out of its quantile"
                if policy.warmup
                else ""
            )
            + ("; probes skip their idle spans (replay.skip_idle)" if policy.skip_idle else "")
        )

    def to_json(self) -> dict:
        return {
            "strategies": list(self.strategies), "budget_s": self.budget_s,
            "out_dir": str(self.out_dir), "slo_scale": self.slo_scale,
            "slo_from": None if self.slo_from is None else str(self.slo_from.path),
            "predict": self.predict, "reference": self.reference, **asdict(self.policy),
        }  # fmt: skip


@dataclass(frozen=True)
class SearchResult:
    knees: list[StrategyResult]
    settings: SearchSettings
    record: dict  # what search.json holds


def search(
    overrides: list[str],
    compose: Callable[[list[str]], DictConfig],
    run: RunFn,
    say: Say = lambda line: None,
    seen: ProbeSeen = lambda strategy, probe: None,
) -> SearchResult:
    """Every contender's knee under one SLO, within the budget; `say` hears each line of
    progress, `seen` each probe as it ends. Every server it starts is stopped when it returns,
    however it returns (an error, Ctrl-C, SIGTERM)."""
    begun = time.monotonic()
    cfg = compose(overrides)
    settings = SearchSettings.of(cfg)
    contenders = contenders_of(settings.strategies, overrides, compose)
    first = reference_of(contenders, settings.reference)
    simulated = SimulatedClock() if backend_of(cfg) == "simulated" else None
    if simulated is not None and any(c.backend != "simulated" for c in contenders):
        raise ConfigError(
            "search.strategies", "a simulated search's contenders are simulated: no server"
        )
    engine = engine_settings(cfg.engine)
    say(device_line(engine))
    say(settings.plan_line(contenders))
    started = [c.name for c in contenders if c.server is not None]
    if started and engine.device.type == "cpu":
        say(
            f"note: {', '.join(started)} serve on this machine's {os.cpu_count()} CPU cores "
            "beside the client sending their requests, which takes its share of them; a "
            "contender in process has the client in its own process"
        )
    with sigterm_exits(), ExitStack() as stack:
        off = OffClock()
        clock = simulated or off
        deadline = clock() + settings.budget_s
        if settings.slo_from is not None:
            say(settings.slo_from.line())
        source = settings.slo_from
        configs = {
            c.name: c.cfg if source is None else with_slo(c.cfg, source.limits) for c in contenders
        }

        def prober(contender: Contender, keep: bool = False) -> RunProber:
            out_dir = settings.out_dir / contender.folder
            cfg, confidence = configs[contender.name], settings.policy.confidence
            if contender.server is None:
                return RunProber(cfg, out_dir, confidence, run, simulated)
            served = ServedProber(contender.name, cfg, contender.server, out_dir, confidence,
                                  run, off, say, keep)  # fmt: skip
            stack.callback(served.close)
            return served

        record: dict = {
            "settings": settings.to_json(),
            "contenders": [c.to_json() for c in contenders],
        }
        reference: dict = {}
        references = prober(first, keep=settings.measures_speed)
        if settings.measures_speed:
            reference, requests = references.reference(settings.policy.floor_requests)
        if settings.slo_from is not None:
            against = settings.slo_from.speed_against(first.name, reference)
            if against is not None:
                say(against.line())
                record["speed_against_slo_source"] = against.to_json()
        elif settings.slo_scale:
            limits = scaled_limits(settings.slo_scale, reference, requests)
            say(limits_line(first.name, settings.slo_scale, limits))
            values = {**{key: None for key in scaled_keys(settings.slo_scale)}, **limits}
            configs = {name: with_slo(c, values) for name, c in configs.items()}
            references.judge_by(configs[first.name])
        record["slo"] = judged_record(SLO.of_config(configs[first.name]))
        predictor = None
        predicted = {c.name for c in contenders if c.in_process}
        if settings.predict and predicted:
            in_process = {name: c for name, c in configs.items() if name in predicted}
            predictor = Predictor(in_process, settings.policy, settings.out_dir, run, say)
        probers = {c.name: references if c is first else prober(c) for c in contenders}
        left_s = max(deadline - clock(), 0.0)

        def predict(name: str) -> Prediction | None:
            assert predictor is not None
            return predictor(name) if name in predicted else None

        knees = find_knees(
            probers, settings.policy, left_s, clock, seen, predict if predictor else None
        )
        if predictor is not None:
            record["cost_models"] = predictor.models
        if settings.measures_speed:
            end, _ = references.reference(settings.policy.floor_requests, "reference-floor-end")
            drift = speed_drift(reference, end)
            if drift is not None:
                say(drift.line())
                record["drift"] = drift.to_json()
                widened_for_drift(knees, drift.factor, settings.policy.resolution)
    for code, key, meaning in FLAGGED:
        probes = flagged_probes(settings.out_dir, code)
        if probes:
            say(f"{meaning} in {len(probes)} probe(s) ({', '.join(probes)}; flag {code})")
            record[key] = probes
    record["wall_s"] = time.monotonic() - begun
    if off.started:
        record["servers"] = {"started_s": off.started, "off_budget_s": off.seconds}
        say(servers_line(off, record["wall_s"]))
    record["knees"] = [knee.to_json() for knee in knees]
    settings.out_dir.mkdir(parents=True, exist_ok=True)
    (settings.out_dir / "search.json").write_text(json.dumps(record, indent=2))
    return SearchResult(knees, settings, record)


def servers_line(off: OffClock, wall_s: float) -> str:
    """How long the search's servers took to start and warm up, outside its budget."""
    started = ", ".join(f"{name} {s:.1f} s" for name, s in off.started.items())
    return (
        f"servers: {len(off.started)} started ({started}); starting and warming them up took "
        f"{off.seconds:.0f} s, {off.seconds / wall_s:.0%} of the search's {wall_s:.0f} s, "
        "outside its budget; every one stopped"
    )


def flagged_probes(out_dir: Path, code: str) -> list[str]:
    """The probes (CONTENDER/PROBE) whose runs' summaries carry the flag `code`."""
    flagged = []
    for path in sorted(out_dir.glob("*/*/summary.json")):
        try:
            codes = json.loads(path.read_text()).get("flag_codes") or []
        except (OSError, json.JSONDecodeError):
            continue
        if code in codes:
            flagged.append(f"{path.parent.parent.name}/{path.parent.name}")
    return flagged
