"""The GPU check's summary (`scripts/gpu_check.sh`, its last step): the verdict first, then each
step's status and time, for each end-to-end run its outcome, throughput, latencies, telemetry,
whether its decode steps replayed CUDA graphs and their time against their memory floor, the
decode steps at batch 1, 32 and the largest against their floor, the profile window's
launches per decode step and the GPU's busy share, the kernel tests' counts
and failures, the timing tables, the calibrated peaks and the main job's answer. Markdown on
stdout; exits 1 when any step failed.

The floor of a decode step is the bytes it must read (weights and the KV it attends, the
roofline counters of `steps.jsonl`) over the device's peak bandwidth: the published figure
of a GPU preset whose name the device's matches (`harness.run.simulate.hardware`), else the
copy bandwidth calibrated on this machine (in the run's meta.json).

    python -m scripts.gpu_check_summary OUT
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

from servelab.base.records import StepRecord
from servelab.harness.checks.profiling import SUMMARY_NAME
from servelab.harness.measure.rundir import read_steps
from servelab.harness.run.simulate.cost_model import StepCostModel
from servelab.harness.run.simulate.hardware import PRESETS, preset_of_device
from servelab.models.dummy import DUMMY_SHAPES

TIMED_OUT = 124  # timeout(1)'s status
FLOOR_BATCHES = (1, 32)  # decode batches whose steps are set against their floor by themselves


def steps_table(out: Path) -> tuple[list[str], bool]:
    lines = ["| step | status | seconds |", "|---|---|---|"]
    failed = False
    for row in csv.reader((out / "steps.tsv").read_text().splitlines(), delimiter="\t"):
        name, code, seconds = row
        status = {"0": "passed", str(TIMED_OUT): "TIMED OUT"}.get(code, f"FAILED (exit {code})")
        failed |= code != "0"
        lines.append(f"| {name} | {status} | {seconds} |")
    return lines, failed


def kernel_tests(out: Path) -> list[str]:
    path = out / "kernel-tests.xml"
    if not path.exists():
        return ["no junit report: the kernel tests did not run"]
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    lines = [", ".join(f"{value} {key}" for key, value in counts.items())]
    for case in suite.iter("testcase"):
        for problem in (*case.findall("failure"), *case.findall("error")):
            message = (problem.get("message") or "").splitlines()[:1]
            lines.append(f"- {case.get('classname')}::{case.get('name')}: {' '.join(message)}")
    return lines


def log_tail(out: Path, name: str, lines: int) -> list[str]:
    path = out / f"{name}.log"
    if not path.exists():
        return [f"({name} did not run)"]
    return ["```", *path.read_text().splitlines()[-lines:], "```"]


def main_job(out: Path) -> list[str]:
    """`make run`'s search on this device: the device it said it used, then its answer (the
    knees and their ratios, as the search printed them last)."""
    path = out / "search.log"
    if not path.exists():
        return ["(search did not run)"]
    lines = path.read_text().splitlines()
    device = next((line for line in lines if line.startswith("device: ")), "(no device line)")
    start = next((i for i, line in enumerate(lines) if "sustained request rate" in line), None)
    answer = lines[start:] if start is not None else ["(no answer: see search.log)", *lines[-8:]]
    return [device, "", "```", *answer, "```"]


def device_bandwidth(meta: dict) -> tuple[float, str] | None:
    """(bytes/s, where from): a matching GPU preset's published figure, else the calibrated
    copy peak the run divided by."""
    preset = preset_of_device(str((meta.get("device") or {}).get("name", "")))
    if preset is not None:
        hardware = PRESETS[preset]
        return hardware.bandwidth, f"{hardware.name} published"
    peaks = meta.get("peaks") or {}
    copy = peaks.get("copy_bytes_per_s")
    return (float(copy), "calibrated copy") if copy else None


def run_rows(out: Path) -> list[str]:
    lines = [
        "| run | status | completed/failed | output tok/s | TTFT p50 s | TPOT p50 s | MBU | "
        "telemetry | CUDA graphs | decode step vs floor |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run_dir in sorted((out / "runs").glob("*")):
        summary_path, meta_path = run_dir / "summary.json", run_dir / "meta.json"
        if not summary_path.exists() or not meta_path.exists():
            lines.append(f"| {run_dir.name} | no summary | | | | | | | | |")
            continue
        summary = json.loads(summary_path.read_text())
        meta = json.loads(meta_path.read_text())
        telemetry = run_dir / "telemetry.csv"
        rows = max(len(telemetry.read_text().splitlines()) - 1, 0) if telemetry.exists() else 0
        source = (summary.get("telemetry") or {}).get("source", "?")
        cells = [
            run_dir.name,
            str(summary.get("status")),
            f"{summary.get('completed')}/{summary.get('failed')}",
            _number(summary.get("output_throughput")),
            _number((summary.get("ttft") or {}).get("p50")),
            _number((summary.get("tpot") or {}).get("p50")),
            _number(summary.get("mbu_mean")),
            f"{source}, {rows} rows",
            graphs_cell(meta.get("cuda_graphs")),
            decode_floor(decode_steps(run_dir), meta),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def graphs_cell(record: dict | None) -> str:
    """Which decode steps replayed graphs: the buckets and the capture time, or why none."""
    if not record:  # a run through an endpoint builds no engine
        return "-"
    if not record["enabled"]:
        return f"off: {record['reason']}"
    buckets = record["buckets"]
    return f"{len(buckets)} buckets {buckets[0]}-{buckets[-1]}, {record['capture_s']:.1f} s"


def decode_steps(run_dir: Path) -> list[StepRecord]:
    """The run's decode-only steps with their roofline bytes (none through an endpoint)."""
    if not (run_dir / "steps.jsonl").exists():
        return []
    return [
        s
        for s in read_steps(run_dir)
        if s.prefill_tokens == 0 and s.decode_tokens > 0 and "bytes" in s.counters
    ]


