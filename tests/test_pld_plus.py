"""PLD+ (arXiv:2412.01447): ranking (Fig. 2), the candidate generator's edge cases (no occurrence, EOS in a draft,
max_new_tokens at a draft boundary), losslessness (greedy on Llama / GPT-2, sdpa / eager; sampling distribution),
the incremental hidden-state store, the selected-head attention capture, attribution, heads files and errors."""

from __future__ import annotations

import importlib
import json
from types import SimpleNamespace

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

import hf_specdec
from hf_specdec.core.stats import DecodeStats
from hf_specdec.core.verify_cost import CostCurve
from hf_specdec.errors import SpecDecError
from hf_specdec.hf_compat import attn_implementation
from hf_specdec.pld_plus.attention_capture import capture_selected_attention
from hf_specdec.pld_plus.attribution import CopiedSpan
from hf_specdec.pld_plus.candidate_generator import PLDPlusCandidateGenerator
from hf_specdec.pld_plus.draft_length import DraftLength
from hf_specdec.pld_plus.induction_heads import (
    DEFAULT_HEADS_FILE,
    copy_sources,
    find_induction_heads,
    load_heads_doc,
    rank_heads,
    read_heads_file,
    write_heads_file,
)
from hf_specdec.pld_plus.ranking import occurrences, rank_by_attention, rank_by_hidden
from hf_specdec.pld_plus.tune import hf_pld_rank

from .conftest import CollectStreamer, tiny_gpt2, tiny_llama

# `hf_specdec.pld_plus` is the custom_generate function; the module that defines it is reached through importlib
pld_module = importlib.import_module("hf_specdec.pld_plus.generate")


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def generators(monkeypatch):
    """Every PLDPlusCandidateGenerator that pld_plus builds during the test."""
    made = []

    class Recording(PLDPlusCandidateGenerator):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(pld_module, "PLDPlusCandidateGenerator", Recording)
    return made


def _greedy(model, prompt, n, **kwargs):
    return model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        **kwargs,
    )


# adaptive K with a fixed cheap verification cost: whether a tiny model drafts must not depend on timing
CHEAP = CostCurve.linear(0.02)
# PLD+ that drafts whenever there is an occurrence (no score floor, cheap verification)
FORCED = dict(custom_generate=hf_specdec.pld_plus, pld_min_score=-1, pld_cost=CHEAP)


