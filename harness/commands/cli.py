"""The `servelab` command: a Hydra run by default, or a tool verb in front of the overrides.

`servelab [overrides]` runs one configuration (`-m` sweeps). Verbs:
`workload show`, `report DIR...`, `calibrate`, `kv-size [context=N batch=N]`, `search`,
`perplexity [windows=N]`, `verify [strategies=a,b out=FILE]`, each followed by overrides.
Every verb that needs configuration composes the same Hydra config tree, so every override
works the same way everywhere. Bad input prints one line naming the field and the fix, and
exits with status 2.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig

from harness.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
GROUPS = ("model", "workload", "strategy")


def check_group_choices(overrides: list[str]) -> None:
    """Unknown preset names fail here with one line, before Hydra's longer message."""
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if key not in GROUPS or not value or "," in value:
            continue
        if not (CONF_DIR / key / f"{value}.yaml").is_file():
            known = ", ".join(sorted(p.stem for p in (CONF_DIR / key).glob("*.yaml")))
            raise ConfigError(key, f"unknown preset {value!r}; choose one of: {known}")


def compose(overrides: list[str]) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    check_group_choices(overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hydra_compose(config_name="config", overrides=overrides)


def run_main() -> None:
    """The Hydra entry point: one run per job, into Hydra's output directory."""
    import hydra
    from hydra.core.hydra_config import HydraConfig

    @hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
    def job(cfg: DictConfig) -> None:
        from harness.measure.summary_table import render_summary
        from harness.runner.run import completed_summary, run

        run_dir = Path(HydraConfig.get().runtime.output_dir)
        earlier = completed_summary(cfg, run_dir)
        if earlier is not None:
            print(f"already complete, not run again: {run_dir}")
            render_summary(earlier, str(run_dir))
            return
        try:
            summary = run(cfg, run_dir)
        except ConfigError as error:
            print(f"servelab: error: {error}", file=sys.stderr)
            sys.exit(2)
        render_summary(summary, str(run_dir))

    check_group_choices([a for a in sys.argv[1:] if not a.startswith("-")])
    job()


def workload_show(args: list[str]) -> None:
    from harness.models.load import model_config_of, tokenizer_for
    from harness.runner.settings import cache_dir_of
    from workloads.build import build_workload
    from workloads.show import render_workload

    if not args or args[0] != "show":
        raise ConfigError("workload", "usage: servelab workload show [workload=NAME] [overrides]")
    cfg = compose(args[1:])
    tokenizer = tokenizer_for(cfg.model, cache_dir_of(cfg))
    max_context = model_config_of(cfg.model, cache_dir_of(cfg)).max_context
    print(render_workload(build_workload(cfg.workload, tokenizer, max_context), max_context))


def report(args: list[str]) -> None:
    from reports.cli import report_main

    usage = "usage: servelab report DIR [DIR ...] [--out FILE] [--baseline STRATEGY]"
    options: dict[str, str | None] = {"--out": None, "--baseline": None}
    for option in options:
        if option in args:
            index = args.index(option)
            if index + 1 >= len(args):
                raise ConfigError("report", f"{option} needs a value; {usage}")
            options[option] = args[index + 1]
            args = args[:index] + args[index + 2 :]
    if not args:
        raise ConfigError("report", usage)
    out = Path(options["--out"]) if options["--out"] else None
    for path in report_main([Path(a) for a in args], out, options["--baseline"]):
        print(path)


def calibrate(args: list[str]) -> None:
    from harness.measure.calibrate import calibrate_main
    from harness.runner.settings import DTYPES, cache_dir_of, resolve_device

    refresh = "--refresh" in args
    cfg = compose([a for a in args if a != "--refresh"])
    device = resolve_device(str(cfg.engine.device))
    dtypes = [DTYPES["fp32"], DTYPES["bf16"]] + ([DTYPES["fp16"]] if device.type == "cuda" else [])
    print(calibrate_main(device, dtypes, cache_dir_of(cfg), refresh))


def take_counts(args: list[str], defaults: dict[str, int]) -> tuple[dict[str, int], list[str]]:
    """Split a verb's own `name=N` arguments (positive integers) from the Hydra overrides."""
    numbers, rest = dict(defaults), []
    for arg in args:
        key, _, value = arg.partition("=")
        if key not in numbers:
            rest.append(arg)
        elif value.isdigit() and int(value) > 0:
            numbers[key] = int(value)
        else:
            raise ConfigError(key, f"{value!r} must be a positive whole number")
    return numbers, rest


def kv_size(args: list[str]) -> None:
    from harness.commands.kv_size import kv_size_main

    numbers, rest = take_counts(args, {"context": 4096, "batch": 1})
    print(kv_size_main(compose(rest), numbers["context"], numbers["batch"]))


def slo_search(args: list[str]) -> None:
    from harness.commands.search import render_search, search
    from harness.runner.run import completed_summary, run

    def run_or_reuse(cfg: DictConfig, run_dir: Path) -> dict:
        return completed_summary(cfg, run_dir) or run(cfg, run_dir)

    results, out_dir = search(args, compose, run_or_reuse)
    print(render_search(results))
    print(f"probes and search.json under {out_dir}")


def perplexity(args: list[str]) -> None:
    from harness.measure.perplexity import perplexity_main

    numbers, rest = take_counts(args, {"windows": 16})
    print(perplexity_main(compose(rest), numbers["windows"]))


def verify(args: list[str]) -> None:
    from harness.commands.verify import render_checks, verify

    strategies = ["orca", "orca-chunked", "vllm"]
    out = None
    rest = []
    for arg in args:
        key, _, value = arg.partition("=")
        if key == "strategies":
            strategies = [s for s in value.strip("[]").split(",") if s]
        elif key == "out":
            out = Path(value)
        else:
            rest.append(arg)
    check_group_choices([f"strategy={s}" for s in strategies])
    cfg = compose(rest)
    checks = verify(strategies, rest, compose, out)
    print(render_checks(checks, str(cfg.engine.dtype)))


VERBS: dict[str, Callable[[list[str]], None]] = {
    "workload": workload_show,
    "report": report,
    "calibrate": calibrate,
    "kv-size": kv_size,
    "search": slo_search,
    "perplexity": perplexity,
    "verify": verify,
}


def main() -> None:
    args = sys.argv[1:]
    try:
        if args and args[0] in VERBS:
            VERBS[args[0]](args[1:])
        else:
            run_main()
    except ConfigError as error:
        print(f"servelab: error: {error}", file=sys.stderr)
        sys.exit(2)
