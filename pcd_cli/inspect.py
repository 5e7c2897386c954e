"""``pcd inspect-schema``: what a schema looks like to one tokenizer, before any record is read.

Loads the tokenizer, its chat template and the model's config, never the weights, compiles
the schema exactly as ``pcd label`` does (``CompiledSchema``) and reports:

* the layout: where this tokenizer attaches the newline between two answer lines (the
  *newline probe*, below), the seam tokens each layout moves back
  (``CompiledSchema.layout_moves``) and the layout kept (fewest moves, first on a tie);
* the chat template: whether there is one, the arguments it is rendered with, those it reads
  (each rendered again with another value), whether it prints a date and the date pinned;
* the prompt head: its tokens and the size of its KV cache, from the model's config;
* per declared field: its type and options (ordinal order, integer range, nullable,
  ``none_label``, a multi field's options, threshold and item bounds, and the decisions it
  is read as); for an integer field, how its values tokenize (``NumberReport``);
* per decision (a multi field has one per option): the trunk (known text where the
  decision starts), each spelling's token path after it and the depth at which it is
  identified, first-token collisions, labels that are a prefix of another, the forest size;
* warnings (``Finding``), one ``kind`` each, listed in ``WARNING_KINDS``.

Rules:

* Newline probe (docs/how-it-works.md, decoding rule 4): join two answer lines of this schema with ``\\n``;
  if the first line's tokens without the newline are not a token prefix of the whole, the
  newline is glued to the punctuation before it (Qwen2.5: ``,\\n``); if the first line's
  tokens *with* the newline are not a prefix, it is glued to the indentation after it
  (SmolLM2: ``\\n``+space); if both are prefixes it is standalone (Gemma).
* ``identified_at`` of a spelling: the number of tokens after the trunk up to and including
  the first one that no spelling of another label shares (the rule of compile.py's
  ``marginal`` scoring; spellings of one label never separate it from itself). Labels with
  the very same tokens cannot be compiled (``CompileError``), so every label has one.
* Collisions: labels whose canonical spelling (the one written into the context) has the
  same first decision token. Booleans' quoted spellings share their opening quote by
  construction and are not counted; their depth shows in ``identified_at``.
* ``code_first`` (seed article 1, "Your label names are a hyperparameter"): the first
  decision token of a label's canonical spelling (JSON quotes skipped) is a code (no letter;
  a digit or one of ``_-#./``) and the label has letters after what was read by its
  identification: the model must commit to a code before it reaches any meaning
  (``CAT_095_Aerospace_Fasteners``: ``0``, ``9``, ``5``; ``SEV_1_MAJOR``: ``1``).
* ``many_labels``: more than ``MANY_LABELS`` labels (the 255-option cap of other tools,
  seed article 2). Allowed; the warning gives its cost.

The tokenizer is the backend contract's (``pcd_cli.backends``); ``chat_args``,
``chat_template`` and ``render_chat(messages, **overrides)`` (``HFTokenizer`` has them) are
used when present for the template probe.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, replace

from .decoding.compile import CompiledSchema, FieldForest, WavePlan
from .decoding.prompt import (
    HEAD_PROBES,
    INPUT_LABEL,
    Layout,
    catalog_line,
    common_prefix_len,
    render_turns,
    system_text,
)
from .decoding.seams import TAIL_PROBES
from .errors import CompileError, RecordError
from .schema.model import Schema, json_string
from .schema.rules import never_allowed, rule_components

#: Characters of the JSON around a label (quotes, separators, line ends): never its meaning.
JSON_PUNCTUATION = ' "\n\r\t,{}:'
#: Characters that make a letterless token a code (digits count too).
CODE_CHARS = "_-#./"
MANY_LABELS = 255
#: Bytes per element of the KV cache, by dtype.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: Another value for each chat-template argument: the template reads the argument if its output changes.
PROBE_VALUES = {"add_generation_prompt": False, "enable_thinking": True, "date_string": "31 Dec 1999"}
WARNING_KINDS = ("context_length", "code_first", "case_only", "json_escape", "logits_width", "seam_merge",
                 "many_labels", "round_trip", "date_unpinned", "system_merged", "record_seam", "special_text",
                 "label_whitespace", "rule_never_allows", "schema")
#: Special-token text a record may hold; the splice check is reported with it (``special_text``).
ATTACK_PROBE = "x{special}y"


@dataclass(frozen=True)
class Finding:
    """A warning. ``kind``: one of ``WARNING_KINDS``; ``field``: its field (``None``: the
    whole schema); ``labels``: the labels concerned; ``message``: the advice, for people."""

    kind: str
    field: str | None
    labels: tuple[str, ...]
    message: str


@dataclass(frozen=True)
class NewlineProbe:
    """Where the newline between two answer lines goes (see the module docstring).

    Attributes:
        family: ``glued_before``, ``glued_after``, ``standalone`` or ``glued_both``.
        sample: the probe text (two lines of this schema, joined by the newline).
        pieces: the token holding the newline with one token either side, as text.
    """

    family: str
    sample: str
    pieces: tuple[str, ...]


@dataclass(frozen=True)
class LayoutReport:
    chosen: str  #: ``newline_first`` or ``newline_last`` (see ``prompt.Layout``)
    reason: str
    seam_moves: dict[str, int]  #: layout name -> ``CompiledSchema.seam_moves()``
    newline: NewlineProbe


@dataclass(frozen=True)
class TemplateReport:
    used: bool  #: the model's chat template renders the prompt (else pcd's plain-text fallback)
    system: str  #: how the instructions and catalog went in: ``prompt.SYSTEM_PLACEMENTS``
    args: dict  #: arguments it is rendered with
    reads: tuple[str, ...]  #: those of ``args`` that change its output
    injects_date: bool  #: it prints a date (reads ``date_string`` or calls ``strftime_now``)
    pinned_date: str | None  #: the date printed on every day, when pinned


@dataclass(frozen=True)
class KVEstimate:
    """KV-cache size of the head: 2 (K, V) x layers x kv_heads x head_dim x tokens x bytes."""

    dtype: str  #: assumed dtype (pcd's default on CPU is float32; bfloat16/float16 halve it)
    layers: int
    kv_heads: int
    head_dim: int
    bytes_per_token: int
    bytes: int


@dataclass(frozen=True)
class HeadReport:
    tokens: int  #: tokens of the prompt head, cached once per schema
    cut: int  #: tokens of the head text given back so that every record's start tokenizes the same
    kv: KVEstimate | None  #: ``None`` without a model config
    examples: int = 0  #: few-shot examples included in the head (the schema's ``examples:``)


@dataclass(frozen=True)
class SpellingReport:
    spelling: str  #: as written in the line (JSON), e.g. ``"SUV"`` or ``true``
    ids: tuple[int, ...]  #: token path after the trunk, to the end of the line (its ending included)
    pieces: tuple[str, ...]  #: each token decoded alone
    identified_at: int  #: tokens after the trunk read until no other label shares the path
    scored_tokens: int  #: tokens the decoder reads on this path with the report's scoring


@dataclass(frozen=True)
class LabelReport:
    label: str
    spellings: tuple[SpellingReport, ...]  #: canonical first


@dataclass(frozen=True)
class Collision:
    token: int  #: the first decision token the labels share
    piece: str
    labels: tuple[str, ...]
    depth: int  #: tokens followed until each of them is identified (the largest ``identified_at``)


@dataclass(frozen=True)
class FieldReport:
    name: str
    type: str
    wave: int
    trunk_text: str
    trunk_ids: tuple[int, ...]
    trunk_pieces: tuple[str, ...]
    forest_tokens: int  #: tokens the field adds to its wave's forward pass (a trunk shared with the forest before counted there)
    decision_points: int  #: trie nodes whose next-token distribution is read
    deepest: int  #: largest ``identified_at`` of the field
    labels: tuple[LabelReport, ...]
    collisions: tuple[Collision, ...]
    prefixes: tuple[tuple[str, str], ...]  #: ``(label, longer label it is a prefix of)``
    #: with ``isolate_fields``, on a declared field's first decision: the tokens its branch feeds per
    #: record after the record's text and before its forest (its catalog line, the turn's close, the
    #: JSON opener; the tail tokenized alone); 0 otherwise
    branch_tokens: int = 0


@dataclass(frozen=True)
class NumberReport:
    """How an integer field's values tokenize: their canonical (unquoted) spellings, the null
    option left out. A range like 1..100 is a collision-heavy trie (``1`` starts ``1``,
    ``10``..``19``, ``100``); the trie runs to the end of the line, so a value that is a
    prefix of another is told apart by the token after its digits, and every value is read exactly."""

    values: int
    digit_tokens: tuple[int, int]  #: fewest and most tokens holding a digit, per value
    first_tokens: int  #: distinct first digit tokens
    colliding: int  #: values whose first digit token starts another value too
    line_end: int  #: values identified only by the token after their digits (a prefix of another value)
    depth: int  #: tokens read after the trunk to identify the deepest value
    exact: bool  #: every value has its own path, line end included, and is read until it is identified


@dataclass(frozen=True)
class DeclaredReport:
    """A field as declared (``Schema.declared``); ``SchemaReport.fields`` has its decisions."""

    name: str
    type: str
    labels: tuple[str, ...]  #: ``Field.labels``: a multi field's options; a nullable field's last label is ``null``
    nullable: bool
    none_label: str | None
    minimum: int | None  #: integer fields: the range
    maximum: int | None
    threshold: float | None  #: multi fields: P(yes) at which an option is chosen, and the item bounds
    min_items: int | None
    max_items: int | None
    decisions: tuple[str, ...]  #: its rows in ``SchemaReport.fields`` (a multi field: one per option)
    numbers: NumberReport | None  #: integer fields: how the values tokenize


@dataclass(frozen=True)
class SchemaReport:
    schema: str
    model: str
    scoring: str
    tokenizer_size: int  #: token ids the tokenizer can produce
    logits_width: int | None  #: the model's ``vocab_size`` from its config (``None``: unknown)
    layout: LayoutReport
    chat_template: TemplateReport
    head: HeadReport
    fields: tuple[FieldReport, ...]
    warnings: tuple[Finding, ...]
    #: rules between fields: ``{"index", "text", "rule"}`` (``rule``: as in ``pcd.rules``)
    rules: tuple[dict, ...] = ()
    #: per group of linked rules: ``{"fields", "rules", "joint_space"}`` (``rules.rule_components``)
    rule_groups: tuple[dict, ...] = ()
    #: the fields as declared, with their types and options (``DeclaredReport``)
    declared: tuple[DeclaredReport, ...] = ()
    #: every field decided in its own branch (``isolate_fields``): the head names no field, each
    #: field's ``trunk`` is its catalog line after the record, then its key
    isolate_fields: bool = False

    def to_dict(self) -> dict:
        """Plain data for ``--json`` (shape documented in docs/inspect-schema.md)."""
        return asdict(self)


def inspect(schema: Schema, *, model: str | None = None, scoring: str = "marginal", tokenizer=None,
            config=None, logits_width: int | None = None, kv_dtype: str = "float32",
            template: str | None = None) -> SchemaReport:
    """Compile ``schema`` for ``model``'s tokenizer and report what will happen to it (loads no weights).

    Args:
        model: ``--model`` (``None``: the embedded default); used when ``tokenizer`` is ``None``,
            which loads the tokenizer and the model's config.
        tokenizer: a backend tokenizer to use instead (tests, notebooks).
        config: a transformers config for the KV estimate and logits width (loaded with the tokenizer).
        logits_width: overrides the config's ``vocab_size``.
        kv_dtype: dtype assumed for the KV estimate (a key of ``DTYPE_BYTES``).
        template: ``--template``, for the schema's examples given as ``columns``; the head
            (and its size) includes the schema's few-shot examples.

    Raises:
        ModelError: the tokenizer cannot be loaded. CompileError: see ``CompiledSchema``.
    """
    model_id = model or "default"
    if tokenizer is None:
        from .backends.torch_backend import load_config, load_tokenizer

        model_id, tokenizer = load_tokenizer(model)
        config = load_config(model)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    width = logits_width or getattr(text_config, "vocab_size", None)
    from .decoding.examples import resolve_examples

    if schema.isolate_fields:  # as the Labeler compiles it: one branch per declared field, its catalog after the record
        from .schema.model import field_alone

        branches = [CompiledSchema(field_alone(schema, i, schema.isolated_key), tokenizer, scoring=scoring,
                                   catalog_after=True) for i in range(len(schema.declared))]
    else:
        branches = [CompiledSchema(schema, tokenizer, scoring=scoring,
                                   examples=resolve_examples(schema.examples, template))]
    compiled = branches[0]  # the head (the system turn) is the same in every branch
    fields, found = [], {}
    for branch in branches:
        tail = len(tokenizer.encode(branch.prompt.tail_text)) if schema.isolate_fields else 0
        for wave, plan in enumerate(branch.default_plans()):
            for forest in plan.forests:
                fields.append(replace(_field_report(branch, plan, forest, wave), branch_tokens=tail))
                tail = 0
                found[schema.field_index(fields[-1].name)] = _field_warnings(branch, plan, forest, fields[-1], width)
    fields.sort(key=lambda r: schema.field_index(r.name))
    prompt = compiled.prompt
    n_head = len(prompt.head_ids)
    head = HeadReport(tokens=n_head, cut=len(tokenizer.encode(prompt.head_text)) - n_head,
                      kv=kv_estimate(text_config, n_head, kv_dtype), examples=len(compiled.examples))
    moves = compiled.layout_moves
    chosen = compiled.layout.name
    reason = (f"fewest seam tokens moved back ({moves[chosen]})" if len(set(moves.values())) > 1
              else f"every layout moves {moves[chosen]} seam tokens; kept the first")
    layout = LayoutReport(chosen=chosen, reason=reason, seam_moves=dict(moves),
                          newline=probe_newline(schema, tokenizer))
    template = probe_template(schema, tokenizer)
    report = SchemaReport(schema=schema.name, model=model_id, scoring=scoring, tokenizer_size=tokenizer.vocab_size,
                          logits_width=width, layout=layout, chat_template=template, head=head,
                          fields=tuple(fields), warnings=(),
                          rules=tuple({"index": r.index, "text": r.text, "rule": r.to_dict()} for r in schema.rules),
                          rule_groups=tuple(rule_components(schema)), declared=declared_reports(schema, fields),
                          isolate_fields=schema.isolate_fields)
    warnings = (_schema_warnings(report) + _load_warnings(schema) + _record_warnings(compiled)
                + [w for i in sorted(found) for w in found[i]])
    context = getattr(text_config, "max_position_embeddings", None)
    if context and n_head + max(f.deepest for f in fields) + len(fields) >= context:
        warnings.insert(0, Finding("context_length", None, (), f"the prompt head alone is {n_head} tokens; the "
                                   f"model's context is {context}: no room is left for the records' text "
                                   "(pcd label stops with exit 3); shorten the descriptions"))
    return replace(report, warnings=tuple(warnings))


def declared_reports(schema: Schema, fields: list[FieldReport]) -> tuple[DeclaredReport, ...]:
    """Each declared field with its type, options and decisions; an integer field with how its
    values tokenize (from its decision's ``FieldReport``)."""
    by_name = {f.name: f for f in fields}
    out = []
    for f, parts in schema.declared_parts():
        multi, integer = f.is_multi, f.type == "integer"
        out.append(DeclaredReport(
            name=f.name, type=f.type, labels=f.labels, nullable=f.nullable, none_label=f.none_label,
            minimum=int(f.labels[0]) if integer else None,
            maximum=int(f.labels[-2 if f.nullable else -1]) if integer else None,
            threshold=f.threshold if multi else None, min_items=f.min_items if multi else None,
            max_items=f.max_items if multi else None,
            decisions=tuple(schema.fields[i].name for i in parts),
            numbers=number_report(by_name[f.name], f.nullable) if integer and f.name in by_name else None))
    return tuple(out)


def number_report(fr: FieldReport, nullable: bool) -> NumberReport:
    """``NumberReport`` of an integer field's decision (the null option, the last label, left out)."""
    values = [lab.spellings[0] for lab in (fr.labels[:-1] if nullable else fr.labels)]

    def digits(s: SpellingReport) -> list[int]:
        return [t for t, p in zip(s.ids, s.pieces) if any(ch.isdigit() for ch in p)]

    counts = [len(digits(s)) for s in values]
    starts = defaultdict(int)
    for s in values:
        starts[digits(s)[0] if digits(s) else None] += 1
    return NumberReport(
        values=len(values), digit_tokens=(min(counts), max(counts)), first_tokens=len(starts),
        colliding=sum(n for n in starts.values() if n > 1),
        line_end=sum(1 for s in values if not any(ch.isdigit() for ch in s.pieces[s.identified_at - 1])),
        depth=max(s.identified_at for s in values),
        exact=len({s.ids for s in values}) == len(values)
        and all(s.identified_at <= len(s.ids) and s.scored_tokens >= s.identified_at for s in values))


def probe_newline(schema: Schema, tokenizer) -> NewlineProbe:
    """Tokenize two answer lines of ``schema`` and see where the newline between them goes."""
    layout = Layout("newline_last")

    def written(f, last: bool) -> str:  # a declared field's answer line (a multi field's whole line)
        if f.is_multi:
            return layout.group_line(f.name, [(option, "true") for option in f.labels], last=last)
        return layout.line(f, f.spellings(0)[0], last=last)

    first, second = schema.declared[0], schema.declared[min(1, len(schema.declared) - 1)]
    line = written(first, False)  # '  "k": v,\n'
    sample = line + written(second, True)[:-1]
    ids = tokenizer.encode(sample)
    bare, with_newline = tokenizer.encode(line[:-1]), tokenizer.encode(line)
    before = common_prefix_len(bare, ids) < len(bare)
    after = common_prefix_len(with_newline, ids) < len(with_newline)
    family = {(True, True): "glued_both", (True, False): "glued_before", (False, True): "glued_after",
              (False, False): "standalone"}[(before, after)]
    k = common_prefix_len(bare, ids)  # the token holding the newline
    return NewlineProbe(family=family, sample=sample,
                        pieces=tuple(tokenizer.decode([t]) for t in ids[max(k - 1, 0):k + 2]))


def probe_template(schema: Schema, tokenizer) -> TemplateReport:
    """Render the schema's first turns with each argument changed, to see which ones the template reads."""
    messages = [{"role": "system", "content": system_text(schema)}, {"role": "user", "content": INPUT_LABEL + "x"}]
    base, placement = render_turns(tokenizer, messages)
    args = getattr(tokenizer, "chat_args", None)
    if base is None or args is None:
        return TemplateReport(used=base is not None, system=placement, args={} if base is None else args or {},
                              reads=(), injects_date=False, pinned_date=None)

    def rendered(name: str) -> str | None:
        try:
            return render_turns(tokenizer, messages, **{name: PROBE_VALUES[name]})[0]
        except CompileError:  # the template refuses the turns with this value: it reads the argument
            return None

    reads = tuple(name for name in args if name in PROBE_VALUES and rendered(name) != base)
    clock = "strftime_now" in (getattr(tokenizer, "chat_template", None) or "")
    pinned = args.get("date_string") if "date_string" in reads and not clock else None  # the clock wins
    return TemplateReport(used=True, system=placement, args=args, reads=reads,
                          injects_date="date_string" in reads or clock, pinned_date=pinned)


def kv_estimate(config, tokens: int, dtype: str = "float32") -> KVEstimate | None:
    """KV-cache bytes of ``tokens`` tokens from a transformers (text) config; ``None`` if it lacks the sizes."""
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    if not layers or not heads:
        return None
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    per_token = 2 * layers * kv_heads * head_dim * DTYPE_BYTES[dtype]
    return KVEstimate(dtype=dtype, layers=layers, kv_heads=kv_heads, head_dim=head_dim,
                      bytes_per_token=per_token, bytes=per_token * tokens)


def _field_report(compiled: CompiledSchema, plan: WavePlan, forest: FieldForest, wave: int) -> FieldReport:
    tok = compiled.tokenizer
    field = compiled.schema.fields[forest.field_index]
    start = len(plan.context_ids) + forest.trunk_len
    spellings = [(label, s) for label in range(len(field.labels)) for s in field.spellings(label)]
    paths = [tuple(compiled.encode_context(plan.context_text + line)[start:]) for _, line in forest.lines]  # as compile
    owners: dict[tuple[int, ...], set[int]] = defaultdict(set)  # path prefix -> labels with a spelling on it
    for (label, _), path in zip(spellings, paths):
        for i in range(1, len(path) + 1):
            owners[path[:i]].add(label)
    scored = {(t.label, tuple(forest.query_ids[q][c] for q, c in t.edges)): len(t.edges) for t in forest.terminals}
    by_label: dict[int, list[SpellingReport]] = defaultdict(list)
    for (label, spelling), path in zip(spellings, paths):
        ident = next((i for i in range(1, len(path) + 1) if len(owners[path[:i]]) == 1), len(path))
        n_scored = next(scored[(label, path[:i])] for i in range(1, len(path) + 1) if (label, path[:i]) in scored)
        by_label[label].append(SpellingReport(spelling=spelling, ids=path, pieces=tuple(tok.decode([t]) for t in path),
                                              identified_at=ident, scored_tokens=n_scored))
    labels = tuple(LabelReport(label=field.labels[i], spellings=tuple(by_label[i])) for i in range(len(field.labels)))
    first: dict[int, list[LabelReport]] = defaultdict(list)
    for lab in labels:
        first[lab.spellings[0].ids[0]].append(lab)
    collisions = tuple(Collision(token=t, piece=tok.decode([t]), labels=tuple(lab.label for lab in group),
                                 depth=max(lab.spellings[0].identified_at for lab in group))
                       for t, group in first.items() if len(group) > 1)
    trunk = forest.ids[:forest.trunk_len]
    return FieldReport(
        name=field.name, type=field.type, wave=wave, trunk_text=tok.decode(trunk), trunk_ids=trunk,
        trunk_pieces=tuple(tok.decode([t]) for t in trunk), forest_tokens=len(forest.ids) - forest.shared,
        decision_points=len(forest.query_rows),
        deepest=max(s.identified_at for lab in labels for s in lab.spellings), labels=labels,
        collisions=collisions,
        prefixes=tuple((a, b) for a in field.labels for b in field.labels if a != b and b.startswith(a)))


def _code_before_meaning(label: str, pieces: tuple[str, ...]) -> tuple[str, ...] | None:
    """The tokens ``label`` is decided on, if the first of them is a code and meaning follows.

    ``pieces``: the label's decision tokens after the trunk, up to its identification. The
    JSON quotes and separators among them are skipped. The rule (``code_first``): the first
    remaining token has no letter and holds a digit or one of ``CODE_CHARS``, and the label
    has letters after the text read so far (``CAT_095_Aerospace_Fasteners`` decided on
    ``0`` ``9`` ``5``; ``1_Low`` on ``1``; not ``item 12``, which has no meaning after its
    number). Returns ``None`` otherwise.
    """
    content = tuple(p for p in pieces if p.strip(JSON_PUNCTUATION))
    if not content:
        return None
    first = content[0].strip(JSON_PUNCTUATION)
    if any(ch.isalpha() for ch in first) or not any(ch.isdigit() or ch in CODE_CHARS for ch in first):
        return None
    read = "".join(pieces).strip(JSON_PUNCTUATION)
    rest = label[label.find(read) + len(read):] if read and read in label else ""
    return content if any(ch.isalpha() for ch in rest) else None


def _schema_warnings(report: SchemaReport) -> list[Finding]:
    out: list[Finding] = []
    moves = report.layout.seam_moves[report.layout.chosen]
    if moves:
        per_layout = ", ".join(f"{k}: {v}" for k, v in report.layout.seam_moves.items())
        fallback = ("written answer lines would change the next line's tokens; the fields decided after the "
                    "first may be scored on a context the model would not tokenize that way" if moves >= 1000 else
                    f"fallback taken: pcd cuts the context back ({moves} tokens in all) and re-feeds those "
                    "tokens as each field's trunk, so the scored tokens stay the tokenizer's own")
        out.append(Finding("seam_merge", None, (), f"the tokenizer merges across a line seam in every layout "
                           f"(seam tokens moved back: {per_layout}); kept {report.layout.chosen}; {fallback}"))
    t = report.chat_template
    if t.injects_date and t.pinned_date is None:
        out.append(Finding("date_unpinned", None, (), "the chat template prints today's date (strftime_now), "
                           "which pcd cannot pin: the head, its cache and its sha256 change every day"))
    return out


#: Words of ``Schema.warnings`` that this report already gives under its own kind
#: (``label_whitespace``, ``case_only``), so they are not repeated as ``schema`` findings.
_REPORTED_OWN_KIND = ("has surrounding whitespace", "differ only by case")


def _load_warnings(schema: Schema) -> list[Finding]:
    """What ``pcd label`` warns about when it loads ``schema`` (``Schema.warnings``), as findings:
    a label the rules between fields make impossible (``rule_never_allows``, its field and
    labels; rules that can never hold together are refused at load, by label and here alike),
    and the other load warnings (``schema``), except those reported under a kind of their own."""
    out = [Finding("rule_never_allows", name, labels, message) for name, labels, message in never_allowed(schema)]
    said = {f.message for f in out}
    out += [Finding("schema", None, (), w) for w in schema.warnings
            if w not in said and not any(words in w for words in _REPORTED_OWN_KIND)]
    return out


def _record_warnings(compiled: CompiledSchema) -> list[Finding]:
    """What ``pcd label`` would do to records, tried on probe records: which are refused at a
    seam (``record_seam``), whether special-token text in a record can be tokenized as text
    (``special_text``), and how the system text went in (``system_merged``)."""
    out: list[Finding] = []
    placement = compiled.prompt.system_placement
    if placement == "merged_refused":
        out.append(Finding("system_merged", None, (), "the chat template refuses a system turn (it raises), so the "
                           "instructions and catalog are put at the start of the user turn"))
    elif placement == "merged_dropped":
        out.append(Finding("system_merged", None, (), "the chat template renders the prompt without its system turn "
                           "(it drops it silently), so the instructions and catalog are put at the start of the "
                           "user turn; check the model's chat_template"))
    refused: dict[str, list[str]] = defaultdict(list)
    for probe in dict.fromkeys(HEAD_PROBES + TAIL_PROBES):
        try:
            compiled.record_chain(probe, probe)
        except RecordError as exc:
            refused[str(exc).split(": ", 1)[1]].append(probe)
    for reason, probes in refused.items():
        out.append(Finding("record_seam", None, tuple(probes), f"records like {', '.join(map(repr, probes))} will be "
                           f"refused by pcd label: {reason}"))
    specials = getattr(compiled.tokenizer, "special_texts", ())
    if specials:
        probe = ATTACK_PROBE.format(special=specials[0])
        try:
            compiled.record_chain("probe", probe)
        except RecordError as exc:
            out.append(Finding("special_text", None, (), f"a record holding special-token text such as "
                               f"{specials[0]!r} will be refused: {str(exc).split(': ', 1)[1]}"))
    return out


def _field_warnings(compiled: CompiledSchema, plan: WavePlan, forest: FieldForest, fr: FieldReport,
                    width: int | None) -> list[Finding]:
    tok = compiled.tokenizer
    field = compiled.schema.fields[forest.field_index]
    name = field.name
    out: list[Finding] = []
    code = []
    for lab in fr.labels:
        canonical = lab.spellings[0]
        decided_on = _code_before_meaning(lab.label, canonical.pieces[:canonical.identified_at])
        if decided_on:
            code.append((lab.label, decided_on))
    if code:
        label, pieces = code[0]
        out.append(Finding("code_first", name, tuple(label for label, _ in code),
                           f"field {name!r}: {len(code)} of {len(fr.labels)} labels make the model commit to "
                           f"digits or codes before any meaning (e.g. {label!r} is decided on "
                           f"{' '.join(map(repr, pieces))}); if you control the labels, put the meaning first, e.g. "
                           "'Aerospace_Fasteners_095' rather than 'CAT_095_Aerospace_Fasteners'"))
    folded: dict[str, list[str]] = defaultdict(list)
    for label in field.labels:
        folded[label.casefold()].append(label)
    for group in (g for g in folded.values() if len(g) > 1):
        out.append(Finding("case_only", name, tuple(group), f"field {name!r}: labels {', '.join(map(repr, group))} "
                           "differ only by case; the model may not tell them apart"))
    spaced = [label for label in field.labels if label != label.strip()]
    if spaced:
        out.append(Finding("label_whitespace", name, tuple(spaced), f"field {name!r}: labels "
                           f"{', '.join(map(repr, spaced))} have surrounding whitespace; the model must write it "
                           "inside the quotes to pick them (they are returned exactly as written)"))
    escaped = [label for label in field.labels if not field.is_boolean and json_string(label)[1:-1] != label]
    if escaped:
        out.append(Finding("json_escape", name, tuple(escaped), f"field {name!r}: {len(escaped)} labels need JSON "
                           f"escaping in the answer line; the model must write the escapes to pick them: "
                           f"{', '.join(json_string(label) for label in escaped[:6])}"))
    if width is not None:
        over = [lab.label for lab in fr.labels if any(t >= width for s in lab.spellings for t in fr.trunk_ids + s.ids)]
        if over:
            worst = max(t for lab in fr.labels for s in lab.spellings for t in fr.trunk_ids + s.ids)
            out.append(Finding("logits_width", name, tuple(over), f"field {name!r}: {len(over)} labels need token ids "
                               f"at or beyond the model's logits width {width} (e.g. {worst} {tok.decode([worst])!r}); "
                               "pcd label will stop with a compile error (exit 3)"))
    if len(field.labels) > MANY_LABELS:
        catalog = len(tok.encode(catalog_line(field)))
        out.append(Finding("many_labels", name, (), f"field {name!r} has {len(field.labels)} labels (more than "
                           f"{MANY_LABELS}): allowed; it costs {fr.forest_tokens} forest tokens in every "
                           f"wave-{fr.wave} pass and {catalog} head tokens for its catalog line"))
    _, anchor_ids = compiled.anchor  # decoded in context: spaces the context owns are not the label's
    bad = {label for label, line in forest.lines
           if not tok.decode(list(anchor_ids) + compiled.encode_context(plan.context_text + line)).endswith(line)}
    broken = [field.labels[i] for i in sorted(bad)]
    if broken:
        out.append(Finding("round_trip", name, tuple(broken), f"field {name!r}: the lines of "
                           f"{', '.join(map(repr, broken))} do not decode back to their text with this tokenizer"))
    return out
