"""``pcd inspect-schema``: layout probe, template probe, per-field paths and collisions, warnings, CLI.

Three small byte-level BPE tokenizers built with the ``tokenizers`` library reproduce the
three newline families of docs/how-it-works.md ("The embedded model") without a hub:
SmolLM2's (GPT-2 pre-tokenizer, newline glued to the indentation after it), Qwen2.5's (its pre-tokenizer regex lets punctuation take
the newline: ``,\\n``) and Gemma's (newline standalone). The tokenizer-level cases of
tests/data/cases.jsonl run on the embedded SmolLM2 tokenizer (loaded without weights).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, PreTrainedTokenizerFast

from pcd_cli.backends.torch_backend import HFTokenizer, load_tokenizer
from pcd_cli.decoding.compile import CompiledSchema
from pcd_cli.inspect import MANY_LABELS, inspect
from pcd_cli.schema.load import load_schema, parse_schema

from ..helpers import pcd

ROOT = Path(__file__).resolve().parents[2]
CASES = {c["id"]: c for c in map(json.loads, (ROOT / "tests" / "data" / "cases.jsonl").read_text().splitlines())}
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")  # Qwen2.5's pre-tokenizer regex
GEMMA_SPLIT = r" ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]+|\n| +"  # newline always its own piece
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TWO_FIELDS = {"fields": {"sentiment": {"type": "enum", "labels": ["positive", "negative"]},
                         "urgent": {"type": "boolean"}}}


def byte_bpe(split: str | None, merges: list[tuple[str, str]], words: tuple[str, ...] = (),
             chat_template: str | None = None) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer: 256 byte tokens, then ``merges``, then each of ``words``
    merged left to right into one token. ``split``: pre-tokenizer regex (``None``: GPT-2's)."""
    merges = list(merges)
    for word in words:
        for i in range(2, len(word) + 1):
            merges.append((word[:i - 1], word[i - 1]))
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split is None)
    tok.pre_tokenizer = byte_level if split is None else pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(split), behavior="isolated"), byte_level])
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=chat_template)


def smollm2_like(**kw):
    return byte_bpe(None, [("Ċ", "Ġ"), ("Ġ", '"')], words=("Ġtrue", "Ġfalse"), **kw)


def qwen_like(**kw):
    return byte_bpe(QWEN_SPLIT, [(",", "Ċ"), ("{", "Ċ")], **kw)


def gemma_like(**kw):
    return byte_bpe(GEMMA_SPLIT, [], **kw)


@pytest.fixture(scope="module")
def smol():
    """The embedded SmolLM2 tokenizer (no weights)."""
    return load_tokenizer(None)[1]


def report_for(schema, tokenizer, **kw):
    return inspect(schema if not isinstance(schema, dict) else parse_schema(schema), tokenizer=tokenizer, **kw)


def field(report, name):
    return next(f for f in report.fields if f.name == name)


def kinds(report):
    return [w.kind for w in report.warnings]


# -- layout: the three newline families ---------------------------------------------------------

@pytest.mark.parametrize("make, family, pieces, moves, chosen", [
    (smollm2_like, "glued_after", (",", "\n ", ' "'), {"newline_first": 0, "newline_last": 3}, "newline_first"),
    (qwen_like, "glued_before", ('"', ",\n", " "), {"newline_first": 3, "newline_last": 0}, "newline_last"),
    (gemma_like, "standalone", (",", "\n", " "), {"newline_first": 0, "newline_last": 0}, "newline_first"),
], ids=["smollm2", "qwen2.5", "gemma"])
def test_newline_family_decides_the_layout(make, family, pieces, moves, chosen):
    report = report_for(TWO_FIELDS, HFTokenizer(make()))
    lay = report.layout
    assert (lay.newline.family, lay.newline.pieces, lay.seam_moves, lay.chosen) == (family, pieces, moves, chosen)
    assert lay.newline.sample == '  "sentiment": "positive",\n  "urgent": true'
    # 3 = one token cut from the wave-0 context + one per written answer line of the first field (2 labels)
    assert "seam_merge" not in kinds(report)
    assert lay.reason == ("every layout moves 0 seam tokens; kept the first" if family == "standalone"
                          else "fewest seam tokens moved back (0)")


