"""Set-up shared by the chain candidate generators of the trained drafters (GLIDE, EDD) in transformers'
assisted-decoding loop: the proposal length gamma and what each draft step needs from the target's
``generation_config``. :data:`DEFAULT_GAMMA` is gamma's one default for every method (GLIDE §5.1 and CAPE:
gamma = 5; EDD Table 1: a draft sequence of length 5): the drafters' ``generation_config.num_assistant_tokens``
(``modeling/``) and CAPE's proposal length fall back to it."""

from __future__ import annotations

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.generation.candidate_generator import CandidateGenerator
from transformers.generation.logits_process import LogitsProcessorList, MinLengthLogitsProcessor

from .draft_budget import ChainSizer, DraftBudget, measured_drafter_cost, shared_gate
from .generate_io import eos_token_ids
from .verify_cost import CostObserver, measured_cost

DEFAULT_GAMMA = 5  # gamma, the proposal length, when nothing else sets it


def chain_length(drafter: PreTrainedModel) -> int:
    """gamma of a drafter's chain: its ``generation_config.num_assistant_tokens``, else :data:`DEFAULT_GAMMA`."""
    return int(getattr(drafter.generation_config, "num_assistant_tokens", None) or DEFAULT_GAMMA)


def init_chain_drafting(
    generator: CandidateGenerator,
    drafter: PreTrainedModel,
    generation_config: GenerationConfig,
    logits_processor: LogitsProcessorList | None,
    target: PreTrainedModel | None = None,
) -> None:
    """Set ``generator``'s ``num_draft_tokens`` (gamma = the drafter's ``num_assistant_tokens``), ``do_sample``,
    ``max_length``, ``eos`` (list of eos ids, empty when there are none), ``logits_processor`` (the target's processors
    without ``MinLengthLogitsProcessor``: a draft that ends early is only a shorter proposal, and the target's
    own processors still enforce the minimum length on what it accepts) and ``sizer``: a
    :class:`~hf_specdec.core.draft_budget.ChainSizer` on ``target``'s measured costs when the drafter's
    ``chain_cost`` is on (the default), else one that keeps all gamma tokens (the papers)."""
    generator.num_draft_tokens = chain_length(drafter)
    generator.do_sample = bool(generation_config.do_sample)
    generator.max_length = generation_config.max_length
    generator.eos = eos_token_ids(generation_config)
    generator.logits_processor = LogitsProcessorList(
        p for p in (logits_processor or []) if not isinstance(p, MinLengthLogitsProcessor)
    )
    generator.sizer = ChainSizer(None)
    # with measured costs: the DraftGate, and the record of the drafted step it waits on
    generator.gate, generator.pending = None, None
    generator.size_drafts = bool(getattr(drafter, "chain_cost", False)) and target is not None
    generator.confidence_temperature = float(getattr(drafter.config, "confidence_temperature", 1.0) or 1.0)


def chain_budget(
    generator: CandidateGenerator, drafter: PreTrainedModel, target: PreTrainedModel, ids
) -> None:
    """On the generator's first step: its :class:`ChainSizer` on the learnt ``c(q)`` (``ids``: the context, whose
    length picks the curve) and ``c_d`` of this machine (both kept per model, dtype, device and threads), and the
    :class:`~hf_specdec.core.draft_budget.DraftGate` kept on the drafter for them (``shared_gate``)."""
    if generator.size_drafts and generator.sizer.budget is None:
        budget = DraftBudget(measured_cost(target, ids[0]), measured_drafter_cost(drafter, target))
        generator.sizer = ChainSizer(budget)
        generator.gate = shared_gate(drafter, target)
        generator.observer = CostObserver(target, ids.shape[-1])  # learns c(q) from the verifications


def _mark(generator: CandidateGenerator, q: int) -> None:
    """The verification of ``q`` tokens starts now (the assisted loop runs it once the candidates are returned). The
    first is not a sample: a drafter that drafts before the prefill has its candidates verified by the prefill."""
    observer = getattr(generator, "observer", None)
    first = not getattr(generator, "marked", False)
    generator.marked = True
    generator.verifying = None if observer is None or first else (q, observer.start())


