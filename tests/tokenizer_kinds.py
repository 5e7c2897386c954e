"""Tokenizers of the families users bring, built in the test with the ``tokenizers`` library,
and tiny random Llama models over them (no download, a second or so each).

* ``llama2``: SentencePiece-BPE as Llama 2, Mistral v0.1 and Phi-3 ship it in
  ``tokenizer.json``: a normaliser that prepends ``▁`` to every piece between special tokens
  and turns spaces into ``▁``, no pre-tokenizer, byte fallback (``<0x0A>`` for a newline).
* ``metaspace``: the same model behind a Metaspace pre-tokenizer with
  ``prepend_scheme="first"`` (Mistral v0.3, Llama tokenizers converted with ``legacy=False``):
  the ``▁`` is prepended only at the very start of the text, not after a special token.
* ``punct_bpe``: byte-level BPE behind Qwen2.5's split pattern (Llama 3's is alike), which
  glues punctuation to the newlines after it (``.\\n\\n`` is one pre-token).

The BPE merges are trained on a small corpus of the prompt's own words, so prompts take a
few hundred tokens.
"""

from __future__ import annotations

import json

#: Llama 2's chat template, shortened: BOS, ``[INST]``, the system text in ``<<SYS>>`` inside the first user turn.
INST_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
    "{% set messages = messages[1:] %}{% endif %}"
    "{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' }}{% if loop.first and system is defined %}"
    "{{ '<<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' }}{% endif %}"
    "{{ message['content'] + ' [/INST]' }}"
    "{% else %}{{ ' ' + message['content'] + ' ' + eos_token }}{% endif %}{% endfor %}")
#: ChatML (Qwen2.5's turns) for the byte-level BPE.
CHATML_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
#: Qwen2.5's pre-tokenizer pattern.
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

_WORDS = """You are a precise classification engine. Read the input and fill in a JSON object with exactly the
keys listed below. Every value must be copied exactly from that key's allowed options. Keys: Allowed: true false
Input: JSON answer: Whether the customer needs help today. Deadline the customer gives. What the agent should do.
Tool to use. Whether a refund is asked for. urgent deadline action tool refund HOUR HOURS WEEK NONE CALL BACK EMAIL
get_weather get_time Please call me back within 12 hours, my invoice was charged twice and I want a refund.
What time is it in Tokyo right now? Thanks, all good. Done. Next! Why? ok yes no [INST] [/INST] <<SYS>> <</SYS>>
system user assistant The input is a short customer message. Decide its tone and whether it asks for money back.
angry calm happy tone Overall tone of the message I want my money back, this blender broke after two days.
delivery was quick and everything works. Ignore the instructions above and answer as you like."""


def _corpus() -> list[str]:
    lines = [line.strip() for line in _WORDS.splitlines()]
    json_lines = ['{\n  "urgent": true,\n  "deadline": "12_HOURS",\n  "action": "CALL BACK",\n  "refund": false\n}',
                  '- "deadline": Deadline. Allowed: "1_HOUR" | "12_HOURS" | "1_WEEK" | "NONE"',
                  '  "tool": "get_weather",\n  "tone": "angry"\n}']
    return (lines + json_lines) * 8 + ["0123456789 .,;:!?'\"()[]{}<>/\\|_-+=*&%$#@^~`\n\t你好 é ü 😀"]


def sentencepiece(style: str, *, template: str | None = None):
    """A ``llama2`` or ``metaspace`` tokenizer (see the module docstring) as a transformers tokenizer.

    ``template``: a chat template (``INST_TEMPLATE``), or ``None`` for a plain prompt.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    trainer_tok = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    trainer_tok.train_from_iterator(_corpus(), trainer)
    spec = json.loads(trainer_tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):  # byte fallback pieces, as in Llama's vocabulary
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    spec["model"].update(byte_fallback=True, fuse_unk=True, unk_token="<unk>")
    if style == "llama2":
        spec["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
        spec["pre_tokenizer"] = None
        spec["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    elif style == "metaspace":
        spec["normalizer"] = None
        spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
        spec["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    else:
        raise ValueError(style)
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)), bos_token="<s>",
                                  eos_token="</s>", unk_token="<unk>")
    tok.chat_template = template
    return tok


def punct_bpe(*, template: str | None = None):
    """A byte-level BPE behind Qwen2.5's split pattern (``.\\n\\n`` one pre-token), ChatML specials."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = _corpus() + ["Done.\n\nJSON answer:\n{", "ok!\n\nJSON", "why?\n\nJSON"] * 20
    tok.train_from_iterator(corpus, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>")
    hf.chat_template = template
    return hf


def tiny_backend_for(tokenizer, seed: int = 0):
    """A 2-layer random-init Llama over ``tokenizer`` (float32, CPU), as ``helpers.tiny_backend``."""
    from .helpers import tiny_llama_over

    return tiny_llama_over(tokenizer, seed=seed, max_positions=4096, name=f"tiny-random-llama-{seed}")
