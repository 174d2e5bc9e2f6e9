"""``DrafterTrainer``: a ``transformers.Trainer`` for drafters that learn from a frozen target (GLIDE, EDD).

Each step runs the frozen target under ``no_grad`` on the batch to produce what the drafter reads (GLIDE: the
target's KV cache, seen through the block-wise mask of GLIDE (arXiv:2402.02082) §4.1; EDD: hidden states), then trains
the drafter with cross entropy on the data's next tokens (assistant tokens only, see ``trainers/data/chat.py``),
plus an optional KL(p_target || q_draft) term (``kl_weight``; GLIDE (arXiv:2402.02082) App. B reports distillation as a
small gain). Only the drafter's parameters are trained; the target is not part of the model, so checkpoints
hold the drafter alone and a run continues from the last one (``run_support.resume_point``).

A drafter used with this trainer provides:

- ``target_forward_kwargs() -> dict | None``: keyword arguments for the target's base-model forward (e.g.
  ``{"use_cache": True}``), or None when the drafter reads nothing from the target;
- ``target_context(target_outputs, input_ids) -> dict``: keyword arguments for ``hidden_states`` built from
  the target's outputs (caches, hidden states, training masks);
- ``hidden_states(input_ids, **context) -> (B, T, D)``, ``draft_logits(hidden) -> (..., V_draft)``,
  ``to_draft_ids(token_ids)`` and ``draft_vocab_ids`` (None for the full vocabulary);
- optionally ``round_length() -> int``: draft positions per drafting round in validation (see below);
- for ``ttt_steps`` > 1 (train as you draft): ``drafted_positions`` and ``unrolled_inputs``
  (``trainers/drafters/unrolled.py``).

Evaluation reports ``eval_loss`` (draft cross entropy), ``eval_kl`` and ``eval_top1_match``: how often the
drafter's argmax equals the target's argmax on the validation tokens, the greedy acceptance rate alpha the
drafter would have at those positions (under the same delay the training mask simulates). For a drafter that
reads the target, ``eval_top1_other_context`` is the same match when what it reads (GLIDE's KV cache, EDD's
soft prompt) comes from *another* validation sequence of the batch: the gap between the two is what the
target's information is worth to the drafter so far (zero for a drafter that has not learned to use it).
``eval_top1_round_start`` is the match at the first position of each drafting round (``drafter.round_length()``;
the first round, which sees no target state, left out): the draft that sees the freshest target state, where a
drafter that reads the target gains most.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import Trainer

from hf_specdec.errors import SpecDecError

from ..data.chat import stack_collator
from ..run_support import step_autocast
from .losses import expected_acceptance, kl_loss, teacher_top_k, top_k_kl_loss
from .unrolled import DEFAULT_DECAY, step_weights, unrolled_loss, unrolled_steps

IGNORE_INDEX = -100


class DrafterTrainer(Trainer):
    """``loss``: ``"ce"`` (cross entropy on the data's tokens, plus ``kl_weight`` x KL) or ``"kl"`` (KL(P_t || P_d)
    alone, EDD (ACL 2025) eq. 4; ``trainers/drafters/losses.py``); ``ttt_steps`` / ``ttt_decay``:
    ``trainers/drafters/unrolled.py``."""

    def __init__(
        self,
        *args,
        target: torch.nn.Module,
        loss: str = "ce",
        kl_weight: float = 0.0,
        teacher_top_k: int | None = None,
        ttt_steps: int = 1,
        ttt_decay: float = DEFAULT_DECAY,
        **kwargs,
    ):
        if loss not in ("ce", "kl"):
            raise SpecDecError(f"DrafterTrainer loss must be 'ce' or 'kl', got {loss!r}")
        self.ttt_weights = step_weights(ttt_steps, ttt_decay)  # checks both
        kwargs.setdefault("data_collator", stack_collator)
        super().__init__(*args, **kwargs)
        self.target = target.eval().requires_grad_(False)
        self.loss = loss
        self.kl_weight = kl_weight
        self.teacher_top_k = teacher_top_k  # KL against the target's top-k only (what a feature store keeps)

    # ------------------------------------------------------------------ one batch
    def _forward(
        self,
        model,
        input_ids: torch.Tensor,
        labels: torch.Tensor,
        need_target_logits: bool,
        context_ids: torch.Tensor | None = None,
        with_alpha: bool = False,
        stored: dict | None = None,
        top_k_teacher: bool = False,
    ) -> dict:
        """``context_ids`` (validation's control): what the drafter reads from the target (cache, hidden states)
        comes from the target's pass over these instead of ``input_ids``; the target's logits stay ``input_ids``'.
        ``with_alpha`` (validation, with ``need_target_logits``): also ``beta`` per position (``eval_alpha``).
        ``stored``: a feature-store batch's ``features`` (what the drafter reads) and ``teacher`` (top-k ids and
        log-probs per position, ``trainers/drafters/features.py``): no target forward at all. ``top_k_teacher``
        (training steps with ``teacher_top_k``): the live teacher truncated as a store's is."""
        drafter = self.accelerator.unwrap_model(model) if hasattr(self, "accelerator") else model
        fwd = drafter.target_forward_kwargs()
        context, target_hidden = {}, None
        with torch.no_grad():
            if stored is not None:
                context = drafter.context_from_features(stored["features"], input_ids)
            elif need_target_logits or (fwd is not None and context_ids is None):
                out = self.target.base_model(input_ids=input_ids, **(fwd or {}))
                target_hidden = out.last_hidden_state
            if fwd is not None and stored is None:
                if context_ids is not None:  # a control pass of its own (a new cache each call)
                    out = self.target.base_model(input_ids=context_ids, **drafter.target_forward_kwargs())
                context = drafter.target_context(out, input_ids)
        # through the model's forward, so that a DDP wrapper (torchrun / accelerate launch) syncs the gradients
        hidden = model(input_ids=input_ids, return_hidden_states=True, **context)
        select = labels[:, 1:] != IGNORE_INDEX  # position j predicts token j + 1
        logits = drafter.draft_logits(hidden[:, :-1][select]).float()
        gold = drafter.to_draft_ids(labels[:, 1:][select])
        result = {"logits": logits, "gold": gold, "n": int(select.sum()), "select": select}
        result.update(context=context, hidden=hidden)  # what an unrolled step reuses (unrolled.py)
        if stored is not None and "teacher" in stored:
            ids, logp = (t[:, : select.shape[1]][select] for t in stored["teacher"])
            result["teacher"] = (drafter.to_draft_ids(ids.long()), logp.float())
        if target_hidden is not None and need_target_logits:
            with torch.no_grad():
                t_logits = self.target.get_output_embeddings()(target_hidden[:, :-1][select]).float()
                if top_k_teacher and self.teacher_top_k:
                    ids, logp = teacher_top_k(t_logits, self.teacher_top_k)
                    result["teacher"] = (drafter.to_draft_ids(ids), logp)
            result["target_argmax"] = t_logits.argmax(-1)
            if with_alpha:
                result["beta"] = expected_acceptance(t_logits, logits.detach(), drafter.draft_vocab_ids)
            if drafter.draft_vocab_ids is not None:
                t_logits = t_logits[:, drafter.draft_vocab_ids]
            result["target_logits"] = t_logits
        return result

    def _losses(self, r: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        if r["n"] == 0 or bool((r["gold"] == IGNORE_INDEX).all()):
            ce = r["logits"].sum() * 0.0
        else:
            ce = F.cross_entropy(r["logits"], r["gold"], ignore_index=IGNORE_INDEX)
        return ce, self._kl(r)

    def _kl(self, r: dict) -> torch.Tensor | None:
        """KL(P_t || P_d) per position: against the target's top-k where the batch has it (a feature store, or
        ``teacher_top_k``), else against its whole distribution; None without a teacher."""
        if "teacher" in r:
            return top_k_kl_loss(r["logits"], *r["teacher"])
        if "target_logits" in r:  # a batch without a supervised position (a long prompt) adds nothing
            return kl_loss(r["logits"], r["target_logits"]) if r["n"] else r["logits"].sum() * 0.0
        return None

    def _step_loss(self, r: dict, num_items_in_batch) -> torch.Tensor:
        """The loss of one pass's result ``r`` (see ``compute_loss``)."""
        kl_only = self.loss == "kl"
        if kl_only:
            ce, kl = None, self._kl(r)
            if kl is None:
                raise SpecDecError("loss 'kl' needs the target's distribution: this batch has no teacher")
        else:
            ce, kl = self._losses(r)
        if num_items_in_batch is None:
            loss = kl if ce is None else ce if kl is None else ce + self.kl_weight * kl
        else:
            total = 0.0 if ce is None else ce * int((r["gold"] != IGNORE_INDEX).sum())
            if kl is not None:
                total = total + (1.0 if ce is None else self.kl_weight) * kl * r["n"]
            loss = total / num_items_in_batch
            if self.args.average_tokens_across_devices:
                loss = loss * self.accelerator.num_processes
        return loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The batch's mean loss per supervised position; inside ``Trainer.train``, where ``num_items_in_batch`` is the
        count of supervised positions over all accumulation steps and processes, the batch's summed loss over that
        count, times the process count (DDP averages gradients): the same gradient for any split of a global batch
        over accumulation steps and processes. With ``ttt_steps`` > 1, the weighted sum of that loss over the unrolled
        steps (``trainers/drafters/unrolled.py``); with 1, the teacher-forced loss itself."""
        stored = stored_batch(inputs)
        input_ids = inputs["input_ids"]
        with step_autocast(self.args, input_ids.device):
            r = self._forward(
                model,
                input_ids,
                inputs["labels"],
                need_target_logits=stored is None and (self.loss == "kl" or self.kl_weight > 0),
                stored=stored,
                top_k_teacher=True,
            )
            losses = [self._step_loss(r, num_items_in_batch)]
            drafter = self.accelerator.unwrap_model(model) if hasattr(self, "accelerator") else model
            for step in unrolled_steps(model, drafter, input_ids, r, len(self.ttt_weights) - 1):
                losses.append(self._step_loss(step, num_items_in_batch))
        loss = unrolled_loss(losses, self.ttt_weights)
        return (loss, {"logits": r["logits"]}) if return_outputs else loss

    # ------------------------------------------------------------------ validation
    def _validation_batches(self, eval_dataset=None):
        """The validation set in batches of ``per_device_eval_batch_size``, in order, on this process's device. With
        several processes, batch j goes to process j mod P: the set is covered once, without the padding of a
        sharded loader, and every batch is the one a single process sees, so summed metrics equal its exactly."""
        from torch.utils.data import DataLoader

        data = self.eval_dataset if eval_dataset is None else eval_dataset
        loader = DataLoader(
            data, batch_size=self.args.per_device_eval_batch_size, collate_fn=self.data_collator
        )
        for j, batch in enumerate(loader):
            if j % self.args.world_size == self.args.process_index:
                yield {k: v.to(self.args.device) for k, v in batch.items()}

    def _validation_passes(self, eval_dataset=None, with_alpha: bool = False):
        """Yield ``(input_ids, labels, result)`` of every validation batch with supervised tokens, the drafter in
        eval mode and without gradients (its mode is restored afterwards)."""
        model = self.model
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                for batch in self._validation_batches(eval_dataset):
                    ids, labels = batch["input_ids"], batch["labels"]
                    r = self._forward(model, ids, labels, need_target_logits=True, with_alpha=with_alpha)
                    if r["n"]:
                        yield ids, labels, r
        finally:
            model.train(was_training)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict:
        model = self.model
        sums = {
            "ce": 0.0,
            "kl": 0.0,
            "alpha": 0.0,
            "match": 0,
            "n": 0,
            "match_other": 0,
            "n_other": 0,
            "match_first": 0,
            "n_first": 0,
        }
        drafter = self.accelerator.unwrap_model(model)
        reads_target = drafter.target_forward_kwargs() is not None
        L = drafter.round_length() if hasattr(drafter, "round_length") else None

        def top1(logits: torch.Tensor) -> torch.Tensor:
            top = logits.argmax(-1)
            return top if drafter.draft_vocab_ids is None else drafter.draft_vocab_ids[top]

        for ids, labels, r in self._validation_passes(eval_dataset, with_alpha=True):
            ce, kl = self._losses(r)
            sums["ce"] += float(ce) * r["n"]
            sums["kl"] += float(kl) * r["n"]
            sums["alpha"] += float(r["beta"].sum())
            hit = top1(r["logits"]) == r["target_argmax"]
            sums["match"] += int(hit.sum())
            sums["n"] += r["n"]
            if L:  # positions that start a drafting round after the first (which has no target context)
                position = torch.arange(labels.shape[1] - 1, device=labels.device)
                position = position.expand(labels.shape[0], -1)[labels[:, 1:] != IGNORE_INDEX]
                first = (position % L == 0) & (position >= L)
                sums["match_first"] += int(hit[first].sum())
                sums["n_first"] += int(first.sum())
            if reads_target and ids.shape[0] > 1:
                # control: the same tokens, but what the drafter reads from the target is the previous row's
                with torch.no_grad():
                    other = self._forward(
                        model, ids, labels, need_target_logits=False, context_ids=ids.roll(1, 0)
                    )
                sums["match_other"] += int((top1(other["logits"]) == r["target_argmax"]).sum())
                sums["n_other"] += r["n"]
        if self.args.world_size > 1:  # each process saw its share of the batches (_validation_batches)
            keys = list(sums)
            total = torch.tensor([float(sums[k]) for k in keys], dtype=torch.float64, device=self.args.device)
            reduced = self.accelerator.reduce(total, reduction="sum").tolist()
            sums = {k: v if k in ("ce", "kl", "alpha") else round(v) for k, v in zip(keys, reduced)}
        n = max(sums["n"], 1)
        metrics = {
            f"{metric_key_prefix}_loss": sums["ce"] / n,
            f"{metric_key_prefix}_kl": sums["kl"] / n,
            f"{metric_key_prefix}_top1_match": sums["match"] / n,
            f"{metric_key_prefix}_alpha": sums["alpha"] / n,
            f"{metric_key_prefix}_tokens": sums["n"],
        }
        if sums["n_first"]:
            metrics[f"{metric_key_prefix}_top1_round_start"] = sums["match_first"] / sums["n_first"]
        if sums["n_other"]:
            metrics[f"{metric_key_prefix}_top1_other_context"] = sums["match_other"] / sums["n_other"]
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def validation_logits(self, eval_dataset=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced draft logits ``(N, V_draft)`` on the validation tokens (under the training mask) and
        the target's greedy tokens ``(N,)`` there (``trainers/drafters/calibration.py`` fits the confidences on
        them)."""
        logits, argmax = [], []
        for _, _, r in self._validation_passes(eval_dataset):
            logits.append(r["logits"].cpu())
            argmax.append(r["target_argmax"].cpu())
        if self.args.world_size > 1:  # every process gets all of them (its share was _validation_batches')
            shares = [None] * self.args.world_size
            torch.distributed.all_gather_object(shares, (logits, argmax))
            logits = [x for share in shares for x in share[0]]
            argmax = [x for share in shares for x in share[1]]
        if not logits:
            raise SpecDecError(
                "the validation data has no supervised (assistant) tokens; use more validation blocks"
            )
        return torch.cat(logits), torch.cat(argmax)


def stored_batch(inputs: dict) -> dict | None:
    """A feature-store batch's ``features`` (``feature.NAME`` keys) and ``teacher`` (``teacher_ids``,
    ``teacher_logp``); None for a plain batch of tokens."""
    features = {k.removeprefix("feature."): v for k, v in inputs.items() if k.startswith("feature.")}
    if not features and "teacher_ids" not in inputs:
        return None
    stored = {"features": features}
    if "teacher_ids" in inputs:
        stored["teacher"] = (inputs["teacher_ids"], inputs["teacher_logp"])
    return stored


def write_training_curve(log_history: list[dict], out_dir: str | Path) -> Path:
    """Write ``training_curve.json`` and ``training_curve.png`` (train loss, eval loss, eval top-1 match)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train = [(h["step"], h["loss"]) for h in log_history if "loss" in h]
    evals = [(h["step"], h["eval_loss"], h.get("eval_top1_match")) for h in log_history if "eval_loss" in h]
    (out_dir / "training_curve.json").write_text(json.dumps({"train": train, "eval": evals}, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    if train:
        ax.plot(*zip(*train), label="train CE", lw=1)
    if evals:
        ax.plot([e[0] for e in evals], [e[1] for e in evals], "o-", label="validation CE")
    ax.set_xlabel("step")
    ax.set_ylabel("cross entropy")
    if evals and evals[0][2] is not None:
        ax2 = ax.twinx()
        ax2.plot([e[0] for e in evals], [e[2] for e in evals], "s--", color="tab:green", label="top-1 match")
        ax2.set_ylabel("top-1 match with target (alpha proxy)")
        ax2.legend(loc="center right", fontsize=8)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    path = out_dir / "training_curve.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
