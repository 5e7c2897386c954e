"""Prior correction without gold labels (issue #18 item 2): against hand-computed values, and
the content-free priors measured by the decoder itself (tiny random model)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pcd_cli.api import Labeler
from pcd_cli.results import Record
from pcd_cli.errors import CalibrationError
from pcd_cli.decoding.prior import CONTENT_FREE, correct
from pcd_cli.schema.load import parse_schema

from ..helpers import tiny_backend

SCHEMA = parse_schema({"name": "s", "fields": {"tone": {"type": "enum", "labels": ["calm", "angry", "sad"]},
                                               "urgent": {"type": "boolean"}}})


def test_correct_divides_by_the_prior_and_renormalises():
    # p = (0.6, 0.3, 0.1), prior (0.5, 0.25, 0.25): (1.2, 1.2, 0.4) / 2.8
    assert correct([0.6, 0.3, 0.1], np.array([0.5, 0.25, 0.25])) == pytest.approx([1.2 / 2.8, 1.2 / 2.8, 0.4 / 2.8])
    assert correct([0.5, 0.25, 0.25], np.array([0.5, 0.25, 0.25])) == pytest.approx([1 / 3] * 3)  # content-free -> uniform
    assert correct(np.array([[0.9, 0.1], [0.2, 0.8]]), np.array([0.9, 0.1])).sum(axis=1) == pytest.approx([1, 1])


def test_labeler_measures_the_priors_on_content_free_records_and_applies_them():
    backend = tiny_backend(chat_template=True, seed=4)
    plain = Labeler(SCHEMA, backend=backend)
    corrected = Labeler(SCHEMA, backend=backend, prior_correction=True)
    assert corrected.forward_passes == 0  # the content-free records are not counted as the input's
    free = list(plain.label([Record(id=i, text=t) for i, t in enumerate(CONTENT_FREE)]))
    for i, f in enumerate(SCHEMA.fields):
        expected = np.mean([r.fields[i].probs for r in free], axis=0)
        assert corrected.priors[f.name] == pytest.approx(expected, abs=1e-9)
    assert json.loads(corrected.metadata()["pcd.prior_correction"])["tone"] == pytest.approx(
        corrected.priors["tone"], abs=1e-6)
    records = [Record(id=i, text=f"message {i} about the order") for i in range(6)]
    for raw, res in zip(plain.label(records), corrected.label(records)):
        for i, f in enumerate(SCHEMA.fields):
            want = correct(raw.fields[i].probs, corrected.priors[f.name])
            assert res.fields[i].probs == pytest.approx(tuple(want), abs=1e-9)
            assert res.fields[i].label == int(np.argmax(want)) and res.fields[i].mass == raw.fields[i].mass
    with pytest.raises(CalibrationError, match="--prior-correction and --calibration"):
        from pcd_cli.quality.calibration import Calibration

        Labeler(SCHEMA, backend=backend, prior_correction=True,
                calibration=Calibration("0", "m", "s", "h", "marginal", {}))
