"""The knee search on made-up systems (no model runs), and the verdict's interval."""

from __future__ import annotations

import pytest

from servelab.harness.measure.verdict import Verdict, attainment, verdict, wilson
from servelab.harness.search.knee import Knee, KneeSettings, Outcome, Probe, find_knees

SETTINGS = KneeSettings(
    target=0.9,
    resolution=0.1,
    requests=48,
    max_requests=96,
    floor_requests=8,
    ceiling_requests=16,
    confidence=0.95,
)


class System:
    """A made-up strategy: every request meets the SLO below `knee` req/s, none above;
    `straddle` rates give a share near the target; every probe costs its requests / rate."""

    def __init__(self, knee: float, ceiling: float, straddle: tuple[float, float] = (0, 0)):
        self.knee, self.top, self.straddle = knee, ceiling, straddle
        self.calls: list[tuple[str, float | None, int]] = []
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def _outcome(self, met: int, requests: int, seconds: float) -> Outcome:
        self.now += seconds
        return Outcome("dir", attainment(met, requests, 0.95), self.top, seconds, seconds)

    def floor(self, requests: int) -> Outcome:
        self.calls.append(("floor", None, requests))
        return self._outcome(requests if self.knee > 0 else 0, requests, 1.0)

    def ceiling(self, requests: int) -> Outcome:
        self.calls.append(("ceiling", None, requests))
        return self._outcome(0, requests, 2.0)

    def at(self, rate: float, requests: int, repeat: int = 0) -> Outcome:
        self.calls.append(("rate", rate, requests))
        low, high = self.straddle
        if low <= rate <= high:
            met = round(requests * 0.88)  # straddles 0.9 at 48 and at 96 requests
        else:
            met = requests if rate <= self.knee else 0
        return self._outcome(met, requests, requests / rate)


def _search(system: System, budget_s: float = 1e6) -> Knee:
    return find_knees({"s": system}, SETTINGS, budget_s, clock=system.clock)[0]


def test_the_knee_is_bracketed_within_the_resolution() -> None:
    system = System(knee=3.0, ceiling=10.0)
    knee = _search(system)
    assert knee.resolved and knee.ceiling == 10.0
    assert knee.passed is not None and knee.failed is not None
    assert knee.passed <= 3.0 < knee.failed and knee.failed / knee.passed <= 1.1
    rates = [rate for kind, rate, _ in system.calls if kind == "rate"]
    assert rates[:2] == [5.0, 2.5]  # from half the ceiling down by halves, then bisection
    assert [kind for kind, _, _ in system.calls[:2]] == ["floor", "ceiling"]


def test_a_slo_missed_one_request_at_a_time_sustains_no_rate() -> None:
    knee = _search(System(knee=0.0, ceiling=10.0))
    assert knee.resolved and knee.passed is None and "no rate is sustained" in knee.note
    assert [p.kind for p in knee.probes] == ["floor"]


def test_a_slo_that_never_binds_puts_the_knee_at_the_ceiling() -> None:
    knee = _search(System(knee=100.0, ceiling=10.0))
    assert knee.resolved and knee.failed is None and knee.upper == 10.0
    assert knee.passed is not None and 10.0 / knee.passed <= 1.1 and "near it" in knee.note


def test_a_probe_at_the_knee_is_lengthened_and_steers_by_its_estimate() -> None:
    system = System(knee=3.0, ceiling=10.0, straddle=(2.4, 2.6))
    seen: list[tuple[str, Probe]] = []
    (knee,) = find_knees(
        {"s": system}, SETTINGS, 1e6, system.clock, lambda s, p: seen.append((s, p))
    )
    at_knee = [p for p in knee.probes if p.kind == "rate" and p.verdict is Verdict.KNEE]
    assert [(p.rate, p.requests) for p in at_knee] == [(2.5, 48), (2.5, 96)]  # both evidence
    assert ("rate", 2.5, 48) in system.calls and ("rate", 2.5, 96) in system.calls
    assert seen == [("s", p) for p in knee.probes]  # each probe told as it ended, in order
    assert len(knee.probes) == len(system.calls)
    assert knee.failed == 5.0 and knee.passed is not None and knee.passed < 2.5  # clear verdicts


