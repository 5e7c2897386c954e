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

    The same arithmetic as ``pcd_cli.decoding.decode.score_forest`` (DESIGN.md §2 rules 6-7): a path's
    log-probability is the sum of its edges' reads; a label's is the log-sum-exp over its paths.

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
    candidate mass, DESIGN.md §2 rule 7). Since ``log q(gold) = log p(gold) + log mass``, the
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

    def save(self, directory: Path, *, adapter_only: bool, card: dict, files: dict[str, bytes] | None = None) -> None:
        """Write the result to ``directory`` atomically (a temporary folder beside it, then renamed).

        ``adapter_only``: peft's adapter files (``adapter_config.json``,
        ``adapter_model.safetensors``); else the base model with the adapter merged in
        (``config.json``, safetensors weights), loadable as any model folder. Both get the
        tokenizer (with its chat template), the card ``pcd-tune.json`` and ``files`` (name ->
        bytes, e.g. the calibration). The live model keeps its adapter unmerged.

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
            else:
                merged = copy.deepcopy(self.peft_model).merge_and_unload()
                merged.save_pretrained(str(tmp))
            self.backend.tokenizer._tok.save_pretrained(str(tmp))
            (tmp / CARD_NAME).write_text(json.dumps(card, indent=2, ensure_ascii=False) + "\n")
            for name, data in (files or {}).items():
                (tmp / name).write_bytes(data)
            if directory.exists():
                shutil.rmtree(directory)
            os.replace(tmp, directory)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise machine_error(exc, given) from exc
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


#: The provenance card every ``pcd tune`` output folder holds.
CARD_NAME = "pcd-tune.json"


def apply_adapter(backend, adapter_dir: str | Path):
    """``backend`` with the LoRA adapter in ``adapter_dir`` merged into its weights (``--adapter``).

    Returns a new ``TorchBackend`` over the merged model (the labelling cost is unchanged).

    Raises:
        ModelError: peft missing, or the folder is not a peft adapter for this model.
    """
    from .torch_backend import TorchBackend

    peft = require_peft()
    adapter_dir = Path(adapter_dir)
    if not (adapter_dir / "adapter_config.json").is_file():
        raise ModelError(f"--adapter {str(adapter_dir)!r}: no adapter_config.json there (write one with "
                         "pcd tune --adapter-only)")
    try:
        merged = peft.PeftModel.from_pretrained(backend.model, str(adapter_dir)).merge_and_unload()
    except (ValueError, RuntimeError, KeyError, OSError) as exc:
        raise ModelError(f"--adapter {str(adapter_dir)!r}: does not fit model {backend.model_id!r} "
                         f"({str(exc).splitlines()[0]})") from exc
    tuned = TorchBackend(merged, backend.tokenizer._tok, backend.model_id)
    return tuned
