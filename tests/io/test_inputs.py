"""Inputs as users bring them (issue #12: non-string values, ids, stdin and compressed input,
CSV delimiters, resume integrity, the model cache key, JSON usage errors, Pydantic schemas)
and the smaller items of issue #13 (fsync, exit 4, the context estimate, the fingerprint).

Readers are tested without a model; jobs on a tiny random Llama; the CLI through the runner.
"""

from __future__ import annotations

import enum
import gzip
import hashlib
import io
import json
import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import List, Literal

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from pydantic import BaseModel, Field

import pcd_cli.io.readers as pio
from pcd_cli.api import Labeler, RepeatedIdWarning, _as_record
from pcd_cli.engines.checkpoint import work_dir_for
from pcd_cli.results import Record, RecordFailure
from pcd_cli.errors import InputError, Interrupted, MissingExtra, SchemaError
from pcd_cli.io.readers import InputSpec, RecordReader, read_records
from pcd_cli.engines.local import job_fingerprint, label_file
from pcd_cli.schema.load import load_schema, parse_schema
from pcd_cli.schema.load import schema_from_model
from pcd_cli.io.values import CellError, RepeatedIds, cell_text

from ..helpers import ORACLE_SCHEMA, copy_case, jsonl_rows, pcd, tiny_backend, trace_contexts

SCHEMA = parse_schema(ORACLE_SCHEMA)
SAMPLES = Path(__file__).resolve().parents[2] / "sample_data"


def flat(path, spec=InputSpec(), **kw):
    return [item for batch in read_records(path, spec, **kw) for item in batch]


def _lines(*rows) -> bytes:
    return b"".join((r if isinstance(r, bytes) else orjson.dumps(r)) + b"\n" for r in rows)


@pytest.fixture(scope="module")
def backend():
    return tiny_backend(chat_template=True, seed=5)


# -- 3. values that are not strings; ids ----------------------------------------------------------

@pytest.mark.parametrize("value,text", [(True, "true"), (False, "false"), (7, "7"), (7.5, "7.5"), (7.0, "7.0"),
                                        (1e20, "1e+20"), (-0.25, "-0.25"), ("x y", "x y"), (b"caf\xc3\xa9", "café")])
def test_scalars_read_in_their_json_spelling(value, text):
    assert cell_text(value, "text field 'text'") == text


@pytest.mark.parametrize("value,message", [
    (["a"], "text field 'text' is a list, not a string"), ({"a": 1}, "text field 'text' is an object, not a string"),
    (float("nan"), "text field 'text' is NaN (a NaN or Infinity literal, or an empty numeric cell), not a value "
                     "pcd can read as text; write a string or null"),
    (b"\xff", "text field 'text' has bytes that are not valid UTF-8")])
def test_lists_objects_and_non_finite_numbers_are_refused(value, message):
    with pytest.raises(CellError) as info:
        cell_text(value, "text field 'text'")
    assert str(info.value) == message


def test_jsonl_values_and_ids_by_one_rule(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(_lines({"id": 7, "text": True}, {"id": 7.0, "text": 7.5}, {"id": "7", "text": "seven"},
                            {"id": True, "text": 12}, {"id": [1], "text": "x"}, {"id": {"a": 1}, "text": "x"},
                            {"id": "t", "tags": ["a", "b"], "text": "x"}, {"id": 8, "text": None},
                            b'{"id": 7.00, "text": "again"}'))
    got = flat(path, InputSpec(id_field="id"))
    assert [(type(r).__name__, r.id) for r in got] == [
        ("Record", "7"), ("Record", "7.0"), ("Record", "7"), ("Record", "true"), ("RecordFailure", None),
        ("RecordFailure", None), ("Record", "t"), ("RecordFailure", "8"), ("Record", "7.0")]
    assert [r.text for r in got if isinstance(r, Record)] == ["true", "7.5", "seven", "12", "x", "again"]
    assert got[4].error == "line 5: id column 'id' is a list, not a string"
    assert got[5].error == "line 6: id column 'id' is an object, not a string"
    templated = flat(path, InputSpec(id_field="id", template="{text} / {tags}"))
    assert templated[6].error == "line 7: template column 'tags' is a list, not a string"
    assert templated[0].error == "line 1: template column 'tags' is missing or null"


def test_parquet_typed_columns_follow_the_same_rule(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": pa.array([1, 2, 3], pa.int64()), "fid": pa.array([1.0, 2.5, 3.0]),
                             "text": pa.array([True, False, None]), "tags": pa.array([["a"], ["b"], []])}), path)
    got = flat(path, InputSpec(id_field="id"))
    assert [(r.id, getattr(r, "text", None)) for r in got] == [("1", "true"), ("2", "false"), ("3", None)]
    assert got[2].error == "row 2: text field 'text' is missing or null"
    assert [r.id for r in flat(path, InputSpec(id_field="fid", text_field="id"))] == ["1.0", "2.5", "3.0"]
    listed = flat(path, InputSpec(text_field="tags"))
    assert listed[0].error == "row 0: text field 'tags' is a list, not a string"


