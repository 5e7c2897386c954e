"""Backend conformance (issue #13): the decoder on tiny random models of every supported
family against an independent oracle (eager attention, full forward, no cache), both
scoring modes, packed and one record per pass, sliding windows crossed, longrope on both
sides of its switch; recurrent architectures refused at load time."""

from __future__ import annotations

import numpy as np
import pytest

from pcd_cli.backends import conformance
from pcd_cli.backends.conformance import FAMILIES, TOLERANCE, WINDOW, build_tiny_model, run_family
from pcd_cli.errors import ModelError

from ..helpers import pcd


@pytest.fixture(scope="module")
def tokenizer_source():
    from pcd_cli.backends.torch_backend import converted_gguf_dir, embedded_gguf_path

    return converted_gguf_dir(embedded_gguf_path())


@pytest.fixture(scope="module")
def models_root(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny-models")


def _load(folder):
    from pcd_cli.backends import load_backend

    return load_backend(str(folder), device="cpu", dtype="float32")


#: make test checks two families (plain RoPE; biased projections); make test-full all seven (20-45 s each here)
FAST_FAMILIES = ("llama", "qwen2")


@pytest.mark.parametrize("family", [f if f in FAST_FAMILIES else pytest.param(f, marks=pytest.mark.full)
                                    for f in FAMILIES])
def test_family_matches_the_eager_oracle(family, models_root, tokenizer_source):
    checks = run_family(family, models_root / family, _load, tokenizer_source)
    for (scoring, packing), check in checks.items():
        print(f"{family:14s} {scoring:8s} {packing:6s} max |pcd - oracle| = {check.max_diff:.1e} "
              f"({check.passes} passes, longest record {check.longest_record} tokens, variants {check.variants})")
        assert check.records == len(conformance.TEXTS)
        assert check.max_diff < TOLERANCE, (family, scoring, packing, check)
        assert check.longest_record > 4 * WINDOW  # every sliding window is crossed within a record
    packed, single = checks[("exact", "packed")], checks[("exact", "single")]
    assert single.passes == 2 * len(conformance.TEXTS)  # two waves, one pass each
    if family == "phi3-longrope":
        assert set(packed.variants) == {0, 1}  # short records and a long one, on both sides of the switch
        assert packed.passes == 4  # the two factor sets are never packed together
    else:
        assert packed.passes == 2


@pytest.mark.parametrize("family", list(conformance.REFUSED_FAMILIES))
def test_recurrent_architectures_are_refused_at_load_time(family, tmp_path, tokenizer_source):
    folder = build_tiny_model(family, tmp_path / family, tokenizer_source, refused=True)
    with pytest.raises(ModelError, match=r"cannot (score it|be scored) exactly|pcd cannot score"):
        _load(folder)


def test_cli_exits_3_naming_the_reason(tmp_path, tokenizer_source):

    folder = build_tiny_model("mamba", tmp_path / "mamba", tokenizer_source, refused=True)
    data = tmp_path / "in.jsonl"
    data.write_text('{"text": "hello"}\n')
    schema = tmp_path / "s.yaml"
    schema.write_text("fields:\n  spam:\n    type: boolean\n")
    result = pcd("label", str(data), "--schema", str(schema), "--model", str(folder),
                 "--device", "cpu", "-o", str(tmp_path / "out.parquet"), code=None)
    assert result.exit_code == 3, result.output
    assert "model type 'mamba' has recurrent" in result.output


def test_non_finite_logits_fail_the_record_naming_the_dtype(tokenizer_source):
    import torch

    from pcd_cli.decoding.compile import CompiledSchema
    from pcd_cli.decoding.decode import Decoder
    from pcd_cli.results import Record, RecordFailure
    from pcd_cli.schema.load import parse_schema

    from ..helpers import tiny_backend

    backend = tiny_backend(seed=11)
    overflow = {"on": False}

    def poison(_module, _inputs, output):  # an fp16-style overflow, on demand
        return torch.full_like(output, float("inf")) if overflow["on"] else output

    handle = backend.model.lm_head.register_forward_hook(poison)
    try:
        compiled = CompiledSchema(parse_schema({"fields": {"spam": {"type": "boolean"}}}), backend.tokenizer)
        decoder = Decoder(backend, compiled)
        overflow["on"] = True
        results = decoder.decode([Record("a", "WIN A PRIZE"), Record("b", "see you at 6")])
    finally:
        handle.remove()
    assert [type(r) for r in results] == [RecordFailure, RecordFailure]
    assert results[0].error == ("record 'a', field 'spam': the model's log-probabilities are not finite (NaN or "
                                "infinite logits in float32); the model's weights or inputs overflow")
    lp = backend._read(torch.tensor([[0.0, 1.0, float("nan")], [0.0, 1.0, 2.0]]), np.array([[0, 1], [1, -1]])).numpy()
    assert np.isnan(lp[0]).all() and np.isfinite(lp[1, 0]) and lp[1, 1] == -np.inf


@pytest.mark.parametrize("family", ["llama", "gemma3", "phi3-longrope"])
def test_decision_features_packed_equal_alone_and_a_plain_forward(family, models_root, tokenizer_source):
    """The linear readout's feature read (issue #50): a decision point's hidden state is the same
    packed with other records, split across passes, alone, and in a plain forward without cache."""
    folder = models_root / family
    if not (folder / "config.json").is_file():
        build_tiny_model(family, folder, tokenizer_source)
    worst = conformance.check_features(_load(folder))
    print(family, worst)
    assert max(worst.values()) < conformance.FEATURE_TOLERANCE, (family, worst)
