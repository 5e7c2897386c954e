"""Calibration: per field a temperature T and one bias per label on the log-probabilities.

    p'_j = softmax_j( log(max(p_j, 1e-12)) / T + b_j )

fitted on labelled rows by minimising the mean negative log-likelihood of the gold labels
plus ``l2 * sum_j b_j^2`` (temperature scaling, Guo et al. 2017, with per-class biases as
in "vector scaling" restricted to a shared slope). In ``a = 1/T`` and ``b`` the objective is
convex (a log-sum-exp of affine functions); it is minimised with scipy's L-BFGS-B and the
analytic gradient. The biases are defined up to a common shift; the penalty makes them sum
to zero.

A probability of exactly 0 (float32 underflow) is floored at 1e-12 before the log, so it may
become small but non-zero after calibration; the decoder never gives a structural zero.

A ``Calibration`` is tied to the model, schema, prompt head and scoring mode it was fitted
for (``check``), and is saved as JSON (shape in docs/quality.md). It names the objective it
was fitted for (``pcd calibrate --objective``): with any but ``likelihood`` each field also
holds a decision rule (``pcd_cli.quality.decision``) that chooses the label written from the
calibrated probabilities (``FieldCalibration.decide``).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, replace
from dataclasses import field as dc_field
from pathlib import Path

import numpy as np
import orjson
import pandas as pd

from ..errors import CalibrationError, InputError
from ..io.files import check_writable, write_atomic
from ..job_fingerprint import CALIBRATION_PART_FIXES, CALIBRATION_PARTS, MODEL_PARTS_KEY, short
from ..schema.model import Schema
from ..version import __version__
from . import metrics as M
from .conformal import CONFORMAL_SHARE, ConformalSet, conformal_split, fit_conformal, too_few_rows
from .data import (FieldData, FieldSpec, MultiFieldData, field_specs, gold_label_index, gold_options, join,
                   resolve_gold_columns)
from .decision import (LIKELIHOOD, DecisionRule, Objective, applies_to, constant_problem, fit_problem, fit_rule,
                       parse_objective, rule_warnings)
from .folds import group_index, grouped_folds
from .readout import Readout, fit_readout

#: Default L2 penalty on the biases (added to the mean NLL).
DEFAULT_L2 = 1e-3
#: ``Calibration`` attribute <- output metadata key, compared by ``Calibration.check``.
CHECKED_KEYS = {"model": "pcd.model", "schema_sha256": "pcd.schema_sha256",
                "prompt_head_sha256": "pcd.prompt_head_sha256", "scoring": "pcd.scoring"}
FILE_FORMAT = "pcd-calibration"
#: The version this pcd writes: 2 records ``fitted_for`` (the model's parts by content); 1 (no
#: ``fitted_for``: checked by the names of ``CHECKED_KEYS``) still loads.
FILE_FORMAT_VERSION = 2
READ_FORMAT_VERSIONS = (1, 2)
#: Bounds of the temperature the fit may choose.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-3, 1e3


def calibrate_logits(probs: np.ndarray, temperature: float, biases: np.ndarray) -> np.ndarray:
    """``log(max(p, 1e-12)) / T + b``: (..., k) calibrated logits."""
    return np.log(np.maximum(np.asarray(probs, dtype=np.float64), M.PROB_FLOOR)) / temperature + biases


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


@dataclass(frozen=True)
class FieldCalibration:
    """One field's calibration.

    Attributes:
        field: the field name. labels: its labels, in schema order (the order of ``biases``).
        temperature: T > 0 (T > 1 softens over-confident probabilities).
        biases: one additive bias per label on the tempered log-probabilities.
        n: rows it was fitted on.
        cv: cross-validated metrics: ``{"folds", "seed", "n", "before": {...}, "after": {...}}``
            with ``accuracy``, ``macro_f1``, ``ece``, ``nll`` each (docs/quality.md).
        conformal: the label-set threshold (``pcd calibrate --coverage``), or ``None``.
        rule: the decision rule choosing the label from the calibrated probabilities
            (``pcd calibrate --objective``), or ``None``: the argmax.
        readout: the field's linear readout of the model's hidden state (``pcd calibrate
            --readout linear``, ``pcd_cli.quality.readout``), or ``None``. When set it gives the
            field's probabilities in place of ``apply`` (the decoder applies it in the wave),
            and ``rule`` acts on its probabilities.
    """

    field: str
    labels: tuple[str, ...]
    temperature: float
    biases: tuple[float, ...]
    n: int
    cv: dict = dc_field(default_factory=dict, compare=False, hash=False)
    conformal: ConformalSet | None = None
    rule: DecisionRule | None = None
    readout: Readout | None = None

    def fingerprint(self) -> list:
        """What this field's values depend on in the file, without its held-out figures (``cv``,
        the rule's ``cv``): labels, temperature, biases, label-set threshold, rule (a field's part
        of the per-field reuse key, ``pcd_cli.job_fingerprint.field_parts``), and the linear
        readout (``--readout linear``) when there is one."""
        return [list(self.labels), self.temperature, list(self.biases),
                None if self.conformal is None else self.conformal.to_dict(),
                None if self.rule is None else {k: v for k, v in self.rule.to_dict().items() if k != "cv"}] + \
            ([{k: v for k, v in self.readout.to_dict().items() if k != "cv"}] if self.readout is not None else [])

    def decide(self, probs: np.ndarray) -> int:
        """The label index written for (k,) calibrated probabilities (``apply``'s output): the
        rule's choice, or the argmax without a rule. The one definition every front-end applies
        (``pcd_cli.api.Labeler``)."""
        if not self.by_rule:
            return int(np.argmax(probs))
        return int(self.rule.decide(np.asarray(probs, dtype=np.float64)))

    @property
    def by_rule(self) -> bool:
        """Whether a decision rule chooses the label: a rule that is not argmax kept in its place
        (``DecisionRule.kept_argmax``: the field is decided as without a rule)."""
        return self.rule is not None and not self.rule.kept_argmax

    def apply(self, probs: np.ndarray) -> np.ndarray:
        """Calibrated probabilities: (k,) or (n, k) in, same shape out (float64, rows sum to 1).

        Raises:
            ValueError: the last axis is not ``len(labels)`` long.
        """
        probs = np.asarray(probs, dtype=np.float64)
        if probs.ndim not in (1, 2) or probs.shape[-1] != len(self.labels):
            raise ValueError(f"field {self.field!r}: expected probabilities of shape (k,) or (n, k) with "
                             f"k = {len(self.labels)}, got {probs.shape}")
        return softmax(calibrate_logits(probs, self.temperature, np.asarray(self.biases)))


@dataclass(frozen=True)
class Calibration:
    """Calibrations of a schema's fields for one model, prompt head and scoring mode.

    Attributes:
        pcd_version: pcd version that fitted it.
        model, schema_sha256, prompt_head_sha256, scoring: what it is valid for (the output
            metadata keys ``pcd.model`` ... of ``Labeler.metadata()``).
        fields: field name -> ``FieldCalibration``; fields without gold labels are absent
            (their probabilities stay as decoded).
        sha256: sha256 of the file's bytes (``''`` before saving).
        dtype: the dtype of the predictions it was fitted on (``pcd.dtype``; ``''``: not recorded,
            files before issue #38); another dtype is named, not refused (``dtype_warnings``).
        objective: what the labels written are chosen for (``pcd calibrate --objective``):
            ``likelihood`` (the argmax; files before issue #44) or the objective of the fields'
            decision rules (``FieldCalibration.rule``).
        fitted_for: the model parts it was fitted for, by content (``CALIBRATION_PARTS`` of
            ``pcd_cli.job_fingerprint.model_parts``: weights, tokenizer and chat template, adapter,
            schema, the rendered prompt, scoring), checked on load against the run's; empty in
            files of format 1 (checked by name then).
    """

    pcd_version: str
    model: str
    schema_sha256: str
    prompt_head_sha256: str
    scoring: str
    fields: dict[str, FieldCalibration]
    sha256: str = ""
    dtype: str = ""
    objective: str = "likelihood"
    fitted_for: dict = dc_field(default_factory=dict)

    def rules(self) -> dict[str, dict]:
        """Field -> its decision rule's ``to_dict()`` without the held-out figures (the output
        metadata ``pcd.decision_rules``); empty without rules. A field that kept argmax
        (``FieldCalibration.by_rule`` false) is not listed: no rule decides it."""
        return {name: {k: v for k, v in fc.rule.to_dict().items() if k != "cv"}
                for name, fc in self.fields.items() if fc.by_rule}

    def readouts(self) -> dict[str, dict]:
        """Field -> its readout's layers (every regression's), regressions (each one's layers and
        strength ``C``), absent labels and cross-validated figures (the output metadata
        ``pcd.readout``); empty without readouts."""
        return {name: {"kind": "linear", "layers": list(fc.readout.read_layers),
                       "regressions": [{"layers": list(r.layers), "C": r.C} for r in fc.readout.regressions],
                       "absent": list(fc.readout.absent),
                       "cv": {k: v for k, v in fc.readout.cv.items() if k != "chosen"}}
                for name, fc in self.fields.items() if fc.readout is not None}

    def dtype_warnings(self, metadata: dict[str, str]) -> list[str]:
        """One line when this calibration was fitted on predictions of another dtype than the
        run's (``pcd.dtype`` of ``metadata``); empty when either is not recorded."""
        run = metadata.get("pcd.dtype", "")
        if not self.dtype or not run or run == self.dtype:
            return []
        return [f"the calibration was fitted on {self.dtype} predictions and this run decodes in {run}: "
                "probabilities differ by rounding (pcd bench shows how much); refit it with pcd calibrate on "
                f"{run} predictions, or run with --dtype {self.dtype}"]

    def to_json(self) -> bytes:
        """The file's bytes (indented JSON, keys in a fixed order)."""
        doc = {
            "format": FILE_FORMAT, "format_version": FILE_FORMAT_VERSION, "pcd_version": self.pcd_version,
            "model": self.model, "schema_sha256": self.schema_sha256,
            "prompt_head_sha256": self.prompt_head_sha256, "scoring": self.scoring,
            **({"dtype": self.dtype} if self.dtype else {}), "objective": self.objective,
            **({"fitted_for": dict(self.fitted_for)} if self.fitted_for else {}),
            "fields": {name: {"labels": list(fc.labels), "temperature": fc.temperature,
                              "biases": dict(zip(fc.labels, fc.biases)), "n": fc.n, "cv": fc.cv}
                       | ({"conformal": fc.conformal.to_dict()} if fc.conformal is not None else {})
                       | ({"rule": fc.rule.to_dict()} if fc.rule is not None else {})
                       | ({"readout": fc.readout.to_dict()} if fc.readout is not None else {})
                       for name, fc in self.fields.items()},
        }
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n"

    def save(self, path: str | Path) -> "Calibration":
        """Write the file atomically (temp file, fsync, rename; through a symlink to its target:
        ``pcd_cli.io.files``); returns a copy with ``sha256`` set.

        Raises:
            MachineError: the file cannot be written (exit 5); an earlier file stays as it was.
        """
        data = self.to_json()
        write_atomic(path, data)
        return replace(self, sha256=hashlib.sha256(data).hexdigest())

    @classmethod
    def load(cls, path: str | Path) -> "Calibration":
        """Read and validate a calibration file.

        Raises:
            CalibrationError: missing or unreadable file, not JSON, a missing or ill-typed key
                (named), biases that do not match the labels, a temperature not > 0.
        """
        path = Path(path)
        where = repr(str(path))
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise CalibrationError(f"{where}: cannot read the calibration file ({exc.strerror})") from None
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise CalibrationError(f"{where}: not a calibration file (not JSON: {exc})") from None
        if not isinstance(doc, dict) or doc.get("format") != FILE_FORMAT:
            raise CalibrationError(f"{where}: not a calibration file (no \"format\": \"{FILE_FORMAT}\"); "
                                   "make one with pcd calibrate")
        if doc.get("format_version") not in READ_FORMAT_VERSIONS:
            raise CalibrationError(f"{where}: format_version {doc.get('format_version')!r}; this pcd reads "
                                   f"{' and '.join(map(str, READ_FORMAT_VERSIONS))}")
        top = {}
        for key in ("pcd_version", *CHECKED_KEYS):
            if not isinstance(doc.get(key), str):
                raise CalibrationError(f"{where}: key {key!r} is missing or not a string")
            top[key] = doc[key]
        raw_fields = doc.get("fields")
        if not isinstance(raw_fields, dict) or not raw_fields:
            raise CalibrationError(f"{where}: key 'fields' is missing or empty")
        fields = {name: _load_field(where, name, raw) for name, raw in raw_fields.items()}
        dtype = doc.get("dtype", "")
        if not isinstance(dtype, str):
            raise CalibrationError(f"{where}: key 'dtype' must be a string")
        objective = doc.get("objective", "likelihood")
        if not isinstance(objective, str):
            raise CalibrationError(f"{where}: key 'objective' must be a string")
        fitted_for = doc.get("fitted_for", {})
        if not isinstance(fitted_for, dict) or not all(isinstance(v, str) for v in fitted_for.values()):
            raise CalibrationError(f"{where}: key 'fitted_for' must map parts to strings")
        return cls(**top, fields=fields, sha256=hashlib.sha256(data).hexdigest(), dtype=dtype, objective=objective,
                   fitted_for=dict(fitted_for))

    def check(self, metadata: dict[str, str]) -> None:
        """Refuse to apply this calibration to outputs of another model, tokenizer, adapter,
        schema, prompt or scoring mode.

        A file that records ``fitted_for`` (format 2) is compared by content with the run's model
        parts (``metadata["pcd.model_parts"]``): weights, tokenizer and chat template, adapter,
        schema, the whole rendered prompt, scoring; a model folder that was renamed still matches,
        one whose chat template was edited does not. A file of format 1, or metadata without
        model parts (an output of an older pcd), is compared by the names of ``CHECKED_KEYS``.

        Args:
            metadata: ``Labeler.metadata()`` or a Parquet output's key-value metadata.

        Raises:
            CalibrationError: names every part that differs ("fitted on another prompt: refit"),
                with both values.
        """
        run_parts = json.loads(metadata.get(MODEL_PARTS_KEY) or "{}")
        if self.fitted_for and run_parts:
            diffs = [f"{CALIBRATION_PART_FIXES[part]} ({short(self.fitted_for[part])} vs this run's "
                     f"{short(run_parts.get(part, '(missing)'))})"
                     for part in CALIBRATION_PARTS if part in self.fitted_for and
                     self.fitted_for[part] != run_parts.get(part)]
            if diffs:
                changed = self._schema_changes(metadata) if "schema" in self.fitted_for and \
                    self.fitted_for["schema"] != run_parts.get("schema") else ""
                raise CalibrationError("the calibration file was " + "; ".join(diffs) + changed + ": refit it with "
                                       "pcd calibrate for this model, schema and prompt")
            return
        diffs = [f"{key}: calibration has {getattr(self, attr)!r}, this run has "
                 f"{metadata.get(key, '(missing)')!r}"
                 for attr, key in CHECKED_KEYS.items() if metadata.get(key) != getattr(self, attr)]
        if diffs:
            prompt = metadata.get("pcd.prompt_head_sha256") != self.prompt_head_sha256
            raise CalibrationError(("fitted on another prompt: refit (the prompt changes with the model's template, the "
                                    "schema, --record-quoting: docs/security.md); " if prompt else "") +
                                   "the calibration file was fitted for another setup (" + "; ".join(diffs) +
                                   "); fit a new one with pcd calibrate")

    def _schema_changes(self, metadata: dict[str, str]) -> str:
        """What differs between the fields this file calibrates and the run's schema
        (``pcd.schema_json``: ``{field: [labels]}``), as a clause for ``check``'s message:
        a field the schema lacks, labels that differ; or, where every calibrated field and its
        labels are the same, that the rest of the schema changed (its instructions, a
        description, a rule)."""
        try:
            run_fields = json.loads(metadata.get("pcd.schema_json") or "null")
        except ValueError:
            run_fields = None
        if not isinstance(run_fields, dict):
            return ""
        changes = []
        for name, fc in self.fields.items():
            group, _, option = name.rpartition(".")  # a multi-select option's calibration: <field>.<option>
            if name not in run_fields and group in run_fields:
                if option not in run_fields[group]:
                    changes.append(f"field {group!r} has no option {option!r} in this schema")
            elif name not in run_fields:
                changes.append(f"field {name!r} is not in this schema")
            elif list(fc.labels) != list(run_fields[name]):
                changes.append(f"field {name!r} had the labels {', '.join(fc.labels)}, this schema has "
                               f"{', '.join(map(str, run_fields[name]))}")
        if not changes:
            return (" (the fields it calibrates have the same labels: the schema's instructions, a description or "
                    "a rule changed)")
        return " (" + "; ".join(changes) + ")"


def fitted_for(metadata: dict[str, str]) -> dict[str, str]:
    """The ``Calibration.fitted_for`` of a calibration fitted on outputs with key-value
    ``metadata``: their model parts (``pcd.model_parts``) that ``CALIBRATION_PARTS`` names; empty
    for outputs of an older pcd that recorded none (the file is then checked by name)."""
    parts = json.loads(metadata.get(MODEL_PARTS_KEY) or "{}")
    return {name: parts[name] for name in CALIBRATION_PARTS if name in parts}


def _load_field(where: str, name: str, raw) -> FieldCalibration:
    at = f"{where}: field {name!r}"
    if not isinstance(raw, dict):
        raise CalibrationError(f"{at}: expected an object")
    labels = raw.get("labels")
    if not isinstance(labels, list) or not labels or not all(isinstance(x, str) for x in labels) \
            or len(set(labels)) != len(labels):
        raise CalibrationError(f"{at}: 'labels' must be a list of distinct strings")
    temperature = raw.get("temperature")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not \
            (math.isfinite(temperature) and temperature > 0):
        raise CalibrationError(f"{at}: 'temperature' must be a number > 0, got {temperature!r}")
    biases = raw.get("biases")
    if not isinstance(biases, dict) or set(biases) != set(labels):
        raise CalibrationError(f"{at}: 'biases' must map every label ({', '.join(labels)}) to a number")
    values = [biases[label] for label in labels]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
        raise CalibrationError(f"{at}: 'biases' must be finite numbers")
    n = raw.get("n")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise CalibrationError(f"{at}: 'n' must be a count")
    cv = raw.get("cv", {})
    if not isinstance(cv, dict):
        raise CalibrationError(f"{at}: 'cv' must be an object")
    try:
        conformal = ConformalSet.from_dict(raw["conformal"], at) if "conformal" in raw else None
    except ValueError as exc:
        raise CalibrationError(str(exc)) from None
    rule = DecisionRule.from_dict(raw["rule"], tuple(labels), at) if "rule" in raw else None
    readout = Readout.from_dict(raw["readout"], tuple(labels), at) if "readout" in raw else None
    if readout is not None and conformal is not None:
        raise CalibrationError(f"{at}: a readout and conformal label sets together (pcd calibrate fits one or the "
                               "other)")
    return FieldCalibration(name, tuple(labels), float(temperature), tuple(float(v) for v in values), n, cv,
                            conformal, rule, readout)


def check_output_path(path: str | Path) -> None:
    """Refuse, before any work, a calibration path that is a folder or cannot be written.

    Raises:
        CalibrationError: names the path and the problem.
    """
    path = Path(path)
    if path.is_dir():
        raise CalibrationError(f"-o {str(path)!r} is a folder; give a file name, e.g. {str(path / 'calibration.json')!r}")
    try:
        check_writable("-o", path)
    except InputError as exc:
        raise CalibrationError(str(exc)) from None


# --- fitting -----------------------------------------------------------------------------------


def fit_temperature_biases(probs: np.ndarray, gold: np.ndarray, *, l2: float = DEFAULT_L2,
                           biases: bool = True) -> tuple[float, np.ndarray]:
    """Fit T and b on (n, k) probabilities and (n,) gold indices.

    Minimises ``mean_i -sum_j y_ij log softmax(a * log p_i + b)_j + l2 * |b|^2`` over ``a = 1/T``
    in [1e-3, 1e3] and ``b`` with L-BFGS-B (scipy) and the analytic gradient. With
    ``biases=False`` only ``a`` is fitted (temperature scaling alone, Guo et al. 2017) and
    ``b`` stays 0.

    The targets ``y`` are Platt's (1999, "Probabilistic outputs for support vector machines",
    §2.2) smoothed labels: a row of gold label ``c`` has ``(N_c + 1) / (N_c + 2)`` on ``c`` (Platt's
    target for a row of its class, ``N_c`` the rows of label ``c``), the rest ``1 / (N_c + 2)``
    shared evenly by the other labels (k = 2 is Platt's rule exactly). Without them the fit is
    unbounded on rows the model got all right (any sharpening lowers their NLL): T ran to its
    1e-3 bound on a 20-row tune holdout and made every test error cost 27 nats (issue 29). On
    many rows they change little.

    Returns:
        (T, biases (k,)).

    Raises:
        CalibrationError: no rows, or the optimiser fails.
    """
    from scipy.optimize import minimize

    n, k = probs.shape
    if not n:
        raise CalibrationError("no rows to fit the calibration on")
    logp = np.log(np.maximum(probs.astype(np.float64), M.PROB_FLOOR))
    per_label = np.bincount(gold, minlength=k).astype(np.float64)[gold]  # N_c of each row's gold label
    target = np.repeat((1.0 / ((per_label + 2) * max(k - 1, 1)))[:, None], k, axis=1)  # Platt's smoothed targets
    target[np.arange(n), gold] = (per_label + 1) / (per_label + 2) if k > 1 else 1.0

    def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
        a, b = theta[0], theta[1:]
        z = a * logp + b
        zmax = z.max(axis=1, keepdims=True)
        e = np.exp(z - zmax)
        s = e.sum(axis=1, keepdims=True)
        log_norm = (zmax + np.log(s))[:, 0]
        loss = float(np.mean(log_norm - (target * z).sum(axis=1)) + l2 * b @ b)  # rows of target sum to 1
        dz = (e / s - target) / n  # d loss / d z
        grad = np.concatenate([[np.sum(dz * logp)], dz.sum(axis=0) + 2 * l2 * b])
        return loss, grad

    theta0 = np.concatenate([[1.0], np.zeros(k)])
    bounds = [(1 / MAX_TEMPERATURE, 1 / MIN_TEMPERATURE)] + [(None, None)] * k
    fun = objective
    if not biases:
        theta0, bounds = theta0[:1], bounds[:1]

        def fun(theta: np.ndarray) -> tuple[float, np.ndarray]:
            loss, grad = objective(np.concatenate([theta, np.zeros(k)]))
            return loss, grad[:1]
    result = minimize(fun, theta0, jac=True, method="L-BFGS-B", bounds=bounds,
                      options={"maxiter": 1000, "gtol": 1e-10, "ftol": 1e-14})
    if not np.all(np.isfinite(result.x)):
        raise CalibrationError(f"the calibration fit diverged ({result.message})")
    return float(1 / result.x[0]), (result.x[1:].copy() if biases else np.zeros(k))


#: ``fit_trusted``: temperature + biases are tried only with at least this many rows per label
#: (k + 1 parameters on fewer rows overfit: issue 29 measured a calibrated ECE of 0.20 from 18 rows).
BIAS_ROWS_PER_LABEL = 10


def fit_trusted(name: str, labels: tuple[str, ...], probs: np.ndarray, gold: np.ndarray, *, folds: int = 5,
                seed: int = 0, l2: float = DEFAULT_L2, objective: Objective | None = None,
                notes: list[str] | None = None, inputs=None, force_rule: bool = False) -> FieldCalibration:
    """The calibration the rows can support, for one field: temperature alone, or temperature
    and per-label biases when there are at least ``BIAS_ROWS_PER_LABEL`` rows per label and
    their cross-validated NLL is lower (``pcd tune`` fits it on its holdout's predictions).

    Both candidates are scored by ``folds``-fold cross-validation on the rows (each row's
    calibrated probabilities come from a fit that did not see it; fewer folds when rows are
    few, at least 2; copies of one model input in one fold, ``folds.grouped_folds``); the saved
    fit is the chosen candidate refitted on all rows.

    Args:
        probs: (n, k) uncalibrated probabilities (rows sum to 1). gold: (n,) label indices.
        objective: ``pcd tune --objective``: also fit the field's decision rule on the chosen
            method's cross-validated probabilities (``decision.fit_rule``, the same folds); below
            the floor, or a precision/recall floor no rule meets, no rule and a line in ``notes``
            (a tune is not refused for it); a rule with no held-out gain keeps argmax
            (``decision.fit_rule``) unless ``force_rule``.
        inputs: (n,) the rows' model input keys (``pcd_cli.results.input_key``); ``None``:
            every row its own group.

    Returns:
        a ``FieldCalibration`` whose ``cv`` holds ``method`` (``"temperature"`` or
        ``"temperature+biases"``), ``reason`` (one sentence), ``folds``, ``seed``, ``n``,
        ``before``/``after`` scores of the chosen method (accuracy, macro-F1, ECE, NLL) and
        ``nll_by_method``.

    Raises:
        CalibrationError: fewer than 2 rows.
    """
    n, k = probs.shape
    if n < 2:
        raise CalibrationError(f"field {name!r}: {n} rows, too few to fit a calibration")
    groups = group_index(inputs, n)
    folds = max(2, min(folds, int(groups.max()) + 1))
    parts = grouped_folds(groups, folds, seed, name=name)
    order = np.concatenate(parts)
    minimum = BIAS_ROWS_PER_LABEL * k
    methods = {"temperature": False} | ({"temperature+biases": True} if n >= minimum else {})
    held: dict[str, np.ndarray] = {}
    for method, with_biases in methods.items():
        out = np.zeros_like(probs, dtype=np.float64)
        for part in parts:
            train = np.setdiff1d(order, part, assume_unique=True)
            t, b = fit_temperature_biases(probs[train], gold[train], l2=l2, biases=with_biases)
            out[part] = softmax(calibrate_logits(probs[part], t, b))
        held[method] = out
    nll = {method: M.nll(out, gold) for method, out in held.items()}
    method = min(nll, key=lambda m: (nll[m], m != "temperature"))  # a tie keeps the fewer parameters
    if len(methods) == 1:
        reason = (f"{n} rows for {k} labels, fewer than {BIAS_ROWS_PER_LABEL} per label: a temperature alone "
                  "(one parameter)")
    else:
        other = next(m for m in nll if m != method)
        reason = (f"{n} rows for {k} labels: {method} had the lower {folds}-fold cross-validated NLL "
                  f"({nll[method]:.4f} against {nll[other]:.4f} for {other})")
    t, b = fit_temperature_biases(probs, gold, l2=l2, biases=methods[method])
    before, _ = scores(probs / np.maximum(probs.sum(axis=1, keepdims=True), M.PROB_FLOOR), gold, labels)
    after, _ = scores(held[method], gold, labels)
    cv = {"method": method, "reason": reason, "folds": folds, "seed": seed, "n": n, "before": asdict(before),
          "after": asdict(after), "nll_by_method": nll}
    rule = None
    if objective is not None and objective.fits_rule:
        why = applies_to(objective, name, tuple(labels))
        try:
            if why is None:
                rule = fit_rule(objective, name, held[method], gold, tuple(labels), parts, seed=seed,
                                groups=groups, force=force_rule)
        except CalibrationError as exc:
            why = f"no decision rule: {exc}"
        if why is not None and notes is not None:
            notes.append(why)
        if rule is not None and notes is not None:  # argmax kept for want of a gain, a forced rule ...
            notes.extend(rule_warnings(name, rule))
    return FieldCalibration(name, tuple(labels), t, tuple(float(x) for x in b), n, cv, rule=rule)


#: How much worse a held-out figure must be before ``held_out_worse`` names it: NLL up by this
#: share of its value before, accuracy or macro-F1 down by this much (below: noise of a few rows).
WORSE_NLL_SHARE, WORSE_SCORE = 0.01, 0.01


def held_out_worse(cv: dict) -> list[str]:
    """The cross-validated figures a calibration made worse on rows its fit did not see, as
    ``"NLL 0.387 -> 0.464"`` phrases (``cv``: ``FieldCalibration.cv``, whose ``before`` and
    ``after`` hold ``accuracy``, ``macro_f1`` and ``nll``); ``[]`` when none is, or unknown.
    The NLL is the figure the fit minimises: when it rises held out, the fit learnt the rows'
    noise (too few gold rows), and the raw probabilities serve better.

    Accuracy and macro-F1 are judged as a pair: one falling while the other rises by more than
    ``WORSE_SCORE`` is a trade-off, not "worse", and neither is named (with the NLL not worse,
    this is the calibration undoing a collapse onto the majority label: accuracy 0.600 -> 0.540,
    macro-F1 0.250 -> 0.378 on 50 airline rows). Which side of the trade a user wants is their
    objective (``pcd calibrate --objective``), whose rule has its own held-out check."""
    before, after = cv.get("before") or {}, cv.get("after") or {}
    worse = []
    b, a = before.get("nll"), after.get("nll")
    if b is not None and a is not None and a > b * (1 + WORSE_NLL_SHARE):
        worse.append(f"NLL {b:.3f} -> {a:.3f}")
    scores = {key: (before.get(key), after.get(key)) for key in ("macro_f1", "accuracy")}
    rose = any(b is not None and a is not None and a > b + WORSE_SCORE for b, a in scores.values())
    for key, name in (("macro_f1", "macro-F1"), ("accuracy", "accuracy")):
        b, a = scores[key]
        if b is not None and a is not None and a < b - WORSE_SCORE and not rose:
            worse.append(f"{name} {b:.3f} -> {a:.3f}")
    return worse


def worse_calibration_warnings(calibration: "Calibration", source: str = "the calibration", *,
                               bound: bool = True) -> list[str]:
    """One line per field whose ``calibration`` made held-out figures worse when it was fitted
    (``held_out_worse`` of its stored ``cv``), saying what to do: ``pcd label`` says it before
    using such a file, ``pcd calibrate`` when it writes one. With ``bound``, also a line per
    field whose temperature is at ``MAX_TEMPERATURE``: it writes the label priors on every row
    (``pcd calibrate`` says that in its own table, so it passes ``bound=False``). A field with a
    linear readout is judged by the readout, which writes its labels: its held-out figures
    against argmax (``FieldReadout.cv``); the logits calibration's temperature is not used for
    its labels, so no bound line."""
    lines = []
    for name, fc in calibration.fields.items():
        if fc.readout is not None:
            cv = fc.readout.cv
            worse = held_out_worse({"before": cv.get("argmax"), "after": cv.get("readout")})
            if worse:
                lines.append(f"field {name!r}: {source}'s linear readout makes it worse on gold rows its fit did "
                             f"not see ({', '.join(worse)}; {cv.get('folds', '?')}-fold cross-validation on "
                             f"{cv.get('n', '?')} rows): label without it, or fit it again on more gold rows")
            continue
        if bound and fc.temperature >= MAX_TEMPERATURE * 0.999:
            lines.append(f"field {name!r}: {source} has its temperature at the bound ({fc.temperature:g}): the "
                         "model's probabilities carried no signal on its gold rows, so the labels follow the "
                         "label priors, not the texts; train the model (pcd tune) or pass a larger --model instead")
        worse = held_out_worse(fc.cv)
        if worse:
            lines.append(f"field {name!r}: {source} makes it worse on gold rows its fit did not see "
                         f"({', '.join(worse)}; {fc.cv.get('folds', '?')}-fold cross-validation on {fc.n} rows): "
                         "label without it (the raw probabilities scored better), or fit it again on more gold "
                         "rows" + (" (the label sets keep their coverage either way)" if fc.conformal else ""))
    return lines


@dataclass(frozen=True)
class Scores:
    """Accuracy, macro-F1, ECE (15 bins) and NLL of one set of probabilities on gold rows."""

    accuracy: float | None
    macro_f1: float | None
    ece: float | None
    nll: float | None


@dataclass(frozen=True)
class FieldCalibrationReport:
    """Cross-validated effect of calibration on one field.

    Attributes:
        field, n, folds: the field, its rows with gold labels, the folds used.
        before, after: scores of the uncalibrated ``<f>__probs`` and of the held-out
            calibrated probabilities, pooled over the folds (each row scored by a fit that
            did not see it).
        before_bins, after_bins: reliability bins of the chosen label's probability (plots).
        temperature, biases: the final fit on all rows (with ``--coverage``: on the rows not
            held for the conformal threshold).
        conformal: the label-set threshold, or ``None`` without ``--coverage``.
        rule: the decision rule (``--objective``), its held-out figures in ``rule.cv``; ``None``: argmax.
        logits, readout: with ``--readout linear``, the temperature-and-bias calibration's
            held-out scores (``after`` is then the readout's) and the fitted readout; else ``None``.
    """

    field: str
    labels: tuple[str, ...]
    n: int
    folds: int
    before: Scores
    after: Scores
    before_bins: tuple[M.ReliabilityBin, ...]
    after_bins: tuple[M.ReliabilityBin, ...]
    temperature: float
    biases: tuple[float, ...]
    conformal: ConformalSet | None = None
    rule: DecisionRule | None = None
    logits: Scores | None = None
    readout: Readout | None = None


@dataclass(frozen=True)
class CalibrationReport:
    """What ``fit_calibration`` measured: one report per calibrated field, plus row counts.

    Attributes:
        fields: per-field cross-validated scores and final fit.
        fields_without_gold: fields left uncalibrated (no gold column).
        gold_rows, matched, gold_without_prediction: row counts of the join.
        skipped: per field, rows not used (null gold, gold not a label).
        notes: what was not done and why (e.g. no label sets for a multi-select field, a field
            an objective naming a label does not apply to).
        objective: the objective the rules were fitted for (``likelihood``: none).
    """

    fields: tuple[FieldCalibrationReport, ...]
    fields_without_gold: tuple[str, ...]
    gold_rows: int
    matched: int
    gold_without_prediction: int
    skipped: dict[str, dict[str, int]]
    notes: tuple[str, ...] = ()
    objective: str = "likelihood"

    def to_dict(self) -> dict:
        """Plain-JSON form: per field ``{n, folds, before, after, temperature, biases: {label: b}}``
        and the row counts (reliability bins left out)."""
        return {
            "fields": {f.field: {"n": f.n, "folds": f.folds, "before": asdict(f.before), "after": asdict(f.after),
                                 "temperature": f.temperature, "biases": dict(zip(f.labels, f.biases)),
                                 "conformal": f.conformal.to_dict() if f.conformal is not None else None,
                                 "rule": f.rule.to_dict() if f.rule is not None else None}
                                | ({"logits": asdict(f.logits), "readout": {
                                    "layers": list(f.readout.read_layers),
                                    "regressions": [{"layers": list(r.layers), "C": r.C}
                                                    for r in f.readout.regressions],
                                    "absent": list(f.readout.absent)}}
                                   if f.readout is not None else {})
                       for f in self.fields}, "objective": self.objective,
            "fields_without_gold": list(self.fields_without_gold), "gold_rows": self.gold_rows,
            "matched": self.matched, "gold_without_prediction": self.gold_without_prediction,
            "skipped": self.skipped, "notes": list(self.notes),
        }


def scores(probs: np.ndarray, gold: np.ndarray, labels: tuple[str, ...]) -> tuple[Scores, list[M.ReliabilityBin]]:
    """Scores of (n, k) probabilities (label = argmax, confidence = max) against gold indices."""
    pred = probs.argmax(axis=1)
    confidence = probs.max(axis=1)
    correct = (pred == gold).astype(np.float64)
    return (Scores(M.accuracy(gold, pred), M.macro_f1(M.label_scores(gold, pred, labels)),
                   M.ece(confidence, correct), M.nll(probs, gold)),
            M.reliability_bins(confidence, correct))


def check_raw_predictions(predictions: pd.DataFrame, schema: Schema | None, metadata: dict[str, str]) -> None:
    """The checks every fit on a pcd output makes before reading it (``fit_calibration``,
    ``fit_unlabelled``): the probabilities are the decoder's own, and the metadata names what the
    calibration will be checked against on load.

    Raises:
        CalibrationError: predictions made with a calibration (``pcd.calibration_sha256`` in the
            metadata or ``<f>__raw_prob`` columns) or with ``--prior-correction`` (a fit on
            corrected probabilities would be applied to raw ones: the two are exclusive at label
            time); metadata lacking one of ``CHECKED_KEYS``; labelled with another schema than
            ``schema``.
    """
    if metadata.get("pcd.calibration_sha256") or any(str(c).endswith("__raw_prob") for c in predictions.columns):
        raise CalibrationError("these predictions were made with a calibration already; fitting needs the raw "
                               "probabilities: label again without --calibration (a --model or --adapter folder from pcd tune "
                               "applies its own pcd-calibration.json unless given --no-calibration)")
    if metadata.get("pcd.prior_correction"):
        raise CalibrationError("these predictions were made with --prior-correction; fitting needs the raw "
                               "probabilities: label again without it")
    missing = [key for key in CHECKED_KEYS.values() if not metadata.get(key)]
    if missing:
        raise CalibrationError(f"the predictions' metadata lacks {', '.join(missing)}; a calibration must name the "
                               "model, schema, prompt head and scoring it is for: use a pcd output")
    if schema is not None and metadata["pcd.schema_sha256"] != schema.source_sha256:
        raise CalibrationError(f"the predictions were labelled with another schema than {schema.name!r} "
                               f"(pcd.schema_sha256 {metadata['pcd.schema_sha256'][:12]}..., the schema's "
                               f"{schema.source_sha256[:12]}...); label the rows with this schema")


def fit_calibration(predictions: pd.DataFrame, gold: pd.DataFrame, schema: Schema | None,
                    metadata: dict[str, str], *, id_field: str = "id", folds: int = 5, seed: int = 0,
                    l2: float = DEFAULT_L2, coverage: float | None = None,
                    objective: Objective | str | None = None,
                    force_rule: bool = False, features: dict | None = None) -> tuple[Calibration, CalibrationReport]:
    """Fit a ``Calibration`` on labelled rows, measuring its effect by k-fold cross-validation.

    For each field with gold labels: rows are shuffled (``seed``) into ``folds`` folds, copies
    of one model input always in one fold (``folds.grouped_folds``, by the predictions'
    ``__input_sha256``); each fold is scored by a fit on the other folds, and the pooled
    held-out scores are compared with the uncalibrated ones. The saved T and biases come from a final fit on all rows.
    Ordinal and integer fields are fitted like enums (one bias per label). A multi-select
    field is fitted per option: each option decision ``<field>.<option>`` is a boolean whose
    probabilities are P(yes)/P(no) from ``<f>__probs`` and whose gold is "the option is in
    the gold list"; the calibration stores it under that decision name, which is how
    ``Labeler`` applies it (its ``<f>__probs`` then hold calibrated P(yes)). ``coverage`` gives
    no label sets for them (a note says so): a conformal set per option is not a set of options.

    Args:
        predictions: a pcd output with ``<f>__probs`` columns (``pcd label --all-probs``),
            uncalibrated.
        gold: id column and one column per field with human labels (see ``evaluate``).
        schema: the fields and labels (``None``: from the predictions, as in ``evaluate``).
        metadata: the predictions' key-value metadata (``pcd.model``, ``pcd.schema_sha256``,
            ``pcd.prompt_head_sha256``, ``pcd.scoring``), recorded in the calibration.
        folds: cross-validation folds (>= 2). seed: the shuffle's seed. l2: bias penalty.
        coverage: also fit a split-conformal label-set threshold per field for this coverage
            (``pcd_cli.quality.conformal``): a seeded ``CONFORMAL_SHARE`` of each field's rows
            is held out of the calibration fit (and its cross-validation) and scores the
            threshold, so the coverage guarantee holds for the calibration that is saved.
        objective: ``pcd calibrate --objective`` (an ``Objective`` or its text; ``None``:
            ``likelihood``): fit each field's decision rule on its cross-validated calibrated
            probabilities (``decision.fit_rule``, the same folds), its held-out figures beside
            argmax in the rule's ``cv``. A field the objective does not name (a label it lacks,
            absent from the cost file) keeps the argmax, with a note. A rule whose held-out gain
            over argmax has a 95 % interval holding zero is not used: argmax is kept
            (``decision.kept_argmax``, said by ``rule_fit_warnings``).
        force_rule: ``--force-rule``: write each fitted rule even where it shows no held-out gain.
        features: ``pcd calibrate --readout linear``: ``{record id (as the join's strings):
            {decision name: {layer: (hidden,) array}}}`` read at each decision point
            (``Decoder.feature_layers``); each field (each option of a multi-select field) also
            gets a linear readout (``pcd_cli.quality.readout.fit_readout``) chosen and measured by
            nested cross-validation in the same folds, its figures beside argmax and the
            temperature-and-bias calibration in its ``cv``; with ``objective`` the rule is fitted
            on the readout's held-out probabilities. Integer fields keep the logits calibration
            (a note says so); a label without gold rows is named in a note.

    Raises:
        CalibrationError: predictions that are not raw, of another schema or without the
            metadata a calibration is checked against (``check_raw_predictions``), no
            ``<f>__probs``, fewer rows than folds for a field; with
            ``coverage``, a field whose held rows are too few for it (``conformal.too_few_rows``:
            no finite threshold, every set would hold every label); with ``objective``, a field
            below the floor or whose objective's figure is the same whatever label is written
            (``decision.fit_problem``), a precision/recall floor no rule meets,
            an objective that applies to no field.
        InputError: see ``evaluate``; an unknown objective.
    """
    if isinstance(objective, str):
        objective = parse_objective(objective)
    if objective is None:
        objective = LIKELIHOOD
    if folds < 2:
        raise CalibrationError(f"--folds must be at least 2, got {folds}")
    check_raw_predictions(predictions, schema, metadata)
    specs = field_specs(predictions, schema)
    joined = join(predictions, gold, specs, id_field=id_field)
    fitted, reports, notes = {}, [], list(joined.repeated_ids)
    for data in joined.fields:
        if isinstance(data, MultiFieldData):
            if coverage is not None:
                notes.append(f"field {data.spec.name!r} is multi-select: calibrated per option, without label sets "
                             "(--coverage applies to single-label fields only)")
            for option in data.option_data():
                fc, report = _fit_field(option, folds=folds, seed=seed, l2=l2, objective=objective, notes=notes,
                                        force_rule=force_rule, features=features)
                fitted[option.spec.name] = fc
                reports.append(report)
            continue
        fc, report = _fit_field(data, folds=folds, seed=seed, l2=l2, coverage=coverage, objective=objective,
                                notes=notes, force_rule=force_rule, features=features)
        fitted[data.spec.name] = fc
        reports.append(report)
    if objective.fits_rule and fitted and not any(fc.rule is not None for fc in fitted.values()):
        raise CalibrationError(f"--objective {objective.name}: it applies to no field with gold labels (" +
                               "; ".join(notes) + ")")
    calibration = Calibration(pcd_version=__version__, model=metadata["pcd.model"],
                              schema_sha256=metadata["pcd.schema_sha256"],
                              prompt_head_sha256=metadata["pcd.prompt_head_sha256"], scoring=metadata["pcd.scoring"],
                              fields=fitted, dtype=metadata.get("pcd.dtype", ""), objective=objective.name,
                              fitted_for=fitted_for(metadata))
    report = CalibrationReport(fields=tuple(reports), fields_without_gold=joined.fields_without_gold,
                               gold_rows=joined.gold_rows, matched=joined.matched,
                               gold_without_prediction=joined.gold_without_prediction,
                               skipped={d.spec.name: {"gold_null": d.gold_null, "gold_invalid": d.gold_invalid}
                                        for d in joined.fields}, notes=tuple(notes), objective=objective.name)
    return calibration, report


def check_objective_gold(gold: pd.DataFrame, schema: Schema, objective: Objective | None, *,
                         id_field: str = "id", floor: bool = True) -> None:
    """Before any model loads: refuse an objective no rule can be fitted for on a decision's
    gold cells (every gold row, as read): ``decision.fit_problem`` (the floor and a figure that
    is the same whatever label is written), or with ``floor=False`` (``pcd tune``, whose rules
    are fitted on its holdout, a part of the rows) ``decision.constant_problem`` alone. A
    multi-select field is checked per option (``<field>.<option>``, a boolean). The fit checks
    again on the rows it joins (``fit_calibration``).

    Raises:
        CalibrationError: naming each such field (or option), its label and its gold counts.
    """
    if objective is None or not objective.fits_rule:
        return
    problems = []
    for _spec, name, labels, rows in gold_decisions(gold, schema, id_field):
        if not rows or applies_to(objective, name, tuple(labels)) is not None:
            continue
        gold_idx = np.asarray(rows, dtype=np.int64)
        problem = fit_problem(objective, name, gold_idx, tuple(labels)) if floor else \
            constant_problem(objective, name, gold_idx, tuple(labels))
        if problem is not None:
            problems.append(problem if floor else f"--objective {objective.name}: {problem}")
    if problems:
        raise CalibrationError(" | ".join(problems))


def gold_decisions(gold: pd.DataFrame, schema: Schema, id_field: str = "id"):
    """The gold file's decisions as read, before any model loads: ``(spec, name, labels, label
    indices of the gold cells)`` per single-label field, and per option of a multi-select field
    (``<field>.<option>``, ``("true", "false")``); fields without a gold column are left out."""
    for spec, cells in _gold_cells(gold, schema, id_field):
        if spec.is_multi:
            chosen = [c for c in (gold_options(v, spec) for v in cells) if c is not None]
            for j, option in enumerate(spec.labels):
                yield spec, f"{spec.name}.{option}", ("true", "false"), [0 if row[j] else 1 for row in chosen]
        else:
            yield spec, spec.name, spec.labels, [i for i in (gold_label_index(v, spec) for v in cells) if i is not None]


def _gold_cells(gold: pd.DataFrame, schema: Schema, id_field: str):
    """``(FieldSpec, the gold cells of its column, row by row)`` per declared field with a gold
    column (``resolve_gold_columns``)."""
    specs = [FieldSpec.of(f) for f in schema.declared]
    frame = resolve_gold_columns(gold, specs, id_field)
    for spec in specs:
        if spec.name in frame.columns:
            yield spec, frame[spec.name].tolist()


def check_gold_labels(gold: pd.DataFrame, schema: Schema, *, id_field: str = "id") -> list[str]:
    """Before any model loads: the gold cells that are not labels of their field
    (``gold_label_index``; a multi-select field's: not a list of its options, ``gold_options``),
    which no fit can use. Null cells are "no gold" and not counted.

    Returns:
        One warning line per field with some such cells, naming up to ``MAX_INVALID_EXAMPLES``
        rows by id (or line) and value, and the label a value spells but for case
        (``near_label``): those rows are left out of that field's fit.

    Raises:
        CalibrationError: a field none of whose gold values is a label, naming its values with
            their counts and the field's labels (the fit would have no row of it, after decoding
            every one).
    """
    from collections import Counter

    from .data import MAX_INVALID_EXAMPLES, _is_present, gold_id_strings, near_label

    ids = ([repr(i) for i in gold_id_strings(gold, id_field)] if id_field in gold.columns
           else [f"line {i + 1}" for i in range(len(gold))])
    warnings, problems = [], []
    for spec, column in _gold_cells(gold, schema, id_field):
        read = (lambda v: gold_options(v, spec)) if spec.is_multi else (lambda v: gold_label_index(v, spec))
        cells = [(i, v) for i, v in enumerate(column) if _is_present(v)]
        bad = [(i, v) for i, v in cells if read(v) is None]
        if not bad:
            continue

        def shown(value, count: str = "") -> str:
            label = near_label(value, spec)
            return repr(value) + count + (f" (the label is {label!r})" if label is not None else "")

        kind, kinds = ("a list of its options", "lists of its options") if spec.is_multi else ("a label", "labels")
        if len(bad) == len(cells):
            counts = Counter(str(v) if spec.is_multi else v for _, v in bad).most_common(MAX_INVALID_EXAMPLES)
            more = len({str(v) for _, v in bad}) - len(counts)
            problems.append(f"field {spec.name!r}: none of its {len(cells)} gold values is {kind}: "
                            + ", ".join(shown(v, f" ×{c}") for v, c in counts)
                            + (f" and {more} more" if more > 0 else "")
                            + f"; its labels are {', '.join(spec.labels)}, matched exactly: write the gold as the "
                            "labels are spelt, or leave the field's column out of the gold file")
            continue
        named = ", ".join(f"row {ids[i]} {shown(v)}" for i, v in bad[:MAX_INVALID_EXAMPLES])
        verb = f"is not {kind}" if len(bad) == 1 else f"are not {kinds}"
        warnings.append(f"field {spec.name!r}: {len(bad)} of its {len(cells)} gold values {verb} "
                        f"and left out of its fit: {named}"
                        + (f" and {len(bad) - MAX_INVALID_EXAMPLES} more" if len(bad) > MAX_INVALID_EXAMPLES else ""))
    if problems:
        raise CalibrationError(" | ".join(problems))
    return warnings


def check_readout_gold(gold: pd.DataFrame, schema: Schema, *, id_field: str = "id") -> None:
    """Before any model loads: refuse ``--readout linear`` when a field's gold cells are below
    the readout's floor (``readout.floor_problem``; integer fields keep the logits calibration
    and are not checked). ``fit_readout`` checks again on the rows it joins.

    Raises:
        CalibrationError: naming each such field (or option) and its thin labels.
    """
    from .readout import floor_problem

    problems = [floor_problem(name, np.asarray(rows, dtype=np.int64), tuple(labels))
                for spec, name, labels, rows in gold_decisions(gold, schema, id_field) if spec.type != "integer"]
    problems = [p for p in problems if p is not None]
    if problems:
        raise CalibrationError(" | ".join(problems))


def check_coverage_rows(gold: pd.DataFrame, schema: Schema, coverage: float | None) -> None:
    """Before any model loads: refuse ``--coverage`` when a single-label field's gold cells
    (non-null) are too few for its conformal threshold (``conformal.too_few_rows``: half of
    them are held for it). ``fit_calibration`` checks again on the rows it actually joins.

    Raises:
        CalibrationError: naming each such field, the rows held and needed, and the fixes.
    """
    if coverage is None:
        return
    problems = []
    for f in schema.declared:
        if f.is_multi or f.name not in gold.columns:
            continue
        count = sum(1 for v in gold[f.name].tolist() if v is not None and v == v and v != "")
        problem = too_few_rows(f.name, int(round(CONFORMAL_SHARE * count)), coverage)
        if problem and count:
            problems.append(problem)
    if problems:
        raise CalibrationError("; ".join(problems) if len(problems) == 1 else
                               "--coverage: " + " | ".join(problems))


def _fit_field(data: FieldData, *, folds: int, seed: int, l2: float, coverage: float | None = None,
               objective: Objective | None = None, notes: list[str] | None = None,
               force_rule: bool = False, features: dict | None = None) -> tuple[FieldCalibration, FieldCalibrationReport]:
    name = data.spec.name
    if data.probs is None:
        raise CalibrationError(f"field {name!r}: the predictions have no {name}__probs column; label with "
                               "--all-probs (pcd calibrate without --predictions does)")
    if objective is not None and objective.fits_rule:
        why = applies_to(objective, name, data.spec.labels)
        if why is not None:
            (notes if notes is not None else []).append(why)
            objective = None
    if features is not None and data.spec.type == "integer":
        (notes if notes is not None else []).append(
            f"field {name!r} is an integer field: it keeps the logits calibration (the linear readout fits labels "
            "with a few gold rows each, not a range of numbers)")
        features = None
    if features is not None:
        if coverage is not None:
            raise CalibrationError("--coverage and --readout linear: conformal label sets are fitted on the logits "
                                   "calibration only; drop one")
        return _fit_readout_field(data, features, folds=folds, seed=seed, l2=l2, objective=objective, notes=notes,
                                  force_rule=force_rule)
    if coverage is None:
        return _fit_temperature_field(data, folds=folds, seed=seed, l2=l2, objective=objective,
                                      force_rule=force_rule)
    fit_rows, held_rows = conformal_split(len(data.gold), seed, groups=data.groups())
    problem = too_few_rows(name, len(held_rows), coverage)
    if problem:  # no finite threshold: every set would hold every label (--abstain-unless-single: every row)
        raise CalibrationError(problem)
    fc, report = _fit_temperature_field(_rows(data, fit_rows), folds=folds, seed=seed, l2=l2, objective=objective,
                                        force_rule=force_rule)
    conformal = fit_conformal(fc.apply(data.probs[held_rows]), data.gold[held_rows], coverage)
    return replace(fc, conformal=conformal), replace(report, conformal=conformal)


def _rows(data: FieldData, rows: np.ndarray) -> FieldData:
    return replace(data, ids=data.ids[rows], gold=data.gold[rows], pred=data.pred[rows], prob=data.prob[rows],
                   mass=data.mass[rows], probs=None if data.probs is None else data.probs[rows],
                   inputs=None if data.inputs is None else data.inputs[rows])


def _fit_temperature_field(data: FieldData, *, folds: int, seed: int, l2: float,
                           objective: Objective | None = None,
                           force_rule: bool = False) -> tuple[FieldCalibration, FieldCalibrationReport]:
    name, labels, n = data.spec.name, data.spec.labels, len(data.gold)
    if objective is not None and objective.fits_rule:  # before the fit: the refusal names the counts
        problem = fit_problem(objective, name, data.gold, labels)
        if problem is not None:
            raise CalibrationError(problem)
    if n < folds:
        raise CalibrationError(f"field {name!r}: {n} rows with gold labels, fewer than --folds {folds}; add gold "
                               "rows or lower --folds")
    groups = data.groups()
    parts = grouped_folds(groups, folds, seed, name=name)  # copies of one text in one fold
    held_out = np.zeros_like(data.probs)
    order = np.concatenate(parts)  # the seeded order (distinct texts: default_rng(seed).permutation(n))
    for part in parts:
        train = np.setdiff1d(order, part, assume_unique=True)
        t, b = fit_temperature_biases(data.probs[train], data.gold[train], l2=l2)
        held_out[part] = softmax(calibrate_logits(data.probs[part], t, b))
    raw = data.probs / np.maximum(data.probs.sum(axis=1, keepdims=True), M.PROB_FLOOR)
    before, before_bins = scores(raw, data.gold, labels)
    after, after_bins = scores(held_out, data.gold, labels)
    t, b = fit_temperature_biases(data.probs, data.gold, l2=l2)
    cv = {"folds": folds, "seed": seed, "n": n, "before": asdict(before), "after": asdict(after)}
    texts = int(groups.max()) + 1 if n else 0
    if texts != n:
        cv["texts"] = texts
    rule = None
    if objective is not None and objective.fits_rule:  # on the held-out calibrated probabilities, the same folds
        rule = fit_rule(objective, name, held_out, data.gold, labels, parts, seed=seed, groups=groups,
                        force=force_rule)
    fc = FieldCalibration(name, labels, t, tuple(float(x) for x in b), n, cv, rule=rule)
    return fc, FieldCalibrationReport(name, labels, n, folds, before, after, tuple(before_bins), tuple(after_bins), t,
                                      tuple(float(x) for x in b), rule=rule)


def _fit_readout_field(data: FieldData, features: dict, *, folds: int, seed: int, l2: float,
                       objective: Objective | None, notes: list[str] | None, force_rule: bool = False
                       ) -> tuple[FieldCalibration, FieldCalibrationReport]:
    """The logits calibration of ``data`` (its figures: today's calibration) and the field's
    linear readout, fitted and measured in the same folds (``grouped_folds``: copies of one text
    in one fold); the decision rule (``objective``) on the readout's held-out probabilities."""
    name, labels, n = data.spec.name, data.spec.labels, len(data.gold)
    if objective is not None and objective.fits_rule:  # before the fit: the refusal names the counts
        problem = fit_problem(objective, name, data.gold, labels)
        if problem is not None:
            raise CalibrationError(problem)
    fc, report = _fit_temperature_field(data, folds=folds, seed=seed, l2=l2)
    missing = [str(i) for i in data.ids if name not in features.get(str(i), {})]
    if missing:
        raise CalibrationError(f"field {name!r}: no hidden state was read for record {missing[0]!r} (and "
                               f"{len(missing) - 1} more); label the gold rows with the readout's feature read")
    rows = [features[str(i)][name] for i in data.ids]
    from .readout import candidate_layers

    n_layers = max(max(r) for r in rows)
    sets = {c: np.stack([np.concatenate([r[layer] for layer in c]) for r in rows]) for c in candidate_layers(n_layers)
            if all(layer in rows[0] for layer in c)}
    bad = [str(data.ids[i]) for i in range(n) if not all(np.isfinite(x[i]).all() for x in sets.values())]
    if bad:
        raise CalibrationError(f"record {bad[0]!r}, field {name!r}: the model's hidden state at the decision point is "
                               "not finite (NaN or infinite); run with --dtype float32")
    groups = data.groups()
    parts = grouped_folds(groups, folds, seed, name=name)  # the logits calibration's folds
    readout, held = fit_readout(name, labels, sets, data.gold, data.probs, parts, seed=seed)
    after, after_bins = scores(held, data.gold, labels)
    cv = {"folds": folds, "seed": seed, "n": n, "argmax": asdict(report.before), "logits": asdict(report.after),
          "readout": asdict(after), "chosen": readout.cv["chosen"]}
    readout = replace(readout, cv=cv)
    if readout.absent and notes is not None:
        notes.append(f"field {name!r}: no gold row has label{'s' if len(readout.absent) > 1 else ''} "
                     f"{', '.join(readout.absent)}; the readout scores "
                     f"{'them' if len(readout.absent) > 1 else 'it'} by the model's own probability times "
                     f"{readout.absent_weight:.3g} (docs/quality.md, \"The linear readout\"): add gold rows of "
                     f"{'them' if len(readout.absent) > 1 else 'it'}")
    rule = None
    if objective is not None and objective.fits_rule:
        rule = fit_rule(objective, name, held, data.gold, labels, parts, seed=seed, groups=groups, force=force_rule)
    fc = replace(fc, cv={**fc.cv, "after": asdict(after), "logits": asdict(report.after)}, rule=rule, readout=readout)
    return fc, replace(report, after=after, after_bins=tuple(after_bins), rule=rule, logits=report.after,
                       readout=readout)


def rule_fit_warnings(calibration: Calibration) -> list[str]:
    """Lines about the fitted decision rules: a field whose rule misses its floor or does worse
    than argmax on held-out folds (``decision.rule_warnings``)."""
    return [line for name, fc in calibration.fields.items() if fc.rule is not None
            for line in rule_warnings(name, fc.rule)]


# --- label-free: a prior correction from unlabelled rows (pcd calibrate --unlabelled) ---------

#: ``FieldCalibration.cv["method"]`` of a prior correction fitted on unlabelled rows.
UNLABELLED_METHOD = "unlabelled-prior"
#: Rows ``pcd calibrate --unlabelled`` estimates the prior on by default (a seeded sample).
DEFAULT_UNLABELLED_SAMPLE = 200


def unlabelled_probabilities(predictions: pd.DataFrame, schema: Schema | None) -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
    """Per decision, the (labels, (n, k) probabilities) of the rows of an uncalibrated pcd output
    (``pcd label --all-probs``): a single-label field's ``<f>__probs`` (each row renormalised
    over its labels), and for a multi-select field one boolean decision ``<f>.<option>`` per
    option with ``(P(yes), 1 - P(yes))``, the names ``fit_calibration`` and ``Labeler`` use.
    Rows without probabilities (a failed or abstained record) are left out.

    Raises:
        InputError: no ``<f>__probs`` column for a field (label with ``--all-probs``), a cell
            whose labels are not the field's (``field_specs`` for the columns).
    """
    from .data import _has_pairs, _pairs

    out: dict[str, tuple[tuple[str, ...], np.ndarray]] = {}
    for spec in field_specs(predictions, schema):
        column = f"{spec.name}__probs"
        if column not in predictions.columns:
            raise InputError(f"field {spec.name!r}: the predictions have no {column} column; label with --all-probs "
                             "(pcd calibrate --unlabelled without --predictions does)")
        rows = []
        for r, cell in enumerate(predictions[column].to_numpy(dtype=object)):
            if not _has_pairs(cell):
                continue
            pairs = _pairs(cell)
            if set(pairs) != set(spec.labels):
                raise InputError(f"predictions row {r}: {column} has labels {sorted(pairs)}, the field has "
                                 f"{list(spec.labels)}")
            rows.append([float(pairs[label]) for label in spec.labels])
        probs = np.asarray(rows, dtype=np.float64).reshape(len(rows), len(spec.labels))
        if spec.is_multi:
            for j, option in enumerate(spec.labels):
                p_yes = np.clip(probs[:, j], 0.0, 1.0)
                out[f"{spec.name}.{option}"] = (("true", "false"), np.column_stack([p_yes, 1.0 - p_yes]))
        else:
            out[spec.name] = (tuple(spec.labels), probs / np.maximum(probs.sum(axis=1, keepdims=True), M.PROB_FLOOR))
    return out


def unlabelled_biases(probs: np.ndarray) -> np.ndarray:
    """The biases of a prior correction: ``b_j = -log(max(mean_i p_ij, PRIOR_FLOOR))`` for (n, k)
    probabilities (n >= 1), so that with T = 1 the calibrated probabilities are
    ``(p_j / prior_j) / sum_l (p_l / prior_l)``.

    The prior is the mean predicted label distribution over the rows: batch calibration (Zhou,
    Wan, Vulić and Korhonen 2024, "Batch Calibration: Rethinking Calibration for In-Context
    Learning and Prompt Engineering", ICLR, eq. 5), estimated once on a sample and then held
    fixed, so a record's label never depends on the other records labelled with it.

    Raises:
        ValueError: no rows, or ``probs`` not 2-D.
    """
    from ..decoding.prior import PRIOR_FLOOR

    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2 or len(probs) == 0:
        raise ValueError(f"expected (n, k) probabilities with n >= 1, got shape {probs.shape}")
    return -np.log(np.maximum(probs.mean(axis=0), PRIOR_FLOOR))


def fit_unlabelled(predictions: pd.DataFrame, schema: Schema | None, metadata: dict[str, str]) -> Calibration:
    """A ``Calibration`` without gold labels: per decision (a field, or a multi-select field's
    option), temperature 1 and the biases ``unlabelled_biases`` of the rows' mean predicted
    label distribution (``pcd calibrate --unlabelled``). It is stored, checked and applied as any
    calibration (``Labeler`` with ``calibration=``); ``cv`` holds ``{"method", "n", "prior"}``
    (no held-out figures: there is no gold).

    Raises:
        CalibrationError: as ``check_raw_predictions``; a decision with no row holding probabilities.
        InputError: see ``unlabelled_probabilities``.
    """
    check_raw_predictions(predictions, schema, metadata)
    fitted = {}
    for name, (labels, probs) in unlabelled_probabilities(predictions, schema).items():
        if len(probs) == 0:
            raise CalibrationError(f"field {name!r}: no row has probabilities (every record failed or abstained); "
                                   "give rows the model can label")
        biases = unlabelled_biases(probs)
        prior = dict(zip(labels, (float(p) for p in probs.mean(axis=0))))
        fitted[name] = FieldCalibration(name, labels, 1.0, tuple(float(b) for b in biases), len(probs),
                                        {"method": UNLABELLED_METHOD, "n": len(probs), "prior": prior})
    return Calibration(pcd_version=__version__, model=metadata["pcd.model"], schema_sha256=metadata["pcd.schema_sha256"],
                       prompt_head_sha256=metadata["pcd.prompt_head_sha256"], scoring=metadata["pcd.scoring"],
                       fields=fitted, dtype=metadata.get("pcd.dtype", ""), fitted_for=fitted_for(metadata))
