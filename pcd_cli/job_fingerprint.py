"""What a labelling job's values depend on, in one place: the job fingerprint.

A row's values are a function of two things (docs/labelling.md, "Nightly runs"): the text the model
reads and the job that reads it. The text is keyed per row (``engines.reuse.input_key``); the job
is keyed here, as named parts (``job_parts``), so that ``pcd label --reuse`` copies a row only from
an output of the same job, ``--resume`` continues only the same run, and a calibration file (fitted
readouts included) applies only to the model, tokenizer, adapter and prompt it was fitted on
(``model_parts``, checked by ``pcd_cli.quality.calibration.Calibration.check``).

The parts cover everything the model reads and every option that can change a decision:

- the model's weights by content (``backend.content_key``: the GGUF or weight files' SHA-256, both
  backends), never by name; the tokenizer by content (``HFTokenizer.content_key``: vocabulary,
  merges, special tokens, the chat template's source); the adapter's files by content;
- the backend, dtype, device kind and the versions of the libraries that compute;
- the whole rendered prompt around a record (``Prompt.rendering_sha256``: head, the text after the
  record, the record's own rendering), the schema, few-shot examples;
- every ``LabelJob`` option that changes a value (``OPTION_PARTS``). An option that cannot change a
  value says why in ``DECISION_NEUTRAL``; ``tests/test_job_fingerprint.py`` fails when an option of
  ``LabelJob`` is in neither, so a new option cannot silently break reuse.

This module sits beside ``pcd_cli.job``: it reads a built ``Labeler`` (duck-typed; it never builds
one) and imports no backend.
"""

from __future__ import annotations

import hashlib
import json

from .backends.select import library_versions
from .version import __version__

#: The fingerprint's parts in the order they are compared (the first that differs is named),
#: each with how a message names it.
PARTS = (
    ("pcd_version", "another pcd version"),
    ("model", "another model (weights)"),
    ("tokenizer", "another tokenizer or chat template (the model folder's tokenizer files)"),
    ("adapter", "another adapter"),
    ("backend", "another backend"),
    ("dtype", "another dtype"),
    ("device", "another device kind"),
    ("libraries", "other versions of the backend's libraries (backends.select.KINDS)"),
    ("schema", "another schema"),
    # the options that change the prompt come before it, so that the message names the option
    ("examples", "other few-shot examples"),
    ("scoring", "another --scoring"),
    ("truncate", "another --truncate"),
    ("permutations", "another --permutations"),
    ("isolate_fields", "another isolate_fields"),
    ("steering_check", "another --steering-check (records whose sentences address the labeller decoded without them)"),
    ("prompt", "another prompt (the chat template around the record, or the record's rendering)"),
    ("calibration", "another calibration"),
    ("prior_correction", "another --prior-correction"),
    ("abstaining", "another abstention (--abstain-below, --abstain-unless-single)"),
)
PART_NAMES = tuple(name for name, _ in PARTS)

#: ``LabelJob`` option -> the parts that cover it (a value it changes shows in these parts).
OPTION_PARTS: dict[str, tuple[str, ...]] = {
    "model": ("model", "tokenizer", "prompt"),
    "adapter": ("adapter",),
    "device": ("device",),
    "dtype": ("dtype",),
    "backend": ("backend", "libraries"),
    "scoring": ("scoring",),
    "truncate": ("truncate",),
    "permutations": ("permutations",),
    "prior_correction": ("prior_correction",),
    "isolate_fields": ("isolate_fields",),
    "calibration": ("calibration",),
    "tuned_calibration": ("calibration",),
    "abstain_below": ("abstaining",),
    "abstain_unless_single": ("abstaining",),
    "examples": ("examples",),
    "shots": ("examples",),
    "seed": ("examples",),
    "drawn_examples": ("examples",),
    "steering_check": ("steering_check",),
    "record_quoting": ("prompt",),  # the head's data notice and the probe records' rendering (rendering_sha256)
}

