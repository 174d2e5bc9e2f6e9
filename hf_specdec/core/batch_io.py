"""Left-padded batches of token-id prompts for a batched ``model.generate``: the pad id, the padded batch and its
attention mask, its rows back, and each row's new tokens of the output (the bench and ``trainers/corpus/regenerate.py``
decode batches with them)."""

from __future__ import annotations

import torch

from ..errors import SpecDecError


def pad_token_id(tokenizer) -> int:
    """The id that left-pads a batch: the tokenizer's pad token, else its EOS."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise SpecDecError("the tokenizer has neither a pad nor an EOS token to pad a batch with")
    return int(pad)


def left_pad(
    rows: list[list[int]], pad_id: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of shape (B, longest row) on ``device``: each row right-aligned after
    ``pad_id``s. Built on the host from the rows' lists and moved once."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long, device="cpu")
    mask = torch.zeros((len(rows), width), dtype=torch.long, device="cpu")
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long, device="cpu")
            mask[i, width - len(r) :] = 1
    return ids.to(device), mask.to(device)


def unpad_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[torch.Tensor]:
    """Each row of a padded batch as its own (1, P_i) prompt (the positions its mask keeps)."""
    return [ids[mask.bool()].unsqueeze(0) for ids, mask in zip(input_ids, attention_mask)]


def split_rows(sequences: torch.Tensor, prompt_length: int, eos_ids: list[int]) -> list[list[int]]:
    """Per-row new tokens of a batched ``generate`` output (B, prompt_length + n): the left-padded prompt stripped
    and each row cut after its first EOS (what follows it is padding for a row that finished before the others)."""
    eos = set(eos_ids)
    rows = []
    for row in sequences[:, prompt_length:].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        rows.append([int(t) for t in row[:end]])
    return rows
