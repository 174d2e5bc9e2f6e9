"""``hf-specdec train glide|edd --eval-only``: validate a saved drafter (``--init-from DIR``) as it is, on the rows the
run's validation options name, with the figures of a training run's final validation (``DrafterTrainer.evaluate``).
``run.py`` builds the target, rows and ``Trainer`` as for training and hands over here instead of training.
"""

from __future__ import annotations

import json
from pathlib import Path

from hf_specdec.errors import SpecDecError

from ..data.rows import validation_rows, validation_source


def eval_only_checked(args) -> bool:
    """Whether the run is ``--eval-only``, checked before the target loads: it validates the ``--init-from``
    drafter as it is, so it needs one and takes no option that only training uses."""
    if not getattr(args, "eval_only", False):
        if getattr(args, "add_to_card", False):
            raise SpecDecError("--add-to-card records an --eval-only validation: add --eval-only")
        return False
    if not getattr(args, "init_from", None):
        raise SpecDecError("--eval-only validates a saved drafter: name it with --init-from DIR")
    unused = [
        flag
        for flag, value in (
            ("--features", args.features),
            ("--draft-vocab", getattr(args, "draft_vocab", 0)),
            ("--resume", args.resume),
            ("--skip-train-rows", getattr(args, "skip_train_rows", 0)),
        )
        if value
    ]
    if unused:
        raise SpecDecError(
            f"--eval-only does not train, so {', '.join(unused)} would do nothing; drop "
            f"{'it' if len(unused) == 1 else 'them'} (the drafter keeps its own draft vocabulary)"
        )
    return True


def write_eval_results(args, trainer) -> int:
    """``--eval-only``: the drafter's validation figures (``DrafterTrainer.evaluate``: KL, CE, top-1, round-start
    top-1, expected acceptance alpha), printed and written to ``--output-dir/eval_results.json`` with the drafter
    and the rows they were measured on."""
    metrics = trainer.evaluate()
    if not trainer.is_world_process_zero():
        return 0
    results = {
        "drafter": str(args.init_from),
        **{k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items() if k != "epoch"},
        "validation_rows": validation_rows(args),
        "validation_source": validation_source(args),
        "command": getattr(args, "command_line", ""),
    }
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval_results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))
    print(f"wrote {out / 'eval_results.json'}")
    if getattr(args, "add_to_card", False):
        from .card import add_evaluation

        evaluation = {
            "rows": results["validation_rows"],
            "source": results["validation_source"],
            "figures": {k.removeprefix("eval_"): v for k, v in results.items() if k.startswith("eval_")},
            "command": results["command"],
        }
        kind = trainer.accelerator.unwrap_model(trainer.model).config.model_type.removeprefix("hf_specdec_")
        print(f"recorded in {add_evaluation(args.init_from, evaluation, kind)}")
    return 0
