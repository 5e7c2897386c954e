"""``pcd label --reuse`` of earlier outputs as users leave them (issue 51, item 2): every kind of
hand edit of a cell, of a key, of a column's type and of the column order, and two earlier
outputs that disagree on a text. An edited row is decoded again and named in a warning; it never
crashes the run nor is copied; column order does not matter; the first ``--reuse`` given wins a
disagreement (docs/labelling.md, "Earlier outputs edited by hand")."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pcd_cli.api import Labeler
from pcd_cli.engines.local import label_file
from pcd_cli.engines.reuse import INPUT_KEY_COLUMN, read_sources
from pcd_cli.io.readers import InputSpec
from pcd_cli.schema.load import parse_schema

from ..helpers import airline_texts, tiny_backend, write_jsonl

#: every field type, nullable ones included
SCHEMA = parse_schema({"name": "types", "fields": {
    "product": {"type": "enum", "labels": ["APP", "WEB"], "nullable": True},
    "urgent": {"type": "boolean"},
    "refund": {"type": "boolean", "nullable": True},
    "topics": {"type": "multi", "labels": ["billing", "outage", "login"]},
    "severity": {"type": "ordinal", "labels": ["LOW", "MEDIUM", "HIGH"], "none_label": "UNKNOWN"},
    "stars": {"type": "integer", "minimum": 1, "maximum": 5, "nullable": True},
}})
SPEC = InputSpec(id_field="id")
N = 8
VALUES = [f.name for f in SCHEMA.declared]


@pytest.fixture(scope="module")
def labeler():
    return Labeler(SCHEMA, backend=tiny_backend(chat_template=True, seed=3))


@pytest.fixture(scope="module")
def earlier(labeler, tmp_path_factory):
    """Night 1 labelled fresh with ``--all-probs``: (input, output path, its table, texts)."""
    folder = tmp_path_factory.mktemp("edited")
    texts = airline_texts(N)
    src = write_jsonl(folder / "in.jsonl", [{"id": f"t{i}", "text": t} for i, t in enumerate(texts)])
    out = folder / "a.parquet"
    label_file(labeler, src, SPEC, output=out, errors_path=folder / "a.errors.jsonl", all_probs=True)
    return src, out, pq.read_table(out), texts


def _relabel(labeler, src, out, reuse, monkeypatch, *, all_probs=True):
    """Label ``src`` again with ``--reuse`` of ``reuse`` (paths): (stats, table, texts decoded,
    reuse warnings)."""
    decoded, events = [], []
    inner = labeler.label_batch

    def spy(batch):
        decoded.extend(r.text for r in batch if hasattr(r, "text"))
        return inner(batch)

    monkeypatch.setattr(labeler, "label_batch", spy)
    stats = label_file(labeler, src, SPEC, output=out, errors_path=out.with_suffix(".errors.jsonl"),
                       all_probs=all_probs, reuse=read_sources([str(p) for p in reuse]),
                       on_event=lambda name, fields, level="info": events.append((name, fields, level)))
    monkeypatch.setattr(labeler, "label_batch", inner)
    warnings = [f for name, f, level in events if name == "reuse" and level == "warning"]
    return stats, pq.read_table(out), decoded, warnings


def _set(table: pa.Table, column: str, row: int, value) -> pa.Table:
    cells = table.column(column).to_pylist()
    cells[row] = value
    i = table.schema.get_field_index(column)
    return table.set_column(i, table.schema.field(i), pa.array(cells, table.schema.field(i).type))


def _other(values, current):
    return next(v for v in values if v != current)


def _edits(a: pa.Table) -> list[tuple[str, int, object]]:
    """(what, edited row, edit: table -> table) for every kind of cell edit pcd can see."""
    rows = a.to_pylist()
    stars_in_range = lambda r: _other([1, 2, 3, 4, 5], rows[r]["stars"])  # noqa: E731
    topics_flipped = lambda r: (["billing"] if rows[r]["topics"] != ["billing"] else [])  # noqa: E731
    return [
        ("enum label outside the schema", 0, lambda t: _set(t, "product", 0, "Negative")),
        ("enum label edited to another schema label", 1,
         lambda t: _set(t, "product", 1, _other(["APP", "WEB"], rows[1]["product"]))),
        ("nullable enum edited to its null option", 2,
         lambda t: _set(t, "product", 2, None if rows[2]["product"] is not None else "APP")),
        ("boolean flipped", 3, lambda t: _set(t, "urgent", 3, not rows[3]["urgent"])),
        ("boolean emptied (not nullable)", 4, lambda t: _set(t, "urgent", 4, None)),
        ("nullable boolean edited", 5,
         lambda t: _set(t, "refund", 5, True if rows[5]["refund"] is not True else False)),
        ("multi option outside the schema", 6, lambda t: _set(t, "topics", 6, ["refunds"])),
        ("multi option repeated", 7, lambda t: _set(t, "topics", 7, ["billing", "billing"])),
        ("multi options out of order", 0, lambda t: _set(t, "topics", 0, ["login", "billing"])),
        ("multi option added or removed", 1, lambda t: _set(t, "topics", 1, topics_flipped(1))),
        ("multi emptied", 2, lambda t: _set(t, "topics", 2, None)),
        ("ordinal label outside the schema", 3, lambda t: _set(t, "severity", 3, "VERY HIGH")),
        ("ordinal edited to another label", 4,
         lambda t: _set(t, "severity", 4, _other(["LOW", "MEDIUM", "HIGH", "UNKNOWN"], rows[4]["severity"]))),
        ("integer out of range", 5, lambda t: _set(t, "stars", 5, 9)),
        ("integer edited within range", 6, lambda t: _set(t, "stars", 6, stars_in_range(6))),
        ("prob edited to junk", 7, lambda t: _set(t, "urgent__prob", 7, 7.5)),
        ("prob emptied", 0, lambda t: _set(t, "severity__prob", 0, None)),
        ("prob edited to another probability", 1,
         lambda t: _set(t, "product__prob", 1, 0.5 if abs(rows[1]["product__prob"] - 0.5) > 0.01 else 0.9)),
        ("mass NaN", 2, lambda t: _set(t, "stars__mass", 2, float("nan"))),
        ("mass negative", 3, lambda t: _set(t, "topics__mass", 3, -0.1)),
        ("probs map emptied", 4, lambda t: _set(t, "refund__probs", 4, None)),
        ("probs map with another label", 5,
         lambda t: _set(t, "urgent__probs", 5, [("yes", 0.5), ("no", 0.5)])),
        ("probs map value junk", 6,
         lambda t: _set(t, "product__probs", 6, [(k, 3.0) for k, _ in rows[6]["product__probs"]])),
        ("expected off the scale", 7, lambda t: _set(t, "stars__expected", 7, 42.0)),
        ("truncated emptied", 0, lambda t: _set(t, "__truncated", 0, None)),
        ("key edited to junk", 1, lambda t: _set(t, INPUT_KEY_COLUMN, 1, "not a sha")),
        ("key emptied", 2, lambda t: _set(t, INPUT_KEY_COLUMN, 2, None)),
    ]


def test_every_kind_of_hand_edit_is_decoded_again_and_named(labeler, earlier, tmp_path, monkeypatch):
    src, _, a, texts = earlier
    rows = a.to_pylist()
    for what, row, edit in _edits(a):
        path = tmp_path / "edited.parquet"
        pq.write_table(edit(a), path)
        stats, out, decoded, warnings = _relabel(labeler, src, tmp_path / "out.parquet", [path], monkeypatch)
        assert decoded == [texts[row]], what  # that row alone, decoded again
        assert (stats.reused, stats.records) == (N - 1, N), what
        assert [w["refused_rows"] for w in warnings] == [1], what
        assert warnings[0]["examples"][0].startswith(f"id 't{row}': "), (what, warnings)
        got = out.to_pylist()
        # every row as night 1 wrote it: the copies bit for bit, the decoded one within the packing bound
        for i, (r, g) in enumerate(zip(rows, got)):
            if i != row:
                assert r == g, what
            else:
                assert [g[c] for c in VALUES] == [r[c] for c in VALUES], what


def test_a_key_edited_to_another_rows_key_refuses_both_rows(labeler, earlier, tmp_path, monkeypatch):
    src, _, a, texts = earlier
    rows = a.to_pylist()
    pair = next((i, j) for i in range(N) for j in range(N)
                if i != j and [rows[i][c] for c in VALUES] != [rows[j][c] for c in VALUES])
    i, j = pair
    pq.write_table(_set(a, INPUT_KEY_COLUMN, i, rows[j][INPUT_KEY_COLUMN]), tmp_path / "key.parquet")
    stats, out, decoded, warnings = _relabel(labeler, src, tmp_path / "out.parquet", [tmp_path / "key.parquet"],
                                             monkeypatch)
    assert sorted(decoded) == sorted([texts[i], texts[j]]) and stats.reused == N - 2
    assert warnings[0]["refused_rows"] == 2 and "an edited key" in warnings[0]["message"]
    assert [[r[c] for c in VALUES] for r in out.to_pylist()] == [[r[c] for c in VALUES] for r in rows]


def test_column_order_and_lossless_type_changes_do_not_matter(labeler, earlier, tmp_path, monkeypatch):
    src, _, a, _ = earlier
    shuffled = a.select(list(np.random.default_rng(0).permutation(a.column_names)))
    widened = a.set_column(a.schema.get_field_index("urgent__prob"), "urgent__prob",
                           a.column("urgent__prob").cast(pa.float64()))
    widened = widened.set_column(widened.schema.get_field_index("product"), "product",
                                 widened.column("product").cast(pa.large_string()).dictionary_encode())
    for what, table in (("reordered", shuffled), ("reversed", a.select(a.column_names[::-1])),
                        ("widened types", widened)):
        pq.write_table(table, tmp_path / "t.parquet")
        stats, out, decoded, warnings = _relabel(labeler, src, tmp_path / "out.parquet", [tmp_path / "t.parquet"],
                                                 monkeypatch)
        assert (stats.reused, decoded, warnings) == (N, [], []), what
        assert out.to_pylist() == a.to_pylist(), what


def test_a_column_whose_type_cannot_be_cast_back_refuses_the_file_by_name(labeler, earlier, tmp_path, monkeypatch):
    src, _, a, texts = earlier
    i = a.schema.get_field_index("topics")  # a list of options written as its text, as a CSV round trip does
    as_text = pa.array([json.dumps(v) for v in a.column("topics").to_pylist()])
    pq.write_table(a.set_column(i, "topics", as_text), tmp_path / "s.parquet")
    stats, _, decoded, warnings = _relabel(labeler, src, tmp_path / "out.parquet", [tmp_path / "s.parquet"],
                                           monkeypatch)
    assert stats.reused == 0 and sorted(decoded) == sorted(texts)
    assert [w["message"] for w in warnings] == [
        f"--reuse {tmp_path / 's.parquet'}: its column 'topics' is string, not the {pa.list_(pa.string())} "
        "pcd writes (rewritten by another tool?): nothing reused"]


def test_two_sources_that_disagree_are_named_and_the_first_given_wins(labeler, earlier, tmp_path, monkeypatch):
    src, _, _, _ = earlier
    # without --all-probs a label edited to another schema label cannot be seen: a valid row
    label_file(labeler, src, SPEC, output=tmp_path / "a.parquet", errors_path=tmp_path / "a.errors.jsonl")
    a = pq.read_table(tmp_path / "a.parquet")
    flipped = not a.column("urgent")[1].as_py()
    pq.write_table(_set(a, "urgent", 1, flipped), tmp_path / "b.parquet")
    for order, winner in ((["b", "a"], flipped), (["a", "b"], not flipped)):
        paths = [tmp_path / f"{name}.parquet" for name in order]
        stats, out, decoded, warnings = _relabel(labeler, src, tmp_path / "out.parquet", paths, monkeypatch,
                                                 all_probs=False)
        assert (stats.reused, decoded) == (N, [])
        assert out.column("urgent")[1].as_py() is winner
        assert [(w["disagreements"], w["paths"]) for w in warnings] == [(1, sorted(map(str, paths)))]
        assert f"id 't1' of {paths[0]} vs id 't1' of {paths[1]}" in warnings[0]["message"]
        assert "the first given wins" in warnings[0]["message"]
        meta = json.loads(out.schema.metadata[b"pcd.reused"])
        assert meta == [{"path": str(paths[0]), "rows": N}]
