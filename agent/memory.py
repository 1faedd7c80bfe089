"""The process's allocator: large buffers mapped on their own, so their pages go back when freed.

A fat pod's text (up to 1.5 MB: etcd's object limit) is read and dropped in one event; glibc's
malloc serves a block that large from its own mapping at first, but raises that threshold to the
size of each such block freed (up to 32 MiB), after which the next ones come from the heap and
the heap keeps their pages: 20 fat pods left the agent's RSS 4 MiB above its RSS with none even
with nothing of them built but what the agent reads (bench/README "fat pods"). Fixing the
threshold at glibc's own default keeps every block past it mapped and returned when freed (two
system calls a fat event, against megabytes held for the process's life). Elsewhere (musl, no
libc to find) nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3
"""glibc's mallopt parameter (malloc.h); setting it also turns its dynamic adjustment off."""
MMAP_THRESHOLD_BYTES = 128 << 10
"""glibc's default: a block this large or larger is a mapping of its own."""


def map_large_buffers() -> bool:
    """Fix malloc's mapping threshold (glibc); True when it was set."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # no C library by that name, or no mallopt in it
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    log.debug(
        "malloc's mapping threshold", extra={"fields": {"bytes": MMAP_THRESHOLD_BYTES, "set": done}}
    )
    return done
