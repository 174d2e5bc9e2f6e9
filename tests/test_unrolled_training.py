"""Train as you draft (``trainers/drafters/unrolled.py``): the unrolled loss at 1 step is today's teacher-forced loss
exactly; at 2 steps it differs and trains the drafter; after L steps every round holds the drafter's own greedy
drafts; GLIDE's pass over fed-back inputs sees what it sees at inference; the options round-trip through the CLI; bad
values are clear errors."""

from __future__ import annotations

import pytest
import torch
from hf_specdec.modeling.masks import drafted_positions
from hf_specdec.trainers.data.chat import stack_collator
from hf_specdec.trainers.drafters.losses import kl_loss
from hf_specdec.trainers.drafters.trainer import DrafterTrainer
from hf_specdec.trainers.drafters.unrolled import feed_back, step_weights, unrolled_steps
from transformers import TrainingArguments

from hf_specdec.errors import SpecDecError

from .conftest import tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")

N = 24  # tokens per row: blocks of L = 5 (EDD in eval mode, GLIDE) and a partial last block


@pytest.fixture(scope="module")
def target():
    return tiny_llama(num_hidden_layers=4)


def _drafter(kind: str, target, **overrides):
    from hf_specdec.modeling import EddConfig, EddForCausalLM, GlideConfig, GlideForCausalLM

    torch.manual_seed(1)
    if kind == "edd":
        drafter = EddForCausalLM(EddConfig.for_target(target, **overrides))
    else:
        drafter = GlideForCausalLM(GlideConfig.for_target(target, cross_attention=kind == "glide"))
    drafter.attach_target(target)
    drafter.init_from_target(target)
    return drafter.eval()  # eval: EDD's fixed block length (5), no randomness


def _trainer(tmp_path, target, drafter, **kw) -> DrafterTrainer:
    args = TrainingArguments(
        output_dir=str(tmp_path / "t"), report_to=[], use_cpu=True, remove_unused_columns=False
    )
    return DrafterTrainer(model=drafter, args=args, target=target, **kw)


def _batch():
    torch.manual_seed(2)
    ids = torch.randint(3, 90, (2, N))
    labels = ids.clone()
    labels[0, :7] = -100  # an unsupervised prefix: its predictions still feed the drafted positions after it
    return {"input_ids": ids, "labels": labels}


def _todays_loss(kind, target, drafter, batch) -> torch.Tensor:
    """The teacher-forced KL of eq. 4 on the supervised positions, written out from the drafter's own pieces."""
    ids, labels = batch["input_ids"], batch["labels"]
    with torch.no_grad():
        if kind == "edd":
            out = target.base_model(input_ids=ids, output_hidden_states=True)
            context = {"soft_prompt": out.hidden_states[drafter.config.encoder_layer], "block_length": 5}
        else:
            from hf_specdec.modeling.masks import blockwise_cross_mask

            out = target.base_model(input_ids=ids, use_cache=True)
            layer = drafter.config.target_layers[0]
            entry = out.past_key_values.layers[layer]
            context = {
                "target_past_key_values": {layer: (entry.keys, entry.values)},
                "cross_attention_mask": blockwise_cross_mask(N, 5),
            }
    hidden = drafter.hidden_states(ids, **context)
    select = labels[:, 1:] != -100
    draft = drafter.draft_logits(hidden[:, :-1][select]).float()
    with torch.no_grad():
        teacher = target.get_output_embeddings()(out.last_hidden_state[:, :-1][select]).float()
    return kl_loss(draft, teacher)


@pytest.mark.parametrize("kind", ["edd", "glide"])
def test_one_step_is_todays_loss_exactly(kind, target, tmp_path):
    drafter = _drafter(kind, target)
    batch = _batch()
    one = _trainer(tmp_path, target, drafter, loss="kl", ttt_steps=1, ttt_decay=0.3)
    default = _trainer(tmp_path, target, drafter, loss="kl")
    today = _todays_loss(kind, target, drafter, batch)
    assert torch.equal(one.compute_loss(drafter, batch), today)
    assert torch.equal(default.compute_loss(drafter, batch), today)
    # inside Trainer.train (the loss normalised by the supervised positions of the whole step) too
    n = int((batch["labels"][:, 1:] != -100).sum())
    assert torch.equal(one.compute_loss(drafter, batch, num_items_in_batch=n), today * n / n)