def _cyclic_prompt(seed: int, vocab: int = 32, length: int = 12) -> torch.Tensor:
    torch.manual_seed(seed)
    base = torch.randint(3, vocab, (length,))
    return torch.cat([base, base[: length // 2]])[None]


def _heads_file(tmp_path, model, heads=((1, 0), (0, 3), (1, 2))):
    entries = [{"layer": layer, "head": head, "score": 0.5} for layer, head in heads]
    return write_heads_file(tmp_path / "heads.json", model, entries, task="test")


# ------------------------------------------------------------------------------------------------- ranking
def test_fig2_semantic_ranking_beats_first_ngram_match():
    """PLD+ (arXiv:2412.01447) Fig. 2: the last token "\\n" (10) follows "7" twice; n-gram lookup takes the first "7 \\n" and
    drafts the wrong continuation, PLD+ takes the occurrence whose preceding hidden state matches the current one."""
    ids = torch.tensor([5, 7, 10, 20, 21, 22, 6, 7, 10, 30, 31, 32, 8, 9, 7, 10])
    right = 8  # the second "\n": its continuation 30 31 32 is what the output needs
    assert occurrences(ids).tolist() == [2, 8]
    assert hf_pld_rank(2)(ids) == 2  # transformers' prompt lookup: first (leftmost) 2-gram match
    torch.manual_seed(0)
    unit = torch.nn.functional.normalize(torch.randn(ids.shape[0] - 1, 16), dim=-1)
    unit[right - 1] = torch.nn.functional.normalize(
        unit[-1] + 0.1 * unit[right - 1], dim=-1
    )  # H_{j-1} ~ H_{t-1}
    j, score = rank_by_hidden(unit, occurrences(ids))
    assert j == right and score > 0.9
    rows = torch.full((3, ids.shape[0] - 1), 0.01)
    rows[1, right] = 0.6  # one induction head attends from x_{t-1} to the right occurrence
    rows[2, 2] = 0.3
    assert rank_by_attention(rows, occurrences(ids)) == (right, pytest.approx(0.6))


def _fake_step(gen: PLDPlusCandidateGenerator, ids: torch.Tensor, unit: torch.Tensor | None = None):
    """Feed the generator a prefill over ids[:-1] (hidden variant, layer 0) and ask for candidates."""
    n = ids.shape[0]
    states = unit if unit is not None else torch.randn(n - 1, gen._states.shape[1])
    outputs = SimpleNamespace(hidden_states=(states[None],))
    return gen.get_candidates(ids[None], model_outputs=outputs)[0][0, n:].tolist()


def _hidden_gen(k: int = 5, max_length: int = 100, eos=None, min_score=-1.0):
    return PLDPlusCandidateGenerator(
        "hidden",
        num_draft_tokens=k,
        max_length=max_length,
        hidden_size=8,
        layer=0,
        eos_token_id=eos,
        min_score=min_score,
    )


def test_no_occurrence_means_no_draft():
    assert _fake_step(_hidden_gen(), torch.tensor([3, 4, 5, 6, 7])) == []  # last token never seen before
    assert _fake_step(_hidden_gen(), torch.tensor([7, 4, 5, 6, 7])) == []  # only at j = 0: no H_{j-1}
    gen = _hidden_gen()
    assert _fake_step(gen, torch.tensor([3, 7, 4, 5, 6, 7])) == [
        4,
        5,
        6,
        7,
    ]  # the continuation, up to the end
    assert gen.drafted_steps == 1


def test_low_score_means_no_draft():
    ids = torch.tensor([3, 7, 4, 5, 6, 7])
    unit = torch.nn.functional.normalize(torch.randn(5, 8), dim=-1)
    unit[0] = -unit[-1]  # cos(H_{j-1}, H_{t-1}) = -1
    assert _fake_step(_hidden_gen(min_score=0.0), ids, unit) == []
    assert _fake_step(_hidden_gen(min_score=-1.5), ids, unit) == [4, 5, 6, 7]


def test_eos_inside_a_draft_ends_it():
    ids = torch.tensor([3, 7, 4, 2, 6, 8, 9, 7])
    assert _fake_step(_hidden_gen(eos=torch.tensor([2])), ids) == [4, 2]
    assert _fake_step(_hidden_gen(eos=None), ids) == [4, 2, 6, 8, 9]


def test_fixed_draft_length_is_k_within_budget():
    lengths = DraftLength(5)
    assert lengths.for_source(3) == 5 and lengths.for_source(3, budget=2) == 2


def test_adaptive_draft_length_follows_cost_and_acceptance():
    from hf_specdec.core.verify_cost import CostCurve

    def best_k(
        h: float, a: float, slope: float, cap: int = 64
    ) -> int:  # brute force of argmax E(K) / c(K + 1)
        gains = {k: (1 + sum(h * a**i for i in range(k))) / (1 + slope * k) for k in range(cap + 1)}
        return max(gains, key=gains.get)

    cheap, dear = CostCurve.linear(0.02), CostCurve.linear(0.15)
    for cost, slope in ((cheap, 0.02), (dear, 0.15)):
        for h, a in ((0.6, 0.6), (0.4, 0.9), (0.9, 0.95)):
            lengths = DraftLength(64, cost, h, 0.9, a, weight=1e9)  # priors frozen
            assert lengths.for_source(7) == best_k(h, a, slope)
    assert DraftLength(64, cheap, 0.6, 0.9, 0.85).for_source(7) > DraftLength(
        64, dear, 0.6, 0.9, 0.85
    ).for_source(7)  # a cheaper verification drafts more
    assert DraftLength(64, dear, 0.05, 0.9, 0.85).for_source(7) == 0  # not worth a draft: plain step

    lengths = DraftLength(64, dear, 0.4, 0.9, 0.85, weight=4)
    fresh = lengths.for_source(10)
    lengths.update(11, drafted=fresh, accepted=fresh)  # fully accepted: the copy continues at 11 + fresh
    assert lengths.acceptance("continue") > 0.85  # fresh - 1 later tokens accepted, none rejected
    running = lengths.for_source(11 + fresh)
    assert running > lengths.for_source(12) >= fresh  # only the continuing occurrence counts as a run
    # fresh drafts keep being rejected at once: their hit rate sinks, drafts shrink to none; the continuation rate
    # (never tried) stays where it was
    cont = lengths.acceptance("continue")
    for _ in range(40):
        k = lengths.for_source(3)
        lengths.update(4, drafted=k, accepted=0)
    assert lengths.acceptance("fresh") < 0.15 and lengths.for_source(3) == 0
    assert lengths.acceptance("continue") == cont
    # a draft accepted for 2 of 6 tokens: one hit, one later token accepted, one rejected
    lengths = DraftLength(64, dear, 0.5, 0.9, 0.5, weight=1e-9)
    lengths.for_source(3)
    lengths.update(4, drafted=6, accepted=2)
    assert lengths.acceptance("fresh") == pytest.approx(1.0) and lengths.acceptance(
        "continue"
    ) == pytest.approx(0.5)
    lengths.update(None, drafted=0, accepted=0)


def test_a_skipped_copy_is_scored_so_a_sunk_hit_rate_can_rise():
    """Where verification is dear and the hit rate starts (or sank) low, the cost rule drafts nothing; the copy it
    skipped is still scored against the token the target emitted, so on text that repeats drafting comes back (it
    never did: no draft, no evidence; Gemma-3-270M's PLD+(h) drafted 9 tokens per prompt on mt-bench and stopped)."""
    from hf_specdec.core.verify_cost import CostCurve

    gen = PLDPlusCandidateGenerator(
        "hidden", 8, 200, hidden_size=8, layer=0, cost=CostCurve.linear(0.15), priors=(0.05, 0.9, 0.85)
    )
    ids = torch.tensor([3] + [4, 5, 6, 7] * 2)  # a cycle: every copy's first token is the target's next token
    states = torch.randn(len(ids) - 1, 8)
    drafted_at = None
    for step in range(12):
        out = gen.get_candidates(ids[None], model_outputs=SimpleNamespace(hidden_states=(states[None],)))[0]
        if out.shape[1] > len(ids):
            drafted_at = step
            break
        gen.update_candidate_strategy(ids[None], None, 0)
        ids = torch.cat([ids, ids[-4:-3]])  # the target's token: the cycle's next
        states = torch.randn(1, 8)  # the one new verified position
    assert drafted_at is not None and drafted_at > 0, drafted_at  # skipped first, drafted again after hits
    assert gen.lengths.acceptance("fresh") > 0.15


def test_draft_and_bonus_token_fit_max_length():
    ids = torch.tensor([3, 7, 4, 5, 6, 8, 9, 1, 7])  # 9 tokens
    assert _fake_step(_hidden_gen(k=5, max_length=13), ids) == [4, 5, 6]  # 9 + 3 drafted + 1 bonus = 13
    assert _fake_step(_hidden_gen(k=5, max_length=10), ids) == []  # only the bonus token fits


# ------------------------------------------------------------------------------------------ end to end
@pytest.mark.parametrize(
    "make,impl,variant",
    [
        (tiny_llama, "sdpa", "hidden"),
        (tiny_llama, "sdpa", "attention"),
        (tiny_llama, "eager", "attention"),
        (tiny_gpt2, "sdpa", "hidden"),
        (tiny_gpt2, "sdpa", "attention"),
    ],
)
def test_greedy_is_token_identical_and_drafts(make, impl, variant, generators, tmp_path):
    model = make(vocab_size=32)
    model.set_attn_implementation(impl)
    heads = _heads_file(tmp_path, model)
    accepted, stats = 0, DecodeStats()
    for seed in range(3):
        prompt = _cyclic_prompt(seed)
        ref = _greedy(model, prompt, 30)
        out = _greedy(
            model,
            prompt,
            30,
            **FORCED,
            pld_variant=variant,
            pld_heads=heads,
            stats=stats,
        )
        assert torch.equal(out, ref), f"seed {seed}"
        accepted += sum(s.length for s in generators[-1].spans)
    assert accepted > 0  # drafts were accepted, so the verification path was exercised
    assert stats.accepted > 0  # ... in the tree core's loop, which filled the stats
    assert model.config._attn_implementation == impl  # restored after PLD+(a)


class Script(LogitsProcessor):
    """Turns any model into a target whose greedy output is ``script`` (everything else gets -inf): a target that
    copies from its prompt, so that drafts are accepted where a test needs them."""

    def __init__(self, start: int, script: list[int]):
        self.start, self.script = start, script

    def __call__(self, input_ids, scores):
        forced = torch.full_like(scores, -float("inf"))
        forced[:, self.script[input_ids.shape[1] - self.start]] = 0.0
        return forced


SCRIPT_PROMPT = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13, 2, 14, 15, 16, 5]])  # 2 = EOS


