"""Chat templates as models ship them: the instructions and the catalog reach the prompt whatever
the template does with a system turn (merged into the user turn where it refuses or drops one,
exit 3 where no merging can help), one BOS where the template prints its own, a pinned date, and
an empty think block for reasoning templates.

The chat-template cases of tests/data/cases-round2/ (copied from ../shared/cases-round2/; this
file was tests/test_cases_round2_templates.py): each case runs on a model folder built in a
temporary directory as the case's ``make_model_folder.sh`` builds it: the embedded
SmolLM2-135M-Instruct (converted by pcd) with the case's ``chat_template.jinja`` (and
``tokenizer_config.json``). Every case must label its input with the instructions and catalog in
the prompt, match the brute-force oracle, and show the behaviour the case asks for.
"""

from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from pcd_cli.api import Labeler
from pcd_cli.backends.torch_backend import HFTokenizer, converted_gguf_dir, embedded_gguf_path, load_backend
from pcd_cli.decoding.compile import CompiledSchema
from pcd_cli.errors import CompileError
from pcd_cli.decoding.prompt import PREAMBLE
from pcd_cli.schema.load import load_schema, parse_schema

from .. import helpers
from ..helpers import pcd, tiny_backend
from ..oracle_sample import max_oracle_diff

CASES_DIR = Path(__file__).parents[1] / "data" / "cases-round2"
CASES = {c["id"]: c for c in map(json.loads, (CASES_DIR / "cases.jsonl").read_text().splitlines())}
TEMPLATE_CASES = sorted(cid for cid, c in CASES.items() if c["kind"] == "chat_template")


def make_model_folder(case_dir: Path, target: Path) -> Path:
    """``make_model_folder.sh``: the converted embedded model with the case's template files."""
    src = converted_gguf_dir(embedded_gguf_path())
    target.mkdir(parents=True, exist_ok=True)
    (target / "model.safetensors").symlink_to(src / "model.safetensors")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (src / name).is_file():
            shutil.copy(src / name, target / name)
    for name in ("chat_template.jinja", "tokenizer_config.json"):
        if (case_dir / name).is_file():
            shutil.copy(case_dir / name, target / name)
    return target


@pytest.fixture(scope="module")
def case_backends(tmp_path_factory):
    """One loaded backend per chat-template case (built on first use)."""
    loaded = {}

    def get(case_id: str):
        if case_id not in loaded:
            folder = make_model_folder(CASES_DIR / case_id, tmp_path_factory.mktemp(case_id))
            loaded[case_id] = (folder, load_backend(str(folder), device="cpu", dtype="float32"))
        return loaded[case_id]

    return get


def _records(case_id: str) -> list[dict]:
    return [json.loads(line) for line in (CASES_DIR / case_id / "input.jsonl").read_text().splitlines()]


def test_every_template_case_is_here():
    assert TEMPLATE_CASES == ["roles-must-alternate-template", "system-role-refused-by-template",
                              "template-prints-bos-no-double-bos", "template-silently-drops-system-turn"]


#: How each case's template takes the system text (``Prompt.system_placement``), and the text
#: that must stand right before the instructions in every prompt.
EXPECTED = {
    "roles-must-alternate-template": ("merged_refused", "[INST] "),
    "system-role-refused-by-template": ("merged_refused", "<|im_start|>user\n"),
    "template-prints-bos-no-double-bos": ("system_turn", "<|endoftext|><|im_start|>system\n"),
    "template-silently-drops-system-turn": ("merged_dropped", "<|im_start|>user\n"),
}


def _template_case(case_backends, case_id, *, sample):
    _, backend = case_backends(case_id)
    schema = load_schema(CASES_DIR / case_id / "schema.yaml")
    labeler = Labeler(schema, backend=backend, trace=True)
    placement, before = EXPECTED[case_id]
    assert labeler.compiled.prompt.system_placement == placement
    records = _records(case_id)
    results = list(labeler.label(records))
    assert [r.id for r in results] == [r["id"] for r in records]
    for record, result in zip(records, results):
        assert len(result.fields) == len(schema.fields)  # a RecordResult, not a failure
        for field, res, trace in zip(schema.fields, result.fields, result.traces):
            context = trace["context"]
            # the instructions and the whole catalog are in the prompt, before the record
            assert context.index(before + PREAMBLE) < context.index(record["text"])
            assert schema.instructions in context and '- "tone": Overall tone of the message. Allowed: ' \
                '"angry" | "calm" | "happy"' in context
            assert res.value in ((True, False) if field.is_boolean else field.labels)
    worst, _ = max_oracle_diff(backend, schema, results, "marginal", sample=sample)
    assert worst < 1e-4


@pytest.mark.parametrize("case_id", TEMPLATE_CASES)
def test_template_case_labels_with_the_catalog_and_matches_oracle(case_backends, case_id):
    _template_case(case_backends, case_id, sample=True)


