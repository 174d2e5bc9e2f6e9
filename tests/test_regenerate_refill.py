"""``corpus --regenerate --method ar-refill`` (trainers/corpus/refill.py): greedy answers with a refilled batch
give every prompt its own plain greedy output, and a greedy fp32 corpus may change its method on resume."""

from __future__ import annotations

import json

import pytest
import torch
from hf_specdec.trainers.corpus.refill import check_plain_greedy, refill_greedy
from hf_specdec.trainers.corpus.store import read_shard

from hf_specdec.core.ragged_cache import RaggedCache
from hf_specdec.core.refill import prefill_groups
from hf_specdec.errors import SpecDecError

from .conftest import tiny_llama
from .test_regenerate import regenerate, tiny_target  # noqa: F401 (the fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


def alone(model, prompt: list[int], max_new_tokens: int, eos: int | None) -> list[int]:
    """The prompt's plain greedy ``generate`` output, alone in its batch, cut after its first EOS."""
    out = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
    )[0, len(prompt) :].tolist()
    return out[: out.index(eos) + 1] if eos in out else out


def test_every_row_is_its_own_greedy_output_through_refills_and_repacks(monkeypatch):
    model = tiny_llama()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 97, (n,), generator=g).tolist() for n in (3, 5, 9, 14, 20, 31, 40)]
    free = [alone(model, p, 12, None) for p in prompts]
    eos = free[2][3]  # a token row 2 writes early: rows end at different steps
    expected = [alone(model, p, 12, eos) for p in prompts]
    assert sorted(map(len, expected))[0] < 12 == max(map(len, expected))
    calls = {"append_rows": 0, "repack": 0}
    for name in calls:
        original = getattr(RaggedCache, name)

        def counted(self, *args, _name=name, _original=original):
            calls[_name] += 1
            return _original(self, *args)

        monkeypatch.setattr(RaggedCache, name, counted)
    got = refill_greedy(model, prompts, 12, [eos], pad_id=0, batch_size=3, refill_at=1)
    assert got == expected
    # it refilled a running batch, and repacked its holes
    assert calls["append_rows"] >= 2 and calls["repack"] >= 1


def test_a_generation_config_that_changes_greedy_is_refused():
    model = tiny_llama()
    check_plain_greedy(model)
    model.generation_config.repetition_penalty = 1.3
    with pytest.raises(SpecDecError, match="repetition_penalty.*--method ar"):
        refill_greedy(model, [[5, 6, 7]], 4, [2], pad_id=0, batch_size=2)


def test_ar_refill_writes_what_ar_writes_and_a_greedy_fp32_run_may_switch(tiny_target, tmp_path):  # noqa: F811
    ar, refill = tmp_path / "ar", tmp_path / "refill"
    regenerate(ar, tiny_target, "--limit", "3", "--splits", "train", "--method", "ar", "--batch-size", "2")
    regenerate(
        refill, tiny_target, "--limit", "3", "--splits", "train", "--method", "ar-refill", "--batch-size", "2"
    )
    shards = sorted((ar / "shards").glob("train-*.jsonl.xz"))
    assert [read_shard(p) for p in shards] == [read_shard(refill / "shards" / p.name) for p in shards]
    # resume the ar run with ar-refill at another batch size: allowed in greedy fp32, recorded per run
    text = read_shard(shards[1])
    shards[1].unlink()
    regenerate(
        ar, tiny_target, "--limit", "3", "--splits", "train", "--method", "ar-refill", "--batch-size", "4"
    )
    assert read_shard(shards[1]) == text
    runs = json.loads((ar / "regenerate.json").read_text())["runs"]
    assert [(r["method"], r["batch_size"], r["shards"]) for r in runs] == [
        ("ar", 2, [p.name for p in shards]),
        ("ar-refill", 4, [shards[1].name]),
    ]


def test_sampling_keeps_its_method_and_batch_size(tiny_target, tmp_path):  # noqa: F811
    regenerate(tmp_path, tiny_target, "--limit", "1", "--splits", "train", "--sample", "--batch-size", "2")
    from hf_specdec.trainers.corpus.regenerate import regenerate as run

    from hf_specdec.target import load_target

    model, tok = load_target(str(tiny_target), "fp32")
    with pytest.raises(SpecDecError, match="other settings.*batch_size"):
        run(model, tok, tmp_path, splits=["train"], limit=1, sample=True, batch_size=3, shard_size=1)
    with pytest.raises(SpecDecError, match="ar-refill decodes greedy only"):
        run(model, tok, tmp_path, splits=["train"], limit=1, sample=True, method="ar-refill", shard_size=1)


@pytest.mark.real
def test_the_default_target_refilled_writes_its_plain_greedy_answers(real_target):
    """fp32: five ShareGPT-like prompts of different lengths, three rows at a time, each answer equal to the prompt's
    own plain greedy ``generate`` (docs/corpus.md compares whole shards the same way)."""
    from hf_specdec.trainers.corpus.regenerate import prompt_ids

    from hf_specdec.core.generate_io import eos_token_ids

    model, tok = real_target
    questions = [
        "Hi!",
        "Name three colors.",
        "Write a haiku about the sea.",
        "What is 2 + 2? Explain.",
        "Sort [3, 1, 2].",
    ]
    prompts = sorted((prompt_ids(tok, [{"role": "user", "content": q}]) for q in questions), key=len)
    eos = eos_token_ids(model.generation_config)
    expected = [alone(model, p, 24, eos[0]) for p in prompts]
    assert refill_greedy(model, prompts, 24, eos, tok.pad_token_id, batch_size=3, refill_at=1) == expected


def test_prefill_groups_keep_padding_under_the_bound():
    lengths = [850, 100, 120, 400, 130, 410, 900, 105]
    groups = prefill_groups([[1] * n for n in lengths], waste=0.25)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        sizes = [lengths[i] for i in g]
        assert sizes == sorted(sizes) and len(g) * max(sizes) <= 1.25 * sum(sizes)
    assert [len(g) for g in groups] == [4, 2, 2]  # 100-130, 400-410, 850-900: one forward each
