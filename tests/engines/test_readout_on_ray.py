"""A calibration with a linear readout (issue #50) applied by ``pcd label --engine ray`` as by the
local engine: a record's readout label, ``<f>__prob`` and ``<f>__probs`` the same, the output
metadata naming the readout; and the calibration's content travels with the job
(``LabelJob.for_workers``), so the file need not exist where the workers run.

On the tiny random model and a local Ray (``test_ray_engine``'s fixtures); the readout's numbers are
drawn at random over the model's real hidden width (its fit is tests/quality/test_readout.py's)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from .test_ray_engine import _local, _ray, assert_same, files  # noqa: F401 - files is the module's fixture

READOUT_FIELDS = ("urgent", "deadline")


@pytest.fixture(scope="module")
def readout_file(files):  # noqa: F811
    """A calibration for the tiny model and the oracle schema whose ``urgent`` and ``deadline``
    fields hold a linear readout of layer 2 (random weights: labels that are not the model's argmax)."""
    from pcd_cli.api import Labeler
    from pcd_cli.quality.calibration import Calibration, FieldCalibration, fitted_for
    from pcd_cli.quality.readout import Readout

    labeler = Labeler(files["schema"], model=files["model"], device="cpu")
    meta = labeler.metadata()
    width = 64 * 1  # the tiny model's hidden size, one layer
    rng = np.random.default_rng(3)
    fields = {}
    for name in READOUT_FIELDS:
        labels = tuple(next(f for f in labeler.schema.fields if f.name == name).labels)
        k = len(labels)
        readout = Readout((2,), labels, tuple(range(k)), np.zeros(width), np.ones(width),
                          rng.normal(scale=2.0, size=(k, width)), np.zeros(k))
        fields[name] = FieldCalibration(name, labels, 1.0, tuple([0.0] * k), 40, readout=readout)
    path = files["root"] / "readout-cal.json"
    Calibration("x", meta["pcd.model"], meta["pcd.schema_sha256"], meta["pcd.prompt_head_sha256"],
                meta["pcd.scoring"], fields, fitted_for=fitted_for(meta)).save(path)
    return path


@pytest.mark.full  # a minute on a shared CPU: three runs; the label_dataset test below stays in make test
def test_ray_writes_the_readouts_labels_and_probabilities_as_the_local_engine(local_ray, files, readout_file,  # noqa: F811
                                                                            tmp_path):
    extra = ["--id-field", "id", "--calibration", str(readout_file)]
    plain = _local(files, files["jsonl"], tmp_path / "plain.parquet", ["--id-field", "id"]).to_pylist()
    local = _local(files, files["jsonl"], tmp_path / "local.parquet", extra)
    _ray(files, files["jsonl"], tmp_path / "ray.parquet", 2, extra)
    remote = pq.read_table(tmp_path / "ray.parquet")
    assert_same(local, remote)  # labels equal, __prob and __probs to 1e-5, the same metadata
    readout = json.loads(remote.schema.metadata[b"pcd.readout"])
    assert set(readout) == set(READOUT_FIELDS) and readout["urgent"]["kind"] == "linear"
    rows = remote.to_pylist()
    for row in rows:  # __prob: the readout's probability of the label written
        for name in READOUT_FIELDS:
            probs = dict(row[f"{name}__probs"])
            assert row[f"{name}__prob"] == pytest.approx(probs[json.dumps(row[name]) if isinstance(row[name], bool) else row[name]], abs=1e-6)
    # the readout decided: some labels are not the model's own
    assert any(r[n] != p[n] for r, p in zip(rows, plain) for n in READOUT_FIELDS)


def test_label_dataset_carries_the_calibration_not_its_path(local_ray, files, readout_file, tmp_path):  # noqa: F811
    import ray

    from pcd_cli.engines.ray_engine import label_dataset

    local = {r["id"]: r for r in _local(files, files["jsonl"], tmp_path / "local.parquet",
                                        ["--id-field", "id", "--calibration", str(readout_file)]).to_pylist()}
    moved = tmp_path / "elsewhere.json"
    rows = [json.loads(line) for line in files["jsonl"].read_text().splitlines()][:4]
    ds = label_dataset(ray.data.from_items(rows), files["schema"], id_field="id", model=files["model"],
                       device="cpu", calibration=str(readout_file), batch_size=2)
    readout_file.rename(moved)  # the workers start after this: the file is not where the job named it
    try:
        got = ds.take_all()
    finally:
        moved.rename(readout_file)
    assert sorted(r["id"] for r in got) == [r["id"] for r in rows]
    for row in got:
        assert row["__error"] is None
        for name in READOUT_FIELDS:
            assert row[name] == local[row["id"]][name]
            assert row[f"{name}__prob"] == pytest.approx(local[row["id"]][f"{name}__prob"], abs=1e-5)
