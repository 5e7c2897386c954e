"""pcd bench --baseline llama.cpp (issue #38): the answer's JSON Schema, pcd's prompt without
its JSON opener, the refusals, and (when llama-cpp-python is installed) one real run beside pcd
on the embedded model's own GGUF file."""

from __future__ import annotations

import json

import pytest

from pcd_cli import bench_llamacpp
from pcd_cli.backends.dtype_speed import bfloat16_would_run
from pcd_cli.bench import run_bench
from pcd_cli.bench_llamacpp import (agreement_per_field, answer_json_schema, baseline_gguf,
                                    llama_cpp_available, prompt_ids_before_opener)
from pcd_cli.errors import InputError, ModelError
from pcd_cli.io.readers import InputSpec
from pcd_cli.results import Record
from pcd_cli.schema.load import parse_schema

SCHEMA = parse_schema({"fields": {
    "spam": {"type": "boolean"},
    "lang": {"type": "enum", "labels": ["en", "fr"], "nullable": True},
    "stars": {"type": "integer", "minimum": 1, "maximum": 3},
    "topics": {"type": "multi", "labels": ["billing", "login"]},
}})
TEXTS = ["Win a free prize now!!! Click here", "Mon mot de passe ne marche plus, aidez-moi", "Lunch at 12?"]
needs_llama = pytest.mark.skipif(not llama_cpp_available(),
                                 reason="llama-cpp-python is not installed (pip install 'pcd-cli[bench]')")


def test_answer_json_schema_allows_exactly_the_values_pcd_reads():
    assert answer_json_schema(SCHEMA) == {
        "type": "object", "additionalProperties": False, "required": ["spam", "lang", "stars", "topics"],
        "properties": {
            "spam": {"type": "boolean"},
            "lang": {"enum": ["en", "fr", None]},
            "stars": {"enum": [1, 2, 3]},
            "topics": {"type": "object", "properties": {"billing": {"type": "boolean"}, "login": {"type": "boolean"}},
                       "required": ["billing", "login"], "additionalProperties": False}}}


def test_a_model_that_is_not_a_gguf_file_is_refused(tmp_path):
    with pytest.raises(InputError, match="runs a GGUF file; --model 'HuggingFaceTB/x' is not one"):
        baseline_gguf("HuggingFaceTB/x")
    assert baseline_gguf(None).name.endswith(".gguf")


def test_without_llama_cpp_the_run_is_refused_with_the_install_line(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_llamacpp, "llama_cpp_available", lambda: False)
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"text": "x"}))
    with pytest.raises(ModelError, match=r"needs llama-cpp-python: pip install 'pcd-cli\[bench\]'"):
        run_bench(SCHEMA, path, InputSpec(limit=1), backend="torch", baseline="llama.cpp")
    with pytest.raises(InputError, match="--baseline 'vllm': expected one of transformers, llama.cpp"):
        run_bench(SCHEMA, path, InputSpec(limit=1), baseline="vllm")


def test_the_prompt_is_pcds_own_up_to_the_json_opener(embedded_backend):
    from pcd_cli.api import Labeler

    labeler = Labeler(SCHEMA, backend=embedded_backend)
    prompt = labeler.compiled.prompt
    tok = embedded_backend.tokenizer
    for i, text in enumerate(TEXTS):
        full, after = prompt.record_ids(i, text)
        ids = prompt_ids_before_opener(labeler, Record(i, text))
        assert ids[: len(prompt.head_ids)] == list(prompt.head_ids)
        assert tok.decode(ids) + prompt.layout.opener == tok.decode(list(prompt.head_ids) + list(after)) == full
        assert not tok.decode(ids).endswith(prompt.layout.opener)


def test_agreement_per_field_counts_a_missing_value_as_a_disagreement():
    pairs = [({"spam": True, "lang": None}, {"spam": True, "lang": None}),
             ({"spam": False, "lang": "en"}, {"spam": True})]
    assert agreement_per_field(SCHEMA, pairs) == {"spam": 0.5, "lang": 0.5, "stars": 0.0, "topics": 0.0}


@needs_llama
def test_llama_cpp_grammar_json_beside_pcd_on_the_embedded_gguf(embedded_backend, tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in TEXTS))
    report = run_bench(SCHEMA, path, InputSpec(limit=3), backend=embedded_backend, baseline="llama.cpp")
    assert [(r.record, r.method) for r in report.rows] == [(str(i), "pcd") for i in range(3)] + [
        (str(i), "llama.cpp") for i in range(3)]
    answer = json.dumps({"spam": False, "lang": "en", "stars": 1, "topics": {"billing": False, "login": False}})
    for r in report.rows[3:]:  # the grammar: always parses, every value allowed, every key present
        assert r.parsed and r.valid and not r.problems, r
        assert set(r.values) == {"spam", "lang", "stars", "topics"}
        assert r.output_tokens >= len(embedded_backend.tokenizer.encode(answer)) // 2
    s = report.summary
    assert s["llama.cpp_valid_rate"] == 1.0 and s["llama.cpp_parsed_rate"] == 1.0
    assert set(s["llama_cpp_agreement_per_field"]) == {"spam", "lang", "stars", "topics"}
    assert all(0.0 <= v <= 1.0 for v in s["llama_cpp_agreement_per_field"].values())
    assert s["llama_cpp_n_threads"] >= 1 and s["llama_cpp_gguf"].endswith(".gguf")
    assert s["pcd_packed_vs_llama_cpp"] > 0 and s["llama_cpp_prefill_records_per_s"] > 0
    fl = s["forward_limit"]
    assert fl["tokens_per_record"] > 10 and fl["passes"] >= 1 and fl["ratio"] > 0
    assert "generate_median_latency_s" not in s  # transformers did not run


def test_bfloat16_comparison_applies_to_a_float32_torch_backend_on_cpu_only(embedded_backend):
    from pathlib import Path

    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    assert bfloat16_would_run(embedded_backend) == ("avx512_bf16" in flags or "amx_bf16" in flags)
    assert not bfloat16_would_run(object())


def test_a_calibration_or_tune_fitted_in_another_dtype_is_named(tmp_path):
    from pcd_cli.quality.calibration import Calibration
    from pcd_cli.backends.tune_folder import card_mismatches

    cal = Calibration("0", "m", "s", "h", "marginal", {}, dtype="float32")
    assert cal.dtype_warnings({"pcd.dtype": "bfloat16"}) == [
        "the calibration was fitted on float32 predictions and this run decodes in bfloat16: probabilities differ "
        "by rounding (pcd bench shows how much); refit it with pcd calibrate on bfloat16 predictions, or run with "
        "--dtype float32"]
    assert cal.dtype_warnings({"pcd.dtype": "float32"}) == [] == cal.dtype_warnings({})
    assert Calibration("0", "m", "s", "h", "marginal", {}).dtype_warnings({"pcd.dtype": "bfloat16"}) == []
    assert b'"dtype": "float32"' in cal.to_json()
    assert card_mismatches({"dtype": "float32"}, {"pcd.dtype": "bfloat16"}) == [
        "dtype: trained for 'float32', labelling with 'bfloat16'"]
    assert card_mismatches({"dtype": "float32"}, {"pcd.dtype": "float32"}) == []
