"""The tree proposer interface of the tree core: what drafts a token tree each step (:class:`TreeProposer`) and what it
learns after every target forward (:class:`StepFeedback`). Every tree method implements it (GLIDE + CAPE, EDD trees,
PLD+ on a batch, n-gram lookup); ``tree_decoding.tree_generate`` drives it at every batch size."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import GenerationConfig
from transformers.cache_utils import Cache

from .tree import TokenTree


@dataclass
class StepFeedback:
    """What the target's forward taught us, handed to :meth:`TreeProposer.observe` after every forward.

    ``input_ids`` is the committed sequence after the step; its last token is the next root and is NOT in
    ``past_key_values`` (the target's compacted cache, length ``input_ids.shape[1] - 1``; read it, do not
    modify it). ``hidden_states`` / ``attentions`` (only when the proposer asked for them) cover the tokens
    this forward added to the cache, in sequence order: the whole prompt for the prefill, the root and the
    accepted nodes for a tree step; hidden states are a per-layer tuple of ``(1, m, hidden)``, attentions a
    per-layer tuple of ``(1, heads, m, cache_length)`` over the compacted cache. ``logits`` are the forward's
    float32 logits of the fed ``[root, nodes...]`` (``(1 + n, vocab)``; one row at the prefill: its last token), before
    any processor: what a proposer that drafts from the verification forward itself reads (SPACE's masks).
    """

    input_ids: torch.Tensor
    new_tokens: list[int]
    num_accepted: int
    accepted_nodes: list[int]
    tree: TokenTree | None
    past_key_values: Cache
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    is_prefill: bool = False
    logits: torch.Tensor | None = None


class TreeProposer:
    """Drafts a token tree each step. Subclass and implement :meth:`propose`.

    Hooks for the methods built on top: a drafter reading the target's KV cache (GLIDE/CAPE) finds it in
    ``StepFeedback.past_key_values``; one conditioned on the target's hidden states (EDD/PCT) sets
    ``needs_hidden_states = True``; one using attention maps (PLD+) sets ``needs_attentions = True`` (needs
    ``attn_implementation="eager"``). Sampling proposers fill ``TokenTree.draft_probs``.

    Batches (``batch_decoding.py``): ``start`` runs once on the proposer given (one-time set-up such as a
    calibration), then every row gets a shallow copy (``copy.copy``) that is ``start``-ed on its own row, so
    ``start`` must (re)create every per-generation state. A row's ``StepFeedback.past_key_values`` is then that
    row's view of the target's cache (``ragged_cache.RowKV``: ``view[layer] = (keys, values)``), not a ``Cache``.
    """

    needs_hidden_states: bool = False
    # the hidden-state layers the proposer reads (indices into ``StepFeedback.hidden_states``, whose other entries are
    # then ``None``); ``None``: every layer
    hidden_layers: tuple[int, ...] | None = None
    needs_attentions: bool = False
    # the verification cost curve the loop's forwards feed (``verify_cost.curve_key``'s variant): a proposer whose
    # forwards compute more than the model's (PLD+(a)'s attention capture) names its own
    cost_variant: str = ""

    def start(self, model, input_ids: torch.Tensor, generation_config: GenerationConfig) -> None:
        """Called once before the prefill (reset per-generation state here)."""

    def propose(self, input_ids: torch.Tensor, max_depth: int) -> TokenTree:
        """A tree below the root ``input_ids[0, -1]``; nodes deeper than ``max_depth`` are dropped."""
        raise NotImplementedError

    def observe(self, feedback: StepFeedback) -> None:
        """Called after every target forward (prefill included) with what was accepted."""

    def expected_tokens(self, depth: int) -> float | None:
        """Tokens the last proposed tree is expected to yield when cut to ``depth`` (its bonus token included), or
        ``None`` (unknown). In a batch, when every row's proposer knows it, the loop cuts the trees to the depth
        that pays for the whole batch (``batch_decoding.best_depth``)."""
        return None
