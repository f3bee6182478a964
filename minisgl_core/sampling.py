"""Per-request sampling parameters and what a finished or streaming request reports."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

from minisgl_core.api.grammar import GrammarError, GrammarSpec


@dataclass
class SamplingParams:
    """How to pick each next token and when to stop. ``temperature == 0`` is greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    #: -1 or 0 disables top-k
    top_k: int = -1
    min_p: float = 0.0
    max_tokens: int = 16
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    #: None: no logprobs; 0: the sampled token's logprob; k > 0: also the k most likely tokens
    logprobs: int | None = None
    skip_special_tokens: bool = True
    #: what the output must match (constrained decoding); None = free text
    grammar: GrammarSpec | None = None

    MAX_TOP_LOGPROBS = 20

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        # messages carry the spec as a plain dict (dataclasses.asdict, msgpack)
        try:
            self.grammar = GrammarSpec.coerce(self.grammar)
        except GrammarError as exc:
            raise ValueError(f"grammar {exc}") from exc
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first field that is out of range."""

        def bad(name: str, why: str) -> None:
            raise ValueError(f"{name} {why}, got {getattr(self, name)!r}")

        def finite(name: str) -> float:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                bad(name, "must be a finite number")
            return float(value)

        if finite("temperature") < 0:
            bad("temperature", "must be >= 0")
        if not 0 < finite("top_p") <= 1:
            bad("top_p", "must be in (0, 1]")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < -1:
            bad("top_k", "must be an integer >= -1 (-1 or 0 disables it)")
        if not 0 <= finite("min_p") <= 1:
            bad("min_p", "must be in [0, 1]")
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            bad("max_tokens", "must be an integer >= 1")
        if not -2 <= finite("presence_penalty") <= 2:
            bad("presence_penalty", "must be in [-2, 2]")
        if not -2 <= finite("frequency_penalty") <= 2:
            bad("frequency_penalty", "must be in [-2, 2]")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            bad("seed", "must be an integer")
        if self.logprobs is not None and (
            not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= self.MAX_TOP_LOGPROBS
        ):
            bad("logprobs", f"must be an integer in [0, {self.MAX_TOP_LOGPROBS}]")
        if not all(isinstance(s, str) and s for s in self.stop):
            bad("stop", "must be non-empty strings")
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            bad("stop_token_ids", "must be non-negative integers")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


#: generation_config.json keys that become a request's defaults when the request leaves them unset
GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "min_p")


def sampling_defaults(generation_config: dict) -> dict:
    """The model's own sampling defaults (from ``generation_config.json``), as vLLM applies them:
    a request's unset field takes the model's value, an explicit one always wins."""
    return {k: generation_config[k] for k in GENERATION_DEFAULTS if generation_config.get(k) is not None}


class TokenLogprob(NamedTuple):
    token_id: int
    logprob: float
    #: the most likely tokens at this position, (token_id, logprob), best first
    top: list[tuple[int, float]]


class StepOutput(NamedTuple):
    """One request's progress in one engine step: its newly sampled token, and whether it finished."""

    rid: int
    token_id: int
    finished: bool
    #: "stop" | "length" | "abort" when finished
    finish_reason: str | None = None
    #: the stop string or stop token id that ended the request, if any
    matched_stop: str | int | None = None
    logprob: TokenLogprob | None = None
    #: why the request failed (finish_reason "error"), e.g. its grammar rejected a sampled token
    error: str | None = None
