"""The decoder against the brute-force oracle (plain forward passes over full texts, no cache)."""

from __future__ import annotations

import numpy as np
import pytest

from pcd_cli.compile import CompiledSchema
from pcd_cli.decode import Decoder, Record
from pcd_cli.oracle import oracle_field

from .conftest import TEXTS

TOL = 1e-4


def _decode(backend, schema, scoring, budget=2048):
    compiled = CompiledSchema(schema, backend.tokenizer, scoring=scoring, logits_width=backend.logits_width)
    decoder = Decoder(backend, compiled, max_tokens_per_pass=budget, trace=True)
    return compiled, decoder, decoder.decode([Record(i, t) for i, t in enumerate(TEXTS)])


def _max_oracle_diff(backend, schema, results, scoring):
    worst = 0.0
    for result in results:
        for fi, (fres, trace) in enumerate(zip(result.fields, result.traces)):
            field = schema.fields[schema.field_index(trace["field"])]
            lines = [(field.labels.index(line["label"]), line["text"]) for line in trace["lines"]]
            probs, mass = oracle_field(backend, trace["context"], field, lines, scoring)
            fres = result.fields[schema.field_index(trace["field"])]
            worst = max(worst, float(np.abs(np.array(fres.probs) - probs).max()), abs(fres.mass - mass))
    return worst


@pytest.mark.parametrize("scoring", ["marginal", "exact"])
@pytest.mark.parametrize("backend_name", ["tiny_chat_backend", "tiny_plain_backend", "embedded_backend"])
def test_decoder_matches_oracle(request, oracle_schema, scoring, backend_name):
    backend = request.getfixturevalue(backend_name)
    _, _, results = _decode(backend, oracle_schema, scoring)
    assert len(results) == len(TEXTS)
    for result in results:
        assert len(result.traces) == len(oracle_schema.fields)
    worst = _max_oracle_diff(backend, oracle_schema, results, scoring)
    print(f"{backend_name} {scoring}: largest difference from the oracle {worst:.2e}")
    assert worst < TOL
