"""How much one server node takes on before it says no: the overload and shutdown settings.

Every bound here turns into a clean, early answer instead of unbounded work: a body too large is
refused before it is parsed (413), a prompt too long before it is tokenized (400), a request with
too many sequences before it is queued (400), a full waiting queue with 429 and ``Retry-After``, a
request past its deadline with a timeout error, a stalled engine with a 503 on ``/health``, and one
stuck in a step with a 503 on ``/health_generate``.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import Field, dataclass, field, fields
from typing import Any

from minisgl_core import request_limits
from minisgl_core.config import ConfigError
from minisgl_core.messages import HEARTBEAT_INTERVAL_MS


def _limit(default: float, flag: str, help_text: str) -> Any:
    """A limit with its command-line flag: the one place each is defined."""
    return field(default=default, metadata={"flag": flag, "help": help_text})


#: limits for which 0 does not mean "none": /health would answer 503 at once, for ever
POSITIVE = frozenset({"health_timeout_s"})


@dataclass(frozen=True)
class ServerLimits:
    max_body_bytes: int = _limit(32 << 20, "--max-body-bytes", "largest request body (413)")
    #: engine sequences one request may start: prompts x n (400 above)
    max_sequences_per_request: int = _limit(
        256, "--max-sequences-per-request", "prompts x n one request may run (400 above)"
    )
    #: engine sequences admitted but not finished across the server; beyond it new requests get 429
    max_queued_sequences: int = _limit(
        4096,
        "--max-queued-requests",
        "engine sequences queued or running before new requests get 429 with Retry-After",
    )
    #: a request's own ``timeout`` field may only lower it
    request_timeout_s: float = _limit(
        0.0, "--request-timeout", "seconds a request may run before it ends with a timeout error (0 = none)"
    )
    shutdown_timeout_s: float = _limit(
        10.0,
        "--shutdown-timeout",
        "seconds SIGTERM lets in-flight requests finish before ending them with an error "
        "(a second SIGTERM or Ctrl-C ends them at once)",
    )
    #: measured from scheduler rank 0's latest report
    health_timeout_s: float = _limit(
        20.0,
        "--health-timeout",
        "/health answers 503 when the scheduler has not reported for this many seconds",
    )
    #: one step may take minutes on a CPU (a prefill of thousands of tokens); SGLang's watchdog
    #: bound on one forward batch (--watchdog-timeout), though here nothing is killed
    step_timeout_s: float = _limit(
        300.0,
        "--step-timeout",
        "/health_generate answers 503, and calls waiting for the scheduler (/flush_cache, "
        "/pause_generation...) give up, once one scheduler step has run this many seconds (0 = none)",
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            value, flag = getattr(self, f.name), f.metadata["flag"]
            if isinstance(f.default, int) and value < 1:
                raise ValueError(f"{flag} must be at least 1")
            if not math.isfinite(value):  # nan passed "< 0" and then failed every request
                raise ValueError(f"{flag} must be a finite number of seconds, got {value}")
            if value < 0:
                raise ValueError(f"{flag} must not be negative")
            if f.name in POSITIVE and value == 0:
                raise ValueError(f"{flag} must be more than 0 seconds")

    max_prompt_chars = staticmethod(request_limits.max_prompt_chars)


def _dest(f: Field) -> str:
    # the names the options always had (plugins see them in ProcessContext.options)
    return f.name.removesuffix("_s")


def add_limit_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("overload and shutdown")
    for f in fields(ServerLimits):
        g.add_argument(
            f.metadata["flag"],
            dest=_dest(f),
            type=type(f.default),
            default=f.default,
            help=f.metadata["help"],
        )


#: the least --health-timeout: two idle heartbeats, so that a report a little late is not a 503
#: (at 1 s, /health answered 503 now and then on an idle, healthy server; tests' own states go lower)
MIN_HEALTH_TIMEOUT_S = 2 * HEARTBEAT_INTERVAL_MS / 1000


def limits_from_args(args: argparse.Namespace) -> ServerLimits:
    try:
        limits = ServerLimits(**{f.name: getattr(args, _dest(f)) for f in fields(ServerLimits)})
    except ValueError as exc:  # the message names the flag
        raise ConfigError(str(exc)) from None
    if limits.health_timeout_s < MIN_HEALTH_TIMEOUT_S:
        raise ConfigError(
            f"--health-timeout {limits.health_timeout_s:g} is shorter than two of the scheduler's idle "
            f"reports (one every {HEARTBEAT_INTERVAL_MS / 1000:g} s): /health would answer 503 between "
            f"them on a healthy server; give {MIN_HEALTH_TIMEOUT_S:g} or more"
        )
    return limits
