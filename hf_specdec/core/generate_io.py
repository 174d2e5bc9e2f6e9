"""What a ``custom_generate`` loop takes from ``generate`` and hands back, written once for every method.

The tree core's ``tree_generate``, which every method proposes into (GLIDE + CAPE, EDD + PCT, PLD+, SPACE, the
chains), takes from here the input checks, the cache set-up, the default stopping criteria, appending tokens under
the stopping criteria, the output assembly, the EOS ids and the streamer keyword.

**Streamer.** transformers 5.23's ``generate`` does not hand its own ``streamer=`` to a ``custom_generate``
callable (it only puts the prompt into it), so every hf_specdec method takes its streamer as
``specdec_streamer=``: the prompt is put into it first, then every emitted token, then ``end()``, as ``generate``
does with its own. The older per-method keywords (``tree_streamer=``, ``pld_streamer=``) still work and raise a
``FutureWarning`` naming ``specdec_streamer``.

**Generation modes.** Every method is greedy or sampling decoding, one sequence per prompt, made faster: no loop
implements beam search (of any kind), contrastive search, DoLa, classifier-free guidance or several sequences per
prompt. :func:`check_generation_mode` refuses them by name (transformers would hand a ``custom_generate`` loop the
expanded beams as a batch, and ignore an ``assistant_model`` for beam search); every entry point calls it first.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Sequence

import torch
from transformers import GenerationConfig, StoppingCriteriaList
from transformers.cache_utils import Cache
from transformers.generation import EosTokenCriteria, GenerationMode, MaxLengthCriteria
from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..errors import SpecDecError
from ..hf_compat import CACHE_ARGUMENT, attn_implementation, cache_of
from .kv_cache import check_cache_supported
from .sliding_window import verification_cache
from .stats import DecodeStats
from .timing import clock

# implementations that take a custom 4D attention mask (hf_specdec_sdpa: grouped_attention.py, sdpa's masks)
SUPPORTED_ATTENTION = ("sdpa", "eager", "hf_specdec_sdpa")
# ``<CAPTURE_PREFIX><impl>``: the implementation ``impl`` with PLD+(a)'s capture of a few heads' weights beside it
# (``pld_plus/attention_capture.py``); the outputs are ``impl``'s own
CAPTURE_PREFIX = "pld_plus|"
NO_MAX_LENGTH = 10**9  # max_length when the generation config sets none
STREAMER_KEYWORD = "specdec_streamer"
# GenerationConfig options no loop implements: (option, when it is on, the mode it asks for)
UNSUPPORTED_OPTIONS = (
    ("num_beams", lambda v: v > 1, "beam search"),
    ("num_beam_groups", lambda v: v > 1, "group beam search"),
    ("diversity_penalty", lambda v: v != 0, "group beam search"),
    ("constraints", bool, "constrained beam search"),
    ("force_words_ids", bool, "constrained beam search"),
    ("penalty_alpha", lambda v: v > 0, "contrastive search"),
    ("dola_layers", lambda v: True, "DoLa decoding"),
    ("num_return_sequences", lambda v: v > 1, "several sequences per prompt"),
    ("guidance_scale", lambda v: v != 1, "classifier-free guidance"),
)
IMPLEMENTED_MODES = (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE, GenerationMode.ASSISTED_GENERATION)


def check_generation_mode(generation_config: GenerationConfig | None, name: str) -> None:
    """Every entry point's generation-mode check (``name`` says which; module docstring): greedy or sampling, one
    sequence per prompt. Any option of :data:`UNSUPPORTED_OPTIONS` that is on, or any other mode
    ``GenerationConfig.get_generation_mode`` names, is a ``SpecDecError`` naming the option and what to do."""
    if generation_config is None:
        return
    for option, is_on, mode in UNSUPPORTED_OPTIONS:
        value = getattr(generation_config, option, None)
        if value is not None and is_on(value):
            raise SpecDecError(
                f"{name} does not implement {mode} ({option}={value!r}): drop {option}; speculative decoding "
                "here is greedy (do_sample=False) or sampling (do_sample=True) with one sequence per prompt, and "
                "its output is what plain generate gives in that mode"
            )
    mode = generation_config.get_generation_mode()
    if mode not in IMPLEMENTED_MODES:
        raise SpecDecError(
            f"{name} does not implement the generation mode {mode.value!r}; use greedy (do_sample=False) or "
            "sampling (do_sample=True) with num_beams=1 and one sequence per prompt"
        )


def check_prompt(input_ids: torch.Tensor, name: str, batch: bool = False) -> None:
    """Every entry point's prompt check (``name`` says which): a 2D ``(batch, length)`` tensor, batch size 1 unless
    the entry point takes a batch (``batch``), and at least one token."""
    if input_ids.dim() != 2 or input_ids.shape[0] < 1 or (input_ids.shape[0] != 1 and not batch):
        raise SpecDecError(
            f"{name} supports batch size 1 only (input_ids of shape {tuple(input_ids.shape)}); loop over the prompts"
        )
    if input_ids.shape[1] == 0:
        raise SpecDecError(
            f"{name} got an empty prompt (input_ids of shape {tuple(input_ids.shape)}); pass at least one token "
            "(e.g. the chat template's generation prompt, or the BOS token)"
        )


def first_row(input_ids: torch.Tensor, model_kwargs: dict) -> torch.Tensor:
    """The first row of a (possibly left-padded) batch without its padding, 1-D: the context a method times its
    verification cost curve on (``verify_cost.measured_cost``)."""
    mask = model_kwargs.get("attention_mask")
    return input_ids[0] if mask is None else input_ids[0][mask[0].bool()]


def check_inputs(
    model, input_ids: torch.Tensor, model_kwargs: dict, synced_gpus: bool, name: str, batch: bool = False
) -> None:
    """What a loop that verifies drafts with a custom 4D attention mask needs (``name`` says which loop):
    :func:`check_prompt`, a decoder-only model, ``sdpa`` or ``eager`` attention, no ``synced_gpus``, and, unless
    ``batch`` (the loop takes left-padded rows: ``batch_decoding.check_left_padded``), no padding."""
    check_prompt(input_ids, name, batch)
    if model.config.is_encoder_decoder:
        raise SpecDecError(f"{name} supports decoder-only models only")
    impl = attn_implementation(model)
    if impl.removeprefix(CAPTURE_PREFIX) not in SUPPORTED_ATTENTION:
        raise SpecDecError(
            f"{name} needs a custom 4D attention mask, which attn_implementation={impl!r} cannot "
            f"take; load the target with attn_implementation='sdpa' or 'eager'"
        )
    mask = model_kwargs.get("attention_mask")
    if not batch and mask is not None and mask.dim() == 2 and not bool(mask.all()):
        raise SpecDecError(f"{name} does not support padded inputs (attention_mask has zeros)")
    if synced_gpus:
        raise SpecDecError(f"{name} does not support synced_gpus")


def stopping_criteria_or_default(
    stopping_criteria: StoppingCriteriaList | None, generation_config: GenerationConfig
) -> StoppingCriteriaList:
    """``generate``'s criteria; when the loop is called directly (none given): stop at max_length / EOS."""
    if stopping_criteria:
        return stopping_criteria
    criteria = StoppingCriteriaList()
    if generation_config.max_length is not None:
        criteria.append(MaxLengthCriteria(generation_config.max_length))
    eos = eos_token_ids(generation_config)
    if eos:
        criteria.append(EosTokenCriteria(eos))
    return criteria


