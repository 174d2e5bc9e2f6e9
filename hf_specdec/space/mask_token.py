"""SPACE's mask token ``[M]`` (SPACE, arXiv:2402.11809, §3.1, §4.1): one added special token with its own embedding row, shared by
SAR-SFT training (``trainers/space/train.py``) and by loading a SAR-SFT adapter onto its base model (``adapter.py``)."""

from __future__ import annotations

import torch

MASK_TOKEN = "<|space_mask|>"


def add_mask_token(model, tokenizer, k: int, seed: int = 0) -> int:
    """Add ``[M]`` as a special token with a freshly initialised embedding row; returns its id.

    The row is drawn from N(0, initializer_range) (§4.1: "initialize its embedding with normal distribution").
    With tied input/output embeddings the same row is also the mask token's output row. Idempotent: a model
    that already has the token keeps its row. The token id and ``k`` are recorded in ``model.config``.
    """
    from tokenizers import AddedToken

    if MASK_TOKEN not in tokenizer.get_vocab():
        tokenizer.add_tokens([AddedToken(MASK_TOKEN, special=True, normalized=False)], special_tokens=True)
    mask_id = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    emb = model.get_input_embeddings()
    if mask_id >= emb.weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
        emb = model.get_input_embeddings()
        std = getattr(model.config, "initializer_range", 0.02)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            row = torch.randn(emb.weight.shape[1], generator=gen) * std
            emb.weight[mask_id] = row.to(emb.weight.dtype)
            out = model.get_output_embeddings()
            if out is not None and out.weight.data_ptr() != emb.weight.data_ptr():
                out.weight[mask_id] = 0.0  # untied head: never prefer the mask token as an output
    model.config.space_mask_token_id = int(mask_id)
    model.config.space_k = int(k)
    return int(mask_id)
