"""A calibration's decision rule (issue #44, ``pcd calibrate --objective``) is applied by the one
job: ``pcd label``, ``pcd label --engine ray`` and ``pcd serve``'s ``/v1/label`` write the same
labels from the same calibration file, the label the rule's (not the argmax), ``<f>__prob`` the
calibrated probability of that label, and the metadata naming the objective and the rule.

Runs on the tiny model and adapter of ``test_one_job`` (its ``tuned`` fixture), with the adapter's
own calibration plus a threshold rule chosen so that it writes other labels than argmax."""

from __future__ import annotations

import pytest

import json
from dataclasses import replace

import pyarrow.parquet as pq

from pcd_cli.quality import Calibration
from pcd_cli.quality.decision import DecisionRule

from .test_one_job import _label, _serve, tuned  # noqa: F401 - tuned is the module's fixture
from .test_ray_engine import assert_same


def _rule_file(root, table, path):
    """The adapter's calibration with a threshold on P(refund = true) that flips two rows off argmax."""
    p_true = sorted(dict(p)["true"] for p in table.column("refund__probs").to_pylist())
    argmax_true = sum(p >= 0.5 for p in p_true)
    t = (p_true[-2] + p_true[-3]) / 2 if argmax_true >= 4 else (p_true[1] + p_true[2]) / 2
    base = Calibration.load(root / "adapter" / "pcd-calibration.json")
    written_model = table.schema.metadata[b"pcd.model"].decode()
    fc = replace(base.fields["refund"], rule=DecisionRule("f1:true", ("true", "false"), threshold=t))
    replace(base, model=written_model, fields={"refund": fc}, objective="f1:true").save(path)
    return t


@pytest.mark.full  # 60 s here (Ray and a server); make test keeps test_one_job and the Ray readout file test
def test_label_ray_and_serve_write_the_rules_labels_from_one_calibration_file(tuned, tmp_path, monkeypatch,  # noqa: F811
                                                                             local_ray):
    first, _ = _label(tuned, tuned / "rows.jsonl", tmp_path / "plain.parquet", [])
    rule_path = tmp_path / "rule.json"
    t = _rule_file(tuned, first, rule_path)
    extra = ["--calibration", str(rule_path)]
    local, local_warnings = _label(tuned, tuned / "rows.jsonl", tmp_path / "local.parquet", extra)
    rows = local.to_pylist()
    p_true = [dict(r["refund__probs"])["true"] for r in rows]
    assert [r["refund"] for r in rows] == [p >= t for p in p_true]  # the rule's labels
    assert any((p >= t) != (p >= 0.5) for p in p_true)  # ... which are not argmax's
    for r, p in zip(rows, p_true):  # __prob: the calibrated probability of the label written
        assert r["refund__prob"] == (p if r["refund"] else dict(r["refund__probs"])["false"])
    meta = {k.decode(): v.decode() for k, v in local.schema.metadata.items()}
    assert meta["pcd.objective"] == "f1:true"
    assert json.loads(meta["pcd.decision_rules"]) == {"refund": {"objective": "f1:true", "threshold": t}}

    remote, ray_warnings = _label(tuned, tuned / "rows.jsonl", tmp_path / "ray.parquet", extra,
                                  engine=["--engine", "ray", "--batch-size", "3"])
    assert_same(local, remote)
    assert ray_warnings == local_warnings

    records = [json.loads(line) for line in (tuned / "rows.jsonl").read_text().splitlines()]
    body, _ = _serve(tuned, extra, monkeypatch, records)
    for row in rows:
        row["refund__probs"] = dict(row["refund__probs"])
    decided = ["id", "refund", "refund__prob", "refund__raw_prob", "refund__probs"]  # the columns the rule decides
    assert [{k: r[k] for k in decided} for r in body["rows"]] == [{k: r[k] for k in decided} for r in rows]
    for key in ("pcd.objective", "pcd.decision_rules", "pcd.calibration_sha256"):
        assert body["metadata"].get(key) == meta[key], key
    assert pq.read_table(tmp_path / "ray.parquet").schema.metadata[b"pcd.decision_rules"].decode() == \
        meta["pcd.decision_rules"]
