"""Nightly exports pay only for what changed (issue #43 items 1-4, 7): ``--reuse`` earlier outputs,
repeated texts decoded once, the counts.

In-process runs use a tiny random Llama (exact float32, fast); the CLI tests use the tiny model
saved as a folder. Each test states what it counts: rows the decoder really received (a spy on
``Labeler.label_batch``), forward passes, and the values cell for cell.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pcd_cli.api import Labeler
from pcd_cli.engines.local import label_file
from pcd_cli.engines.reuse import INPUT_KEY_COLUMN, JOB_PARTS_KEY, REUSED_KEY, input_key, read_sources
from pcd_cli.errors import InputError, Interrupted
from pcd_cli.io.readers import InputSpec
from pcd_cli.schema.load import parse_schema

from ..helpers import ORACLE_SCHEMA, airline_texts, flat, pcd, save_tiny_model, tiny_backend, write_jsonl

SCHEMA = parse_schema(ORACLE_SCHEMA)
SPEC = InputSpec(id_field="id")
#: numeric columns compared against a fresh run (within the packing bound)
NUMBERS = [c for f in SCHEMA.declared for c in (f"{f.name}__prob", f"{f.name}__mass")]


@pytest.fixture(scope="module")
def backend():
    return tiny_backend(chat_template=True, seed=3)


@pytest.fixture(scope="module")
def labeler(backend):
    # the steering check off: its second decodes of texts with the schema's words are passes of
    # their own, and these tests count the passes reuse saves (the check is tested in test_steering)
    return Labeler(SCHEMA, backend=backend, steering_check=False)


def _nights(tmp_path: Path):
    """The issue's example at a tenth of its size: night 1 has 24 tickets; night 2 edits 2, adds
    2 new ones and has 2 more rows repeating those 4 texts under other ids (28 rows)."""
    texts = airline_texts(24)
    night1 = [{"id": f"t{i}", "text": t} for i, t in enumerate(texts)]
    night2 = [dict(r) for r in night1]
    night2[3]["text"] += " (edited: still waiting)"
    night2[17]["text"] = "Different text now: " + night2[17]["text"]
    night2 += [{"id": "t24", "text": "New ticket: my bag never arrived"},
               {"id": "t25", "text": "New ticket: refund me for the cancelled flight"},
               {"id": "t26", "text": night2[3]["text"]},   # the edited text again, another id
               {"id": "t27", "text": "New ticket: my bag never arrived"}]
    return write_jsonl(tmp_path / "night1.jsonl", night1), write_jsonl(tmp_path / "night2.jsonl", night2)


class _Spy:
    """Counts the records the labeler's decoder really receives."""

    def __init__(self, labeler, monkeypatch):
        self.texts: list[str] = []
        inner = labeler.label_batch

        def label_batch(batch):
            self.texts += [r.text for r in batch if hasattr(r, "text")]
            return inner(batch)

        monkeypatch.setattr(labeler, "label_batch", label_batch)


def _run(labeler, src, out, **kw):
    events = []
    stats = label_file(labeler, src, SPEC, output=out, errors_path=out.with_suffix(".errors.jsonl"),
                       on_event=lambda name, fields, *_: events.append((name, fields)), **kw)
    return stats, pq.read_table(out), events


