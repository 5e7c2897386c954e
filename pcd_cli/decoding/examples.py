"""Few-shot examples for the prompt head: from the schema's ``examples:`` key or drawn from a gold file.

An example is shown to the model as a prior user/assistant exchange whose answer object is
written exactly as the decoder writes and scores lines (``pcd_cli.decoding.prompt.answer_object``).
Examples live in the head, so they cost one prefill per run, not per record.

``draw_examples`` picks K labelled rows from a gold file, balanced over each field's labels
and deterministic for a given seed: rows are shuffled with ``random.Random(seed)``, then
each pick takes the row whose labels are the least represented so far (the sum over fields
of ``1 / (1 + picks of that row's label)``), the earlier row in shuffled order on ties.
"""

from __future__ import annotations

import random
from pathlib import Path

from ..errors import InputError, SchemaError
from ..io.readers import InputSpec, row_to_record
from ..schema.model import Example, Schema, decision_labels


def resolve_examples(examples: tuple[Example, ...], template: str | None = None) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``(input text, label index per field)`` of each example, texts filled from ``template`` where
    an example gives ``columns``.

    Raises:
        SchemaError: an example cannot become a text (names the example).
    """
    return tuple((e.render_text(template), e.labels) for e in examples)


def draw_examples(gold_path: str | Path, schema: Schema, spec: InputSpec, *, shots: int, seed: int = 0,
                  fmt: str | None = None) -> tuple[Example, ...]:
    """Draw ``shots`` examples from a gold file, balanced over each field's labels (module doc).

    Only rows with a usable text and a valid label for every field qualify; the others are
    skipped. Args as for ``pcd label``: ``spec`` says where the text (or template columns)
    and the id are.

    Raises:
        InputError: the file cannot be read, or has fewer qualifying rows than ``shots``
            (names how many qualify and why the others did not).
    """
    if shots < 1:
        raise InputError(f"--shots {shots}: give at least 1")
    from ..io.annotations import gold_rows  # a Label Studio / Argilla export, a filled review sheet

    candidates: list[tuple[str, tuple[int, ...], str]] = []
    skipped: dict[str, int] = {}
    for index, (line, row) in enumerate(gold_rows(gold_path, spec, fmt=fmt, fields=schema.declared)):
        if isinstance(row, str):
            skipped["unreadable"] = skipped.get("unreadable", 0) + 1
            continue
        record = row_to_record(row, index, line, spec)
        if not hasattr(record, "text"):
            skipped["no text"] = skipped.get("no text", 0) + 1
            continue
        try:
            labels = decision_labels(schema.declared, row)
        except SchemaError:
            skipped["a field without a valid label"] = skipped.get("a field without a valid label", 0) + 1
            continue
        where = f"{Path(gold_path).name} " + (f"line {line}" if line is not None else f"row {index}")
        candidates.append((record.text, labels, where))
    if len(candidates) < shots:
        why = ", ".join(f"{n} with {reason}" for reason, n in skipped.items()) or "none skipped"
        raise InputError(f"--examples {str(gold_path)!r}: {len(candidates)} rows have a text and a label for every "
                         f"field ({why}); --shots {shots} needs at least that many")
    order = list(range(len(candidates)))
    random.Random(seed).shuffle(order)
    counts = [dict.fromkeys(range(len(f.labels)), 0) for f in schema.fields]
    picked: list[int] = []
    remaining = order
    for _ in range(shots):
        _, best = max(enumerate(remaining), key=lambda p: (
            sum(1.0 / (1 + counts[k][lab]) for k, lab in enumerate(candidates[p[1]][1])), -p[0]))
        remaining = [i for i in remaining if i != best]
        picked.append(best)
        for k, lab in enumerate(candidates[best][1]):
            counts[k][lab] += 1
    return tuple(Example(labels=candidates[i][1], text=candidates[i][0], source=candidates[i][2]) for i in picked)
