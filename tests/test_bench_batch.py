"""``hf-specdec bench --batch-size B``: batches, left padding, per-row tokens, the rows-one-at-a-time fallback, batched
``ar`` against each row alone, and batch 1 unchanged. Tiny random-weight models and a byte-level tokenizer, no
timing asserted."""

import json

import pytest
import torch

from hf_specdec.bench.harness import batches, run_bench
from hf_specdec.bench.methods import (
    AutoRegressive,
    BenchContext,
    HFPromptLookup,
    get_method,
    greedy_new_tokens,
    run_row,
)
from hf_specdec.core.batch_io import left_pad, split_rows, unpad_rows
from hf_specdec.core.stats import DecodeStats

from .conftest import tiny_llama

PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11], [12, 13, 14, 15, 16, 12, 13]]


def byte_tokenizer():
    """A byte-level BPE tokenizer without merges (256 byte tokens + EOS), built offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<|endoftext|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


@pytest.fixture(scope="module")
def tiny_bytes_checkpoint(tmp_path_factory):
    """A random tiny Llama over the byte tokenizer, saved like any local HF checkpoint (no pad token: the bench pads
    with EOS)."""
    path = tmp_path_factory.mktemp("tiny-bytes")
    tokenizer = byte_tokenizer()
    model = tiny_llama(
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=None,
        max_position_embeddings=2048,
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def method(cls, model, pad_id=0):
    runner = cls()
    tokenizer = type("Tok", (), {"pad_token_id": pad_id, "eos_token_id": 2})()
    runner.setup(BenchContext(model, tokenizer, "fp32"))
    return runner


def test_batches_group_prompts_with_a_short_last_batch():
    assert batches(list(range(10)), 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert batches(list(range(3)), 1) == [[0], [1], [2]] and batches([0, 1], 8) == [[0, 1]]


def test_left_pad_and_unpad_round_trip():
    ids, mask = left_pad(PROMPTS, pad_id=0)
    assert ids.shape == mask.shape == (3, 10)
    assert ids[1].tolist() == [0] * 7 + [9, 10, 11] and mask[1].tolist() == [0] * 7 + [1] * 3
    assert [r[0].tolist() for r in unpad_rows(ids, mask)] == PROMPTS


def test_split_rows_strips_the_prompt_and_cuts_after_the_first_eos():
    out = torch.tensor([[0, 4, 4, 30, 2, 0, 0], [4, 4, 4, 31, 32, 33, 34], [0, 0, 4, 2, 2, 0, 0]])
    assert split_rows(out, 3, [2]) == [[30, 2], [31, 32, 33, 34], [2]]
    assert split_rows(out, 3, []) == [[30, 2, 0, 0], [31, 32, 33, 34], [2, 2, 0, 0]]


def test_rows_one_at_a_time_are_batch_1_generate():
    """The default ``generate_rows`` (what ``hf-pld`` uses at B > 1): each row's tokens are the method's batch-1
    output on the row alone, and the stats are the rows' stats summed."""
    model = tiny_llama()
    runner = method(HFPromptLookup, model)
    ids, mask = left_pad(PROMPTS, pad_id=0)
    rows, stats = runner.generate_rows(ids, mask, 10)
    alone = [run_row(runner, model, torch.tensor([p]), 10) for p in PROMPTS]
    assert rows == [tokens for tokens, _ in alone]
    assert rows == [
        greedy_new_tokens(model, torch.tensor([p]), 10, prompt_lookup_num_tokens=10).tolist() for p in PROMPTS
    ]
    for key in ("new_tokens", "target_forwards", "drafted", "accepted"):
        assert getattr(stats, key) == sum(getattr(s, key) for _, s in alone)
    assert not HFPromptLookup.batchable and runner.generate_batch(ids, mask, 10)[0] == rows