def test_embedded_smollm2_glues_newline_to_the_indentation(smol):
    report = report_for(TWO_FIELDS, smol)
    assert report.layout.newline.family == "glued_after"
    assert report.layout.newline.pieces == ('",', "\n ", ' "')
    assert report.layout.chosen == "newline_first" and report.layout.seam_moves["newline_last"] > 0


def test_tokenizer_merging_across_every_seam_is_reported_with_its_fallback():
    # punctuation takes the newline and one space of the indentation (",\n " one token): both layouts move seams
    both = byte_bpe(r"[^\s\p{L}\p{N}]+\n? ?| ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+", [],
                    words=("{ĊĠ", ",ĊĠ"))
    report = report_for(TWO_FIELDS, HFTokenizer(both))
    lay = report.layout
    assert (lay.newline.family, lay.newline.pieces) == ("glued_both", ('"', ",\n ", " "))
    assert (lay.seam_moves, lay.chosen) == ({"newline_first": 3, "newline_last": 3}, "newline_first")
    (warning,) = report.warnings
    assert warning.kind == "seam_merge" and "kept newline_first; fallback taken" in warning.message


# -- chat template and head ---------------------------------------------------------------------

def test_template_probe_finds_the_date_and_thinking_arguments():
    template = ("Today: {{ date_string }}\n" + CHATML.replace(
        "<|im_start|>assistant\n{% endif %}", "<|im_start|>assistant\n{% if enable_thinking is defined and "
        "enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"))
    t = report_for(TWO_FIELDS, HFTokenizer(gemma_like(chat_template=template))).chat_template
    assert t.used and t.injects_date and t.pinned_date == "01 Jan 2025"
    assert t.reads == ("add_generation_prompt", "enable_thinking", "date_string")
    assert t.args == {"add_generation_prompt": True, "enable_thinking": False, "date_string": "01 Jan 2025"}


def test_template_printing_the_clock_is_a_warning():
    template = "{{ strftime_now('%d %b %Y') }}\n" + CHATML
    report = report_for(TWO_FIELDS, HFTokenizer(gemma_like(chat_template=template)))
    assert report.chat_template.injects_date and report.chat_template.pinned_date is None
    assert kinds(report) == ["date_unpinned"]
    both = "{{ strftime_now('%d %b %Y') }} {{ date_string }}\n" + CHATML  # the clock still moves the head
    report = report_for(TWO_FIELDS, HFTokenizer(gemma_like(chat_template=both)))
    assert "date_string" in report.chat_template.reads and report.chat_template.pinned_date is None
    assert kinds(report) == ["date_unpinned"]


def test_no_template_means_plain_text_prompt():
    report = report_for(TWO_FIELDS, HFTokenizer(gemma_like()))
    assert report.chat_template == type(report.chat_template)(
        used=False, system="plain_text", args={}, reads=(), injects_date=False, pinned_date=None)


def test_head_kv_estimate_comes_from_the_config_only():
    tok = HFTokenizer(gemma_like(chat_template=CHATML))
    config = LlamaConfig(vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2)
    schema = parse_schema(TWO_FIELDS)
    report = inspect(schema, tokenizer=tok, config=config)
    head_ids = CompiledSchema(schema, tok).prompt.head_ids
    kv = report.head.kv
    assert report.head.tokens == len(head_ids)
    assert (kv.dtype, kv.layers, kv.kv_heads, kv.head_dim) == ("float32", 2, 2, 16)
    assert kv.bytes_per_token == 2 * 2 * 2 * 16 * 4 and kv.bytes == 512 * len(head_ids)
    assert inspect(schema, tokenizer=tok, config=config, kv_dtype="bfloat16").head.kv.bytes == 256 * len(head_ids)
    assert report.logits_width == tok.vocab_size
    unknown = inspect(schema, tokenizer=tok)
    assert unknown.head.kv is None and unknown.logits_width is None


# -- fields: paths, identification, collisions, prefixes ---------------------------------------------

