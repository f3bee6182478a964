"""Per-request sampling parameters and what a finished or streaming request reports."""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Any, ClassVar, NamedTuple

from minisgl_core.api.grammar import GrammarError, GrammarSpec

#: a lone UTF-16 surrogate: text no tokenizer encodes, nor UTF-8
LONE_SURROGATE = re.compile("[\ud800-\udfff]")

#: every integer a request carries travels as a signed 64-bit integer (msgpack, torch tensors)
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: temperatures in (0, MIN_TEMPERATURE) are raised to it, as vLLM does: dividing logits by a
#: smaller one overflows to inf and yields NaN probabilities
MIN_TEMPERATURE = 1e-2


def choice_seed(seed: int, index: int) -> int:
    """The seed of choice ``index`` of a request with ``n > 1``: distinct and reproducible, and
    still a signed 64-bit integer (it wraps around) whatever the request's seed."""
    return (seed + index - INT64_MIN) % 2**64 + INT64_MIN


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token and when to stop. ``temperature == 0`` is greedy.

    Frozen, and validated once: constructing one checks every field (ValueError naming the first
    bad one), which happens where a request enters, in the HTTP server's routes or the offline
    ``LLM``'s caller. Every process downstream receives this very object (over IPC through
    :meth:`to_wire` / :meth:`from_wire`, which does not check again) and trusts it.

    ``max_tokens=None`` means as many as the context leaves; admission
    (:func:`minisgl_core.request_limits.admit`, the one check against an engine's limits) turns it
    into a number, so an engine only ever sees a number."""

    temperature: float = 1.0
    top_p: float = 1.0
    #: -1 or 0 disables top-k
    top_k: int = -1
    min_p: float = 0.0
    #: None: what the context leaves (resolved at admission)
    max_tokens: int | None = 16
    #: a string or any sequence of strings; kept as a tuple
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    #: None: no logprobs; 0: the sampled token's logprob; k > 0: also the k most likely tokens
    logprobs: int | None = None
    #: vLLM's: the same for every prompt token after the first (its logprob given the tokens before
    #: it, and the k most likely there); the prompt is then computed whole, without the prefix cache
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    #: the stop string that ended the request stays at the end of the text (vLLM's name)
    include_stop_str_in_output: bool = False
    #: stops (eos, stop_token_ids, stop strings) take effect only from this many output tokens on;
    #: until then eos and stop_token_ids cannot be sampled (vLLM's min_tokens)
    min_tokens: int = 0
    #: keep only the prompt's last k tokens (vLLM's left truncation); -1: as many as the context
    #: length holds; None: the whole prompt (one that does not fit is refused)
    truncate_prompt_tokens: int | None = None
    #: token id -> added to its logit before sampling, in [-100, 100] (OpenAI's logit_bias)
    logit_bias: dict[int, float] = field(default_factory=dict)
    #: > 1 discourages every token already in the prompt or the output (Hugging Face semantics)
    repetition_penalty: float = 1.0
    #: what the output must match (constrained decoding), None = free
    grammar: GrammarSpec | None = None
    #: with a grammar: the token ids of the model's reasoning tags (start, end), as vLLM and SGLang
    #: constrain a reasoning model. The output may then open with the start tag instead of the
    #: grammar's text; the reasoning after it is free, and the grammar applies from the token after
    #: the end tag. None: the grammar applies from the first token. The server sets it from
    #: ``--reasoning-parser`` when both tags are single tokens and the prompt leaves the reasoning
    #: open (Qwen3's ``enable_thinking`` false closes it in the prompt)
    reasoning_tag_ids: tuple[int, int] | None = None
    #: with ``reasoning_tag_ids``: the prompt opened the reasoning itself (it ends with the start
    #: tag, as Qwen3's thinking-only templates and DeepSeek-R1's do), so the output begins inside
    #: it and the grammar applies after its end tag
    reasoning_opened: bool = False
    #: completions per prompt (vLLM's n), in [1, MAX_N]: the offline ``LLM`` runs each prompt as n
    #: engine requests (:meth:`for_choice`), the server takes n from its request body; an engine
    #: runs one completion a request and refuses any other n
    n: int = 1
    #: the sampled tokens' logprobs (``logprobs``) are SGLang's: of the logits the draw uses (the
    #: grammar's mask, bias, penalties, bans) divided by the temperature (1 when greedy), before
    #: top-k, top-p and min-p, as SGLang's ``/generate`` reports them. False: the model's own
    #: distribution, only the grammar's mask applied (vLLM's default, ``raw_logprobs``). The
    #: prompt's logprobs are the model's either way, as in SGLang
    scaled_logprobs: bool = False
    #: vLLM's: only these token ids may be sampled (every other gets -inf before the draw); None:
    #: any. Kept sorted without repeats; admission checks them against the vocabulary
    allowed_token_ids: tuple[int, ...] | None = None
    #: vLLM's: words the output may not end in. Each is tokenized twice, its leading whitespace
    #: stripped and with one leading space (that second form kept where it is a distinct word:
    #: another first token, as many tokens); the last token of a form cannot be sampled right after
    #: the output's tokens equal the form's others, so a one-token word is never sampled
    bad_words: tuple[str, ...] = ()
    #: ``bad_words`` as token sequences, each form a tuple: set by admission, which has the
    #: tokenizer (:func:`minisgl_core.request_limits.bad_words_token_ids`); None until then. The
    #: engine reads these, every rank the same ones, and refuses bad_words not yet admitted
    bad_words_token_ids: tuple[tuple[int, ...], ...] | None = None

    MAX_TOP_LOGPROBS: ClassVar[int] = 20
    #: the most completions one prompt may ask for: the offline LLM's bound and the server's (its
    #: request schema bounds n with this one)
    MAX_N: ClassVar[int] = 64
    MAX_LOGIT_BIAS: ClassVar[float] = 100.0
    #: stop strings a request may give, and characters in each: every step the scheduler decodes a
    #: window as long as the longest and looks for each (1,000 stops of 8,000 characters stalled
    #: every request of the server for a minute); OpenAI takes 4
    MAX_STOP_STRINGS: ClassVar[int] = 256
    MAX_STOP_CHARS: ClassVar[int] = 1024
    #: the longest grammar text (a schema's JSON, a regex...) a request may give: compiling grows
    #: faster than the size (a regex of 1 MB took 7 s on two cores, of 2 MB 55 s), and a compile
    #: cannot be stopped once begun, not even when its client leaves
    MAX_GRAMMAR_CHARS: ClassVar[int] = 1 << 19
    #: allowed_token_ids a request may give: the largest vocabularies (Gemma's 262,144 ids)
    MAX_ALLOWED_TOKEN_IDS: ClassVar[int] = 1 << 18
    #: bad words a request may give (vLLM's bound, on its tokenized forms), and characters in each:
    #: every step each form's tokens are compared with the output's last ones
    MAX_BAD_WORDS: ClassVar[int] = 128
    MAX_BAD_WORD_CHARS: ClassVar[int] = 1024

    def __post_init__(self) -> None:
        normalise = partial(object.__setattr__, self)
        stop = self.stop
        # (a dict, a number: its keys taken as the stops, or "not iterable")
        if not (stop is None or isinstance(stop, (str, list, tuple))):
            raise ValueError(f"stop must be a string or a list of strings, got {type(stop).__name__}")
        normalise("stop", (stop,) if isinstance(stop, str) else tuple(stop or ()))
        if not (self.stop_token_ids is None or isinstance(self.stop_token_ids, (list, tuple))):
            raise ValueError(
                f"stop_token_ids must be a list of token ids, got {type(self.stop_token_ids).__name__}"
            )
        normalise("stop_token_ids", tuple(self.stop_token_ids or ()))
        bad_words = self.bad_words
        if not (bad_words is None or isinstance(bad_words, (str, list, tuple))):
            raise ValueError(f"bad_words must be a list of strings, got {type(bad_words).__name__}")
        normalise("bad_words", (bad_words,) if isinstance(bad_words, str) else tuple(bad_words or ()))
        allowed = self.allowed_token_ids
        if allowed is not None:
            if not isinstance(allowed, (list, tuple)):  # (a set's order, a string's characters)
                raise ValueError(
                    f"allowed_token_ids must be a list of token ids, got {type(allowed).__name__}"
                )
            normalise("allowed_token_ids", tuple(allowed))
        forms = self.bad_words_token_ids
        if forms is not None:
            if not isinstance(forms, (list, tuple)) or not all(
                isinstance(f, (list, tuple)) and f for f in forms
            ):
                raise ValueError("bad_words_token_ids must be lists of token ids (admission sets them)")
            normalise("bad_words_token_ids", tuple(tuple(f) for f in forms))
        if not (self.logit_bias is None or isinstance(self.logit_bias, dict)):
            raise ValueError(f"logit_bias must map token ids to biases, got {type(self.logit_bias).__name__}")
        # JSON and msgpack carry these as plain values: ids may be strings, the grammar a dict
        biases: dict[int, Any] = {}
        for key, value in (self.logit_bias or {}).items():
            token = _token_id(key)
            if token in biases:  # "17" and "017": two biases for one token, the last silently won
                raise ValueError(f"logit_bias names token {token} twice (as {short_repr(key)} too)")
            biases[token] = value
        normalise("logit_bias", biases)
        try:
            normalise("grammar", GrammarSpec.coerce(self.grammar))
        except GrammarError as exc:
            raise ValueError(f"grammar {exc}") from exc
        if self.grammar is not None and len(self.grammar.value) > self.MAX_GRAMMAR_CHARS:
            raise ValueError(
                f"grammar of {len(self.grammar.value):,} characters ({self.grammar.kind}): at most "
                f"{self.MAX_GRAMMAR_CHARS:,} are taken (a compile grows faster than the grammar)"
            )
        self._validate()
        if 0 < self.temperature < MIN_TEMPERATURE:
            normalise("temperature", MIN_TEMPERATURE)

    def _validate(self) -> None:
        """Raise ValueError naming the first field that is out of range (its message starts with
        the field's name).

        Integer ranges: ``max_tokens`` in [1, 2**63-1] or None, ``top_k`` in [-1, 2**63-1] (above
        the vocabulary size it keeps every token), ``seed`` in [-2**63, 2**63-1] (OpenAI's int64),
        ``logprobs`` and ``prompt_logprobs`` in [0, 20], ``n`` in [1, 64], ``stop_token_ids``,
        ``allowed_token_ids`` and ``logit_bias``'s token ids in [0, 2**63-1] (admission also checks
        them against the vocabulary)."""

        def bad(name: str, why: str) -> None:
            raise ValueError(f"{name} {why}, got {short_repr(getattr(self, name))}")

        def integer(name: str, low: int, high: int, value: object = None) -> int:
            """The field ``name`` (or one of its items, ``value``) as an int; a numpy integer's
            field becomes a Python int (msgpack and torch take those)."""
            field_value = value is None
            value = getattr(self, name) if field_value else value
            if not _is_integer(value) or not low <= value <= high:  # type: ignore[operator]
                bad(name, f"must be an integer in [{_bound(low)}, {_bound(high)}]")
            if field_value and type(value) is not int:
                object.__setattr__(self, name, int(value))  # type: ignore[arg-type]
            return int(value)  # type: ignore[arg-type]

        #: the float fields checked, each as a Python float: stored once every check passed, so
        #: that an error shows the value given
        floats: dict[str, float] = {}

        def finite(name: str) -> float:
            value = getattr(self, name)
            try:  # (10**400 was an OverflowError from math.isfinite)
                number = float(value) if _is_number(value) else math.nan
            except OverflowError:
                number = math.nan
            if not math.isfinite(number):
                bad(name, "must be a finite number")
            # np.float32(0.5) or an int a Python float: torch took repetition_penalty=10**20 for
            # an integer, and the sampler failed with an OverflowError
            floats[name] = number
            return number

        for name in (
            "ignore_eos", "skip_special_tokens", "include_stop_str_in_output", "reasoning_opened", "scaled_logprobs",
        ):  # fmt: skip
            if not isinstance(getattr(self, name), bool):  # "no" was True; 0 failed after generating
                bad(name, "must be True or False")
        if finite("temperature") < 0:
            bad("temperature", "must be >= 0")
        if not 0 < finite("top_p") <= 1:
            bad("top_p", "must be in (0, 1]")
        integer("top_k", -1, INT64_MAX)
        if not 0 <= finite("min_p") <= 1:
            bad("min_p", "must be in [0, 1]")
        if self.max_tokens is not None:
            integer("max_tokens", 1, INT64_MAX)
        if not -2 <= finite("presence_penalty") <= 2:
            bad("presence_penalty", "must be in [-2, 2]")
        if not -2 <= finite("frequency_penalty") <= 2:
            bad("frequency_penalty", "must be in [-2, 2]")
        if self.seed is not None:
            integer("seed", INT64_MIN, INT64_MAX)
        if self.logprobs is not None:
            integer("logprobs", 0, self.MAX_TOP_LOGPROBS)
        if self.prompt_logprobs is not None:
            integer("prompt_logprobs", 0, self.MAX_TOP_LOGPROBS)
        integer("min_tokens", 0, INT64_MAX)
        integer("n", 1, self.MAX_N)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad("min_tokens", f"must be at most max_tokens ({self.max_tokens})")
        if self.min_tokens and self.grammar is not None:
            bad("min_tokens", "cannot be combined with a grammar (it may allow only a stop token)")
        tags = self.reasoning_tag_ids
        if tags is not None:
            if not isinstance(tags, (list, tuple)) or len(tags) != 2:
                bad("reasoning_tag_ids", "must be two token ids (the reasoning's start and end tags)")
            pair = tuple(integer("reasoning_tag_ids", 0, INT64_MAX, token) for token in tags)
            if pair[0] == pair[1]:
                bad("reasoning_tag_ids", "must be two different token ids")
            if self.grammar is None:
                bad("reasoning_tag_ids", "only applies with a grammar (it says where the grammar starts)")
            object.__setattr__(self, "reasoning_tag_ids", pair)
        elif self.reasoning_opened:
            bad("reasoning_opened", "needs reasoning_tag_ids (the tags of the reasoning the prompt opened)")
        k = self.truncate_prompt_tokens
        if k is not None:
            if not _is_integer(k) or not (k == -1 or 1 <= k <= INT64_MAX):
                bad("truncate_prompt_tokens", "must be -1 (the context length) or an integer in [1, 2**63-1]")
            object.__setattr__(self, "truncate_prompt_tokens", int(k))
        if not all(isinstance(s, str) and s for s in self.stop):
            bad("stop", "must be non-empty strings")
        if len(self.stop) > self.MAX_STOP_STRINGS:
            raise ValueError(f"stop must hold at most {self.MAX_STOP_STRINGS} strings, got {len(self.stop)}")
        if any(len(s) > self.MAX_STOP_CHARS for s in self.stop):
            longest = max(len(s) for s in self.stop)
            raise ValueError(
                f"stop strings must be at most {self.MAX_STOP_CHARS} characters, got one of {longest}"
            )
        for i, text in enumerate(self.stop):  # (the scheduler's UnicodeEncodeError, once admitted)
            if (surrogate := LONE_SURROGATE.search(text)) is not None:
                raise ValueError(
                    f"stop is not valid text: stop string {i} has a lone UTF-16 surrogate at index "
                    f"{surrogate.start()}"
                )
        stop_ids = tuple(integer("stop_token_ids", 0, INT64_MAX, token) for token in self.stop_token_ids)
        object.__setattr__(self, "stop_token_ids", stop_ids)
        if self.allowed_token_ids is not None:
            if not self.allowed_token_ids:  # (every token -inf: nothing to sample)
                bad("allowed_token_ids", "must hold at least one token id (None allows every token)")
            if len(self.allowed_token_ids) > self.MAX_ALLOWED_TOKEN_IDS:
                raise ValueError(
                    f"allowed_token_ids must hold at most {self.MAX_ALLOWED_TOKEN_IDS} token ids, got "
                    f"{len(self.allowed_token_ids)}"
                )
            allowed = {integer("allowed_token_ids", 0, INT64_MAX, token) for token in self.allowed_token_ids}
            object.__setattr__(self, "allowed_token_ids", tuple(sorted(allowed)))
        if not all(isinstance(w, str) and w.strip() for w in self.bad_words):
            bad("bad_words", "must be strings with some text besides whitespace")
        if len(self.bad_words) > self.MAX_BAD_WORDS:
            raise ValueError(
                f"bad_words must hold at most {self.MAX_BAD_WORDS} words, got {len(self.bad_words)}"
            )
        if any(len(w) > self.MAX_BAD_WORD_CHARS for w in self.bad_words):
            longest = max(len(w) for w in self.bad_words)
            raise ValueError(
                f"bad_words must be at most {self.MAX_BAD_WORD_CHARS} characters each, got one of {longest}"
            )
        for i, text in enumerate(self.bad_words):  # (the tokenizer's UnicodeEncodeError)
            if (surrogate := LONE_SURROGATE.search(text)) is not None:
                raise ValueError(
                    f"bad_words is not valid text: word {i} has a lone UTF-16 surrogate at index {surrogate.start()}"
                )
        if self.bad_words_token_ids is not None:
            forms = tuple(
                tuple(integer("bad_words_token_ids", 0, INT64_MAX, token) for token in form)
                for form in self.bad_words_token_ids
            )
            object.__setattr__(self, "bad_words_token_ids", forms)
        if not finite("repetition_penalty") > 0:
            bad("repetition_penalty", "must be > 0 (1 disables it)")
        limit = self.MAX_LOGIT_BIAS
        for token, bias in self.logit_bias.items():
            if not 0 <= token <= INT64_MAX:  # (a larger id cannot cross to the workers)
                bad("logit_bias", "must map token ids (integers in [0, 2**63-1]) to biases")
            if not _is_number(bias) or not -limit <= bias <= limit:
                bad("logit_bias", f"values must be numbers in [-{limit:g}, {limit:g}]")
            if type(bias) not in (int, float):
                self.logit_bias[token] = float(bias)
        for name, number in floats.items():
            object.__setattr__(self, name, number)

    # ---------------------------------------------------------------- derived copies (no re-check)

    def _derived(self, **changes: Any) -> SamplingParams:
        """A copy with ``changes``, which the caller guarantees are in range: no validation."""
        copy = object.__new__(SamplingParams)
        copy.__dict__.update(self.__dict__, **changes)
        return copy

    def with_max_tokens(self, max_tokens: int) -> SamplingParams:
        """This request with ``max_tokens`` decided by admission (what the context leaves)."""
        if not 1 <= max_tokens <= INT64_MAX:
            raise ValueError(f"max_tokens must be an integer in [1, 2**63-1], got {max_tokens}")
        return self._derived(max_tokens=max_tokens)

    def with_bad_words_token_ids(self, forms: tuple[tuple[int, ...], ...]) -> SamplingParams:
        """This request with its ``bad_words`` tokenized, by admission
        (:func:`minisgl_core.request_limits.bad_words_token_ids`)."""
        return self._derived(bad_words_token_ids=tuple(tuple(form) for form in forms))

    def for_choice(self, index: int) -> SamplingParams:
        """The parameters of the engine request that runs choice ``index`` of a request with
        ``n > 1``: ``n`` 1 (an engine runs one completion a request) and, with a seed, a distinct
        but reproducible one per choice (:func:`choice_seed`); this very object when nothing
        changes. The server and the offline ``LLM`` expand n alike, so that a seeded request
        gives the same choices through both."""
        changes: dict[str, Any] = {}
        if self.n != 1:
            changes["n"] = 1
        if index != 0 and self.seed is not None:
            changes["seed"] = choice_seed(self.seed, index)
        return self._derived(**changes) if changes else self

    # ---------------------------------------------------------------- the wire (msgpack)

    def to_wire(self) -> list[Any]:
        """The fields in order as plain values (msgpack); the grammar as ``[kind, value]``."""
        values = [getattr(self, name) for name in _FIELD_NAMES]
        if self.grammar is not None:
            values[_GRAMMAR_INDEX] = [self.grammar.kind, self.grammar.value]
        return values

    @classmethod
    def from_wire(cls, values: list[Any]) -> SamplingParams:
        """Rebuild what :meth:`to_wire` sent, without validating again: the object was validated
        where the request entered, and only minisgl's own processes send it."""
        by_name = dict(zip(_FIELD_NAMES, values, strict=True))
        by_name["stop"] = tuple(by_name["stop"])
        by_name["stop_token_ids"] = tuple(by_name["stop_token_ids"])
        by_name["bad_words"] = tuple(by_name["bad_words"])
        if by_name["allowed_token_ids"] is not None:
            by_name["allowed_token_ids"] = tuple(by_name["allowed_token_ids"])
        if by_name["bad_words_token_ids"] is not None:
            by_name["bad_words_token_ids"] = tuple(map(tuple, by_name["bad_words_token_ids"]))
        if by_name["reasoning_tag_ids"] is not None:
            by_name["reasoning_tag_ids"] = tuple(by_name["reasoning_tag_ids"])
        grammar = by_name["grammar"]
        if grammar is not None:
            by_name["grammar"] = GrammarSpec(*grammar)
        params = object.__new__(cls)
        params.__dict__.update(by_name)
        return params

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(SamplingParams))
_GRAMMAR_INDEX = _FIELD_NAMES.index("grammar")


def _bound(value: int) -> str:
    return {INT64_MIN: "-2**63", INT64_MAX: "2**63-1"}.get(value, str(value))


def short_repr(value: object) -> str:
    """A field's value for an error message, cut short (a stop list may be long)."""
    try:
        return cut(repr(value))
    except RecursionError:  # (a list nested thousands deep: repr's error replaced the field's)
        return f"<{type(value).__name__} nested too deeply to show>"


def cut(text: str, limit: int = 80) -> str:
    """``text`` for an error message: at most ``limit`` characters, ``...`` ending a longer one
    (a client's 100,000-character value was echoed whole)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_integer(value: object) -> bool:
    """An integer of any kind (numpy's too, as vLLM takes them), not a bool (True is no count)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    """A real number of any kind (numpy's float32 too), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _token_id(key: object) -> int:
    """A logit_bias key: an integer (numpy's too), or its decimal digits as JSON keys carry it. Not
    whatever ``int()`` takes: "5_0" was token 50, "٥" (an Arabic-Indic digit) 5, 5.7 token 5 and
    True 1."""
    if _is_integer(key):
        return int(key)  # type: ignore[call-overload]
    if isinstance(key, str) and re.fullmatch(r"-?[0-9]+", key):
        return int(key)
    raise ValueError(f"logit_bias keys must be token ids, got {short_repr(key)}")


#: generation_config.json keys that become a request's defaults when the request leaves them unset
GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
#: generation_config.json keys minisgl reads but cannot honour (no such sampler option): logged once
UNSUPPORTED_GENERATION_KEYS = ("typical_p", "epsilon_cutoff", "eta_cutoff")


def sampling_defaults(generation_config: dict) -> dict:
    """The model's own sampling defaults (from ``generation_config.json`` or a weight file's
    metadata) as SamplingParams fields: ``max_new_tokens`` becomes ``max_tokens``."""
    defaults = {k: generation_config[k] for k in GENERATION_DEFAULTS if generation_config.get(k) is not None}
    if generation_config.get("max_new_tokens") is not None:
        defaults["max_tokens"] = generation_config["max_new_tokens"]
    return defaults


def merge_sampling(request: dict, model_defaults: dict) -> dict:
    """SamplingParams keyword arguments for one request, field by field: the request's value when
    it set one (not None), else the model's default, else SamplingParams' own (OpenAI's) default,
    which is why unset fields are simply left out."""
    merged = {k: v for k, v in model_defaults.items() if v is not None}
    merged.update({k: v for k, v in request.items() if v is not None})
    return merged


class TokenLogprob(NamedTuple):
    token_id: int
    logprob: float
    #: the most likely tokens at this position, (token_id, logprob), best first
    top: list[tuple[int, float]]
    #: the token's rank in the vocabulary at this position (1: the most likely; a tie takes the
    #: lowest place, as vLLM counts); None where not computed
    rank: int | None = None


class StepOutput(NamedTuple):
    """One request's progress in one engine step: its newly sampled token, and whether it finished."""

    rid: int
    token_id: int
    finished: bool
    #: "stop" | "length" | "abort" | "error" | "invalid" when finished
    finish_reason: str | None = None
    #: the stop string or stop token id that ended the request, if any
    matched_stop: str | int | None = None
    logprob: TokenLogprob | None = None
    #: why the request failed (finish_reason "error"), e.g. its grammar rejected a sampled token;
    #: "invalid" when the request is at fault (its grammar accepts no text, or did not compile)
    error: str | None = None
    #: with ``prompt_logprobs``, on the request's first output: one per prompt token, None for the
    #: first (nothing precedes it)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    #: on the request's first output (a token's, or its grammar's error): how many prompt tokens
    #: were read from the prefix cache, not computed for it (Request.cached_prompt_tokens); else None
    cached_tokens: int | None = None
    #: with finish_reason "invalid": the request's field at fault (a SamplingParams field, or
    #: "grammar" for whichever field set it), which the server's 400 names as its param; else None
    error_param: str | None = None
    #: of the request's prediction (OpenAI's Predicted Outputs), the tokens this step's output used
    #: for the first time (a verify step's accepted drafts from it): added up into the usage's
    #: ``accepted_prediction_tokens``; else None
    accepted_prediction_tokens: int | None = None
