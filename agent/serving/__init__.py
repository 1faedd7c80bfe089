"""Serving HTTP/1.1 without a thread or a descriptor per peer's whim: a single-threaded event
loop (`loop`) over the open connections (`connections`) with bounded connections and timeouts
(`limits`), each connection's requests read and replies written by h11 (`http`), and who may
connect to a Unix socket (`peer`)."""
