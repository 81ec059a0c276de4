"""What arrives: lengths, arrival processes, prompt sources, traces, all deterministic from a seed."""