def test_night_two_decodes_only_changed_texts_and_copies_the_rest_bit_for_bit(labeler, tmp_path, monkeypatch):
    night1, night2 = _nights(tmp_path)
    _, first, _ = _run(labeler, night1, tmp_path / "n1.parquet", batch_records=5)
    _, fresh, _ = _run(labeler, night2, tmp_path / "fresh.parquet", dedup_keys=0)
    passes_before = labeler.forward_passes
    spy = _Spy(labeler, monkeypatch)
    stats, second, events = _run(labeler, night2, tmp_path / "n2.parquet", batch_records=5,
                                 reuse=read_sources([str(tmp_path / "n1.parquet")]))
    # only the 2 edited and 2 new texts reach the decoder, each once (2 of them for two rows)
    texts = {r["id"]: r["text"] for r in map(json.loads, night2.read_text().splitlines())}
    assert sorted(spy.texts) == sorted(texts[k] for k in ("t3", "t17", "t24", "t25"))
    assert (stats.reused, stats.deduplicated, stats.records) == (22, 2, 28)
    d = stats.to_dict()
    assert (d["reused"], d["deduplicated"]) == (22, 2)
    assert stats.forward_passes == labeler.forward_passes - passes_before
    fresh_passes = _run(labeler, night2, tmp_path / "fresh2.parquet", dedup_keys=0)[0].forward_passes
    # one pass per wave for the 4 texts, against a fresh run's three chunks (benchmarks/nightly.py: the
    # issue's quarter at its size, where more passes are saved than one group's minimum of one per wave)
    assert (stats.forward_passes, fresh_passes) == (2, 6)
    # the 22 unchanged rows are night 1's values, every column, bit for bit
    by_id = {r["id"]: r for r in first.to_pylist()}
    rows = second.to_pylist()
    unchanged = [r for r in rows if r["id"] not in ("t3", "t17", "t24", "t25", "t26", "t27")]
    assert len(unchanged) == 22 and all(r == by_id[r["id"]] for r in unchanged)
    # a copy is its first copy's values under its own id and place
    pos = {r["id"]: i for i, r in enumerate(rows)}
    assert {k: v for k, v in rows[pos["t26"]].items() if k != "id"} == \
        {k: v for k, v in rows[pos["t3"]].items() if k != "id"}
    assert {k: v for k, v in rows[pos["t27"]].items() if k != "id"} == \
        {k: v for k, v in rows[pos["t24"]].items() if k != "id"}
    assert [r["id"] for r in rows] == [f"t{i}" for i in range(28)]
    # every row equals a fresh run's within the packing bound, labels equal
    assert second.column("id").to_pylist() == fresh.column("id").to_pylist()
    for col in NUMBERS:
        assert np.max(np.abs(np.array(second.column(col)) - np.array(fresh.column(col)))) <= 1e-5, col
    for f in SCHEMA.declared:
        assert second.column(f.name).to_pylist() == fresh.column(f.name).to_pylist()
    # the key column is the SHA-256 of the text the model read; the metadata names the job and the reuse
    assert second.column(INPUT_KEY_COLUMN).to_pylist() == [input_key(texts[f"t{i}"]) for i in range(28)]
    meta = second.schema.metadata
    assert json.loads(meta[JOB_PARTS_KEY.encode()])["model"] == labeler.backend.content_key
    assert json.loads(meta[REUSED_KEY.encode()]) == [{"path": str(tmp_path / "n1.parquet"), "rows": 22}]
    assert (meta[b"pcd.records_reused"], meta[b"pcd.records_deduplicated"]) == (b"22", b"2")
    assert ("reuse", {"message": f"--reuse {tmp_path / 'n1.parquet'}: 24 rows of the same job to copy from",
                      "path": str(tmp_path / "n1.parquet"), "rows": 24}) in events


def test_a_differing_job_reuses_nothing_and_names_the_first_part_that_differs(labeler, backend, tmp_path):
    night1, night2 = _nights(tmp_path)
    _run(labeler, night1, tmp_path / "n1.parquet")
    other = Labeler(SCHEMA, backend=tiny_backend(chat_template=True, seed=4), steering_check=False)  # other weights, same name
    stats, _, events = _run(other, night2, tmp_path / "n2.parquet", reuse=read_sources([str(tmp_path / "n1.parquet")]))
    assert stats.reused == 0 and stats.decoded == 28
    said = [f["message"] for name, f in events if name == "reuse"]
    a, b = backend.content_key, other.backend.content_key
    assert said == [f"--reuse {tmp_path / 'n1.parquet'}: labelled with another model (weights) "
                    f"(sha256 {a[:8]}... vs {b[:8]}...): nothing reused"]
    abstaining = Labeler(SCHEMA, backend=backend, abstain_below=0.3, steering_check=False)  # same weights, another abstention
    _, _, events = _run(abstaining, night2, tmp_path / "n3.parquet", reuse=read_sources([str(tmp_path / "n1.parquet")]))
    assert [f["reason"] for name, f in events if name == "reuse"][0].startswith("labelled with another abstention")


