"""Retraining a served model on gold, and the versions it makes: the rules ``pcd serve
--label-studio`` applies behind its routes, with nothing of HTTP or Label Studio in them.

* ``fit_on_gold``: ``pcd calibrate`` under ``TUNE_FROM_ROWS`` gold rows, ``pcd tune`` from there on
  (the library functions behind the commands), with the holdout figures the fit did not train on.
* ``not_worse``: the swap rule (mean holdout accuracy not lower, mean holdout NLL not higher).
* ``Version``, ``VersionHistory``, ``version_name``: a schema's versions, ``<model>:<hash>``, kept
  in ``versions.json`` (written whole, atomically), and which one a restart serves again.

``server/label_studio.py`` (the backend's state: journals, links, the retrain thread) calls these.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from .job import LabelJob

log = logging.getLogger("pcd.server")

#: Gold rows from which a retrain runs ``pcd tune`` rather than ``pcd calibrate``: docs/quality.md
#: ("tune when you have a few hundred labelled rows"; ``pcd_cli.tune.FEW_ROWS``).
TUNE_FROM_ROWS = 200


@dataclass
class Version:
    """One line of a schema's version history (``GET /versions``).

    Attributes:
        version: ``<model>:<hash>`` (the model's name, the first 12 hex of the sha256 of the fitted
            calibration or adapter; ``base`` for the served model as started).
        method: ``base``, ``calibrate`` or ``tune``.
        accepted: swapped in (``not_worse``); ``False``: kept the old model (``reason`` says why).
        gold_rows: gold rows the run read; holdout_rows: rows its figures were measured on.
        before, after: mean over fields of ``accuracy`` and ``nll`` on those rows, with the
            served model and with the new one.
        seconds: the run's wall time; created: UTC ISO time; path: the fitted file or folder.
        label_studio: project id -> what Label Studio's API answered to the new ``model_version``.
        job: the options that make the served job this version (``{"calibration": path}``,
            ``{"adapter": path}``, ...): what a restart applies again (``restore``).
    """

    version: str
    method: str
    accepted: bool
    created: str
    gold_rows: int = 0
    holdout_rows: int = 0
    before: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)
    seconds: float = 0.0
    reason: str = ""
    path: str | None = None
    label_studio: dict = field(default_factory=dict)
    job: dict = field(default_factory=dict)


class VersionHistory:
    """A schema's versions, oldest first, kept in ``versions.json`` (written whole, atomically)."""

    def __init__(self, path: Path, base: str):
        self.path = path
        self._lock = threading.Lock()
        self.items: list[Version] = []
        if path.is_file():
            try:
                self.items = [Version(**v) for v in json.loads(path.read_text(encoding="utf-8"))]
            except (ValueError, TypeError) as exc:
                log.warning("version history %s unreadable (%s); starting a new one", path, exc)
        #: the version served when the server last stopped, applied again once the model is loaded
        self.to_restore = self.last_fitted()
        self.add(Version(base, "base", True, now()))  # this process serves the base model until a swap

    def last_fitted(self) -> Version | None:
        """The latest accepted version that a fit made, when its files are still there (``None``:
        none, or the base model was served last)."""
        for v in reversed(self.items):
            if v.accepted and v.method != "base":
                return v if v.job and v.path and Path(v.path).exists() else None
        return None

    @property
    def current(self) -> str:
        """The version served now: the last accepted one."""
        return next(v.version for v in reversed(self.items) if v.accepted)

    def add(self, version: Version) -> None:
        from .io.files import write_atomic

        with self._lock:
            self.items.append(version)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps([asdict(v) for v in self.items], indent=1).encode() + b"\n")