@pytest.mark.parametrize("max_new", [1, 2, 3, 5, 9, 12])
def test_max_new_tokens_at_a_draft_boundary(max_new, generators):
    """The scripted target copies 6..13 after "5": drafts of K=4 are accepted, and the budget ends anywhere."""
    model = tiny_llama(vocab_size=32, eos_token_id=None)
    script = LogitsProcessorList(
        [Script(SCRIPT_PROMPT.shape[1], [6, 7, 8, 9, 10, 11, 12, 13, 3, 4, 3, 4, 3])]
    )
    kwargs = dict(max_new_tokens=max_new, do_sample=False, logits_processor=script)
    ref = model.generate(SCRIPT_PROMPT, **kwargs)
    out = model.generate(
        SCRIPT_PROMPT, **kwargs, custom_generate=hf_specdec.pld_plus, pld_num_tokens=4, pld_min_score=-1
    )
    assert out.shape[1] == SCRIPT_PROMPT.shape[1] + max_new
    assert torch.equal(out, ref)
    if max_new >= 3:
        assert generators[-1].spans  # drafts were accepted up to the budget


def test_eos_inside_an_accepted_draft_stops_like_greedy(generators):
    """The scripted target copies "6 7 8 9 10 11 12 13 2(EOS)" from its prompt: PLD+ drafts up to and including the
    EOS (and nothing after it), the loop accepts it and stops exactly where greedy generation stops."""
    model = tiny_llama(vocab_size=32, eos_token_id=2)
    script = LogitsProcessorList(
        [Script(SCRIPT_PROMPT.shape[1], [6, 7, 8, 9, 10, 11, 12, 13, 2, 3, 3, 3, 3])]
    )
    kwargs = dict(max_new_tokens=12, do_sample=False, logits_processor=script)
    ref = model.generate(SCRIPT_PROMPT, **kwargs)
    out = model.generate(
        SCRIPT_PROMPT, **kwargs, custom_generate=hf_specdec.pld_plus, pld_min_score=-1, pld_num_tokens=10
    )
    assert torch.equal(out, ref) and out[0, SCRIPT_PROMPT.shape[1] :].tolist() == [
        6,
        7,
        8,
        9,
        10,
        11,
        12,
        13,
        2,
    ]
    gen = generators[-1]
    assert gen.drafted_tokens == 8  # 7 .. 2: cut after the EOS
    assert gen.spans == [CopiedSpan(SCRIPT_PROMPT.shape[1] + 1, 2, 8)]  # one step copied 7 .. EOS