def test_repeated_texts_are_decoded_once_across_checkpoint_batches_within_the_cache_bound(labeler, tmp_path,
                                                                                        monkeypatch):
    texts = airline_texts(6)
    order = [0, 1, 2, 0, 3, 1, 4, 0, 5, 2, 2]  # repeats far apart, across chunks (4) and batches (3)
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": f"r{i}", "text": texts[k]} for i, k in enumerate(order)])
    spy = _Spy(labeler, monkeypatch)
    stats, table, _ = _run(labeler, src, tmp_path / "out.parquet", batch_records=3, chunk_records=4)
    assert sorted(spy.texts) == sorted(texts) and stats.deduplicated == 5 and stats.decoded == 11
    rows = table.to_pylist()
    for i, k in enumerate(order):  # each copy: the first copy's values, its own id
        first = rows[order.index(k)]
        assert rows[i]["id"] == f"r{i}" and {c: v for c, v in rows[i].items() if c != "id"} == \
            {c: v for c, v in first.items() if c != "id"}
    spy.texts.clear()  # a cache of 1 distinct text: repeats within a group of 4 texts to decode, and of the
    stats, _, _ = _run(labeler, src, tmp_path / "one.parquet", batch_records=3, chunk_records=4, dedup_keys=1)
    # last text decoded, are shared: groups {0 1 2 (0) 3}, {1 4 0 5}, {2 (2)}
    assert stats.deduplicated == 2 and len(spy.texts) == 9
    spy.texts.clear()  # --dedup-keys 0 is off: no copy shared, not even within one group (was 5 of 11 shared)
    stats, off, _ = _run(labeler, src, tmp_path / "off.parquet", batch_records=3, chunk_records=4, dedup_keys=0)
    assert stats.deduplicated == 0 and stats.decoded == 11
    assert spy.texts == [texts[k] for k in order]  # every row reached the decoder, in input order
    assert off.column("id").to_pylist() == [f"r{i}" for i in range(11)]


def test_a_resumed_run_with_dedup_writes_what_an_uninterrupted_one_does(labeler, tmp_path):
    texts = airline_texts(8)
    order = [0, 1, 2, 3, 0, 4, 1, 5, 6, 2, 7, 3, 0, 1]
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": f"r{i}", "text": texts[k]} for i, k in enumerate(order)])
    _, whole, _ = _run(labeler, src, tmp_path / "whole.parquet", batch_records=3, chunk_records=4)
    calls = iter(range(100))
    with pytest.raises(Interrupted):
        _run(labeler, src, tmp_path / "cut.parquet", batch_records=3, chunk_records=4,
             should_stop=lambda: next(calls) >= 2)
    stats, resumed, _ = _run(labeler, src, tmp_path / "cut.parquet", batch_records=3, chunk_records=4, resume=True)
    assert resumed.to_pylist() == whole.to_pylist()  # bit-identical, the dedup cache rebuilt from the parts
    assert stats.deduplicated == 6 and stats.records == 14


def test_cli_reuse_counts_in_the_done_event_and_refuses_what_is_not_a_pcd_output(tmp_path):
    model = tmp_path / "tiny"
    save_tiny_model(model, seed=3)
    night1, night2 = _nights(tmp_path)
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(ORACLE_SCHEMA))
    base = ["label", "-s", schema, "--model", model, "--log-format", "json"]
    pcd(*base, night1, "-o", tmp_path / "n1.parquet")
    result = pcd(*base, night2, "-o", tmp_path / "n2.parquet", "--reuse", tmp_path / "n1.parquet")
    done = [json.loads(line) for line in result.stderr.splitlines() if '"done"' in line][0]
    assert (done["reused"], done["deduplicated"], done["labelled"]) == (22, 2, 28)
    # a Parquet file that is not a pcd output: exit 2, before any model loads (no such model either)
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"id": ["a"], "text": ["x"]}), plain)
    result = pcd("label", night2, "-s", schema, "--model", tmp_path / "no-such-model", "-o", tmp_path / "x.parquet",
                 "--reuse", plain, code=2)
    assert f"--reuse {str(plain)!r}: not a pcd output" in flat(result.stderr)
    # an output written before this change (no key column, no fingerprint): refused the same way
    old = tmp_path / "old.parquet"
    table = pq.read_table(tmp_path / "n1.parquet")
    meta = {k: v for k, v in table.schema.metadata.items() if k != JOB_PARTS_KEY.encode()}
    pq.write_table(table.drop_columns([INPUT_KEY_COLUMN]).replace_schema_metadata(meta), old)
    result = pcd("label", night2, "-s", schema, "--model", tmp_path / "no-such-model", "-o", tmp_path / "x.parquet",
                 "--reuse", old, code=2)
    assert "before outputs recorded what --reuse needs" in flat(result.stderr)
    result = pcd("label", night2, "-s", schema, "--model", model, "-o", tmp_path / "x.parquet",
                 "--reuse", tmp_path / "missing.parquet", code=2)
    assert f"--reuse {str(tmp_path / 'missing.parquet')!r}: no such file, folder or glob" in flat(result.stderr)


