"""Schema + prompt + tokenizer -> label tries and the token forest each wave feeds.

Rules implemented here (docs/how-it-works.md, "The decoding rules"): lines are tokenized
whole, in context, after the text that precedes them (itself tokenized after a stand-in record, never on its own:
``encode_context``, ``pcd_cli.decoding.seams``), and the seam is moved back where the tokenizer
would merge across it (rule 3); each record's prompt is checked against the compiled tail
(``record_chain``); the layout is probed, not assumed (rule 4); a label is a set of spellings
(rule 5); all spellings of a field form a trie whose trunk is known text and whose branches
are followed until the label is identified (``marginal``) or to the end of the line,
line ending included (``exact``) (rule 6).

Exact-mode definition (issue #2): a spelling's path probability is the product of the
conditional probabilities of its tokens after the trunk, to the end of the line.
Marginal mode stops each path at the first trie node below which only one label remains.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

from ..errors import CompileError, RecordError
from ..schema.model import Schema
from .prompt import INPUT_LABEL, LAYOUTS, Layout, Prompt, build_prompt, common_prefix_len
from .seams import TAIL_PROBES, RecordTail, encode_after, fixed_tail_len, pick_anchor

SCORING_MODES = ("marginal", "exact")


@dataclass(frozen=True)
class Terminal:
    """A scored path end: the label it counts for and the edges leading to it.

    ``edges``: ``(query slot, child slot)`` pairs, root first; the path's log-probability is
    the sum of the log-probabilities read at those places.
    """

    label: int
    edges: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class FieldForest:
    """One field's part of a wave's token forest, in forest-local indices.

    Attributes:
        field_index: index of the field in the schema.
        ids: token ids to feed, parents before children (trunk first).
        depths: position offset of each token after the end of the context (0 = next position).
        paths: forest-local ancestors of each token, itself included (its attention inside the forest).
        query_rows: forest-local tokens whose next-token distribution is read.
        query_ids: token ids read at each query row (the children on scored paths).
        terminals: scored path ends (one per label spelling in exact mode; one per
            identification node in marginal mode).
        lines: ``(label index, complete line text)`` for every spelling (for the trace).
        shared: leading trunk tokens that are the first ``shared`` tokens of the forest before
            it in the wave (same ids, so same positions and ancestors: the context only):
            the decoder feeds them once, with that forest, and this forest's tokens attend to
            them there. The options of a multi field share ``"topics": {"`` this way (issue #38).
    """

    field_index: int
    ids: tuple[int, ...]
    depths: tuple[int, ...]
    paths: tuple[tuple[int, ...], ...]
    query_rows: tuple[int, ...]
    query_ids: tuple[tuple[int, ...], ...]
    terminals: tuple[Terminal, ...]
    lines: tuple[tuple[int, str], ...]
    shared: int = 0

    @property
    def trunk_len(self) -> int:
        """Tokens of known text before the first decision (the fed tokens that are not trie nodes)."""
        return len(self.ids) - len(self.query_rows) + 1


@dataclass(frozen=True)
class WavePlan:
    """What one wave feeds after a given context.

    Attributes:
        context_text: text after the record text up to this wave (template tail, JSON opener,
            answer lines already written).
        context_ids: the stable tokens of ``context_text``: ``encode_context(context_text)``
            cut back so that every scored line tokenizes identically in context.
        forests: one per field of the wave, in schema order.
    """

    context_text: str
    context_ids: tuple[int, ...]
    forests: tuple[FieldForest, ...]

    @property
    def n_tokens(self) -> int:
        """Tokens one record feeds for the forests (trunk tokens shared with the forest before counted once)."""
        return sum(len(f.ids) - f.shared for f in self.forests)


class CompiledSchema:
    """A schema compiled for one tokenizer: prompt, layout and lazily built wave plans.

    Args:
        schema: validated schema.
        tokenizer: backend tokenizer.
        scoring: ``"marginal"`` or ``"exact"``.
        logits_width: the model's logits width (label token ids must be below it).
        layout: ``None`` probes both layouts and keeps the one with the fewest moved seams.
        examples: few-shot examples for the prompt head as ``(input text, label index per
            field)`` (``pcd_cli.decoding.examples.resolve_examples``); rendered in the chosen layout.
        label_orders: ``--permutations``: list the booleans' and enums' allowed values after the
            record in these orders (``prompt.build_prompt``); ``None``: in the system catalog.
        catalog_after: an isolated field's branch (``Schema.isolate_fields``; ``schema`` is then
            that field's ``field_alone``): its catalog is written after the record.

    Raises:
        CompileError: a label needs a token the model has no logit for, or no layout keeps
            the seams between written answer lines stable.
    """

    def __init__(self, schema: Schema, tokenizer, *, scoring: str = "marginal",
                 logits_width: int | None = None, layout: Layout | None = None,
                 examples: tuple[tuple[str, tuple[int, ...]], ...] = (),
                 label_orders: dict[str, tuple[int, ...]] | None = None, catalog_after: bool = False):
        if scoring not in SCORING_MODES:
            raise CompileError(f"--scoring {scoring!r}: expected one of {', '.join(SCORING_MODES)}")
        self.schema = schema
        self.tokenizer = tokenizer
        self.examples = tuple(examples)
        self.label_orders = label_orders
        self.catalog_after = catalog_after
        self.scoring = scoring
        self.logits_width = min(logits_width or tokenizer.vocab_size, tokenizer.vocab_size)
        self._plans: dict[tuple[int, str], WavePlan] = {}
        self._anchors: dict[str, tuple[str, tuple[int, ...]]] = {}  # by tail text (one per probed prompt)
        self._tails: dict[str, RecordTail] = {}
        self.prompt: Prompt
        #: ``seam_moves()`` of each probed layout, by name (the layout probe's evidence; empty
        #: when ``layout`` was given).
        self.layout_moves: dict[str, int] = {}
        if layout is None:  # keep the first layout with the fewest moved seams, with its plans
            best = None
            for candidate in LAYOUTS:
                self.prompt, self._plans = build_prompt(schema, tokenizer, candidate, self.examples, label_orders, catalog_after), {}
                moves = self.seam_moves()
                self.layout_moves[candidate.name] = moves
                if best is None or moves < best[0]:
                    best = (moves, self.prompt, self._plans)
            _, self.prompt, self._plans = best
        else:
            self.prompt = build_prompt(schema, tokenizer, layout, self.examples, label_orders, catalog_after)
        self.wave_plan(0, self.prompt.tail_text)

    @property
    def layout(self) -> Layout:
        return self.prompt.layout

    def written_line(self, field_index: int, label: int) -> str:
        """The answer line written into the context once ``label`` is decided (canonical spelling)."""
        field = self.schema.fields[field_index]
        return self.layout.line(field, field.spellings(label)[0], last=False)

    def written_text(self, labels: dict[int, int]) -> str:
        """The answer lines written into the context once the decisions ``labels`` (decision
        index -> label index, one wave's) are decided, canonical spellings; a multi field's
        options are written together as its one line (``Layout.answer_lines``)."""
        return self.layout.answer_lines(self.schema.fields, labels)

    def seam_moves(self) -> int:
        """Tokens cut from the end of wave contexts over wave 0 and every wave-1 context;
        1000 per written line that would have to be un-fed (the layout is then unusable)."""
        plan0 = self.wave_plan(0, self.prompt.tail_text)
        moves = len(self.encode_context(plan0.context_text)) - len(plan0.context_ids)
        if len(self.schema.waves) > 1:
            first = self.schema.waves[0]
            for label in range(max(len(self.schema.fields[fi].labels) for fi in first)):
                text = plan0.context_text + self.written_text(
                    {fi: min(label, len(self.schema.fields[fi].labels) - 1) for fi in first})
                plan1 = self.wave_plan(1, text)
                moves += len(self.encode_context(text)) - len(plan1.context_ids)
                if plan1.context_ids[: len(plan0.context_ids)] != plan0.context_ids:
                    moves += 1000
        return moves

    def default_plans(self) -> list[WavePlan]:
        """One plan per wave, after label 0 of every earlier field (for estimates and reports)."""
        text = self.prompt.tail_text
        plans = [self.wave_plan(0, text)]
        for w in range(1, len(self.schema.waves)):
            text += self.written_text({fi: 0 for fi in self.schema.waves[w - 1]})
            plans.append(self.wave_plan(w, text))
        return plans

    def wave_plan(self, wave: int, context_text: str) -> WavePlan:
        """The plan for ``wave`` after ``context_text`` (cached per context)."""
        key = (wave, context_text)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._build_plan(wave, context_text)
            self._plans[key] = plan
        return plan

    @property
    def anchor(self) -> tuple[str, tuple[int, ...]]:
        """``(text, ids)`` standing where a record ends, for ``encode_context`` (``seams.pick_anchor``)."""
        key = self.prompt.tail_text
        anchor = self._anchors.get(key)
        if anchor is None:
            anchor = self._anchors[key] = pick_anchor(self.tokenizer, self.prompt.head_text, key, INPUT_LABEL)
        return anchor

    def encode_context(self, text: str) -> list[int]:
        """Tokens of ``text`` (text after a record: the prompt's tail, answer lines) as it
        tokenizes after a record, never on its own (``seams`` rule 1: SentencePiece-style
        tokenizers give a text that starts a string a ``▁`` it lacks inside the prompt)."""
        anchor, anchor_ids = self.anchor
        return encode_after(self.tokenizer, anchor, anchor_ids, text)

    @property
    def record_tail(self) -> RecordTail:
        """Where each record's tokens end and the compiled tail begins (``seams`` rule 2)."""
        key = self.prompt.tail_text
        tail = self._tails.get(key)
        if tail is None:
            tail_ids = tuple(self.encode_context(key))
            refed = len(tail_ids) - len(self.wave_plan(0, key).context_ids)
            afters = []
            for probe in TAIL_PROBES:
                try:
                    afters.append(self.prompt.record_ids(probe, probe)[1])
                except RecordError:  # refused at the head: inspect-schema reports it
                    continue
            tail = self._tails[key] = RecordTail(tail_ids=tail_ids, refed=refed,
                                                 fixed=fixed_tail_len(tail_ids, afters))
        return tail

    def record_chain(self, record_id: object, text: str) -> tuple[str, list[int]]:
        """One record's full prompt text and its wave-0 chain: its tokens after the head up to
        the first wave's forests, the tail tokens it merges with included.

        Raises:
            RecordError: a seam breaks (head or fixed tail) or its special-token text cannot be
                tokenized as text exactly (``Prompt.record_ids``, ``seams.RecordTail.chain``).
        """
        full, after = self.prompt.record_ids(record_id, text)
        return full, self.record_tail.chain(record_id, after)

    def _build_plan(self, wave: int, context_text: str) -> WavePlan:
        encode = self.encode_context
        base = encode(context_text)
        n_fields = len(self.schema.fields)
        rows: dict[int, list[tuple[int, str, list[int]]]] = {}
        k = len(base)
        for fi in self.schema.waves[wave]:
            field = self.schema.fields[fi]
            spelled = []
            for label in range(len(field.labels)):
                for spelling in field.spellings(label):
                    line = self.layout.line(field, spelling, last=fi == n_fields - 1)
                    ids = encode(context_text + line)
                    k = min(k, common_prefix_len(base, ids))
                    spelled.append((label, line, ids))
            rows[fi] = spelled
        while k > 0 and any(_lcp_all([ids[k:] for _, _, ids in spelled]) == 0 for spelled in rows.values()):
            k -= 1  # a field's lines differ at their first token: re-feed the last context token as its trunk
        forests = [self._forest(fi, [(label, line, ids[k:]) for label, line, ids in rows[fi]])
                   for fi in self.schema.waves[wave]]
        for i in range(1, len(forests)):  # trunk tokens equal to the previous forest's are fed once
            before, forest = forests[i - 1], forests[i]
            shared = min(common_prefix_len(before.ids, forest.ids), before.trunk_len, forest.trunk_len)
            forests[i] = replace(forest, shared=shared)
        return WavePlan(context_text=context_text, context_ids=tuple(base[:k]), forests=tuple(forests))

    def _forest(self, fi: int, spelled: list[tuple[int, str, list[int]]]) -> FieldForest:
        field = self.schema.fields[fi]
        for label, line, ids in spelled:
            bad = [t for t in ids if not 0 <= t < self.logits_width]
            if bad:
                raise CompileError(f"field {field.name!r}, label {field.labels[label]!r}: token id {bad[0]} is "
                                   f"outside the model's {self.logits_width} logits")
        suffixes = [ids for _, _, ids in spelled]
        trunk_len = min(_lcp_all(suffixes), min(len(s) for s in suffixes) - 1)
        if trunk_len < 1:
            raise CompileError(f"field {field.name!r}: its lines share no token after the context "
                               "(the layout's seam is unstable for this tokenizer)")
        trunk = suffixes[0][:trunk_len]
        # Trie over the parts after the trunk. Node 0 is the root (the trunk's last token).
        parent, token, depth, labels, children = [-1], [trunk[-1]], [0], [set()], [{}]
        ends: list[int] = []
        for label, _, ids in spelled:
            node = 0
            labels[0].add(label)
            for t in ids[trunk_len:]:
                nxt = children[node].get(t)
                if nxt is None:
                    nxt = len(parent)
                    parent.append(node), token.append(t), depth.append(depth[node] + 1)
                    labels.append(set()), children.append({})
                    children[node][t] = nxt
                node = nxt
                labels[node].add(label)
            ends.append(node)
        owner: dict[int, int] = {}
        for (label, _, _), end in zip(spelled, ends):
            if owner.setdefault(end, label) != label:
                raise CompileError(f"field {field.name!r}: labels {field.labels[owner[end]]!r} and "
                                   f"{field.labels[label]!r} have the very same tokens with this tokenizer, so the "
                                   "model cannot tell them apart; rename one (pcd inspect-schema shows the tokens)")
        # Terminal of each spelling: its line end (exact) or where its label is identified (marginal).
        terminal_nodes: dict[tuple[int, int], None] = {}
        for (label, _, _), end in zip(spelled, ends):
            node = end
            if self.scoring == "marginal":
                chain = _ancestors(parent, end)  # root excluded, root-side first
                node = next((n for n in chain if labels[n] == {label}), end)
            terminal_nodes[(node, label)] = None
        fed: set[int] = set()
        for node, _ in terminal_nodes:
            fed.update(_ancestors(parent, node)[:-1])
        order = [n for n in _bfs(children) if n in fed]
        local = {0: trunk_len - 1}
        for i, n in enumerate(order):
            local[n] = trunk_len + i
        ids_out = list(trunk) + [token[n] for n in order]
        depths = list(range(trunk_len)) + [trunk_len - 1 + depth[n] for n in order]
        trunk_path = tuple(range(trunk_len))
        paths = [tuple(range(i + 1)) for i in range(trunk_len)]
        for n in order:
            paths.append(trunk_path + tuple(local[a] for a in _ancestors(parent, n)))
        query_nodes = [0] + order
        query_children: dict[int, list[int]] = {n: [] for n in query_nodes}
        slot: dict[int, tuple[int, int]] = {}
        query_index = {n: i for i, n in enumerate(query_nodes)}
        for node, _ in terminal_nodes:
            for n in _ancestors(parent, node):
                if n not in slot:
                    kids = query_children[parent[n]]
                    slot[n] = (query_index[parent[n]], len(kids))
                    kids.append(token[n])
        terminals = tuple(Terminal(label=label, edges=tuple(slot[n] for n in _ancestors(parent, node)))
                          for node, label in terminal_nodes)
        return FieldForest(field_index=fi, ids=tuple(ids_out), depths=tuple(depths), paths=tuple(paths),
                           query_rows=tuple(local[n] for n in query_nodes),
                           query_ids=tuple(tuple(query_children[n]) for n in query_nodes),
                           terminals=terminals, lines=tuple((label, line) for label, line, _ in spelled))


def _lcp_all(seqs: list[list[int]]) -> int:
    first = seqs[0]
    return min((common_prefix_len(first, s) for s in seqs[1:]), default=len(first))


def _ancestors(parent: list[int], node: int) -> list[int]:
    """Nodes from the root's child down to ``node`` (root excluded)."""
    chain = []
    while node > 0:
        chain.append(node)
        node = parent[node]
    return chain[::-1]


def _bfs(children: list[dict]) -> list[int]:
    out, queue = [], deque([0])
    while queue:
        n = queue.popleft()
        out.append(n)
        queue.extend(children[n].values())
    return out