def test_a_probe_that_does_not_fit_the_budget_is_not_run() -> None:
    system = System(knee=3.0, ceiling=10.0)
    knee = _search(system, budget_s=40.0)  # floor 1 s, ceiling 2 s, 5 req/s 9.6 s, 2.5: 19.2
    assert not knee.resolved and "budget spent" in knee.note
    assert system.now <= 40.0


class SharedClock:
    """One clock for several made-up systems: each probe advances it by its cost."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Sharing(System):
    def __init__(self, clock: SharedClock, knee: float, ceiling: float) -> None:
        super().__init__(knee, ceiling)
        self.shared = clock

    def _outcome(self, met: int, requests: int, seconds: float) -> Outcome:
        self.shared.now += seconds
        return super()._outcome(met, requests, seconds)


def test_a_shared_budget_brackets_every_knee_before_refining_any() -> None:
    """Three strategies and a budget too small to resolve all three, large enough that no
    probe before a pass exceeds its strategy's share: every one's anchors run first, then
    every knee gets a passing rate before any bracket is narrowed."""
    clock = SharedClock()
    systems = {
        name: Sharing(clock, knee, 10.0) for name, knee in [("a", 3.0), ("b", 1.5), ("c", 4.0)]
    }
    order: list[tuple[str, str, float | None]] = []
    knees = find_knees(
        systems, SETTINGS, 220.0, clock, lambda s, p: order.append((s, p.kind, p.rate))
    )
    assert [kind for _, kind, _ in order[:6]] == ["floor", "ceiling"] * 3
    assert [s for s, _, _ in order[:6]] == ["a", "a", "b", "b", "c", "c"]
    assert all(k.passed is not None for k in knees)  # every knee bracketed ...
    assert not all(k.resolved for k in knees)  # ... though the budget resolves not all
    rates = [(i, s, rate) for i, (s, kind, rate) in enumerate(order) if kind == "rate"]
    first_pass = {
        name: min(i for i, s, rate in rates if s == name and rate <= systems[name].knee)
        for name in systems
    }
    refining = [i for i, s, _ in rates if i > first_pass[s]]  # a bracket narrowed
    assert refining and min(refining) > max(first_pass.values())  # only once all had a pass
    assert clock.now <= 220.0
    assert all("budget spent" in k.note for k in knees if not k.resolved)


def test_a_knee_far_below_its_ceiling_does_not_starve_the_others() -> None:
    """ "a" fails at every rate down to a fiftieth of its ceiling, each halving twice the cost
    of the last; with turns by time spent, "b" and "c" still find a passing rate in a budget
    that "a" alone would spend (taking turns in order of the strategies, "c" would get none)."""
    clock = SharedClock()
    systems = {
        name: Sharing(clock, knee, 10.0) for name, knee in [("a", 0.2), ("b", 3.0), ("c", 4.0)]
    }
    order: list[str] = []
    knees = find_knees(systems, SETTINGS, 200.0, clock, lambda s, p: order.append(s))
    a, b, c = knees
    assert a.passed is None and b.passed is not None and c.passed is not None
    assert order[6:9] == ["a", "b", "c"]  # after the anchors, one turn each
    assert clock.now <= 200.0


def test_a_probe_too_long_for_the_budget_gives_way_to_one_that_fits() -> None:
    """A slow strategy's next probe would overrun the budget; a fast one's still fits, and
    runs, so the budget is not left idle."""
    clock = SharedClock()
    systems = {"slow": Sharing(clock, 0.02, 0.1), "fast": Sharing(clock, 3.0, 10.0)}
    knees = find_knees(systems, SETTINGS, 150.0, clock)
    slow, fast = knees
    assert "budget spent" in slow.note and slow.passed is None  # 48 / 0.05 = 960 s: too long
    assert fast.passed is not None  # ran after the slow one's probe was refused
    assert clock.now <= 150.0


@pytest.mark.parametrize(
    ("met", "counted", "expected"),
    [(48, 48, Verdict.PASS), (44, 48, Verdict.KNEE), (30, 48, Verdict.FAIL), (0, 0, Verdict.FAIL)],
)
def test_a_verdict_is_pass_or_fail_only_when_its_interval_says_so(
    met: int, counted: int, expected: Verdict
) -> None:
    assert verdict(attainment(met, counted, 0.95), 0.9) is expected


def test_the_wilson_interval_matches_its_closed_form() -> None:
    low, high = wilson(44, 48, 0.95)
    assert low == pytest.approx(0.8045, abs=1e-4) and high == pytest.approx(0.9671, abs=1e-4)
    assert wilson(0, 0, 0.95) == (0.0, 1.0)


def test_a_strategy_slowed_on_purpose_moves_its_knee_down_by_the_factor(tmp_path) -> None:
    """The same search on the tiny model with every step delayed by d, then by 2d and every
    SLO limit doubled: the whole system runs twice as slow (the delay dwarfs the tiny model's
    own step), so its knee should about halve: the two brackets hold a ratio near 2. Static
    batching, whose waits grow with the load well before its throughput ceiling."""
    from servelab.harness.commands.config import compose
    from servelab.harness.commands.search import search
    from servelab.harness.runner.run import run
    from servelab.harness.search.knee import ratio_interval

    def knee_at(delay: float) -> Knee:
        overrides = [
            "model=dummy-tiny", "engine.dtype=fp32", "telemetry.roofline=false",
            "workload=random", "workload.input_len.dist=fixed", "workload.input_len.value=8",
            "workload.output_len.value=6", "engine.max_batch_size=8",
            f"+engine.test_step_delay_s={delay}", f"slo.e2e_s={16 * delay}",
            "+slo.attainment=0.75", "search.strategies=[fastertransformer]",
            "search.requests=32", "search.max_requests=32", "search.floor_requests=4",
            "search.ceiling_requests=32",
            "search.resolution=0.3",
            "search.budget_s=200", f"search.out_dir={tmp_path / str(delay)}",
        ]  # fmt: skip
        knees, _ = search(overrides, compose, lambda cfg, d: run(cfg, d, progress=False))
        return knees[0]

    fast, slow = knee_at(0.04), knee_at(0.08)
    assert fast.resolved and slow.resolved
    low, high = ratio_interval(fast, slow)  # the tiny model's own step time keeps it under 2
    assert low is not None and high is not None and low <= 2.2 and high >= 1.6, (low, high)
    assert fast.estimate is not None and slow.estimate is not None
    assert fast.estimate / slow.estimate == pytest.approx(2.0, rel=0.3)


def test_a_probe_line_says_what_ran_and_what_it_showed() -> None:
    from servelab.harness.commands.search import probe_line

    stopped = Outcome("d", attainment(38, 48, 0.95), 0.9, 41.2, 40.0, stopped=True)
    line = probe_line("vllm", Probe("rate", 0.58, 48, Verdict.FAIL, stopped))
    assert line == (
        "  vllm: 0.58 req/s, 48 requests: fail, at most 38/48 (stopped early) met the SLO "
        "[0.66, 0.88] (41 s)"
    )
    top = Outcome("d", attainment(0, 16, 0.95), 1.16, 16.0, 14.0)
    line = probe_line("vllm", Probe("ceiling", None, 16, Verdict.FAIL, top))
    assert line == (
        "  vllm: all at once, 16 requests: fail, 0/16 met the SLO [0.00, 0.19], "
        "1.16 req/s served (16 s)"
    )
    waited = Outcome("d", attainment(44, 48, 0.95), 0.05, 96.3, 950.0, idle_skipped_s=861.52)
    line = probe_line("fastertransformer", Probe("rate", 0.0507, 48, Verdict.KNEE, waited))
    assert line == (
        "  fastertransformer: 0.0507 req/s, 48 requests: knee, 44/48 met the SLO [0.80, 0.97] "
        "(96 s, 862 s idle skipped)"
    )


def test_scaled_limits_are_multiples_of_the_reference_floor(tmp_path, capsys) -> None:
    """`search.slo_scale`: one floor run of the first strategy, then every probe of every
    strategy runs under limits that are those multiples of it (one prompt length: TTFT's
    line is its median, with no per-token part; a given per-token part is replaced too). The
    multiples are wide: the tiny model's floor takes milliseconds, which a busy machine doubles."""
    import json

    from omegaconf import OmegaConf

    from servelab.harness.commands.config import compose
    from servelab.harness.commands.search import search
    from servelab.harness.runner.run import run

    overrides = [
        "model=dummy-tiny", "engine.dtype=fp32", "telemetry.roofline=false", "workload=random",
        "workload.input_len.dist=fixed", "workload.input_len.value=8",
        "workload.output_len.value=6", "search.strategies=[fastertransformer,vllm]",
        "search.slo_scale.ttft_s=40", "search.slo_scale.normalized_latency_s=20",
        "slo.ttft_s=99", "slo.ttft_per_prompt_token_s=1", "search.floor_requests=3",
        "search.ceiling_requests=4",
        "search.budget_s=0.01", f"search.out_dir={tmp_path}",
    ]  # fmt: skip
    search(overrides, compose, lambda cfg, d: run(cfg, d, progress=False))
    reference = json.loads(
        (tmp_path / "fastertransformer/reference-floor/summary.json").read_text()
    )
    ttft = float(f"{40 * reference['ttft']['p50']:.4g}")
    normalized = float(f"{20 * reference['normalized_latency']['p50']:.4g}")
    out = capsys.readouterr().out
    assert "SLO scaled from fastertransformer's requests one at a time" in out
    assert "machine speed: one request at a time, median TPOT" in out
    recorded = json.loads((tmp_path / "search.json").read_text())["drift"]
    end = json.loads((tmp_path / "fastertransformer/reference-floor-end/summary.json").read_text())
    assert recorded["after_s"] == end["tpot"]["p50"]
    assert recorded["before_s"] == reference["tpot"]["p50"]
    for probe in ("fastertransformer/floor", "fastertransformer/ceiling", "vllm/floor"):
        slo = OmegaConf.load(tmp_path / probe / "config.yaml").slo
        assert (slo.ttft_s, slo.normalized_latency_s) == (ttft, normalized), probe
        assert slo.ttft_per_prompt_token_s is None, probe