def test_a_night_whose_few_changes_lie_far_apart_commits_every_batch(labeler, tmp_path):
    """A group of rows to decode stays open across the copied rows between its changed rows, so
    the output lags the reader by the group's whole span: each checkpoint still names the input's
    digest where it ends (benchmarks/nightly.py at 5,000 records failed with 'no digest kept after
    row 5376'), and a group closes once it spans ``max_span`` input rows."""
    from pcd_cli.engines.reuse import ReuseIndex, ReusingLabeler, keyed_schema
    from pcd_cli.results import Record

    texts = airline_texts(90)
    night1 = [{"id": f"t{i}", "text": t} for i, t in enumerate(texts)]
    night2 = [dict(r) for r in night1]
    for i in (2, 45, 88):
        night2[i]["text"] += " (edited)"
    src1, src2 = write_jsonl(tmp_path / "night1.jsonl", night1), write_jsonl(tmp_path / "night2.jsonl", night2)
    _, first, _ = _run(labeler, src1, tmp_path / "n1.parquet", batch_records=5)
    stats, second, events = _run(labeler, src2, tmp_path / "n2.parquet", batch_records=5,
                                 reuse=read_sources([str(tmp_path / "n1.parquet")]))
    assert (stats.reused, stats.records) == (87, 90)
    assert sum(1 for name, _ in events if name == "checkpoint") >= 90 // 5
    _, fresh, _ = _run(labeler, src2, tmp_path / "fresh.parquet")
    for col in NUMBERS:
        assert np.max(np.abs(np.array(second.column(col)) - np.array(fresh.column(col)))) <= 1e-5, col
    by_id = {r["id"]: r for r in first.to_pylist()}
    assert all(r == by_id[r["id"]] for r in second.to_pylist() if r["id"] not in ("t2", "t45", "t88"))

    # max_span: the group opened by row 2 is decoded once it spans 10 rows, not at the next change
    arrow_schema = keyed_schema(labeler.output_schema("id", pa.string(), all_probs=False))
    index = ReuseIndex(read_sources([str(tmp_path / "n1.parquet")]), labeler.job_parts(), arrow_schema,
                       schema=labeler.schema)
    pipe = ReusingLabeler(labeler, arrow_schema, index, dedup_keys=0, max_span=10)
    released = [len(pipe.feed([Record(r["id"], r["text"])])) for r in night2[:20]]
    assert released[:2] == [1, 1] and released[2:11] == [0] * 9 and released[11] == 10


def test_a_night_whose_texts_all_differ_says_why_nothing_was_reused(labeler, tmp_path):
    """The same job, but every text differs from the earlier run's (a --template with a value that
    changes every night, such as a {date} partition): a warning says so rather than a silent 0."""
    texts = airline_texts(6)
    night1 = write_jsonl(tmp_path / "n1.jsonl", [{"id": f"t{i}", "text": f"2026-12-04: {t}"} for i, t in enumerate(texts)])
    night2 = write_jsonl(tmp_path / "n2.jsonl", [{"id": f"t{i}", "text": f"2026-12-05: {t}"} for i, t in enumerate(texts)])
    _run(labeler, night1, tmp_path / "n1.parquet")
    stats, _, events = _run(labeler, night2, tmp_path / "n2.parquet", reuse=read_sources([str(tmp_path / "n1.parquet")]))
    assert stats.reused == 0
    warned = [f["message"] for name, f in events if name == "reuse" and f.get("reason") == "no text matched"]
    assert warned == ["--reuse: 6 earlier rows of the same job, but no text of this input is one of theirs: nothing "
                      "reused. The text the model reads differs from the earlier run's (another --template or "
                      "--text-field, or a value in it that changes every night, such as a {date} partition column): "
                      "keep such values out of the text to reuse rows (docs/labelling.md, Nightly runs)"]
    # one text the same: no such warning
    write_jsonl(night2, [{"id": "t0", "text": f"2026-12-04: {texts[0]}"}])
    _, _, events = _run(labeler, night2, tmp_path / "n3.parquet", reuse=read_sources([str(tmp_path / "n1.parquet")]))
    assert not [f for name, f in events if name == "reuse" and f.get("reason") == "no text matched"]
