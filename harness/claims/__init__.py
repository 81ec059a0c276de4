"""The papers' claims beside what this machine measures for them (`servelab claims`)."""
