"""The drafter's cost c: one draft forward (the drafter's layer over one token, plus its head) over one forward of the
target over one token, both after the same context and timed on this machine (edd-pct.txt §3.2 calls the two step
times s_d and s_t; c = s_d / s_t). Reported by the bench beside each drafter method, and used by ``draft-vocab`` to
size a draft vocabulary (c(V) for a V-row head)."""

from __future__ import annotations

import torch

from .timing import device_of, median_seconds


@torch.no_grad()
def draft_step_costs(
    drafter, target, sizes: list[int], context: int = 256, rounds: int = 1
) -> dict[int, float]:
    """``c(V)`` for each V: the drafter's forward over one token (after ``context`` target tokens) plus a V-row head,
    over the target's one-token forward after the same context, both timed here (median of 20 calls each); with
    ``rounds`` > 1, the median of that many such ratios over the one prefilled context (one round's ratio drifts by
    +-20% on a 2-core CPU, as the two sides are timed apart)."""
    from .sliding_window import verification_cache

    device = device_of(target)
    ids = torch.randint(3, target.config.vocab_size, (1, context + 1), device=device)
    cache = verification_cache(target, None)  # the full layers the loops verify into (and GLIDE reads)
    fwd = {k: v for k, v in (drafter.target_forward_kwargs() or {}).items() if k != "past_key_values"}
    out = target.base_model(input_ids=ids[:, :-1], past_key_values=cache, **fwd)

    def target_step():
        target(ids[:, -1:], past_key_values=cache, logits_to_keep=1)
        cache.crop(-1)

    step_context = drafter.context_from_features(
        {k: v[..., -1:, :] for k, v in drafter.features_from_target(out).items()}, ids[:, -1:]
    )
    head = target.get_output_embeddings().weight
    hidden = torch.randn(1, head.shape[1], dtype=head.dtype, device=device)
    whole = head.shape[0] if drafter.draft_vocab_ids is None else len(drafter.draft_vocab_ids)
    heads = {v: head[: v or whole].contiguous() for v in sizes}
    samples: dict[int, list[float]] = {v: [] for v in sizes}
    for _ in range(rounds):
        t_target = median_seconds(target_step, device)
        t_layer = median_seconds(
            lambda: drafter(input_ids=ids[:, -1:], return_hidden_states=True, **step_context), device
        )
        for v, rows in heads.items():
            t_head = median_seconds(lambda rows=rows: torch.nn.functional.linear(hidden, rows), device)
            samples[v].append((t_layer + t_head) / t_target)
    return {v: sorted(s)[len(s) // 2] for v, s in samples.items()}


def drafter_cost(drafter, target, context: int = 256, rounds: int = 5) -> float:
    """c of ``drafter`` with its own head (its draft vocabulary, or the whole one) on ``target``, over ``rounds``."""
    return draft_step_costs(drafter, target, [0], context, rounds)[0]


def costs_by_dtype(drafter, target) -> dict:
    """c in fp32 and in bf16 (copies cast to bf16; the originals are untouched) and the machine they were timed on:
    what a drafter's model card records."""
    import copy

    from ..machine import describe_machine, machine_line

    costs = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        d = copy.deepcopy(drafter).to(dtype)  # the copy carries its own copy of the attached target
        t = d.target.to(dtype)
        costs[name] = round(drafter_cost(d, t), 4)
        del d, t
    costs["machine"] = machine_line(describe_machine(device_of(target)))
    return costs