def test_api_items_follow_the_readers_rule(tmp_path):
    rows = [{"id": 7, "text": True}, {"id": 7.0, "text": ["a"]}, {"text": 4.5}, {"id": None, "text": "x"},
            {"id": "b", "text": {"k": 1}}, 12, True, ["x"], "  ", {"id": "c", "text": "fine"}]
    got = [_as_record(i, row) for i, row in enumerate(rows)]
    assert [(type(r).__name__, r.id) for r in got] == [
        ("Record", "7"), ("RecordFailure", "7.0"), ("Record", 2), ("RecordFailure", None), ("RecordFailure", "b"),
        ("Record", 5), ("Record", 6), ("RecordFailure", 7), ("RecordFailure", 8), ("Record", "c")]
    assert [r.text for r in got if isinstance(r, Record)] == ["true", "4.5", "12", "true", "fine"]
    assert got[1].error == "row 1: text field 'text' is a list, not a string"
    assert got[3].error == "row 3: id column 'id' is missing or empty"
    assert got[4].error == "row 4: text field 'text' is an object, not a string"
    assert got[7].error == "row 7: text field 'text' is a list, not a string"
    path = tmp_path / "same.jsonl"
    path.write_bytes(_lines(*[r for r in rows if isinstance(r, dict) and "id" in r]))
    from_file = flat(path, InputSpec(id_field="id"))
    from_api = [r for r, row in zip(got, rows) if isinstance(row, dict) and "id" in row]
    assert [(type(a).__name__, a.id, getattr(a, "text", None)) for a in from_file] == \
        [(type(b).__name__, b.id, getattr(b, "text", None)) for b in from_api]
    assert [a.error.split(": ", 1)[1] for a in from_file if isinstance(a, RecordFailure)] == \
        [b.error.split(": ", 1)[1] for b in from_api if isinstance(b, RecordFailure)]


def test_repeated_ids_counter():
    seen = RepeatedIds(keep=2)
    for rid in ["a", "b", "a", None, "c", "a", "b", None, "d", "c"]:
        seen.add(rid)
    assert (seen.count, seen.examples) == (4, ["a", "b"])
    assert seen.message() == ("4 rows repeat an id seen earlier ('a', 'b', ...); each is a row of its own, never "
                              "merged; pcd eval, calibrate and review match them by order, the n-th repeat of an id "
                              "as 'ID (repeat n)'")


def test_repeated_ids_are_counted_never_merged_and_survive_resume(backend, tmp_path):
    src = tmp_path / "in.jsonl"
    ids = ["a", "b", "a", "c", "a", "b", "d", "x"]
    src.write_bytes(_lines(*[{"id": rid, "text": f"text {i}"} for i, rid in enumerate(ids[:-1])], b"{bad"))
    out = tmp_path / "o.parquet"
    labeler = Labeler(SCHEMA, backend=backend)
    kw = dict(output=out, errors_path=tmp_path / "o.errors.jsonl", progress=False, batch_records=3, chunk_records=3)
    stats = label_file(labeler, src, InputSpec(id_field="id"), **kw)
    assert pq.read_table(out).column("id").to_pylist() == ids[:-1]  # every row kept, in order
    assert (stats.repeated_ids.count, stats.repeated_ids.examples) == (3, ["a", "b"])
    assert (stats.to_dict()["repeated_ids"], stats.to_dict()["repeated_id_examples"]) == (3, ["a", "b"])
    polls = []
    with pytest.raises(Interrupted):
        label_file(labeler, src, InputSpec(id_field="id"), should_stop=lambda: polls.append(1) or len(polls) > 2, **kw)
    resumed = label_file(labeler, src, InputSpec(id_field="id"), resume=True, **kw)
    assert resumed.decoded < 7 and (resumed.repeated_ids.count, resumed.repeated_ids.examples) == (3, ["a", "b"])
    no_ids = label_file(labeler, src, InputSpec(), **kw)  # row numbers never repeat
    assert no_ids.repeated_ids.count == 0


