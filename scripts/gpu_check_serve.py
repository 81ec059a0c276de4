"""The GPU check's serve step (`scripts/gpu_check.sh`): `servelab serve` on a free loopback
port with the model and overrides given, then a measured run against it through
`backend=openai` (a few requests) into RUN_DIR, the server's output in RUN_DIR/server.log,
then the server stopped. Exits with the client run's
status, or 1 when the server did not start or did not stop.

    python -m scripts.gpu_check_serve RUN_DIR START_S -- SERVE_OVERRIDES... -- RUN_OVERRIDES...
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from servelab.harness.serving.process import start_server


def main() -> None:
    run_dir, start_s = Path(sys.argv[1]), float(sys.argv[2])
    rest = sys.argv[3:]
    if rest.count("--") != 2 or rest[0] != "--":
        raise SystemExit(__doc__)
    split = rest.index("--", 1)
    serve_overrides, run_overrides = rest[1:split], rest[split + 1 :]
    run_dir.mkdir(parents=True, exist_ok=True)
    server = start_server(serve_overrides, start_s=start_s, log=run_dir / "server.log")
    print(f"server at {server.url}")
    try:
        client = subprocess.run(
            [sys.executable, "-m", "servelab", "backend=openai", f"endpoint.url={server.url}",
             *run_overrides, f"hydra.run.dir={run_dir}"],
            check=False,
        )  # fmt: skip
    finally:
        stopped = server.stop()
    print(f"client run: exit {client.returncode}; server: exit {stopped}")
    sys.exit(client.returncode or (1 if stopped not in (0, -signal.SIGTERM) else 0))


if __name__ == "__main__":
    main()
