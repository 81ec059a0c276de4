"""The load generator checked on every endpoint run: did the client send the arrivals the
workload configured, or did it fall behind (and report its own limit as the server's)?

From the requests' send times (`t_send`) against their scheduled times: the configured and
the achieved rate (requests sent, less one, over the span of their sends), the send lag's
p50, p99 and max, the share sent more than `LATE_S` late, and a Kolmogorov-Smirnov test of
the gaps between consecutive sends against the configured process's gaps (exponential for
Poisson, gamma for gamma arrivals): a small p-value says the server saw another process than
the one configured. The fit judges the gaps' distribution at `LATE_S` and beyond, the scale
at which the project calls a send late: below it a gap's shape is the client's own timing
(one process serialises its sends, so gaps under a fraction of a millisecond come out a
little longer), which the send lag judges, and which a server forming a batch each step
cannot tell apart; over tens of thousands of gaps that shift alone would reject any fit.
A run whose send lag's p99 passes its bound is flagged (`flags.SEND_LAG`), one whose fit
fails is flagged too (`flags.ARRIVALS_OFF`); gates refuse both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from servelab.base.records import RequestRecord
from servelab.workloads.arrivals import ArrivalSpec

LATE_S = 0.010


@dataclass(frozen=True)
class LoadGenerator:
    process: str
    configured_rate: float | None
    achieved_rate: float | None
    sent: int
    lag_p50_s: float | None
    lag_p99_s: float | None
    lag_max_s: float | None
    late_share: float | None  # sent more than LATE_S after their scheduled time
    ks_statistic: float | None  # the sent gaps against the configured process's
    ks_p_value: float | None

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "late_s": LATE_S}


def load_generator(records: Sequence[RequestRecord], spec: ArrivalSpec) -> LoadGenerator:
    sent = sorted((r for r in records if r.t_send is not None), key=lambda r: r.t_send or 0.0)
    times = np.array([r.t_send for r in sent], dtype=np.float64)
    lags = np.array([(r.t_send or 0.0) - r.t_scheduled for r in sent], dtype=np.float64)
    span = float(times[-1] - times[0]) if times.size > 1 else 0.0
    statistic, p_value = gaps_fit(np.diff(times), spec, resolution_s=LATE_S)
    return LoadGenerator(
        process=spec.process,
        configured_rate=spec.rate,
        achieved_rate=(times.size - 1) / span if span > 0 else None,
        sent=int(times.size),
        lag_p50_s=_percentile(lags, 50),
        lag_p99_s=_percentile(lags, 99),
        lag_max_s=float(lags.max()) if lags.size else None,
        late_share=float((lags > LATE_S).mean()) if lags.size else None,
        ks_statistic=statistic,
        ks_p_value=p_value,
    )


def gaps_fit(
    gaps: np.ndarray, spec: ArrivalSpec, resolution_s: float = 0.0
) -> tuple[float | None, float | None]:
    """The one-sample KS statistic of `gaps` against the process's gap distribution, the
    largest distance between the two distribution functions at `resolution_s` and beyond,
    and its p-value by the Kolmogorov distribution (for a resolution above zero an upper
    bound: the distance over part of the range is at most the one over all of it, so the
    test errs towards not flagging); (None, None) for a process without a gap distribution,
    or fewer than 8 gaps."""
    if spec.process not in ("poisson", "gamma") or spec.rate is None or gaps.size < 8:
        return None, None
    n = gaps.size
    ordered = np.sort(gaps)
    shape = spec.burstiness if spec.process == "gamma" else 1.0
    cdf = _gamma_cdf(np.append(ordered, resolution_s), shape, spec.rate)
    above = np.arange(1, n + 1) / n - cdf[:-1]  # the empirical function at each gap
    below = cdf[:-1] - np.arange(n) / n  # and just before it
    judged = ordered > resolution_s
    at_resolution = abs(np.searchsorted(ordered, resolution_s, side="right") / n - cdf[-1])
    statistic = float(max(at_resolution, above[judged].max(initial=0.0),
                          below[judged].max(initial=0.0)))  # fmt: skip
    return statistic, kolmogorov_p(statistic, n)


def _gamma_cdf(gaps: np.ndarray, shape: float, rate: float) -> np.ndarray:
    """The distribution function of gamma gaps of mean 1 / rate (exponential at shape 1)."""
    scaled = torch.as_tensor(gaps * rate * shape, dtype=torch.float64)
    return torch.special.gammainc(torch.tensor(shape, dtype=torch.float64), scaled).numpy()


def kolmogorov_p(statistic: float, n: int) -> float:
    """P(D_n >= statistic) by the Kolmogorov distribution, with Stephens' small-n correction."""
    root = math.sqrt(n)
    x = (root + 0.12 + 0.11 / root) * statistic
    if x < 0.2:
        return 1.0
    total = sum((-1) ** (k - 1) * math.exp(-2 * k * k * x * x) for k in range(1, 101))
    return float(min(max(2 * total, 0.0), 1.0))


def _percentile(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q, method="linear")) if values.size else None