def decode_floor(steps: list[StepRecord], meta: dict, batch: int | None = None) -> str:
    """The median of the decode `steps` (of `batch` sequences, or any) against the time their
    bytes take at the peak bandwidth."""
    bandwidth = device_bandwidth(meta)
    steps = [s for s in steps if batch is None or s.decode_tokens == batch]
    if bandwidth is None or not steps:
        return "-"
    rate, source = bandwidth
    step_s = statistics.median(s.model_s for s in steps)
    floor_s = statistics.median(s.counters["bytes"] / rate for s in steps)
    return (
        f"{step_s * 1e3:.2f} ms vs {floor_s * 1e3:.2f} ms ({step_s / floor_s:.1f}x; "
        f"{source} {rate / 1e12:.2f} TB/s; {len(steps)} steps)"
    )


def floor_by_batch(out: Path) -> list[str]:
    """Every run's decode steps at the batches `FLOOR_BATCHES` names and at its largest, each
    against its floor: whether a step stays near the bytes it reads as the batch grows."""
    lines = [
        "| run | " + " | ".join(f"batch {b}" for b in FLOOR_BATCHES) + " | largest batch |",
        "|---|" + "---|" * (len(FLOOR_BATCHES) + 1),
    ]
    for run_dir in [*sorted((out / "runs").glob("*")), out / "profile-vllm"]:
        meta_path = run_dir / "meta.json"
        steps = decode_steps(run_dir)
        if not meta_path.exists() or not steps:
            continue
        meta = json.loads(meta_path.read_text())
        largest = max(s.decode_tokens for s in steps)
        cells = [decode_floor(steps, meta, batch) for batch in FLOOR_BATCHES]
        cells.append(f"{largest}: {decode_floor(steps, meta, largest)}")
        lines.append(f"| {run_dir.name} | " + " | ".join(cells) + " |")
    return lines


def calibrated(out: Path) -> list[str]:
    return [
        line for log in sorted(out.glob("calibrate-*.log")) for line in log_tail(out, log.stem, 8)
    ]


