"""Where the server's processes meet (ZeroMQ ipc sockets in a private temp dir) and how they talk.

Every process binds a PULL socket for its own inbox and connects PUSH sockets to the inboxes it
writes to; ZeroMQ keeps the order of the messages between two sockets. High-water marks are off so
a burst of requests queues instead of being dropped or blocking a sender.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import zmq

from minisgl_core.messages import Message, decode, encode

#: how long a closing socket keeps trying to deliver what it still holds (ms)
LINGER_MS = 2000


@dataclass(frozen=True)
class Endpoints:
    """The inbox of each process, as ipc:// addresses inside ``root`` (owned by the launcher)."""

    root: str

    @classmethod
    def create(cls) -> Endpoints:
        return cls(tempfile.mkdtemp(prefix="minisgl-"))

    def _addr(self, name: str) -> str:
        return f"ipc://{Path(self.root) / name}"

    @property
    def tokenizer(self) -> str:
        return self._addr("tokenizer")

    @property
    def detokenizer(self) -> str:
        return self._addr("detokenizer")

    @property
    def scheduler(self) -> str:
        return self._addr("scheduler")

    @property
    def api(self) -> str:
        return self._addr("api")

    @property
    def control(self) -> str:
        return self._addr("control")

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _configure(sock: zmq.Socket) -> zmq.Socket:
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.LINGER, LINGER_MS)
    return sock


def bind_pull(ctx: zmq.Context, addr: str) -> zmq.Socket:
    sock = _configure(ctx.socket(zmq.PULL))
    sock.bind(addr)
    return sock


def connect_push(ctx: zmq.Context, addr: str) -> zmq.Socket:
    sock = _configure(ctx.socket(zmq.PUSH))
    sock.connect(addr)
    return sock


def send(sock: zmq.Socket, msg: Message) -> None:
    sock.send(encode(msg))


def recv(sock: zmq.Socket, timeout_ms: int | None = None) -> Message | None:
    """The next message, waiting at most ``timeout_ms`` (None: forever); None on timeout."""
    if timeout_ms is not None and not sock.poll(timeout_ms):
        return None
    return decode(sock.recv())


def drain(sock: zmq.Socket) -> list[Message]:
    """Every message already waiting, without blocking."""
    out: list[Message] = []
    while True:
        try:
            out.append(decode(sock.recv(zmq.NOBLOCK)))
        except zmq.Again:
            return out