def test_a_scaled_limit_must_name_a_limit() -> None:
    from servelab.harness.commands.config import compose
    from servelab.harness.commands.search import SearchSettings
    from servelab.harness.errors import ConfigError

    with pytest.raises(ConfigError, match=r"search\.slo_scale\.ttft: not a limit"):
        SearchSettings.of(compose(["+search.slo_scale.ttft=4"]))


def test_steering_bounds_that_meet_without_a_clear_pass_are_not_resolved() -> None:
    """Below the knee every probe straddles the target (46 of 48 met: likely, not clearly,
    passing); above it every probe stops early as a failure, at most 39 of 48. The search
    halves down to a 64th of the ceiling for a clear pass, finds none, and bisects: the
    steering bounds meet, but no rate clearly passed and the fit on those bounds is wider
    than 10%, so the knee is not resolved."""

    class Straddling(System):
        def at(self, rate: float, requests: int, repeat: int = 0) -> Outcome:
            self.calls.append(("rate", rate, requests))
            if rate <= self.knee:
                return self._outcome(round(requests * 46 / 48), requests, requests / rate)
            self.now += 1.0
            measured = attainment(39, 48, 0.95)
            return Outcome("dir", measured, self.top, 1.0, 1.0, stopped=True)

    system = Straddling(knee=3.0, ceiling=10.0)
    knee = _search(system)
    assert min(rate for kind, rate, _ in system.calls if kind == "rate") == 10.0 / 64
    assert knee.passed is None and knee.failed is not None
    assert knee.fit is not None and knee.fit.width > 1.1
    assert not knee.resolved
    assert "no rate clearly passed: the knee is below the lowest failure" in knee.note