def test_api_warns_about_repeated_ids(backend):
    labeler = Labeler(SCHEMA, backend=backend)
    with pytest.warns(RepeatedIdWarning, match="1 row repeats an id seen earlier \\('x'\\); each is a row of its own"):
        results = list(labeler.label([{"id": "x", "text": "one"}, {"id": "y", "text": "two"},
                                      {"id": "x", "text": "three"}]))
    assert [r.id for r in results] == ["x", "y", "x"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(labeler.label(["one", "two"]))


# -- 4. standard input, compressed input, CSV delimiters ---------------------------------------------

def _compress(data: bytes, how: str) -> bytes:
    return gzip.compress(data) if how == "gz" else zstandard.ZstdCompressor().compress(data)


@pytest.mark.parametrize("how", ["gz", "zst"])
@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_compressed_inputs_stream_like_plain_ones(tmp_path, kind, how):
    plain = SAMPLES / f"airline_tweets.{kind}"
    packed = tmp_path / f"tweets.{kind}.{how}"
    packed.write_bytes(_compress(plain.read_bytes(), how))
    before = set(tmp_path.iterdir())
    spec = InputSpec(id_field="id")
    assert flat(packed, spec) == flat(plain, spec) and len(flat(plain, spec)) > 50
    odd = tmp_path / "export.bin"
    shutil.copyfile(packed, odd)
    assert flat(odd, spec, fmt=f"{kind}.{how}") == flat(plain, spec)
    assert set(tmp_path.iterdir()) == before | {odd}  # nothing unpacked next to it
    reader, plain_reader = RecordReader(packed, spec), RecordReader(plain, spec)
    list(reader), list(plain_reader)
    assert reader.digest == plain_reader.digest  # the hash is of the decompressed rows


def test_damaged_compressed_input_is_an_input_error(tmp_path):
    data = gzip.compress(_lines(*[{"text": f"row {i} " * 50} for i in range(200)]))
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="the gzip stream is damaged or cut short"):
        flat(path)
    with pytest.raises(InputError, match="cannot tell the format from the extension '.parquet.gz'"):
        pio.input_kind(Path("x.parquet.gz"), None)


class _Stdin:
    def __init__(self, data: bytes):
        self.buffer = io.BufferedReader(io.BytesIO(data))


@pytest.mark.parametrize("packed", [None, "gz", "zst"])
def test_standard_input_needs_a_format_and_sniffs_compression(monkeypatch, packed):
    data = (SAMPLES / "airline_tweets.csv").read_bytes()
    monkeypatch.setattr(sys, "stdin", _Stdin(_compress(data, packed) if packed else data))
    spec = InputSpec(id_field="id")
    assert flat("-", spec, fmt="csv") == flat(SAMPLES / "airline_tweets.csv", spec)
    with pytest.raises(InputError, match="reading standard input needs --format"):
        RecordReader("-", spec)
    with pytest.raises(InputError, match="Parquet cannot be read from standard input"):
        RecordReader("-", spec, fmt="parquet")


@pytest.mark.parametrize("delimiter,typed", [(";", ";"), ("\t", "\\t"), ("|", "|")])
def test_csv_delimiter_option_and_the_hint(tmp_path, delimiter, typed):
    path = tmp_path / "in.csv"
    path.write_text(f'id{delimiter}text\r\na{delimiter}"one{delimiter} two"\r\nb{delimiter}three\r\n', encoding="utf-8")
    assert flat(path, InputSpec(id_field="id", csv_delimiter=typed)) == [Record("a", f"one{delimiter} two"),
                                                                        Record("b", "three")]
    with pytest.raises(InputError) as info:
        flat(path, InputSpec(id_field="id"))
    # the hint shows the separator as it is typed on a command line (\t, not \\t), both times
    assert f"the header is one column made of '{typed}'-separated names: pass --csv-delimiter '{typed}'" \
        in str(info.value)


