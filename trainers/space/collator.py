"""SAR-SFT data collator (SPACE, arXiv:2402.11809, §3.1 eq. 2-3 and App. A.1).

SAR-SFT changes only the data loader of ordinary SFT. Each sample is kept unchanged with probability
``p_ar`` (the plain autoregressive loss, eq. 1). Otherwise a start ``m`` is drawn uniformly among the answer
positions from which ``k`` consecutive answer tokens fit, those ``k`` *input* tokens are replaced by the
mask token ``[M]``, the labels are left intact, and input and labels are truncated to end right after the
masked span (eq. 2). With the causal-LM shift used by ``transformers`` (the logit at position ``j`` is scored
against ``labels[j + 1]``) this gives exactly the k + 1 SAR terms of eq. 3:

- positions ``< m``: the ordinary AR loss on the answer prefix (first sum of eq. 3);
- the last real token (position ``m - 1``) predicts ``y_m`` (next token, as in AR);
- mask ``i`` (position ``m + i - 1``, i = 1..k) predicts ``y_{m+i}``, the token ``i + 1`` places after the
  last real token; that is what the auto-correct decoder reads from a mask group (eq. 6).

So the kept length is ``m + k + 1`` (the token at ``m + k`` is only there to carry the last label; its own
logit is never scored). Prompt and chat-template tokens are never masked and never scored: they carry label
-100 from ``hf_specdec.trainers.data.chat.sft_dataset`` and ``m`` is drawn among supervised positions only.
``p_ar = 1`` is plain SFT (the paper's baseline, §4.2.2).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from hf_specdec.errors import SpecDecError

IGNORE_INDEX = -100


def sar_sample(
    input_ids: list[int], labels: list[int], k: int, mask_token_id: int, m: int
) -> tuple[list[int], list[int]]:
    """The SAR view of one sample with the mask span starting at position ``m`` (eq. 2).

    ``input_ids[m : m + k]`` become ``mask_token_id``; both lists are cut to ``m + k + 1`` tokens.
    """
    if not all(label != IGNORE_INDEX for label in labels[m : m + k]) or m + k > len(input_ids):
        raise SpecDecError(f"mask span [{m}, {m + k}) is not inside the supervised answer")
    end = min(m + k + 1, len(input_ids))
    ids = list(input_ids[:end])
    ids[m : m + k] = [mask_token_id] * k
    return ids, list(labels[:end])


def mask_starts(labels: list[int], k: int) -> list[int]:
    """Every ``m`` such that the ``k`` tokens ``m .. m + k - 1`` are all supervised (answer) tokens."""
    ok = [label != IGNORE_INDEX for label in labels]
    starts, run = [], 0
    for j, good in enumerate(ok):
        run = run + 1 if good else 0
        if run >= k:
            starts.append(j - k + 1)
    return starts


@dataclass
class SpaceDataCollator:
    """Batches SFT samples (``input_ids``, ``labels``) for SAR-SFT; plugs into ``transformers.Trainer``.

    Args:
        mask_token_id: id of the added ``[M]`` token (see ``hf_specdec.trainers.space.train.add_mask_token``).
        pad_token_id: id used to right-pad ``input_ids`` (padded labels are -100, attention mask 0).
        k: number of mask tokens (paper default 5).
        p_ar: probability of leaving a sample unchanged (paper default 0.5; 1.0 = plain SFT).
        seed: seed of the collator's own random stream (masking decisions are reproducible).
    """

    mask_token_id: int
    pad_token_id: int
    k: int = 5
    p_ar: float = 0.5
    seed: int = 0
    pad_to_multiple_of: int | None = None
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.k < 1:
            raise SpecDecError(f"k must be at least 1 (got {self.k})")
        if not 0.0 <= self.p_ar <= 1.0:
            raise SpecDecError(f"p_ar must be in [0, 1] (got {self.p_ar})")
        self._rng = random.Random(self.seed)

    def transform(self, input_ids: list[int], labels: list[int]) -> tuple[list[int], list[int]]:
        """One sample: unchanged with probability ``p_ar``, else its SAR view at a uniform ``m``."""
        if self.p_ar >= 1.0 or self._rng.random() < self.p_ar:
            return list(input_ids), list(labels)
        starts = mask_starts(labels, self.k)
        if not starts:  # answer shorter than k: nothing to mask, keep the AR sample
            return list(input_ids), list(labels)
        return sar_sample(input_ids, labels, self.k, self.mask_token_id, self._rng.choice(starts))

    def fix(self, features) -> list[dict]:
        """Apply the random choice once (e.g. to a validation set, so every evaluation scores the same
        masks): the returned samples carry ``sar_fixed`` and pass through ``__call__`` unchanged."""
        out = []
        for f in features:
            ids, labels = self.transform(list(f["input_ids"]), list(f["labels"]))
            out.append({"input_ids": ids, "labels": labels, "sar_fixed": True})
        return out

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        rows = [
            (list(f["input_ids"]), list(f["labels"]))
            if f.get("sar_fixed")
            else self.transform(list(f["input_ids"]), list(f["labels"]))
            for f in features
        ]
        width = max(len(ids) for ids, _ in rows)
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        batch_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        batch_labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for r, (ids, labels) in enumerate(rows):
            batch_ids[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            batch_labels[r, : len(labels)] = torch.tensor(labels, dtype=torch.long)
            attention[r, : len(ids)] = 1
        return {"input_ids": batch_ids, "labels": batch_labels, "attention_mask": attention}