class Shallow(Sharing):
    """Every request meets the SLO up to 0.7 req/s, 92% of them up to `knee` (likely passing:
    the interval straddles 0.9 at 48 and at 96 requests), none above."""

    def at(self, rate: float, requests: int, repeat: int = 0) -> Outcome:
        self.calls.append(("rate", rate, requests))
        share = 1.0 if rate <= 0.7 else 0.92 if rate <= self.knee else 0.0
        return self._outcome(round(requests * share), requests, requests / rate)


def test_a_shallow_curve_is_halved_below_its_likely_pass_until_one_clearly_passes() -> None:
    """2.5 and 1.25 likely pass, 0.625 clearly does: the bracket's lower end. The bisection
    then goes on upward from the highest likely pass, 2.5, not from the clear one."""
    system = Shallow(SharedClock(), knee=3.0, ceiling=10.0)
    knee = _search(system)
    rates = [(rate, n) for kind, rate, n in system.calls if kind == "rate"]
    assert rates[:6] == [(5.0, 48), (2.5, 48), (2.5, 96), (1.25, 48), (1.25, 96), (0.625, 48)]
    assert 2.5 < rates[6][0] < 5.0  # bisecting from the highest likely pass
    assert knee.passed == 0.625 and knee.failed is not None and knee.failed > 3.0


