"""An ASGI app served over real HTTP on 127.0.0.1 in a thread, for a test module."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


def free_port() -> int:
    """A port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def serve_app(app: Any) -> Iterator[str]:
    """Serve ``app`` until the block ends; yields its ``http://127.0.0.1:PORT/v1`` URL."""
    instance = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=instance.run, daemon=True)
    thread.start()
    for _ in range(200):
        if instance.started:
            break
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{instance.config.port}/v1"
    finally:
        instance.should_exit = True
        thread.join(timeout=10)
