"""A name given twice in an input is never resolved silently: a CSV header naming a column twice
exits 2 before the model loads, a Parquet file with a repeated column is refused, and a JSONL
object repeating a key pcd reads fails that row only (schema files: tests/schema/test_schema.py).

The inputs are the case csv-duplicate-header-columns of tests/data/cases-round3/ (issue #20;
formerly tests/test_cases_round3.py).
"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pcd_cli.errors import InputError
from pcd_cli.io.readers import InputSpec, RecordReader

from ..helpers import pcd

CASE = Path(__file__).parents[1] / "data" / "cases-round3" / "csv-duplicate-header-columns"


def _label(*args):
    return pcd("label", *args, code=None)


@pytest.mark.parametrize("name, column, positions", [("input.csv", "text", "columns 2 and 4"),
                                                     ("input-dup-id.csv", "id", "columns 1 and 3")])
def test_a_csv_header_naming_a_column_twice_exits_2_before_the_model_loads(tmp_path, name, column, positions):
    started = time.perf_counter()
    result = _label(CASE / name, "-s", CASE / "schema.yaml", "--id-field", "id", "-o", tmp_path / "o.parquet")
    assert result.exit_code == 2
    assert f"column {column!r} appears twice in the CSV header ({positions}); rename one" in " ".join(result.output.split())
    assert time.perf_counter() - started < 5  # no model was loaded
    assert not (tmp_path / "o.parquet").exists()


def test_a_parquet_file_with_a_repeated_column_is_refused(tmp_path):
    table = pa.Table.from_arrays([pa.array(["a"]), pa.array(["hello"]), pa.array(["note"])], names=["id", "text", "text"])
    pq.write_table(table, tmp_path / "dup.parquet")
    with pytest.raises(InputError, match=r"column 'text' appears twice in the Parquet schema \(columns 2 and 3\)"):
        list(RecordReader(tmp_path / "dup.parquet", InputSpec(id_field="id")))


def test_a_jsonl_object_repeating_a_read_key_fails_that_row_only(tmp_path):
    rows = (CASE / "input-dup-key.jsonl").read_text() + '{"id": "ok-1", "text": "a fine row", "note": 1}\n'
    (tmp_path / "in.jsonl").write_text(rows)
    items = [i for batch in RecordReader(tmp_path / "in.jsonl", InputSpec(id_field="id")) for i in batch]
    n_dup = len((CASE / "input-dup-key.jsonl").read_text().splitlines())
    assert [type(i).__name__ for i in items] == ["RecordFailure"] * n_dup + ["Record"]
    assert "key 'text' appears twice in the JSON object (keys 2 and 4)" in items[0].error
    assert items[-1].text == "a fine row"
    # a key pcd does not read may repeat (it is not used); the row is labelled
    (tmp_path / "other.jsonl").write_text('{"id": "x", "text": "hi", "n": 1, "n": 2}\n')
    items = [i for b in RecordReader(tmp_path / "other.jsonl", InputSpec(id_field="id")) for i in b]
    assert type(items[0]).__name__ == "Record"
