"""Prior correction without gold labels ("calibrate before use", Zhao, Wallace, Feng, Klein and
Singh 2021, "Calibrate Before Use: Improving Few-Shot Performance of Language Models", ICML).

A small model leans toward some labels whatever the text says (the embedded model calls 298
of 300 held-out SMS spam). That lean is measured once per prompt head on content-free
records, texts that carry no evidence for any label: ``CONTENT_FREE`` ("N/A", "[MASK]" and
"(empty)", the last standing in for the paper's empty string, which cannot end a record:
pcd's seam check refuses a text whose end merges into the prompt after it). Per field, their label probabilities are averaged into ``p_cf``;
every record's probabilities are then divided by it and renormalised:

    q_j = (p_j / p_cf_j) / sum_l (p_l / p_cf_l)

(the paper's ``W = diag(p_cf)^-1``, ``b = 0``). A record that looks like the content-free
ones gets a uniform distribution; a label the model prefers everywhere needs more evidence.
The candidate mass is left as decoded. The priors are computed by the decoder itself
(``Decoder.decode``), so they are exact for the prompt head, scoring and model in use.
"""

from __future__ import annotations

import numpy as np

from ..results import Record, RecordResult
from ..schema.model import Schema

#: Content-free texts (Zhao et al. 2021, section 5): their probabilities are averaged.
CONTENT_FREE = ("N/A", "[MASK]", "(empty)")
#: Floor of a content-free probability before dividing by it.
PRIOR_FLOOR = 1e-6


def content_free_priors(decoder, schema: Schema, texts: tuple[str, ...] = CONTENT_FREE) -> dict[str, np.ndarray]:
    """Per field, the (k,) mean label probabilities of the decoder on ``texts``.

    Raises:
        ValueError: every content-free record failed (the message gives the first error).
    """
    results = decoder.decode([Record(id=f"content-free-{i}", text=t) for i, t in enumerate(texts)])
    ok = [r for r in results if isinstance(r, RecordResult)]
    if not ok:
        raise ValueError(f"the content-free records could not be labelled: {results[0].error}")
    return {f.name: np.mean([np.asarray(r.fields[i].probs, dtype=np.float64) for r in ok], axis=0)
            for i, f in enumerate(schema.fields)}


def correct(probs, prior: np.ndarray) -> np.ndarray:
    """``probs / prior``, renormalised: (k,) or (n, k) in, the same shape out (float64)."""
    q = np.asarray(probs, dtype=np.float64) / np.maximum(prior, PRIOR_FLOOR)
    return q / q.sum(axis=-1, keepdims=True)