def step_profile(out: Path) -> list[str]:
    """The device's step profile and the plan that loads it for its preset."""
    path = out / "step-profile.json"
    if not path.is_file():
        return ["(no step profile: see step-profile.log)"]
    model = StepCostModel.load(path)
    quality = model.quality.median_error if model.quality else None
    lines = [
        f"timed on {model.measured_on}, {model.described.get('model')} "
        f"{model.described.get('dtype')}; the fit's median error on its grid "
        + (f"{quality:.1%}" if quality is not None else "-"),
    ]
    preset = preset_of_device(model.measured_on)
    if preset is None:
        return [*lines, "no `servelab plan` preset is this device"]
    return [
        *lines,
        f"`servelab plan model={model.described.get('model')} plan.hardware=[{preset}] "
        f"+plan.profiles.{preset}={path}`: the plan's {preset} rows from these steps",
    ]


def model_layers(run_dir: Path) -> int | None:
    """The layers of the run's model, where it is a named dummy shape."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    shape = DUMMY_SHAPES.get(str((config.get("model") or {}).get("shape")))
    return None if shape is None else shape.num_layers


def profile_window(run_dir: Path) -> list[str]:
    """Each profiled step: its batch, wall time, what it launched, the GPU's busy share; and
    the median decode step's launches per layer."""
    path = run_dir / SUMMARY_NAME
    if not path.exists():
        return [f"no {SUMMARY_NAME}: the profile window did not run to its end"]
    steps = json.loads(path.read_text())["steps"]
    layers = model_layers(run_dir)
    lines = [
        "| step | kind | batch | wall ms | kernels | copies | host operators | GPU busy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for step in steps:
        cells = [
            step["step"], step.get("kind", "?"), step.get("num_seqs", "?"),
            f"{step['wall_s'] * 1e3:.2f}", step["kernels"], step["copies"], step["host_ops"],
            f"{step['gpu_busy_share']:.0%}",
        ]  # fmt: skip
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    decode = [step for step in steps if step.get("kind") == "decode"]
    if not decode:
        return [*lines, "", "no decode step in the window"]
    kernels = statistics.median(step["kernels"] for step in decode)
    host_ops = statistics.median(step["host_ops"] for step in decode)
    busy = statistics.median(step["gpu_busy_share"] for step in decode)
    per_layer = "" if layers is None else (
        f" ({kernels / layers:.1f} kernels, {host_ops / layers:.1f} operators a layer of {layers})"
    )  # fmt: skip
    return [
        *lines,
        "",
        f"median decode step: {kernels:g} kernels, {host_ops:g} host operators{per_layer}; "
        f"the GPU busy {busy:.0%} of it ({len(decode)} decode steps)",
    ]


def _number(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, int | float) else "-"


def main() -> None:
    out = Path(sys.argv[1])
    table, failed = steps_table(out)
    sections = [
        "# GPU check",
        "",
        "every step passed" if not failed else "SOME STEPS FAILED: see their logs",
        "",
        *table,
        "",
        "## Machine",
        *log_tail(out, "machine", 40),
        "",
        "## End-to-end runs",
        *run_rows(out),
        "",
        "## Decode steps against their floor, by batch",
        *floor_by_batch(out),
        "",
        "## Profile window (vllm)",
        *profile_window(out / "profile-vllm"),
        "",
        "## Kernel tests (Triton compiled where CUDA runs)",
        *kernel_tests(out),
        "",
        "## Decode attention",
        *log_tail(out, "bench-attention", 12),
        "",
        "## Int4 linear layers",
        *log_tail(out, "bench-int4", 16),
        "",
        "## Calibrated peaks",
        *calibrated(out),
        "",
        "## Step profile (for `servelab plan`)",
        *step_profile(out),
        "",
        "## The main job (`make run`'s search, a minute's budget)",
        *main_job(out),
    ]
    print("\n".join(sections))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
