"""The detokenizer's hold-back of a possible stop-string beginning, read incrementally: against a
brute-force reference on random text, and in time linear in the text where the rescan was not
(1,000 stops of 8,000 characters stalled every request of a server for a minute)."""

from __future__ import annotations

import random
import time

import pytest

from minisgl_core.sampling import SamplingParams
from minisgl_core.tokenizer.detokenize import IncrementalDetokenizer, _StopTail


class CharTokenizer:
    """Token id i is the character chr(i)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(map(chr, ids))


def held_back(text: str, stops: list[str]) -> int:
    """The reference: the longest proper beginning of any stop that the text ends with."""
    return max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


def test_the_tail_matches_the_brute_force_reference_on_random_text():
    rng = random.Random(0)
    for _ in range(300):
        alphabet = "ab" if rng.random() < 0.7 else "abc"
        stop = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8)))
        tail, text = _StopTail(stop), ""
        for _ in range(rng.randint(1, 12)):
            piece = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
            tail.feed(piece)
            text += piece
            assert tail.matched == held_back(text, [stop]), (stop, text)


def test_the_stream_stops_where_the_reference_says():
    rng = random.Random(1)
    for _ in range(200):
        stops = [
            "".join(rng.choice("ab") for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 3))
        ]
        text = "".join(rng.choice("abc") for _ in range(rng.randint(1, 30)))
        detok = IncrementalDetokenizer(CharTokenizer(), stops)
        sent = ""
        for i in range(len(text)):
            sent += detok.add([ord(text[i])])
            seen = text[: i + 1]
            first = min((at for s in stops if (at := seen.find(s)) >= 0), default=len(seen))
            # out: all but a tail that may begin a stop, and nothing from a whole one on
            assert sent == seen[: min(len(seen) - held_back(seen, stops), first)], (stops, seen, sent)
            if first < len(seen):  # the request ends here (the scheduler saw it): the text before it
                matched = min((s for s in stops if seen.find(s) == first), key=len)
                sent += detok.add([], finished=True, matched_stop=matched)
                assert sent == seen[:first], (stops, seen, sent)
                break


def test_long_stop_strings_cost_time_linear_in_the_text():
    n, length = SamplingParams.MAX_STOP_STRINGS, SamplingParams.MAX_STOP_CHARS
    stops = ["☃" * (length - 4) + f"{i:04d}" for i in range(n)]
    detok = IncrementalDetokenizer(CharTokenizer(), stops)
    started = time.perf_counter()
    # text no stop begins with: the rescan tried every beginning of every stop at every step
    story = "".join(detok.add([ord(ch)]) for ch in "once upon a time " * 60)
    assert story == "once upon a time " * 60  # nothing held back
    # and text that may begin them all: held back until it cannot
    held = "".join(detok.add([ord("☃")]) for _ in range(2000))
    assert held == "☃" * (2000 - (length - 4)) and detok.add([ord("x")]) == "☃" * (length - 4) + "x"
    assert time.perf_counter() - started < 10  # (the rescan: minutes)


def test_stop_strings_are_bounded_in_number_and_length():
    SamplingParams(stop=["s"] * SamplingParams.MAX_STOP_STRINGS)
    SamplingParams(stop=["s" * SamplingParams.MAX_STOP_CHARS])
    with pytest.raises(ValueError, match=r"^stop must hold at most 256 strings, got 257"):
        SamplingParams(stop=["s"] * (SamplingParams.MAX_STOP_STRINGS + 1))
    with pytest.raises(ValueError, match=r"^stop strings must be at most 1024 characters, got one of 1025"):
        SamplingParams(stop=["ok", "s" * (SamplingParams.MAX_STOP_CHARS + 1)])
