"""The input cases of tests/data/cases-round2/ (issue #12; the chat-template cases are tested
elsewhere). Each runs ``pcd label`` as its ``cases.jsonl`` line says, on the embedded model,
through the CLI runner, and checks the behaviour the case states.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from .helpers import pcd

CASES_DIR = Path(__file__).with_name("data") / "cases-round2"
CASES = {c["id"]: c for c in map(json.loads, (CASES_DIR / "cases.jsonl").read_text().splitlines())}


def _pcd(*args, code: int = 0):
    return pcd("label", *args, code=code)


def _case(name: str, tmp_path: Path) -> Path:
    """A writable copy of the case's folder (outputs are written next to the input)."""
    assert name in CASES
    return Path(shutil.copytree(CASES_DIR / name, tmp_path / name))


def _jsonl(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def _contexts(trace: Path) -> dict[str, str]:
    """Record id -> the context of its first field's trace line (holds the record's text)."""
    out: dict[str, str] = {}
    for row in _jsonl(trace):
        out.setdefault(row["record"], row["context"])
    return out


def test_jsonl_unicode_line_separators(tmp_path):
    case = _case("jsonl-unicode-line-separators", tmp_path)
    _pcd(case / "input.jsonl", "-s", case / "schema.yaml", "--id-field", "id", "-o", case / "out.parquet",
         "--trace", case / "trace.jsonl")
    assert pq.read_table(case / "out.parquet").column("id").to_pylist() == ["r1", "r2", "r3", "r5"]
    errors = _jsonl(case / "out.errors.jsonl")
    assert [(e["row"], e["line"]) for e in errors] == [(3, 4)]
    contexts = _contexts(case / "trace.jsonl")
    assert "Great kettle\u2028boils fast" in contexts["r1"]
    assert "what it does\u2029I returned it." in contexts["r2"]
    assert "Arrived late\u0085but works fine." in contexts["r3"]
    assert "\r" not in contexts["r5"]  # CRLF line ends are not part of the record


def test_csv_utf8_bom_header(tmp_path):
    case = _case("csv-utf8-bom-header", tmp_path)
    assert (case / "input.csv").read_bytes().startswith(b"\xef\xbb\xbftext,")
    _pcd(case / "input.csv", "-s", case / "schema.yaml", "--id-field", "id", "-o", case / "out.parquet")
    table = pq.read_table(case / "out.parquet")
    assert table.column("id").to_pylist() == ["c1", "c2"]
    assert not (case / "out.errors.jsonl").exists()


def test_csv_quoted_multiline_line_numbers(tmp_path):
    case = _case("csv-quoted-multiline-line-numbers", tmp_path)
    _pcd(case / "input.csv", "-s", case / "schema.yaml", "--id-field", "id", "-o", case / "out.parquet",
         "--trace", case / "trace.jsonl")
    assert pq.read_table(case / "out.parquet").column("id").to_pylist() == ["m1", "m3"]
    (error,) = _jsonl(case / "out.errors.jsonl")
    assert (error["row"], error["line"], error["record"]) == (1, 5, None)
    assert error["error"] == "line 5: the CSV row has 3 fields; the header has 2"
    assert "First line of the review\nsecond line, still the same cell\nthird line" in _contexts(case / "trace.jsonl")["m1"]


def test_csv_semicolon_delimited_excel_export(tmp_path):
    case = _case("csv-semicolon-delimited-excel-export", tmp_path)
    base = (case / "input.csv", "-s", case / "schema.yaml", "--id-field", "id", "-o", case / "out.parquet")
    refused = _pcd(*base, "--log-format", "json", code=2)
    (event,) = [json.loads(line) for line in refused.stderr.splitlines()]
    assert event["level"] == "error"
    assert "no column 'text' (columns: id;text)" in event["message"]
    assert "';'-separated names: pass --csv-delimiter ';'" in event["message"]
    assert not (case / "out.parquet").exists() and not (case / "out.errors.jsonl").exists()
    _pcd(*base, "--csv-delimiter", ";", "--trace", case / "trace.jsonl")
    assert pq.read_table(case / "out.parquet").column("id").to_pylist() == ["s1", "s2"]
    assert "Nice pan; heats evenly, good price" in _contexts(case / "trace.jsonl")["s1"]


def test_non_string_text_values_cli_and_api_agree(tmp_path, embedded_backend):
    from pcd_cli import Labeler, RecordFailure
    from pcd_cli.schema.load import load_schema

    case = _case("non-string-text-values", tmp_path)
    _pcd(case / "input.jsonl", "-s", case / "schema.yaml", "--id-field", "id", "-o", case / "out.parquet",
         "--trace", case / "trace.jsonl")
    table = pq.read_table(case / "out.parquet").to_pydict()
    assert table["id"] == ["n1", "n2", "n3", "n6"]
    errors = {e["record"]: e["error"] for e in _jsonl(case / "out.errors.jsonl")}
    assert errors == {"n4": "line 4: text field 'text' is a list, not a string",
                      "n5": "line 5: text field 'text' is an object, not a string"}
    contexts = _contexts(case / "trace.jsonl")
    assert "Input:\n123<|im_end|>" in contexts["n1"] and "Input:\n4.5<|im_end|>" in contexts["n2"]
    assert "Input:\ntrue<|im_end|>" in contexts["n3"] and "True" not in contexts["n3"]

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


@pytest.mark.parametrize("edited", ["input.same_size_edit.jsonl", "input.rows_inserted.jsonl"])
def test_resume_after_input_edited(tmp_path, edited):
    case = _case("resume-after-input-edited", tmp_path)
    src, out = case / "input.jsonl", case / "B.parquet"
    args = (src, "-s", case / "schema.yaml", "--id-field", "id", "-o", out, "--batch-size", 1)
    _pcd(*args, "--max-errors", 0, code=1)  # e3 is broken: the run stops after the chunk holding it
    manifest = orjson.loads((case / ".B.parquet.pcd-work" / "manifest.json").read_bytes())
    done = manifest["progress"]["rows"]  # the chunk in flight (16 rows, not tied to --batch-size) is committed
    assert done >= 3 and manifest["progress"]["failures"] >= 1
    stat = src.stat()
    shutil.copyfile(case / edited, src)  # the export is rewritten ...
    os.utime(src, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # ... with its mtime kept (cp -p, rsync -t)
    resumed = _pcd(*args, "--resume", "--log-format", "json")
    events = [json.loads(line) for line in resumed.stderr.splitlines()]
    assert events[0]["event"] == "discarded"
    assert f"the input's first {done} rows are not those the unfinished run labelled" in events[0]["reason"]
    assert f"{done} rows were discarded and the run starts over" in events[0]["reason"]
    assert "resumed" not in [e["event"] for e in events]
    fresh = case / "fresh.parquet"
    _pcd(case / edited, "-s", case / "schema.yaml", "--id-field", "id", "-o", fresh, "--batch-size", 1)
    assert pq.read_table(out).to_pydict() == pq.read_table(fresh).to_pydict()  # no stale label spliced in
