"""A threaded localhost HTTP server for the stand-ins of checking servers (kimina-lean-server's `/verify`)."""
import contextlib, http.server, threading


class Server(http.server.ThreadingHTTPServer):
    request_queue_size = 128   # many checks at once, as uvicorn's backlog takes them (the default 5 resets connections)


@contextlib.contextmanager
def serving(handler:type, **attrs):
    "Serve a fresh subclass of `handler` with `attrs` (and its own `seen` list) on a free port: yields (url, the subclass)."
    h = type('H', (handler,), {**attrs, 'seen': []})
    srv = Server(('127.0.0.1', 0), h)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try: yield f'http://127.0.0.1:{srv.server_port}', h
    finally: srv.shutdown(); srv.server_close()