def test_streamer_gets_the_prompt_then_every_token():
    model = tiny_llama(vocab_size=32, seed=0)
    prompt = _cyclic_prompt(0)
    streamer = CollectStreamer()
    out = _greedy(model, prompt, 20, **FORCED, specdec_streamer=streamer)
    assert streamer.follows(prompt, out)
    assert any(len(c) > 1 for c in streamer.chunks[1:])  # accepted drafts arrive several tokens at a time
    old = CollectStreamer()  # the old keyword still streams, with a warning that names the new one
    with pytest.warns(FutureWarning, match="specdec_streamer"):
        _greedy(model, prompt, 20, **FORCED, pld_streamer=old)
    assert old.chunks == streamer.chunks and old.ended


def test_hidden_store_keeps_only_verified_positions(generators):
    """After generation the incremental store equals a fresh full forward's normalised layer-l states."""
    model = tiny_llama(vocab_size=32, seed=0)
    prompt = _cyclic_prompt(0)
    out = _greedy(model, prompt, 25, **FORCED, pld_layer=1)
    gen = generators[-1]
    assert 0 < sum(s.length for s in gen.spans) < gen.drafted_tokens  # drafts were accepted and rejected
    with torch.no_grad():
        full = model(out, output_hidden_states=True).hidden_states[1][0]
    n = gen._stored  # the last forward is absorbed by a next call that never comes
    assert out.shape[1] - 1 - n <= 1 + gen.num_draft_tokens
    expected = torch.nn.functional.normalize(full[:n], dim=-1)
    torch.testing.assert_close(gen._states[:n], expected, atol=1e-4, rtol=1e-4)