def test_csv_delimiter_must_be_one_character():
    for bad in ("", ";;", '"', "\\n"):
        with pytest.raises(InputError, match="--csv-delimiter"):
            InputSpec(csv_delimiter=bad)


def test_cli_reads_standard_input(tmp_path):
    rows = _lines({"id": "s1", "text": "Great flight, thanks!"}, {"id": "s2", "text": "Lost my bag again."})
    schema = SAMPLES.parent / "schemas" / "airline_sentiment.yaml"
    out = tmp_path / "o.parquet"
    refused = pcd("label", "-", "-s", schema, "-o", out, code=2, input=rows)
    assert "reading standard input needs --format" in refused.stderr
    assert "needs -o" in pcd("label", "-", "-s", schema, "--format", "jsonl", code=2, input=rows).stderr
    pcd("label", "-", "-s", schema, "--format", "jsonl", "--id-field", "id", "-o", out, "-q", code=0,
        input=gzip.compress(rows))
    table = pq.read_table(out)
    assert table.column("id").to_pylist() == ["s1", "s2"]
    assert table.schema.metadata[b"pcd.input"] == b"<stdin>"


# -- 5. resume integrity --------------------------------------------------------------------------

def test_skip_checks_the_rows_read_past(tmp_path, monkeypatch):
    path = tmp_path / "in.jsonl"
    path.write_bytes(_lines(*[{"id": f"r{i}", "text": f"text {i}"} for i in range(6)]))
    first = RecordReader(path, InputSpec(id_field="id"), batch_size=4)
    batch = next(iter(first))
    digest = first.digest
    assert digest == hashlib.sha256(b"".join(path.read_bytes().splitlines(keepends=True)[:4])).hexdigest()
    again = RecordReader(path, InputSpec(id_field="id"), batch_size=10)
    assert again.skip(4, digest) is None
    assert [r.id for b in again for r in b] == ["r4", "r5"]
    path.write_bytes(path.read_bytes().replace(b"text 1", b"TEXT 1"))  # same size
    changed = RecordReader(path, InputSpec(id_field="id"), batch_size=10)
    assert changed.skip(4, digest) == ("the input's first 4 rows are not those the unfinished run labelled "
                                       "(their content changed)")
    assert [r.id for b in changed for r in b] == [f"r{i}" for i in range(6)]  # back at row 0
    short = tmp_path / "short.jsonl"
    short.write_bytes(_lines({"id": "r0", "text": "text 0"}))
    assert RecordReader(short, InputSpec()).skip(4, digest) == "the input now has 1 rows, fewer than the 4 rows done"
    # standard input cannot be read twice: the rows read past are replayed
    monkeypatch.setattr(sys, "stdin", _Stdin(path.read_bytes()))
    piped = RecordReader("-", InputSpec(id_field="id"), fmt="jsonl", batch_size=10)
    assert piped.skip(4, digest) is not None
    items = [r for b in piped for r in b]
    assert [r.text for r in items] == ["text 0", "TEXT 1"] + [f"text {i}" for i in range(2, 6)]
    assert [r.row for r in items] == list(range(6)) and batch[0].row == 0


def test_csv_and_parquet_digests_cover_header_and_values(tmp_path):
    csv_path = tmp_path / "in.csv"
    csv_path.write_bytes(b"\xef\xbb\xbfid,text\r\n\r\na,one\r\nb,\"two\nlines\"\r\n")
    reader = RecordReader(csv_path, InputSpec(id_field="id"))
    list(reader)
    assert reader.digest == hashlib.sha256(b"id,text\r\n\r\na,one\r\nb,\"two\nlines\"\r\n").hexdigest()
    renamed = tmp_path / "renamed.csv"
    renamed.write_bytes(b"id,text,x\r\na,one,1\r\n")
    other = RecordReader(renamed, InputSpec(id_field="id"))
    assert other.skip(1, reader.digest) is not None
    pq_path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["one", "two"]}), pq_path)
    first = RecordReader(pq_path, InputSpec(id_field="id"))
    list(first)
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["one", "TWO"]}), pq_path)
    assert RecordReader(pq_path, InputSpec(id_field="id")).skip(2, first.digest) is not None