@pytest.mark.parametrize("scoring", ["marginal", "exact"])
def test_paths_are_what_the_decoder_feeds(smol, scoring):
    schema = parse_schema(CASES["shared-prefix-labels-no-eos"]["schema"])
    report = report_for(schema, smol, scoring=scoring)
    compiled = CompiledSchema(schema, smol, scoring=scoring)
    plan = compiled.wave_plan(0, compiled.prompt.tail_text)
    forest = plan.forests[0]
    f = report.fields[0]
    assert f.trunk_ids == forest.ids[:forest.trunk_len] and f.forest_tokens == len(forest.ids) - forest.shared
    for lab, (_, line) in zip(f.labels, forest.lines):
        (s,) = lab.spellings
        assert list(plan.context_ids) + list(f.trunk_ids) + list(s.ids) == smol.encode(plan.context_text + line)
        assert s.scored_tokens == (s.identified_at if scoring == "marginal" else len(s.ids))


def test_shared_prefix_digits_collide_and_are_followed(smol):
    f = report_for(CASES["shared-prefix-labels-no-eos"]["schema"], smol).fields[0]
    paths = {lab.label: (lab.spellings[0].pieces, lab.spellings[0].identified_at) for lab in f.labels}
    end = ('"', "\n", "}")  # the closing quote and the line ending are part of every path
    assert paths == {"0": (("0", *end), 1), "1": (("1", *end), 2), "12": (("1", "2", *end), 2)}
    assert [(c.piece, c.labels, c.depth) for c in f.collisions] == [("1", ("1", "12"), 2)]
    assert f.prefixes == (("1", "12"),) and f.deepest == 2


def test_shared_word_prefix_goes_into_the_trunk(smol):
    f = report_for(CASES["first-token-only-enum"]["schema"], smol).fields[0]
    assert f.trunk_text.endswith(' "get_') and f.collisions == ()
    assert [lab.spellings[0].pieces[0] for lab in f.labels] == ["weather", "time"]


def test_label_that_is_a_prefix_of_another_ends_on_its_closing_quote(smol):
    f = report_for(CASES["label-is-prefix-of-other-label"]["schema"], smol).fields[0]
    assert f.prefixes == (("John", "John Doe"),)
    assert f.trunk_pieces[-1] == "John"
    assert [lab.spellings[0].pieces for lab in f.labels] == [('"', "\n", "}"), (" Do", "e", '"', "\n", "}")]
    assert [lab.spellings[0].identified_at for lab in f.labels] == [1, 1]


def test_boolean_spellings_of_one_label_never_collide(smol):
    report = report_for(CASES["key-separator-merged-quote-colon"]["schema"], smol)
    f = report.fields[0]
    assert f.trunk_pieces[-1] == '":'  # the merged quote-colon is known text, tokenized in context
    spellings = {s.spelling: (s.pieces[0], s.identified_at) for lab in f.labels for s in lab.spellings}
    assert spellings == {"true": (" true", 1), '"true"': (' "', 2), "false": (" false", 1), '"false"': (' "', 2)}
    assert f.collisions == () and report.warnings == ()


def test_255_labels_collide_on_the_first_digit(smol):
    report = report_for(load_schema(ROOT / "schemas" / "customs_255.yaml"), smol)
    f = field(report, "customs_category")
    assert f.trunk_text.endswith(' "CAT_')
    assert [(c.piece, len(c.labels), c.depth) for c in f.collisions] == [("0", 100, 3), ("1", 100, 3), ("2", 55, 3)]
    (code,) = [w for w in report.warnings if w.kind == "code_first"]
    assert code.field == "customs_category" and len(code.labels) == 255
    assert "'0' '0' '0'" in code.message and "Aerospace_Fasteners_095" in code.message
    assert "many_labels" not in kinds(report)  # 255 is allowed without a warning


def test_case_255_shared_prefix(smol):
    f = report_for(CASES["large-enum-parser-blowup"]["schema"], smol).fields[0]
    assert [(c.piece, len(c.labels)) for c in f.collisions] == [("0", 99), ("1", 100), ("2", 56)]
    ident = {lab.label: lab.spellings[0].identified_at for lab in f.labels}
    assert ident["CAT_001"] == ident["CAT_123"] == 3


# -- warnings -------------------------------------------------------------------------------

def test_meaning_first_labels_raise_no_code_warning(smol):
    schema = {"fields": {"category": {"type": "enum", "labels": [
        "Aerospace_Fasteners_095", "Live_Animals_000", "Edible_Fruits_007"]}}}
    assert "code_first" not in kinds(report_for(schema, smol))
    numbered = {"fields": {"item": {"type": "enum", "labels": ["item 1", "item 2", "item 12"]}}}
    assert "code_first" not in kinds(report_for(numbered, smol))  # nothing after the number to put first
    punctuated = {"fields": {"risk": {"type": "enum", "labels": ["HIGH_RISK", "HIGH_VALUE", "LOW", "(none)"]}}}
    assert "code_first" not in kinds(report_for(punctuated, smol))  # quotes and '(' are not codes


