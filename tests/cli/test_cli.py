"""End-to-end tests of the ``pcd`` command line, in process, on the embedded model."""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pcd_cli
import pcd_cli.backends
import pcd_cli.backends.torch_backend
from pcd_cli.decoding.prompt import quote_record
from pcd_cli.schema.load import load_schema

from ..helpers import flat, pcd

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "sample_data"
SCHEMAS = ROOT / "schemas"
AIRLINE = SCHEMAS / "airline_sentiment.yaml"
AIRLINE_LABELS = {"NEGATIVE", "NEUTRAL", "POSITIVE"}
N = 4  # records per end-to-end run
FIRST_IDS = [json.loads(line)["id"] for line in (DATA / "airline_tweets.jsonl").read_text().splitlines()[:N]]
META_KEYS = ("pcd.version", "pcd.model", "pcd.schema_sha256", "pcd.prompt_head_sha256", "pcd.scoring",
             "pcd.created_utc")

def strict_json(line: str):
    def reject(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(line, parse_constant=reject)


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if anything tries to load a model."""
    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(pcd_cli.backends, "load_backend", refuse)
    monkeypatch.setattr(pcd_cli.backends.torch_backend, "load_backend", refuse)
    return calls


def check_label_table(table: pa.Table, ids: list, labels: set[str], field: str = "sentiment") -> None:
    assert table.num_rows == len(ids)
    assert table.column(table.schema.names[0]).to_pylist() == ids
    assert set(table.column(field).to_pylist()) <= labels
    for col in (f"{field}__prob", f"{field}__mass"):
        values = table.column(col).to_pylist()
        assert all(0.0 < v <= 1.0 for v in values), (col, values)


# -- label on each input format ---------------------------------------------------------------

@pytest.fixture(scope="module")
def format_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("formats")
    runs = {}
    for ext in ("jsonl", "csv", "parquet"):
        target = out / f"{ext}.parquet"
        result = pcd("label", DATA / f"airline_tweets.{ext}", "--schema", AIRLINE, "--id-field", "id",
                     "--limit", N, "-o", target, "--no-progress")
        runs[ext] = (result, target)
    return out, runs


@pytest.mark.parametrize("ext", ["jsonl", "csv", "parquet"])
def test_label_each_format(format_runs, ext):
    _, runs = format_runs
    result, target = runs[ext]
    assert f"wrote {N} rows to" in flat(result.stdout)
    table = pq.read_table(target)
    assert table.schema.names == ["id", "sentiment", "sentiment__prob", "sentiment__mass", "sentiment__steered",
                                  "__truncated", "__input_sha256"]
    assert [table.schema.field(c).type for c in table.schema.names] == [pa.string(), pa.string(), pa.float32(),
                                                                         pa.float32(), pa.bool_(), pa.bool_(),
                                                                         pa.string()]
    assert table.column("__truncated").to_pylist() == [False] * N
    check_label_table(table, FIRST_IDS, AIRLINE_LABELS)
    meta = {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
    assert all(meta.get(k) for k in META_KEYS), meta
    assert meta["pcd.version"] == pcd_cli.__version__
    assert meta["pcd.schema_sha256"] == load_schema(AIRLINE).source_sha256
    assert re.fullmatch(r"[0-9a-f]{64}", meta["pcd.prompt_head_sha256"])
    assert meta["pcd.scoring"] == "marginal"
    created = dt.datetime.fromisoformat(meta["pcd.created_utc"])
    assert created.utcoffset() == dt.timedelta(0)
    assert abs((dt.datetime.now(dt.timezone.utc) - created).total_seconds()) < 3600


def test_formats_agree(format_runs):
    _, runs = format_runs
    tables = {ext: pq.read_table(target).to_pydict() for ext, (_, target) in runs.items()}
    ref = tables["jsonl"]
    for ext in ("csv", "parquet"):
        assert tables[ext]["id"] == ref["id"]
        assert tables[ext]["sentiment"] == ref["sentiment"]
        for col in ("sentiment__prob", "sentiment__mass"):
            assert tables[ext][col] == pytest.approx(ref[col], abs=1e-6)


def test_no_temp_files_after_a_run(format_runs):
    out, runs = format_runs
    assert sorted(p.name for p in out.iterdir()) == sorted(target.name for _, target in runs.values())


def test_boolean_column(tmp_path):
    target = tmp_path / "[bold]out" / "spam.parquet"  # paths are printed as they are, not as rich markup
    result = pcd("label", DATA / "sms_spam.jsonl", "-s", SCHEMAS / "sms_spam.yaml", "--id-field", "id",
                 "--limit", 3, "-o", target)
    assert str(target) in "".join(result.stdout.split())
    table = pq.read_table(target)
    assert table.schema.names == ["id", "is_spam", "is_spam__prob", "is_spam__mass", "is_spam__steered",
                                  "__truncated", "__input_sha256"]
    assert table.schema.field("is_spam").type == pa.bool_()
    assert table.schema.field("is_spam__prob").type == pa.float32()
    assert all(isinstance(v, bool) for v in table.column("is_spam").to_pylist())
    check_label_table(table, ["sms-0", "sms-1", "sms-2"], {True, False}, field="is_spam")


# -- --all-probs and --trace ------------------------------------------------------------------

def test_all_probs_and_trace(tmp_path, format_runs):
    target, trace = tmp_path / "o.parquet", tmp_path / "trace.jsonl"
    pcd("label", DATA / "airline_tweets.jsonl", "-s", AIRLINE, "--id-field", "id", "--limit", N, "-o", target,
        "--all-probs", "--trace", trace)
    table = pq.read_table(target)
    assert table.schema.names == ["id", "sentiment", "sentiment__prob", "sentiment__mass", "sentiment__probs",
                                  "sentiment__steered", "__truncated", "__input_sha256"]
    assert table.schema.field("sentiment__probs").type == pa.map_(pa.string(), pa.float32())
    rows = table.to_pylist()
    labels = list(load_schema(AIRLINE).fields[0].labels)
    for row in rows:
        probs = dict(row["sentiment__probs"])
        assert [k for k, _ in row["sentiment__probs"]] == labels
        assert sum(probs.values()) == pytest.approx(1.0, abs=1e-5)
        assert probs[row["sentiment"]] == pytest.approx(row["sentiment__prob"], abs=1e-7)
        assert row["sentiment__prob"] == pytest.approx(max(probs.values()), abs=1e-7)
    # same labels and numbers as the plain run
    plain = pq.read_table(format_runs[1]["jsonl"][1]).to_pydict()
    assert [r["sentiment"] for r in rows] == plain["sentiment"]
    assert [r["sentiment__prob"] for r in rows] == pytest.approx(plain["sentiment__prob"], abs=1e-6)

    texts = [json.loads(line)["text"] for line in (DATA / "airline_tweets.jsonl").read_text().splitlines()[:N]]
    lines = trace.read_text(encoding="utf-8").splitlines()
    assert len(lines) == N  # one field
    for line, row, text in zip(lines, rows, texts):
        entry = strict_json(line)
        assert set(entry) >= {"record", "field", "scoring", "context", "lines", "probs", "mass"}
        assert entry["record"] == row["id"] and entry["field"] == "sentiment" and entry["scoring"] == "marginal"
        assert in_prompt(text.strip(), load_schema(AIRLINE).record_quoting) in entry["context"]
        assert [ln["label"] for ln in entry["lines"]] == labels
        for ln in entry["lines"]:
            assert set(ln) == {"label", "text"} and f'"{ln["label"]}"' in ln["text"]
        assert list(entry["probs"]) == labels
        assert [entry["probs"][k] for k in labels] == pytest.approx([dict(row["sentiment__probs"])[k]
                                                                     for k in labels], abs=1e-6)
        assert entry["probs"][row["sentiment"]] == pytest.approx(row["sentiment__prob"], abs=1e-6)
        assert entry["mass"] == pytest.approx(row["sentiment__mass"], abs=1e-6)


def in_prompt(text: str, quoting: str) -> str:
    """``text``, a part of a record, as it stands in the prompt (``quote_record``): for ``json``
    with its JSON escapes, without the quotes around the whole record."""
    quoted = quote_record(text, quoting)
    return quoted[1:-1] if quoting == "json" else quoted


# -- templates over many fields ---------------------------------------------------------------

def test_template_with_support_triage(tmp_path):
    schema = load_schema(SCHEMAS / "support_triage.yaml")
    assert len(schema.fields) == 28
    target, trace = tmp_path / "tickets.parquet", tmp_path / "trace.jsonl"
    # without the steering check: its vocabulary (28 fields' words) erases most sentences of these tickets,
    # and the trace is then of the ticket without them; this test is about the template's text in the prompt
    pcd("label", DATA / "support_tickets.jsonl", "-s", SCHEMAS / "support_triage.yaml", "--id-field", "id",
        "--template", r"Subject: {subject}\n\n{body}", "--limit", 2, "-o", target, "--trace", trace,
        "--no-steering-check")
    table = pq.read_table(target)
    expected = ["id"] + [c for f in schema.fields for c in (f.name, f"{f.name}__prob", f"{f.name}__mass")]
    assert table.schema.names == expected + ["__truncated", "__input_sha256"] and len(expected) == 1 + 28 * 3
    tickets = [json.loads(line) for line in (DATA / "support_tickets.jsonl").read_text().splitlines()[:2]]
    assert table.column("id").to_pylist() == [t["id"] for t in tickets]
    for f in schema.fields:
        if f.is_boolean:
            assert table.schema.field(f.name).type == pa.bool_()
        else:
            assert set(table.column(f.name).to_pylist()) <= set(f.labels)
        assert all(0.0 < p <= 1.0 for p in table.column(f"{f.name}__prob").to_pylist())
    entries = [strict_json(line) for line in trace.read_text(encoding="utf-8").splitlines()]
    assert len(entries) == 2 * 28
    assert {(e["record"], e["field"]) for e in entries} == {(t["id"], f.name) for t in tickets
                                                            for f in schema.fields}
    for e in entries:
        ticket = next(t for t in tickets if t["id"] == e["record"])
        assert in_prompt(f"Subject: {ticket['subject']}\n\n", schema.record_quoting) in e["context"]
        assert in_prompt(ticket["body"].strip(), schema.record_quoting) in e["context"]


# -- default ids and paths --------------------------------------------------------------------

def test_default_ids_and_output_path(tmp_path, format_runs):
    src = tmp_path / "airline_tweets.jsonl"
    lines = (DATA / "airline_tweets.jsonl").read_text().splitlines(keepends=True)[:3]
    src.write_text("".join(lines))
    result = pcd("label", src, "-s", AIRLINE)
    target = tmp_path / "airline_tweets.labels.parquet"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["airline_tweets.jsonl", "airline_tweets.labels.parquet"]
    # the input has an 'id' column: it is the record id without --id-field, and the run says so
    assert "wrote 3 rows" in flat(result.stdout) and "ids from the 'id' column; --row-ids numbers" in flat(result.stdout)
    table = pq.read_table(target)
    assert table.schema.names == ["id", "sentiment", "sentiment__prob", "sentiment__mass", "sentiment__steered",
                                  "__truncated", "__input_sha256"]
    check_label_table(table, [json.loads(line)["id"] for line in lines], AIRLINE_LABELS)
    plain = pq.read_table(format_runs[1]["jsonl"][1]).to_pydict()
    assert table.column("sentiment").to_pylist() == plain["sentiment"][:3]
    # --row-ids, or an input without an 'id' column: row numbers from 0
    src.write_text("".join(json.dumps({"text": json.loads(line)["text"]}) + "\n" for line in lines))
    result = pcd("label", src, "-s", AIRLINE, "-o", tmp_path / "rows.parquet")
    assert "ids are row numbers (column 'row')" in flat(result.stdout)
    table = pq.read_table(tmp_path / "rows.parquet")
    assert table.schema.names[0] == "row" and table.schema.field("row").type == pa.int64()
    check_label_table(table, [0, 1, 2], AIRLINE_LABELS)
    assert pcd("label", src, "-s", AIRLINE, "--row-ids", "--id-field", "id", code=2)


# -- nothing is lost --------------------------------------------------------------------------

def test_bad_records_go_to_the_errors_file(tmp_path):
    src = tmp_path / "mixed.jsonl"
    lines = [
        json.dumps({"id": "[/g1]", "text": "@united thanks for the upgrade, great crew!"}),  # not rich markup
        json.dumps({"id": "m1", "body": "no text key"}),
        json.dumps({"id": "e1", "text": "   "}),
        '{"id": "j1", "text": "broken',
        '["an", "array"]',
        json.dumps({"id": "g2", "text": "@AmericanAir lost my bag again"}),
    ]
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    # --min-mass 1 lists every record in the summary's lowest-mass table
    result = pcd("label", src, "-s", AIRLINE, "--id-field", "id", "-o", out / "mixed.labels.parquet",
                 "--min-mass", 1)
    table = pq.read_table(out / "mixed.labels.parquet")
    errors = [strict_json(line) for line in (out / "mixed.errors.jsonl").read_text().splitlines()]
    assert table.num_rows + len(errors) == len(lines)
    check_label_table(table, ["[/g1]", "g2"], AIRLINE_LABELS)
    assert "[/g1]" in result.stdout and "6 rows read: 2 records labelled, 4 failed" in flat(result.stdout)
    assert [(e["row"], e["line"], e["record"]) for e in errors] == [(1, 2, "m1"), (2, 3, "e1"), (3, 4, None),
                                                                   (4, 5, None)]
    by_line = {e["line"]: e["error"] for e in errors}
    assert "'text'" in by_line[2] and "missing" in by_line[2]
    assert "empty" in by_line[3]
    assert by_line[4].startswith("line 4: not valid JSON")
    assert by_line[5].startswith("line 5: expected a JSON object")
    assert "4 rows failed" in flat(result.stderr)
    meta = table.schema.metadata
    assert (meta[b"pcd.records_read"], meta[b"pcd.records_labelled"], meta[b"pcd.records_failed"]) == (b"6", b"2", b"4")


def test_every_record_failing_exits_1(tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_text('{"id": "a", "text": null}\nnot json\n')  # a JSONL without the text key at all: exit 2
    # the errors file is this run's; an earlier run's trace (and output) are left as they were
    (tmp_path / "o.errors.jsonl").write_text('{"record": "old", "error": "old"}\n' * 5)
    (tmp_path / "trace.jsonl").write_text('{"record": "old"}\n')
    result = pcd("label", src, "-s", AIRLINE, "--id-field", "id", "-o", tmp_path / "o.parquet",
                 "--trace", tmp_path / "trace.jsonl", code=1)
    errors = [strict_json(line) for line in (tmp_path / "o.errors.jsonl").read_text().splitlines()]
    assert [(e["record"], e["line"]) for e in errors] == [("a", 1), (None, 2)]
    assert (tmp_path / "trace.jsonl").read_text() == '{"record": "old"}\n'
    assert not (tmp_path / "o.parquet").exists()
    assert "no row could be labelled: all 2 failed" in flat(result.stderr)


# -- bad schemas fail before any model is loaded ----------------------------------------------

BAD_SCHEMAS = {
    "no-fields": ("name: x\nfields: {}\n", [], ["no fields"]),
    "unknown-type": ("fields:\n  sentiment: {type: decimal}\n", [], ["'sentiment'", "unknown type 'decimal'"]),
    "duplicate-label": ("fields:\n  sentiment: {type: enum, labels: [GOOD, BAD, GOOD]}\n", [],
                        ["'sentiment'", "duplicate label 'GOOD'"]),
    "non-string-label": ("fields:\n  rating: {type: enum, labels: [1, 2]}\n", [],
                         ["'rating'", "label #1 is written 1, which YAML reads as the number 1", 'quote it: "1"',
                          "label #2 is written 2"]),
    "empty-label": ("fields:\n  sentiment: {type: enum, labels: ['', BAD]}\n", [],
                    ["'sentiment'", "label #1 is empty"]),
    "output-column-clash": ("fields:\n  sentiment: {type: enum, labels: [A, B]}\n"
                            "  sentiment__prob: {type: boolean}\n", [],
                            ["'sentiment__prob'", "clashes with the output column"]),
    "id-clash": ("fields:\n  id: {type: boolean}\n", ["--id-field", "id"],
                 ["'id'", "clashes with the id column"]),
    "row-clash": ("fields:\n  row: {type: boolean}\n", ["--row-ids"], ["'row'", "clashes with the id column"]),
    "not-yaml": ("fields: [unclosed\n", [], ["not valid YAML"]),
}


@pytest.mark.parametrize("name", list(BAD_SCHEMAS))
def test_bad_schema_exits_2_before_loading_a_model(tmp_path, no_model, name):
    text, extra, phrases = BAD_SCHEMAS[name]
    schema = tmp_path / "bad.yaml"
    schema.write_text(text)
    result = pcd("label", DATA / "airline_tweets.jsonl", "-s", schema, "-o", tmp_path / "o.parquet", *extra,
                 code=2)
    message = flat(result.stderr)
    assert message.startswith("error:")
    for phrase in phrases:
        assert phrase in message
    assert no_model == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_missing_schema_file(tmp_path, no_model):
    result = pcd("label", DATA / "airline_tweets.jsonl", "-s", tmp_path / "nope.yaml", code=2)
    assert "nope.yaml" in flat(result.stderr) and "cannot read" in flat(result.stderr)


def test_case_only_labels_warn_but_run(tmp_path):
    schema = tmp_path / "case.yaml"
    schema.write_text("fields:\n  answer: {type: enum, labels: [ok, OK, bad]}\n")
    result = pcd("label", DATA / "airline_tweets.jsonl", "-s", schema, "--limit", 1, "-o", tmp_path / "o.parquet")
    assert "warning:" in flat(result.stderr)
    assert "labels 'ok' and 'OK' differ only by case" in flat(result.stderr)
    assert set(pq.read_table(tmp_path / "o.parquet").column("answer").to_pylist()) <= {"ok", "OK", "bad"}


# -- bad inputs -------------------------------------------------------------------------------

def test_missing_input_file(tmp_path, no_model):
    result = pcd("label", tmp_path / "nope.jsonl", "-s", AIRLINE, code=2)
    assert "nope.jsonl" in result.stderr and "no such input file" in flat(result.stderr)


def test_unknown_extension(tmp_path, no_model):
    src = tmp_path / "tweets.txt"
    shutil.copy(DATA / "airline_tweets.jsonl", src)
    result = pcd("label", src, "-s", AIRLINE, code=2)
    message = flat(result.stderr)
    assert "cannot tell the format" in message and "'.txt'" in message and "--format" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tweets.txt"]


def test_csv_without_the_text_column(tmp_path):
    src = tmp_path / "t.csv"
    src.write_text("id,body\n1,hello there\n")
    result = pcd("label", src, "-s", AIRLINE, "--id-field", "id", code=2)
    assert "no column 'text'" in flat(result.stderr)
    assert "--text-field" in flat(result.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_a_header_without_the_text_column_fails_before_the_model_loads(tmp_path, kind):
    """The header is read first: the error is the column (exit 2), not the missing model (3)."""
    src = tmp_path / f"t.{kind}"
    if kind == "csv":
        src.write_text("id,body\n1,hello there\n")
    else:
        pq.write_table(pa.table({"id": [1], "body": ["hello there"]}), src)
    result = pcd("label", src, "-s", AIRLINE, "--id-field", "id", "--model", tmp_path / "no-such-model", code=2)
    assert "no column 'text'" in flat(result.stderr)


def test_bad_option_values(tmp_path, no_model):
    result = pcd("label", DATA / "airline_tweets.jsonl", "-s", AIRLINE, "--limit", 0, code=2)
    assert "--limit" in result.stderr
    result = pcd("label", DATA / "airline_tweets.jsonl", "-s", AIRLINE, "--format", "xml", code=2)
    assert "--format" in result.stderr


# -- help, version, inspect-schema ------------------------------------------------------------

HELP = {
    (): ["label", "inspect-schema", "bench", "--version"],
    ("label",): ["--schema", "--output", "--id-field", "--text-field", "--template", "--limit", "--all-probs",
                 "--trace", "--errors", "--scoring", "--format"],
    ("inspect-schema",): ["--model", "--scoring", "tokenizer"],
    ("bench",): ["--schema", "--input", "--n", "--max-new-tokens", "--json"],
}


@pytest.mark.parametrize("command", list(HELP), ids=lambda c: "-".join(c) or "app")
def test_help(command, no_model):
    result = pcd(*command, "--help")
    assert "Usage: pcd" in flat(result.stdout)
    for word in HELP[command]:
        assert word in result.stdout, word


def test_piped_help_is_100_columns_with_every_option_name_whole():
    """``pcd label --help | less`` (stdout not a terminal, no COLUMNS): 100 columns, not rich's
    80 (issue #51 item 6), every option of the command on one line; COLUMNS still decides."""
    import os
    import subprocess
    import sys

    from pcd_cli.cli import app
    from typer.main import get_command

    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH", "LINES")}
    lines = {}
    for columns in (None, "80"):
        out = subprocess.run([sys.executable, "-m", "pcd_cli.cli", "label", "--help"], capture_output=True, text=True,
                             env=env | ({"COLUMNS": columns} if columns else {}), cwd=ROOT, check=True).stdout
        lines[columns] = out.splitlines()
    assert max(map(len, lines[None])) == 100 and max(map(len, lines["80"])) == 80
    text = "\n".join(lines[None])
    names = [o for p in get_command(app).commands["label"].params for o in p.opts if o.startswith("--")]
    assert len(names) > 30
    for name in names:  # each name whole, followed by a space or the box's edge, never cut by a wrap
        assert re.search(re.escape(name) + r"(\s|$)", text), name
    assert len(lines[None]) < 0.75 * len(lines["80"])  # fewer, fuller lines


def test_no_arguments_shows_help():
    result = pcd(code=None)
    assert "label" in result.output and "inspect-schema" in result.output


def test_version():
    assert pcd("--version").stdout.strip() == f"pcd {pcd_cli.__version__}"


def test_inspect_schema_support_triage():
    result = pcd("inspect-schema", SCHEMAS / "support_triage.yaml", env={"COLUMNS": "240"})
    for f in load_schema(SCHEMAS / "support_triage.yaml").fields:
        assert f.name in result.stdout, f.name


def test_inspect_schema_customs():
    result = pcd("inspect-schema", SCHEMAS / "customs_255.yaml", env={"COLUMNS": "240"})
    assert "customs_category" in result.stdout
    assert "255" in result.stdout


def test_inspect_schema_bad_schema(tmp_path, no_model):
    schema = tmp_path / "bad.yaml"
    schema.write_text("fields:\n  x: {type: enum, labels: [A]}\n")
    result = pcd("inspect-schema", schema, code=2)
    assert "'x'" in result.stderr and "at least two labels" in flat(result.stderr)


# -- atomic output ----------------------------------------------------------------------------

def test_failure_midway_leaves_no_output_and_resumes(tmp_path, monkeypatch, embedded_backend):
    from pcd_cli.api import Labeler
    from pcd_cli.engines.checkpoint import work_dir_for
    from pcd_cli.io.readers import InputSpec
    from pcd_cli.engines.local import label_file

    labeler = Labeler(AIRLINE, backend=embedded_backend)
    real = Labeler.label_batch
    calls = []

    def flaky(self, batch):
        calls.append([r.id for r in batch])
        if len(calls) == 2:
            raise RuntimeError("boom on batch 2")
        return real(self, batch)

    monkeypatch.setattr(Labeler, "label_batch", flaky)
    out = tmp_path / "out"
    out.mkdir()
    run = dict(output=out / "o.parquet", errors_path=out / "o.errors.jsonl", batch_records=2, chunk_records=2)
    with pytest.raises(RuntimeError, match="boom on batch 2"):
        label_file(labeler, DATA / "airline_tweets.jsonl", InputSpec(id_field="id", limit=5), **run)
    assert calls == [["air-0", "air-1"], ["air-2", "air-3"]]
    work = work_dir_for(out / "o.parquet")
    assert [p.name for p in out.iterdir()] == [work.name]  # no output, only the work folder
    assert sorted(p.name for p in work.iterdir()) == ["lock", "manifest.json", "part-000000.parquet"]

    # an earlier output survives a failed run untouched
    (out / "o.parquet").write_bytes(b"earlier")
    calls.clear()
    with pytest.raises(RuntimeError):
        label_file(labeler, DATA / "airline_tweets.jsonl", InputSpec(id_field="id", limit=5), resume=True, **run)
    assert calls == [["air-2", "air-3"], ["air-4"]]  # the first batch was kept; this run commits one more
    assert sorted(p.name for p in out.iterdir()) == sorted(["o.parquet", work.name])
    assert (out / "o.parquet").read_bytes() == b"earlier"

    # without the fault, --resume decodes only what is left and writes all rows in order
    monkeypatch.setattr(Labeler, "label_batch", lambda self, batch: calls.append([r.id for r in batch]) or
                        real(self, batch))
    calls.clear()
    stats = label_file(labeler, DATA / "airline_tweets.jsonl", InputSpec(id_field="id", limit=5), resume=True, **run)
    assert calls == [["air-4"]]
    assert (stats.records, stats.decoded, stats.failures) == (5, 1, 0)
    assert pq.read_table(out / "o.parquet").column("id").to_pylist() == [f"air-{i}" for i in range(5)]
    assert [p.name for p in out.iterdir()] == ["o.parquet"]


def test_output_that_is_a_folder_is_refused_before_labelling(tmp_path, no_model):
    result = pcd("label", DATA / "airline_tweets.jsonl", "-s", AIRLINE, "-o", tmp_path, code=2)
    message = flat(result.stderr)
    assert "is a folder; give a file name" in message
    assert "airline_tweets.labels.parquet" in message.replace(" ", "")  # rich may wrap the path


@pytest.mark.parametrize("template, problem", [("T: {text", "expected '}' before end of string"),
                                               ("T: {}", "name the columns in braces")])
def test_malformed_template_is_refused_before_labelling(tmp_path, no_model, template, problem):
    result = pcd("label", DATA / "airline_tweets.jsonl", "-s", AIRLINE, "--template", template, code=2)
    assert "--template" in result.stderr and problem in flat(result.stderr)


def test_jsonl_with_a_byte_order_mark(tmp_path):
    src = tmp_path / "bom.jsonl"
    src.write_bytes(b'\xef\xbb\xbf{"id": "a", "text": "great flight, thanks"}\n{"id": "b", "text": "lost my bag"}\n')
    pcd("label", src, "-s", AIRLINE, "--id-field", "id", "-o", tmp_path / "o.parquet")
    assert pq.read_table(tmp_path / "o.parquet").column("id").to_pylist() == ["a", "b"]
    assert not (tmp_path / "o.errors.jsonl").exists()


def test_bench_without_usable_records_says_why_before_loading_a_model(tmp_path):
    src = tmp_path / "tickets.jsonl"
    src.write_text('{"id": 1, "subject": "refund", "body": "charged twice"}\n')
    result = pcd("bench", "-s", AIRLINE, "-i", src, "--model", tmp_path / "no-such-model", code=2)
    assert "no usable record to benchmark (e.g. line 1: text field 'text' is missing or null)" in flat(result.stderr)


def test_bench_and_calibrate_take_csv_delimiter_and_check_columns_before_the_model(tmp_path):
    """The hint's --csv-delimiter exists on bench and calibrate too; with it the header is read
    right and the run goes on to the model (missing here: exit 3). Calibrate without a text
    column stops at the gold file (exit 2) before any model loads."""
    semi = tmp_path / "semi.csv"
    semi.write_text("id;text;sentiment\n1;great flight;POSITIVE\n")
    nowhere = tmp_path / "no-such-model"
    hint = pcd("bench", "-s", AIRLINE, "-i", semi, "--n", 1, "--model", nowhere, code=2)
    assert "pass --csv-delimiter ';'" in flat(hint.stderr)
    pcd("bench", "-s", AIRLINE, "-i", semi, "--n", 1, "--csv-delimiter", ";", "--model", nowhere, code=3)
    pcd("calibrate", semi, "-s", AIRLINE, "-o", tmp_path / "cal.json", "--csv-delimiter", ";", "--model", nowhere,
        code=3)
    notext = tmp_path / "notext.csv"
    notext.write_text("id,body,sentiment\n1,great flight,POSITIVE\n")
    result = pcd("calibrate", notext, "-s", AIRLINE, "-o", tmp_path / "cal.json", "--model", nowhere, code=2)
    assert "notext.csv': no column 'text' (columns: id, body, sentiment)" in flat(result.stderr)
