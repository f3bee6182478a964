"""The responses ``/v1/responses`` stored (OpenAI's ``store``, on by default): each finished
response's JSON and the conversation it ran on, kept in the API server process's memory for
``GET``/``DELETE /v1/responses/{id}`` and for a later request's ``previous_response_id``.

Bounded twice, the oldest response evicted first: at most ``--responses-store-size`` responses,
and at most :data:`MAX_STORED_CHARS` characters of JSON in all (a response keeps its whole
conversation, which a chain of turns repeats in each, so the count alone would not bound the
memory). Each entry is kept as JSON text: immutable, its size known, and answered as it was.
Nothing survives a restart, and each replica behind a router keeps its own.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from typing import Any, NamedTuple

logger = logging.getLogger(__name__)

#: the most characters of JSON the store keeps in all (responses and their conversations)
MAX_STORED_CHARS = 256 << 20
#: ``--responses-store-size``'s default
DEFAULT_STORE_SIZE = 1024


class Stored(NamedTuple):
    #: the Response object as the client got it (the last stream event's, for a stream)
    response: str
    #: the conversation it ran on: the input items as rendered, a previous response's first
    input_items: str

    @property
    def chars(self) -> int:
        return len(self.response) + len(self.input_items)


class ResponseStore:
    """Responses by id, oldest evicted first past ``max_responses`` or ``max_chars``;
    ``max_responses`` 0: nothing is stored (``enabled`` is false)."""

    def __init__(self, max_responses: int, max_chars: int = MAX_STORED_CHARS) -> None:
        self.max_responses = max_responses
        self.max_chars = max_chars
        self._entries: OrderedDict[str, Stored] = OrderedDict()
        self.chars = 0

    @property
    def enabled(self) -> bool:
        return self.max_responses > 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response: dict[str, Any], input_items: list[dict[str, Any]]) -> None:
        """Keep ``response`` (its ``id`` the key) and the ``input_items`` it ran on."""
        if not self.enabled:
            return
        entry = Stored(json.dumps(response, ensure_ascii=False), json.dumps(input_items, ensure_ascii=False))
        self.delete(response["id"])  # (what was kept under the id is replaced, even by nothing)
        if entry.chars > self.max_chars:  # (would evict everything and still not fit)
            logger.warning(
                "response %s not stored: its %d characters of JSON are more than the store holds",
                response["id"],
                entry.chars,
            )
            return
        self._entries[response["id"]] = entry
        self.chars += entry.chars
        while len(self._entries) > self.max_responses or self.chars > self.max_chars:
            _, oldest = self._entries.popitem(last=False)
            self.chars -= oldest.chars

    def get(self, rid: str) -> Stored | None:
        return self._entries.get(rid)

    def delete(self, rid: str) -> bool:
        entry = self._entries.pop(rid, None)
        if entry is None:
            return False
        self.chars -= entry.chars
        return True

    def conversation(self, rid: str) -> list[dict[str, Any]] | None:
        """What a request naming ``rid`` as its ``previous_response_id`` continues: the stored
        response's input items, then its output items."""
        entry = self._entries.get(rid)
        if entry is None:
            return None
        return [*json.loads(entry.input_items), *json.loads(entry.response)["output"]]
