"""Few-shot examples in the prompt head: validation, the balanced draw, token-identical answer
lines, one prefill per run, and the decoder against the brute-force oracle with examples."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from pcd_cli.api import Labeler
from pcd_cli.decoding.compile import CompiledSchema
from pcd_cli.decoding.decode import Decoder
from pcd_cli.results import Record
from pcd_cli.errors import InputError, SchemaError
from pcd_cli.decoding.examples import draw_examples, resolve_examples
from pcd_cli.io.readers import InputSpec
from pcd_cli.decoding.oracle import oracle_field
from pcd_cli.decoding.prompt import answer_object, quote_record
from pcd_cli.schema.load import load_schema, parse_schema

from ..helpers import ORACLE_SCHEMA, TEXTS, tiny_backend
from ..oracle_sample import max_oracle_diff

ROOT = Path(__file__).resolve().parents[2]
DEV = ROOT / "sample_data" / "airline_tweets.dev.jsonl"

EXAMPLES = [
    {"text": "I need a call back in the next hour, the card was charged twice; refund it.",
     "labels": {"urgent": True, "deadline": "1_HOUR", "action": "CALL BACK", "tool": "get_time", "refund": "true"}},
    {"text": "What's the weather in Lisbon this week?",
     "labels": {"urgent": False, "deadline": "1_WEEK", "action": "EMAIL", "tool": "get_weather", "refund": "false"}},
]


def _schema_with_examples(examples=EXAMPLES):
    return parse_schema(dict(ORACLE_SCHEMA, examples=examples))


def test_schema_examples_are_parsed_with_label_indices():
    schema = _schema_with_examples()
    assert [e.labels for e in schema.examples] == [(0, 0, 1, 1, 0), (1, 2, 2, 0, 1)]
    assert schema.examples[0].text.startswith("I need a call back")
    assert schema.source_sha256 != parse_schema(ORACLE_SCHEMA).source_sha256


@pytest.mark.parametrize("bad, message", [
    ({"text": "x", "labels": {"urgent": True}}, "examples[0]: field 'deadline' has no value"),
    ({"text": "x", "labels": dict(EXAMPLES[0]["labels"], deadline="2_HOURS")},
     "examples[0]: field 'deadline': '2_HOURS' is not one of its labels"),
    ({"text": "x", "labels": dict(EXAMPLES[0]["labels"], colour="red")}, "examples[0]: field 'colour' is not in the schema"),
    ({"labels": EXAMPLES[0]["labels"]}, "examples[0]: give exactly one of 'text' or 'columns'"),
    ({"text": "x", "labels": dict(EXAMPLES[0]["labels"], urgent="maybe")}, "field 'urgent': 'maybe' is not one of"),
])
def test_a_bad_example_names_the_example_and_field(bad, message):
    with pytest.raises(SchemaError) as info:
        _schema_with_examples([bad])
    assert message in str(info.value)


def test_column_examples_need_the_template():
    schema = parse_schema({"fields": {"spam": {"type": "boolean"}},
                           "examples": [{"columns": {"subject": "Win", "body": "Free prize"}, "labels": {"spam": True}}]})
    assert resolve_examples(schema.examples, "Subject: {subject}\\n\\n{body}") == (("Subject: Win\n\nFree prize", (0,)),)
    with pytest.raises(SchemaError, match="need --template"):
        resolve_examples(schema.examples, None)
    with pytest.raises(SchemaError, match="cannot be filled"):
        resolve_examples(schema.examples, "{title}")


def test_draw_is_balanced_deterministic_and_counts_what_it_skips(tmp_path):
    schema = load_schema(ROOT / "schemas" / "airline_sentiment.yaml")
    spec = InputSpec(id_field="id")
    drawn = draw_examples(DEV, schema, spec, shots=6, seed=3)
    assert drawn == draw_examples(DEV, schema, spec, shots=6, seed=3)
    assert Counter(e.labels[0] for e in drawn) == {0: 2, 1: 2, 2: 2}
    assert drawn != draw_examples(DEV, schema, spec, shots=6, seed=4)
    gold = tmp_path / "gold.jsonl"
    gold.write_text('{"id": 1, "text": "fine", "sentiment": "POSITIVE"}\n{"id": 2, "text": "meh", "sentiment": "MEH"}\n'
                    '{"id": 3, "text": "", "sentiment": "NEGATIVE"}\n')
    with pytest.raises(InputError) as info:
        draw_examples(gold, schema, spec, shots=2)
    assert "1 rows have a text and a label for every field (1 with a field without a valid label, 1 with no text)" \
        in str(info.value)


def test_answer_lines_in_the_head_are_token_identical_to_scored_lines():
    """Each example's answer object, in the probed layout, tokenizes with its token boundaries
    on the line boundaries, in the head exactly as the lines the decoder writes after a record."""
    backend = tiny_backend()
    schema = _schema_with_examples()
    shots = resolve_examples(schema.examples)
    compiled = CompiledSchema(schema, backend.tokenizer, examples=shots)
    layout = compiled.layout
    encode = backend.tokenizer.encode
    head = compiled.prompt.head_text
    tail = compiled.prompt.tail_text
    for text, labels in shots:
        answer = answer_object(schema, layout, labels)
        lines = [compiled.written_line(i, lab) for i, lab in enumerate(labels[:-1])]
        assert answer.startswith(layout.opener + "".join(lines))
        start = head.index(text + tail) + len(text + tail)  # the head holds the record's own tail before the answer
        before = head[:start]
        ids = encode(before)
        for line in lines:
            longer = encode(before + line)
            assert longer[: len(ids)] == ids  # no merge across the seam before the line
            # the same tokens as the line written after a record (the decoder's context)
            after_record = encode("Input:\n" + TEXTS[0] + tail + line)
            assert longer[len(ids):] == after_record[len(after_record) - (len(longer) - len(ids)):]
            before, ids = before + line, longer
        assert head.index(answer) == head.index(text + tail) + len(text + tail) - len(layout.opener)


def _examples_against_oracle(backend, scoring, *, sample):
    schema = _schema_with_examples()
    before = backend.forward_passes
    labeler = Labeler(schema, backend=backend, scoring=scoring, trace=True)
    assert backend.forward_passes - before == 1  # the head, examples included, is prefilled once
    plain_head = len(CompiledSchema(parse_schema(ORACLE_SCHEMA), backend.tokenizer).prompt.head_ids)
    assert len(labeler.compiled.prompt.head_ids) > plain_head + 60
    results = list(labeler.label(TEXTS))
    assert backend.forward_passes - before == 1 + labeler.forward_passes  # every record reuses the head
    for result in results:
        shown = quote_record(EXAMPLES[1]["text"], schema.record_quoting)  # as the prompt renders a record
        assert all("Input:\n" + shown in trace["context"] for trace in result.traces)
    worst, checked = max_oracle_diff(backend, schema, results, scoring, sample=sample)
    assert checked == len(schema.fields) * (1 if sample else len(TEXTS))
    assert worst < 1e-4


@pytest.mark.parametrize("scoring", ["marginal", "exact"])
def test_decoder_with_examples_matches_the_oracle(scoring):
    _examples_against_oracle(tiny_backend(seed=5), scoring, sample=False)


@pytest.mark.full  # make test checks examples against the oracle on tiny models (both scorings, every decision)
@pytest.mark.parametrize("scoring", ["marginal", "exact"])
def test_embedded_decoder_with_examples_matches_the_oracle_on_a_sample(embedded_backend, scoring):
    _examples_against_oracle(embedded_backend, scoring, sample=True)


@pytest.mark.full
@pytest.mark.parametrize("scoring", ["marginal", "exact"])
def test_embedded_decoder_with_examples_matches_the_oracle_everywhere(embedded_backend, scoring):
    _examples_against_oracle(embedded_backend, scoring, sample=False)


def test_examples_change_the_head_hash_and_metadata():
    backend = tiny_backend()
    plain = Labeler(parse_schema(ORACLE_SCHEMA), backend=backend)
    shot = Labeler(_schema_with_examples(), backend=backend)
    assert plain.metadata()["pcd.examples"] == "0" and shot.metadata()["pcd.examples"] == "2"
    assert plain.compiled.prompt.head_sha256 != shot.compiled.prompt.head_sha256
    none = Labeler(_schema_with_examples(), backend=backend, examples=())
    assert none.compiled.prompt.head_sha256 == plain.compiled.prompt.head_sha256


def test_decoder_with_examples_in_a_plain_prompt_matches_the_oracle():
    backend = tiny_backend(chat_template=False, seed=2)
    schema = _schema_with_examples()
    compiled = CompiledSchema(schema, backend.tokenizer, examples=resolve_examples(schema.examples))
    assert "JSON answer:\n" + answer_object(schema, compiled.layout, schema.examples[0].labels) in compiled.prompt.head_text
    decoder = Decoder(backend, compiled, trace=True)
    result = decoder.decode([Record(0, TEXTS[0])])[0]
    trace = result.traces[0]
    field = schema.fields[0]
    probs, _ = oracle_field(backend, trace["context"], field,
                            [(field.labels.index(l["label"]), l["text"]) for l in trace["lines"]], "marginal")
    assert np.abs(np.array(result.fields[0].probs) - probs).max() < 1e-4


def test_inspect_schema_counts_the_examples_in_the_head():
    from pcd_cli.inspect import inspect

    backend = tiny_backend()
    plain = inspect(parse_schema(ORACLE_SCHEMA), tokenizer=backend.tokenizer, config=backend.model.config)
    shot = inspect(_schema_with_examples(), tokenizer=backend.tokenizer, config=backend.model.config)
    labeler = Labeler(_schema_with_examples(), backend=backend)
    assert (plain.head.examples, shot.head.examples) == (0, 2)
    assert shot.head.tokens == len(labeler.compiled.prompt.head_ids) > plain.head.tokens
