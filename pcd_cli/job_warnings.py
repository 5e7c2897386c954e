"""What a labelling job says without stopping: ``JobWarning`` values with a stable code, made by
the ``Labeler`` and the job runners, shown by each front-end its own way (``pcd_cli.job``)."""

from __future__ import annotations

from dataclasses import dataclass

#: ``JobWarning.code`` values, one per kind of warning a job can carry.
SCHEMA_WARNING = "schema"
ADAPTER_MISMATCH = "adapter_mismatch"
TUNE_MISMATCH = "tune_mismatch"
TUNED_CALIBRATION_SKIPPED = "tuned_calibration_skipped"
CALIBRATION_WORSE = "calibration_worse"
WEAK_LABEL_SET = "weak_label_set"
OUTPUT_NOT_PARQUET = "output_not_parquet"
#: a calibration or tune fitted in another dtype than this run's (applied: they differ by rounding)
DTYPE_MISMATCH = "dtype_mismatch"


@dataclass(frozen=True)
class JobWarning:
    """Something a user should know about a labelling job that does not stop it.

    Attributes:
        code: the kind (``SCHEMA_WARNING``, ``ADAPTER_MISMATCH``, ``TUNE_MISMATCH``,
            ``TUNED_CALIBRATION_SKIPPED``, ``CALIBRATION_WORSE``, ``WEAK_LABEL_SET``,
            ``OUTPUT_NOT_PARQUET``, ``DTYPE_MISMATCH``), stable for scripts and JSON logs.
        message: one line for a person, naming the field, folder or option concerned.
    """

    code: str
    message: str

    def to_dict(self) -> dict[str, str]:
        """``{"code", "message"}`` (JSON logs, ``GET /v1/schemas``)."""
        return {"code": self.code, "message": self.message}
