"""Issue #28 item 4: label sets, rules and few rows agree.

- a written label is always inside its own conformal set: a label the rules write outside the
  set joins it (and ``--abstain-unless-single`` then abstains on that field);
- ``--coverage`` on too few gold rows for it is refused (exit 2, before any model loads),
  naming the rows needed; a file fitted that way is warned about at label time;
- the held rows the threshold was fitted on are covered when labelled again exactly as their
  fit scores say (no precision lost between fit and label).

Case: cases-round4/conformal-too-few-calibration-rows (inputs copied under tests/data)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pcd_cli.api import Labeler
from pcd_cli.errors import CalibrationError
from pcd_cli.quality import read_predictions
from pcd_cli.quality.calibration import fit_calibration
from pcd_cli.quality.conformal import (
    SCORE_TOLERANCE,
    ConformalSet,
    conformal_split,
    fit_conformal,
    gold_rows_needed,
    rows_needed,
    too_few_rows,
    weak_set_warnings,
)
from pcd_cli.results import FieldResult, RecordResult
from pcd_cli.schema.load import parse_schema
from pcd_cli.schema.rules import RuleSolver

from ..helpers import flat, pcd, tiny_backend

CASE = Path(__file__).parents[1] / "data" / "cases-round4" / "conformal-too-few-calibration-rows"
TONES = ("calm", "angry", "sad")


def test_case_calibrate_refuses_too_few_rows_for_the_coverage_before_the_model_loads(tmp_path):
    result = pcd("calibrate", CASE / "gold.jsonl", "-s", CASE / "schema.yaml", "--coverage", "0.9",
                 "-o", tmp_path / "cal.json", "--folds", "3", "--model", tmp_path / "no-such-model", code=2)
    message = flat(result.stderr)
    assert ("field 'sentiment': 6 held rows are too few for coverage 0.9 (at least 9 needed, so 18 gold rows, "
            "as half of them set the threshold): every label set would hold every label; ask for --coverage "
            "0.85 or less, or add gold rows") in message
    assert "threshold" not in result.stdout and not (tmp_path / "cal.json").exists()


def test_rows_needed_is_where_the_threshold_becomes_finite():
    for coverage, held, gold in ((0.5, 1, 2), (0.8, 4, 7), (0.9, 9, 18), (0.95, 19, 38), (0.99, 99, 198)):
        assert (rows_needed(coverage), gold_rows_needed(coverage)) == (held, gold)
        probs = np.full((held, 3), 1 / 3)
        probs[:, 0] = 0.8
        probs[:, 1:] = 0.1
        assert fit_conformal(probs, np.zeros(held, dtype=int), coverage).score_threshold < 1.0
        assert fit_conformal(probs[:-1], np.zeros(held - 1, dtype=int), coverage).score_threshold == 1.0
        assert too_few_rows("f", held, coverage) is None and too_few_rows("f", held - 1, coverage) is not None
        assert len(conformal_split(gold, seed=0)[1]) >= held > len(conformal_split(gold - 1, seed=0)[1])


def _predictions(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    schema = parse_schema({"name": "s", "fields": {"tone": {"type": "enum", "labels": list(TONES)}}})
    p = rng.dirichlet(np.ones(3), n)
    frame = pd.DataFrame({"id": [f"r{i}" for i in range(n)], "tone": [TONES[int(np.argmax(r))] for r in p],
                          "tone__prob": p.max(axis=1), "tone__mass": np.ones(n),
                          "tone__probs": [list(zip(TONES, row)) for row in p]})
    gold = pd.DataFrame({"id": frame["id"], "tone": [TONES[rng.choice(3, p=row)] for row in p]})
    meta = {"pcd.model": "m", "pcd.schema_sha256": schema.source_sha256, "pcd.prompt_head_sha256": "h",
            "pcd.scoring": "marginal"}
    return schema, frame, gold, meta


@pytest.mark.parametrize("rows, coverage, refused", [(12, 0.9, "6 held rows are too few for coverage 0.9"),
                                                     (12, 0.85, None), (30, 0.95, "15 held rows are too few for "
                                                                                  "coverage 0.95 (at least 19 "
                                                                                  "needed, so 38 gold rows"),
                                                     (38, 0.95, None), (7, 0.8, None)])
def test_fit_calibration_refuses_a_coverage_its_held_rows_cannot_give(rows, coverage, refused):
    schema, frame, gold, meta = _predictions(rows)
    if refused:
        with pytest.raises(CalibrationError, match=refused.replace("(", r"\(")):
            fit_calibration(frame, gold, schema, meta, folds=2, coverage=coverage)
    else:
        calibration, _ = fit_calibration(frame, gold, schema, meta, folds=2, coverage=coverage)
        c = calibration.fields["tone"].conformal
        assert c.n == round(rows / 2) >= rows_needed(coverage) and c.coverage == coverage


def test_a_file_fitted_on_too_few_rows_is_warned_about_when_labelling():
    class Fitted:  # a FieldCalibration's conformal, as an older pcd wrote it
        conformal = ConformalSet(0.9, 1.0, 6)

    assert weak_set_warnings({"sentiment": Fitted(), "ok": type("F", (), {"conformal": ConformalSet(0.8, 0.5, 9)})()}) \
        == ["field 'sentiment': its label sets were fitted on 6 held rows, too few for coverage 0.9 (at least 9 "
            "needed): every set holds every label, so --abstain-unless-single abstains on every row; fit again "
            "with more gold rows (pcd calibrate --coverage)"]


# -- rules and sets -----------------------------------------------------------------------------

RULED = {"name": "r", "fields": {"tone": {"type": "enum", "labels": list(TONES)}, "urgent": {"type": "boolean"}},
         "rules": [{"if": {"urgent": True}, "then": {"tone": "angry"}}]}


def _field(probs, label_set):
    label = int(np.argmax(probs))
    return FieldResult(label=label, value=None, prob=float(probs[label]), mass=1.0, probs=tuple(probs),
                       label_set=label_set)


def test_a_label_the_rules_write_outside_its_set_joins_the_set():
    schema = parse_schema(RULED)
    solver = RuleSolver(schema)
    # tone: calm 0.9 (set {calm}); urgent true 0.95: the rule writes angry, outside the set
    moved = solver.apply(RecordResult("a", (_field((0.9, 0.07, 0.03), (0,)), _field((0.95, 0.05), (0,)))))
    tone = moved.fields[0]
    assert (tone.label, tone.changed_by_rules, tone.label_set) == (1, True, (0, 1))
    assert tone.label in tone.label_set
    # a label the rules write inside the set leaves the set as it was
    kept = solver.apply(RecordResult("b", (_field((0.5, 0.45, 0.05), (0, 1)), _field((0.95, 0.05), (0,)))))
    assert (kept.fields[0].label, kept.fields[0].label_set) == (1, (0, 1))
    # without sets (no --coverage) nothing is added
    plain = solver.apply(RecordResult("c", (_field((0.9, 0.07, 0.03), None), _field((0.95, 0.05), None))))
    assert plain.fields[0].label_set is None and plain.fields[0].label == 1


def _gold_texts(n: int) -> list[dict]:
    return [{"id": f"r{i}", "text": f"message {i} " * (i % 5 + 1) + ("help now" if i % 3 == 0 else "")}
            for i in range(n)]


@pytest.fixture(scope="module")
def backend():
    return tiny_backend(chat_template=True, seed=2)


def test_written_labels_stay_in_their_sets_and_a_disagreement_abstains(backend):
    schema = parse_schema({**RULED, "rules": [{"if": {"urgent": True}, "then": {"tone": "angry"}},
                                              {"if": {"urgent": False}, "not": {"tone": "angry"}}]})
    rows = _gold_texts(40)
    frame = Labeler(schema, backend=backend).label_frame(pd.DataFrame(rows), id_field="id")
    rng = np.random.default_rng(1)
    gold = pd.DataFrame({"id": frame["id"], "tone": rng.choice(TONES, len(frame)),
                         "urgent": rng.choice([True, False], len(frame))})
    calibration, _ = fit_calibration(frame, gold, schema, frame.attrs["metadata"], folds=2, coverage=0.5)
    outside = 0
    for abstain in (False, True):
        labeler = Labeler(schema, backend=backend, calibration=calibration, abstain_unless_single=abstain)
        for result in labeler.label(rows):
            for f, res in zip(schema.fields, result.fields):
                assert res.label in res.label_set, (result.id, f.name)
                own = calibration.fields[f.name].conformal.label_set(
                    calibration.fields[f.name].apply(np.float32(res.raw_probs).astype(np.float64)))
                assert res.label_set[:len(own)] == own
                if res.label not in own:  # the rules wrote it outside the model's own set
                    outside += not abstain
                    assert res.changed_by_rules and res.label_set == (*own, res.label)
                assert res.abstained == (abstain and len(res.label_set) != 1)
                assert (res.value is None) == res.abstained
    assert outside > 0  # the case the rules create is exercised


def test_held_rows_are_covered_when_labelled_again_as_their_fit_scores_say(backend):
    schema = parse_schema({"name": "t", "fields": {"tone": {"type": "enum", "labels": list(TONES)}}})
    rows = _gold_texts(60)
    frame = Labeler(schema, backend=backend).label_frame(pd.DataFrame(rows), id_field="id")
    rng = np.random.default_rng(3)
    gold = pd.DataFrame({"id": frame["id"], "tone": rng.choice(TONES, len(frame))})
    for coverage in (0.6, 0.8):
        calibration, _ = fit_calibration(frame, gold, schema, frame.attrs["metadata"], folds=2, coverage=coverage)
        fc = calibration.fields["tone"]
        q, n = fc.conformal.score_threshold, fc.conformal.n
        _, held = conformal_split(len(frame), seed=0)
        probs = np.array([[dict(c)[t] for t in TONES] for c in frame["tone__probs"]])
        gold_index = np.array([TONES.index(g) for g in gold["tone"]])
        fit_scores = 1 - fc.apply(probs[held])[np.arange(n), gold_index[held]]
        assert int((fit_scores <= q).sum()) >= math.ceil((n + 1) * coverage)  # the rank-th score is q itself
        relabelled = list(Labeler(schema, backend=backend, calibration=calibration).label(
            [rows[i] for i in held]))
        # read in another batch, a row's float32 probabilities move a little (~1e-6): SCORE_TOLERANCE
        noise = max(np.abs(np.array(r.fields[0].raw_probs) - probs[i]).max() for i, r in zip(held, relabelled))
        assert 0 < noise < SCORE_TOLERANCE
        covered = [gold_index[i] in r.fields[0].label_set for i, r in zip(held, relabelled)]
        assert covered == [bool(s <= q) or int(np.argmax(fc.apply(probs[i]))) == gold_index[i]
                           for i, s in zip(held, fit_scores)]
        assert sum(covered) >= math.ceil((n + 1) * coverage)


def test_the_sets_pcd_label_writes_are_those_of_the_output_it_read(tmp_path, backend):
    """Fit from a written output (``--predictions``), label again to a file: same sets."""
    from pcd_cli.engines.local import label_file
    from pcd_cli.io.readers import InputSpec

    schema = parse_schema({"name": "t", "fields": {"tone": {"type": "enum", "labels": list(TONES)}}})
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in _gold_texts(30)))
    label_file(Labeler(schema, backend=backend), src, InputSpec(id_field="id"), output=tmp_path / "raw.parquet",
               errors_path=tmp_path / "e.jsonl", all_probs=True)
    raw, meta = read_predictions(tmp_path / "raw.parquet")
    gold = pd.DataFrame({"id": raw["id"], "tone": np.random.default_rng(5).choice(TONES, len(raw))})
    calibration, _ = fit_calibration(raw, gold, schema, meta, folds=2, coverage=0.7)
    fc = calibration.fields["tone"]
    label_file(Labeler(schema, backend=backend, calibration=calibration), src, InputSpec(id_field="id"),
               output=tmp_path / "cal.parquet", errors_path=tmp_path / "e.jsonl", all_probs=True)
    out, _ = read_predictions(tmp_path / "cal.parquet")
    for cell, written in zip(raw["tone__probs"], out["tone__set"]):
        probs = fc.apply(np.array([dict(cell)[t] for t in TONES]))
        assert [TONES[j] for j in fc.conformal.label_set(probs)] == list(written)


def test_a_held_row_read_again_with_float32_noise_stays_covered():
    """The row whose score is the threshold, its probabilities moved by float32 noise (as another
    batch gives them), is still covered: scores within SCORE_TOLERANCE of q count as within it."""
    rng = np.random.default_rng(7)
    probs = rng.dirichlet(np.ones(3), 40)
    gold = np.array([rng.choice(3, p=row) for row in probs])
    c = fit_conformal(probs, gold, 0.8)
    edge = int(np.argmin(np.abs(1 - probs[np.arange(40), gold] - c.score_threshold)))
    assert 1 - probs[edge, gold[edge]] == c.score_threshold and gold[edge] != int(np.argmax(probs[edge]))
    for shift in (3e-7, 3e-6):  # the gold label a little less probable, the others a little more
        moved = probs[edge].copy()
        moved[gold[edge]] -= abs(shift)
        moved[[j for j in range(3) if j != gold[edge]]] += abs(shift) / 2
        assert gold[edge] in c.label_set(moved)
    far = probs[edge].copy()
    far[gold[edge]] -= 1e-4
    far[[j for j in range(3) if j != gold[edge]]] += 0.5e-4
    assert gold[edge] not in c.label_set(far)
