"""servelab measuring core: engine loop, model, request state, replay, metrics, telemetry, CLI."""