def now() -> str:
    """The UTC time as ``YYYY-MM-DDTHH:MM:SSZ`` (a version's ``created``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def version_name(model_id: str, fitted: bytes | None) -> str:
    """``<model name>:<first 12 hex of sha256(fitted)>`` (``base`` without a fitted file)."""
    name = re.split(r"[/\\]", str(model_id).rstrip("/\\"))[-1] or "model"
    return f"{name}:{hashlib.sha256(fitted).hexdigest()[:12] if fitted is not None else 'base'}"


def not_worse(before: dict, after: dict) -> tuple[bool, str]:
    """The swap rule: the new model's mean holdout accuracy is not lower and its mean holdout NLL
    not higher than the served model's on the same rows (a missing figure is not compared).
    Returns ``(ok, why)``."""
    ba, aa, bn, an = before.get("accuracy"), after.get("accuracy"), before.get("nll"), after.get("nll")
    if aa is None and an is None:
        return False, "no holdout figures (too few gold rows with answers)"
    if ba is not None and aa is not None and aa < ba - 1e-12:
        return False, f"holdout accuracy {aa:.4f} below the served model's {ba:.4f}"
    if bn is not None and an is not None and an > bn + 1e-12:
        return False, f"holdout NLL {an:.4f} above the served model's {bn:.4f}"
    return True, "not worse on the holdout"


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


# -- training ---------------------------------------------------------------------------------------
@dataclass
class Fitted:
    """What a trainer returns: the new ``job`` (the served one with the calibration or adapter),
    the holdout figures ``before``/``after`` (``{"accuracy", "nll"}``, means over fields), the
    rows they were measured on, the fitted ``path`` and whether the job needs a model of its own
    (``own_model``: a tuned adapter is merged into new weights)."""

    job: LabelJob
    before: dict
    after: dict
    holdout_rows: int
    path: Path
    own_model: bool


def served_calibration(job: LabelJob):
    """The calibration ``job`` applies (``--calibration``, else a tuned folder's own
    ``pcd-calibration.json``), loaded; ``None`` without one or when it cannot be read (the
    labeler refuses such a file by name; a retrain then fits as for no calibration)."""
    from .api import tuned_calibration_path
    from .errors import PcdError
    from .quality import Calibration

    path = job.calibration
    if path is None and job.tuned_calibration:
        path = tuned_calibration_path(job.adapter) or tuned_calibration_path(job.model)
    if path is None:
        return None
    try:
        return path if isinstance(path, Calibration) else Calibration.load(path)
    except PcdError:
        return None


def served_objective(job: LabelJob):
    """The objective of the calibration ``job`` applies (``served_calibration``): a retrain fits
    its decision rules again for it (``pcd calibrate --objective``), so the labels served keep
    following the rule the user chose. ``likelihood`` without one, or for a ``cost:`` objective
    (its cost file is not at hand: the rule falls back to argmax).

    Returns:
        the ``quality.decision.Objective`` (read back from the file: ``recorded_objective``)."""
    from .errors import PcdError
    from .quality.decision import LIKELIHOOD, recorded_objective

    calibration = served_calibration(job)
    if calibration is None:
        return LIKELIHOOD
    try:
        objective = recorded_objective(calibration.objective, f"calibration {str(job.calibration or 'pcd-calibration.json')!r}")
    except PcdError:
        return LIKELIHOOD
    return LIKELIHOOD if objective.row.reads_file else objective


def served_readout(job: LabelJob) -> str:
    """The readout of the calibration ``job`` applies (``served_calibration``), as ``pcd calibrate
    --readout`` names it: ``linear`` when a field of it holds a linear readout (``pcd calibrate
    --readout linear``; the ``readout`` object of a field in the file), else ``logits`` (no
    calibration too). A retrain fits the same readout again, so a served readout is refitted on
    the new gold, never dropped."""
    calibration = served_calibration(job)
    return "linear" if calibration is not None and calibration.readouts() else "logits"


def fit_on_gold(method: str, gold: Path, schema, job: LabelJob, out: Path, *, store: Path | None = None) -> Fitted:
    """Run ``pcd calibrate`` or ``pcd tune`` (the library functions behind the commands) on the
    export ``gold`` for ``schema`` and ``job`` into the folder ``out``.

    ``calibrate``: ``calibrate_on_gold`` (5-fold cross-validated before/after; the served job
    with ``calibration`` set), with the served calibration's readout (``served_readout``: a
    linear readout is fitted again) and, with ``store``, the gold rows an earlier fit of the same
    job labelled read from that file (``pcd_cli.quality.labelled_rows``): only new rows are
    decoded. Both fit the decision rules of the served calibration's objective again
    (``served_objective``). ``tune``: ``tune_on_gold`` (``pcd tune``'s default epochs, holdout
    and patience; the figures of epoch 0 and of the kept epoch on the holdout; the served job with
    ``adapter`` set, or, when it already had one, ``model`` the merged folder; its calibration is
    ``pcd tune``'s own, on the logits).

    Raises:
        PcdError: as ``calibrate_on_gold`` and ``tune_on_gold`` (too few rows, no peft, ...).
    """
    out.mkdir(parents=True, exist_ok=True)
    if method == "calibrate":
        from .fitting import calibrate_on_gold

        path = out / "calibration.json"
        n_rows = len(json.loads(gold.read_text(encoding="utf-8")))
        run = calibrate_on_gold(gold, schema, job, output=path, folds=min(5, max(2, n_rows)),
                                objective=served_objective(job), readout=served_readout(job), store=store)
        log.info("calibrate: %s of %d gold rows decoded, the others read from %s", run.decoded, n_rows, store)
        run.calibration.save(path)
        fields = run.report.fields
        before = {"accuracy": _mean(f.before.accuracy for f in fields), "nll": _mean(f.before.nll for f in fields)}
        after = {"accuracy": _mean(f.after.accuracy for f in fields), "nll": _mean(f.after.nll for f in fields)}
        return Fitted(replace(job, calibration=str(path), tuned_calibration=True), before, after,
                      max((f.n for f in fields), default=0), path, own_model=False)
    from .fitting import tune_on_gold
    from .tune import DEFAULT_PATIENCE, TuneConfig

    path = out / "tuned"
    adapter_only = job.adapter is None
    # pcd tune's defaults: epochs by the gold rows (``default_epochs``), --patience DEFAULT_PATIENCE
    run = tune_on_gold(gold, schema, job, path, TuneConfig(epochs=0, patience=DEFAULT_PATIENCE,
                                                           objective=served_objective(job)),
                       adapter_only=adapter_only)
    epochs = run.result.epochs
    first, kept = epochs[0].holdout, epochs[run.result.best_epoch].holdout

    def figures(scores):
        return {"accuracy": _mean(s.accuracy for s in scores.values()), "nll": _mean(s.nll for s in scores.values())}

    new_job = replace(job, adapter=str(path), calibration=None) if adapter_only else \
        replace(job, model=str(path), adapter=None, calibration=None)
    return Fitted(new_job, figures(first), figures(kept), run.result.holdout_rows, path, own_model=True)


def fitted_bytes(path: Path) -> bytes:
    """The bytes a version hash is taken over: the file, or a folder's adapter/weights files."""
    if path.is_file():
        return path.read_bytes()
    digest = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file() and p.suffix in (".safetensors", ".bin", ".json"):
            digest.update(p.relative_to(path).as_posix().encode())
            digest.update(p.read_bytes())
    return digest.digest()




def changed_options(old, new) -> dict:
    """The options of job ``new`` that differ from ``old`` (JSON values)."""
    return {k: getattr(new, k) for k in old.options() if getattr(new, k) != getattr(old, k)}


def adapter_bytes(job) -> bytes | None:
    """What the base version's hash is taken over: the served adapter folder (``None``: none)."""
    adapter = getattr(job, "adapter", None)
    if adapter and Path(adapter).exists():
        return fitted_bytes(Path(adapter))
    return None
