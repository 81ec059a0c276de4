"""What arrives: lengths, arrival processes, prompt sources and traces, deterministic from a seed.

`workloads.build.build_workload` turns the `workload` config node into a `Workload`;
`workloads.show.render_workload` describes one as text; `workloads.text.text_section`
hands out the real-text sections other modules calibrate and evaluate on.
"""
