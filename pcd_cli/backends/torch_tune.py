"""LoRA training through the decoder's own reads (``pcd tune``): the torch half.

``pcd_cli.tune`` runs the loop (holdout, epochs, metrics, card) without touching a framework;
everything that needs torch or peft is here: attaching a LoRA adapter to a loaded
``TorchBackend``, turning the decoder's differentiable reads into label log-probabilities
and a cross-entropy loss, one optimiser step, keeping the best adapter, and writing the
result as a model folder (weights merged) or as an adapter alone.

The loss is the article's recipe (../shared/seeds/002, "Do you need to train anything?"):
cross-entropy restricted to a field's allowed labels, where a label's log-score is exactly
what ``score_forest`` reads for it (its trie paths' summed log-probabilities, marginal or
exact, spellings combined by log-sum-exp), renormalised over the labels; plus, with
``mass_weight``, the gold label's full-vocabulary negative log-likelihood, which keeps the
candidate mass (``field_loss``).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import torch

from ..errors import ModelError
from ..io.files import machine_error, machine_errors, write_target
from .tune_folder import CARD_NAME, folder_files, model_name_key, read_card, written_by_pcd

#: peft's name for every linear layer of the transformer blocks (the LM head excluded).
LORA_TARGETS = "all-linear"


def require_peft():
    """Import peft, or raise ``ModelError`` saying how to install it (the CLI exits 3)."""
    try:
        import peft
    except ImportError as exc:
        raise ModelError("pcd tune needs peft, which is not installed; install it with: "
                         "pip install 'pcd-cli[tune]' (make install does it)") from exc
    return peft


def label_logprobs(forest, reads, n_labels: int) -> torch.Tensor:
    """A field's unnormalised label log-probabilities from the decoder's differentiable reads.

    The same arithmetic as ``pcd_cli.decoding.decode.score_forest`` (docs/how-it-works.md,
    decoding rules 6-7): a path's log-probability is the sum of its edges' reads; a label's is the log-sum-exp over its paths.

    Args:
        forest: the field's ``FieldForest``.
        reads: ``reads[q]``: float32 tensor of the log-probabilities of ``forest.query_ids[q]``.
        n_labels: the field's label count.

    Returns:
        float32 ``(n_labels,)``; ``-inf`` for a label without any path.
    """
    per_label: list[list[torch.Tensor]] = [[] for _ in range(n_labels)]
    for term in forest.terminals:
        per_label[term.label].append(torch.stack([reads[q][c] for q, c in term.edges]).sum())
    device = reads[0].device if reads else "cpu"
    return torch.stack([torch.logsumexp(torch.stack(paths), 0) if paths else
                        torch.tensor(float("-inf"), device=device) for paths in per_label])


def field_loss(forest, reads, n_labels: int, gold: int, mass_weight: float = 0.0) -> torch.Tensor:
    """One field decision's training loss (nats), a scalar tensor:

        -log p(gold)  +  mass_weight * -log q(gold)

    ``p`` are the label probabilities renormalised over the allowed labels
    (``FieldResult.probs``): the cross-entropy of the article's recipe. ``q(gold)`` is the gold
    label's unrenormalised probability, its trie path(s) read on the model's full next-token
    distribution at the same positions (``label_logprobs``; its sum over labels is the
    candidate mass, docs/how-it-works.md, decoding rule 7). Since ``log q(gold) = log p(gold) + log mass``, the
    second term is ``mass_weight * (-log p(gold) - log mass)``: it keeps probability on the
    menu, which the renormalised term alone does not (a tune with ``mass_weight = 0`` halved
    the mean mass on airline tweets, issue 29).
    """
    lp = label_logprobs(forest, reads, n_labels)
    loss = torch.logsumexp(lp, 0) - lp[gold]
    if mass_weight:
        loss = loss - mass_weight * lp[gold]
    return loss


class LoraTrainer:
    """A LoRA adapter on a ``TorchBackend``'s model and its AdamW optimiser.

    The adapter's layers are injected into the backend's own model (peft), so the decoder's
    passes run through them with nothing else changed; the base weights are frozen.
    ``lora_dropout`` is 0 and the model stays in eval mode, so a training pass computes
    exactly what a labelling pass computes (the step-0 oracle test relies on it).

    Args:
        backend: a loaded ``TorchBackend`` (float32 recommended for training on the CPU).
        rank: LoRA rank ``r``; ``lora_alpha`` is ``2 * rank``.
        lr: AdamW learning rate. seed: seeds torch before the adapter is initialised.

    Raises:
        ModelError: peft is not installed, or the model has no linear layers peft can adapt.
    """

    def __init__(self, backend, *, rank: int = 8, lr: float = 5e-4, seed: int = 0, weight_decay: float = 0.0):
        peft = require_peft()
        torch.manual_seed(seed)
        self.backend = backend
        self.base_config = backend.model.config
        config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=LORA_TARGETS,
                                 bias="none", task_type="CAUSAL_LM")
        try:
            with warnings.catch_warnings():  # peft asks transformers a deprecated question (FutureWarning)
                warnings.simplefilter("ignore", FutureWarning)
                self.peft_model = peft.get_peft_model(backend.model, config)
        except ValueError as exc:
            raise ModelError(f"cannot attach a LoRA adapter to {backend.model_id!r} ({exc})") from exc
        self.peft_model.eval()
        self.params = [p for p in self.peft_model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=weight_decay)

    @property
    def trainable_parameters(self) -> int:
        """Number of trainable (adapter) parameters."""
        return sum(p.numel() for p in self.params)

    def step(self, losses: list, max_grad_norm: float = 1.0) -> float:
        """Backward the mean of ``losses`` (scalar tensors, one per field decision), clip the
        gradient norm, one AdamW step; returns the mean loss (nats)."""
        loss = torch.stack(losses).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, max_grad_norm)
        self.optimizer.step()
        return float(loss.detach())

    def adapter_state(self) -> dict:
        """A copy of the adapter's weights (to keep the best epoch)."""
        from peft import get_peft_model_state_dict

        return {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.peft_model).items()}

    def load_adapter_state(self, state: dict) -> None:
        """Put back weights from ``adapter_state``."""
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(self.peft_model, state)

    def reset(self, state: dict) -> None:
        """Start again from ``state`` (``adapter_state`` of the initial adapter) with a fresh
        AdamW optimiser (no moments carried over): each run of a cross-fit starts alike."""
        self.load_adapter_state(state)
        group = self.optimizer.param_groups[0]
        self.optimizer = torch.optim.AdamW(self.params, lr=group["lr"], weight_decay=group["weight_decay"])

    def adapter_sha256(self) -> str:
        """SHA-256 (hex) over the adapter's weights (names, shapes, float32 bytes, in name order):
        the same adapter gives the same digest in its adapter card and in a merged folder's card."""
        import hashlib

        digest = hashlib.sha256()
        for name, tensor in sorted(self.adapter_state().items()):
            digest.update(f"{name}:{tuple(tensor.shape)}".encode())
            digest.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
        return digest.hexdigest()

    def save(self, directory: Path, *, adapter_only: bool, card: dict, files: dict[str, bytes] | None = None,
             base_name: str | None = None) -> None:
        """Write the result to ``directory`` atomically (a temporary folder beside it, then renamed).

        ``adapter_only``: peft's adapter files (``adapter_config.json``,
        ``adapter_model.safetensors``); else the base model with the adapter merged in
        (``config.json``, safetensors weights), loadable as any model folder. Both get the
        tokenizer (with its chat template), the card ``pcd-tune.json`` and ``files`` (name ->
        bytes, e.g. the calibration). The live model keeps its adapter unmerged.

        The card gets ``files`` (every file written, relative paths: what a later run may
        replace, ``tune_folder``) and ``adapter_sha256``. The adapter's config names its base
        as ``base_name`` (the model id, never a path of this machine); peft's boilerplate
        ``README.md`` (it repeats that path) is not written.

        An existing ``directory`` (an earlier pcd tune folder, checked by
        ``tune_folder.check_tune_output`` before training) is swapped for the new one when it
        holds only pcd's files; files that appeared in it since are kept, pcd's own replaced one by one.
        A symlinked ``directory`` is replaced at its target; the link stays (``pcd_cli.io.files``).

        Raises:
            MachineError: the folder cannot be written (nothing half-written is left).
        """
        given = Path(directory)
        directory = write_target(given)
        with machine_errors(given):
            directory.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
        try:
            if adapter_only:
                self.peft_model.save_pretrained(str(tmp))
                _scrub_adapter_config(tmp / "adapter_config.json", base_name)
                (tmp / "README.md").unlink(missing_ok=True)
            else:
                merged = copy.deepcopy(self.peft_model).merge_and_unload()
                merged.save_pretrained(str(tmp))
            self.backend.tokenizer._tok.save_pretrained(str(tmp))
            for name, data in (files or {}).items():
                (tmp / name).write_bytes(data)
            card = dict(card, adapter_sha256=self.adapter_sha256(), files=sorted({*folder_files(tmp), CARD_NAME}))
            (tmp / CARD_NAME).write_text(json.dumps(card, indent=2, ensure_ascii=False) + "\n")
            _replace_folder(tmp, directory)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise machine_error(exc, given) from exc
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _scrub_adapter_config(path: Path, base_name: str | None) -> None:
    """Name the base model in a written ``adapter_config.json`` by ``base_name`` (the model id),
    not by the folder path peft records (a path of the machine that trained it)."""
    config = json.loads(path.read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = base_name
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _replace_folder(tmp: Path, directory: Path) -> None:
    """Put the finished folder ``tmp`` at ``directory``: renamed into place when new; an earlier
    pcd tune folder is set aside, replaced and then deleted when it holds only pcd's files;
    else (files appeared since ``check_tune_output``) pcd's old files are replaced one by one
    and the others kept."""
    if not directory.exists():
        os.replace(tmp, directory)
        return
    ours, others = written_by_pcd(directory)
    if not others:
        aside = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old.", dir=directory.parent))
        os.replace(directory, aside / "old")
        os.replace(tmp, directory)
        shutil.rmtree(aside, ignore_errors=True)
        return
    new = folder_files(tmp)
    for name in ours:
        if name not in new:
            (directory / name).unlink(missing_ok=True)
    for name in new:
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp / name, directory / name)
    shutil.rmtree(tmp, ignore_errors=True)


