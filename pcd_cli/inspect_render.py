"""Formats an ``inspect.SchemaReport``: rich tables for people, one JSON object for scripts."""

from __future__ import annotations

import orjson
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .inspect import FieldReport, SchemaReport
from .schema.rules import MAX_JOINT_SPACE

#: Label rows shown per field in the path table (``--json`` has them all).
PATH_ROWS = 8
#: Trunk tokens shown in the fields table (the last ones: where the decision starts).
TRUNK_TAIL = 3
#: ``TemplateReport.system`` in words.
SYSTEM_WAYS = {"system_turn": "in the system turn",
               "merged_refused": "merged into the user turn (the template refuses a system turn)",
               "merged_dropped": "merged into the user turn (the template drops the system turn)",
               "plain_text": "in the plain-text prompt"}
NEWLINE_FAMILIES = {
    "glued_after": "glued to the indentation after it (like SmolLM2)",
    "glued_before": "glued to the punctuation before it (like Qwen2.5)",
    "standalone": "a token of its own (like Gemma)",
    "glued_both": "glued to the text on both sides",
}


def report_json(report: SchemaReport) -> str:
    """The report as one indented JSON object (keys and types: docs/inspect-schema.md)."""
    return orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2).decode()


def _show(piece: str) -> str:
    """``piece`` on one line: control characters (newlines) escaped, the rest as is."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in piece)


def _path(pieces) -> str:
    return "|".join(_show(p) for p in pieces)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def _names(labels, most: int = 6) -> str:
    shown = ", ".join(_show(label) for label in labels[:most])
    return shown + (f", +{len(labels) - most} more" if len(labels) > most else "")


def render_inspection(report: SchemaReport, console: Console) -> None:
    """Print ``report``: a summary, a fields table, label paths where labels share tokens, warnings.

    Labels and names are printed as text, never as markup, with control characters escaped.
    """

    def say(text: str) -> None:
        console.print(Text(text), highlight=False)  # Text: labels may hold [brackets], never markup

    lay, tpl, head = report.layout, report.chat_template, report.head
    say(f"schema {report.schema} on {report.model} (scoring {report.scoring})")
    moves = ", ".join(f"{k} {v}" for k, v in lay.seam_moves.items())
    say(f"layout {lay.chosen}: {lay.reason}; seam tokens moved back per layout: {moves}")
    say(f"newline probe: the newline is {NEWLINE_FAMILIES[lay.newline.family]}: "
        f"{' '.join(map(repr, lay.newline.pieces))}")
    if tpl.used:
        args = ", ".join(f"{k}={v!r}" for k, v in tpl.args.items())
        date = (f"prints a date, pinned to {tpl.pinned_date}" if tpl.pinned_date else
                "prints today's date, NOT pinned" if tpl.injects_date else "prints no date")
        what = "instructions" if report.isolate_fields else "instructions and catalog"
        say(f"chat template: rendered with {args}; reads {', '.join(tpl.reads) or 'none of them'}; {date}; "
            f"{what} {SYSTEM_WAYS[tpl.system]}")
    else:
        say("chat template: none (plain-text prompt)")
    if report.isolate_fields:
        tails = {f.name: f.branch_tokens for f in report.fields}
        fed = ", ".join(f"{d.name} {tails.get(d.decisions[0], 0)}" for d in report.declared)
        say("isolate_fields: every field is decided in its own branch after the record (its catalog line, "
            "then its key); the head names no field, a field's trunk and forest are those of its branch; "
            f"tokens each branch feeds per record before its forest: {fed}")
    kv = head.kv
    memory = (f"KV cache {_mib(kv.bytes)} in {kv.dtype} ({kv.layers} layers x {kv.kv_heads} KV heads x "
              f"{kv.head_dim} dims x 2; {kv.bytes_per_token} bytes per token)" if kv
              else "KV cache size unknown (no model config)")
    cut = f" (cut back {head.cut} so that every record's start tokenizes the same)" if head.cut else ""
    shots = f", {head.examples} few-shot examples included" if head.examples else ""
    say(f"head: {head.tokens} tokens{shots}{cut}; {memory}")
    say(f"vocabulary: tokenizer {report.tokenizer_size} tokens, logits width "
        f"{report.logits_width if report.logits_width is not None else 'unknown'}")
    if any(d.type not in ("boolean", "enum") or d.nullable or d.none_label is not None for d in report.declared):
        console.print(_declared_table(report))  # plain schemas: the fields table says it all
        for d in report.declared:
            if d.numbers is not None:
                say(_numbers_line(d))
    console.print(_fields_table(report, wide=console.width >= 120))
    say("trunk: its token count and last tokens (the decision starts after them); forest: tokens the field adds "
        "to its forward pass; colliding: labels sharing their first decision token; deepest: tokens read to "
        "identify a label")
    for f in report.fields:
        if f.collisions or f.prefixes:
            _render_paths(f, console, say)
    for rule in report.rules:
        say(f"rules[{rule['index']}]: {rule['text']}")
    for group in report.rule_groups:
        rules = ", ".join(f"rules[{i}]" for i in group["rules"])
        say(f"{rules} link{'s' * (len(group['rules']) == 1)} {', '.join(group['fields'])}: joint space "
            f"{group['joint_space']:,} assignments, searched exactly per record (limit {MAX_JOINT_SPACE:,})")
    for w in report.warnings:
        say(f"warning [{w.kind}]: {w.message}")
    say(f"{len(report.warnings)} warning{'s' * (len(report.warnings) != 1)}")


def _fields_table(report: SchemaReport, *, wide: bool) -> Table:
    """One row per field; ``wide`` adds the wave and decision-point columns (``--json`` has every value)."""
    table = Table(box=box.SIMPLE_HEAD, padding=0, pad_edge=False, title="fields", title_justify="left")
    columns = ["field", "type", "labels", "trunk", "forest", "colliding", "prefixes", "deepest"]
    if wide:
        columns[2:2] = ["wave"]
        columns.insert(columns.index("colliding"), "decisions")
    widths = {"field": 14, "type": 7, "trunk": 12}  # the rest are numbers
    for col in columns:
        table.add_column(col, justify="left" if col in widths else "right", overflow="fold", min_width=widths.get(col))
    options = {name for d in report.declared if d.type == "multi" for name in d.decisions}
    for f in report.fields:
        tail = ("…|" if len(f.trunk_pieces) > TRUNK_TAIL else "") + _path(f.trunk_pieces[-TRUNK_TAIL:])
        cells = {"field": Text(_show(f.name)), "type": "option" if f.name in options else f.type, "wave": str(f.wave), "labels": str(len(f.labels)),
                 "trunk": Text(f"{len(f.trunk_ids)}: {tail}"), "forest": str(f.forest_tokens),
                 "decisions": str(f.decision_points), "colliding": str(sum(len(c.labels) for c in f.collisions)),
                 "prefixes": str(len(f.prefixes)), "deepest": str(f.deepest)}
        table.add_row(*(cells[col] for col in columns))
    return table


def _declared_table(report: SchemaReport) -> Table:
    """One row per field as declared: its type, its values (options) and the decisions it is read as."""
    table = Table(box=box.SIMPLE_HEAD, padding=0, pad_edge=False, title="declared fields", title_justify="left")
    for col in ("field", "type", "values", "decisions"):
        table.add_column(col, overflow="fold", justify="right" if col == "decisions" else "left")
    for d in report.declared:
        table.add_row(Text(_show(d.name)), d.type + (", nullable" if d.nullable else ""), Text(_values(d)),
                      f"{len(d.decisions)} yes/no" if d.type == "multi" else "1")
    return table


def _values(d) -> str:
    """A declared field's values in words: ``LOW < MEDIUM < HIGH``, ``1..5``, options and their bounds."""
    labels = list(d.labels[:-1] if d.nullable else d.labels)
    if d.none_label is not None:
        labels.remove(d.none_label)
    if d.type == "integer":
        text = f"{d.minimum}..{d.maximum} ({len(labels)} values)"
    elif d.type == "ordinal":
        text = " < ".join(_show(label) for label in labels[:12]) + (f" (+{len(labels) - 12} more)" if len(labels) > 12 else "")
    else:
        text = _names(labels, most=12)
    if d.none_label is not None:
        text += f"; none_label {_show(d.none_label)}"
    if d.nullable:
        text += "; or null"
    if d.type == "multi":
        bounds = [f"P(yes) >= {d.threshold:g}"] + ([f"at least {d.min_items}"] if d.min_items else []) \
            + ([f"at most {d.max_items}"] if d.max_items is not None else [])
        text += f"; an option is chosen at {', '.join(bounds)}"
    return text


