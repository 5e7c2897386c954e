"""Input reading and output sinks (no model needed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pcd_cli.io.readers as pio
from pcd_cli.results import FieldResult, Record, RecordFailure, RecordResult
from pcd_cli.errors import InputError
from pcd_cli.io.readers import InputSpec, detect_format, read_records
from pcd_cli.io.output import ParquetSink, output_schema, results_table
from pcd_cli.engines.local import default_errors, default_output
from pcd_cli.schema.load import parse_schema

SAMPLES = Path(__file__).resolve().parents[2] / "sample_data"


def flat(path, spec=InputSpec(), **kw):
    return [item for batch in read_records(path, spec, **kw) for item in batch]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


# -- CSV --------------------------------------------------------------------------------

TRICKY = [
    'Hello, world',
    'She said "no", then "yes"',
    'line one\nline two, with a comma\n"quoted" third line',
    '1.50',  # a number-looking text stays as written
    'true',
    'ünïcödé — ok',
]


def test_csv_quoted_fields_round_trip_exactly(tmp_path):
    path = tmp_path / "t.csv"
    with path.open("w", encoding="utf-8", newline="") as fh:
        fh.write("id,text\n")
        for i, text in enumerate(TRICKY):
            fh.write(f'{i},"' + text.replace('"', '""') + '"\n')
    got = flat(path, InputSpec(id_field="id"))
    assert [r.text for r in got] == TRICKY
    assert [r.id for r in got] == [str(i) for i in range(len(TRICKY))]
    assert all(isinstance(r, Record) for r in got)


def test_csv_ids_and_texts_are_read_as_strings(tmp_path):
    path = tmp_path / "ids.csv"
    path.write_text("id,text\n007,2.50\n010,3\n", encoding="utf-8")
    got = flat(path, InputSpec(id_field="id"))
    assert got == [Record("007", "2.50"), Record("010", "3")]


def test_csv_big_file_streams_with_line_numbers(tmp_path):
    # cells are read as written (no type inference that a later row could contradict)
    lines = ["id,text,extra"] + [f"{i},t{i},{i}" for i in range(90_000)] + ["late-id,late text,not a number"]
    path = tmp_path / "big.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert path.stat().st_size > 1 << 20
    got = flat(path, InputSpec(id_field="id"), batch_size=10_000)
    assert len(got) == 90_001
    assert got[-1] == Record("late-id", "late text")
    assert got[5] == Record("5", "t5")
    assert (got[5].row, got[5].line, got[-1].row, got[-1].line) == (5, 7, 90_000, 90_002)


def test_csv_missing_column_names_it(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("id,body\n1,hello\n", encoding="utf-8")
    with pytest.raises(InputError, match="no column 'text'"):
        flat(path)
    with pytest.raises(InputError, match="no column 'ident'"):
        flat(path, InputSpec(text_field="body", id_field="ident"))


def test_csv_bad_rows_fail_alone_with_their_line_numbers(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b'id,text\n1,a\n2,b,c\n3,"two\nlines"\n\n4\n5,caf\xe9\n6,ok\n')
    got = flat(path, InputSpec(id_field="id"))
    assert [(type(r).__name__, r.id, r.row, r.line) for r in got] == [
        ("Record", "1", 0, 2), ("RecordFailure", None, 1, 3), ("Record", "3", 2, 4),
        ("RecordFailure", None, 3, 7), ("RecordFailure", "5", 4, 8), ("Record", "6", 5, 9)]
    assert got[1].error == "line 3: the CSV row has 3 fields; the header has 2"
    assert got[3].error == "line 7: the CSV row has 1 field; the header has 2"
    assert got[4].error == "line 8: the text has bytes that are not valid UTF-8"
    assert got[2].text == "two\nlines"


def test_empty_csv_has_no_rows(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"")
    assert flat(path) == []
    path.write_bytes(b"id,text\n")
    assert flat(path, InputSpec(id_field="id")) == []


def test_csv_empty_cells(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text('id,text\n,has no id\nb,""\nc,ok\n', encoding="utf-8")
    got = flat(path, InputSpec(id_field="id"))
    assert isinstance(got[0], RecordFailure) and got[0].id is None and got[0].row == 0
    assert "line 2" in got[0].error and "'id'" in got[0].error
    assert isinstance(got[1], RecordFailure) and got[1].id == "b" and "empty" in got[1].error
    assert got[2] == Record("c", "ok")


# -- limit and batches -----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["airline_tweets.jsonl", "airline_tweets.csv", "airline_tweets.parquet"])
def test_limit_is_honoured_and_formats_agree(name):
    got = flat(SAMPLES / name, InputSpec(id_field="id", limit=7))
    assert [r.id for r in got] == [f"air-{i}" for i in range(7)]
    reference = [json.loads(line) for line in (SAMPLES / "airline_tweets.jsonl").read_text().splitlines()[:7]]
    assert [r.text for r in got] == [row["text"].strip() for row in reference]


@pytest.mark.parametrize("name", ["airline_tweets.jsonl", "airline_tweets.csv", "airline_tweets.parquet"])
def test_batches_respect_batch_size(name):
    sizes = [len(b) for b in read_records(SAMPLES / name, InputSpec(limit=23), batch_size=5)]
    assert sizes == [5, 5, 5, 5, 3]
    sizes = [len(b) for b in read_records(SAMPLES / name, InputSpec(), batch_size=50)]
    assert sizes == [50, 50, 20]


def test_limit_counts_failed_rows_too(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", ["{bad", {"text": "a"}, {"text": "b"}, {"text": "c"}])
    got = flat(path, InputSpec(limit=2))
    assert len(got) == 2
    assert isinstance(got[0], RecordFailure) and got[1] == Record(1, "a")


def test_default_ids_are_row_numbers(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": "a"}, {"text": "b"}, {"text": "c"}])
    assert flat(path) == [Record(0, "a"), Record(1, "b"), Record(2, "c")]


# -- JSONL rows ---------------------------------------------------------------------------------

def test_jsonl_bad_rows_become_failures_naming_the_row(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [
        {"id": "a", "text": "good"},
        {"id": "b"},
        {"id": "c", "text": "   "},
        "{not json",
        "[1, 2]",
        {"id": 7, "text": "  padded  "},
        {"text": "no id here"},
    ])
    got = flat(path, InputSpec(id_field="id"))
    assert got[0] == Record("a", "good")
    assert isinstance(got[1], RecordFailure) and got[1].id == "b" and "'text'" in got[1].error
    assert isinstance(got[2], RecordFailure) and got[2].id == "c" and "empty" in got[2].error
    assert isinstance(got[3], RecordFailure) and got[3].id is None and "not valid JSON" in got[3].error
    assert isinstance(got[4], RecordFailure) and got[4].id is None and "expected a JSON object" in got[4].error
    assert got[5] == Record("7", "padded")  # ids become strings; texts are stripped
    assert isinstance(got[6], RecordFailure) and got[6].id is None
    assert "line 7" in got[6].error and "'id'" in got[6].error
    assert [(r.row, r.line) for r in got] == [(i, i + 1) for i in range(7)]


def test_jsonl_line_numbers_count_blank_lines_rows_do_not(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'\n{"text": "a"}\n   \n{"text": "b\xff"}\n{"text": "c"}')  # no final newline
    got = flat(path)
    assert [(r.row, r.line) for r in got] == [(0, 2), (1, 4), (2, 5)]
    assert got[0] == Record(0, "a") and got[2] == Record(2, "c")
    assert isinstance(got[1], RecordFailure) and got[1].error.startswith("line 4: bytes that are not valid UTF-8")


def test_skip_resumes_at_a_row(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", ["{bad"] + [{"text": f"t{i}"} for i in range(9)])
    got = flat(path, InputSpec(limit=8), skip=3, batch_size=2)
    assert [r.row for r in got] == [3, 4, 5, 6, 7] and got[0] == Record(3, "t2")


# -- templates ------------------------------------------------------------------------------------

def test_template_composes_columns_and_unescapes(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [
        {"id": "T1", "subject": "Outage", "body": "API down\nsince 9:00", "n": 3},
        {"id": "T2", "subject": "Hi"},
    ])
    spec = InputSpec(template=r"Subject: {subject}\n\n{body}\t#{n}", id_field="id")
    assert spec.columns_needed() == ["subject", "body", "n", "id"]
    got = flat(path, spec)
    assert got[0] == Record("T1", "Subject: Outage\n\nAPI down\nsince 9:00\t#3")
    assert isinstance(got[1], RecordFailure) and got[1].id == "T2"
    assert "'body'" in got[1].error


def test_template_on_support_tickets():
    spec = InputSpec(template=r"Subject: {subject}\n\n{body}", id_field="id", limit=2)
    got = flat(SAMPLES / "support_tickets.jsonl", spec)
    rows = [json.loads(line) for line in (SAMPLES / "support_tickets.jsonl").read_text().splitlines()[:2]]
    assert [r.id for r in got] == [row["id"] for row in rows]
    assert [r.text for r in got] == [f"Subject: {row['subject']}\n\n{row['body']}".strip() for row in rows]


def test_template_columns_checked_for_csv(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("subject,body\na,b\n", encoding="utf-8")
    assert flat(path, InputSpec(template="{subject}: {body}")) == [Record(0, "a: b")]
    with pytest.raises(InputError, match="no column 'title'"):
        flat(path, InputSpec(template="{title}: {body}"))


# -- Parquet --------------------------------------------------------------------------------------

def test_parquet_reads_only_needed_columns(tmp_path, monkeypatch):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": [10, 11, 12], "text": ["a", "b", "c"], "blob": [b"x" * 100] * 3,
                             "other": [1.0, 2.0, 3.0]}), path)
    asked = []
    real = pq.ParquetFile.iter_batches

    def spy(self, *args, **kwargs):
        asked.append(kwargs.get("columns"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pio.pq.ParquetFile, "iter_batches", spy)
    got = flat(path, InputSpec(id_field="id"))
    assert got == [Record("10", "a"), Record("11", "b"), Record("12", "c")]
    assert asked == [["text", "id"]]
    with pytest.raises(InputError, match="no column 'body'"):
        flat(path, InputSpec(text_field="body"))


def test_parquet_null_text_is_a_failure(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": ["a", None]}), path)
    got = flat(path)
    assert got[0] == Record(0, "a")
    assert isinstance(got[1], RecordFailure) and got[1].id == 1 and "'text'" in got[1].error
    assert got[1].error.startswith("row 1:") and got[1].line is None


# -- formats and paths ----------------------------------------------------------------------------

@pytest.mark.parametrize("name,fmt", [("a.jsonl", "jsonl"), ("a.ndjson", "jsonl"), ("a.json", "jsonl"),
                                      ("a.csv", "csv"), ("A.CSV", "csv"), ("a.parquet", "parquet"),
                                      ("a.pq", "parquet")])
def test_detect_format_by_extension(name, fmt):
    assert detect_format(Path(name), None) == fmt


def test_detect_format_override_and_errors(tmp_path):
    assert detect_format(Path("a.txt"), "csv") == "csv"
    assert detect_format(Path("a.jsonl"), "parquet") == "parquet"
    with pytest.raises(InputError, match="--format"):
        detect_format(Path("a.txt"), None)
    with pytest.raises(InputError, match="expected one of"):
        detect_format(Path("a.jsonl"), "xml")
    path = tmp_path / "rows.txt"
    path.write_text("text\nhello\n", encoding="utf-8")
    assert flat(path, fmt="csv") == [Record(0, "hello")]
    with pytest.raises(InputError, match="cannot tell the format"):
        flat(path)


def test_missing_input_file(tmp_path):
    with pytest.raises(InputError, match="no such input file"):
        flat(tmp_path / "nope.jsonl")


def test_default_paths(tmp_path):
    assert default_output(tmp_path / "in" / "tweets.csv") == tmp_path / "in" / "tweets.labels.parquet"
    assert default_errors(tmp_path / "x.labels.parquet") == tmp_path / "x.errors.jsonl"
    assert default_errors(tmp_path / "out.parquet") == tmp_path / "out.errors.jsonl"


# -- output ----------------------------------------------------------------------------------------

SCHEMA = parse_schema({"name": "s", "fields": {
    "spam": {"type": "boolean"},
    "mood": {"type": "enum", "labels": ["BAD", "OK", "GOOD"]},
}})


def _result(rid, spam: bool, mood: int, truncated: bool = False) -> RecordResult:
    mood_probs = [0.1, 0.1, 0.1]
    mood_probs[mood] = 0.8
    return RecordResult(rid, (
        FieldResult(0 if spam else 1, spam, 0.9, 0.95, (0.9, 0.1) if spam else (0.1, 0.9)),
        FieldResult(mood, SCHEMA.fields[1].labels[mood], 0.8, 0.5, tuple(mood_probs)),
    ), truncated=truncated)


def test_parquet_sink_writes_typed_columns_and_metadata(tmp_path):
    schema = output_schema(SCHEMA, "row", pa.int64(), all_probs=True).with_metadata({"pcd.version": "x"})
    old = os.umask(0o022)
    try:
        out = tmp_path / "sub" / "o.parquet"
        sink = ParquetSink(out, schema)
        assert not out.exists()  # nothing at the target until close()
        sink.write_table(results_table([_result(0, True, 2), _result(1, False, 0)], SCHEMA, schema))
        sink.write_table(results_table([], SCHEMA, schema))
        sink.write_table(results_table([_result(2, False, 1, truncated=True)], SCHEMA, schema))
        sink.close()
    finally:
        os.umask(old)
    table = pq.read_table(out)
    assert table.schema.names == ["row", "spam", "spam__prob", "spam__mass", "spam__probs",
                                  "mood", "mood__prob", "mood__mass", "mood__probs", "__truncated"]
    assert table.schema.field("row").type == pa.int64()
    assert table.schema.field("spam").type == pa.bool_()
    assert table.schema.field("mood").type == pa.string()
    assert table.schema.field("mood__prob").type == pa.float32()
    assert table.schema.metadata[b"pcd.version"] == b"x"
    assert table.column("row").to_pylist() == [0, 1, 2]
    assert table.column("spam").to_pylist() == [True, False, False]
    assert table.column("mood").to_pylist() == ["GOOD", "BAD", "OK"]
    assert table.column("__truncated").to_pylist() == [False, False, True]
    assert dict(table.column("mood__probs").to_pylist()[0]) == pytest.approx({"BAD": 0.1, "OK": 0.1, "GOOD": 0.8})
    assert sorted(p.name for p in out.parent.iterdir()) == ["o.parquet"]
    assert out.stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600


def test_parquet_sink_abort_keeps_an_earlier_output(tmp_path):
    out = tmp_path / "o.parquet"
    out.write_bytes(b"earlier run")
    schema = output_schema(SCHEMA, "id", pa.string(), all_probs=False)
    sink = ParquetSink(out, schema)
    sink.write_table(results_table([_result("a", True, 0)], SCHEMA, schema))
    assert any(p.suffix == ".tmp" for p in tmp_path.iterdir())
    sink.abort()
    assert [p.name for p in tmp_path.iterdir()] == ["o.parquet"]
    assert out.read_bytes() == b"earlier run"


def test_csv_unclosed_quote_fails_its_row_and_the_rest_is_read(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b'id,text\r\nj,ok\r\nk,"unclosed quote here\r\nl,next row\r\nm,"and ""this"""\r\nn,b"c\r\n')
    got = flat(path, InputSpec(id_field="id"))
    assert [(type(r).__name__, r.id, r.row, r.line) for r in got] == [
        ("Record", "j", 0, 2), ("RecordFailure", None, 1, 3), ("Record", "l", 2, 4), ("Record", "m", 3, 5),
        ("Record", "n", 4, 6)]
    assert got[1].error.startswith("line 3: not a valid CSV row")
    assert got[3].text == 'and "this"' and got[4].text == 'b"c'
    path.write_bytes(b'id,text\nj,ok\nk,"unclosed\nl,next\n')
    got = flat(path, InputSpec(id_field="id"))
    assert [(r.id, r.line) for r in got] == [("j", 2), (None, 3), ("l", 4)]
    assert got[1].error == "line 3: a quoted field is never closed"
    path.write_bytes(b'id,text\na,"x"y\nb,ok\n')  # text after a closing quote
    got = flat(path, InputSpec(id_field="id"))
    assert isinstance(got[0], RecordFailure) and got[0].error.startswith("line 2: not a valid CSV row")
    assert got[1] == Record("b", "ok") and got[1].line == 3


def test_empty_quoted_cell_is_an_empty_text_not_a_blank_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text('text\n""\n\nhello\n', encoding="utf-8")
    got = flat(path)
    assert isinstance(got[0], RecordFailure) and got[0].error == "line 2: the text is empty"
    assert got[1] == Record(1, "hello") and got[1].line == 4


def test_template_over_empty_columns_is_an_empty_text(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"subject": "", "body": " "}, {"subject": "Hi", "body": ""}])
    got = flat(path, InputSpec(template=r"Subject: {subject}\n\n{body}"))
    assert isinstance(got[0], RecordFailure) and got[0].error == "line 1: the template's columns are all empty"
    assert got[1] == Record(1, "Subject: Hi")


def test_utf16_jsonl_lines_fail_with_a_hint(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes('{"text": "a"}\n{"text": "b"}\n'.encode("utf-16"))
    got = flat(path)
    assert got and all(isinstance(r, RecordFailure) and "UTF-16 text? pcd reads UTF-8" in r.error for r in got)
