"""What every training run (``hf-specdec train glide``, ``train edd``, ``train space``) shares around the
``Trainer``: stopping on a time budget, resuming from the last checkpoint, and writing the model card."""

from __future__ import annotations

import json
import time
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData
from transformers import TrainerCallback


class TimeLimitCallback(TrainerCallback):
    """Stop (and save) once training has run ``max_seconds`` of wall time (in any process: they all stop at the
    same step), or at optimizer step ``stop_at_step``; the learning-rate schedule stays the one of ``max_steps`` (so a run stopped at step N matches
    another run's state at step N: equal-budget ablations)."""

    def __init__(self, max_seconds: float | None, stop_at_step: int | None = None):
        self.max_seconds = max_seconds
        self.stop_at_step = stop_at_step
        self.start = None

    @classmethod
    def from_args(cls, args) -> TimeLimitCallback:
        """From the trainers' ``--max-minutes`` and ``--stop-at-step`` (``trainers/drafters/options.py``)."""
        return cls(args.max_minutes * 60 if args.max_minutes else None, getattr(args, "stop_at_step", None))

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        timed_out = bool(self.max_seconds) and time.perf_counter() - self.start > self.max_seconds
        if (
            self.max_seconds and args.world_size > 1
        ):  # all processes stop at the same step, or they would hang
            import torch

            flag = torch.tensor([float(timed_out)], device=args.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            timed_out = bool(flag.item())
        if timed_out or (self.stop_at_step and state.global_step >= self.stop_at_step):
            control.should_training_stop = True
            control.should_save = True
        return control


def mixed_precision_bf16(args) -> bool:
    """Whether the run trains in bf16 mixed precision: ``--precision`` resolved like ``--dtype auto``
    (``hf_specdec.machine.resolve_auto_dtype``); a Namespace without it (programmatic runs) trains in fp32."""
    import torch

    from hf_specdec.machine import cpu_has_native_bf16, resolve_auto_dtype

    device = "cuda" if torch.cuda.is_available() else "cpu"
    bf16 = resolve_auto_dtype(getattr(args, "precision", None) or "fp32", device) == "bf16"
    if bf16 and device == "cpu" and not cpu_has_native_bf16():
        print("--precision bf16 on a CPU without native bf16: mixed precision is emulated there (slower)")
    return bf16


def step_autocast(args, device):
    """A drafter training step's autocast (``TrainingArguments.bf16``, or ``fp16`` on a GPU): the ``Trainer``
    (accelerate) puts only the model's ``forward`` under autocast, which for a drafter is its one layer; the frozen
    target's pass and the LM heads, most of a step's work, would stay fp32 without this and a bf16 step would cost
    what an fp32 one does. Validation does not use it (the target's pass stays fp32 there)."""
    import torch

    half = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else None
    return torch.autocast(device.type, dtype=half or torch.float32, enabled=half is not None)


def shared_training_arguments(args) -> dict:
    """The ``TrainingArguments`` every recipe shares (glide, edd, space): the same output folder, steps, batch sizes
    and cosine schedule fields, logging / evaluation / checkpoints every N steps (two kept), the batches built in the
    process (no workers, all columns kept for the collator), the seed, no reporting, the CPU (gloo) off CUDA, and bf16
    mixed precision as ``--precision`` resolves (:func:`mixed_precision_bf16`)."""
    import torch

    return dict(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        lr_scheduler_type="cosine",
        logging_steps=args.logging_steps,
        eval_strategy="steps",
        eval_steps=args.eval_steps,
        save_strategy="steps",
        save_steps=args.save_steps,
        save_total_limit=2,
        report_to=[],
        remove_unused_columns=False,
        dataloader_num_workers=0,
        seed=args.seed,
        use_cpu=not torch.cuda.is_available(),
        bf16=mixed_precision_bf16(args),
    )


def last_checkpoint(output_dir: str | Path) -> str | None:
    """The newest ``checkpoint-N`` folder the ``Trainer`` saved in ``output_dir`` (``get_last_checkpoint``), if any."""
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(str(output_dir)) if Path(output_dir).is_dir() else None


def resume_point(output_dir: str | Path, resume: bool | None) -> str | None:
    """The checkpoint a ``train`` run continues from, one policy for every recipe (that of HF's example scripts):

    - ``resume=None`` (the default): the last ``checkpoint-N`` in ``output_dir`` if it holds one, else a fresh run;
    - ``True`` (``--resume``): that checkpoint, and an error when there is none;
    - ``False`` (``--no-resume``): a fresh run, refused when the folder holds an earlier run's checkpoints (the
      ``Trainer`` would rotate them away and overwrite the model, and a later resume could pick a stale one).

    Called before the model loads, so a refusal costs nothing; prints the checkpoint it resumes from.
    """
    from hf_specdec.errors import SpecDecError

    last = last_checkpoint(output_dir)
    if resume and last is None:
        raise SpecDecError(f"--resume: no checkpoint-* folder in {output_dir}; drop --resume to start fresh")
    if resume is False and last is not None:
        raise SpecDecError(
            f"{output_dir} holds {Path(last).name} of an earlier run: drop --no-resume to continue it, or give "
            "another --output-dir (or delete its checkpoint-* folders) to start a new run"
        )
    if last is not None:
        print(f"resuming from {last}")
    return last


def timed_train(trainer, resume: str | None):
    """``trainer.train(resume_from_checkpoint=resume)``, timed for the card's training speed: ``(its result, wall
    seconds, optimizer steps it ran)``; a resumed run counts only the steps since its checkpoint."""
    from transformers import TrainerState

    start = TrainerState.load_from_json(str(Path(resume) / "trainer_state.json")).global_step if resume else 0
    t0 = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=resume)
    return result, time.perf_counter() - t0, trainer.state.global_step - start


def per_hour(count: float, seconds: float) -> float:
    """A training speed: ``count`` (tokens, samples) per hour of ``seconds``."""
    return count * 3600 / max(seconds, 1e-9)


def write_card(
    folder: str | Path,
    info: dict,
    intro: list[str],
    rows: list[tuple[str, object]],
    footer: list[str],
    header: str = "| | |",
    json_name: str = "model_card.json",
    card_data: ModelCardData | None = None,
) -> Path:
    """Write a model card into ``folder``: ``json_name`` (``info``, machine-readable) and ``README.md`` = the
    ``card_data`` as the Hub's YAML metadata (``huggingface_hub.ModelCard``), then the ``intro`` lines, a
    two-column table (``header``, then one ``| label | value |`` row per ``rows`` entry; a dict value is written
    ``key value, ...``) and the ``footer`` lines. Returns the README's path."""
    folder = Path(folder)
    lines = [*intro, "", header, "|---|---|"]
    for label, value in rows:
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        lines.append(f"| {label} | {value} |")
    lines += ["", *footer, ""]
    (folder / json_name).write_text(json.dumps(info, indent=1))
    path = folder / "README.md"
    meta = f"---\n{card_data.to_yaml()}\n---\n" if card_data is not None else ""
    ModelCard(meta + "\n".join(lines)).save(path)
    return path
