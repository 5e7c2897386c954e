"""Order-debiased labelling (``--permutations K``): each field's probabilities combined over K
orderings of its labels in the prompt.

Small models prefer a label for its place in the list (Zheng et al. 2024, "Large Language
Models Are Not Robust Multiple Choice Selectors"; Pezeshkpour and Hruschka 2023, "Large
Language Models Sensitivity to The Order of Options"). pcd lists the allowed values of the
booleans and enums *after the record* (``prompt.values_after_record``) once per ordering, so
the record's tokens, which every ordering shares, are fed once and each ordering is a branch
attending to them (``Decoder(orderings=...)``): the cost per record is the record once plus K
short tails and answer forests, well below K separate prompts. The system catalog names the
keys and descriptions and says the values follow the input, so the head (and its KV cache) is
the same for every ordering.

The orderings: for a field of ``n`` labels, the cyclic shifts of the schema's list and their
reversals, ``shift 0, reversed(shift 0), shift 1, reversed(shift 1), ...`` (duplicates
dropped: ``2n`` orders, 2 for ``n = 2``); ordering ``k`` lists every permuted field in its
``k``-th order (modulo its count). Ordinal and integer scales keep their order (it is their
meaning), and a multi field's options are separate yes/no decisions.

Combination: the arithmetic mean of the orderings' label probabilities (and candidate
masses), the label its argmax. The mean is the label distribution under an ordering drawn
uniformly from the set, the quantity that does not depend on which ordering the schema file
happens to list; it stays a distribution without renormalising and keeps a label that one
ordering prefers strongly (a product of probabilities would veto it). ``order_spread`` is the
largest minus the smallest probability of the chosen label over the orderings. With every
ordering of the set (``K = 2n``), the set is closed under reversing or shifting the schema's
list, so a field's combined probabilities do not depend on that list's order (exactly when the
schema has one permuted field, or all permuted fields have as many labels).
"""

from __future__ import annotations

import numpy as np

from ..errors import SchemaError
from ..results import FieldResult, RecordResult
from ..schema.model import Schema
from .compile import CompiledSchema
from .prompt import is_permuted


def label_orderings(n: int) -> list[tuple[int, ...]]:
    """The distinct cyclic shifts of ``range(n)`` and their reversals, in the order
    ``shift 0, reversed(shift 0), shift 1, reversed(shift 1), ...`` (``2n`` of them for
    ``n >= 3``; 2 for ``n = 2``; 1 for ``n = 1``)."""
    out: list[tuple[int, ...]] = []
    for shift in range(n):
        order = tuple((shift + i) % n for i in range(n))
        for candidate in (order, order[::-1]):
            if candidate not in out:
                out.append(candidate)
    return out


def max_orderings(schema: Schema) -> int:
    """The most distinct orderings ``--permutations`` can use for ``schema``: the largest
    count of ``label_orderings`` over its permuted fields (0 when it has none)."""
    return max((len(label_orderings(len(f.labels))) for f in schema.declared if is_permuted(f)), default=0)


def orderings_for(schema: Schema, k: int) -> list[dict[str, tuple[int, ...]]]:
    """``k`` label orders per permuted field: ordering ``j`` gives each permuted field its
    ``j``-th ``label_orderings`` entry (modulo their count).

    Raises:
        SchemaError: ``k`` below 2, the schema has no boolean or enum field, or ``k`` exceeds
            ``max_orderings`` (the orderings would repeat); exit 2.
    """
    most = max_orderings(schema)
    if k < 2:
        raise SchemaError(f"--permutations {k}: give 2 or more (1 is the plain prompt)")
    if most == 0:
        raise SchemaError("--permutations: the schema has no boolean or enum field whose labels could be reordered")
    if k > most:
        raise SchemaError(f"--permutations {k}: this schema has at most {most} distinct orderings "
                           "(the cyclic shifts of its longest label list and their reversals)")
    fields = [f for f in schema.declared if is_permuted(f)]
    return [{f.name: label_orderings(len(f.labels))[j % len(label_orderings(len(f.labels)))] for f in fields}
            for j in range(k)]


def compile_orderings(schema: Schema, tokenizer, k: int, **compile_args) -> list[CompiledSchema]:
    """The schema compiled once per ordering (``orderings_for``), all in the layout the first
    one probes; ``compile_args`` go to ``CompiledSchema``.

    Raises:
        SchemaError: as ``orderings_for``. CompileError: as ``CompiledSchema``.
    """
    orders = orderings_for(schema, k)
    first = CompiledSchema(schema, tokenizer, label_orders=orders[0], **compile_args)
    compile_args = dict(compile_args, layout=first.layout)
    return [first] + [CompiledSchema(schema, tokenizer, label_orders=o, **compile_args) for o in orders[1:]]


def combine(results: list[RecordResult], schema: Schema) -> RecordResult:
    """One record's results under each ordering -> its combined result (module doc): per
    field the mean of the probabilities and masses, the argmax label, ``order_spread``;
    the traces of every ordering, in ordering order.

    Args:
        results: one ``RecordResult`` per ordering, fields in schema order (label indices in
            the schema's order: the orderings change the prompt, not the indices).
    """
    fields = []
    for field, per_order in zip(schema.fields, zip(*(r.fields for r in results))):
        probs = np.mean([np.asarray(f.probs, dtype=np.float64) for f in per_order], axis=0)
        label = int(np.argmax(probs))
        spread = max(f.probs[label] for f in per_order) - min(f.probs[label] for f in per_order)
        fields.append(FieldResult(label=label, value=field.value(label), prob=float(probs[label]),
                                  mass=float(np.mean([f.mass for f in per_order])),
                                  probs=tuple(float(p) for p in probs), order_spread=float(spread)))
    return RecordResult(id=results[0].id, fields=tuple(fields), traces=tuple(t for r in results for t in r.traces),
                        truncated=results[0].truncated)