#: ``LabelJob`` option -> why it changes no value of a row under the same row key.
DECISION_NEUTRAL: dict[str, str] = {
    "template": "what the model reads of a row is keyed per row: __input_sha256 is the SHA-256 of the text after "
                "--template (engines.reuse.input_key)",
    "text_field": "keyed per row, as template: the text after --text-field is what __input_sha256 hashes",
    "id_field": "names a row, never changes its values: every copy keeps its own id",
    "max_tokens_per_pass": "changes how records are packed into passes, which moves values only within the "
                           "packing bound (1e-5, tests/decoding/test_oracle.py)",
    "trace": "writes per-field traces beside the output, never a value of a row",
}

#: The parts a calibration file (and a readout in it) is fitted for and checked against on load
#: (``Calibration.check``): what the model reads and how its logits are read. A calibration of
#: another dtype or backend is named, not refused (``Calibration.dtype_warnings``).
CALIBRATION_PARTS = ("model", "tokenizer", "adapter", "schema", "prompt", "scoring")
#: Said in messages where a calibration's part differs: what to do about it.
CALIBRATION_PART_FIXES = {
    "model": "fitted on other weights",
    "tokenizer": "fitted with another tokenizer or chat template",
    "adapter": "fitted with another adapter",
    "schema": "fitted for another schema",
    "prompt": "fitted on another prompt",
    "scoring": "fitted for another --scoring",
}

#: Output metadata: ``model_parts`` as a JSON object (``Labeler.metadata``); a calibration fitted on
#: the output records them (``Calibration.fitted_for``).
MODEL_PARTS_KEY = "pcd.model_parts"

#: ``job_parts``' entry for a job that decides each field alone (``per_field``): JSON of
#: ``field_parts``. Not in ``PARTS``: the ``schema`` part already tells two jobs' fields apart.
FIELDS_PART = "fields"
#: The parts a per-field job compares field by field instead (``reusable_fields``).
PER_FIELD = ("schema", "calibration", "abstaining")