def test_a_grown_input_resumes_an_edited_one_starts_over(backend, tmp_path):
    src = tmp_path / "in.jsonl"
    rows = [{"id": f"r{i}", "text": f"Row number {i} says hello."} for i in range(10)]
    src.write_bytes(_lines(*rows[:8]))
    out = tmp_path / "o.parquet"
    labeler = Labeler(SCHEMA, backend=backend)

    def run(**kw):
        events = []
        stats = label_file(labeler, src, InputSpec(id_field="id"), output=out, errors_path=tmp_path / "e.jsonl",
                           progress=False, batch_records=3, chunk_records=3,
                           on_event=lambda name, fields: events.append((name, fields.get("reason"))), **kw)
        return stats, events

    polls = []
    with pytest.raises(Interrupted):
        run(should_stop=lambda: polls.append(1) or len(polls) > 2)
    src.write_bytes(_lines(*rows))  # the export grew: the rows done are unchanged
    stats, events = run(resume=True)
    assert events[0] == ("resumed", None) and stats.decoded == 4 and stats.read == 10
    fresh = tmp_path / "fresh.parquet"
    label_file(labeler, src, InputSpec(id_field="id"), output=fresh, errors_path=tmp_path / "f.jsonl", progress=False,
               batch_records=3, chunk_records=3)
    assert pq.read_table(out).to_pydict() == pq.read_table(fresh).to_pydict()
    polls.clear()
    with pytest.raises(Interrupted):
        run(should_stop=lambda: polls.append(1) or len(polls) > 2)
    stat = src.stat()
    src.write_bytes(src.read_bytes().replace(b"number 1 ", b"NUMBER 1 "))
    os.utime(src, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    stats, events = run(resume=True)
    assert events[0][0] == "discarded" and "first 6 rows are not those" in events[0][1]
    assert stats.decoded == 10


def test_fingerprint_names_what_can_change_results(backend, tmp_path):
    import torch
    import transformers

    labeler = Labeler(SCHEMA, backend=backend, max_tokens_per_pass=512)
    src = tmp_path / "in.jsonl"
    src.write_bytes(_lines({"text": "hello"}))
    fp = job_fingerprint(labeler, src, InputSpec(csv_delimiter=";"), fmt=None, all_probs=False, trace=False)
    assert (fp["device"], fp["dtype"], fp["max_tokens_per_pass"], fp["csv_delimiter"]) == \
        ("cpu", "float32", 512, ";")
    assert fp["libraries"] == f"torch {torch.__version__}, transformers {transformers.__version__}"
    assert fp["model"] == backend.content_key and len(fp["model"]) == 64  # the weights, not the name
    assert "input_size" not in fp and "input_mtime_ns" not in fp  # the content hash decides instead
    assert job_fingerprint(labeler, "-", InputSpec(), fmt="jsonl", all_probs=False, trace=False)["input"] == "<stdin>"


# -- 7. the model cache is keyed by content ------------------------------------------------------

def test_a_copy_of_the_gguf_reuses_the_conversion(tmp_path, monkeypatch):
    import transformers

    from pcd_cli.backends import torch_backend as tb

    original = tb.embedded_gguf_path()
    converted = tb.converted_gguf_dir(original)
    copy = tmp_path / "other-venv" / "renamed.gguf"
    copy.parent.mkdir()
    shutil.copyfile(original, copy)

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_conversion)
    assert tb.converted_gguf_dir(copy) == converted
    assert tb.gguf_content_key(copy) == hashlib.sha256(original.read_bytes()).hexdigest()
    with copy.open("r+b") as fh:  # another model in the same file name: another key
        fh.seek(-1, os.SEEK_END)
        last = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([last[0] ^ 1]))
    assert tb.converted_gguf_target(copy) != converted
    assert tb.converted_gguf_target(copy).name.startswith("renamed-")


