"""servelab over HTTP: an OpenAI-compatible server around one engine loop.

`protocol` holds the request bodies and response shapes, `errors` the error bodies OpenAI
clients expect, `intake` turns a request into an engine request (or a 4xx), `engine_loop`
runs the engine in its own thread behind the async front end, `text` detokenizes streams,
`metrics` renders Prometheus text, `app` routes, and `server` binds and runs it all.
"""