def eos_token_ids(generation_config: GenerationConfig) -> list[int]:
    """The EOS ids of a generation: the config's ``eos_token_id`` (an id, a list or a tensor; ``generate`` resolves
    it on the config it passes, from its arguments and the model's generation config); empty when there are none."""
    eos = generation_config.eos_token_id
    return [] if eos is None else [int(t) for t in torch.as_tensor(eos, device="cpu").flatten().tolist()]


def prepare_cache(model, input_ids: torch.Tensor, model_kwargs: dict) -> tuple[Cache, int]:
    """The cache the tree loops verify into (``generate``'s, else a new ``DynamicCache``; of full layers for a model
    with sliding-window layers, ``sliding_window.verification_cache``) and how many prompt tokens it holds already."""
    cache = verification_cache(model, cache_of(model_kwargs))
    check_cache_supported(cache)
    past = cache.get_seq_length()
    if past >= input_ids.shape[1]:
        raise SpecDecError("the passed cache already covers the whole prompt; pass at least one new token")
    return cache, past


def logits_to_keep(model, rows: int) -> dict:
    """``{"logits_to_keep": rows}`` for a model that supports it (the lm head then runs on the last rows only)."""
    return {"logits_to_keep": rows} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


def resolve_streamer(input_ids: torch.Tensor, streamer, specdec_streamer, **deprecated):
    """The streamer the loop feeds: ``specdec_streamer`` (the prompt is put into it here, as ``generate`` does with
    its own), else ``streamer`` (a direct call's). ``deprecated``: the old per-method keywords (module docstring)."""
    for keyword, value in deprecated.items():
        if value is not None:
            warnings.warn(
                f"{keyword}= is deprecated; pass {STREAMER_KEYWORD}= (the streamer keyword of every hf_specdec "
                "method)",
                FutureWarning,
                stacklevel=2,
            )
            specdec_streamer = value if specdec_streamer is None else specdec_streamer
    if specdec_streamer is None:
        return streamer
    specdec_streamer.put(input_ids.cpu())
    return specdec_streamer