def test_selected_attention_equals_eager_weights():
    model = tiny_llama(seed=2)  # GQA: 4 query heads over 2 KV heads
    ids = torch.randint(3, 97, (1, 15))
    heads = {0: torch.tensor([1, 3]), 1: torch.tensor([0])}
    with torch.no_grad(), capture_selected_attention(model, heads, last_rows=4) as heads_only:
        got = model(ids, output_attentions=True).attentions
    assert heads_only and model.config._attn_implementation == "sdpa"
    got = [a for a in got if a is not None]
    model.set_attn_implementation("eager")
    with torch.no_grad():
        ref = model(ids, output_attentions=True).attentions
    for (layer, hs), weights in zip(heads.items(), got):
        torch.testing.assert_close(weights, ref[layer][:, hs, -4:].float(), atol=1e-5, rtol=1e-4)


def test_attribution_points_to_the_copied_text():
    model = tiny_llama(vocab_size=32, seed=0)
    prompt = _cyclic_prompt(0)
    out = model.generate(
        prompt,
        max_new_tokens=30,
        do_sample=False,
        **FORCED,
        pld_return_attribution=True,
    )
    assert torch.equal(out.sequences, model.generate(prompt, max_new_tokens=30, do_sample=False))
    seq = out.sequences[0]
    assert out.attribution, "no copied span on a repetitive output"
    for span in out.attribution:
        assert span.source_start < span.output_start and span.output_start >= prompt.shape[1] + 1
        assert torch.equal(
            seq[span.output_start : span.output_start + span.length],
            seq[span.source_start : span.source_start + span.length],
        )


def test_sampling_preserves_the_target_distribution(generators):
    """Tokens 1-2 sampled through PLD+ drafts (forced: min_score -1) follow the target's p(x1) p(x2 | x1)."""
    stats = pytest.importorskip("scipy.stats")
    V = 6
    model = tiny_llama(vocab_size=V, seed=3, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)  # a peaked target, so that a wrong rule shows
    prompt = torch.tensor([[1, 4, 2, 5, 1, 3, 0, 2, 4]])
    torch.manual_seed(0)
    n, counts = 600, torch.zeros(V, V)
    for _ in range(n):
        out = model.generate(prompt, max_new_tokens=3, do_sample=True, **FORCED)
        counts[out[0, -3], out[0, -2]] += 1
    assert (
        sum(g.drafted_steps for g in generators) > n // 2
    )  # the second token was mostly verified, not sampled
    with torch.no_grad():
        p1 = torch.softmax(model(prompt).logits[0, -1], -1)
        expected = torch.stack(
            [
                p1[a] * torch.softmax(model(torch.cat([prompt, torch.tensor([[a]])], 1)).logits[0, -1], -1)
                for a in range(V)
            ]
        )
    mask = expected.flatten() * n >= 5
    obs, exp = counts.flatten()[mask], expected.flatten()[mask] * n
    exp = exp * obs.sum() / exp.sum()
    assert stats.chisquare(obs.numpy(), exp.numpy()).pvalue > 1e-3