@pytest.mark.full
@pytest.mark.parametrize("case_id", TEMPLATE_CASES)
def test_template_case_matches_oracle_on_every_decision(case_backends, case_id):
    _template_case(case_backends, case_id, sample=False)


def test_template_that_prints_bos_gives_one_bos(case_backends):
    _, backend = case_backends("template-prints-bos-no-double-bos")
    bos_id = backend.tokenizer.encode("<|endoftext|>")
    assert bos_id == [0]
    labeler = Labeler(CASES_DIR / "template-prints-bos-no-double-bos" / "schema.yaml", backend=backend, trace=True)
    head = labeler.compiled.prompt.head_ids
    assert head[0] == 0 and head.count(0) == 1
    (result,) = list(labeler.label([_records("template-prints-bos-no-double-bos")[0]]))
    for trace in result.traces:
        assert trace["context"].startswith("<|endoftext|><|im_start|>system\n")
        assert trace["context"].count("<|endoftext|>") == 1


def test_silently_dropped_system_turn_cli(case_backends, tmp_path):
    """The case's own commands: inspect-schema warns; label exits 0 with the catalog in the prompt."""
    case_dir = CASES_DIR / "template-silently-drops-system-turn"
    folder, _ = case_backends("template-silently-drops-system-turn")
    result = pcd("inspect-schema", str(case_dir / "schema.yaml"), "-m", str(folder), "--json", code=None)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["chat_template"]["system"] == "merged_dropped"
    merged = [w for w in report["warnings"] if w["kind"] == "system_merged"]
    assert len(merged) == 1 and "drops it silently" in merged[0]["message"]
    out, trace = tmp_path / "out.parquet", tmp_path / "trace.jsonl"
    result = pcd("label", str(case_dir / "input.jsonl"), "-s", str(case_dir / "schema.yaml"),
                 "--id-field", "id", "-m", str(folder), "--trace", str(trace), "-o", str(out),
                 "--quiet", code=None)
    assert result.exit_code == 0, result.output
    assert pq.read_table(out).column("id").to_pylist() == ["a1", "a2"]
    contexts = [orjson.loads(line)["context"] for line in trace.read_text().splitlines()]
    assert len(contexts) == 4 and all("<|im_start|>user\n" + PREAMBLE in c for c in contexts)


def test_template_that_loses_the_instructions_everywhere_exits_3(tmp_path):
    """A template that prints neither the system turn nor the user's text: no merging can help."""
    case_dir = CASES_DIR / "template-silently-drops-system-turn"
    folder = make_model_folder(case_dir, tmp_path / "model")
    (folder / "chat_template.jinja").write_text(
        "{%- for m in messages -%}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'][-40:] + '<|im_end|>\\n' }}"
        "{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}")
    from transformers import AutoTokenizer

    tokenizer = HFTokenizer(AutoTokenizer.from_pretrained(str(folder)))
    with pytest.raises(CompileError, match="missing from the prompt even in the user turn"):
        CompiledSchema(load_schema(case_dir / "schema.yaml"), tokenizer)
    result = pcd("inspect-schema", str(case_dir / "schema.yaml"), "-m", str(folder), code=None)
    assert result.exit_code == 3
    assert "instructions and catalog are missing" in result.output


# -- cases chat-template-date-injection and reasoning-template-think-block of tests/data/cases.jsonl
# (schema and label cases from public bug reports of similar tools; formerly tests/test_cases.py)

@contextmanager
def chat_template(backend, template: str):
    """Temporarily give the backend's tokenizer another chat template."""
    tok = backend.tokenizer._tok
    original, tok.chat_template = tok.chat_template, template
    try:
        yield
    finally:
        tok.chat_template = original


def test_pinned_date_keeps_the_head_reproducible():
    backend = tiny_backend()
    with chat_template(backend, "{{ 'Today: ' + date_string + '\n' }}{% for m in messages %}<|im_start|>"
                       "{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
                       "<|im_start|>assistant\n{% endif %}"):
        schema = parse_schema(helpers.CASES["chat-template-date-injection"]["schema"])
        a = CompiledSchema(schema, backend.tokenizer).prompt
        b = CompiledSchema(schema, backend.tokenizer).prompt
        assert "Today: 01 Jan 2025" in a.head_text
        assert a.head_sha256 == b.head_sha256
        meta = Labeler(schema, backend=backend).metadata()
        assert meta["pcd.prompt_head_sha256"] == a.head_sha256


def test_reasoning_template_gets_an_empty_think_block():
    backend = tiny_backend()
    with chat_template(backend, "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                       "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                       "{% if enable_thinking is defined and enable_thinking is false %}"
                       "<think>\n\n</think>\n\n{% endif %}{% endif %}"):
        schema = parse_schema(helpers.CASES["reasoning-template-think-block"]["schema"])
        prompt = CompiledSchema(schema, backend.tokenizer).prompt
        assert prompt.tail_text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n" + prompt.layout.opener)