class StopRule:
    """The stopping criteria of a generation, checked on the host when they are only a length limit and EOS ids
    (``MaxLengthCriteria`` / ``EosTokenCriteria``, what ``generate`` builds by default): then appending a step's
    tokens costs no device read, where calling the criteria would read a flag back once per emitted token. Any other
    criterion (stop strings, a user's own) is called as a plain loop calls it, token by token."""

    def __init__(self, stopping_criteria: StoppingCriteriaList):
        self.criteria = stopping_criteria
        self.max_length: int | None = None
        self.eos: set[int] = set()
        self.on_host = all(isinstance(c, (MaxLengthCriteria, EosTokenCriteria)) for c in stopping_criteria)
        if self.on_host:  # read once per generation
            for c in stopping_criteria:
                if isinstance(c, MaxLengthCriteria):
                    self.max_length = min(c.max_length, self.max_length or c.max_length)
                else:
                    self.eos |= {
                        int(t) for t in torch.as_tensor(c.eos_token_id, device="cpu").flatten().tolist()
                    }

    def append(self, input_ids: torch.Tensor, tokens: Sequence[int]) -> tuple[torch.Tensor, bool]:
        """Append ``tokens`` up to and including the first one that ends generation (EOS, max length, stop strings...),
        as a plain loop would; returns the new ids and whether generation is finished."""
        if not self.on_host:
            for t in tokens:
                input_ids = torch.cat([input_ids, input_ids.new_tensor([[t]])], dim=-1)
                if bool(self.criteria(input_ids, None).any()):
                    return input_ids, True
            return input_ids, False
        tokens, done = list(tokens), False
        for i, t in enumerate(tokens):
            if t in self.eos or (
                self.max_length is not None and input_ids.shape[1] + i + 1 >= self.max_length
            ):
                tokens, done = tokens[: i + 1], True
                break
        return torch.cat([input_ids, input_ids.new_tensor([tokens])], dim=-1), done


class GenerateOutputs:
    """The per-token outputs ``generate(return_dict_in_generate=True, output_scores=..., ...)`` returns, one entry
    per new token as ``_sample`` reports them. Kinds a loop does not produce (``kinds``) stay ``None``."""

    KINDS = ("scores", "logits", "hidden_states", "attentions")

    def __init__(self, generation_config: GenerationConfig, kinds: Sequence[str] = KINDS):
        self.return_dict = bool(generation_config.return_dict_in_generate)
        for kind in self.KINDS:
            wanted = self.return_dict and kind in kinds and getattr(generation_config, f"output_{kind}")
            setattr(self, kind, [] if wanted else None)

    def add(self, scores: Sequence[torch.Tensor], logits: torch.Tensor | None = None) -> None:
        """The processed ``scores`` of the emitted tokens and, per token, its row of the raw ``logits``."""
        if self.scores is not None:
            self.scores += scores
        if self.logits is not None:
            self.logits += [logits[j : j + 1] for j in range(len(scores))]

    def result(self, input_ids: torch.Tensor, cache: Cache) -> GenerateDecoderOnlyOutput | torch.Tensor:
        """What ``generate`` returns: the sequences, or with ``return_dict_in_generate`` the output object."""
        if not self.return_dict:
            return input_ids
        kept = {
            kind: None if getattr(self, kind) is None else tuple(getattr(self, kind)) for kind in self.KINDS
        }
        return GenerateDecoderOnlyOutput(sequences=input_ids, **kept, **{CACHE_ARGUMENT: cache})


def finish(stats: DecodeStats, streamer, t_start: float, device: torch.device, tick=clock) -> None:
    """End the stream and total the statistics of a generation that started at ``t_start`` (``tick(device)``;
    ``tick`` is ``timing.untimed`` when nobody asked for statistics)."""
    if streamer is not None:
        streamer.end()
    stats.new_tokens = sum(s["new_tokens"] for s in stats.steps)
    stats.total_time += tick(device) - t_start
