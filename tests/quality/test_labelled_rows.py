"""The store of labelled gold rows (``pcd_cli.quality.labelled_rows``): rows and features come back
exactly as written, only under the same job fingerprint, and an unreadable file is ignored."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa

from pcd_cli.quality.labelled_rows import LabelledRows, fingerprint


def _rows():
    schema = pa.schema([("refund", pa.bool_()), ("refund__prob", pa.float32()),
                        ("refund__probs", pa.list_(pa.struct([("label", pa.string()), ("prob", pa.float32())])))])
    table = pa.Table.from_pylist([
        {"refund": True, "refund__prob": 0.6163882613182068,
         "refund__probs": [{"label": "true", "prob": 0.6163882613182068}, {"label": "false", "prob": 0.38361176}]},
        {"refund": False, "refund__prob": 0.51, "refund__probs": [{"label": "true", "prob": 0.49},
                                                                  {"label": "false", "prob": 0.51}]}], schema=schema)
    rng = np.random.default_rng(0)
    features = [{"refund": {1: rng.normal(size=8), 2: rng.normal(size=8)}}, None]
    return table, features


def test_rows_and_features_come_back_exactly_under_the_same_fingerprint_only(tmp_path):
    table, features = _rows()
    parts = {"model": "a" * 64, "prompt": "b" * 64}
    key = fingerprint(parts, (1, 2), ["id", *table.column_names])
    store = LabelledRows(tmp_path / "s" / "rows.npz")
    store.write(key, ["k1", "k2"], table, features)
    back = store.read(key)
    assert back.keys == {"k1": 0, "k2": 1}
    assert back.table.equals(table)
    assert back.features[1] is None
    for layer in (1, 2):
        assert np.array_equal(back.features[0]["refund"][layer], features[0]["refund"][layer])
    # another model, other layers read or other columns: another fingerprint, nothing read
    assert store.read(fingerprint({**parts, "model": "c" * 64}, (1, 2), ["id", *table.column_names])) is None
    assert store.read(fingerprint(parts, (), ["id", *table.column_names])) is None
    assert store.read(fingerprint(parts, (1, 2), ["id", "refund"])) is None
    assert [p.name for p in (tmp_path / "s").iterdir()] == ["rows.npz"]  # no temporary file left


def test_an_unreadable_store_is_ignored_with_a_warning(tmp_path, caplog):
    path = tmp_path / "rows.npz"
    path.write_bytes(b"not an npz")
    with caplog.at_level(logging.WARNING, logger="pcd"):
        assert LabelledRows(path).read("k") is None
    assert "unreadable" in caplog.text and str(path) in caplog.text
    table, features = _rows()
    LabelledRows(path).write("k", ["k1", "k2"], table, features)
    path.write_bytes(path.read_bytes()[:200])  # cut short
    assert LabelledRows(path).read("k") is None
    assert LabelledRows(tmp_path / "none.npz").read("k") is None
