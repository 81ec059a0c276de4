"""The GPU check's serve step (`scripts/gpu_check.sh`): `servelab serve` on a free loopback
port with the model and overrides given, then a measured run against it through
`backend=openai` (a few requests) into RUN_DIR, the server's output in RUN_DIR/server.log,
then the server stopped. Exits with the client run's
status, or 1 when the server did not start or did not stop.

    python -m scripts.gpu_check_serve RUN_DIR START_S -- SERVE_OVERRIDES... -- RUN_OVERRIDES...
"""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

BANNER = "servelab: serving "  # the line `servelab serve` prints once it listens


def start(overrides: list[str], log: Path, start_s: float) -> tuple[subprocess.Popen, str]:
    """The server, and its URL once its banner is printed (every line copied to `log`)."""
    server = subprocess.Popen(
        [sys.executable, "-m", "servelab", "serve", "serve.port=0", *overrides],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()

    def copy() -> None:
        assert server.stdout is not None
        with log.open("w") as out:
            for line in server.stdout:
                out.write(line)
                out.flush()
                lines.put(line)
        lines.put(None)

    threading.Thread(target=copy, daemon=True).start()
    deadline = time.monotonic() + start_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1.0)
        except queue.Empty:
            continue
        if line is None:
            break
        if line.startswith(BANNER):
            return server, line.rsplit(" at ", 1)[1].strip()
    server.kill()
    raise SystemExit(f"servelab serve did not start within {start_s:.0f} s: see {log}")


def main() -> None:
    run_dir, start_s = Path(sys.argv[1]), float(sys.argv[2])
    rest = sys.argv[3:]
    if rest.count("--") != 2 or rest[0] != "--":
        raise SystemExit(__doc__)
    split = rest.index("--", 1)
    serve_overrides, run_overrides = rest[1:split], rest[split + 1 :]
    run_dir.mkdir(parents=True, exist_ok=True)
    server, url = start(serve_overrides, run_dir / "server.log", start_s)
    print(f"server at {url}")
    try:
        client = subprocess.run(
            [sys.executable, "-m", "servelab", "backend=openai", f"endpoint.url={url}",
             *run_overrides, f"hydra.run.dir={run_dir}"],
            check=False,
        )  # fmt: skip
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            stopped = server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            stopped = server.wait()
    print(f"client run: exit {client.returncode}; server: exit {stopped}")
    sys.exit(client.returncode or (1 if stopped not in (0, -signal.SIGTERM) else 0))


if __name__ == "__main__":
    main()
