"""Label quality: metrics against human gold labels, and calibration fitted on them.

    >>> from pcd_cli.quality import evaluate, fit_calibration, read_gold, read_predictions
    >>> predictions, metadata = read_predictions("out/airline.labels.parquet")
    >>> gold = read_gold("sample_data/airline_tweets.jsonl")
    >>> report = evaluate(predictions, gold)                  # accuracy, macro-F1, ECE, ...
    >>> calibration, cv = fit_calibration(predictions, gold, None, metadata)
    >>> calibration.save("airline.calibration.json")

Modules: ``data`` (reading and matching by id), ``metrics`` (numpy formulas),
``evaluate`` (``EvalReport``), ``calibration`` (temperature + per-label bias), ``render``
(rich tables), ``plots`` (reliability diagrams; the ``plot`` extra), ``review`` (``pcd review``:
the rows to check as Label Studio / Argilla / spreadsheet files), ``annotations`` (their
exports read back as gold).
"""

from .calibration import (
                          Calibration,
                          CalibrationReport,
                          FieldCalibration,
                          FieldCalibrationReport,
                          Scores,
                          fit_calibration,
)
from .data import read_gold, read_predictions
from .evaluate import EvalReport, FieldReport, evaluate

__all__ = ["Calibration", "CalibrationReport", "EvalReport", "FieldCalibration", "FieldCalibrationReport",
           "FieldReport", "Scores", "evaluate", "fit_calibration", "read_gold", "read_predictions"]