def test_a_likely_pass_is_no_lower_end_when_the_budget_chooses() -> None:
    """ "b" passes clearly at 2.5 req/s; "shallow" only likely passes there. Shallow alone has
    no lower end, so its halving for a clear pass goes before any probe narrowing b's bracket,
    though it has spent more on rate probes than b."""
    clock = SharedClock()
    systems = {"shallow": Shallow(clock, 3.0, 10.0), "b": Sharing(clock, 3.0, 10.0)}
    order: list[tuple[str, float | None, Verdict]] = []
    shallow, _ = find_knees(
        systems, SETTINGS, 1e6, clock, lambda s, p: order.append((s, p.rate, p.verdict))
    )
    b_passed = order.index(("b", 2.5, Verdict.PASS))
    shallow_passed = order.index(("shallow", 0.625, Verdict.PASS))
    b_refining = [i for i, (s, _, _) in enumerate(order) if s == "b" and i > b_passed]
    assert b_passed < shallow_passed < min(b_refining)
    assert shallow.passed == 0.625


def test_a_knee_with_no_lower_end_goes_before_the_bracketed_ones_refine() -> None:
    """ "slow" passes nothing down to a 32nd of its ceiling, each halving twice the cost of the
    last. Once "b" has a rate passed, slow's probes go first whatever their share (0.125 req/s
    takes 384 s, over half the budget), since a knee with no lower end is less known than b's
    bracket; b refines on what is left once slow's next halving (768 s) no longer fits."""
    clock = SharedClock()
    systems = {"slow": Sharing(clock, 0.02, 1.0), "b": Sharing(clock, 3.0, 10.0)}
    order: list[tuple[str, float | None, Verdict]] = []
    slow, b = find_knees(
        systems, SETTINGS, 1000.0, clock, lambda s, p: order.append((s, p.rate, p.verdict))
    )
    b_passed = min(i for i, (s, _, v) in enumerate(order) if s == "b" and v is Verdict.PASS)
    slow_probe = order.index(("slow", 0.125, Verdict.FAIL))
    b_refining = [i for i, (s, _, _) in enumerate(order) if s == "b" and i > b_passed]
    assert b_passed < slow_probe < min(b_refining)
    assert b.resolved and b.passed is not None and b.failed is not None
    assert b.failed / b.passed <= 1.1
    assert slow.passed is None and not slow.resolved and "0.0625 req/s" in slow.note
    assert clock.now <= 1000.0


