"""Bench methods, pluggable by name.

A method is a class with a ``name``, an optional ``setup(ctx)`` (load a drafter, a heads file...) and
``generate(input_ids, max_new_tokens) -> (new_tokens, stats or None)``. Returning ``None`` for the
stats lets the harness infer them from the target's forwards (see ``stats.ForwardMeter.chain_stats``),
which is right for every draft-then-verify chain or tree loop that feeds the drafted tokens to the
target. Register with ``@register``; modules that define methods are listed in ``PLUGIN_MODULES``.

Batches (``hf-specdec bench --batch-size B``): ``generate_batch(input_ids, attention_mask, max_new_tokens) ->
(per-row new tokens, stats or None)`` takes a left-padded batch. The default, :meth:`Method.generate_rows`, runs the
rows one at a time through ``generate`` (what a transformers user does for assisted generation with transformers'
own assistants, which refuse a batch; hf_specdec's chain drafters take one, :func:`batched_assisted`). A method opts in to one batched call by overriding ``generate_batch`` and setting ``batchable = True``; the
harness calls ``generate_rows`` for every method whose ``batchable`` is False, and the report marks those rows.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
from dataclasses import dataclass, field

import torch

from ..core.assisted import batch_stats
from ..core.batch_io import pad_token_id, split_rows, unpad_rows
from ..core.generate_io import eos_token_ids
from ..core.host_syncs import HostSyncCounter
from ..core.stats import DecodeStats, DrafterMeter, ForwardMeter
from ..core.timing import clock
from ..errors import SpecDecError

# Modules that register more methods on import (one line each; a missing optional part is skipped).
PLUGIN_MODULES: list[str] = [
    "hf_specdec.bench.tree_methods",
    "hf_specdec.bench.pld_methods",
    "hf_specdec.bench.glide_methods",
    "hf_specdec.bench.space_methods",
    "hf_specdec.bench.edd_methods",
]


@dataclass
class BenchContext:
    model: torch.nn.Module
    tokenizer: object
    dtype: str
    options: dict = field(default_factory=dict)  # --option KEY=VALUE of the CLI (glide=PATH, gamma=3 ...)
    model_name: str | None = None  # --model as given (None: the default target), for methods that check it


class Method:
    name = ""
    description = ""
    drafter = None  # a drafter model (GLIDE / EDD) whose cost c the bench reports; None for the others
    # True: ``generate_batch`` decodes a whole batch in one ``model.generate`` call (bench --batch-size B > 1);
    # False: the bench runs the batch's rows one at a time (``generate_rows``) and says so in its report.
    batchable = False

    def setup(self, ctx: BenchContext) -> None:
        self.ctx = ctx
        # what it decodes: a method that decodes a model of its own replaces it (``bench/own_models.py``)
        self.model = ctx.model

    def generate(
        self, input_ids: torch.Tensor, max_new_tokens: int
    ) -> tuple[torch.Tensor, DecodeStats | None]:
        raise NotImplementedError

    def generate_batch(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int
    ) -> tuple[list[list[int]], DecodeStats | None]:
        """New tokens of every row of a left-padded batch (each cut after its first EOS) and the stats of the
        whole batch (``target_forwards`` counted per row: a forward over r active rows counts r; ``None``: the
        harness infers them). Default: :meth:`generate_rows`; a method that batches overrides this and sets
        ``batchable = True``."""
        return self.generate_rows(input_ids, attention_mask, max_new_tokens)

    def generate_rows(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int
    ) -> tuple[list[list[int]], DecodeStats]:
        """The batch's rows one at a time, each unpadded, through :meth:`generate`; the rows' stats summed."""
        rows, total = [], DecodeStats()
        for row in unpad_rows(input_ids, attention_mask):
            tokens, stats = run_row(self, self.model, row, max_new_tokens)
            rows.append(tokens)
            for key in (
                "new_tokens",
                "target_forwards",
                "drafted",
                "accepted",
                "draft_time",
                "verify_time",
                "total_time",
            ):
                setattr(total, key, getattr(total, key) + getattr(stats, key))
            total.steps.extend(stats.steps)
        return rows, total


METHODS: dict[str, type[Method]] = {}

# The decoding of every bench generation: greedy, or sampling inside ``sampling(T)`` (``bench --temperature T``).
_DECODING: contextvars.ContextVar[dict | None] = contextvars.ContextVar("bench_decoding", default=None)


def decoding() -> dict:
    """The ``generate`` keywords that choose greedy or sampling for the bench generation being made."""
    return dict(_DECODING.get() or {"do_sample": False})


@contextlib.contextmanager
def sampling(temperature: float | None):
    """Inside the block every bench generation samples at ``temperature`` from the whole distribution (top-k and
    top-p off), as the papers' T = 1 rows do; ``None`` or 0 leaves it greedy."""
    if not temperature:
        yield
        return
    if temperature < 0:
        raise SpecDecError(f"--temperature must be > 0 (got {temperature}); leave it out for greedy decoding")
    token = _DECODING.set({"do_sample": True, "temperature": float(temperature), "top_k": 0, "top_p": 1.0})
    try:
        yield
    finally:
        _DECODING.reset(token)


