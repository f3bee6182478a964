"""Output text of a SentencePiece vocabulary whose decoder strips the space of the first "▁" piece
(Llama 2's, Mistral's, Phi-3's): the output is read after the prompt's last tokens, so an answer
starting "▁Paris" is " Paris", as vLLM and SGLang give it (decoded alone it was "Paris", and
"The capital of France is" + "Paris" ran together), streamed, whole, offline and for stop strings.
And its byte pieces (<0xE6>), a run of which decodes all to U+FFFD where it ends inside a character:
an output cut there, a stop-string window starting there, min_tokens' text ending there."""

from __future__ import annotations

from pathlib import Path

import pytest

from minisgl_core.messages import StepOutputs
from minisgl_core.processes.text_workers import Detokenizer
from minisgl_core.sampling import SamplingParams
from minisgl_core.scheduler.request import Request
from minisgl_core.scheduler.stop import StopChecker
from minisgl_core.tokenizer.detokenize import IncrementalDetokenizer, final_text, prompt_context

WORDS = ["▁The", "▁capital", "▁of", "▁France", "▁is", "▁Paris", ".", "▁It", "▁big"]


def sentencepiece_tokenizer():
    """Llama 2's layout: "▁" for spaces, a space put before the text, bytes as <0xNN> pieces, and
    a decoder that takes the first space off again."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for word in ["▁", *WORDS]:
        vocab[word] = len(vocab)
    # (no merges: text encodes as "▁" and bytes, enough for a prompt; the words are decoded by id)
    model = models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


@pytest.fixture(scope="module")
def spm():
    return sentencepiece_tokenizer()


def ids_of(tokenizer, *words: str) -> list[int]:
    return tokenizer.convert_tokens_to_ids(list(words))


def test_the_tokenizer_drops_the_first_space(spm):
    assert spm.decode(ids_of(spm, "▁Paris", ".")) == "Paris."
    prompt = ids_of(spm, "▁The", "▁capital", "▁of", "▁France", "▁is")
    assert spm.decode(prompt + ids_of(spm, "▁Paris")) == "The capital of France is Paris"
    assert spm.decode(spm.encode("The capital", add_special_tokens=False)) == "The capital"


def test_the_output_keeps_its_first_space_whole_and_streamed(spm):
    prompt = ids_of(spm, "▁The", "▁capital", "▁of", "▁France", "▁is")
    output = ids_of(spm, "▁Paris", ".", "▁It", "▁is", "▁big", ".")
    context = prompt_context(prompt)
    assert final_text(spm, output, None, context=context) == " Paris. It is big."
    assert final_text(spm, output, " is", context=context) == " Paris. It"

    detok = Detokenizer(spm)
    step = StepOutputs()
    step.open_stream(5, [], True, context=context)
    texts = []
    for i, token in enumerate(output):
        step.add(5, token, "length" if i == len(output) - 1 else None)
        texts += detok.convert(step).texts
        step = StepOutputs()
    assert texts == [" Paris", ".", " It", " is", " big", "."]


def test_a_stop_string_starting_with_the_first_space_is_found(spm):
    """stop " Paris": the scheduler read the first token alone ("Paris") and went on."""
    prompt = ids_of(spm, "▁The", "▁capital", "▁of", "▁France", "▁is")
    checker = StopChecker((), lambda ids, skip: spm.decode(ids, skip_special_tokens=skip))
    params = SamplingParams(max_tokens=8, stop=[" Paris"], ignore_eos=True)
    req = Request(rid=0, prompt_ids=prompt, params=params, arrival=0)
    req.output_ids.append(ids_of(spm, "▁Paris")[0])
    assert checker.check(req) == ("stop", " Paris")
    assert final_text(spm, req.output_ids, " Paris", context=prompt_context(prompt)) == ""


def test_offline_generation_keeps_the_first_space(spm, tmp_path: Path):
    """LLM.generate through the engine: the first token forced to "▁Paris"."""
    from minisgl_core.demo.factories import make_model_dir
    from minisgl_core.llm import LLM

    model_dir = make_model_dir(tmp_path / "tiny-llama", "LlamaForCausalLM", seed=0)
    spm.save_pretrained(model_dir)
    llm = LLM(model_dir, device="cpu", attn="torch", max_context_len=256, num_kv_tokens=1024)
    paris = ids_of(spm, "▁Paris")
    [out] = llm.generate(
        "The capital of France is", SamplingParams(max_tokens=1, allowed_token_ids=paris, temperature=0)
    )
    assert out.outputs[0].text == " Paris"
    [out] = llm.generate(
        "The capital of France is",
        SamplingParams(max_tokens=1, allowed_token_ids=paris, temperature=0, stop=[" Paris"]),
    )
    assert (out.outputs[0].text, out.outputs[0].finish_reason) == ("", "stop")


def test_an_output_cut_inside_a_character_keeps_the_characters_before_it(spm):
    """Byte pieces (<0xE6>) ending inside a character decode, the whole run of them, to U+FFFD
    a byte: "日本" and half of "語" were seven U+FFFD (the last one dropped), whole and as the
    stream's last piece; the cut character's bytes are left out, as the stream never sent them."""
    prompt = ids_of(spm, "▁The", "▁capital", "▁is")
    pieces = ["▁", *(f"<0x{b:02X}>" for b in "日本語".encode())]
    output = ids_of(spm, *pieces)[:-1]  # max_tokens reached one byte before "語" completes
    context = prompt_context(prompt)
    assert final_text(spm, output, None, context=context) == " 日本"
    detok = IncrementalDetokenizer(spm, [], context=context)
    streamed = "".join(detok.add([token]) for token in output[:-1]) + detok.add(output[-1:], finished=True)
    assert streamed == " 日本"
    # whole characters, and a U+FFFD the model wrote itself, stay
    assert final_text(spm, ids_of(spm, *pieces), None, context=context) == " 日本語"
    written = ids_of(spm, "▁", *(f"<0x{b:02X}>" for b in "\ufffd".encode()))
    assert final_text(spm, written, None, context=context) == " \ufffd"


def byte_pieces(spm, text: str) -> list[int]:
    return ids_of(spm, *(f"<0x{b:02X}>" for b in text.encode()))


def stop_at(spm, output: list[int], **params) -> tuple[int, str | None]:
    """(tokens produced when the scheduler's check stopped, the stop it matched)."""
    checker = StopChecker((), lambda ids, skip: spm.decode(ids, skip_special_tokens=skip))
    sampling = SamplingParams(max_tokens=len(output), ignore_eos=True, **params)
    req = Request(rid=0, prompt_ids=ids_of(spm, "▁The", "▁capital", "▁is"), params=sampling, arrival=0)
    for token in output:
        req.output_ids.append(token)
        reason, matched = checker.check(req)
        if reason == "stop":
            return len(req.output_ids), matched  # type: ignore[return-value]
    return len(output), None


def test_a_stop_after_byte_pieces_is_found_where_it_ends(spm):
    """A window starting inside a character of a run of byte pieces decoded the whole run to
    U+FFFD: stop "👧 ." in "👨‍👩‍👧 ." was found a token late (or, with max_tokens there, never)."""
    output = [
        *ids_of(spm, "▁"),
        *byte_pieces(spm, "👨\u200d👩\u200d👧"),
        *ids_of(spm, "▁", "."),
        *ids_of(spm, "▁It"),
    ]
    assert stop_at(spm, output, stop=["👧 ."]) == (len(output) - 1, "👧 .")
    for stop in ["語", "本語", "日本語 It"]:  # CJK spelled in byte pieces, each window start
        text_ids = [*ids_of(spm, "▁"), *byte_pieces(spm, "一日本語"), *ids_of(spm, "▁It", "▁big")]
        want = len(ids_of(spm, "▁")) + len(byte_pieces(spm, "一日本語")) + (1 if "It" in stop else 0)
        assert stop_at(spm, text_ids, stop=[stop]) == (want, stop), stop


def test_a_stop_before_min_tokens_stays_uncounted_after_byte_pieces(spm):
    """The text of the first min_tokens - 1 tokens, ending inside "👩" after other byte pieces,
    decoded to U+FFFD from "👨" on: read as the text before it, so "👨", ended before min_tokens,
    counted and cut the answer short."""
    output = [*ids_of(spm, "▁"), *byte_pieces(spm, "日本"), *ids_of(spm, "▁")]
    output += [*byte_pieces(spm, "👨\u200d👩"), *ids_of(spm, "▁It", "▁big")]
    min_tokens = len(output) - 3  # the first min_tokens - 1 end two bytes into "👩"
    assert stop_at(spm, output, stop=["👨"], min_tokens=min_tokens) == (len(output), None)
    detok = IncrementalDetokenizer(spm, ["👨"], min_tokens=min_tokens, context=ids_of(spm, "▁is"))
    streamed = "".join(detok.add([token], finished=token == output[-1]) for token in output)
    assert streamed == final_text(spm, output, None, context=ids_of(spm, "▁is")) == " 日本 👨\u200d👩 It big"