# -- 8. usage errors in JSON logs; 13.8: exit 4, fsync ------------------------------------------------

def test_usage_errors_are_json_when_asked(tmp_path):
    schema = SAMPLES.parent / "schemas" / "airline_sentiment.yaml"
    for flag in (["--log-format", "json"], ["--log-format=json"]):
        result = pcd("label", SAMPLES / "airline_tweets.jsonl", "-s", schema, "--max-errors", "many", *flag, code=2)
        (event,) = [json.loads(line) for line in result.stderr.splitlines()]
        assert (event["level"], event["event"], event["exit_code"]) == ("error", "usage_error", 2)
        assert event["message"].startswith("Invalid value for '--max-errors'")
    (event,) = [json.loads(line) for line in pcd("lable", "x", "--log-format", "json", code=2).stderr.splitlines()]
    assert "No such command 'lable'" in event["message"]
    plain = pcd("label", SAMPLES / "airline_tweets.jsonl", "-s", schema, "--max-errors", "many", code=2)
    assert "Invalid value for '--max-errors'" in plain.stderr and not plain.stderr.startswith("{")


def test_an_internal_error_exits_4_with_one_line(tmp_path, monkeypatch):
    import pcd_cli.schema.load

    def broken(path):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(pcd_cli.schema.load, "load_schema", broken)
    args = ("label", SAMPLES / "airline_tweets.jsonl", "-s", "x.yaml", "-o", tmp_path / "o.parquet")
    text = pcd(*args, code=4)
    assert text.stderr.strip().splitlines() == [
        "error: internal error: ZeroDivisionError: boom; this is a bug in pcd, please report it (--log-format json "
        "shows the traceback)"]
    (event,) = [json.loads(line) for line in pcd(*args, "--log-format", "json", code=4).stderr.splitlines()]
    assert (event["event"], event["exit_code"]) == ("internal_error", 4)
    assert "Traceback" in event["traceback"] and "ZeroDivisionError: boom" in event["traceback"]


def test_assembled_files_are_fsynced_before_the_work_folder_goes(backend, tmp_path, monkeypatch):
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    src = tmp_path / "in.jsonl"
    src.write_bytes(_lines({"id": "a", "text": "fine"}, b"{bad"))
    out = tmp_path / "o.parquet"
    label_file(Labeler(SCHEMA, backend=backend, trace=True), src, InputSpec(id_field="id"), output=out,
               errors_path=tmp_path / "o.errors.jsonl", trace_path=tmp_path / "o.trace.jsonl", progress=False)
    assert not work_dir_for(out).exists()
    for name in (".o.errors.jsonl.", ".o.trace.jsonl.", ".o.parquet."):  # temporary names: .<name>.<random>.tmp
        assert any(p.startswith(str(tmp_path / name)) and p.endswith(".tmp") for p in synced), name
    assert str(tmp_path) in synced  # the renames themselves


# -- 13.8: the context estimate follows the longest answer ---------------------------------------------

def test_context_estimate_follows_the_longest_answer(backend):
    long_label = "a label that is written with very many words " * 4
    schema = parse_schema({"fields": {"first": {"type": "enum", "labels": ["x", long_label.strip()]},
                                      "second": {"type": "boolean"}}})
    decoder = Labeler(schema, backend=backend).decoder
    compiled = decoder.compiled
    short_line, long_line = compiled.written_line(0, 0), compiled.written_line(0, 1)
    tail = compiled.prompt.tail_text
    plan0 = compiled.wave_plan(0, tail)
    plan1 = compiled.wave_plan(1, tail + long_line)
    expected = max(max(max(f.depths) + 1 for f in plan0.forests),
                   len(plan1.context_ids) - len(plan0.context_ids) + max(max(f.depths) + 1 for f in plan1.forests))
    assert decoder._positions_after_record == expected
    encode = backend.tokenizer.encode
    assert len(encode(tail + long_line)) - len(encode(tail + short_line)) > 20  # label 0 would undercount


# -- 9. Pydantic models as schemas ------------------------------------------------------------------

class Tone(enum.Enum):
    CALM = "calm"
    ANGRY = "angry"