def sha256_of(value) -> str:
    """SHA-256 (hex) of ``value`` as canonical JSON (keys sorted; non-JSON values by ``repr``)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=repr, ensure_ascii=False).encode()).hexdigest()


def model_parts(labeler) -> dict[str, str]:
    """What ``labeler``'s model reads and how, by content: the ``model`` (weights), ``tokenizer``,
    ``adapter``, ``backend``, ``dtype``, ``schema``, ``prompt`` and ``scoring`` parts of
    ``job_parts`` (strings; hashes are SHA-256 hex). Output metadata records them
    (``pcd.model_parts``) and a calibration fitted on those outputs is checked against them."""
    backend = labeler.backend
    merged = getattr(backend, "merged_adapter", None)
    adapter = "none"
    if merged is not None:
        adapter = getattr(backend, "adapter_content_key", None) or f"folder:{merged[0]}"
    return {
        "model": str(getattr(backend, "content_key", None) or f"id:{backend.model_id}"),
        "tokenizer": str(getattr(backend.tokenizer, "content_key", None) or "unknown"),
        "adapter": adapter,
        "backend": type(backend).__name__,
        "dtype": str(getattr(backend, "dtype_name", "")),
        "schema": labeler.schema.source_sha256,
        "prompt": labeler.compiled.prompt.rendering_sha256,
        "scoring": labeler.compiled.scoring,
    }


def job_parts(labeler) -> dict[str, str]:
    """The job fingerprint of ``labeler``: everything that changes a row's values, as ``PARTS``
    names them (strings; hashes are SHA-256 hex): ``model_parts`` and the device kind (``cpu``,
    ``cuda``, ``mps``), the library versions, pcd's version, examples, truncation, permutations,
    isolation, calibration (the file's SHA-256: its readouts and rules included), prior correction
    and abstention. The token budget per pass and batch sizes are left out (``DECISION_NEUTRAL``)."""
    calibration = labeler.calibration
    parts = model_parts(labeler) | {
        "pcd_version": __version__,
        "device": str(getattr(labeler.backend, "device", "cpu")).split(":")[0],
        "libraries": ", ".join(f"{name} {version}" for name, version in library_versions(labeler.backend).items()),
        "examples": sha256_of([repr(e) for e in labeler.examples]),
        "truncate": labeler.decoder.truncate,
        "permutations": str(labeler.permutations),
        "isolate_fields": str(bool(labeler.isolate_fields)).lower(),
        "steering_check": "on" if labeler.job.steering_check else "off",
        "calibration": calibration.sha256 if calibration is not None else "none",
        "prior_correction": "on" if labeler.priors is not None else "off",
        "abstaining": sha256_of([labeler.abstain_thresholds, bool(labeler.abstain_unless_single)]),
    }
    ordered = {name: parts[name] for name in PART_NAMES}
    return ordered | ({FIELDS_PART: json.dumps(field_parts(labeler), sort_keys=True)} if per_field(labeler) else {})


def per_field(labeler) -> bool:
    """Whether ``labeler``'s fields are each decided alone (``isolate_fields`` and no rules
    between fields: a field's values then depend on the record, the instructions, that field and
    its own calibration and abstention only), so that an earlier output of a job that differs
    in other fields can lend the fields that did not change (``reusable_fields``)."""
    return bool(labeler.isolate_fields) and getattr(labeler, "rules", None) is None


def per_field_names(labeler) -> tuple[str, ...]:
    """``labeler``'s declared field names when its fields are decided alone (``per_field``), for
    ``ReuseIndex(fields=...)``; ``()`` otherwise."""
    return tuple(f.name for f in labeler.schema.declared) if per_field(labeler) else ()


def field_parts(labeler) -> dict[str, str]:
    """Per declared field of an isolated job (``per_field``): SHA-256 (hex) of what its values
    depend on beyond the parts shared by every field (``PARTS`` but ``PER_FIELD``): the
    instructions, the key its branch writes, the field and its decisions as declared, each
    decision's calibration (``FieldCalibration.fingerprint``: without its held-out figures; a
    fitted readout included) and abstention threshold, and whether it abstains unless its label
    set is single."""
    schema, calibration = labeler.schema, labeler.calibration
    sets = set(getattr(labeler, "set_fields", ()) or ())
    out = {}
    for declared, part in schema.declared_parts():
        decisions = [schema.fields[i] for i in part]
        calibrations = []
        for d in decisions:
            fc = calibration.fields.get(d.name) if calibration is not None else None
            calibrations.append(None if fc is None else fc.fingerprint())
        out[declared.name] = sha256_of([schema.instructions, schema.isolated_key, repr(declared),
                                        [repr(d) for d in decisions], calibrations,
                                        [labeler.abstain_thresholds.get(d.name) for d in decisions],
                                        bool(labeler.abstain_unless_single) and any(d.name in sets for d in decisions)])
    return out


def reusable_fields(theirs: dict, ours: dict) -> list[str]:
    """The declared fields (this run's, sorted by name) whose values an earlier output of job
    ``theirs`` holds as this run's job ``ours`` would write them: both jobs decide each field
    alone (``per_field``), every part but ``PER_FIELD`` is the same, and the field's own part
    (``field_parts``) too. Empty when nothing can be reused per field."""
    if FIELDS_PART not in theirs or FIELDS_PART not in ours:
        return []
    if any(theirs.get(name) != ours.get(name) for name in PART_NAMES if name not in PER_FIELD):
        return []
    before, now = json.loads(theirs[FIELDS_PART]), json.loads(ours[FIELDS_PART])
    return [name for name, sha in now.items() if before.get(name) == sha]


def first_difference(theirs: dict, ours: dict) -> str | None:
    """How the earlier job ``theirs`` differs from this run's ``ours`` (both ``job_parts``, or
    both ``model_parts``), as a message naming the first differing part in ``PARTS`` order and
    both values (hashes shortened: ``sha256 ab12cd34... vs 9f3e0a1b...``, the earlier one's
    first); ``None`` when every part ``ours`` has is the same."""
    for name, said in PARTS:
        if name not in ours:
            continue
        a, b = theirs.get(name), ours.get(name)
        if a == b:
            continue
        if a is None:
            return f"labelled without a record of its {name.replace('_', ' ')} (an older pcd)"
        if is_sha256(a) and is_sha256(b):
            return f"labelled with {said} (sha256 {a[:8]}... vs {b[:8]}...)"
        return f"labelled with {said} ({short(a)} vs {short(b)})"
    return None


def is_sha256(value) -> bool:
    """Whether ``value`` is a SHA-256 hex digest (64 lower-case hex digits)."""
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def short(value) -> str:
    """A sha256 as ``sha256`` and its first 8 hex digits; anything else (``none``) as it is."""
    return f"sha256 {value[:8]}..." if is_sha256(value) else str(value)