def test_batched_ar_equals_each_row_alone():
    """Plain batched greedy ``generate`` (left padding, attention mask) on the tiny model gives each row's batch-1
    tokens, a row that ends early included (cut after its EOS; the batch pads it)."""
    model = tiny_llama()
    free = [greedy_new_tokens(model, torch.tensor([p]), 12, eos_token_id=None).tolist() for p in PROMPTS]
    eos = free[1][4]  # the 5th token of row 1 becomes EOS: row 1 stops there while the others go on
    model.generation_config.eos_token_id = eos
    alone = [greedy_new_tokens(model, torch.tensor([p]), 12).tolist() for p in PROMPTS]
    assert len(alone[1]) == free[1].index(eos) + 1 <= 5 and max(len(r) for r in alone) == 12
    runner = method(AutoRegressive, model)
    ids, mask = left_pad(PROMPTS, pad_id=0)
    rows, stats = runner.generate_batch(ids, mask, 12)
    assert AutoRegressive.batchable and rows == alone
    assert isinstance(stats, DecodeStats) and stats.new_tokens == stats.target_forwards == sum(map(len, rows))


@pytest.mark.parametrize("batch_size", [1, 3])
def test_bench_batch_size(tiny_bytes_checkpoint, tmp_path, batch_size):
    """B = 1 keeps the records of the per-prompt bench (config gains ``batch_size``); B = 3 groups 4 prompts as
    3 + 1, runs ``ar`` batched and ``hf-pld`` row by row, and checks every row against ``ar`` on the row alone."""
    out = tmp_path / "bench"
    results = run_bench(
        ["ar", "hf-pld"],
        ["mt-bench"],
        limit=4,
        max_new_tokens=6,
        model=str(tiny_bytes_checkpoint),
        out=out,
        batch_size=batch_size,
    )
    saved = json.loads((out / "results.json").read_text())
    assert saved["runs"] == results["runs"]
    report = (out / "report.md").read_text()
    assert saved["config"]["batch_size"] == batch_size and f"batch size {batch_size}," in report
    run_keys = {
        "method", "task", "n_prompts", "new_tokens", "seconds", "tokens_per_s", "speedup", "tau", "alpha",
        "draft_share", "verify_share", "lossless", "identical", "ties", "failures", "split",
    }  # fmt: skip
    for r in saved["runs"]:  # the per-step split: target + drafter + overhead is the wall time per step
        s = r["split"]
        per_step = r["seconds"] / s["steps"] * 1000
        assert abs(s["target_ms"] + s["drafter_ms"] + s["overhead_ms"] - per_step) < 0.01 * per_step + 0.01
        assert s["one_token_forward_ms"] > 0 and s["target_fwd"] > 0
        assert (s.get("syncs_per_step") is not None) == (batch_size == 1)
    assert "| host syncs/step |" in report
    verdict = {"identical", "lossless", "first_diff", "gap", "reason"}
    if batch_size == 1:
        assert set(saved) == {"command", "config", "runs", "drafter_cost", "sizing_costs", "per_prompt"}
        # nothing here sizes its drafts by measured costs (`hf-pld` is transformers' fixed-length lookup)
        assert saved["sizing_costs"] == {"verify_curve": {}, "drafter_c": {}} and "sized by" not in report
        assert "check_rows" not in saved["config"]
        assert all(set(r) == run_keys for r in saved["runs"])
        record = {"id", *DecodeStats().to_dict(), *verdict}
        assert all(set(r) == record for rs in saved["per_prompt"].values() for r in rs)
        assert "| task | method | speedup |" in report and "rows one at a time" not in report
    else:
        assert saved["config"]["check_rows"] is True
        ar, pld = saved["runs"]
        assert set(ar) == run_keys | {"batch_size", "batched", "batched_forwards", "row_alone_identical"}
        assert ar["batched"] and not pld["batched"] and ar["n_prompts"] == pld["n_prompts"] == 4
        assert ar["row_alone_identical"] == pld["row_alone_identical"] == 4  # batched ar == each row alone
        assert ar["tau"] == 1.0 and ar["new_tokens"] == pld["new_tokens"]
        assert [len(b["ids"]) for b in saved["per_batch"]["ar/mt-bench"]] == [3, 1]
        assert [r["batch"] for r in saved["per_prompt"]["hf-pld/mt-bench"]] == [0, 0, 0, 1]
        assert "| mt-bench | hf-pld | no: rows one at a time |" in report
        assert "batched `ar` == `ar` on the row alone: mt-bench 4/4 rows" in report
    assert all(r["lossless"] for r in saved["runs"])