class Review(BaseModel):
    """The input is a short product review."""

    sentiment: Literal["negative", "neutral", "positive"] = Field(description="Overall opinion of the product")
    mentions_price: bool = Field(description="The review talks about the price")
    tone: Tone
    refund: bool = Field(description="Asks for a refund", json_schema_extra={"depends_on": ["tone"]})


def test_a_pydantic_model_is_the_same_schema_as_its_yaml():
    schema = schema_from_model(Review)
    same = parse_schema({"name": "Review", "instructions": "The input is a short product review.", "fields": {
        "sentiment": {"type": "enum", "labels": ["negative", "neutral", "positive"],
                      "description": "Overall opinion of the product"},
        "mentions_price": {"type": "boolean", "description": "The review talks about the price"},
        "tone": {"type": "enum", "labels": ["calm", "angry"]},
        "refund": {"type": "boolean", "description": "Asks for a refund", "depends_on": ["tone"]}}})
    assert schema == same
    assert [f.name for f in schema.fields] == ["sentiment", "mentions_price", "tone", "refund"]
    assert schema.waves == ((0,), (1, 2), (3,))


class Numbers(enum.Enum):
    ONE = 1
    TWO = 2


USE = ("use bool, Literal['a', 'b', ...] or a str Enum, int with Field(ge=..., le=...), list[Literal[...]] / "
       "set[MyEnum] (multi-select), or Optional[...] of one of them")


@pytest.mark.parametrize("annotation,problem", [
    (int, "type int without both bounds is not supported; pcd reads an integer as one of its values: give "
          "Field(ge=..., le=...) (or gt/lt, conint), at most 500 values"),
    (str, f"type str is not supported; {USE}"), (float, f"type float is not supported; {USE}"),
    (List[str], "type List[str] is not supported; a multi-select is list[Literal['a', 'b', ...]] or set[MyEnum] "
                "(a str Enum)")])
def test_other_types_fail_naming_the_field_and_type(annotation, problem):
    model = type("Bad", (BaseModel,), {"__annotations__": {"ok": bool, "score": annotation}})
    with pytest.raises(SchemaError) as info:
        schema_from_model(model)
    assert str(info.value) == f"field 'score' of Bad: {problem}"  # tests/test_schema_types.py: every type


def test_pydantic_labels_get_the_yaml_checks():
    numbers = type("N", (BaseModel,), {"__annotations__": {"n": Numbers}})  # an Enum of 1, 2: an integer field
    assert schema_from_model(numbers).fields[0].labels == ("1", "2")
    assert schema_from_model(numbers).fields[0].type == "integer"
    literal = type("L", (BaseModel,), {"__annotations__": {"n": Literal["a", 2]}})
    with pytest.raises(SchemaError, match="Literal value 2 \\(int\\) among string values; labels are strings"):
        schema_from_model(literal)
    one = type("One", (BaseModel,), {"__annotations__": {"n": Literal["only"]}})
    with pytest.raises(SchemaError, match="an enum needs at least two labels"):
        schema_from_model(one)
    cased = type("Cased", (BaseModel,), {"__annotations__": {"n": Literal["Yes", "yes"]}})
    assert schema_from_model(cased).warnings == ("field 'n': labels 'Yes' and 'yes' differ only by case",)


MODELS_PY = '''
import enum
from typing import Literal
from pydantic import BaseModel, Field


class Review(BaseModel):
    """Product reviews."""
    sentiment: Literal["negative", "positive"] = Field(description="Opinion")
    price: bool


class Broken(BaseModel):
    score: float
'''