# -------------------------------------------------------------------------------------------- heads files
def test_copy_sources_prefers_the_longest_suffix():
    seq = torch.tensor([4, 5, 6, 9, 5, 6, 1, 4, 5, 6])
    sources, overlaps = copy_sources(seq, 9)
    assert sources.tolist() == [2] and overlaps.tolist() == [3]  # "4 5 6" at 0..2 beats "9 5 6" at 3..5


def test_find_heads_then_heads_file_round_trips(tmp_path):
    model = tiny_llama(vocab_size=32, seed=0)
    hits, events = find_induction_heads(model, [_cyclic_prompt(s)[0] for s in range(2)], max_new_tokens=12)
    assert hits.shape == (2, 4) and events > 0 and int(hits.sum()) <= events * 8
    ranked = rank_heads(hits, events)
    assert [h["score"] for h in ranked] == sorted((h["score"] for h in ranked), reverse=True)
    path = write_heads_file(tmp_path / "h.json", model, ranked, task="t", events=events)
    doc = load_heads_doc(path)
    assert doc["events"] == events and doc["num_layers"] == 2 and doc["num_heads"] == 4
    pairs = [(h["layer"], h["head"]) for h in ranked]
    assert read_heads_file(path, model=model) == pairs
    assert read_heads_file(path, model=model, top=2) == pairs[:2]


def test_shipped_heads_file_is_valid():
    doc = load_heads_doc(DEFAULT_HEADS_FILE)
    assert doc["num_layers"] == 30 and doc["num_heads"] == 9 and doc["task"] == "summarize"
    assert all(0 <= h["layer"] < 30 and 0 <= h["head"] < 9 for h in doc["heads"])


