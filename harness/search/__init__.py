"""The knee search: the highest request rate each strategy sustains under the SLO, anchored on
what this machine does, with the uncertainty of every verdict (`servelab search`)."""
