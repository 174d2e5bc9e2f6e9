"""``hf-specdec train {glide,edd,space,...}``: each recipe is a module with ``add_arguments(parser)`` and
``run(args)``; add new ones to ``RECIPES``."""

from __future__ import annotations

import importlib

RECIPES: dict[str, str] = {
    "space": "hf_specdec.trainers.space.train",
    "glide": "hf_specdec.trainers.drafters.glide",
    "edd": "hf_specdec.trainers.drafters.edd",
}


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train a drafter or fine-tune a model (resumable, with progress)")
    recipes = p.add_subparsers(dest="recipe", metavar="RECIPE")
    recipes.required = True
    for name, module in RECIPES.items():
        mod = importlib.import_module(module)
        rp = recipes.add_parser(
            name, help=(mod.__doc__ or "").strip().splitlines()[0] if mod.__doc__ else None
        )
        mod.add_arguments(rp)
        rp.set_defaults(func=mod.run)
