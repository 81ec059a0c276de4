"""The SLO: its limits and the per-request ratio (limits.py), the forms a search derives
them in (scaled.py from this machine's floor, earlier_run.py from an earlier search), the one
rule for which source sets each limit (sources.py), and the stop of a run whose verdict can
only be a failure (early_stop.py)."""