def test_schema_option_loads_a_model_from_a_python_file(tmp_path, backend):
    models = tmp_path / "models.py"
    models.write_text(MODELS_PY)
    schema = load_schema(f"{models}:Review")
    assert [(f.name, f.labels, f.description) for f in schema.fields] == [
        ("sentiment", ("negative", "positive"), "Opinion"), ("price", ("true", "false"), "")]
    assert schema.instructions == "Product reviews."
    with pytest.raises(SchemaError, match="name the model as .*models.py:ModelName \\(models found: Review, Broken\\)"):
        load_schema(models)
    with pytest.raises(SchemaError, match="defines no 'Nope'"):
        load_schema(f"{models}:Nope")
    result = pcd("label", SAMPLES / "airline_tweets.jsonl", "-s", f"{models}:Broken", "-o", tmp_path / "o.parquet",
                 code=2)
    assert "field 'score' of Broken: type float is not supported" in result.stderr
    (tmp_path / "needs.py").write_text("import pydantic_not_installed_here\n")
    with pytest.raises(SchemaError, match="importing .* failed"):
        load_schema(f"{tmp_path / 'needs.py'}:X")
    (tmp_path / "nopyd.py").write_text("raise ModuleNotFoundError('x', name='pydantic')\n")
    with pytest.raises(MissingExtra, match="pip install 'pcd-cli\\[pydantic\\]'"):
        load_schema(f"{tmp_path / 'nopyd.py'}:X")
    (result,) = list(Labeler(Review, backend=backend).label(["Too pricey, but I love it."]))
    assert result.fields[0].value in ("negative", "neutral", "positive") and result.fields[1].value in (True, False)


# -- cases of tests/data/cases-round2/ (issue #12; formerly tests/test_cases_round2_inputs.py):
# jsonl-unicode-line-separators and non-string-text-values

def test_jsonl_unicode_line_separators(tmp_path):
    case = copy_case("jsonl-unicode-line-separators", tmp_path)
    pcd("label", case / "input.jsonl", "-s", case / "schema.yaml", "--id-field", "id", "-o", case / "out.parquet",
         "--trace", case / "trace.jsonl")
    assert pq.read_table(case / "out.parquet").column("id").to_pylist() == ["r1", "r2", "r3", "r5"]
    errors = jsonl_rows(case / "out.errors.jsonl")
    assert [(e["row"], e["line"]) for e in errors] == [(3, 4)]
    contexts = trace_contexts(case / "trace.jsonl")
    assert "Great kettle\u2028boils fast" in contexts["r1"]
    assert "what it does\u2029I returned it." in contexts["r2"]
    assert "Arrived late\u0085but works fine." in contexts["r3"]
    assert "\r" not in contexts["r5"]  # CRLF line ends are not part of the record


def test_non_string_text_values_cli_and_api_agree(tmp_path, embedded_backend):
    from pcd_cli import Labeler, RecordFailure
    from pcd_cli.schema.load import load_schema

    case = copy_case("non-string-text-values", tmp_path)
    pcd("label", case / "input.jsonl", "-s", case / "schema.yaml", "--id-field", "id", "-o", case / "out.parquet",
         "--trace", case / "trace.jsonl")
    table = pq.read_table(case / "out.parquet").to_pydict()
    assert table["id"] == ["n1", "n2", "n3", "n6"]
    errors = {e["record"]: e["error"] for e in jsonl_rows(case / "out.errors.jsonl")}
    assert errors == {"n4": "line 4: text field 'text' is a list, not a string",
                      "n5": "line 5: text field 'text' is an object, not a string"}
    contexts = trace_contexts(case / "trace.jsonl")
    # a number or boolean cell is its JSON text, then quoted as data like any record (quote_record)
    from pcd_cli.decoding.prompt import quote_record

    assert f"Input:\n{quote_record('123', 'json')}<|im_end|>" in contexts["n1"]
    assert f"Input:\n{quote_record('4.5', 'json')}<|im_end|>" in contexts["n2"]
    assert f"Input:\n{quote_record('true', 'json')}<|im_end|>" in contexts["n3"] and "True" not in contexts["n3"]

    rows = [json.loads(line) for line in (case / "input.jsonl").read_text().splitlines()]
    results = list(Labeler(load_schema(case / "schema.yaml"), backend=embedded_backend).label(rows))
    failed = {r.id: r.error for r in results if isinstance(r, RecordFailure)}
    assert failed == {"n4": "row 3: text field 'text' is a list, not a string",
                      "n5": "row 4: text field 'text' is an object, not a string"}
    labelled = [r for r in results if not isinstance(r, RecordFailure)]
    assert [r.id for r in labelled] == table["id"]
    assert [r.fields[0].value for r in labelled] == table["sentiment"]
    for i, r in enumerate(labelled):  # the same text in the prompt: the same numbers
        assert abs(r.fields[0].prob - table["sentiment__prob"][i]) < 1e-5
