"""``--encoding-errors replace`` (issue #45 kind 5): one stray byte that is not UTF-8 failed its row
every night until the exporter was fixed. With ``replace`` such a byte reads as U+FFFD, the row is
labelled, and the run names the rows (warning and ``done`` event: ``replaced_rows``,
``replaced_row_lines``), resumed runs included; ``strict`` (the default) fails the row alone."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pcd_cli.api import Labeler
from pcd_cli.engines.local import label_file
from pcd_cli.errors import InputError, Interrupted
from pcd_cli.io.readers import InputSpec, RecordReader, ReplacedRow, read_table_rows
from pcd_cli.results import Record, RecordFailure
from pcd_cli.schema.load import parse_schema

from ..helpers import ORACLE_SCHEMA, pcd, save_tiny_model, tiny_backend

BAD = b"caf\xe9 au lait, ticket \xff"  # Latin-1 bytes in a UTF-8 export


def _jsonl(path: Path, n: int = 3, bad: tuple[int, ...] = (1,)) -> Path:
    lines = [b'{"id": "r%d", "text": "%s"}' % (i, BAD if i in bad else b"message %d" % i) for i in range(n)]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _csv(path: Path) -> Path:
    path.write_bytes(b"id,text\nr0,fine\nr1,\"" + BAD + b"\"\nr2,also fine\n")
    return path


def _records(path: Path, errors: str):
    reader = RecordReader(path, InputSpec(id_field="id", encoding_errors=errors))
    return [r for batch in reader for r in batch], reader.replaced


@pytest.mark.parametrize("make", [_jsonl, _csv])
def test_strict_fails_the_row_and_replace_reads_u_fffd_and_counts_it(tmp_path, make):
    src = make(tmp_path / ("in.jsonl" if make is _jsonl else "in.csv"))
    strict, none = _records(src, "strict")
    assert isinstance(strict[1], RecordFailure) and "not valid UTF-8" in strict[1].error and none.count == 0
    assert [type(r) for r in strict] == [Record, RecordFailure, Record]
    replaced, counted = _records(src, "replace")
    assert [type(r) for r in replaced] == [Record, Record, Record]
    assert replaced[1].text == "caf\ufffd au lait, ticket \ufffd"  # as bytes.decode("utf-8", "replace") reads them
    assert [r.text for r in replaced[::2]] == [r.text for r in strict[::2]]  # the other rows as before
    assert (counted.count, counted.lines) == (1, [3 if make is _csv else 2])  # the CSV header is line 1
    rows = [row for _, row in read_table_rows(src, InputSpec(encoding_errors="replace"))]
    assert [isinstance(r, ReplacedRow) for r in rows] == [False, True, False]


def test_a_bad_value_is_refused():
    with pytest.raises(InputError, match="--encoding-errors 'ignore': expected one of strict, replace"):
        InputSpec(encoding_errors="ignore")


def test_pcd_label_names_the_replaced_rows_and_strict_fails_them(tmp_path):
    model = tmp_path / "tiny"
    save_tiny_model(model)
    schema = tmp_path / "s.yaml"
    schema.write_text("fields:\n  urgent: {type: boolean}\n")
    src = _jsonl(tmp_path / "in.jsonl", 4, bad=(1, 3))
    base = ("label", src, "-s", schema, "--model", model, "--id-field", "id")
    strict = pcd(*base, "-o", tmp_path / "s.parquet")
    assert pq.read_table(tmp_path / "s.parquet").column("id").to_pylist() == ["r0", "r2"]
    assert "2 rows failed" in strict.stderr
    said = pcd(*base, "-o", tmp_path / "r.parquet", "--encoding-errors", "replace", env={"COLUMNS": "300"})
    assert pq.read_table(tmp_path / "r.parquet").column("id").to_pylist() == ["r0", "r1", "r2", "r3"]
    assert ("warning: 2 rows have bytes that are not valid UTF-8, read as U+FFFD (--encoding-errors replace): "
            "line 2, 4") in " ".join(said.stderr.split())
    logged = pcd(*base, "-o", tmp_path / "j.parquet", "--encoding-errors", "replace", "--log-format", "json", "-q")
    done = next(e for e in map(json.loads, logged.stderr.splitlines()) if e["event"] == "done")
    assert (done["replaced_rows"], done["replaced_row_lines"], done["failed"]) == (2, [2, 4], 0)
    plain = pcd(*base, "-o", tmp_path / "p.parquet", "--log-format", "json")
    assert "replaced_rows" not in next(e for e in map(json.loads, plain.stderr.splitlines()) if e["event"] == "done")
    refused = pcd(*base, "-o", tmp_path / "ray", "--engine", "ray", "--encoding-errors", "replace", code=2)
    assert "--encoding-errors replace applies to --engine local only" in " ".join(refused.stderr.split())


def test_a_resumed_run_still_names_the_rows_replaced_before_it(tmp_path):
    src = _jsonl(tmp_path / "in.jsonl", 20, bad=(3, 18))
    labeler = Labeler(parse_schema(ORACLE_SCHEMA), backend=tiny_backend(seed=2))
    spec = InputSpec(id_field="id", encoding_errors="replace")
    kw = dict(output=tmp_path / "o.parquet", errors_path=tmp_path / "o.errors.jsonl", progress=False,
              batch_records=4, chunk_records=4)
    polls = []
    with pytest.raises(Interrupted):
        label_file(labeler, src, spec, should_stop=lambda: polls.append(1) or len(polls) > 2, **kw)
    resumed = label_file(labeler, src, spec, resume=True, **kw)
    assert resumed.decoded < 20 and resumed.failures == 0
    assert (resumed.replaced.count, resumed.replaced.lines) == (2, [4, 19])


def test_review_and_eval_read_the_same_input_with_the_same_option(tmp_path):
    """The file ``pcd label --encoding-errors replace`` labelled is read back the same way by
    ``pcd review`` (its texts) and ``pcd eval`` (as gold), which name the replaced rows too."""
    model = tmp_path / "tiny"
    save_tiny_model(model)
    schema = tmp_path / "s.yaml"
    schema.write_text("fields:\n  urgent: {type: boolean}\n")
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'{"id": "r0", "text": "fine", "urgent": true}\n'
                    b'{"id": "r1", "text": "' + BAD + b'", "urgent": false}\n')
    out = tmp_path / "o.parquet"
    pcd("label", src, "-s", schema, "--model", model, "--id-field", "id", "-o", out, "--all-probs",
        "--encoding-errors", "replace")
    sheet = tmp_path / "r.csv"
    refused = pcd("review", out, src, "--to", "csv", "-o", sheet, code=2)
    assert "1 of the 2 rows to review have no record" in " ".join(refused.stderr.split())
    pcd("review", out, src, "--to", "csv", "-o", sheet, "--encoding-errors", "replace")
    assert "caf\ufffd au lait" in sheet.read_text(encoding="utf-8")
    strict = pcd("eval", out, src, code=2)
    assert "bytes that are not valid UTF-8" in " ".join(strict.stderr.split())
    pcd("eval", out, src, "--encoding-errors", "replace", "--json", tmp_path / "e.json")
    report = json.loads((tmp_path / "e.json").read_text())
    assert (report["gold_rows"], report["matched"]) == (2, 2)
    assert any(w.endswith("1 row has bytes that are not valid UTF-8, read as U+FFFD (--encoding-errors replace): "
                          "line 2; fix the export to label their text as written") for w in report["warnings"])
