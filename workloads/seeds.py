"""Independent random streams derived from one workload seed.

Each concern (input lengths, output lengths, arrivals, prompt content, sampling seeds)
draws from its own generator, so changing one part of a config (say the arrival rate)
leaves every other part of the workload exactly as it was.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np


class Stream(IntEnum):
    """The concerns that draw random numbers; the value is mixed into the seed."""

    INPUT_LEN = 1
    OUTPUT_LEN = 2
    ARRIVAL = 3
    PROMPT = 4
    SAMPLING = 5


def stream(seed: int, which: Stream) -> np.random.Generator:
    """The generator for one concern of a workload with this seed."""
    return np.random.default_rng([seed, int(which)])