def register(cls: type[Method]) -> type[Method]:
    METHODS[cls.name] = cls
    return cls


@contextlib.contextmanager
def metered(method, model, syncs: HostSyncCounter | None = None):
    """The target's :class:`ForwardMeter` and, for a method with a drafter, its :class:`DrafterMeter` (``None``
    otherwise), both pausing ``syncs`` inside their forwards: what the bench's per-step split reads."""
    with contextlib.ExitStack() as stack:
        meter = stack.enter_context(ForwardMeter(model))
        meter.syncs = syncs
        drafter = getattr(method, "drafter", None)
        drafter_meter = None if drafter is None else stack.enter_context(DrafterMeter(drafter, syncs))
        yield meter, drafter_meter


def run_row(
    method, model, input_ids: torch.Tensor, max_new_tokens: int, count_syncs: bool = False
) -> tuple[list[int], DecodeStats]:
    """One timed ``method.generate`` on one unpadded prompt (1, P), stats inferred from ``model``'s forwards when the
    method returns none (``ForwardMeter.chain_stats``), with the per-step split (target / drafter forwards) filled
    in. ``count_syncs``: also count the host syncs outside forwards (``core/host_syncs.py``; for an untimed pass:
    counting slows the loop down)."""
    syncs = HostSyncCounter() if count_syncs else contextlib.nullcontext()
    with syncs, metered(method, model, syncs if count_syncs else None) as (meter, drafter_meter):
        t0 = clock(meter.device)
        tokens, stats = method.generate(input_ids, max_new_tokens)
        elapsed = clock(meter.device) - t0
    tokens = [int(t) for t in tokens]
    if stats is None:
        stats = meter.chain_stats(input_ids.shape[1], len(tokens), elapsed)
    stats.new_tokens, stats.total_time = len(tokens), elapsed
    if not stats.target_forwards:
        stats.target_forwards, stats.verify_time = meter.calls, meter.time
    meter.split(stats, drafter_meter)
    if count_syncs:
        stats.host_syncs = syncs.total
    return tokens, stats


def batched_greedy(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int, pad_id: int, **kwargs
) -> list[list[int]]:
    """Greedy (or, under ``sampling``, sampled) ``model.generate`` on a left-padded batch with ``kwargs``; returns each row's new tokens (see
    :func:`split_rows`)."""
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        max_new_tokens=max_new_tokens,
        pad_token_id=pad_id,
        **decoding(),
        **kwargs,
    )
    return split_rows(out, input_ids.shape[1], eos_token_ids(model.generation_config))


def batched_greedy_with_stats(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int, pad_id: int, **kwargs
) -> tuple[list[list[int]], DecodeStats]:
    """:func:`batched_greedy` for a ``custom_generate`` loop that fills its own ``stats=DecodeStats()``."""
    stats = DecodeStats()
    rows = batched_greedy(model, input_ids, attention_mask, max_new_tokens, pad_id, stats=stats, **kwargs)
    return rows, stats


def batched_assisted(
    method: Method, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int
) -> tuple[list[list[int]], DecodeStats]:
    """``method``'s batch through ``generate(assistant_model=method.drafter)`` (an hf_specdec chain drafter: the
    batched tree loop, ``core/assisted.py``), its ``DecodeStats`` collected with ``assisted.batch_stats`` (``generate``
    takes no ``stats=`` for assisted generation). A batch of one row goes through :meth:`Method.generate_rows` (stats
    inferred from the target's forwards, as at batch 1)."""
    if input_ids.shape[0] == 1:
        return method.generate_rows(input_ids, attention_mask, max_new_tokens)
    args = (method.model, input_ids, attention_mask, max_new_tokens, pad_token_id(method.ctx.tokenizer))
    with batch_stats() as stats:
        rows = batched_greedy(*args, assistant_model=method.drafter)
    return rows, stats


