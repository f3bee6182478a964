"""The scheduler's stop-string check on text whose characters span several tokens, as a byte-level
vocabulary spells CJK and emoji: found wherever the text holds the stop, never inside a character."""

from __future__ import annotations

import random

from minisgl_core.sampling import SamplingParams
from minisgl_core.scheduler.request import Request
from minisgl_core.scheduler.stop import StopChecker


def byte_decode(ids: list[int], skip_special_tokens: bool = True) -> str:
    """Token id i is the byte i (a character of k UTF-8 bytes is k tokens)."""
    return bytes(ids).decode("utf-8", errors="replace")


def run(text: str, stop: list[str], min_tokens: int = 0) -> tuple[int, str | None]:
    """Feed ``text``'s bytes one token at a time: (tokens produced when the checker stopped, the
    stop it matched), or (all, None)."""
    data = text.encode("utf-8")
    params = SamplingParams(max_tokens=len(data) + 9, stop=stop, min_tokens=min_tokens, ignore_eos=True)
    req = Request(rid=0, prompt_ids=[1], params=params, arrival=0)
    checker = StopChecker((), byte_decode)
    for byte in data:
        req.output_ids.append(byte)
        reason, matched = checker.check(req)
        if reason == "stop":
            return len(req.output_ids), matched  # type: ignore[return-value]
    return len(data), None


def reference(text: str, stop: list[str], min_tokens: int = 0) -> tuple[int, str | None]:
    """The first token (byte) count at which the text of whole characters so far holds a stop
    that ends at or after token ``min_tokens``."""
    data = text.encode("utf-8")
    for n in range(1, len(data) + 1):
        if n < min_tokens:
            continue
        seen = data[:n].decode("utf-8", errors="ignore")  # whole characters only
        earliest = len(data[: min_tokens - 1].decode("utf-8", errors="ignore")) if min_tokens > 1 else 0
        hits = [(at, len(s), s) for s in stop if (at := seen.find(s, max(0, earliest - len(s) + 1))) >= 0]
        if hits:
            return n, min(hits)[2]
    return len(data), None


def test_cjk_and_emoji_stops_are_found():
    """The window was the stop's length in characters + 4 tokens: "日本語では" (five characters,
    fifteen bytes) inside Japanese text, or three emoji, were never found."""
    text = "はなくなるは日本語ではなくなる"
    assert run(text, ["日本語では"]) == (len("はなくなるは日本語では".encode()), "日本語では")
    assert run("Emoji: 🎉🎉🎉🎉", ["🎉🎉🎉"]) == (len("Emoji: 🎉🎉🎉".encode()), "🎉🎉🎉")
    assert run("한국어 텍스트", ["한국어"])[1] == "한국어"


def test_a_replacement_character_stop_matches_only_a_real_one():
    """Part of an emoji decodes to U+FFFD: a stop of "\\ufffd" ended the request inside the first
    emoji; only a U+FFFD the text really holds counts."""
    assert run("🎉🎉🎉 party", ["\ufffd"]) == (len("🎉🎉🎉 party".encode()), None)
    assert run("ab\ufffdcd", ["\ufffd"]) == (
        len("ab\ufffd".encode()) + 1,
        "\ufffd",
    )  # once a token follows it


def test_random_unicode_text_stops_where_the_reference_says():
    rng = random.Random(0)
    alphabet = ["a", "b", "é", "日", "本", "🎉", "한", " "]
    for _ in range(600):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        stops = [
            "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))
        ]
        if rng.random() < 0.3:  # a stop the text holds
            start = rng.randrange(len(text))
            stops.append(text[start : start + rng.randint(1, 5)])
        if rng.random() < 0.3:  # a long one (a window past 16 tokens: the last characters looked at first)
            start = rng.randrange(len(text))
            stops.append(text[start : start + rng.randint(5, 14)])
        min_tokens = rng.choice([0, 0, 3, 9])
        got, want = run(text, stops, min_tokens), reference(text, stops, min_tokens)
        assert got == want, (text, stops, min_tokens)


def test_a_stop_string_matches_the_text_the_client_gets_special_tokens_skipped_or_not(default_model_dir):
    """A stop string holding a special token's text ("4.<|im_end|>") matched in the scheduler,
    which decoded special tokens, while the detokenizer skipped them and found nothing to cut: the
    client got "The answer is 4." with finish_reason "stop" and stop_reason "4.<|im_end|>". Now the
    scheduler matches on the text the client gets, as vLLM does: with special tokens skipped such a
    stop never matches; with them kept it matches and the text is cut before it."""
    from minisgl_core.tokenizer.detokenize import final_text
    from minisgl_core.tokenizer.load import load_tokenizer

    tokenizer = load_tokenizer(str(default_model_dir))
    ids = tokenizer.encode("The answer is 4.<|im_end|>\nMore", add_special_tokens=False)
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in ids
    checker = StopChecker((), lambda window, skip: tokenizer.decode(window, skip_special_tokens=skip))
    for skip in (True, False):
        params = SamplingParams(
            max_tokens=64, stop=["4.<|im_end|>"], ignore_eos=True, skip_special_tokens=skip
        )
        req = Request(rid=0, prompt_ids=[1], params=params, arrival=0)
        matched = None
        for token in ids:
            req.output_ids.append(token)
            reason, matched = checker.check(req)
            if reason == "stop":
                break
        if skip:
            assert matched is None and len(req.output_ids) == len(ids)
        else:
            assert matched == "4.<|im_end|>"
            assert (
                final_text(tokenizer, req.output_ids, matched, skip_special_tokens=False) == "The answer is "
            )
