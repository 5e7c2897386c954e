"""CSV files as spreadsheets and exports write them: a UTF-8 byte order mark before the header,
quoted cells over several lines (errors name the file's line, not the row), and a
semicolon-separated Excel export (refused before the model loads with the --csv-delimiter hint,
then read with it).

Each test runs the case folder of tests/data/cases-round2/ it names (issue #12; these were in
tests/test_cases_round2_inputs.py) with ``pcd label`` on the embedded model.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from pcd_cli.decoding.prompt import quote_record

from ..helpers import copy_case, jsonl_rows, pcd, trace_contexts


def test_csv_utf8_bom_header(tmp_path):
    case = copy_case("csv-utf8-bom-header", tmp_path)
    assert (case / "input.csv").read_bytes().startswith(b"\xef\xbb\xbftext,")
    pcd("label", case / "input.csv", "-s", case / "schema.yaml", "--id-field", "id", "-o", case / "out.parquet")
    table = pq.read_table(case / "out.parquet")
    assert table.column("id").to_pylist() == ["c1", "c2"]
    assert not (case / "out.errors.jsonl").exists()


def test_csv_quoted_multiline_line_numbers(tmp_path):
    case = copy_case("csv-quoted-multiline-line-numbers", tmp_path)
    pcd("label", case / "input.csv", "-s", case / "schema.yaml", "--id-field", "id", "-o", case / "out.parquet",
         "--trace", case / "trace.jsonl")
    assert pq.read_table(case / "out.parquet").column("id").to_pylist() == ["m1", "m3"]
    (error,) = jsonl_rows(case / "out.errors.jsonl")
    assert (error["row"], error["line"], error["record"]) == (1, 5, None)
    assert error["error"] == "line 5: the CSV row has 3 fields; the header has 2"
    # the cell's three lines reach the model whole, quoted as data (one JSON string: quote_record)
    assert quote_record("First line of the review\nsecond line, still the same cell\nthird line", "json") \
        in trace_contexts(case / "trace.jsonl")["m1"]


def test_csv_semicolon_delimited_excel_export(tmp_path):
    case = copy_case("csv-semicolon-delimited-excel-export", tmp_path)
    base = (case / "input.csv", "-s", case / "schema.yaml", "--id-field", "id", "-o", case / "out.parquet")
    refused = pcd("label", *base, "--log-format", "json", code=2)
    (event,) = [json.loads(line) for line in refused.stderr.splitlines()]
    assert event["level"] == "error"
    assert "no column 'text' (columns: id;text)" in event["message"]
    assert "';'-separated names: pass --csv-delimiter ';'" in event["message"]
    assert not (case / "out.parquet").exists() and not (case / "out.errors.jsonl").exists()
    pcd("label", *base, "--csv-delimiter", ";", "--trace", case / "trace.jsonl")
    assert pq.read_table(case / "out.parquet").column("id").to_pylist() == ["s1", "s2"]
    assert "Nice pan; heats evenly, good price" in trace_contexts(case / "trace.jsonl")["s1"]
