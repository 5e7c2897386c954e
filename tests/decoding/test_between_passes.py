"""``Decoder.between_passes`` and ``Decoder.spare`` (issue #45 kind 4, what ``pcd serve`` uses to
decode short records between a long record's passes and to stop a call nobody waits for): on a
tiny random Llama, a long record decoded on a spare decoder while short records are decoded on
the original between its passes gives exactly what each gives alone; a hook that raises ends the
call with the cache cropped back to the head, and the decoder goes on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pcd_cli.decoding.compile import CompiledSchema
from pcd_cli.decoding.decode import Decoder
from pcd_cli.results import Record
from pcd_cli.schema.load import load_schema

from ..helpers import TEXTS, tiny_backend

SCHEMA = load_schema(Path(__file__).resolve().parents[2] / "schemas" / "airline_sentiment.yaml")
LONG = "My bag never arrived and the agent at the desk told me to call a number nobody answers. " * 30


@pytest.fixture(scope="module")
def decoder():
    backend = tiny_backend(seed=5)
    compiled = CompiledSchema(SCHEMA, backend.tokenizer, scoring="marginal", logits_width=backend.logits_width)
    return Decoder(backend, compiled, max_tokens_per_pass=64)


def _probs(results):
    return [np.array([f.probs for f in r.fields]) for r in results]


def test_short_records_between_a_long_records_passes_change_nothing(decoder):
    long_alone = decoder.decode([Record("long", LONG)])
    short_alone = [decoder.decode([Record(i, t)]) for i, t in enumerate(TEXTS)]
    spare = decoder.spare()
    pending = list(enumerate(TEXTS))
    between: list = []

    def hook():  # on the long record's decoder, as the server's worker does
        if pending:
            i, t = pending.pop(0)
            between.append(decoder.decode([Record(i, t)]))

    spare.between_passes = hook
    long_interleaved = spare.decode([Record("long", LONG)])
    spare.between_passes = None
    assert spare.record_passes > len(TEXTS)  # the long record is many passes of 64 tokens
    assert len(between) == len(TEXTS)  # every short record was decoded between them
    for a, b in zip(_probs(long_alone), _probs(long_interleaved)):
        np.testing.assert_array_equal(a, b)
    for alone, inter in zip(short_alone, between):
        np.testing.assert_array_equal(_probs(alone)[0], _probs(inter)[0])
    head = len(decoder.compiled.prompt.head_ids)
    assert all(decoder.backend.cache_length(c) == head for c in [*decoder.caches.values(), *spare.caches.values()])


def test_a_hook_that_raises_ends_the_call_and_the_decoder_goes_on(decoder):
    before = decoder.decode([Record("a", TEXTS[0])])
    calls = []

    class Stop(Exception):
        pass

    def hook():
        calls.append(1)
        if len(calls) == 3:
            raise Stop()

    decoder.between_passes = hook
    with pytest.raises(Stop):
        decoder.decode([Record("long", LONG)])
    decoder.between_passes = None
    head = len(decoder.compiled.prompt.head_ids)
    assert len(calls) == 3 and all(decoder.backend.cache_length(c) == head for c in decoder.caches.values())
    np.testing.assert_array_equal(_probs(before)[0], _probs(decoder.decode([Record("a", TEXTS[0])]))[0])