def chain_start(generator: CandidateGenerator) -> bool:
    """A step's start, after :func:`chain_budget`: ``False`` when the gate keeps the drafter idle this step (the
    drafted steps have not paid; the assisted loop then verifies no candidate, a plain step), else the sizer starts
    on the gate's corrected estimates."""
    generator.pending = None
    # no budget: no gate either (chain_budget sets both)
    gate, budget = generator.gate, generator.sizer.budget
    if budget is not None and not budget.draft_now(gate):
        _mark(generator, 1)
        return False
    generator.sizer.start(1.0 if gate is None else gate.estimate_scale)
    return True


def chain_drafted(generator: CandidateGenerator) -> None:
    """The drafted step's record (``ChainSizer.record``), fed to the gate by :func:`chain_verified`."""
    if generator.gate is not None:
        generator.pending = generator.sizer.record()
    _mark(generator, 1 + generator.sizer.kept)


def chain_verified(generator: CandidateGenerator, input_ids: torch.Tensor, num_matches: int) -> None:
    """``update_candidate_strategy``'s part: the last drafted step's outcome to the gate. ``input_ids`` ends with the
    ``num_matches + 1`` tokens the verification emitted; the first of them is read (one host read) only when the step
    kept no draft and its first token is scored for free."""
    record, generator.pending = generator.pending, None
    verifying, generator.verifying = getattr(generator, "verifying", None), None
    if verifying is not None:
        generator.observer.stop(*verifying)
    if record is None:
        return
    emitted = [int(input_ids[0, -1 - int(num_matches)])] if record[2] is not None else []
    generator.gate.verified(record, emitted, int(num_matches))


def draft_token(
    generator: CandidateGenerator, drafter: PreTrainedModel, sequence: torch.Tensor, logits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """One chain draft token from the drafter's ``logits`` (over its draft vocabulary, ``modeling/attached.py``)
    at the end of ``sequence``: ``(token (1, 1), full-vocabulary processed logits or None, confidence)``. Greedy
    without logits processors takes the argmax over the draft vocabulary directly; otherwise the logits are mapped
    to the full vocabulary, processed like the target's, and sampled (``do_sample``) or maximised. The processed
    logits are what transformers' speculative sampling needs as the draft distribution q. ``confidence`` (a (1, 1)
    float tensor on the device, no host read): the largest probability of ``softmax(logits / T)``, ``T`` the
    drafter's ``confidence_temperature`` (the estimate :class:`ChainSizer` reads). It is the greedy draft's own
    probability, and when sampling it depends on the distribution only, never on the token drawn from it: a draft
    kept or dropped by the value drawn would bias speculative sampling; one kept by its distribution does not."""
    t = generator.confidence_temperature
    if not len(generator.logits_processor) and not generator.do_sample:
        token = logits.argmax(-1, keepdim=True)
        scaled = logits.float() / t
        confidence = (scaled.max(-1, keepdim=True).values - scaled.logsumexp(-1, keepdim=True)).exp()
        ids = drafter.draft_vocab_ids
        return (token if ids is None else ids[token]), None, confidence
    full = generator.logits_processor(sequence, drafter.to_full_vocab(logits.float()))
    token = torch.multinomial(full.softmax(-1), 1) if generator.do_sample else full.argmax(-1, keepdim=True)
    return token, full, (full / t).softmax(-1).max(-1, keepdim=True).values


def read_draft(token: torch.Tensor, confidence: torch.Tensor) -> tuple[int, float]:
    """The one host read of a chain draft step: the token id and its confidence together (ids below 2**24 are
    exact in float32)."""
    token_id, p = torch.cat([token.to(confidence.dtype), confidence], dim=-1)[0].tolist()
    return int(token_id), p
