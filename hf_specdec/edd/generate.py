"""``hf_specdec.edd_pct``: EDD + PCT as one ``custom_generate`` call, like the other methods.

Usage::

    import hf_specdec
    from hf_specdec.modeling import EddForCausalLM

    edd = EddForCausalLM.from_pretrained("runs/edd-smollm2", target=target)
    out = target.generate(**inputs, custom_generate=hf_specdec.edd_pct, drafter=edd, max_new_tokens=128)

It builds the Pruned Candidate Tree proposer (:class:`~hf_specdec.edd.tree_proposer.EddTreeProposer`, builder
``"pct"``) and runs the tree core's ``tree_generate``. Another tree builder (VCT, EAGLE-2) or any other
:class:`EddTreeProposer` setting goes through ``custom_generate=hf_specdec.tree_generate, proposer=...``.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig, LogitsProcessorList

from ..core.draft_budget import DraftBudget
from ..core.generate_io import check_generation_mode, check_prompt
from ..core.stats import DecodeStats
from ..core.tree_decoding import tree_generate
from ..errors import SpecDecError
from ..shipped import shipped_drafter
from .pct import DEFAULT_PCT_MAX_DEPTH, DEFAULT_PCT_WIDTH, DEFAULT_REMOVAL_THRESHOLD
from .tree_proposer import EddTreeProposer

NAME = "custom_generate=hf_specdec.edd_pct"


def edd_pct(
    model,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList | None = None,
    stopping_criteria=None,
    generation_config: GenerationConfig | None = None,
    synced_gpus: bool = False,
    streamer=None,
    drafter=None,
    pct_width: int = DEFAULT_PCT_WIDTH,
    pct_depth: int = DEFAULT_PCT_MAX_DEPTH,
    pct_removal: float = DEFAULT_REMOVAL_THRESHOLD,
    pct_cost: bool | DraftBudget = True,
    stats: DecodeStats | None = None,
    specdec_streamer=None,
    **model_kwargs,
):
    """``custom_generate`` for EDD + PCT, from "Faster Speculative Decoding via Effective Draft Decoder with Pruned
    Candidate Tree" (Zheng and Wang, ACL 2025, anthology 2025.acl-long.486), §3.1 EDD and §3.2 PCT:
    ``target.generate(**inputs, custom_generate=hf_specdec.edd_pct, drafter=edd)``. Each step the EDD drafter grows
    a candidate tree from its confidences and the target verifies it in one forward (``tree_generate``): the output
    is the target's, greedy (token-identical to plain greedy ``generate``) or sampled (``do_sample=True``). A
    left-padded batch (with ``attention_mask``) drafts and accepts per row; ``return_dict_in_generate=True`` gives a
    ``GenerateDecoderOnlyOutput``. Pass a streamer as ``specdec_streamer=`` (transformers 5.23 does not forward
    ``streamer=`` to a ``custom_generate`` callable).

    Args:
        drafter: an ``EddForCausalLM`` trained for this target (attached to it here if needed). None: the EDD drafter
            shipped for this target (``hf_specdec/shipped.py``, loaded once and kept on the target), else a
            ``SpecDecError`` saying how to train one.
        pct_width: the top-k tokens a frontier node is expanded with (5).
        pct_depth: the tree's maximum depth (10).
        pct_removal: the removal threshold, below which a node's estimated acceptance is pruned (0.01).
        pct_cost: size the tree by its cost on this machine (``core/draft_budget.py``): ``True`` uses the cost curve
            and drafter cost learnt here, a ``DraftBudget`` is used as given, ``False`` is the paper's PCT (s_d / s_t
            timed while decoding, eq. 5).
        stats: a ``DecodeStats`` to fill (tau = new tokens per target forward; ``steps[i]["nodes"]``).
    """
    check_generation_mode(generation_config or model.generation_config, NAME)
    check_prompt(input_ids, NAME, batch=True)
    if drafter is None:  # the target's shipped drafter, loaded once; else one error saying how to get one
        drafter = shipped_drafter("edd", model)
    if not hasattr(getattr(drafter, "config", None), "encoder_layer"):
        raise SpecDecError(
            "edd_pct needs an EDD drafter (hf_specdec.modeling.EddForCausalLM) as drafter=, got "
            f"{type(drafter).__name__}"
        )
    proposer = EddTreeProposer(
        drafter, "pct", width=pct_width, depth=pct_depth, removal_threshold=pct_removal, cost=pct_cost
    )
    return tree_generate(
        model,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        synced_gpus,
        streamer,
        proposer=proposer,
        stats=stats,
        specdec_streamer=specdec_streamer,
        **model_kwargs,
    )
