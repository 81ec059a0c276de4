"""The machine fingerprint an absolute bound is recorded with.

A ratio of two strategies measured side by side carries over from one machine to another; an
absolute time or rate does not. A gate may hold an absolute bound on a timing metric only
together with the fingerprint of the machine the bound was measured on, and applies it only
where the fingerprint matches. The fingerprint covers what decides speed: the CPU model, its
cores and matrix-relevant instruction sets, the threads torch uses, the memory, any GPUs, and
the torch version; it is the first 12 hex digits of the sha256 of those, as sorted JSON.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import torch

from servelab.harness.measure.meta import cpu_info


@dataclass(frozen=True)
class Fingerprint:
    id: str
    parts: dict[str, Any]


def machine_parts() -> dict[str, Any]:
    """What the fingerprint is made of, on this machine."""
    cpu = cpu_info()
    gpus = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            gpus.append(f"{props.name} (sm {props.major}.{props.minor})")
    return {
        "cpu": cpu["model"],
        "logical_cores": cpu["logical_cores"],
        "torch_threads": cpu["torch_threads"],
        "cpu_flags": cpu["flags"],
        "memory_gib": round(cpu["memory_total_gib"]),
        "gpus": gpus,
        "torch": torch.__version__,
    }


def fingerprint_of(parts: dict[str, Any]) -> Fingerprint:
    text = json.dumps(parts, sort_keys=True)
    return Fingerprint(hashlib.sha256(text.encode()).hexdigest()[:12], parts)


def machine_fingerprint() -> Fingerprint:
    return fingerprint_of(machine_parts())
