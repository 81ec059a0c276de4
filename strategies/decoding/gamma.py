"""How many tokens a request drafts this step (`strategy.gamma_rule`).

- `fixed`: `strategy.gamma` every step.
- `adaptive`: from the request's running acceptance rate α̂ = (accepted + 1) / (proposed + 2)
  over its own verifications so far (1/2 before any), the gamma in 1..`strategy.gamma` that
  maximises the expected speedup (1 − α̂^(γ+1)) / ((1 − α̂)(γc + 1)), where c
  (`strategy.gamma_cost`) is what one draft token costs, drafting and verifying it, as a share
  of a target step. A request whose drafts keep failing drafts one token; one whose drafts
  keep passing drafts the most.

Either way gamma never exceeds what the request may still emit minus one (the target adds a
token of its own), nor what its context has room for.
"""

from __future__ import annotations

from servelab.engine.request import Request

RULES = ("fixed", "adaptive")


def expected_speedup(alpha: float, gamma: float, cost: float) -> float:
    """Tokens per unit of time against plain decoding: (1 − α^(γ+1)) / ((1 − α)(γc + 1)),
    whose limit at α = 1 is (γ + 1) / (γc + 1)."""
    tokens = gamma + 1 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return tokens / (gamma * cost + 1)


def running_acceptance(request: Request) -> float:
    """α̂ of the adaptive rule: accepted over proposed, with one of each counted in advance."""
    proposed = request.counters.get("spec_proposed", 0)
    accepted = request.counters.get("spec_accepted", 0)
    return (accepted + 1) / (proposed + 2)


def choose_gamma(request: Request, rule: str, gamma: int, cost: float, max_context: int) -> int:
    """Drafts for `request` this step; 0 when it may not speculate now."""
    if request.num_computed_tokens != request.num_tokens - 1 or not request.output_ids:
        return 0  # still prefilling, or before its first token
    room = min(
        request.sampling.max_tokens - len(request.output_ids), max_context - request.num_tokens
    )
    if rule == "adaptive":
        alpha = running_acceptance(request)
        gamma = max(range(1, gamma + 1), key=lambda g: expected_speedup(alpha, g, cost))
    return max(0, min(gamma, room - 1))