@pytest.mark.parametrize("labels, decided_on", [
    (["SEV_0_CRITICAL", "SEV_1_MAJOR", "SEV_2_MINOR"], ("0",)),  # 'SEV_' is in the trunk; one digit decides
    (["1_Low", "2_Medium", "3_High"], ("1",)),
    (["P1_CRITICAL", "P2_HIGH", "P3_LOW"], ("1",)),
])
def test_one_leading_code_token_is_code_first(smol, labels, decided_on):
    report = report_for({"fields": {"level": {"type": "enum", "labels": labels}}}, smol)
    (w,) = [w for w in report.warnings if w.kind == "code_first"]
    assert w.labels == tuple(labels)
    assert f"is decided on {' '.join(map(repr, decided_on))}" in w.message


def test_more_code_first_cases(smol):
    coded = {"fields": {"category": {"type": "enum", "labels": [
        "CAT_095_Aerospace_Fasteners", "CAT_000_Live_Animals", "CAT_007_Edible_Fruits"]}}}
    assert kinds(report_for(coded, smol)) == ["code_first"]


def test_case_only_labels(smol):
    schema = CASES["enum-case-variants-unsupported-backend"]["schema"]
    assert report_for(schema, smol).warnings == ()
    labels = schema["fields"][0]["labels"] + ["Sedan"]
    report = report_for({"fields": [{**schema["fields"][0], "labels": labels}]}, smol)
    (w,) = report.warnings
    assert (w.kind, w.field, w.labels) == ("case_only", "car_type", ("sedan", "Sedan"))


def test_json_escaping(smol):
    schema = CASES["slash-in-enum-escaped"]["schema"]
    assert report_for(schema, smol).warnings == ()  # '/' is not escaped
    labels = schema["fields"][0]["labels"] + ['say "hi"', "a\\b"]
    report = report_for({"fields": [{**schema["fields"][0], "labels": labels}]}, smol)
    (w,) = report.warnings
    assert (w.kind, w.labels) == ("json_escape", ('say "hi"', "a\\b"))
    assert '"say \\"hi\\"", "a\\\\b"' in w.message
    f = report.fields[0]
    assert [s.spelling for lab in f.labels[2:] for s in lab.spellings] == ['"say \\"hi\\""', '"a\\\\b"']


@pytest.mark.parametrize("case_id, label, text", [("cjk-enum-latin1-mangled", "在线", '在线"'),
                                                  ("emoji-grammar-crash", "😀", '😀"')])
def test_non_ascii_paths_decode_to_the_label(smol, case_id, label, text):
    report = report_for(CASES[case_id]["schema"], smol)
    assert report.warnings == ()  # no escaping (written as UTF-8), every line round-trips
    f, lab = next((f, lab) for f in report.fields for lab in f.labels if lab.label == label)
    assert text in smol.decode(f.trunk_ids + lab.spellings[0].ids)  # the trunk may hold the first bytes


def test_quoted_labels_are_spelled_once(smol):
    f = report_for(CASES["enum-value-keeps-literal-quotes"]["schema"], smol).fields[0]
    assert [[s.spelling for s in lab.spellings] for lab in f.labels] == [['"decision"'], ['"fact"'], ['"question"']]


def test_label_tokens_beyond_the_logits_width(smol):
    schema = CASES["vocab-size-vs-logits-width"]["schema"]
    assert report_for(schema, smol, logits_width=smol.vocab_size).warnings == ()
    f = report_for(schema, smol).fields[0]
    top = max(t for lab in f.labels for s in lab.spellings for t in f.trunk_ids + s.ids)
    owners = tuple(lab.label for lab in f.labels if any(top in f.trunk_ids + s.ids for s in lab.spellings))
    report = report_for(schema, smol, logits_width=top)
    (w,) = report.warnings
    assert (w.kind, w.labels, report.logits_width) == ("logits_width", owners, top)
    assert f"width {top} (e.g. {top} " in w.message


