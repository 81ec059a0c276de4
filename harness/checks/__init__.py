"""Checks of the project itself, not measurements of a serving run: the install against its
lock (`lock`), Triton's kernels compiled for a GPU's arch from any machine (`triton_builds`),
and what model code launches, counted on any device (`launches`)."""
