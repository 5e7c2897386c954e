"""An input without the text, id or template key pcd is told to read is refused before the model
loads (exit 2), JSONL as CSV and Parquet, and before Ray starts for ``--engine ray``; a key
present in any of the first rows passes.

From issue 28 item 7, "the first hour tells the truth" (formerly tests/test_first_hour.py).
"""

from __future__ import annotations

import json

import pytest

from ..helpers import AIRLINE, airline_schema, flat, pcd

SCHEMA = airline_schema()


@pytest.mark.parametrize("option, value, message", [
    ("--text-field", "body", "no key 'body' (the text field) in any of its first 3 JSON objects (keys: id, text, "
                             "sentiment)"),
    ("--id-field", "tweet_id", "no key 'tweet_id' (the id field) in any of its first 3 JSON objects"),
    ("--template", "Tweet: {tweet}", "no key 'tweet' (the template column) in any of its first 3 JSON objects"),
])
def test_jsonl_without_the_text_id_or_template_key_exits_2_before_the_model(tmp_path, option, value, message):
    """A nonexistent --model proves it: the input error (exit 2) comes first; with the right keys
    the same command reaches the model (exit 3)."""
    src = tmp_path / "tweets.jsonl"
    src.write_text("".join(json.dumps({"id": f"a{i}", "text": f"tweet {i}", "sentiment": "NEGATIVE"}) + "\n"
                           for i in range(3)))
    result = pcd("label", src, "-s", AIRLINE, option, value, "--model", tmp_path / "no-such-model",
                 "-o", tmp_path / "o.parquet", code=2)
    assert message in flat(result.stderr)
    assert not (tmp_path / "o.parquet").exists() and not (tmp_path / "o.errors.jsonl").exists()
    pcd("label", src, "-s", AIRLINE, "--id-field", "id", "--model", tmp_path / "no-such-model",
        "-o", tmp_path / "o.parquet", code=3)


def test_jsonl_key_in_a_later_first_row_passes_and_limit_bounds_the_rows_read(tmp_path):
    """A key present in any of the first rows passes (a row without it fails on its own, to the
    errors file); ``--limit 1`` reads one row, so a key only in row 2 is refused."""
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "note": "no text here"}\nnot json\n{"id": "b", "text": "hello"}\n')
    pcd("label", src, "-s", AIRLINE, "--id-field", "id", "--model", tmp_path / "none", "-o", tmp_path / "o.parquet",
        code=3)
    result = pcd("label", src, "-s", AIRLINE, "--id-field", "id", "--limit", "1", "--model", tmp_path / "none",
                 "-o", tmp_path / "o.parquet", code=2)
    assert "no key 'text' (the text field) in its only JSON object (keys: id, note)" in flat(result.stderr)


def test_ray_engine_refuses_a_jsonl_without_the_text_key_before_ray_starts(tmp_path):
    """The same preflight for every file of an --engine ray input (a folder here), before Ray."""
    from pcd_cli.engines.ray_engine import label_files
    from pcd_cli.errors import InputError
    from pcd_cli.io.readers import InputSpec

    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.jsonl").write_text('{"id": "a", "text": "fine"}\n')
    (folder / "b.jsonl").write_text('{"id": "b", "message": "the key is another"}\n')
    with pytest.raises(InputError, match=r"b\.jsonl': no key 'text' \(the text field\) in its only JSON object "
                                         r"\(keys: id, message\)"):
        label_files(folder, SCHEMA, InputSpec(id_field="id"), {}, output=tmp_path / "out", errors_path=tmp_path / "e")


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
@pytest.mark.parametrize("option, value, missing", [("--template", "{day}: {body}", "day"),
                                                    ("--id-field", "ident", "ident")])
def test_an_unknown_field_lists_the_columns_found_partition_columns_included(tmp_path, fmt, option, value, missing):
    """Under hive folders (``date=.../region=...``) an unknown --template or --id-field name lists
    the file's columns and the partition columns its path adds (issue #51 item 6), exit 2 before
    the model; the partition columns themselves are accepted."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    part = tmp_path / "exports" / "date=2026-12-05" / "region=eu"
    part.mkdir(parents=True)
    rows = [{"id": "a", "body": "late again"}, {"id": "b", "body": "fine"}]
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), part / "part-0.parquet")
        found = "columns: id, body"
    elif fmt == "jsonl":
        (part / "part-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        found = "keys: id, body"
    else:
        (part / "part-0.csv").write_text("id,body\na,late again\nb,fine\n")
        found = "columns: id, body"
    options = {"--template": "{date} {region}: {body}", "--id-field": "id"} | {option: value}
    args = [part for pair in options.items() for part in pair]
    result = pcd("label", tmp_path / "exports", "-s", AIRLINE, *args, "--model", tmp_path / "no-such-model",
                 "-o", tmp_path / "o.parquet", code=2)
    message = flat(result.stderr)
    assert f"part-0.{fmt}': no {'key' if fmt == 'jsonl' else 'column'} {missing!r}" in message
    assert f"({found}; partition columns: date, region)" in message, message
    logged = pcd("label", tmp_path / "exports", "-s", AIRLINE, *args, "--model", tmp_path / "no-such-model",
                 "-o", tmp_path / "o.parquet", "--log-format", "json", code=2)
    error = json.loads(logged.stderr.splitlines()[-1])  # the JSON error event carries the exit code
    assert (error["event"], error["exit_code"]) == ("error", 2) and "partition columns: date, region" in error["message"]
    pcd("label", tmp_path / "exports", "-s", AIRLINE, "--template", "{date} {region}: {body}", "--id-field", "id",
        "--model", tmp_path / "no-such-model", "-o", tmp_path / "o.parquet", code=3)  # the right names pass
