"""``pcd tune``: gold labels -> a LoRA adapter trained through the decoder's own forest.

Training is the decoder run backwards (docs/how-it-works.md, "Training reads what labelling
reads"): ``Decoder.training_reads`` feeds the same head (few-shot examples included), record segment, answer-line forest and waves as
``pcd label``, in the same packed passes bounded by the same token budget, with the
backend's autograd path; the loss is each field's cross-entropy over its allowed labels,
each label scored as the decoder scores it (``--scoring``), plus ``--mass-weight`` times the
gold label's full-vocabulary negative log-likelihood at the same positions, which keeps the
candidate mass (``pcd_cli.backends.torch_tune.field_loss``). Later waves see the gold answer
line of earlier fields (teacher forcing), or the decoder's own pick where the gold row
lacks that field. The framework half (peft, optimiser, saving) is in
``pcd_cli.backends.torch_tune``.

Per epoch: the training rows in a seeded shuffle, one optimiser step per packed group; then
the seeded, stratified holdout (never trained on) is labelled by the plain decoder and
scored with ``pcd eval``'s metrics; the epoch with the lowest mean holdout NLL is kept.
An epoch that collapses (``divergence``: a NaN or exploding loss, a candidate mass fallen
a hundredfold, probabilities gone flat) fails the run (``TrainingDiverged``), so a
collapse is never kept as "best"; a holdout of fewer than ``MIN_HOLDOUT_ROWS`` rows is
named as too small to choose an epoch (``TuneResult.warnings``).
Then the calibration those holdout rows can support (``fit_tune_calibration``) is fitted on
the kept epoch's holdout predictions and written into the tuned folder, where ``pcd label
--model DIR`` finds it. With ``--cross-fit K`` the holdout is every row in turn: K fold runs
give each gold row an out-of-fold prediction, the calibration is fitted on all of them, and the
written model trains on all rows (``tune``).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .backends.tune_folder import CALIBRATION_NAME
from .decoding.compile import CompiledSchema
from .decoding.decode import DEFAULT_MAX_TOKENS_PER_PASS, Decoder
from .errors import InputError, TuneInterrupted
from .io.readers import InputSpec, row_to_record
from .quality import metrics as M
from .quality.decision import LIKELIHOOD, Objective, parse_objective
from .quality.folds import first_rows, group_index
from .quality.data import (
    FieldSpec,
    _is_present,
    _present_gold,
    gold_label_index,
    gold_options,
)
from .results import Record, RecordFailure, input_key
from .schema.model import Schema
from .version import __version__

#: ``--mass-weight``'s default (chosen by ``benchmarks/tune_quality.py``; docs/quality.md).
DEFAULT_MASS_WEIGHT = 0.3


#: Below this many gold rows ``pcd tune`` runs ``FEW_ROWS_EPOCHS`` epochs by default, else 3: on the
#: learning curve (benchmarks/quality.json, ``tune.learning_curve`` and ``learning_curve_epochs6``)
#: 6 epochs beat 3 at 50 and 100 rows on airline (0.610 -> 0.690, 0.630 -> 0.790) and intents
#: (0.605 -> 0.684, 0.684 -> 0.789), while at 200-300 rows the 3-epoch runs already kept epoch 2;
#: the holdout NLL still picks the epoch.
FEW_ROWS = 200
FEW_ROWS_EPOCHS = 6
#: ``pcd tune --patience``'s default (``TuneConfig.patience`` is 0, every epoch): in the 37 runs whose
#: per-epoch holdout NLL benchmarks/quality.json logs, stopping after 2 epochs without a better NLL
#: changed the kept epoch once (SMS, 100 rows: epoch 3 for 6; on 300 test rows accuracy 0.953 for
#: 0.963, NLL 0.127 for 0.187, ECE 0.028 for 0.034), patience 1 in 9; it saves 1-2 epochs in 4.
DEFAULT_PATIENCE = 2


def default_epochs(gold_rows: int) -> int:
    """``pcd tune``'s epochs when ``--epochs`` is not given: ``FEW_ROWS_EPOCHS`` (6) under
    ``FEW_ROWS`` (200) gold rows, else 3 (source: the learning curve quoted at ``FEW_ROWS``)."""
    return FEW_ROWS_EPOCHS if gold_rows < FEW_ROWS else 3


@dataclass(frozen=True)
class TuneConfig:
    """Hyperparameters of ``pcd tune`` (recorded in the card).

    Attributes:
        epochs: passes over the training rows. rank: LoRA rank. lr: AdamW learning rate.
        seed: seeds the holdout split, the shuffle and the adapter's initialisation.
        holdout: fraction of gold rows held out (stratified on the first field); 0 keeps none
            (then the last epoch is kept).
        scoring: ``marginal`` or ``exact``, the scoring ``pcd label`` will read.
        max_tokens_per_pass: the token budget of one packed pass, hence of one training step.
        mass_weight: weight of the gold label's full-vocabulary NLL in the loss (``field_loss``);
            0 is the renormalised cross-entropy alone.
        permutations: ``K >= 2``: train over the K label orderings ``pcd label --permutations
            K`` reads (``pcd_cli.decoding.permute``): every ordering's branch of a record is a
            loss term, the holdout is labelled with the orderings combined. 1: the plain prompt.
        cross_fit: ``K >= 2``: K fold runs give every gold row an out-of-fold prediction for
            the calibration and choose the epochs; the written model trains on all rows
            (``tune``). 0: one holdout of ``holdout`` picks the epoch and fits the calibration.
        patience: early stopping: training ends once this many epochs in a row did not beat
            the best holdout NLL (0: every epoch runs). Without holdout rows it never stops early.
        objective: ``pcd tune --objective`` (``quality.decision.Objective``; its text is parsed
            here, ``parse_objective``): the decision rule fitted with the calibration on the
            holdout (``fit_tune_calibration``); ``likelihood``: none. The card records its name.
        force_rule: ``pcd tune --force-rule``: write each rule even where it shows no held-out
            gain over argmax (``quality.decision.fit_rule``).
    """

    epochs: int = 3
    rank: int = 8
    lr: float = 5e-4
    seed: int = 0
    holdout: float = 0.2
    scoring: str = "marginal"
    max_tokens_per_pass: int = DEFAULT_MAX_TOKENS_PER_PASS
    mass_weight: float = DEFAULT_MASS_WEIGHT
    permutations: int = 1
    cross_fit: int = 0
    patience: int = 0
    objective: Objective = LIKELIHOOD
    force_rule: bool = False

    def __post_init__(self):
        if isinstance(self.objective, str):  # the Python API's text: parsed where it enters
            object.__setattr__(self, "objective", parse_objective(self.objective))


#: A holdout with fewer rows (for the field with the most) is too small to choose an epoch: the
#: choice is kept but named as such (``TuneResult.warnings``). The NLL of a few rows moves by
#: more than an epoch's change (one row of 3 flipping moves it by a third of its loss).
MIN_HOLDOUT_ROWS = 10
#: ``divergence``: a field's holdout candidate mass below this share of its mass before
#: training is a collapse (the model stopped writing the labels at all).
MASS_COLLAPSE = 0.01
#: ``divergence``: every holdout row's probabilities within this of ``1/k`` (and not so before
#: training) is flat: the labels carry no information.
FLAT_TOLERANCE = 1e-3
#: ``divergence``: a training loss above this many times the first step's loss (at least 1 nat)
#: has exploded, read as the median of the last ``LOSS_EXPLOSION_WINDOW`` steps: one hard row in
#: a one-row step (a long text) may cost 10+ nats while the holdout keeps improving; a real
#: explosion (the learning rate) lasts.
LOSS_EXPLOSION = 10.0
LOSS_EXPLOSION_WINDOW = 5


class TrainingDiverged(InputError):
    """Training collapsed (``divergence``): nothing is written. Exit 2, as a bad option: the
    usual cause is the learning rate (``--lr``)."""


@dataclass(frozen=True)
class FieldScores:
    """Holdout metrics of one field (``pcd eval``'s definitions, ``pcd_cli.quality.metrics``);
    ``mass``: mean candidate mass of the field on those rows."""

    n: int
    accuracy: float | None
    macro_f1: float | None
    nll: float | None
    ece: float | None
    mass: float | None = None


@dataclass
class EpochLog:
    """One epoch: mean training loss (nats per field decision), holdout scores per field, seconds."""

    epoch: int
    train_loss: float | None
    holdout: dict[str, FieldScores]
    seconds: float


@dataclass
class TuneResult:
    """What ``tune`` did. ``epochs[0]`` is the model before training (epoch 0, no loss)."""

    epochs: list[EpochLog]
    best_epoch: int
    train_rows: int
    holdout_rows: int
    skipped: list[str] = field(default_factory=list)
    #: what the user should know about the choice of epoch (a holdout too small to choose one)
    warnings: list[str] = field(default_factory=list)
    interrupted: bool = False
    steps: int = 0
    train_seconds: float = 0.0
    trainable_parameters: int = 0
    #: the kept epoch's holdout predictions: field index -> ((n, k) probabilities, (n,) gold); with
    #: ``cross_fit``, every gold row's out-of-fold prediction
    holdout_predictions: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)
    #: field index -> (n,) candidate masses of the same rows
    holdout_masses: dict[int, np.ndarray] = field(default_factory=dict, repr=False)
    #: the same rows' predictions (and masses) before training (epoch 0)
    base_predictions: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)
    base_masses: dict[int, np.ndarray] = field(default_factory=dict, repr=False)
    #: field index -> (n,) model input keys of the holdout rows (``results.input_key``): copies of
    #: one text are one group in the calibration's folds (``quality.folds``)
    holdout_inputs: dict[int, np.ndarray] = field(default_factory=dict, repr=False)
    #: ``--cross-fit``: folds, each fold's kept epoch, the final run's epochs, per-fold logs
    cross_fit: dict | None = None
    #: the epoch after which ``patience`` stopped training (``None``: every epoch ran)
    stopped_early: int | None = None


def gold_records(gold, schema: Schema, spec: InputSpec) -> tuple[list[Record], list[list[int | None]], list[str]]:
    """Gold rows as records and label indices, by ``pcd eval``'s rules (``gold_label_index``,
    ``gold_options``), one index per decision (``schema.fields``): a multi-select field's gold
    list becomes one boolean per option decision (0 = chosen, 1 = not).

    A missing or null gold cell, or a value that is not a label (not a list of the options),
    leaves that field (every option of it) out of the row's loss (``None``); a row with no
    usable text or no gold label at all is skipped.

    Returns:
        ``(records, labels per record per decision, messages for skipped rows)``.

    Raises:
        InputError: no field of the schema has a gold column.
    """
    from .quality.data import resolve_gold_columns

    specs = [(FieldSpec.of(f), len(part)) for f, part in schema.declared_parts()]
    gold = resolve_gold_columns(gold, [s for s, _ in specs], spec.id_field or "id")  # Argilla names, multi []
    if not any(s.name in gold.columns for s, _ in specs):
        raise InputError(f"the gold file has no column for any field of the schema "
                         f"({', '.join(s.name for s, _ in specs)}); columns: {', '.join(map(str, gold.columns))}")
    frame = gold.astype(object).where(gold.notna(), None)
    records, labels, skipped = [], [], []
    for i, row in enumerate(frame.to_dict("records")):
        record = row_to_record(row, i, None, spec)
        if isinstance(record, RecordFailure):
            skipped.append(record.error)
            continue
        row_labels: list[int | None] = []
        for s, width in specs:
            value = row.get(s.name)
            if s.is_multi:
                chosen = gold_options(value, s) if _present_gold(value) else None
                row_labels.extend([None] * width if chosen is None else [0 if yes else 1 for yes in chosen])
            else:
                row_labels.append(gold_label_index(value, s) if _is_present(value) else None)
        if all(lab is None for lab in row_labels):
            skipped.append(f"row {i} (id {record.id!r}): no gold label for any field")
            continue
        records.append(record)
        labels.append(row_labels)
    return records, labels, skipped


def stratified_holdout(labels: Sequence[int | None], fraction: float, seed: int,
                       groups: np.ndarray | None = None) -> np.ndarray:
    """Indices of a seeded holdout: ``round(fraction * n)`` of each gold label's rows (at least
    one of a label with two or more rows), rows without a label counted as one more stratum.
    With ``groups`` (``quality.folds.group_index`` of the rows' model inputs) whole groups are
    held, each counted once, stratified on its first row's label: copies of one text are never
    on both sides.

    Returns:
        int64 sorted indices into ``labels``.
    """
    if fraction <= 0:
        return np.zeros(0, dtype=np.int64)
    if groups is not None:
        groups = np.asarray(groups, dtype=np.int64)
        held_groups = stratified_holdout([labels[i] for i in first_rows(groups)], fraction, seed)
        return np.flatnonzero(np.isin(groups, held_groups)).astype(np.int64)
    rng = np.random.default_rng(seed)
    strata: dict[object, list[int]] = {}
    for i, label in enumerate(labels):
        strata.setdefault(label, []).append(i)
    held: list[int] = []
    for key in sorted(strata, key=lambda k: (k is None, k)):
        rows = np.array(strata[key])
        rng.shuffle(rows)
        k = int(round(fraction * len(rows)))
        if k == 0 and len(rows) >= 2:
            k = 1
        held.extend(rows[:k].tolist())
    return np.array(sorted(held), dtype=np.int64)


def holdout_scores(decoder: Decoder, records: Sequence[Record], labels: Sequence[Sequence[int | None]],
                   schema: Schema, predictions: dict | None = None, masses: dict | None = None,
                   inputs: dict | None = None) -> dict[str, FieldScores]:
    """Label ``records`` with ``decoder`` and score each field against ``labels``.

    ``predictions``, if given, is filled with field index -> ``((n, k) probabilities, (n,)
    gold indices)`` of the rows that have a gold label for that field (for the calibration);
    ``masses`` with field index -> (n,) candidate masses of the same rows, ``inputs`` with their
    model input keys (``results.input_key`` of the record text).
    """
    results = decoder.decode(records)
    out = {}
    for fi, f in enumerate(schema.fields):
        kept = [i for i, (r, lab) in enumerate(zip(results, labels))
                if lab[fi] is not None and not isinstance(r, RecordFailure)]
        rows = [(results[i], labels[i][fi]) for i in kept]
        if not rows:
            out[f.name] = FieldScores(0, None, None, None, None)
            continue
        probs = np.array([r.fields[fi].probs for r, _ in rows])
        gold = np.array([g for _, g in rows])
        mass = np.array([r.fields[fi].mass for r, _ in rows], dtype=np.float64)
        if predictions is not None:
            predictions[fi] = (probs, gold)
        if masses is not None:
            masses[fi] = mass
        if inputs is not None:
            inputs[fi] = np.array([input_key(records[i].text) for i in kept], dtype=object)
        out[f.name] = _field_scores(probs, gold, mass, f.labels)
    return out


def _field_scores(probs: np.ndarray, gold: np.ndarray, mass: np.ndarray, labels) -> FieldScores:
    pred = probs.argmax(1)
    return FieldScores(n=len(gold), accuracy=M.accuracy(gold, pred), macro_f1=M.macro_f1(M.label_scores(gold, pred, labels)),
                       nll=M.nll(probs, gold), ece=M.ece(probs.max(1), pred == gold), mass=float(np.mean(mass)))


def divergence(before: dict[str, FieldScores], after: dict[str, FieldScores],
               predictions: dict[int, tuple[np.ndarray, np.ndarray]], before_flat: dict[int, bool],
               schema: Schema) -> str | None:
    """Why an epoch's holdout shows a collapsed model, or ``None``.

    Checked per field with holdout rows: the NLL is NaN or infinite; the mean candidate mass
    fell below ``MASS_COLLAPSE`` times its value before training; every row's probabilities
    lie within ``FLAT_TOLERANCE`` of ``1/k`` when they did not before training
    (``before_flat[field index]``). A flat model lowers the NLL of a wrong one (``log k``), so
    without this check such an epoch looks like an improvement.

    Args:
        before, after: ``holdout_scores`` of epoch 0 and of this epoch.
        predictions: this epoch's ``(probabilities, gold)`` per field index (``holdout_scores``).
    """
    for fi, f in enumerate(schema.fields):
        b, a = before.get(f.name), after.get(f.name)
        if a is None or not a.n:
            continue
        if a.nll is None or not np.isfinite(a.nll):
            return f"field {f.name!r}: the holdout NLL is {a.nll} (NaN or infinite probabilities)"
        if b is not None and b.mass and a.mass is not None and a.mass < MASS_COLLAPSE * b.mass:
            return (f"field {f.name!r}: the candidate mass collapsed from {b.mass:.3g} to {a.mass:.2g} on the holdout "
                    "(the model no longer writes any label)")
        probs = predictions.get(fi, (None, None))[0]
        if probs is not None and _flat(probs) and not before_flat.get(fi, False):
            return (f"field {f.name!r}: the probabilities went flat (every label 1/{probs.shape[1]} on every "
                    "holdout row)")
    return None


def _flat(probs: np.ndarray) -> bool:
    return bool(len(probs)) and bool(np.all(np.abs(probs - 1.0 / probs.shape[1]) < FLAT_TOLERANCE))


def _diverged(reason: str, epoch: int, config: TuneConfig) -> TrainingDiverged:
    return TrainingDiverged(f"training diverged in epoch {epoch}: {reason}. --lr {config.lr:g} is probably too high "
                            f"(the default is {TuneConfig.lr:g}); nothing was written")


def _mean_nll(scores: dict[str, FieldScores]) -> float:
    values = [s.nll for s in scores.values() if s.nll is not None]
    return float(np.mean(values)) if values else float("nan")


def tune(backend, schema: Schema, records: list[Record], labels: list[list[int | None]], config: TuneConfig, *,
         examples=(), on_step: Callable[[int, int, float], None] | None = None,
         on_epoch: Callable[[EpochLog], None] | None = None,
         on_fold: Callable[[int, int, int, int, int], None] | None = None):
    """Train a LoRA adapter on ``backend``'s model through the decoder's reads.

    With ``config.cross_fit`` 0: one seeded, stratified holdout (``config.holdout``) picks the
    epoch and its predictions are the ones the calibration is fitted on. With
    ``config.cross_fit`` K >= 2: cross-fitting (``cross_fit_folds``): K fold runs, each
    trained on the other folds with its own fold as the holdout; every gold row gets an
    out-of-fold prediction from the run that did not train on it (the kept epoch's), the
    written model is then trained on all rows for the median of the folds' kept epochs, and
    the calibration is fitted on all the out-of-fold predictions. This is scikit-learn's
    ``CalibratedClassifierCV(ensemble=False)`` recipe (``cross_val_predict`` predictions for
    the calibrator, the final model fitted on all data): the calibration sees every row
    instead of a holdout's fifth, at the cost of K + 1 runs.

    Args:
        backend: a loaded ``TorchBackend`` (the adapter is injected into its model).
        records, labels: from ``gold_records``.
        examples: few-shot examples for the prompt head (``resolve_examples`` output), as
            ``pcd label --examples`` will use them.
        on_step: called after every optimiser step with ``(step, steps per epoch, loss)``.
        on_epoch: called with each ``EpochLog`` (epoch 0: before training).
        on_fold: called before each run of a cross-fit with ``(run, runs, training rows,
            holdout rows, epochs)``; the last run (``run == runs``) is the final one on all rows.

    Returns:
        ``(TuneResult, trainer)``: the trainer holds the kept adapter (``LoraTrainer.save``
        writes it). A ``KeyboardInterrupt`` during training stops it; the best adapter so far
        is kept and ``interrupted`` is set (in a cross-fit: during the final run).

    Raises:
        ModelError: peft missing or the model cannot take an adapter. InputError: no
        training rows are left after the holdout, or fewer gold rows than folds.
        TrainingDiverged: a step's loss is NaN or infinite or exploded (over
        ``LOSS_EXPLOSION`` times the first step's, as the median of the last
        ``LOSS_EXPLOSION_WINDOW`` steps), or an epoch's holdout shows a collapse
        (``divergence``); training stops there. TuneInterrupted (exit 130): a ``KeyboardInterrupt``
        during a cross-fit's fold runs, before there is a model to write.
    """
    run = _Runner(backend, schema, records, labels, config, examples, on_step, on_epoch)
    if config.cross_fit >= 2:
        return _cross_fit(run, on_fold), run.trainer
    first = [lab[0] for lab in labels]
    groups = group_index([input_key(r.text) for r in records])  # copies of one text: one side
    held = set(stratified_holdout(first, config.holdout, config.seed, groups).tolist())
    train = [i for i in range(len(records)) if i not in held]
    if not train:
        raise InputError(f"no gold rows left to train on ({len(records)} rows, holdout {config.holdout})")
    return run.train(train, sorted(held), config.epochs, seed=config.seed), run.trainer


class _Runner:
    """One tune's compiled prompt, decoder settings and trainer; ``train`` runs epochs on a
    training/holdout split from the adapter's initial weights and a fresh optimiser."""

    def __init__(self, backend, schema, records, labels, config, examples, on_step, on_epoch):
        from .backends.torch_tune import LoraTrainer

        self.backend, self.schema, self.records, self.labels, self.config = backend, schema, records, labels, config
        self.on_step, self.on_epoch = on_step, on_epoch
        self.orderings: list[CompiledSchema] = []
        if config.permutations > 1:
            from .decoding.permute import compile_orderings

            self.orderings = compile_orderings(schema, backend.tokenizer, config.permutations, scoring=config.scoring,
                                               logits_width=backend.logits_width, examples=examples)
        self.compiled = self.orderings[0] if self.orderings else CompiledSchema(
            schema, backend.tokenizer, scoring=config.scoring, logits_width=backend.logits_width, examples=examples)
        self.trainer = LoraTrainer(backend, rank=config.rank, lr=config.lr, seed=config.seed)
        self.initial_state = self.trainer.adapter_state()

    def decoder(self) -> Decoder:
        return Decoder(self.backend, self.compiled, orderings=self.orderings,
                       max_tokens_per_pass=self.config.max_tokens_per_pass)

    def train(self, train: list[int], held: list[int], epochs: int, *, seed: int) -> TuneResult:
        """Epochs 1..``epochs`` on rows ``train`` (indices), the holdout ``held`` scored before
        training and after each epoch; the trainer ends holding the kept epoch's adapter."""
        from .backends.torch_tune import field_loss

        config, schema, records, labels, trainer = self.config, self.schema, self.records, self.labels, self.trainer
        trainer.reset(self.initial_state)
        hold_records = [records[i] for i in held]
        hold_labels = [labels[i] for i in held]
        rng = np.random.default_rng(seed)
        predictions: dict = {}
        masses: dict = {}
        inputs: dict = {}  # the same rows every epoch

        def evaluate() -> dict[str, FieldScores]:
            predictions.clear()
            masses.clear()
            if not hold_records:
                return {}
            return holdout_scores(self.decoder(), hold_records, hold_labels, schema, predictions, masses, inputs)

        t0 = time.perf_counter()
        log = [EpochLog(0, None, evaluate(), time.perf_counter() - t0)]
        if self.on_epoch:
            self.on_epoch(log[0])
        before_flat = {fi: _flat(probs) for fi, (probs, _) in predictions.items()}
        result = TuneResult(epochs=log, best_epoch=0, train_rows=len(train), holdout_rows=len(hold_records),
                            trainable_parameters=trainer.trainable_parameters, holdout_predictions=dict(predictions),
                            holdout_masses=dict(masses), base_predictions=dict(predictions),
                            base_masses=dict(masses), holdout_inputs=dict(inputs))
        most = max((s.n for s in log[0].holdout.values()), default=0)
        if not hold_records:
            if not config.cross_fit:
                result.warnings.append("no holdout (--holdout 0): the last epoch is kept, unchecked against "
                                       "held-out rows")
        elif most < MIN_HOLDOUT_ROWS:
            result.warnings.append(f"the holdout has {most} row{'s' if most != 1 else ''}, too few to choose an "
                                   f"epoch (fewer than {MIN_HOLDOUT_ROWS}: the NLL of so few rows moves more than an "
                                   "epoch changes it); the kept epoch is a guess: give more gold rows or a larger "
                                   "--holdout")
        step_losses: list[float] = []
        best_state, best_nll = trainer.adapter_state(), _mean_nll(log[0].holdout)
        decoder = self.decoder()
        train_start = time.perf_counter()
        try:
            for epoch in range(1, epochs + 1):
                start = time.perf_counter()
                order = [train[i] for i in rng.permutation(len(train))]
                groups, failures = decoder.training_groups([records[i] for i in order])
                result.skipped.extend(f.error for f in failures if epoch == 1)
                losses = []
                for g, group in enumerate(groups):
                    rows = [order[i] for i in group]
                    reads = decoder.training_reads_by_ordering([records[i] for i in rows], [labels[i] for i in rows])
                    terms = [field_loss(forest, rd, len(schema.fields[fi].labels), labels[i][fi], config.mass_weight)
                             for i, per_ordering in zip(rows, reads) for per_field in per_ordering
                             for fi, (forest, rd) in per_field.items() if labels[i][fi] is not None]
                    if not terms:
                        continue
                    loss = trainer.step(terms)
                    if not np.isfinite(loss):
                        raise _diverged(f"the training loss is {loss} at step {g + 1}", epoch, config)
                    step_losses.append(loss)
                    recent = float(np.median(step_losses[-LOSS_EXPLOSION_WINDOW:]))
                    if recent > LOSS_EXPLOSION * max(step_losses[0], 1.0):
                        raise _diverged(f"the training loss exploded to {recent:.4g} at step {g + 1} (the median of "
                                        f"the last {min(len(step_losses), LOSS_EXPLOSION_WINDOW)} steps; the first "
                                        f"step's: {step_losses[0]:.4g})", epoch, config)
                    losses.append((loss, len(terms)))
                    result.steps += 1
                    if self.on_step:
                        self.on_step(g + 1, len(groups), loss)
                train_loss = (sum(l * n for l, n in losses) / sum(n for _, n in losses)) if losses else None
                entry = EpochLog(epoch, train_loss, evaluate(), time.perf_counter() - start)
                log.append(entry)
                if self.on_epoch:
                    self.on_epoch(entry)
                reason = divergence(log[0].holdout, entry.holdout, predictions, before_flat, schema)
                if reason is not None:
                    raise _diverged(reason, epoch, config)
                nll = _mean_nll(entry.holdout)
                if not hold_records or (np.isfinite(nll) and not nll >= best_nll):  # a finite NLL beats a NaN one
                    best_state, best_nll, result.best_epoch = trainer.adapter_state(), nll, epoch
                    result.holdout_predictions, result.holdout_masses = dict(predictions), dict(masses)
                elif config.patience and epoch - result.best_epoch >= config.patience and epoch < epochs:
                    result.stopped_early = epoch
                    break
        except KeyboardInterrupt:
            result.interrupted = True
        result.train_seconds = time.perf_counter() - train_start
        if hold_records and result.best_epoch == 0 and len(log) > 1:
            result.warnings.append("no epoch improved on the holdout NLL: the written model is the base model "
                                   "(epoch 0, untrained)")
        trainer.load_adapter_state(best_state)
        return result


def cross_fit_folds(labels: Sequence[int | None], folds: int, seed: int,
                    groups: np.ndarray | None = None) -> np.ndarray:
    """Each row's fold (``0 .. folds-1``): stratified on ``labels`` (the first field's gold,
    ``None`` a stratum of its own) by scikit-learn's ``StratifiedKFold(shuffle=True,
    random_state=seed)``; a label with fewer rows than folds is spread as far as it goes. With
    ``groups`` (``quality.folds.group_index`` of the rows' model inputs) the groups are folded,
    each by its first row's label, and every row goes to its group's fold.

    Returns:
        (n,) int64 fold indices.

    Raises:
        InputError: fewer rows than folds.
    """
    import warnings

    from sklearn.model_selection import StratifiedKFold

    if groups is not None:
        groups = np.asarray(groups, dtype=np.int64)
        first = first_rows(groups)
        if len(first) < folds:
            raise InputError(f"--cross-fit {folds}: {len(labels)} gold rows hold {len(first)} distinct texts, fewer "
                             "than the folds")
        return cross_fit_folds([labels[i] for i in first], folds, seed)[groups]
    n = len(labels)
    if n < folds:
        raise InputError(f"--cross-fit {folds}: {n} gold rows, fewer than the folds")
    strata = np.array([-1 if lab is None else int(lab) for lab in labels])
    out = np.zeros(n, dtype=np.int64)
    with warnings.catch_warnings():  # "the least populated class has only 1 member": spread as it goes
        warnings.simplefilter("ignore", UserWarning)
        for k, (_, part) in enumerate(StratifiedKFold(folds, shuffle=True, random_state=seed).split(strata, strata)):
            out[part] = k
    return out


def _pool(parts: Sequence[dict], masses: Sequence[dict]) -> tuple[dict, dict]:
    """Field index -> concatenated ``(probs, gold)`` and masses of the fold runs' predictions."""
    pooled, pooled_mass = {}, {}
    for fi in sorted({fi for part in parts for fi in part}):
        chunks = [part[fi] for part in parts if fi in part]
        pooled[fi] = (np.concatenate([c[0] for c in chunks]), np.concatenate([c[1] for c in chunks]))
        pooled_mass[fi] = np.concatenate([m[fi] for m in masses if fi in m])
    return pooled, pooled_mass


def _cross_fit(run: _Runner, on_fold) -> TuneResult:
    config, schema = run.config, run.schema
    k = config.cross_fit
    fold_of = cross_fit_folds([lab[0] for lab in run.labels], k, config.seed,
                              group_index([input_key(r.text) for r in run.records]))
    runs, per_fold = [], []
    for fold in range(k):
        held = np.flatnonzero(fold_of == fold).tolist()
        train = np.flatnonzero(fold_of != fold).tolist()
        if on_fold:
            on_fold(fold + 1, k + 1, len(train), len(held), config.epochs)
        result = run.train(train, held, config.epochs, seed=config.seed + fold)
        if result.interrupted:
            raise TuneInterrupted(f"interrupted in cross-fit fold {fold + 1} of {k}: nothing is written (the model "
                              "to write trains after the folds)")
        runs.append(result)
        per_fold.append({"fold": fold + 1, "train_rows": len(train), "holdout_rows": len(held),
                         "best_epoch": result.best_epoch, "stopped_early": result.stopped_early,
                         "train_seconds": round(result.train_seconds, 2),
                         "holdout_nll": [_mean_nll(e.holdout) for e in result.epochs],
                         "warnings": list(result.warnings)})
    kept = [r.best_epoch for r in runs]
    final_epochs = int(np.floor(np.median(kept) + 0.5))
    everything = list(range(len(run.records)))
    if on_fold:
        on_fold(k + 1, k + 1, len(everything), 0, final_epochs)
    final = run.train(everything, [], final_epochs, seed=config.seed)
    base, base_mass = _pool([r.base_predictions for r in runs], [r.base_masses for r in runs])
    oof, oof_mass = _pool([r.holdout_predictions for r in runs], [r.holdout_masses for r in runs])
    _, oof_inputs = _pool([r.holdout_predictions for r in runs], [r.holdout_inputs for r in runs])
    before, after = pooled_scores(base, base_mass, schema), pooled_scores(oof, oof_mass, schema)
    final.epochs[0] = EpochLog(0, None, before, final.epochs[0].seconds)
    final.epochs[-1] = EpochLog(final.epochs[-1].epoch, final.epochs[-1].train_loss, after, final.epochs[-1].seconds)
    final.best_epoch = final_epochs
    final.holdout_predictions, final.holdout_masses, final.holdout_inputs = oof, oof_mass, oof_inputs
    final.base_predictions, final.base_masses = base, base_mass
    final.holdout_rows = len(everything)
    final.train_seconds += sum(r.train_seconds for r in runs)
    final.steps += sum(r.steps for r in runs)
    final.skipped = runs[0].skipped + [s for s in final.skipped if s not in runs[0].skipped]
    final.cross_fit = {"folds": k, "kept_epochs": kept, "final_epochs": final_epochs, "per_fold": per_fold}
    for fold, r in enumerate(runs, 1):
        final.warnings.extend(f"fold {fold} of {k}: {w}" for w in r.warnings)
    if final_epochs == 0:
        final.warnings.append(f"the folds kept epochs {kept}: the median is 0, so the written model is the base "
                              "model (untrained)")
    return final


def pooled_scores(predictions: dict, masses: dict, schema: Schema) -> dict[str, FieldScores]:
    """Per field, ``holdout_scores``' figures of pooled predictions (field index -> ``(probs,
    gold)`` and masses): the cross-fit's out-of-fold scores."""
    out = {}
    for fi, f in enumerate(schema.fields):
        if fi not in predictions or not len(predictions[fi][1]):
            out[f.name] = FieldScores(0, None, None, None, None)
            continue
        probs, gold = predictions[fi]
        out[f.name] = _field_scores(probs, gold, masses[fi], f.labels)
    return out


#: ``fit_tune_calibration``: a field with fewer holdout rows than this is left uncalibrated.
MIN_CALIBRATION_ROWS = 10


def fit_tune_calibration(result: TuneResult, schema: Schema, metadata: dict[str, str], *, model: str,
                         seed: int = 0, objective: Objective = LIKELIHOOD, force_rule: bool = False):
    """The calibration a tune can trust, fitted on the kept epoch's holdout predictions (rows
    the adapter never trained on; they only chose the epoch), per field by
    ``pcd_cli.quality.calibration.fit_trusted``: a temperature alone when rows are few
    (fewer than ``BIAS_ROWS_PER_LABEL`` per label), else temperature and per-label biases if
    their cross-validated NLL is lower.

    Args:
        metadata: the tuning ``Labeler.metadata()`` (schema, prompt head and scoring the
            calibration is tied to). model: the ``pcd.model`` that ``pcd label`` will record
            for the tuned model (a merged folder: the folder's name; an adapter: its base's id).

    A field whose fitted calibration makes any cross-validated figure worse
    (``calibration.held_out_worse``: NLL up over 1 %, accuracy or macro-F1 down over 0.01 with
    neither up over 0.01) is
    left uncalibrated: pcd never applies by default what its own check says is worse.

    objective: ``pcd tune --objective``: each field's decision rule is fitted on the holdout's
    cross-validated calibrated probabilities (``fit_trusted``); a field below the floor keeps
    argmax, said in the notes, and so does a field whose rule shows no held-out gain over argmax
    unless ``force_rule``. The calibration names the objective when a rule was fitted.

    Returns:
        ``(Calibration or None, notes)``: ``None`` when no field has ``MIN_CALIBRATION_ROWS``
        holdout rows (``--holdout 0`` keeps none) or every field was left out; notes say which
        fields were left out and why.
    """
    from .quality.calibration import Calibration, fit_trusted, fitted_for, held_out_worse
    fields, notes = {}, []
    for fi, f in enumerate(schema.fields):
        probs, gold = result.holdout_predictions.get(fi, (np.zeros((0, len(f.labels))), np.zeros(0, dtype=int)))
        if len(gold) < MIN_CALIBRATION_ROWS:
            notes.append(f"field {f.name!r}: {len(gold)} holdout rows, fewer than {MIN_CALIBRATION_ROWS}: not calibrated")
            continue
        fitted = fit_trusted(f.name, f.labels, probs, gold, seed=seed, objective=objective, notes=notes,
                             inputs=result.holdout_inputs.get(fi), force_rule=force_rule)
        worse = held_out_worse(fitted.cv)
        if worse:  # a calibration its own cross-validation says is worse is not written, nor applied
            notes.append(f"field {f.name!r}: calibrating made the holdout worse on rows its fit did not see "
                         f"({', '.join(worse)}; {fitted.cv['folds']}-fold cross-validation on {fitted.n} rows): "
                         "not calibrated, the raw probabilities are kept")
            continue
        fields[f.name] = fitted
    if not fields:
        return None, notes
    return Calibration(pcd_version=__version__, model=model, schema_sha256=metadata["pcd.schema_sha256"],
                       prompt_head_sha256=metadata["pcd.prompt_head_sha256"], scoring=metadata["pcd.scoring"],
                       fields=fields, dtype=metadata.get("pcd.dtype", ""), fitted_for=fitted_for(metadata),
                       objective=(objective if any(fc.rule is not None for fc in fields.values())
                                  else LIKELIHOOD).name), notes


def calibration_card(calibration, notes: Sequence[str], holdout_rows: int, cross_fit: dict | None = None) -> dict:
    """The card's ``calibration`` entry: the file (or ``None``), what it was fitted on, and per
    field the method, why, T, biases and its cross-validated before/after scores."""
    if calibration is None:
        return {"file": None, "notes": list(notes)}
    fitted_on = (f"out-of-fold predictions of all {holdout_rows} gold rows ({cross_fit['folds']} fold runs, each row "
                 "predicted by the run that did not train on it, at that run's kept epoch)" if cross_fit else
                 f"the kept epoch's predictions of the {holdout_rows} holdout rows (never trained on)")
    return {"file": CALIBRATION_NAME,
            "fitted_on": fitted_on,
            "fields": {name: {"method": fc.cv["method"], "reason": fc.cv["reason"], "temperature": fc.temperature,
                              "biases": dict(zip(fc.labels, fc.biases)), "n": fc.n,
                              "cv_before": fc.cv["before"], "cv_after": fc.cv["after"]}
                       for name, fc in calibration.fields.items()},
            "notes": list(notes)}


def file_sha256(path: str | Path) -> str:
    """SHA-256 (hex) of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def make_card(*, base_model: str, base_key: str, metadata: dict[str, str], gold_path: str | Path,
              records: Sequence[Record], result: TuneResult, config: TuneConfig, adapter_only: bool,
              calibration: dict | None = None) -> dict:
    """The provenance card ``pcd-tune.json``: base model and its content key, the schema and
    prompt head it was trained for (``Labeler.metadata`` keys), the gold file's name (not its
    path: no path of the training machine is written) and sha256 and the ids of the rows used, the hyperparameters, per-epoch loss and holdout metrics (mean
    candidate mass included), and ``calibration`` (``calibration_card``)."""
    return {
        "pcd_version": __version__,
        "kind": "adapter" if adapter_only else "merged",
        "base_model": base_model,
        "base_model_key": base_key,
        "schema_name": metadata["pcd.schema_name"],
        "schema_sha256": metadata["pcd.schema_sha256"],
        "prompt_head_sha256": metadata["pcd.prompt_head_sha256"],
        "scoring": metadata["pcd.scoring"],
        "dtype": metadata.get("pcd.dtype"),
        "examples": int(metadata["pcd.examples"]),
        "gold_file": Path(gold_path).name,  # its name: the folder travels, this machine's paths do not
        "gold_sha256": file_sha256(gold_path),
        "rows_used": len(records),
        "train_rows": result.train_rows,
        "holdout_rows": result.holdout_rows,
        "record_ids_sha256": hashlib.sha256("\n".join(str(r.id) for r in records).encode()).hexdigest(),
        "hyperparameters": asdict(config) | {"objective": config.objective.name},
        "trainable_parameters": result.trainable_parameters,
        "best_epoch": result.best_epoch,
        "stopped_early": result.stopped_early,
        "warnings": list(result.warnings),
        "interrupted": result.interrupted,
        "train_seconds": round(result.train_seconds, 2),
        "epochs": [{"epoch": e.epoch, "train_loss": e.train_loss, "seconds": round(e.seconds, 2),
                    "holdout": {k: asdict(v) for k, v in e.holdout.items()}} for e in result.epochs],
    } | ({"cross_fit": result.cross_fit} if result.cross_fit else {}) | (
        {"calibration": calibration} if calibration is not None else {})
