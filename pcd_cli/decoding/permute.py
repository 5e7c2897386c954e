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

The orderings: for a field of ``n`` labels, the cyclic shifts of the schema's list, then their
reversals, ``shift 0, shift 1, ..., shift n-1, reversed(shift 0), ...`` (duplicates dropped:
``2n`` orders, 2 for ``n = 2``); ordering ``k`` lists every permuted field in its ``k``-th order
(modulo its count). Ordinal and integer scales keep their order (it is their meaning), and a
multi field's options are separate yes/no decisions.

Balanced sets only (issue #45: ``--permutations 4`` on a 3-label field put one label first
twice as often as another and flipped 2 of 6 labels when the list was reordered): ``K`` must
be a multiple of every permuted field's label count, so each label sits at each place of its
list equally often (``K / n`` times: whole rounds of cyclic shifts, a Latin square, and with
``K = 2n`` of their reversals too); any other ``K`` is refused, naming the field and the counts
that fit (``balanced_counts``). A field with fewer distinct orderings than ``K`` repeats them.

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

import math

import numpy as np

from ..errors import SchemaError
from ..results import FieldResult, RecordResult
from ..schema.model import Schema
from .compile import CompiledSchema
from .prompt import is_permuted


def label_orderings(n: int) -> list[tuple[int, ...]]:
    """The distinct cyclic shifts of ``range(n)``, then their reversals, in the order
    ``shift 0, shift 1, ..., reversed(shift 0), reversed(shift 1), ...`` (``2n`` of them for
    ``n >= 3``; 2 for ``n = 2``; 1 for ``n = 1``): every prefix of ``n`` or ``2n`` of them puts
    each label at each place equally often."""
    shifts = [tuple((shift + i) % n for i in range(n)) for shift in range(n)]
    out: list[tuple[int, ...]] = []
    for candidate in shifts + [order[::-1] for order in shifts]:
        if candidate not in out:
            out.append(candidate)
    return out


def balanced_counts(schema: Schema) -> list[int]:
    """The ``--permutations`` counts that are balanced for every permuted field of ``schema``
    (each label at each place of its list equally often): the multiples of the least common
    multiple ``L`` of the fields' label counts, up to ``max_orderings`` (or ``L`` alone, when it
    is above that: the longer fields' orderings then repeat, in whole rounds). Empty without a
    permuted field."""
    sizes = [len(f.labels) for f in schema.declared if is_permuted(f)]
    if not sizes:
        return []
    step = math.lcm(*sizes)
    return list(range(step, max(max_orderings(schema), step) + 1, step))


def max_orderings(schema: Schema) -> int:
    """The most distinct orderings ``--permutations`` can use for ``schema``: the largest
    count of ``label_orderings`` over its permuted fields (0 when it has none)."""
    return max((len(label_orderings(len(f.labels))) for f in schema.declared if is_permuted(f)), default=0)


def orderings_for(schema: Schema, k: int) -> list[dict[str, tuple[int, ...]]]:
    """``k`` label orders per permuted field: ordering ``j`` gives each permuted field its
    ``j``-th ``label_orderings`` entry (modulo their count).

    A balanced ``k`` above a field's distinct orderings repeats them (each label still at each
    place equally often, the same combined probabilities as fewer, at more cost): ``pcd serve``
    applies one ``k`` to schemas of other label counts (``--permutations 6``: a yes/no question
    gets its 2 orderings three times, a three-way one its 6).

    Raises:
        SchemaError: ``k`` below 2, the schema has no boolean or enum field, or ``k`` is not a
            multiple of every permuted field's label count (names the field and the counts that
            fit, ``balanced_counts``); exit 2.
    """
    most = max_orderings(schema)
    if k < 2:
        raise SchemaError(f"--permutations {k}: give 2 or more (1 is the plain prompt)")
    if most == 0:
        raise SchemaError("--permutations: the schema has no boolean or enum field whose labels could be reordered")
    fields = [f for f in schema.declared if is_permuted(f)]
    fit = balanced_counts(schema)
    odd = [f for f in fields if k % len(f.labels)]
    if odd:
        f = odd[0]
        raise SchemaError(f"--permutations {k}: unbalanced for field {f.name!r} ({len(f.labels)} labels): some labels "
                          f"would be listed first more often than others; give a multiple of {len(f.labels)} "
                          f"(for every field of this schema: {' or '.join(map(str, fit))})")
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
