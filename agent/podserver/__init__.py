"""The agent's side of the plugin protocol: a Unix-socket HTTP server answering ADD/CHECK/DEL/GC."""