def _adapter_name(adapter_dir: Path) -> str:
    return f"--adapter {str(adapter_dir)!r}"


def _examples(keys, limit: int = 2) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:limit]) + (f" (and {len(keys) - limit} more)" if len(keys) > limit else "")


def check_adapter_folder(adapter_dir: str | Path, model: str | None = None) -> dict:
    """The checks ``apply_adapter`` makes before any weight loads; returns the parsed
    ``adapter_config.json``.

    Raises:
        ModelError: no such folder; a model folder (``config.json``, no ``adapter_config.json``:
            a merged folder goes to ``--model``); no ``adapter_config.json``; a config that is
            not JSON; ``--adapter`` is the ``--model`` folder, or the adapter is already merged
            into the ``--model`` folder (their pcd tune cards carry the same ``adapter_sha256``).
    """
    adapter_dir = Path(adapter_dir).expanduser()
    name = _adapter_name(adapter_dir)
    if not adapter_dir.is_dir():
        raise ModelError(f"{name}: no such folder")
    config_path = adapter_dir / "adapter_config.json"
    if not config_path.is_file():
        if (adapter_dir / "config.json").is_file():
            raise ModelError(f"{name}: no adapter_config.json there: it is a model folder (config.json and weights), "
                             "not a LoRA adapter; a merged model folder (pcd tune without --adapter-only) goes to "
                             "--model")
        raise ModelError(f"{name}: no adapter_config.json there (write one with pcd tune --adapter-only)")
    model_dir = Path(model).expanduser() if model else None
    if model_dir is not None and model_dir.is_dir():
        if model_dir.resolve() == adapter_dir.resolve():
            raise ModelError(f"{name} is the --model folder itself; give the base model as --model")
        mine, theirs = read_card(adapter_dir), read_card(model_dir)
        if mine and theirs and theirs.get("kind") == "merged" and _same_training(mine, theirs):
            raise ModelError(f"{name} is already merged into --model {str(model)!r} (their pcd-tune.json cards "
                             "name the same training); applying it again would count it twice: label with "
                             f"--model {str(model)!r} alone, or give the base model as --model")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"{name}: adapter_config.json is not readable JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise ModelError(f"{name}: adapter_config.json is not a JSON object")
    return config