def _numbers_line(d) -> str:
    """How an integer field's values tokenize, in words (``inspect.NumberReport``)."""
    n = d.numbers
    low, high = n.digit_tokens
    per = f"{low} digit token{'s' * (low != 1)}" if low == high else f"{low} to {high} digit tokens"
    exact = ("exact: every value has its own token path to the end of its line and is read until it is identified"
             if n.exact else "NOT exact: some values share a whole path or are not read until identified")
    shared = (f"{n.colliding} share their first digit token with another ({n.first_tokens} distinct first tokens)"
              if n.colliding else "each starts with a digit token of its own")
    prefixes = (f"; {n.line_end} are a prefix of another value, told apart by the token after their digits"
                if n.line_end else "")
    return (f"{_show(d.name)}: {n.values} values {d.minimum}..{d.maximum}, {per} each; {shared}{prefixes}; "
            f"trie depth {n.depth} tokens; {exact}")


def _render_paths(f: FieldReport, console: Console, say) -> None:
    shared = "; ".join(f"{_show(c.piece)!r} starts {len(c.labels)} labels ({_names(c.labels)}; followed {c.depth} "
                       "tokens)" for c in f.collisions)
    prefixes = "; ".join(f"{_show(a)!r} is a prefix of {_show(b)!r}" for a, b in f.prefixes[:PATH_ROWS])
    if len(f.prefixes) > PATH_ROWS:
        prefixes += f"; +{len(f.prefixes) - PATH_ROWS} more prefixes"
    say(f"{_show(f.name)}: " + "; ".join(p for p in (shared, prefixes) if p) + " — pcd follows the branches")
    table = Table(box=box.SIMPLE_HEAD, padding=0, pad_edge=False, title_justify="left",
                  title=f"{_show(f.name)}: token paths after the trunk")
    for col in ("label", "spelling", "path", "identified at", "scored tokens"):
        table.add_column(col, overflow="fold", justify="right" if col in ("identified at", "scored tokens") else "left")
    involved = {label for c in f.collisions for label in c.labels} | {label for pair in f.prefixes for label in pair}
    ordered = sorted(f.labels, key=lambda lab: lab.label not in involved)  # stable: the involved ones first
    for lab in ordered[:PATH_ROWS]:
        for s in lab.spellings:
            table.add_row(Text(_show(lab.label)), Text(_show(s.spelling)), Text(_path(s.pieces)), str(s.identified_at),
                          str(s.scored_tokens))
    console.print(table)
    if len(f.labels) > PATH_ROWS:
        say(f"... {len(f.labels) - PATH_ROWS} more labels (--json lists them all)")
