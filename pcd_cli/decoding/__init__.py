"""Decoding: the prompt (``prompt``, ``seams``), the schema compiled for a tokenizer (``compile``),
the packed forward passes (``decode``), label orderings (``permute``), content-free priors (``prior``)
and the brute-force reference (``oracle``); ``examples`` puts few-shot examples in the prompt head."""