def test_bad_heads_files_and_layers_give_clear_errors(tmp_path):
    model = tiny_llama(vocab_size=32)
    good = json.loads(_heads_file(tmp_path, model).read_text())
    cases = {
        "missing.json": (None, "does not exist"),
        "not-json.json": ("{oops", "not valid JSON"),
        "format.json": (json.dumps({"heads": good["heads"]}), "not a heads file"),
        "empty.json": (json.dumps({**good, "heads": []}), "lists no heads"),
        "types.json": (
            json.dumps({**good, "heads": [{"layer": "1", "head": 0}]}),
            "integer 'layer' and 'head'",
        ),
        "layer.json": (
            json.dumps({**good, "heads": [{"layer": 2, "head": 0}]}),
            r"layer 2, head 0\) does not exist",
        ),
        "head.json": (
            json.dumps({**good, "heads": [{"layer": 0, "head": 4}]}),
            r"layer 0, head 4\) does not exist",
        ),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        with pytest.raises(SpecDecError, match=message):
            read_heads_file(path, model=model)
    other = tiny_llama(vocab_size=32, seed=5)  # same shapes, other weights: the fingerprint tells them apart
    with pytest.raises(SpecDecError, match="built for target"):
        read_heads_file(tmp_path / "heads.json", model=other)
    prompt = _cyclic_prompt(0)
    with pytest.raises(SpecDecError, match="pld_layer=3 is out of range"):
        model.generate(prompt, max_new_tokens=2, custom_generate=hf_specdec.pld_plus, pld_layer=3)
    with pytest.raises(SpecDecError, match="find-heads"):  # no shipped heads for a tiny model
        model.generate(prompt, max_new_tokens=2, custom_generate=hf_specdec.pld_plus, pld_variant="attention")
    with pytest.raises(SpecDecError, match="pld_variant"):
        model.generate(prompt, max_new_tokens=2, custom_generate=hf_specdec.pld_plus, pld_variant="magic")
    with pytest.raises(SpecDecError, match="drop output_attentions"):  # its forwards weigh a few heads only
        model.generate(
            prompt,
            max_new_tokens=2,
            custom_generate=hf_specdec.pld_plus,
            pld_variant="attention",
            pld_heads=tmp_path / "heads.json",
            return_dict_in_generate=True,
            output_attentions=True,
        )
    with pytest.raises(SpecDecError, match="three probabilities"):  # the old two-prior form
        model.generate(prompt, max_new_tokens=2, custom_generate=hf_specdec.pld_plus, pld_priors=(0.6, 0.9))


def test_find_heads_cli_rejects_an_unknown_task(tmp_path, capsys):
    from hf_specdec.cli import main

    assert main(["find-heads", "--task", "no-such-task", "--out", str(tmp_path / "h.json")]) == 2
    assert "no-such-task" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ real target
@pytest.mark.real
@pytest.mark.compat
def test_real_target_is_lossless_and_faster_per_forward(real_target, generators):
    from hf_specdec.tasks import load_task

    model, tokenizer = real_target
    row = load_task("code-edit", tokenizer, 1)[0]
    prompt = tokenizer(row["prompt"], return_tensors="pt").input_ids
    ref = _greedy(model, prompt, 40)
    for variant in ("hidden", "attention"):
        out = _greedy(model, prompt, 40, custom_generate=hf_specdec.pld_plus, pld_variant=variant)
        assert torch.equal(out, ref), variant
        gen = generators[-1]
        assert gen.steps + 1 < 40  # fewer target forwards than tokens: drafts were accepted


def test_oracle_rank_picks_the_occurrence_the_target_accepts_most_of():
    from hf_specdec.pld_plus.tune import oracle_rank, replay

    # context: "7 4 5 | 7 4 9 | 7" ; the greedy output goes on "4 9 1": the occurrence at 3 is the right one
    seq = torch.tensor([7, 4, 5, 7, 4, 9, 7, 4, 9, 1])
    rank = oracle_rank(seq, k=3)
    assert rank(seq[:7]) == 3 and hf_pld_rank(2)(seq[:7]) == 0  # n-gram matching takes the first (wrong) one
    run = replay(seq, start=6, rank=rank, k=3, eos=set(), max_len=10)
    assert run.forwards == 2 and run.new_tokens == 4  # prefill -> 7; then one step accepts "4 9" + bonus "1"


class _Boom(Exception):
    pass


class _RaisingCriteria(StoppingCriteria):
    def __init__(self, model):
        self.model = model

    def __call__(self, input_ids, scores, **kwargs):
        raise _Boom(attn_implementation(self.model))  # what the model runs on while generate is inside


class _RaisingStreamer(CollectStreamer):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def put(self, value):
        if self.chunks:  # the prompt goes through, the first generated token raises
            raise _Boom(attn_implementation(self.model))
        super().put(value)


@pytest.mark.parametrize("raiser", ["stopping_criteria", "specdec_streamer"])
def test_attention_implementation_is_restored_when_generate_raises(raiser, tmp_path):
    """PLD+(a) switches the model's attention to its capturing wrapper for the call: an exception inside generate
    (a stopping criterion or a streamer that raises) leaves the model on its own implementation, usable again."""
    model = tiny_llama(vocab_size=32)
    model.set_attn_implementation("sdpa")
    prompt = _cyclic_prompt(0)
    kw = dict(**FORCED, pld_variant="attention", pld_heads=_heads_file(tmp_path, model))
    bad = (
        StoppingCriteriaList([_RaisingCriteria(model)])
        if raiser == "stopping_criteria"
        else _RaisingStreamer(model)
    )
    with pytest.raises(_Boom) as raised:
        _greedy(model, prompt, 8, **kw, **{raiser: bad})
    assert raised.value.args[0] == "pld_plus|sdpa"  # it raised while the wrapper was on
    assert attn_implementation(model) == "sdpa"
    assert torch.equal(_greedy(model, prompt, 8, **kw), _greedy(model, prompt, 8))
