"""Per-field reuse with ``isolate_fields`` (issue #43 item 4): when each field is decided alone, an
earlier output of a job that differs in some fields lends the others; a schema that gained a field
costs only the new field's branch on unchanged rows, and the reuse message says so.

A tiny random Llama (exact float32, fast). What is checked: the rows the decoder received and the
fields it decoded for them (spies on ``Labeler.label_batch``/``label_fields``), the copied columns
bit for bit, every column within the packing bound of a fresh run of the new schema.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pcd_cli.api import Labeler
from pcd_cli.engines.local import label_file
from pcd_cli.engines.reuse import REUSED_KEY, columns_of, read_sources
from pcd_cli.io.readers import InputSpec
from pcd_cli.results import Record
from pcd_cli.schema.load import parse_schema

from ..helpers import ORACLE_SCHEMA, airline_texts, tiny_backend, tiny_llama_over, write_jsonl

SPEC = InputSpec(id_field="id")
#: packed vs one-record passes differ by float32 rounding only (the decoder's packing bound)
BOUND = 1e-5
FIELDS = dict(ORACLE_SCHEMA["fields"])
FIELDS["topics"] = {"type": "multi", "description": "What the message is about",
                    "labels": ["billing", "time", "weather"]}
BEFORE = ["urgent", "deadline", "topics"]          # night 1's schema
AFTER = ["urgent", "deadline", "topics", "action"]  # night 2's: one field more


def _schema(names, fields=FIELDS, **extra):
    return parse_schema({"name": "iso", "isolate_fields": True, "fields": {n: fields[n] for n in names}} | extra)


@pytest.fixture(scope="module")
def backend():
    return tiny_backend(chat_template=True, seed=5)


def _run(labeler, src, out, **kw):
    events = []
    stats = label_file(labeler, src, SPEC, output=out, errors_path=out.with_suffix(".errors.jsonl"),
                       on_event=lambda name, fields, *_: events.append((name, fields)), **kw)
    return stats, pq.read_table(out), events


class _Spy:
    """What the labeler decodes: whole rows (``label_batch``) and rows decoded in part, with the
    fields asked (``label_fields``)."""

    def __init__(self, labeler, monkeypatch):
        self.whole: list[str] = []
        self.part: list[tuple[str, tuple[str, ...]]] = []
        batch, fields = labeler.label_batch, labeler.label_fields

        def label_batch(items):
            self.whole += [r.text for r in items if hasattr(r, "text")]
            return batch(items)

        def label_fields(items, names):
            self.part += [(r.text, tuple(names)) for r in items if hasattr(r, "text")]
            return fields(items, names)

        monkeypatch.setattr(labeler, "label_batch", label_batch)
        monkeypatch.setattr(labeler, "label_fields", label_fields)


def test_label_fields_gives_the_fields_label_batch_gives_feeding_only_their_branches(backend):
    labeler = Labeler(_schema(AFTER), backend=backend)
    records = [Record(f"r{i}", t) for i, t in enumerate(airline_texts(6))]
    whole = labeler.label_batch(records)
    fed = labeler.decoder.tokens_fed
    part = labeler.label_fields(records, ["topics", "action"])
    sub = labeler._field_parts[("topics", "action")][1]
    assert 0 < sub.tokens_fed < fed  # two branches' tails and answers, not four
    schema = labeler.schema
    names = [d.name for f, p in schema.declared_parts() if f.name in ("topics", "action") for d in
             (schema.fields[i] for i in p)]
    for w, p in zip(whole, part):
        assert len(p.fields) == len(names)
        got = {n: r for n, r in zip(names, p.fields)}
        want = {schema.fields[i].name: whole_f for i, whole_f in enumerate(w.fields) if schema.fields[i].name in got}
        assert set(got) == set(want) == set(names)
        for n in names:
            assert got[n].value == want[n].value
            assert np.max(np.abs(np.asarray(got[n].probs) - np.asarray(want[n].probs))) <= BOUND
            assert abs(got[n].mass - want[n].mass) <= BOUND
    assert labeler.forward_passes >= labeler.decoder.record_passes + sub.record_passes > labeler.decoder.record_passes
    with pytest.raises(KeyError, match="nope"):
        labeler.label_fields(records, ["nope"])
    shared = Labeler(parse_schema({"name": "s", "fields": {n: FIELDS[n] for n in AFTER}}), backend=backend)
    with pytest.raises(ValueError, match="isolate_fields"):
        shared.label_fields(records, ["action"])


def test_label_fields_truncates_where_the_whole_row_would(tmp_path):
    """The longest branch sizes the cut: a text that fits the fields asked alone but not the whole
    schema is cut as the whole schema cuts it (so the copied fields are known to move: decoded whole)."""
    from transformers import AutoTokenizer

    from pcd_cli.backends.torch_backend import converted_gguf_dir, embedded_gguf_path

    tokenizer = AutoTokenizer.from_pretrained(str(converted_gguf_dir(embedded_gguf_path())))
    short = tiny_llama_over(tokenizer, seed=5, max_positions=8192)
    labeler = Labeler(_schema(AFTER), backend=short)
    long_text = " ".join(airline_texts(40))
    need = labeler.decoder._slot(Record("x", long_text), long_text)[1]
    small = tiny_llama_over(tokenizer, seed=5, max_positions=need - 5)
    cut = Labeler(_schema(AFTER), backend=small)
    whole = cut.label_batch([Record("x", long_text)])[0]
    part = cut.label_fields([Record("x", long_text)], ["urgent"])[0]
    assert whole.truncated and part.truncated
    alone = Labeler(_schema(["urgent"]), backend=small).label_batch([Record("x", long_text)])[0]
    assert not alone.truncated  # the one-field schema alone has room for the whole text: label_fields does not
    assert np.max(np.abs(np.asarray(part.fields[0].probs) - np.asarray(whole.fields[0].probs))) <= BOUND


def _nights(tmp_path: Path):
    texts = airline_texts(16)
    night1 = [{"id": f"t{i}", "text": t} for i, t in enumerate(texts)]
    night2 = [dict(r) for r in night1]
    night2[5]["text"] += " (edited: still waiting)"
    night2 += [{"id": "t16", "text": "New ticket: my bag never arrived"}]
    return write_jsonl(tmp_path / "night1.jsonl", night1), write_jsonl(tmp_path / "night2.jsonl", night2)


def test_a_schema_that_gained_a_field_decodes_only_that_field_on_unchanged_rows(backend, tmp_path, monkeypatch):
    night1, night2 = _nights(tmp_path)
    _, first, _ = _run(Labeler(_schema(BEFORE), backend=backend), night1, tmp_path / "n1.parquet")
    labeler = Labeler(_schema(AFTER), backend=backend)
    _, fresh, _ = _run(labeler, night2, tmp_path / "fresh.parquet")
    passes = labeler.forward_passes
    spy = _Spy(labeler, monkeypatch)
    stats, second, events = _run(labeler, night2, tmp_path / "n2.parquet",
                                 reuse=read_sources([str(tmp_path / "n1.parquet")]))
    texts = {r["id"]: r["text"] for r in map(json.loads, night2.read_text().splitlines())}
    # the edited and the new text are decoded whole; the 15 unchanged ones only for the new field
    assert sorted(spy.whole) == sorted([texts["t5"], texts["t16"]])
    assert sorted(t for t, _ in spy.part) == sorted(texts[f"t{i}"] for i in range(16) if i != 5)
    assert {names for _, names in spy.part} == {("action",)}
    assert (stats.reused, stats.partly_reused, stats.records) == (0, 15, 17)
    assert stats.to_dict()["partly_reused"] == 15
    assert second.schema.metadata[b"pcd.records_partly_reused"] == b"15"
    # the copied columns are night 1's, bit for bit; every column within the bound of a fresh run
    by_id = {r["id"]: r for r in first.to_pylist()}
    copied = columns_of(first.schema, BEFORE)
    for row in second.to_pylist():
        if row["id"] not in ("t5", "t16"):
            assert {c: row[c] for c in copied} == {c: by_id[row["id"]][c] for c in copied}
    assert second.column_names == fresh.column_names
    for name in second.column_names:
        a, b = second.column(name).to_pylist(), fresh.column(name).to_pylist()
        if name.endswith(("__prob", "__mass")):
            assert np.max(np.abs(np.array(a) - np.array(b))) <= BOUND, name
        elif name.endswith("__probs"):
            assert max(abs(x[1] - y[1]) for ra, rb in zip(a, b) for x, y in zip(ra, rb)) <= BOUND, name
        else:
            assert a == b, name
    # fewer forward passes than the fresh run (one branch, not four, on 15 rows)
    assert stats.forward_passes == labeler.forward_passes - passes
    fresh_fed = labeler.decoder.tokens_fed
    assert stats.forward_passes <= _run(labeler, night2, tmp_path / "fresh2.parquet")[0].forward_passes
    assert labeler.decoder.tokens_fed > fresh_fed
    # the message names what is copied and what is decoded; the metadata which fields came from where
    message = next(f["message"] for name, f in events if name == "reuse")
    assert message == (f"--reuse {tmp_path / 'n1.parquet'}: labelled with another schema (sha256 "
                       f"{first.schema.metadata[b'pcd.schema_sha256'].decode()[:8]}... vs "
                       f"{labeler.schema.source_sha256[:8]}...): isolate_fields: 'urgent', 'deadline', 'topics' "
                       "copied per field, only 'action' decoded on the 16 rows of texts it labelled")
    assert json.loads(second.schema.metadata[REUSED_KEY.encode()]) == [
        {"path": str(tmp_path / "n1.parquet"), "rows": 15, "fields": BEFORE}]


def test_a_changed_field_is_decoded_and_an_unchanged_one_copied(backend, tmp_path, monkeypatch):
    night1, night2 = _nights(tmp_path)
    _run(Labeler(_schema(BEFORE), backend=backend), night1, tmp_path / "n1.parquet")
    fields = dict(FIELDS, deadline=dict(FIELDS["deadline"], description="When the customer needs it done by"))
    labeler = Labeler(_schema(BEFORE, fields), backend=backend)
    spy = _Spy(labeler, monkeypatch)
    _run(labeler, night2, tmp_path / "n2.parquet", reuse=read_sources([str(tmp_path / "n1.parquet")]))
    assert {names for _, names in spy.part} == {("deadline",)}


@pytest.mark.parametrize("case", ["not isolated", "rules", "another instruction"])
def test_nothing_is_reused_per_field_where_fields_are_not_decided_alone(backend, tmp_path, monkeypatch, case):
    night1, night2 = _nights(tmp_path)
    if case == "not isolated":
        before = parse_schema({"name": "s", "fields": {n: FIELDS[n] for n in BEFORE}})
        after = parse_schema({"name": "s", "fields": {n: FIELDS[n] for n in AFTER}})
    elif case == "rules":
        rules = {"rules": [{"if": {"urgent": True}, "then": {"deadline": ["1_HOUR", "12_HOURS"]}}]}
        before, after = _schema(BEFORE, **rules), _schema(AFTER, **rules)
    else:
        before, after = _schema(BEFORE), _schema(AFTER, instructions="Label the customer's message.")
    _run(Labeler(before, backend=backend), night1, tmp_path / "n1.parquet")
    labeler = Labeler(after, backend=backend)
    spy = _Spy(labeler, monkeypatch)
    _, _, events = _run(labeler, night2, tmp_path / "n2.parquet", reuse=read_sources([str(tmp_path / "n1.parquet")]))
    assert spy.part == [] and len(spy.whole) == 17
    message = next(f["message"] for name, f in events if name == "reuse")
    assert message.endswith(": nothing reused")
    # the part that rules out reuse per field is named, not "another schema"
    said = {"not isolated": "another schema", "rules": "another schema",
            "another instruction": "another prompt"}[case]
    assert f"labelled with {said} (" in message


def test_a_schema_whose_fields_only_moved_copies_every_row_whole(backend, tmp_path, monkeypatch):
    """Fields listed in another order (and another schema name): every field's own part is the
    same, so every row is copied whole, nothing decoded, counted as reused."""
    night1, night2 = _nights(tmp_path)
    _, first, _ = _run(Labeler(_schema(BEFORE), backend=backend), night1, tmp_path / "n1.parquet")
    moved = parse_schema({"name": "iso2", "isolate_fields": True, "fields": {n: FIELDS[n] for n in reversed(BEFORE)}})
    labeler = Labeler(moved, backend=backend)
    spy = _Spy(labeler, monkeypatch)
    stats, second, events = _run(labeler, night1, tmp_path / "n2.parquet",
                                 reuse=read_sources([str(tmp_path / "n1.parquet")]))
    assert spy.whole == [] and spy.part == [] and stats.forward_passes == 0
    assert (stats.reused, stats.partly_reused, stats.records) == (16, 0, 16)
    by_id = {r["id"]: r for r in first.to_pylist()}
    assert all(row == by_id[row["id"]] for row in second.to_pylist())
    assert second.column_names[1] == "topics"  # the new schema's column order
    assert "every field's own part is unchanged: rows copied whole" in \
        next(f["message"] for name, f in events if name == "reuse")
