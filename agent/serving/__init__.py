"""Serving HTTP/1.1 without a thread or a descriptor per peer's whim: a single-threaded event
loop (`loop`) with bounded connections and timeouts (`limits`), the request framing it reads and
writes (`http`), and who may connect to a Unix socket (`peer`)."""