def greedy_new_tokens(model, input_ids: torch.Tensor, max_new_tokens: int, **kwargs) -> torch.Tensor:
    """Greedy (or, under ``sampling``, sampled) ``model.generate`` (batch 1, no padding) with ``kwargs``; returns the new tokens only."""
    out = model.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=max_new_tokens,
        **decoding(),
        **kwargs,
    )
    return out[0, input_ids.shape[1] :]


def greedy_with_stats(
    model, input_ids: torch.Tensor, max_new_tokens: int, **kwargs
) -> tuple[torch.Tensor, DecodeStats]:
    """:func:`greedy_new_tokens` for a ``custom_generate`` loop that fills its own ``stats=DecodeStats()`` (trees,
    SPACE: their forwards are not "1 + drafted" tokens, so the harness cannot infer tau from the target's forwards)."""
    stats = DecodeStats()
    return greedy_new_tokens(model, input_ids, max_new_tokens, stats=stats, **kwargs), stats


class GenerateCallMethod(Method):
    """A method that is one greedy ``model.generate(**generate_kwargs())`` call, at batch 1 (``generate``) and on a
    left-padded batch (``generate_batch``). ``stats_kwarg``: the call takes ``stats=DecodeStats()`` and fills it
    (tree loops, SPACE); otherwise the harness infers the stats from the target's forwards. ``batchable`` stays
    False until the ``custom_generate`` loop accepts a batch; set it True to bench the batched call."""

    stats_kwarg = False

    def generate_kwargs(self) -> dict:
        raise NotImplementedError

    def generate(self, input_ids, max_new_tokens):
        if self.stats_kwarg:
            return greedy_with_stats(self.model, input_ids, max_new_tokens, **self.generate_kwargs())
        return greedy_new_tokens(self.model, input_ids, max_new_tokens, **self.generate_kwargs()), None

    def generate_batch(self, input_ids, attention_mask, max_new_tokens):
        args = (self.model, input_ids, attention_mask, max_new_tokens, pad_token_id(self.ctx.tokenizer))
        if self.stats_kwarg:
            return batched_greedy_with_stats(*args, **self.generate_kwargs())
        return batched_greedy(*args, **self.generate_kwargs()), None


@register
class AutoRegressive(Method):
    name = "ar"
    description = "plain greedy model.generate (the reference)"

    batchable = True

    def generate(self, input_ids, max_new_tokens):
        return greedy_new_tokens(self.model, input_ids, max_new_tokens), None

    def generate_batch(self, input_ids, attention_mask, max_new_tokens):
        """Plain batched greedy ``generate``. A row is active in a forward until it has its last token, so its
        forwards equal its new tokens (tau 1, as at batch 1); finished rows still ride in the batch (padding)."""
        rows = batched_greedy(
            self.model, input_ids, attention_mask, max_new_tokens, pad_token_id(self.ctx.tokenizer)
        )
        n = sum(len(r) for r in rows)
        return rows, DecodeStats(new_tokens=n, target_forwards=n)


@register
class StockAutoRegressive(AutoRegressive):
    name = "ar-stock"
    description = "plain greedy model.generate of a copy of the target on stock kernels (bench --kernels)"
    # its model is a copy of the target, not a model of its own: its outputs are judged against `ar`'s
    same_target = True


@register
class HFPromptLookup(Method):
    name = "hf-pld"
    description = "transformers' prompt lookup decoding (prompt_lookup_num_tokens=10)"
    # transformers refuses a batch for assisted generation: at B > 1 its rows run one at a time (generate_rows),
    # which is what a transformers user has today.
    batchable = False

    def generate(self, input_ids, max_new_tokens):
        return greedy_new_tokens(self.model, input_ids, max_new_tokens, prompt_lookup_num_tokens=10), None


def available_methods() -> dict[str, type[Method]]:
    """Every registered method. A plugin module whose optional third-party dependency is missing is skipped; an
    import error inside this package (a bug) is raised, so a broken module never silently drops its methods."""
    for module in PLUGIN_MODULES:
        try:
            importlib.import_module(module)
        except ImportError as err:
            missing = (err.name or "").split(".")[0]
            if not missing or missing in ("hf_specdec", "modeling", "trainers"):
                raise
    return METHODS


def get_method(name: str) -> type[Method]:
    methods = available_methods()
    if name not in methods:
        raise SpecDecError(f"unknown method {name!r}; choose from {', '.join(methods)}")
    return methods[name]