def _same_training(a: dict, b: dict) -> bool:
    """Two pcd tune cards of the same adapter: the same ``adapter_sha256``, or (cards without
    it) the same base weights, gold rows, hyperparameters and kept epoch."""
    if a.get("adapter_sha256") or b.get("adapter_sha256"):
        return a.get("adapter_sha256") == b.get("adapter_sha256")
    keys = ("base_model_key", "gold_sha256", "record_ids_sha256", "hyperparameters", "best_epoch")
    return all(a.get(k) is not None for k in keys) and all(a.get(k) == b.get(k) for k in keys)


def _peft_config(peft, raw: dict, name: str):
    """The peft config of ``raw``, with the keys this peft does not know left out; returns
    ``(config, ignored keys)``."""
    import dataclasses

    from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING

    kind = raw.get("peft_type")
    if kind not in PEFT_TYPE_TO_CONFIG_MAPPING:
        raise ModelError(f"{name}: adapter_config.json has peft_type {kind!r}, which peft {peft.__version__} "
                         f"does not know (written by a newer peft? pip install -U peft)")
    cls = PEFT_TYPE_TO_CONFIG_MAPPING[kind]
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    ignored = sorted(k for k in raw if k not in known)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = cls(**{k: v for k, v in raw.items() if k in known})
    except (TypeError, ValueError) as exc:
        raise ModelError(f"{name}: peft {peft.__version__} cannot read its adapter_config.json "
                         f"({str(exc).splitlines()[0]})") from exc
    config.inference_mode = True
    return config, ignored