@pytest.mark.parametrize("kind", ["edd", "glide", "vanilla"])
def test_two_steps_differ_and_train_the_drafter(kind, target, tmp_path):
    drafter = _drafter(kind, target)
    batch = _batch()
    one = _trainer(tmp_path, target, drafter, loss="kl")
    two = _trainer(tmp_path, target, drafter, loss="kl", ttt_steps=2, ttt_decay=0.5)
    first = one.compute_loss(drafter, batch)
    unrolled = two.compute_loss(drafter, batch)
    assert not torch.allclose(unrolled, first)
    # the weighted sum of the teacher-forced loss and the loss on the drafter's own first-step drafts
    r = two._forward(
        drafter, batch["input_ids"], batch["labels"], need_target_logits=True, top_k_teacher=True
    )
    drafted = drafter.drafted_positions(batch["input_ids"], r["context"])
    (step2,) = unrolled_steps(drafter, drafter, batch["input_ids"], r, 1)
    assert not torch.equal(step2["fed_ids"], batch["input_ids"])
    assert torch.equal(step2["fed_ids"][:, ~drafted], batch["input_ids"][:, ~drafted])  # round starts kept
    second = two._step_loss(step2, None)
    torch.testing.assert_close(unrolled, (first + 0.5 * second) / 1.5)
    # the gradient of the second step alone reaches the drafter's weights
    drafter.zero_grad()
    second.backward()
    grads = [p.grad for p in drafter.parameters() if p.requires_grad]
    assert grads and all(g is not None for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0


@pytest.mark.parametrize("kind", ["edd", "glide"])
def test_after_L_steps_every_round_holds_the_drafters_greedy_drafts(kind, target, tmp_path):
    """Jacobi fixed point: after L steps (L = 5) the inputs of each round are the drafter's argmax given the round's
    earlier inputs, i.e. its greedy chain from the round's committed token; one more step changes nothing."""
    drafter = _drafter(kind, target)
    batch = _batch()
    trainer = _trainer(tmp_path, target, drafter, loss="kl", ttt_steps=6)
    ids = batch["input_ids"]
    with torch.no_grad():
        first = trainer._forward(drafter, ids, batch["labels"], need_target_logits=True)
        fed = [step["fed_ids"] for step in unrolled_steps(drafter, drafter, ids, first, 5)]
    assert torch.equal(fed[-1], fed[-2])
    assert not torch.equal(fed[0], fed[-1])  # the first feedback is not yet the drafts
    # the greedy chain of round 2 (positions 10..14) of row 1 (all supervised), drafted one token at a time
    row = 1
    with torch.no_grad():
        chain = ids[row : row + 1].clone()
        for i in range(11, 15):
            inputs = drafter.unrolled_inputs(ids[row : row + 1], chain, _row_context(first["context"], row))
            hidden = drafter(**inputs, return_hidden_states=True)[:, -N:]
            top = drafter.draft_logits(hidden[0, i - 1]).argmax(-1)
            chain[0, i] = top if drafter.draft_vocab_ids is None else drafter.draft_vocab_ids[top]
    assert torch.equal(fed[-1][row, 10:15], chain[0, 10:15])


def _row_context(context: dict, row: int) -> dict:
    out = {}
    for k, v in context.items():
        if k == "target_past_key_values":
            out[k] = {layer: (kv[0][row : row + 1], kv[1][row : row + 1]) for layer, kv in v.items()}
        elif k == "soft_prompt":
            out[k] = v[row : row + 1]
        else:
            out[k] = v
    return out


def test_glide_fed_back_half_sees_verified_tokens_before_its_round(target, tmp_path):
    """GLIDE's pass over [data ; fed-back]: fed back with the data itself it is today's pass; changing the fed-back
    tokens of one round changes no other round (earlier rounds reach a round as data, i.e. verified tokens)."""
    drafter = _drafter("glide", target)
    batch = _batch()
    ids = batch["input_ids"]
    trainer = _trainer(tmp_path, target, drafter, loss="kl")
    with torch.no_grad():
        r = trainer._forward(drafter, ids, batch["labels"], need_target_logits=True)
        same = drafter(**drafter.unrolled_inputs(ids, ids, r["context"]), return_hidden_states=True)
        torch.testing.assert_close(same[:, N:], r["hidden"])
        torch.testing.assert_close(same[:, :N], r["hidden"])
        other = ids.clone()
        other[:, 6:10] = (other[:, 6:10] + 1) % 90  # the drafted positions of round 1 (5..9)
        moved = drafter(**drafter.unrolled_inputs(ids, other, r["context"]), return_hidden_states=True)[:, N:]
    torch.testing.assert_close(moved[:, :5], r["hidden"][:, :5])
    torch.testing.assert_close(moved[:, 10:], r["hidden"][:, 10:])
    assert not torch.allclose(moved[:, 6:10], r["hidden"][:, 6:10])


def test_unrolled_training_from_a_feature_store(target, tmp_path):
    """A store batch (soft prompt and top-k teacher from the store) unrolls like a live batch with the same teacher."""
    from hf_specdec.trainers.drafters.features import FeatureStore, build_features

    from tests.test_features import BLOCK, write_corpus

    corpus = write_corpus(tmp_path, 4)
    drafter = _drafter("edd", target)
    build_features(target, drafter, corpus, tmp_path / "store", BLOCK, top_k=6, dtype="fp32")
    store = FeatureStore(tmp_path / "store")
    trainer = _trainer(tmp_path, target, drafter, loss="kl", teacher_top_k=6, ttt_steps=3)
    stored = stack_collator([store[i] for i in range(3)])
    live = {"input_ids": stored["input_ids"], "labels": stored["labels"]}
    torch.testing.assert_close(trainer.compute_loss(drafter, stored), trainer.compute_loss(drafter, live))


def test_step_weights_and_feed_back():
    assert step_weights(1) == [1.0]
    assert step_weights(3, 0.5) == pytest.approx([4 / 7, 2 / 7, 1 / 7])
    assert step_weights(2, 1.0) == [0.5, 0.5]
    assert drafted_positions(7, 3).tolist() == [False, True, True, False, True, True, False]
    ids = torch.tensor([[10, 11, 12, 13, 14, 15, 16]])
    predicted = torch.tensor([[20, 21, 22, 23, 24, 25]])  # predicted[:, i - 1] is the token for position i
    assert feed_back(ids, predicted, drafted_positions(7, 3)).tolist() == [[10, 20, 21, 13, 23, 24, 16]]


@pytest.mark.parametrize(
    "steps, decay, message",
    [
        (0, 0.8, "ttt_steps .* must be an integer >= 1"),
        (-2, 0.8, "ttt_steps .* must be an integer >= 1"),
        (2.5, 0.8, "ttt_steps .* must be an integer >= 1"),
        (2, 0.0, r"ttt_decay .* must be a finite number > 0"),
        (2, -0.5, r"ttt_decay .* must be a finite number > 0"),
        (2, float("nan"), r"ttt_decay .* must be a finite number > 0"),
    ],
)
def test_bad_values_are_clear_errors(steps, decay, message, target, tmp_path):
    with pytest.raises(SpecDecError, match=message):
        step_weights(steps, decay)
    with pytest.raises(SpecDecError, match=message):
        _trainer(tmp_path, target, _drafter("glide", target), ttt_steps=steps, ttt_decay=decay)


def test_edd_without_soft_prompt_has_no_rounds_to_unroll(target, tmp_path):
    drafter = _drafter("edd", target, soft_prompt=False)
    trainer = _trainer(tmp_path, target, drafter, loss="kl", ttt_steps=2)
    with pytest.raises(SpecDecError, match="needs EDD's drafting rounds"):
        trainer.compute_loss(drafter, _batch())


@pytest.mark.parametrize("recipe", ["edd", "glide"])
def test_options_round_trip_through_the_cli(recipe, tmp_path, capsys):
    from hf_specdec.trainers.drafters.options import unrolled_options

    from hf_specdec.cli import build_parser, main

    base = ["train", recipe, "--output-dir", str(tmp_path / "o")]
    args = build_parser().parse_args(base)
    assert unrolled_options(args) == {"ttt_steps": 1, "ttt_decay": 0.8}  # today's recipe by default
    args = build_parser().parse_args([*base, "--ttt-steps", "3", "--ttt-decay", "0.5"])
    assert unrolled_options(args) == {"ttt_steps": 3, "ttt_decay": 0.5}
    # checked before anything loads: one clear line, exit status 2
    for option, value in (
        ("--ttt-steps", "0"),
        ("--ttt-steps", "-1"),
        ("--ttt-decay", "0"),
        ("--ttt-decay", "-1"),
    ):
        assert main([*base, "--model", str(tmp_path / "missing"), option, value]) == 2
        err = capsys.readouterr().err.strip()
        assert option.removeprefix("--").replace("-", "_") in err and len(err.splitlines()) == 1


def test_init_from_continues_a_saved_drafter(target, tmp_path):
    """``--init-from DIR`` (the warm start of the equal-compute runs in docs/edd-pct.md): the saved drafter's weights
    and reduced draft vocabulary, under this run's recipe; a drafter of another shape is a clear error."""
    from hf_specdec.modeling import GlideConfig, GlideForCausalLM
    from hf_specdec.trainers.drafters.run import warm_start

    saved = _drafter("edd", target)
    saved.set_draft_vocab(torch.arange(3, 40))
    with torch.no_grad():
        saved.decoder.norm.weight.mul_(1.5)
    saved.save_pretrained(tmp_path / "saved")
    fresh = _drafter("edd", target, block_min=3, block_max=4)
    warm_start(fresh, str(tmp_path / "saved"), target)
    assert torch.equal(fresh.draft_vocab_ids, saved.draft_vocab_ids)
    for name, value in saved.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], value), name
    assert (fresh.config.block_min, fresh.config.block_max) == (3, 4)  # the recipe is this run's
    glide = GlideForCausalLM(GlideConfig.for_target(target)).attach_target(target)
    glide.save_pretrained(tmp_path / "glide1")
    two_layers = GlideForCausalLM(GlideConfig.for_target(target, num_hidden_layers=2)).attach_target(target)
    with pytest.raises(SpecDecError, match="do not fit"):
        warm_start(two_layers, str(tmp_path / "glide1"), target)
