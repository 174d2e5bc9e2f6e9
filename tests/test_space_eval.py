"""``trainers/space/eval.mask_top1``: the SAR masks' held-out top-1 (each mask scored against the right answer
token; one forward per row computes each span's SAR view)."""

import json

import pytest
import torch
from hf_specdec.trainers.space.collator import mask_starts, sar_sample
from hf_specdec.trainers.space.eval import main, mask_top1, span_inputs

from hf_specdec.errors import SpecDecError

from .conftest import tiny_llama
from .test_space_adapter import _base_and_adapter

MASK = 96


def _row(n_prompt: int, n_answer: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, MASK, (n_prompt + n_answer,), generator=g).tolist()
    return {"input_ids": ids, "labels": [-100] * n_prompt + ids[n_prompt:]}


class Oracle(torch.nn.Module):
    """Knows the one true row: at position p it puts its logit on the row's token ``p + 1 + shift``."""

    def __init__(self, ids: list[int], shift: int = 0) -> None:
        super().__init__()
        self.ids, self.shift, self.anchor = ids, shift, torch.nn.Parameter(torch.zeros(()))
        self.config, self.dtype = tiny_llama().config, torch.float32  # a full-attention model's masks

    @property
    def device(self) -> torch.device:
        return self.anchor.device

    def forward(self, input_ids, position_ids, attention_mask):
        logits = torch.zeros(*input_ids.shape, MASK + 1)
        for j, p in enumerate(position_ids[0].tolist()):
            if p + 1 + self.shift < len(self.ids):
                logits[:, j, self.ids[p + 1 + self.shift]] = 1.0
        return type("Out", (), {"logits": logits})


def test_each_mask_is_scored_against_the_token_it_predicts():
    row = _row(5, 40, seed=1)
    assert len(set(row["input_ids"])) > 30  # distinct enough that a shifted guess mostly misses
    top1, spans = mask_top1(Oracle(row["input_ids"]), [row], k=3, mask_token_id=MASK, stride=4)
    # starts 5, 9, ..., 41: 41 + 3 is the last answer token
    assert top1 == [1.0, 1.0, 1.0, 1.0] and spans == 10
    shifted, _ = mask_top1(Oracle(row["input_ids"], shift=1), [row], k=3, mask_token_id=MASK, stride=4)
    assert max(shifted) < 0.5


def test_one_forward_per_row_equals_each_sar_view_fed_alone():
    """The groups of masks appended to a row (``span_inputs``) compute eq. 2's SAR views (``sar_sample``), each
    fed alone."""
    from hf_specdec.core.sliding_window import LayerMasks

    model, k = tiny_llama(vocab_size=MASK + 1), 2
    row = _row(7, 30, seed=3)
    starts = mask_starts(row["labels"], k)[::3]
    allowed, positions = span_inputs(len(row["input_ids"]), starts, k, torch.device("cpu"))
    fed = torch.tensor([row["input_ids"] + [MASK] * (k * len(starts))])
    mask = LayerMasks(model)(allowed[None, None], positions[None], positions[None])
    with torch.no_grad():
        together = model(input_ids=fed, position_ids=positions[None], attention_mask=mask).logits[0]
        for s, m in enumerate(starts):
            ids, _ = sar_sample(row["input_ids"], row["labels"], k, MASK, m)
            alone = model(torch.tensor([ids])).logits[0]
            # the AR prediction, then the group's masks
            torch.testing.assert_close(together[m - 1], alone[m - 1], rtol=1e-4, atol=1e-5)
            group = together[len(row["input_ids"]) + s * k :][:k]
            torch.testing.assert_close(group, alone[m : m + k], rtol=1e-4, atol=1e-5)


def test_add_to_card_writes_the_figures_into_a_saved_adapters_card(tmp_path):
    """``python -m hf_specdec.trainers.space.eval --add-to-card``: the figures it prints land in the folder's card
    (JSON and README), with the held-out text and the command; a folder without a SPACE card is refused before any
    model loads."""
    base, adapter, _ = _base_and_adapter(tmp_path)
    with pytest.raises(SpecDecError, match="has no space_training.json"):
        main(["--model", str(base), "--add-to-card"])
    before = (adapter / "README.md").read_text()
    assert "held-out top-1" not in before
    main(
        [
            "--model",
            str(adapter),
            "--base",
            str(base),
            "--samples",
            "2",
            "--max-length",
            "64",
            "--add-to-card",
        ]
    )
    info = json.loads((adapter / "space_training.json").read_text())
    scores = info["mask_top1"]
    assert len(scores["masks"]) == 3 and scores["samples"] == 2 and scores["spans"] > 0
    assert scores["command"].endswith("--add-to-card") and "ShareGPT" in scores["data"]
    card = (adapter / "README.md").read_text()
    assert f"{scores['ar']:.3f} / " in card and "of 2 first turns" in card and "Held-out top-1 by:" in card
    assert info["k"] == 3 and card.split("| held-out")[0] in before  # the rest of the card is kept