def _adapter_weights(adapter_dir: Path, name: str) -> dict:
    """The adapter's tensors (``adapter_model.safetensors``, else ``adapter_model.bin``)."""
    safetensors_path, bin_path = adapter_dir / "adapter_model.safetensors", adapter_dir / "adapter_model.bin"
    try:
        if safetensors_path.is_file():
            from safetensors.torch import load_file

            from .model_files import check_safetensors

            check_safetensors(safetensors_path)
            return load_file(str(safetensors_path))
        if bin_path.is_file():
            return torch.load(str(bin_path), map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError) as exc:
        raise ModelError(f"{name}: cannot read its weights ({str(exc).splitlines()[0]})") from exc
    raise ModelError(f"{name}: no adapter_model.safetensors (or adapter_model.bin) there")


def _missing_targets(model, targets) -> tuple[list[str], list[str]]:
    """``(target module names no layer of ``model`` has, the model's linear layer names)``; a
    regex or ``all-linear`` target is left to peft (empty list)."""
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules() if n}
    linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
    if targets is None or isinstance(targets, str):
        return [], linear
    return sorted(t for t in targets if t.rsplit(".", 1)[-1] not in names), linear


def fit_report(expected: dict, given: dict, base_params: set[str]) -> str | None:
    """Why an adapter's tensors do not fit the model, or ``None``.

    Args:
        expected: name -> shape of the tensors the adapter should have on this model (peft's
            saved names, ``get_peft_model_state_dict`` of the injected adapter).
        given: name -> shape of the adapter file's tensors.
        base_params: the base model's parameter names with peft's ``base_model.model.``
            prefix: a tensor saved for one of them (peft saves resized embeddings) is expected.

    Returns:
        ``"the adapter's weights match no layer of the model ..."``, missing or unexpected keys
        (counted, two named), or the first shapes that differ (``shapes of another model``).
    """
    extra = {k for k in given if k not in expected and k not in base_params}
    missing = [k for k in expected if k not in given]
    if not set(given) & set(expected):
        return (f"the adapter's weights match no layer of the model: its {len(given)} tensors are named like "
                f"{_examples(given, 1)}, the model's LoRA layers like {_examples(expected, 1)}; none of its weights "
                "would be applied")
    if missing or extra:
        parts = ([f"{len(missing)} of the model's adapter tensors are missing ({_examples(missing)})"] if missing else []) \
            + ([f"{len(extra)} tensors match no layer ({_examples(extra)})"] if extra else [])
        return "missing or unexpected keys: " + "; ".join(parts)
    wrong = [(k, tuple(given[k]), tuple(v)) for k, v in expected.items() if tuple(given[k]) != tuple(v)]
    if wrong:
        k, got, want = wrong[0]
        return (f"shapes of another model: {k} is {got} in the adapter but {want} on this model"
                + (f" ({len(wrong)} tensors differ)" if len(wrong) > 1 else "") + "; the adapter was made for a model "
                "with other layer sizes")
    return None


