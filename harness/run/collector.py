"""Pausing Python's cyclic garbage collector where a run holds millions of objects.

A run keeps every record it writes, for its own summary and report (`RunWriter(keep=True)`):
a 10,000-request simulation holds 550,000 step records, and each full pass of the collector
walks all of them. Those passes were a seventh of such a run, spread over its loop and its
summary, and recovered nothing: the loop's and the summary's objects are freed by their
reference counts. `collector_paused` holds the collector off for such a stretch; any cycle
made meanwhile is collected after it. A client sending requests on a schedule holds them
all too, and a full pass over them paused its sends long enough to move its arrivals off
their schedule (the run's `send_lag` shows it): `heap_frozen` leaves what
was built before it out of every pass (`gc.freeze`) while the collector still runs.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Within: no cyclic garbage collection; the collector as it was after, however it ends."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextmanager
def heap_frozen() -> Iterator[None]:
    """Within: every object alive on entry is left out of the collector's passes; returned to
    them after, however it ends."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
