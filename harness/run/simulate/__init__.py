"""Simulated serving: a step-cost model fitted on real runs, and the runner that predicts each
forward on a virtual clock instead of computing it (`backend=simulated`)."""
