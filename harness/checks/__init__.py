"""Checks of the project itself, not measurements of a serving run: the install against its
lock (`lock`), Triton's kernels compiled for a GPU's arch from any machine (`triton_builds`),
what model code launches, counted on any device (`launches`), and where a step's time goes: an
opt-in profiler window over a few steps of a run (`profiling`, its trace read back per step by
`trace_steps`)."""