def test_more_than_255_labels_is_allowed_with_its_cost():
    tok = HFTokenizer(gemma_like())
    labels = [f"item {chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(MANY_LABELS + 1)]
    report = report_for({"fields": {"item": {"type": "enum", "labels": labels}}}, tok)
    (w,) = report.warnings
    f = report.fields[0]
    assert (w.kind, w.field) == ("many_labels", "item")
    assert "256 labels (more than 255)" in w.message and f"costs {f.forest_tokens} forest tokens" in w.message
    assert len(f.labels) == 256 and f.trunk_text.endswith('"item ')


# -- CLI ------------------------------------------------------------------------------------

def inspect_schema(*args):
    return pcd("inspect-schema", *args, code=None)


def write(tmp_path, schema: dict) -> Path:
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    return path


SHAPE = {
    "schema": str, "model": str, "scoring": str, "tokenizer_size": int, "logits_width": int,
    "layout": {"chosen": str, "reason": str, "seam_moves": dict,
               "newline": {"family": str, "sample": str, "pieces": list}},
    "chat_template": {"used": bool, "system": str, "args": dict, "reads": list, "injects_date": bool, "pinned_date": type(None)},
    "head": {"tokens": int, "cut": int, "examples": int, "kv": {"dtype": str, "layers": int, "kv_heads": int, "head_dim": int,
                                               "bytes_per_token": int, "bytes": int}},
    "fields": list, "warnings": list, "rules": list, "rule_groups": list, "declared": list, "isolate_fields": bool,
}
FIELD_SHAPE = {"name": str, "type": str, "wave": int, "trunk_text": str, "trunk_ids": list, "trunk_pieces": list,
               "forest_tokens": int, "decision_points": int, "deepest": int, "labels": list, "collisions": list,
               "prefixes": list, "branch_tokens": int}


def check_shape(value, shape):
    if isinstance(shape, dict):
        assert isinstance(value, dict) and set(value) == set(shape), (set(value) ^ set(shape))
        for key, sub in shape.items():
            check_shape(value[key], sub)
    else:
        assert isinstance(value, shape), (value, shape)


def test_cli_json_shape_and_strict_exit(tmp_path):
    result = inspect_schema(write(tmp_path, CASES["shared-prefix-labels-no-eos"]["schema"]), "--json", "--strict")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    check_shape(data, SHAPE)
    (f,) = data["fields"]
    check_shape(f, FIELD_SHAPE)
    (d,) = data["declared"]  # the field as declared (tests/test_schema_types.py: every type)
    assert (d["name"], d["type"], d["decisions"], d["numbers"]) == (f["name"], f["type"], [f["name"]], None)
    assert data["warnings"] == [] and data["head"]["kv"]["bytes_per_token"] == 2 * 30 * 3 * 64 * 4
    twelve = {"spelling": '"12"', "ids": f["labels"][2]["spellings"][0]["ids"], "pieces": ["1", "2", '"', "\n", "}"],
              "identified_at": 2, "scored_tokens": 2}
    assert f["labels"][2] == {"label": "12", "spellings": [twelve]}
    assert f["collisions"] == [{"token": f["labels"][1]["spellings"][0]["ids"][0], "piece": "1", "labels": ["1", "12"],
                                "depth": 2}]
    assert f["prefixes"] == [["1", "12"]]


def test_cli_strict_fails_on_warnings_and_json_lists_them(tmp_path):
    schema = write(tmp_path, {"fields": {"car": {"type": "enum", "labels": ["sedan", "Sedan", "SUV"]}}})
    assert inspect_schema(schema).exit_code == 0
    result = inspect_schema(schema, "--json", "--strict")
    assert result.exit_code == 1
    (w,) = json.loads(result.stdout)["warnings"]
    assert w == {"kind": "case_only", "field": "car", "labels": ["sedan", "Sedan"],
                 "message": "field 'car': labels 'sedan', 'Sedan' differ only by case; "
                            "the model may not tell them apart"}


def test_cli_rich_output_names_fields_collisions_and_warnings():
    result = pcd("inspect-schema", str(ROOT / "schemas" / "customs_255.yaml"), code=None,
                 env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "layout newline_first" in out and "the newline is glued to the indentation after it" in out
    assert "'0' starts 100 labels (CAT_000_Live_Animals, " in out
    assert "warning [code_first]: field 'customs_category': 255 of 255 labels" in out
    assert out.rstrip().endswith("1 warning")


def test_cli_model_folder_with_config_but_no_weights(tmp_path):
    folder = tmp_path / "toy"
    tok = qwen_like(chat_template=CHATML)
    tok.save_pretrained(folder)
    LlamaConfig(vocab_size=257, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=1).save_pretrained(folder)
    result = inspect_schema(write(tmp_path, TWO_FIELDS), "--model", folder, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["model"] == "toy" and data["layout"]["chosen"] == "newline_last"
    assert data["head"]["kv"]["bytes_per_token"] == 2 * 3 * 1 * 16 * 4 and data["logits_width"] == 257
    # the toy's first merged token (",\n", id 256 after the 256 bytes) ends sentiment's lines: in range;
    # "{\n" (257) is beyond this config's 257 logits but only in the context, not in any label's line
    assert data["tokenizer_size"] == 258 and data["warnings"] == []
    LlamaConfig(vocab_size=256).save_pretrained(folder)
    result = inspect_schema(write(tmp_path, TWO_FIELDS), "--model", folder, "--json", "--strict")
    assert result.exit_code == 1
    (w,) = json.loads(result.stdout)["warnings"]
    assert (w["kind"], w["field"], w["labels"]) == ("logits_width", "sentiment", ["positive", "negative"])


@pytest.mark.parametrize("content, message", [(None, "cannot read it"), ("fields: [unclosed", "not valid YAML"),
                                              (b"name: \xff\xfe\nfields: {}\n", "not UTF-8 text"), ("", "is empty"),
                                              ("fields:\n  x: {type: enum, labels: [A]}\n", "at least two labels")])
def test_cli_unreadable_schema_exits_2(tmp_path, content, message):
    path = tmp_path / "schema.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    result = inspect_schema(path, "--json")
    assert result.exit_code == 2 and message in " ".join(result.stderr.split()) and result.stdout == ""


def test_render_without_template_or_config_and_with_prefixes():
    from rich.console import Console

    from pcd_cli.inspect_render import render_inspection

    tok = HFTokenizer(gemma_like())
    console = Console(width=200, record=True)
    render_inspection(report_for({"fields": {"name": {"type": "enum", "labels": ["John", "John Doe", "[b]x"]}}}, tok),
                      console)
    text = console.export_text()
    assert "chat template: none (plain-text prompt)" in text and "KV cache size unknown (no model config)" in text
    assert "vocabulary: tokenizer 256 tokens, logits width unknown" in text
    assert "'John' is a prefix of 'John Doe'" in text and "[b]x" in text  # labels are never read as markup
    assert "newline probe: the newline is a token of its own (like Gemma): ',' '\\n' ' '" in text


def test_labels_with_the_very_same_tokens_cannot_be_compiled():
    from tokenizers import normalizers

    from pcd_cli.backends.torch_backend import converted_gguf_dir, embedded_gguf_path
    from pcd_cli.errors import CompileError
    from transformers import AutoTokenizer

    raw = AutoTokenizer.from_pretrained(str(converted_gguf_dir(embedded_gguf_path())))
    raw.backend_tokenizer.normalizer = normalizers.Lowercase()
    schema = {"fields": {"car": {"type": "enum", "labels": ["SUV", "sedan", "Sedan"]}}}
    with pytest.raises(CompileError, match="labels 'sedan' and 'Sedan' have the very same tokens"):
        report_for(schema, HFTokenizer(raw))  # pcd label compiles the same way and stops too


def test_render_names_colliding_labels_and_escapes_control_characters():
    from rich.console import Console

    from pcd_cli.inspect_render import render_inspection

    animals = ["Dog", "Cat", "Cow", "Pig", "Hen", "Duck", "Eel", "Fox", "Goat", "Goose", "Mouse", "Moose",
               "a\x1b[31mRED"]
    report = report_for({"fields": {"animal\nkind": {"type": "enum", "labels": animals}}}, load_tokenizer(None)[1])
    console = Console(width=200, record=True)
    render_inspection(report, console)
    text = console.export_text()
    assert "\x1b" not in text and '"a\\u001b[31mRED"' in text and "animal\\nkind" in text
    (goose,) = [c for c in report.fields[0].collisions if "Goose" in c.labels]
    assert f"starts {len(goose.labels)} labels ({', '.join(goose.labels)}; followed" in text
    rows = text[text.index("token paths after the trunk"):]
    assert "Goose" in rows and "Moose" in rows  # colliding labels are listed before the others


@pytest.mark.parametrize("fields, id_args, message", [
    ({"row": {"type": "boolean"}}, [],
     "field 'row': clashes with the id column 'row'; rename the field or pass another --id-field"),
    ({"ok": {"type": "boolean"}, "id": {"type": "boolean"}}, ["--id-field", "id"],
     "field 'id': clashes with the id column 'id'; rename the field or pass another --id-field"),
    ({"ok": {"type": "boolean"}}, ["--id-field", "ok__prob"],
     "output column 'ok__prob' of field 'ok' clashes with the id column; rename the field or pass another --id-field"),
])
def test_cli_refuses_what_label_refuses_with_the_same_message(tmp_path, fields, id_args, message):
    schema = write(tmp_path, {"fields": fields})
    inspected = inspect_schema(schema, *id_args)
    labelled = pcd("label", str(tmp_path / "in.jsonl"), "-s", str(schema), *id_args,
                   "-o", str(tmp_path / "out.parquet"), code=None)
    assert (inspected.exit_code, labelled.exit_code) == (2, 2)
    assert inspected.output == f"error: {message}\n"
    assert message in labelled.output


def test_cli_id_field_moves_the_id_column(tmp_path):
    result = inspect_schema(write(tmp_path, {"fields": {"row": {"type": "boolean"}}}), "--id-field", "id", "--json")
    assert result.exit_code == 0, result.output
    assert [f["name"] for f in json.loads(result.stdout)["fields"]] == ["row"]


def test_a_multi_fields_options_count_their_shared_trunk_once(smol):
    """Issue #38 item 3: the options of a multi field share their trunk (``"topics": {``); the
    report's forest tokens are what each option adds to the pass, as the decoder feeds them."""
    schema = parse_schema({"fields": {"topics": {"type": "multi", "labels": ["billing", "outage", "security"]}}})
    report = report_for(schema, smol)
    compiled = CompiledSchema(schema, smol)
    plan = compiled.wave_plan(0, compiled.prompt.tail_text)
    assert [f.forest_tokens for f in report.fields] == [len(fo.ids) - fo.shared for fo in plan.forests]
    assert sum(f.forest_tokens for f in report.fields) == plan.n_tokens
    assert plan.forests[1].shared > 0 and report.fields[1].forest_tokens < len(plan.forests[1].ids)


def test_an_isolated_schema_is_reported_as_its_branches_are_compiled(smol):
    """``isolate_fields``: the head is the system turn naming no field, and each field's trunk and
    forest are those of its own branch (``field_alone`` with the catalog after the record), as the
    Labeler compiles them; not the shared prompt's."""
    from pcd_cli.schema.model import field_alone

    fields = {"urgent": {"type": "boolean", "description": "Needs action today, with a much longer description "
                                                           "than the other fields have"},
              "team": {"type": "enum", "labels": ["billing", "shipping", "other"]},
              "topics": {"type": "multi", "labels": ["refund", "delay", "login"]}}
    isolated = parse_schema({"name": "iso", "fields": fields, "isolate_fields": True})
    report = report_for(isolated, smol)
    shared = report_for({"name": "iso", "fields": fields}, smol)
    assert report.isolate_fields and not shared.isolate_fields
    branches = [CompiledSchema(field_alone(isolated, i), smol, catalog_after=True) for i in range(3)]
    assert report.head.tokens == len(branches[0].prompt.head_ids) < shared.head.tokens
    by_name = {f.name: f for f in report.fields}
    for branch in branches:
        plan = branch.wave_plan(0, branch.prompt.tail_text)
        for forest in plan.forests:
            f = by_name[branch.schema.fields[forest.field_index].name]
            assert f.trunk_ids == forest.ids[:forest.trunk_len] and f.forest_tokens == len(forest.ids) - forest.shared
    # the multi field's first option opens the object: its forest differs from the shared prompt's
    assert by_name["topics.refund"].forest_tokens != field(shared, "topics.refund").forest_tokens
    tails = {f.name: f.branch_tokens for f in report.fields}
    assert tails["urgent"] > tails["team"] > 0 and tails["topics.refund"] > 0 and tails["topics.delay"] == 0
    assert all(f.branch_tokens == 0 for f in shared.fields)
