"""A small built-in English-ish corpus to train the test tokenizers on (no downloads)."""

from __future__ import annotations

import random

_TEXT = """\
The quick brown fox jumps over the lazy dog while the small cat sleeps near the warm window.
Once upon a time there was a little village beside a quiet river, and every morning the baker opened his shop.
Children walked to school through the green fields, talking about books, games, music and the weather.
Scientists measure temperature, pressure and speed with careful instruments before they write their reports.
A good question often matters more than a quick answer; patient people listen before they speak.
The train leaves the station at seven o'clock, crosses the mountains and arrives in the city after dinner.
Computers read numbers, store information in memory and follow simple instructions very quickly.
She bought apples, oranges, bread, cheese and fresh vegetables at the market on Saturday afternoon.
Hello! How are you today? I am fine, thank you. What would you like to learn about?
Please explain why the sky is blue, how rain forms in clouds, and where rivers find the sea.
In the spring the garden is full of flowers; in the autumn the trees lose their yellow and red leaves.
The engineer designed a bridge that was strong, light and beautiful, and thousands of people crossed it.
Write a short story about a friendly robot who helps an old farmer repair a broken tractor.
History teaches us that great cities grow slowly, through trade, work, friendship and many small decisions.
The ocean is deep and mysterious; whales sing, fish swim in bright schools, and ships sail across the waves.
My favourite recipe uses eggs, flour, sugar, butter and a little salt, mixed together and baked for an hour.
"""

_WORDS = """
time person year way day thing man world life hand part child eye woman place work week case point government
company number group problem fact water room mother area money story month lot right study book job word business
issue side kind head house service friend father power hour game line end member law car city community name
president team minute idea kid body information back parent face others level office door health art war history
party result change morning reason research girl guy moment air teacher force education foot boy age policy process
music market sense nation plan college interest death experience effect use class control care field development
role effort rate heart drug show leader light voice wife police mind price report decision son view relationship
town road arm difference value building action model season society tax director position player record paper
space ground form event official matter center couple site project activity star table need court oil situation
cost industry figure street image phone data picture practice piece land product doctor wall patient worker news
test movie north love support technology step baby computer type attention film tree source organization hair
window evidence population garden engine network language sister summer winter bright careful happy strange simple
ancient modern gentle heavy quiet rapid silver golden hidden frozen curious build carry discover explain follow
imagine measure notice prepare remember survive travel understand wonder
""".split()

_FUNCTION_WORDS = """
the the the a a an and and of of to to in in is is was are be it it that this for on with as you you I I we
they he she what how why where when who not but or all can will would there their your my his her our
from by at about more one two three some any very just so if than then also like have has had do does did
""".split()


def builtin_corpus(num_sentences: int = 4000, seed: int = 0) -> list[str]:
    """Hand-written paragraphs (repeated, so their words dominate the first merges) plus seeded
    random sentences mixing function words and a common-word list: enough distinct words for
    byte-level BPE to reach a 2048-token vocabulary."""
    rng = random.Random(seed)
    lines = _TEXT.splitlines() * 20
    for _ in range(num_sentences):
        words = [
            rng.choice(_FUNCTION_WORDS if rng.random() < 0.4 else _WORDS) for _ in range(rng.randint(4, 12))
        ]
        sentence = " ".join(words).capitalize() + rng.choice(".!?,;")
        if rng.random() < 0.2:
            sentence += f" {rng.randint(0, 9999)}"
        lines.append(sentence)
    return lines
