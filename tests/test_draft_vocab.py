"""Sizing a draft vocabulary (trainers/drafters/draft_vocab.py): the acceptance each size keeps, and the chain's
model."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hf_specdec.trainers.drafters.draft_vocab import expected_tokens, frequent_tokens_from_counts, vocab_table


class _Validation:
    """Stands in for DrafterTrainer: teacher-forced draft logits over the drafter's columns and the target's tokens."""

    def __init__(self, logits, argmax):
        self.logits, self.argmax = logits, argmax

    def validation_logits(self):
        return self.logits, self.argmax


class _Drafter:
    def __init__(self, ids=None):
        self.draft_vocab_ids = ids


def test_a_of_v_is_the_top1_among_the_kept_tokens():
    # drafter columns = token ids 0..5; frequency order 3, 1, 4, 0, 5, 2
    counts = Counter({3: 50, 1: 30, 4: 10, 0: 5, 5: 3, 2: 2})
    logits = torch.tensor(
        [
            [0.0, 1.0, 0.0, 5.0, 0.0, 0.0],  # top-1 = 3 (kept by every size), target 3: hit everywhere
            [0.0, 0.0, 9.0, 0.0, 0.0, 1.0],  # top-1 = 2 (rarest); among {3, 1, 4, 0, 5}: 5; target 5
            [
                2.0,
                0.0,
                0.0,
                0.0,
                3.0,
                0.0,
            ],  # top-1 = 4; among {3, 1}: a tie at 0, the first column (1): a miss
        ]
    )
    argmax = torch.tensor([3, 5, 4])
    costs = {2: 0.01, 5: 0.02, 0: 0.05}
    rows = vocab_table(
        _Validation(logits, argmax), _Drafter(), counts, [], [2, 5, 0], costs, c_verify=2.0, gamma=5
    )
    by = {r["size"]: r for r in rows}
    assert by[2]["a"] == pytest.approx(1 / 3, abs=1e-4)  # only row 0 (row 1 -> 3 or 1, row 2 -> 1)
    # row 1 falls back to 5, the target's token; row 2 keeps 4
    assert by[5]["a"] == pytest.approx(1.0, abs=1e-4)
    assert by[6]["a"] == pytest.approx(2 / 3, abs=1e-4)  # whole vocabulary: row 1 proposes 2, a miss
    assert by[2]["coverage"] == pytest.approx(80 / 100) and by[6]["coverage"] == 1.0
    for r in rows:
        assert r["tokens_per_time"] == pytest.approx(
            expected_tokens(r["a"], 5) / (2.0 + 5 * r["c"]), abs=1e-4
        )


def test_columns_of_a_drafter_with_its_own_reduced_vocabulary_are_its_token_ids():
    counts = Counter({40: 9, 10: 5, 30: 1})
    logits = torch.tensor([[0.0, 2.0, 1.0]])  # columns = tokens 10, 30, 40: top-1 30; among {40, 10}: 40
    rows = vocab_table(
        _Validation(logits, torch.tensor([40])),
        _Drafter(torch.tensor([10, 30, 40])),
        counts,
        [],
        [2, 0],
        {2: 0.01, 0: 0.02},
        c_verify=2.0,
        gamma=3,
    )
    assert [r["a"] for r in rows] == [1.0, 0.0] and [r["size"] for r in rows] == [2, 3]


def test_chain_model_and_frequency_order():
    assert expected_tokens(0.0, 5) == 1.0 and expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    counts = Counter({7: 3, 8: 2, 9: 1})
    assert frequent_tokens_from_counts(counts, [1], 3).tolist() == [
        1,
        7,
        8,
    ]  # special ids first, then by count