def apply_adapter(backend, adapter_dir: str | Path, model: str | None = None):
    """``backend`` with the LoRA adapter in ``adapter_dir`` merged into its weights (``--adapter``).

    Checked before anything is merged (peft itself loads a misfit as a no-op with a warning):
    ``check_adapter_folder``; the config's target modules against the model's layers; every
    tensor of the adapter file against the tensors the adapter should have on this model
    (``fit_report``). The adapter's ``base_model_name_or_path`` is compared by name
    (``tune_folder.model_name_key``) with ``model`` and the backend's model id.

    Args:
        model: the ``--model`` given (a folder, a GGUF file, a hub id or ``None``), for the
            checks that compare the adapter with it.

    Returns:
        ``(TorchBackend over the merged model, warnings)``: warnings name keys of the adapter's
        config this peft does not know (written by a newer peft; ignored) and a base model
        the config names that is not this one.

    Raises:
        ModelError: peft missing; see ``check_adapter_folder``; target modules the model lacks;
            weights matching no layer, missing or unexpected keys, shapes of another model.
            The backend's model is left as it was.
    """
    from .torch_backend import TorchBackend

    peft = require_peft()
    adapter_dir = Path(adapter_dir).expanduser()
    name = _adapter_name(adapter_dir)
    raw = check_adapter_folder(adapter_dir, model)
    config, ignored = _peft_config(peft, raw, name)
    said: list[str] = []
    if ignored:
        said.append(f"{name}: adapter_config.json has keys peft {peft.__version__} does not know "
                    f"({', '.join(ignored)}): written by a newer peft; they are ignored (pip install -U peft "
                    "reads them)")
    base = raw.get("base_model_name_or_path")
    ours = {model_name_key(backend.model_id)} | ({model_name_key(model)} if model else set())
    if isinstance(base, str) and base and model_name_key(base) not in ours:
        said.append(f"{name} was made for another base model ({base!r} in its adapter_config.json), not "
                    f"{backend.model_id!r}: its labels may mean little")
    missing, linear = _missing_targets(backend.model, config.target_modules)
    if missing and len(missing) == len(config.target_modules):
        raise ModelError(f"{name}: its target modules ({', '.join(missing)}) are not layers of {backend.model_id!r} "
                         f"(its linear layers: {', '.join(linear)}); the adapter was made for another model family")
    if missing:
        said.append(f"{name}: target modules {', '.join(missing)} are not layers of {backend.model_id!r}; left out")
    given = _adapter_weights(adapter_dir, name)
    base_params = {f"base_model.model.{k}" for k, _ in backend.model.named_parameters()}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            peft_model = peft.get_peft_model(backend.model, config)
    except (ValueError, RuntimeError, KeyError, TypeError) as exc:
        raise ModelError(f"{name}: does not fit model {backend.model_id!r} ({str(exc).splitlines()[0]})") from exc
    try:
        # save_embedding_layers=False: "auto" may ask the Hub; saved embeddings are allowed by base_params
        state = peft.get_peft_model_state_dict(peft_model, save_embedding_layers=False)
        expected = {k: tuple(v.shape) for k, v in state.items()}
        problem = fit_report(expected, {k: tuple(v.shape) for k, v in given.items()}, base_params)
        if problem is not None:
            raise ModelError(f"{name} does not fit model {backend.model_id!r}: {problem}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            peft.set_peft_model_state_dict(peft_model, given)
        merged = peft_model.merge_and_unload()
    except BaseException:
        peft_model.unload()  # the backend's model without the adapter's layers, as it was
        raise
    out = TorchBackend(merged, backend.tokenizer._tok, backend.model_id)
    # named by its base weights (the adapter is its own part of the job fingerprint)
    out.content_source = getattr(backend, "content_source", None)
    if getattr(backend, "_content_key", None) is not None:
        out._content_key = backend._content_key
    return out, said
