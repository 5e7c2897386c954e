"""``pcd serve --label-studio``: the server as a Label Studio ML backend that pre-labels tasks,
journals every annotation as gold, retrains in the background and swaps the better model in.

What Label Studio 1.23.2 sends (its ML client ``label_studio/ml/api_connector.py``, ``MLApi``, whose
timeouts are ``ML_TIMEOUT_HEALTH`` 1 s, ``ML_TIMEOUT_SETUP`` 3 s, ``ML_TIMEOUT_PREDICT`` 100 s; the
reference backend HumanSignal/label-studio-ml-backend ``label_studio_ml/api.py``):

* ``GET /health`` before a batch prediction (``MLApi.health``): answered by the server's own
  ``/health`` (no model work; any 200 JSON is "connected", ``ml/models.py`` ``update_state``).
* ``POST /setup`` (``MLApi.setup``): ``{"project": "<id>.<created unix>", "schema": <label config
  XML>, "hostname", "access_token", "extra_params"}``, answered ``{"model_version"}``. Here the
  config's ``<Choices>`` controls are mapped to a served schema (``map_config``).
* ``POST /predict`` (``MLApi.make_predictions``): ``{"tasks": [...], "project", "label_config",
  "params"}``, all selected tasks in one POST, answered ``{"results": [...]}`` with one
  prediction per task, in order (``MLBackend._get_predictions_from_ml_backend`` falls back to
  one task per call on a wrong count): ``{"result": [...], "score", "model_version"}``.
* ``POST /webhook``: the webhook Label Studio creates for the backend when it is added
  (``ml/models.py`` ``create_ml_webhook``: every action, with payload) sends ``{"action": ACTION,
  ...}`` for ``ANNOTATION_CREATED``/``ANNOTATION_UPDATED`` (``annotation``, ``task``,
  ``project``), ``ANNOTATIONS_CREATED`` (lists), ``ANNOTATIONS_DELETED`` (``annotations``),
  ``TASKS_DELETED`` (``tasks``: ids only; the tasks' annotations go without an
  ``ANNOTATIONS_DELETED``) and ``PROJECT_DELETED`` (``webhooks/models.py`` ``WebhookAction``), with
  ``WEBHOOK_TIMEOUT`` 1 s, and without Redis the annotator's save waits on it: the journal append
  is the only work done before answering (an append that fails is answered 503 naming the file:
  ``state_unwritable``).
  ``MLApi.train`` sends ``START_TRAINING`` there too (``{"action", "project"}``) when the flag
  ``ff_back_dev_1417_start_training_mlbackend_webhooks_250122_long`` is on (it is in 1.23.2).
* ``POST /train`` (older Label Studio, ``MLApi.train``): ``{"annotations": [tasks with their
  annotations], "project", "label_config"}``.
* ``GET /versions`` (``MLApi.get_versions``): the model versions (``{"versions": [...]}``) with each
  one's holdout figures.

Learning (``Retrainer``): ``START_TRAINING``, ``/train`` or every ``retrain_every`` new gold rows
start one background job per schema (a trigger while one runs is answered ``busy``). The job
writes the schema's journals as one Label Studio export, runs ``pcd calibrate``
(``calibrate_on_gold``) under ``tune_from_rows`` gold rows and ``pcd tune`` (``tune_on_gold``)
from there on, and reads the figures the fit did not train on (calibrate: the cross-validated
before/after; tune: its holdout before training (epoch 0) and at the kept epoch). Only when the
new model is **not worse** (``not_worse``: mean holdout accuracy not lower and mean holdout NLL not
higher) is it swapped in (``LabelService.replace_labeler``: between decode calls; requests already
queued finish on the old model). Every run, kept or not, is a line of the schema's version
history; the projects mapped to the schema get the new ``model_version`` through Label Studio's
API (``patch_model_version``, with the token ``/setup`` gave).

State on disk (``state_dir``): ``projects/<id>/gold.jsonl`` (``GoldJournal``),
``projects/<id>/link.json`` (the mapping, without the token), ``schemas/<name>/versions.json``,
``schemas/<name>/<version>/`` (the fitted calibration or adapter) and
``schemas/<name>/labelled-rows.npz`` (``LABELLED_ROWS``: the gold rows a calibrate retrain
labelled, with their raw probabilities and readout features, so the next one decodes only new
rows; ``pcd_cli.quality.labelled_rows``).

A calibrate retrain fits the readout the served calibration has (``retrain.served_readout``: a
linear readout, ``pcd calibrate --readout linear``, is fitted again on the new gold) and its
decision rules (``retrain.served_objective``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import threading
import time
import urllib.error
import weakref
import urllib.request
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable
from xml.etree import ElementTree

from ..io.gold_journal import JOURNAL_NAME, GoldJournal
from ..retrain import (TUNE_FROM_ROWS, Fitted, Version, VersionHistory, adapter_bytes, changed_options,
                       fit_on_gold, fitted_bytes, not_worse, now, version_name)
from ..errors import InputError, MachineError
from ..io.files import machine_error
from ..io.annotations import label_studio_rows
from ..tune import MIN_CALIBRATION_ROWS
from ..backends.memory import release_memory
from .service_errors import BadRequest, JournalUnwritable, NotReady, UnknownProject

log = logging.getLogger("pcd.server")

#: Webhook actions that carry annotations (Label Studio's ``webhooks.models.WebhookAction``).
ANNOTATION_ACTIONS = ("ANNOTATION_CREATED", "ANNOTATION_UPDATED", "ANNOTATIONS_CREATED")
#: Webhook actions that take annotations out of the gold: ``ANNOTATIONS_DELETED`` (their ids),
#: ``TASKS_DELETED`` (the tasks' ids: Label Studio deletes their annotations without sending
#: ``ANNOTATIONS_DELETED``) and ``PROJECT_DELETED`` (everything of the project).
DELETE_ACTIONS = ("ANNOTATIONS_DELETED", "TASKS_DELETED", "PROJECT_DELETED")
#: A schema's store of labelled gold rows (``pcd_cli.quality.labelled_rows``), in ``schemas/<name>/``.
LABELLED_ROWS = "labelled-rows.npz"
#: Seconds to wait on Label Studio's API when telling it the new model version.
API_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class LabelStudioConfig:
    """Settings of ``pcd serve --label-studio``.

    Attributes:
        state_dir: folder of the journals, links and version histories (``--state-dir``).
        label_studio_url: Label Studio's base URL for its API (``--label-studio-url``); ``None``:
            the ``hostname`` each project's ``/setup`` gave.
        retrain_every: start a retrain after this many new gold rows of a schema
            (``--retrain-every``); 0: only on ``START_TRAINING`` and ``/train``.
        tune_from_rows: gold rows from which a retrain tunes rather than calibrates.
        min_gold_rows: gold rows each mapped field needs before a retrain runs (fewer: the run
            is not started and ``/versions`` says which field has how many); default
            ``pcd_cli.tune.MIN_CALIBRATION_ROWS``, the floor under which ``pcd tune`` leaves a
            field uncalibrated.
    """

    state_dir: str
    label_studio_url: str | None = None
    retrain_every: int = 0
    tune_from_rows: int = TUNE_FROM_ROWS
    min_gold_rows: int = MIN_CALIBRATION_ROWS


# -- the label config ------------------------------------------------------------------------------
#: Object tags pcd cannot read as Label Studio means them (tag -> why, and what to do instead):
#: their value is not one plain text of the task. Refused at ``/setup`` (``map_config``).
REFUSED_OBJECTS = {
    "HyperText": "its value is HTML markup, which pcd would read as raw tags and text; give the plain text to a "
                 "<Text> object",
    "Paragraphs": "its value is a list of dialogue turns, not one text; join them into one string for a <Text> "
                  "object",
}


@dataclass(frozen=True)
class Control:
    """One ``<Choices>`` control of a Label Studio config: its ``name``, the object it labels
    (``toName``), its options as Label Studio writes them in results (``choices``: each
    ``<Choice>``'s ``alias`` when it has one, else its ``value``; Label Studio's Choice tag:
    "the alias replaces the choice value in the annotation results") and their ``values``,
    whether several may be chosen, and what pcd cannot serve: ``per_region`` (``perRegion="true"``:
    one answer per region another control marks) and ``dynamic`` (``value="$key"``: choices
    read from each task's data)."""

    name: str
    to_name: str
    choices: tuple[str, ...]
    multiple: bool
    values: tuple[str, ...] = ()
    per_region: bool = False
    dynamic: str | None = None


@dataclass(frozen=True)
class TextObject:
    """One object tag of a config (``<Text>``, ``<HyperText>``, ``<Image>`` ...): its ``tag``, its
    ``value`` attribute (``$text`` -> data key ``text``; ``None`` when not a ``$`` variable) and
    ``value_type`` (``valueType``, ``<Text>``'s ``text`` or ``url``)."""

    tag: str
    var: str | None
    value_type: str = "text"


@dataclass(frozen=True)
class ConfigMapping:
    """A project's config mapped to a served schema.

    Attributes:
        schema: the served schema's name.
        fields: control name -> the schema field it answers.
        to_name: the ``<Text>`` object the controls label; ``text_var``: its data key (``$text``
            -> ``text``).
        choices: control name -> {the field's label -> what Label Studio writes for it}, for the
            labels a ``<Choice alias>`` renames (an empty map: every choice is written as the
            label). Predictions write the right side; annotations are read back through it.
    """

    schema: str
    fields: dict[str, str]
    to_name: str
    text_var: str
    choices: dict = field(default_factory=dict)

    def written(self, control: str, label: str) -> str:
        """What Label Studio writes in a result of ``control`` for the field's ``label``."""
        return self.choices.get(control, {}).get(label, label)

    def label_of(self, control: str, written: object) -> object:
        """The field's label for what Label Studio wrote in a result of ``control`` (unknown
        values come back unchanged, for the gold reader to report)."""
        back = {w: label for label, w in self.choices.get(control, {}).items()}
        return back.get(written, written) if isinstance(written, str) else written


class MappingError(BadRequest):
    """A config that cannot be mapped to a served schema (the message names what does not map)."""

    code = "label_config_not_mapped"


def parse_config(xml: str) -> tuple[list[Control], dict[str, TextObject]]:
    """The ``<Choices>`` controls of a Label Studio labeling config and its object tags (every
    element with a ``name`` and a ``value`` that is not a control: name -> ``TextObject``).

    Raises:
        MappingError: not XML.
    """
    try:
        root = ElementTree.fromstring(xml)
    except ElementTree.ParseError as exc:
        raise MappingError(f"the label config is not XML ({exc})") from None
    controls = []
    for el in root.iter("Choices"):
        options = [c for c in el.iter("Choice")]
        values = tuple(c.get("value") or c.get("alias") or "" for c in options)
        written = tuple(c.get("alias") or c.get("value") or "" for c in options)
        dynamic = el.get("value") if (el.get("value") or "").startswith("$") else None
        controls.append(Control(el.get("name", ""), el.get("toName", ""), written,
                                el.get("choice", "single") == "multiple", values,
                                (el.get("perRegion") or "").lower() == "true", dynamic))
    objects = {}
    for el in root.iter():
        if el.tag in ("Choices", "Choice", "Header", "View", "Style") or "name" not in el.attrib \
                or "value" not in el.attrib or "toName" in el.attrib:
            continue
        value = el.get("value") or ""
        objects[el.get("name", "")] = TextObject(el.tag, value[1:] if value.startswith("$") and len(value) > 1 else None,
                                                 (el.get("valueType") or "text").lower())
    return controls, objects


def _unservable(control: Control) -> str | None:
    """Why pcd cannot answer ``control`` as Label Studio means it (``None``: it can)."""
    if control.per_region:
        return (f"<Choices name={control.name!r} perRegion=\"true\"> answers per region that another control marks; "
                "pcd answers one set of choices per task and cannot give a region id: remove perRegion")
    if control.dynamic:
        return (f"<Choices name={control.name!r} value={control.dynamic!r}> reads its choices from each task's data; "
                "pcd answers a schema's fixed labels: list them as <Choice> tags")
    return None


def _object_problem(to_name: str, obj: TextObject | None) -> str | None:
    """Why the object the controls label is not one plain text pcd can read (``None``: it is)."""
    if obj is None:
        return f"the <Choices> controls label {to_name!r}, which is no object of the config"
    if obj.tag in REFUSED_OBJECTS:
        return f"the <Choices> controls label <{obj.tag} name={to_name!r}>: {REFUSED_OBJECTS[obj.tag]}"
    if obj.tag != "Text":
        return f"the <Choices> controls label <{obj.tag} name={to_name!r}>; pcd labels text: a <Text value=\"$key\"> object"
    if obj.value_type != "text":
        return (f"<Text name={to_name!r} valueType={obj.value_type!r}>: the task holds a link to the text, and pcd "
                "labels the task's text itself, never what a URL points to: put the text in the task (valueType "
                "\"text\", the default)")
    if obj.var is None:
        return f"<Text name={to_name!r}> has no value=\"$key\" naming the task's text"
    return None


def map_config(xml: str, schemas: dict) -> ConfigMapping:
    """Map a config's ``<Choices>`` controls to one served schema's fields.

    A control maps to a field of the same name with the same labels (the config ``pcd review``
    writes); else to the one field whose labels are the control's choices (a config written by
    hand). A control's choices are what Label Studio writes in results: a ``<Choice>``'s
    ``alias`` when it has one, else its ``value``; a control whose aliases are not the field's
    labels maps by its values (``value="NEGATIVE" alias="neg"``), and predictions then write the
    aliases and annotations are read back through them (``ConfigMapping.choices``). A schema
    serves the config when every control maps to a distinct field of it; exactly one schema
    must. Booleans are the choices ``true``/``false``, a multi-select field a
    ``choice="multiple"`` control. Controls other than ``<Choices>`` (``<TextArea>``,
    ``<Labels>`` ...) get no prediction; they stay the annotators'.

    Args:
        schemas: name -> ``Schema`` (``service.named``' schemas).

    Raises:
        MappingError: no ``<Choices>``; a ``<Choices>`` pcd cannot serve (``perRegion``, dynamic
            ``value="$key"`` choices); controls labelling different objects; an object that is
            not one plain text (``<HyperText>``, ``<Paragraphs>``, ``<Text valueType="url">``,
            an image ...: ``_object_problem``, naming the tag and attribute); no schema, or more
            than one, serving every control (names the controls that map nowhere, or the schemas).
    """
    controls, objects = parse_config(xml)
    if not controls:
        raise MappingError("the label config has no <Choices> control; pcd answers classification configs "
                           "(pcd review --to label-studio writes one)")
    for control in controls:
        problem = _unservable(control)
        if problem:
            raise MappingError(problem)
    targets = {c.to_name for c in controls}
    if len(targets) != 1:
        raise MappingError(f"the <Choices> controls label several objects ({', '.join(sorted(targets))}); pcd "
                           "labels one text per task")
    to_name = targets.pop()
    problem = _object_problem(to_name, objects.get(to_name))
    if problem:
        raise MappingError(problem)
    fits, misses = {}, {}
    for name, schema in schemas.items():
        fields, renamed, missing = {}, {}, []
        for control in controls:
            found = _field_for(control, schema, taken=set(fields.values()))
            if found is None:
                missing.append(control.name)
            else:
                fields[control.name] = found[0]
                if found[1]:
                    renamed[control.name] = found[1]
        (misses if missing else fits)[name] = missing or (fields, renamed)
    if len(fits) == 1:
        name, (fields, renamed) = fits.popitem()
        return ConfigMapping(name, fields, to_name, objects[to_name].var, renamed)
    if len(fits) > 1:
        raise MappingError(f"the label config fits several served schemas ({', '.join(sorted(fits))}); name the "
                           "<Choices> controls after one schema's fields")
    detail = "; ".join(f"schema {n!r}: no field for control{'s' if len(m) > 1 else ''} {', '.join(map(repr, m))}"
                       for n, m in sorted(misses.items()))
    raise MappingError("no served schema has a field with each <Choices> control's options (" + (detail or "no "
                       "schema served") + "); write the config with pcd review --to label-studio")


def _field_for(control: Control, schema, taken: set[str]) -> tuple[str, dict] | None:
    """The field ``control`` answers and {label: what Label Studio writes} for the labels an
    alias renames; matched by what Label Studio writes first, then by the ``<Choice value>``s."""
    for options in (control.choices, control.values):
        written = dict(zip(options, control.choices))
        fields = [f for f in schema.declared if f.name not in taken and (f.type == "multi") == control.multiple
                  and {str(l) for l in f.labels} == set(written)]
        named = [f for f in fields if f.name == control.name]
        pick = named[0] if named else (fields[0] if len(fields) == 1 else None)
        if pick is not None:
            return pick.name, {str(l): written[str(l)] for l in pick.labels if written[str(l)] != str(l)}
    return None


# -- the backend ------------------------------------------------------------------------------------
@dataclass
class ProjectLink:
    """A Label Studio project known from ``/setup``: its id, mapping, and (in memory only) the
    ``hostname`` and ``access_token`` Label Studio sent."""

    project: str
    mapping: ConfigMapping
    hostname: str = ""
    access_token: str = ""


class LabelStudioBackend:
    """What ``pcd serve --label-studio`` keeps and does behind its routes
    (``formats/label_studio.py``): project links, the gold journals, retraining and versions.

    Args:
        service: the running ``LabelService``; its startup schemas (``service.named``) are what
            projects map to.
        config: ``LabelStudioConfig``.
        fit: the trainer, ``fit_on_gold(method, gold, schema, job, out, store=path) -> Fitted``
            (``store``: the schema's ``LABELLED_ROWS`` file; tests pass a fake trainer).
        build_labeler: ``(schema, job, own_model) -> labeler`` for a fitted job; default: over
            the service's loaded model (``service.host.labeler``), or a model of its own
            (``pcd_cli.api.build_labeler``) for a tuned one.
        patch_project: ``(base_url, token, project_id, version) -> str`` telling Label Studio the
            new version (default: ``patch_model_version``).
    """

    def __init__(self, service, config: LabelStudioConfig, *, fit: Callable[..., Fitted] = fit_on_gold,
                 build_labeler: Callable | None = None, patch_project: Callable | None = None):
        self.service = service
        self.config = config
        self.state = Path(config.state_dir).expanduser()
        self.fit = fit
        self.build = build_labeler or self._build_labeler
        self.patch_project = patch_project or patch_model_version
        self.links: dict[str, ProjectLink] = {}
        #: when a list, every request body is appended to it as ``(path, body)`` (recording what
        #: a real Label Studio sends: tests/server/test_label_studio_live.py)
        self.recorded: list | None = None
        self._lock = threading.Lock()
        self._training: dict[str, threading.Thread] = {}
        self._rows_at_last_run: dict[str, int] = {}
        #: schema -> why its last training trigger did not start a run (``missing_gold``)
        self.refusals: dict[str, str] = {}
        self.histories: dict[str, VersionHistory] = {}
        #: labeler -> the version it is, set before it is swapped in (weak keys: a labeler swapped
        #: out is freed, and never mistaken for a new one); the base model's are not in it (``version_of``)
        self._versions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._base: dict[str, str] = {}
        for name, entry in service.named.items():
            base = version_name(entry.options.model or "embedded", adapter_bytes(entry.options))
            self._base[name] = base
            path = self.state / "schemas" / name / "versions.json"
            try:
                self.histories[name] = VersionHistory(path, base)
            except OSError as exc:  # exit 2 naming the state folder, never "cannot listen there"
                detail = exc if isinstance(exc, MachineError) else machine_error(exc, path, "cannot write")
                raise InputError(f"--state-dir: the version history {detail}; give a folder pcd can write in") from None
        for link_file in sorted((self.state / "projects").glob("*/link.json")):
            try:
                saved = json.loads(link_file.read_text(encoding="utf-8"))
                mapping = ConfigMapping(**saved["mapping"])
                if mapping.schema in service.named:
                    self.links[saved["project"]] = ProjectLink(saved["project"], mapping)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("label studio link %s unreadable (%s); skipped", link_file, exc)

    # -- what the routes ask (formats/label_studio.py) ------------------------------------------
    async def setup(self, project: str, mapping: ConfigMapping, hostname: str, token: str) -> str:
        """Remember ``project`` as mapped by ``mapping`` (its token in memory only; the mapping
        saved when it changed); returns the schema's current version.

        Raises:
            NotReady: while the model loads or the versions served before the last stop are
                restored (the version answered would not be the one served).
            JournalUnwritable: the project's link cannot be saved.
        """
        if not self.service.ready.is_set():
            raise NotReady("the model is still loading (or its last served version being restored); retry when "
                           "GET /ready answers 200")
        link = ProjectLink(project, mapping, hostname, token)
        with self._lock:
            changed = project not in self.links or self.links[project].mapping != mapping
            self.links[project] = link
        if changed:
            try:
                await asyncio.to_thread(self._save_link, link)
            except OSError as exc:
                raise state_unwritable(str(machine_error(exc, None, f"cannot write project {project}'s link"))) from None
            log.info("label studio project %s mapped to schema %s (%s)", project, mapping.schema,
                     ", ".join(f"{c}->{f}" for c, f in mapping.fields.items()))
        return self.histories[mapping.schema].current

    def _save_link(self, link: ProjectLink) -> None:
        from ..io.files import write_atomic

        path = self.state / "projects" / link.project / "link.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"project": link.project, "mapping": asdict(link.mapping)}).encode())

    def link(self, project: str | None, label_config: object = None) -> ProjectLink:
        """The project's link: known from ``/setup``, or made from ``label_config`` (the label
        config XML a body carries).

        Raises:
            UnknownProject: when neither is there; MappingError: when the config does not map.
        """
        link = self.links.get(project) if project is not None else None
        if link is None:
            if not isinstance(label_config, str):
                raise UnknownProject(f"project {project!r} has not called /setup and the body carries no label_config")
            link = ProjectLink(project or "?", map_config(label_config, {n: e.schema for n, e in self.service.named.items()}))
            if project is not None:
                self.links[project] = link
        return link

    def versions(self) -> dict:
        """``{"versions": [the accepted version names, oldest first], "schemas": {name: {"current",
        "history": [Version...]}}}``."""
        out = {name: {"current": h.current, "history": [asdict(v) for v in h.items]}
               for name, h in self.histories.items()}
        accepted = list(dict.fromkeys(v.version for h in self.histories.values() for v in h.items if v.accepted))
        return {"versions": accepted, "schemas": out}

    # -- the journal ----------------------------------------------------------------------------
    def journal(self, project: str) -> GoldJournal:
        """The project's ``GoldJournal`` (``<state_dir>/projects/<id>/gold.jsonl``)."""
        return GoldJournal(self.state / "projects" / project / JOURNAL_NAME)

    def journal_event(self, project: str, action: str, body: dict) -> tuple[int, list[dict]]:
        """Append one webhook's event to the project's journal: its annotations
        (``ANNOTATION_ACTIONS``) or what a ``DELETE_ACTIONS`` deletes. ``PROJECT_DELETED`` also
        forgets the project's link.

        Returns:
            ``(events written, not kept)``: ``not_kept`` lists ``{"annotation", "reason"}`` for each
            annotation that could not be journalled (no task with ``id`` and a ``data`` object
            beside it), so the answer says so rather than dropping it silently.

        Raises:
            JournalUnwritable: (``state_unwritable``) when the journal cannot be written: the event
                is not kept and the answer says where and why.
        """
        try:
            return self._journal_event(project, action, body)
        except MachineError as exc:
            raise state_unwritable(str(exc)) from None

    def _journal_event(self, project: str, action: str, body: dict) -> tuple[int, list[dict]]:
        journal = self.journal(project)
        if action == "ANNOTATIONS_DELETED":
            ids = [a.get("id") if isinstance(a, dict) else a for a in _as_list(body.get("annotations"))]
            for aid in ids:
                journal.append_delete(aid)
            return len(ids), []
        if action == "TASKS_DELETED":
            ids = [t.get("id") if isinstance(t, dict) else t for t in _as_list(body.get("tasks"))]
            ids = [t for t in ids if t is not None]
            if ids:
                journal.append_task_delete(ids)
            return len(ids), []
        if action == "PROJECT_DELETED":
            journal.append_project_delete()
            with self._lock:
                self.links.pop(project, None)
            (self.state / "projects" / project / "link.json").unlink(missing_ok=True)
            return 1, []
        annotations = _as_list(body.get("annotation", body.get("annotations")))
        tasks = {t.get("id"): t for t in _as_list(body.get("task", body.get("tasks"))) if isinstance(t, dict)}
        n, not_kept = 0, []
        for a in annotations:
            aid = a.get("id") if isinstance(a, dict) else None
            tid = a.get("task") if isinstance(a, dict) else None
            task = tasks.get(tid) or (next(iter(tasks.values())) if len(tasks) == 1 else None)
            try:
                if task is None:
                    raise ValueError(f"its task{f' {tid!r}' if tid is not None else ''} is not in the body")
                journal.append_annotation(task, a)
                n += 1
            except ValueError as exc:
                not_kept.append({"annotation": aid, "reason": str(exc)})
                log.warning("label studio project %s: %s annotation %s not journalled: %s", project, action, aid, exc)
        return n, not_kept

    def journal_tasks(self, project: str, tasks: list) -> int:
        """Append every annotation of ``tasks`` (``/train``'s body) to the project's journal.

        Raises:
            JournalUnwritable: when the journal cannot be written.
        """
        journal = self.journal(project)
        n = 0
        try:
            for task in tasks:
                if isinstance(task, dict):
                    for a in task.get("annotations") or []:
                        journal.append_annotation(task, a)
                        n += 1
        except MachineError as exc:
            raise state_unwritable(str(exc), kept=n) from None
        return n

    def gold_tasks(self, schema: str) -> list[dict]:
        """The journals of the projects mapped to ``schema`` as one Label Studio export in the
        schema's terms, through each project's mapping (the one ``/setup`` made): a result of a
        mapped control is named after its field and its choices are the field's labels
        (``ConfigMapping.label_of``: an alias read back); results of other controls are left
        out. Each task's ``data`` gets the record text under ``text`` (from the config's text
        variable) and ``ls-<project>-<task id>`` under ``id`` when it has none."""
        job = self.service.named[schema].options
        tasks = []
        for p, link in list(self.links.items()):
            if link.mapping.schema != schema:
                continue
            mapping = link.mapping
            for task in self.journal(p).tasks():
                data = dict(task["data"])
                data.setdefault(job.id_field or "id", f"ls-{p}-{task['id']}")
                if mapping.text_var in data:
                    data[GOLD_TEXT] = data[mapping.text_var]
                annotations = [{**a, "result": _in_schema_terms(a.get("result"), mapping)}
                               for a in task["annotations"] if isinstance(a, dict)]
                tasks.append({**task, "data": data, "annotations": annotations})
        return tasks

    def missing_gold(self, schema: str, tasks: list[dict]) -> str | None:
        """What the gold ``tasks`` (``gold_tasks``) lack for a retrain of ``schema``: each mapped
        field needs ``min_gold_rows`` rows whose answer is one of its labels (a calibration or
        tune judged on fewer is noise: ``pcd tune`` leaves such a field uncalibrated). ``None``
        when every field has enough."""
        entry = self.service.named[schema]
        mapped = {f for link in list(self.links.values()) if link.mapping.schema == schema
                  for f in link.mapping.fields.values()}
        rows = label_studio_rows(tasks, "the gold journal")
        short = []
        for f in entry.schema.declared:
            if f.name not in mapped:
                continue
            labels = {str(l) for l in f.labels}
            n = sum(1 for r in rows if _is_label(r.get(f.name), labels, f.type == "multi"))
            if n < self.config.min_gold_rows:
                short.append(f"field {f.name!r} {n}")
        if not short:
            return None
        return (f"not enough gold to retrain: annotated rows with one of the field's labels: {', '.join(short)}; "
                f"each mapped field needs at least {self.config.min_gold_rows} (fewer cannot judge a calibration or "
                "tune: pcd tune leaves such a field uncalibrated); annotate more tasks and train again")

    # -- learning -------------------------------------------------------------------------------
    def gold_rows(self, schema: str) -> int:
        """Gold rows (tasks with an answer) over the journals of the projects mapped to ``schema``."""
        return sum(len(self.journal(p).gold_rows()) for p, link in list(self.links.items())
                   if link.mapping.schema == schema)

    def maybe_retrain(self, project: str) -> str | None:
        link = self.links.get(project)
        if link is None or self.config.retrain_every <= 0:
            return None
        schema = link.mapping.schema
        rows = self.gold_rows(schema)
        if rows - self._rows_at_last_run.get(schema, 0) >= self.config.retrain_every:
            return self.start_training(project)
        return None

    def start_training(self, project: str) -> str:
        """Start a retrain of the schema ``project`` maps to, in a background thread; returns
        ``started``, ``busy`` (one runs for that schema), ``unmapped`` (no ``/setup`` yet) or
        ``not_enough_gold`` (``missing_gold``: not started; the reason is a line of the schema's
        version history and ``training_answer``'s ``reason``)."""
        link = self.links.get(project)
        if link is None:
            log.warning("label studio project %s: training asked before /setup mapped it; nothing done", project)
            return "unmapped"
        schema = link.mapping.schema
        running = self._training.get(schema)
        if running is None or not running.is_alive():
            tasks = self.gold_tasks(schema)
            missing = self.missing_gold(schema, tasks)
            if missing:
                rows = self._rows_at_last_run[schema] = self.gold_rows(schema)
                method = "tune" if rows >= self.config.tune_from_rows else "calibrate"
                self.refusals[schema] = missing
                self.histories[schema].add(Version(f"not-started-{now()}", method, False, now(), rows, reason=missing))
                log.warning("schema %s: retrain not started: %s", schema, missing)
                return "not_enough_gold"
        with self._lock:
            running = self._training.get(schema)
            if running is not None and running.is_alive():
                log.info("schema %s: a retrain runs already; this trigger is not queued", schema)
                return "busy"
            thread = threading.Thread(target=self._retrain, args=(schema,), name=f"pcd-retrain-{schema}",
                                      daemon=True)
            self._training[schema] = thread
            thread.start()
        return "started"

    def training_answer(self, project: str) -> dict:
        """What a training trigger (``START_TRAINING``, ``/train``) is answered: ``{"training":
        start_training's status}``, with ``reason`` when the run was not started for want of gold,
        and ``previous_run`` (``{"version", "method", "reason"}``) when the schema's run before
        this trigger failed or was not swapped in: a run fails in the background, after its
        trigger was answered, and this is where Label Studio's webhook log shows it (as well as
        ``GET /versions`` and pcd's log)."""
        link = self.links.get(project)
        before = self._last_run(link.mapping.schema) if link is not None else None
        status = self.start_training(project)
        out: dict = {"training": status}
        if status == "not_enough_gold" and link is not None:
            out["reason"] = self.refusals.get(link.mapping.schema, "")
        if before is not None and not before.accepted:
            out["previous_run"] = {"version": before.version, "method": before.method, "reason": before.reason}
        return out

    def _last_run(self, schema: str):
        """The schema's latest history line that a trigger made (not the base model, not a
        restore), or ``None``."""
        history = self.histories.get(schema)
        runs = [v for v in (history.items if history else []) if v.method != "base"
                and v.reason != "restored at start-up"]
        return runs[-1] if runs else None

    def wait_training(self, timeout: float = 600.0) -> None:
        """Join the running retrain threads (tests, shutdown)."""
        for thread in list(self._training.values()):
            thread.join(timeout)

    def _retrain(self, schema: str) -> None:
        """One retrain of ``schema`` (module doc): journal -> export -> fit -> holdout check ->
        swap if not worse -> history -> Label Studio told. Every failure is logged and recorded."""
        started = time.perf_counter()
        history = self.histories[schema]
        entry = self.service.named[schema]
        projects = [p for p, link in list(self.links.items()) if link.mapping.schema == schema]
        stamp, n = time.strftime('%Y%m%dT%H%M%S', time.gmtime()), 0
        while (self.state / "schemas" / schema / f"run-{stamp}-{n:04d}").exists():
            n += 1  # never a folder of an earlier run (one run per schema at a time)
        work = self.state / "schemas" / schema / f"run-{stamp}-{n:04d}"
        gold = work / "gold.export.json"
        job = entry.options
        tasks = self.gold_tasks(schema)  # in the schema's terms, through each project's mapping
        from ..io.files import write_atomic

        try:
            work.mkdir(parents=True, exist_ok=True)
            write_atomic(gold, json.dumps(tasks, ensure_ascii=False).encode())
        except OSError as exc:
            history.add(Version(f"failed-{now()}", "calibrate", False, now(), reason=f"the run's folder {str(work)!r} "
                                f"cannot be written ({type(exc).__name__}: {exc}); the served model stays"))
            log.warning("schema %s: retrain failed: %s cannot be written (%s)", schema, work, exc)
            return
        rows = sum(1 for p in projects for _ in self.journal(p).gold_rows())
        self._rows_at_last_run[schema] = rows
        method = "tune" if rows >= self.config.tune_from_rows else "calibrate"
        log.info("schema %s: retrain (%s) on %d gold rows of project%s %s", schema, method, rows,
                 "s" if len(projects) != 1 else "", ", ".join(projects))
        try:
            # the export holds each task's record text (a --template's text composed already, as
            # pcd review writes it) under GOLD_TEXT: read it as it is, then serve with the job's own
            fitted = self.fit(method, gold, entry.schema, replace(job, id_field=None, template=None,
                                                                  text_field=GOLD_TEXT), work,
                              store=self.state / "schemas" / schema / LABELLED_ROWS)
            fitted.job = replace(fitted.job, template=job.template, text_field=job.text_field, id_field=job.id_field)
            release_memory()  # the fit's own model (a tune's trained copy) is gone before the new one loads
            ok, why = not_worse(fitted.before, fitted.after)
            version = version_name(job.model or "embedded", fitted_bytes(fitted.path))
            record = Version(version, method, False, now(), rows, fitted.holdout_rows, fitted.before, fitted.after,
                             0.0, why, str(fitted.path), job=changed_options(entry.options, fitted.job))
            if ok:
                labeler = self.build(entry.schema, fitted.job, fitted.own_model)
                self._versions[labeler] = version
                self.service.replace_labeler(schema, labeler, fitted.job)
                del labeler
                record.accepted = True
                log.info("schema %s: version %s swapped in (%s; accuracy %s -> %s)", schema, version, why,
                         fitted.before.get("accuracy"), fitted.after.get("accuracy"))
            else:
                log.warning("schema %s: version %s not swapped in: %s", schema, version, why)
        except Exception as exc:  # noqa: BLE001 - a failed run keeps the old model and says why
            record = Version(f"failed-{now()}", method, False, now(), rows, reason=f"{type(exc).__name__}: {exc}")
            log.warning("schema %s: retrain failed (%s); the served model stays", schema, record.reason)
        record.seconds = round(time.perf_counter() - started, 3)
        if record.accepted:
            for p in projects:
                record.label_studio[p] = self._tell_label_studio(self.links[p], record.version)
        history.add(record)
        fitted = entry = None  # the fit's model and the swapped-out labeler: nothing here holds them
        self._prune(schema)
        release_memory()

    def _prune(self, schema: str) -> None:
        """The state dir keeps what the version history needs (docs/serve.md, "Memory and the
        state folder over retrains"): the run folders of the served version and of the accepted version before
        it (a rollback), and any folder their jobs read (a tune over a tuned model reads the
        earlier run's model); every other run folder (rejected, failed or older runs: a tuned
        model is 0.5 GB) is deleted. Its history line stays, with its figures."""
        root = self.state / "schemas" / schema
        accepted = [v for v in self.histories[schema].items if v.accepted and v.method != "base"]
        keep: set[Path] = set()
        for v in accepted[-2:]:  # the served version (the last accepted) and the one before it
            for value in [v.path, *v.job.values()]:
                if isinstance(value, str) and value:
                    p = Path(value)
                    keep.update(q for q in (p, *p.parents) if q.parent == root)
        for run in sorted(root.glob("run-*")):
            if run.is_dir() and run not in keep:
                shutil.rmtree(run, ignore_errors=True)
                log.info("schema %s: run folder %s deleted (neither the served version nor the one before)",
                         schema, run.name)

    def restore(self) -> None:
        """Serve again, once the model is loaded, the version each schema served when the server
        last stopped (``VersionHistory.to_restore``), in a thread that ends when done or when the
        service fails to start or stops. Called by ``create_app``."""
        pending = {name: h.to_restore for name, h in self.histories.items() if h.to_restore is not None}
        if not pending:
            return
        # before ready: /ready, /setup and /predict wait until the restored versions serve
        if not self.service.add_startup_step(lambda: self._restore_now(pending)):
            threading.Thread(target=self._restore, args=(pending,), name="pcd-restore", daemon=True).start()

    def _restore(self, pending: dict) -> None:
        while not self.service.ready.wait(0.2):
            if self.service.startup_error is not None or self.service.draining:
                return
        self._restore_now(pending)

    def _restore_now(self, pending: dict) -> None:
        """Build and swap in each schema's version to restore (the service's start-up step)."""
        for name, version in pending.items():
            entry = self.service.named[name]
            job = replace(entry.options, **version.job)
            try:
                labeler = self.build(entry.schema, job, version.method == "tune")
            except Exception as exc:  # noqa: BLE001 - a version that no longer loads: the base model stays
                log.warning("schema %s: version %s not restored (%s: %s); serving the base model", name,
                            version.version, type(exc).__name__, exc)
                continue
            self._versions[labeler] = version.version
            self.service.replace_labeler(name, labeler, job)
            del labeler
            self.histories[name].add(replace(version, method=version.method, created=now(), seconds=0.0,
                                             reason="restored at start-up", label_studio={}))
            log.info("schema %s: version %s restored", name, version.version)

    def version_of(self, schema: str, labeler) -> str:
        """The version ``labeler`` is (the one that decoded a request): a swapped-in one's, else the
        base model's; the schema's current version when no labeler decoded anything."""
        if labeler is None:
            return self.histories[schema].current
        return self._versions.get(labeler, self._base[schema])

    def _build_labeler(self, schema, job, own_model: bool):
        if own_model:
            from ..api import build_labeler

            return build_labeler(schema, job)
        return self.service.host.labeler(schema, job)

    def _tell_label_studio(self, link: ProjectLink, version: str) -> str:
        base = self.config.label_studio_url or link.hostname
        if not base or not link.access_token:
            return "not told: no Label Studio URL or token (call /setup, or give --label-studio-url)"
        try:
            return self.patch_project(base, link.access_token, link.project, version)
        except Exception as exc:  # noqa: BLE001 - Label Studio unreachable: the swap stands, the log says so
            log.warning("label studio project %s: model_version not updated (%s)", link.project, exc)
            return f"error: {type(exc).__name__}: {exc}"


def patch_model_version(base_url: str, token: str, project: str, version: str) -> str:
    """Make ``version`` the project's ``model_version`` in Label Studio, the way Label Studio
    itself keeps them in step: the project's ML backend (``GET /api/ml?project=<id>``; the one
    connected, else the first) is renamed ``PATCH /api/ml/<backend id>`` ``{"title": version, "url",
    "project"}`` (``ml/serializers.py`` checks health and setup on every update)
    (``ml/models.py`` ``MLBackend.save`` then moves the project's ``model_version`` along when it
    was the old title), and ``PATCH /api/projects/<id>/`` ``{"model_version": version}`` sets it
    otherwise (``projects/serializers.py`` ``validate_model_version`` accepts only a live ML
    backend's title or a version some prediction carries: hence the rename first). Authorised
    with ``Authorization: Token <token>``, the token ``/setup`` sends as ``access_token``
    (``MLApi.setup``: ``project.created_by.auth_token.key``). Returns ``"ok"``.

    Raises:
        OSError: Label Studio did not answer, or refused (its status and body in the message).
    """
    base = base_url.rstrip("/")
    backends = _api(base, token, "GET", f"/api/ml?project={project}")
    if isinstance(backends, dict):
        backends = backends.get("results", [])
    if backends:
        backend = next((b for b in backends if b.get("state") == "CO"), backends[0])
        # the serializer checks the backend again (``MLBackendSerializer.validate``: health and setup
        # with the body's url and project), so both go with the new title
        _api(base, token, "PATCH", f"/api/ml/{backend['id']}", {"title": version, "url": backend["url"],
                                                                  "project": int(project)})
    current = _api(base, token, "GET", f"/api/projects/{project}/")
    if current.get("model_version") != version:
        _api(base, token, "PATCH", f"/api/projects/{project}/", {"model_version": version})
    return "ok"


def _api(base: str, token: str, method: str, path: str, body: dict | None = None):
    request = urllib.request.Request(base + path, data=None if body is None else json.dumps(body).encode(),
                                     method=method, headers={"Authorization": f"Token {token}",
                                                             "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=API_TIMEOUT_S) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        raise OSError(f"{method} {path}: {exc.code} {exc.read()[:300].decode('utf-8', 'replace')}") from None


#: The data key of the record text in the export a retrain reads (``gold_tasks``).
GOLD_TEXT = "text"


def _in_schema_terms(results: object, mapping: ConfigMapping) -> list:
    """An annotation's results with each mapped control's ``from_name`` its field and its choices
    the field's labels (``ConfigMapping.label_of``); results of unmapped controls dropped."""
    out = []
    for r in results if isinstance(results, list) else []:
        if not isinstance(r, dict) or r.get("from_name") not in mapping.fields:
            continue
        control = r["from_name"]
        value = r.get("value") if isinstance(r.get("value"), dict) else {}
        choices = value.get("choices")
        if isinstance(choices, list):
            value = {**value, "choices": [mapping.label_of(control, c) for c in choices]}
        out.append({**r, "from_name": mapping.fields[control], "value": value})
    return out


def _is_label(value: object, labels: set[str], multi: bool) -> bool:
    """Whether a gold row's answer is one of the field's labels (a multi field: a list of them)."""
    if multi:
        return isinstance(value, list) and all(str(v) in labels for v in value) or \
            (isinstance(value, str) and value in labels)
    return isinstance(value, str) and value in labels


def state_unwritable(problem: str, *, kept: int | None = None) -> JournalUnwritable:
    """The error (``journal_unwritable``, retry after 60 s) for an event pcd could not keep on disk: ``problem``
    names the file and the system's reason; the answer says the event was not kept, so that
    the sender sees it (Label Studio shows a webhook's failed answer; the annotation itself stays
    in Label Studio and is journalled when sent again: saved anew, or through ``/train``). The
    same line goes to the log."""
    done = f" ({kept} event{'s' if kept != 1 else ''} before it were kept)" if kept else ""
    message = (f"{problem}; this event was not kept in pcd's gold{done}: make the --state-dir folder "
               "writable, then send it again (save the annotation again, or train with /train)")
    log.warning("label studio: %s", message)
    return JournalUnwritable(message)


def project_id(value) -> str | None:
    """Label Studio's project id from ``"<id>.<created unix>"`` (``MLApi._create_project_uid``), an
    integer, or a project object ``{"id", ...}`` (webhooks)."""
    if isinstance(value, dict):
        value = value.get("id")
    if isinstance(value, bool) or value is None:
        return None
    text = str(value).split(".", 1)[0].strip()
    return text if text.isdigit() else None


def _as_list(value) -> list:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]
