"""The decoder's results against the brute-force oracle: every decision, or a stratified sample.

``make test`` checks a sample on the embedded model (each field of the schema once, on
records taken in turn, and for that decision the chosen label and the runner-up, each as its
unnormalised probability ``p * mass``); ``make test-full`` (``-m full``) checks every label of
every field of every record. Both read the oracle with plain forward passes over the full
text (``pcd_cli.decoding.oracle``), no cache.
"""

from __future__ import annotations

import numpy as np

from pcd_cli.decoding.oracle import oracle_field, oracle_label_logprobs


def _lines(field, trace):
    return [(field.labels.index(line["label"]), line["text"]) for line in trace["lines"]]


def max_oracle_diff(backend, schema, results, scoring, *, sample: bool) -> tuple[float, int]:
    """Largest difference between the decoder and the oracle, and how many decisions were checked.

    ``sample=False``: every field of every result, all labels' probabilities and the mass.
    ``sample=True``: field ``i`` of result ``i % len(results)`` only, its top two labels'
    unnormalised probabilities (``probs[l] * mass``, so the mass is checked too).
    """
    worst, checked = 0.0, 0
    for r, result in enumerate(results):
        traces = {t["field"]: t for t in result.traces}
        for fi, field in enumerate(schema.fields):
            if sample and fi % len(results) != r:
                continue
            res, trace = result.fields[fi], traces[field.name]
            checked += 1
            if not sample:
                probs, mass = oracle_field(backend, trace["context"], field, _lines(field, trace), scoring)
                worst = max(worst, float(np.abs(np.array(res.probs) - probs).max()), abs(res.mass - mass))
                continue
            top = [int(i) for i in np.argsort(res.probs)[::-1][:2]]
            label_lp = oracle_label_logprobs(backend, trace["context"], field, _lines(field, trace), scoring,
                                             labels=set(top))
            for label in top:
                worst = max(worst, abs(res.probs[label] * res.mass - float(np.exp(label_lp[label]))))
    return worst, checked