def test_bounds_that_meet_wider_than_the_clear_verdicts_are_refined_on_new_requests() -> None:
    """Every probe between 2.6 and 3 req/s straddles the target (44 of 48, 88 of 96), 2.5
    clearly passes and the rates above 3 clearly fail (half met): the steering bounds meet
    near 2.8 while the clear verdicts say [2.5, 3.1) and the fit is wider than 10%. The
    search goes on at the fitted knee, each probe on the next workload seed (the same seed
    would be the same run) and max_requests long: within a short budget it ends unresolved,
    saying so; given time, the fit comes within 10% and resolves it."""

    class Plateau(System):
        def __init__(self) -> None:
            super().__init__(knee=3.0, ceiling=10.0)
            self.repeats: list[int] = []

        def at(self, rate: float, requests: int, repeat: int = 0) -> Outcome:
            self.calls.append(("rate", rate, requests))
            self.repeats.append(repeat)
            share = 1.0 if rate <= 2.6 else 0.92 if rate <= 3.0 else 0.5
            return self._outcome(round(requests * share), requests, requests / rate)

    short = Plateau()
    knee = _search(short, budget_s=400.0)
    assert knee.passed == 2.5 and knee.failed is not None and knee.failed / knee.passed > 1.1
    assert not knee.resolved and "budget spent" in knee.note
    refined = [r for r in short.repeats if r > 0]
    assert refined == list(range(1, len(refined) + 1)) and len(refined) >= 2
    rate_calls = [n for kind, _, n in short.calls if kind == "rate"]
    assert all(
        n == SETTINGS.max_requests for n, r in zip(rate_calls, short.repeats, strict=True) if r > 0
    )
    long = Plateau()
    knee = _search(long)
    assert knee.resolved and knee.fit is not None and knee.fit.width <= 1.1
    assert knee.failed is not None and knee.failed / knee.passed > 1.1  # the fit resolved it


def test_a_repeat_probe_draws_the_workload_with_the_next_seed_in_its_own_directory(
    tmp_path,
) -> None:
    """The prober behind `servelab search`: a repeat at a rate is a new run on other requests
    (workload seed + repeat, its own directory), never the first probe's run reused."""
    from servelab.harness.commands.config import compose
    from servelab.harness.commands.search import RunProber, SearchSettings, SimulatedClock

    seen: list[tuple[int, str]] = []

    def record(cfg, run_dir) -> dict:
        seen.append((int(cfg.workload.seed), run_dir.name))
        return {"status": "complete", "completed": 4, "slo_attainment": 1.0, "duration_s": 1.0}

    overrides = ["slo.ttft_s=1", f"search.out_dir={tmp_path}"]
    settings = SearchSettings.of(compose(overrides))
    simulated = SimulatedClock()  # over simulated runs the budget counts simulated seconds
    prober = RunProber(overrides, "vllm", settings, compose, record, simulated)
    first = prober.at(0.5, 4)
    prober.at(0.5, 4, repeat=2)
    assert seen == [(0, "rate-0.5-n4"), (2, "rate-0.5-n4-repeat2")]
    assert first.seconds == 1.0 and simulated() == 2.0


def test_a_probe_that_skips_its_idle_spans_is_costed_at_its_busy_time() -> None:
    """The floor served 8 requests in 1 s: 0.125 s each alone. At half the ceiling (5 req/s,
    0.2 s apart) a probe's 48 requests span 9.6 s; skipping the idle between them, about
    48 x 0.125 = 6 s. Both add the drain of one request alone (the ceiling loaded nothing)."""
    from dataclasses import replace

    from servelab.harness.search.knee import KneeSearch

    def first_wanted(settings: KneeSettings) -> float:
        search = KneeSearch("s", System(knee=3.0, ceiling=10.0), settings, lambda s, p: None)
        search.anchor()
        return search.wanted(1e6).cost_s

    assert first_wanted(SETTINGS) == pytest.approx(48 * 0.2 + 0.125)
    assert first_wanted(replace(SETTINGS, skip_idle=True)) == pytest.approx(48 * 0.125 + 0.125)
