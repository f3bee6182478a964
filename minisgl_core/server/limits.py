"""How much one server node takes on before it says no: the overload and shutdown settings.

Every bound here turns into a clean, early answer instead of unbounded work: a body too large is
refused before it is parsed (413), a prompt too long before it is tokenized (400), a request with
too many sequences before it is queued (400), a full waiting queue with 429 and ``Retry-After``, a
request past its deadline with a timeout error, and a stalled engine with a 503 on ``/health``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

#: no BPE vocabulary of a served model has tokens longer than this many characters on average, so a
#: prompt over ``context * CHARS_PER_TOKEN`` characters cannot fit and is refused without tokenizing
CHARS_PER_TOKEN = 16


@dataclass(frozen=True)
class ServerLimits:
    #: largest request body in bytes (413 above)
    max_body_bytes: int = 32 << 20
    #: engine sequences one request may start: prompts x n (400 above)
    max_sequences_per_request: int = 256
    #: engine sequences admitted but not finished across the server; beyond it new requests get 429
    max_queued_sequences: int = 4096
    #: seconds a request may run before it ends with a timeout error (0: no limit); a request's
    #: own ``timeout`` field may only lower it
    request_timeout_s: float = 0.0
    #: seconds SIGTERM waits for in-flight requests before ending their streams with an error
    shutdown_timeout_s: float = 10.0
    #: /health answers 503 when scheduler rank 0 has not reported for this long
    health_timeout_s: float = 20.0

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_sequences_per_request", "max_queued_sequences"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        for name in ("request_timeout_s", "shutdown_timeout_s", "health_timeout_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.removesuffix('_s').replace('_', '-')} must not be negative")

    def max_prompt_chars(self, max_context_len: int) -> int:
        return max_context_len * CHARS_PER_TOKEN


def add_limit_args(p: argparse.ArgumentParser) -> None:
    d = ServerLimits()
    g = p.add_argument_group("overload and shutdown")
    g.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes, help="largest request body (413)")
    g.add_argument(
        "--max-sequences-per-request",
        type=int,
        default=d.max_sequences_per_request,
        help="prompts x n one request may run (400 above)",
    )
    g.add_argument(
        "--max-queued-requests",
        dest="max_queued_sequences",
        type=int,
        default=d.max_queued_sequences,
        help="engine sequences queued or running before new requests get 429 with Retry-After",
    )
    g.add_argument(
        "--request-timeout",
        type=float,
        default=d.request_timeout_s,
        help="seconds a request may run before it ends with a timeout error (0 = none)",
    )
    g.add_argument(
        "--shutdown-timeout",
        type=float,
        default=d.shutdown_timeout_s,
        help="seconds SIGTERM lets in-flight requests finish before ending them with an error",
    )
    g.add_argument(
        "--health-timeout",
        type=float,
        default=d.health_timeout_s,
        help="/health answers 503 when the scheduler has not reported for this many seconds",
    )


def limits_from_args(args: argparse.Namespace) -> ServerLimits:
    try:
        return ServerLimits(
            max_body_bytes=args.max_body_bytes,
            max_sequences_per_request=args.max_sequences_per_request,
            max_queued_sequences=args.max_queued_sequences,
            request_timeout_s=args.request_timeout,
            shutdown_timeout_s=args.shutdown_timeout,
            health_timeout_s=args.health_timeout,
        )
    except ValueError as exc:
        raise SystemExit(f"minisgl: error: {exc}") from None
