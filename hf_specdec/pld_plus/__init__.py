"""PLD+: Somasundaram et al., "PLD+: Accelerating LLM inference by leveraging Language Model Artifacts"
(arXiv:2412.01447), §4, App. B, App. D: prompt lookup whose occurrences are ranked with the target's own artifacts.

Prompt lookup decoding (PLD, transformers' ``prompt_lookup_num_tokens``) drafts the tokens that followed an
earlier n-gram match in the context. PLD+ matches only the last token ``x_t`` (eq. 1: the occurrences
``P = {j < t : x_j = x_t}``) and ranks the occurrences with what the verification forward already computed:

- ``pld_variant="hidden"`` (PLD+(h), §4.2.2, eq. 3): cosine similarity between the hidden states at layer ``l``
  of the tokens *before* the occurrence and before ``x_t``: ``cos(H_{j-1}, H_{t-1})``.
- ``pld_variant="attention"`` (PLD+(a), §4.2.1, eq. 2): the attention that ``x_{t-1}`` pays to ``x_j``, maxed
  over a set of induction heads (found once per model by ``hf-specdec find-heads``, see ``induction_heads.py``).

The draft (§4.3) is the ``K`` tokens after the best occurrence; no occurrence means no draft, so the step is a
plain decoding step. Verification (§4.4): both variants propose into the tree core's loop
(``core/tree_decoding.py``, ``proposer.py``; the sequence kept on the host), PLD+(h) at every batch size, PLD+(a) at
batch size 1. Greedy keeps the longest prefix equal to the target's argmax; sampling accepts a draft
token with the target's probability of it (a deterministic draft, exactly the rule of HF prompt lookup), so the
output is the target's, token for token (greedy) or in distribution (sampling).

Names: ``K`` (``pld_num_tokens``) is the number of drafted tokens per step (the papers' gamma); tau is the number
of tokens produced per target forward; ``l`` (``pld_layer``) indexes ``output_hidden_states`` (0 = embeddings,
``i`` = output of decoder layer ``i``).

The artifacts come from the verification forward: the loop gathers hidden state ``l`` of the kept tokens only
(PLD+(h)); for PLD+(a) the attention of only the selected heads, and of the last rows only, is computed, next to the model's own (sdpa) attention, by a thin registered attention function
(``attention_capture.py``); the model's outputs are the unchanged ones of its own kernel. Hidden states
are kept incrementally: each step appends only the rows of the verified positions (rejected draft positions are
dropped), never recomputes them. Attention rows are read from the latest forward only (the row of ``x_{t-1}``
spans the whole context).

Attribution (App. D): with ``pld_return_attribution=True``, :func:`pld_plus` returns the context position every
copied-and-accepted span came from (:class:`CopiedSpan`).

Usage (``hf_specdec.pld_plus`` is this package's ``custom_generate`` function, ``generate.pld_plus``)::

    out = target.generate(**inputs, custom_generate=hf_specdec.pld_plus, pld_variant="hidden", max_new_tokens=256)

One module per concern: ``ranking.py`` (eq. 1-3), ``draft_length.py`` (§4.3's K), ``attention_capture.py`` (the
selected heads' weights), ``candidate_generator.py`` (the ``CandidateGenerator``), ``attribution.py`` (App. D),
``generate.py`` (the ``custom_generate`` entry), ``defaults.py`` (tuned values), ``heads_file.py`` (PLD+(a)'s heads
file), ``induction_heads.py`` (``hf-specdec find-heads``, §4.2.1, App. B.1) and ``tune.py`` (``hf-specdec pld-tune``, §5.5). PLD+ needs no
trained drafter (nothing in ``modeling/``) and no training (nothing in ``trainers/``): it drafts from the context.
"""

from .generate import pld_plus

__all__ = ["pld_plus"]