@pytest.mark.parametrize("name", ["glide", "vanilla-draft", "edd"])
def test_chain_drafter_methods_run_their_batch_in_one_call(name, tmp_path):
    """``glide`` / ``vanilla-draft`` / ``edd`` take the batch in one ``generate(assistant_model=...)`` call (the
    batched tree loop): each row equals ``ar`` on the row alone and the stats are the loop's (drafts counted); a batch
    of one row runs transformers' assisted loop (rows one at a time, stats inferred)."""
    from hf_specdec.modeling import EddConfig, EddForCausalLM, GlideConfig, GlideForCausalLM

    torch.manual_seed(0)
    if name == "edd":
        model = tiny_llama(num_hidden_layers=4)
        drafter = EddForCausalLM(EddConfig.for_target(model))
        drafter.init_from_target(model)
        options = {"edd": str(tmp_path)}
    else:
        model = tiny_llama()
        drafter = GlideForCausalLM(GlideConfig.for_target(model, cross_attention=name == "glide"))
        drafter.attach_target(model).init_from_target(model)
        options = {"glide" if name == "glide" else "vanilla": str(tmp_path)}
    drafter.save_pretrained(tmp_path)
    runner = get_method(name)()
    tokenizer = type("Tok", (), {"pad_token_id": 0, "eos_token_id": 2})()
    runner.setup(
        BenchContext(model, tokenizer, "fp32", {**options, "gamma": "3", "chain_cost": "0"})
    )  # gamma drafts
    alone = [greedy_new_tokens(model, torch.tensor([p]), 10).tolist() for p in PROMPTS]
    ids, mask = left_pad(PROMPTS, pad_id=0)
    rows, stats = runner.generate_batch(ids, mask, 10)
    assert runner.batchable and rows == alone
    assert stats.batched_forwards > 0 and stats.drafted > 0
    assert stats.target_forwards == sum(s["rows"] for s in stats.steps)
    rows, stats = runner.generate_batch(ids[:1], mask[:1], 10)
    assert rows == alone[:1] and stats.batched_forwards == 0 and stats.target_forwards > 0


def test_bench_samples_at_a_temperature_seeded_per_prompt(tiny_bytes_checkpoint, tmp_path):
    """--temperature T: every method samples (so outputs differ from greedy), the same seed gives the same samples,
    losslessness is left to the distribution tests (None, reported as n/a), and a batch is refused."""
    from hf_specdec.errors import SpecDecError

    def bench(out, temperature=None, seed=0):
        return run_bench(
            ["ar", "tree-lookup"], ["mt-bench"], limit=2, max_new_tokens=8, model=str(tiny_bytes_checkpoint),
            out=tmp_path / out, temperature=temperature, seed=seed,
        )  # fmt: skip

    greedy, hot, again = bench("greedy"), bench("hot", 1.5), bench("again", 1.5)
    assert all(r["lossless"] is None and r["identical"] is None for r in hot["runs"])
    assert all(r["lossless"] is True for r in greedy["runs"])
    assert hot["config"]["decoding"] == "sampling, temperature 1.5, seed 0"
    assert "n/a (sampled)" in (tmp_path / "hot" / "report.md").read_text()
    figures = [(r["new_tokens"], r["tau"]) for r in hot["runs"]]
    assert figures == [(r["new_tokens"], r["tau"]) for r in again["runs"]]  # seeded: the same samples
    # the generations really sample: the bench's generate call under sampling() differs from greedy
    from transformers import AutoModelForCausalLM

    from hf_specdec.bench.methods import greedy_new_tokens, sampling

    model = AutoModelForCausalLM.from_pretrained(tiny_bytes_checkpoint)
    prompt = torch.tensor([[5, 6, 7, 8]])
    greedy_tokens = greedy_new_tokens(model, prompt, 8)
    with sampling(1.5):
        sampled = []
        for seed in range(3):
            torch.manual_seed(seed)
            sampled.append(greedy_new_tokens(model, prompt, 8))
    assert any(not torch.equal(t, greedy_tokens) for t in sampled)
    with pytest.raises(SpecDecError, match="batch-size 1"):
        run_bench(["ar"], ["mt-bench"], limit=2, model=str(tiny_bytes_checkpoint), out=tmp_path / "b",
                  temperature=1.0, batch_size=2)  # fmt: skip
