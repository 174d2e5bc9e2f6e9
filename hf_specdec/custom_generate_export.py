"""``hf-specdec export-custom-generate METHOD DIR``: a decoding strategy in the Hub's own ``custom_generate`` form.

transformers loads a community decoding strategy from a Hub repo or a local folder with
``model.generate(..., custom_generate="org/repo" or DIR, trust_remote_code=True)``: it runs the function
``generate(model, *args, **kwargs)`` of ``custom_generate/generate.py`` (called with every argument the user gave
``generate``) after checking that the packages ``generate.py`` imports and those ``custom_generate/requirements.txt``
lists are installed. Sibling modules are allowed only as single-level relative imports (``from .name import x``
is resolved to ``custom_generate/name.py``, locally and from the Hub; ``from ..x`` and ``from .a.b`` are not).

So the export is self-contained: the hf_specdec modules the method needs (the import closure of its loop, found
by reading the sources) are copied flat into ``custom_generate/`` as ``<package>_<module>.py`` with every
``hf_specdec`` import rewritten to that form; ``generate.py`` is a small wrapper that hands our loop to
transformers' ``generate`` as a callable ``custom_generate``. Nothing imports ``hf_specdec`` at run time, so the
folder works where it is not installed (``tests/test_custom_generate_export.py`` runs it with ``hf_specdec``
blocked). Methods that need a trained drafter (GLIDE+CAPE, EDD+PCT) are not exported: their drafter classes live in
``hf_specdec.modeling`` and are shared as model repos instead.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import SpecDecError

PACKAGE = "hf_specdec"
_IMPORT_HEAD = re.compile(r"from\s+\.*[\w.]*\s+import")


@dataclass(frozen=True)
class Export:
    """One exportable method: the module and function of its ``custom_generate`` loop and the wrapper's text."""

    module: str
    loop: str
    title: str
    wrapper: str


def _source(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        raise SpecDecError(f"cannot bundle {module}: no Python source found")
    return Path(spec.origin)


def flat_name(module: str) -> str:
    """``hf_specdec.core.tree`` -> ``core_tree``: the module's file name inside ``custom_generate/``."""
    parts = module.split(".")
    if parts[0] != PACKAGE or len(parts) < 2:
        raise SpecDecError(f"cannot bundle {module}: only {PACKAGE} submodules are bundled")
    return "_".join(parts[1:])


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str | None:
    """The absolute ``hf_specdec`` module ``node`` imports from, or None for a third-party import."""
    if node.level == 0:
        name = node.module or ""
        return name if name == PACKAGE or name.startswith(PACKAGE + ".") else None
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    if node.module is None:
        raise SpecDecError(
            f"cannot bundle {module}: `from {'.' * node.level} import ...` (line {node.lineno}); "
            "import from the module itself"
        )
    return ".".join([*base, node.module])


def _rewrite(module: str) -> tuple[str, list[str]]:
    """``module``'s source with its ``hf_specdec`` imports made ``from .flat import``, and the modules it imports."""
    path = _source(module)
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    needed: list[str] = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import) and any(
            a.name == PACKAGE or a.name.startswith(PACKAGE + ".") for a in node.names
        ):
            raise SpecDecError(f"cannot bundle {module}: `import {PACKAGE}...` (line {node.lineno})")
        if not isinstance(node, ast.ImportFrom):
            continue
        target = _resolve(module, path.name == "__init__.py", node)
        if target is None:
            continue
        needed.append(target)
        i = node.lineno - 1
        head, tail = lines[i][: node.col_offset], lines[i][node.col_offset :]
        lines[i] = head + _IMPORT_HEAD.sub(f"from .{flat_name(target)} import", tail, count=1)
    header = f"# Bundled from {PACKAGE}/{path.relative_to(_source(PACKAGE).parent)} by `hf-specdec export-custom-generate`.\n"
    return header + "".join(lines), needed


def bundle(entry: str) -> dict[str, str]:
    """``{flat file name: source}`` of ``entry`` and every ``hf_specdec`` module it imports, transitively."""
    files: dict[str, str] = {}
    todo, seen = [entry], set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        text, needed = _rewrite(module)
        files[f"{flat_name(module)}.py"] = text
        todo.extend(needed)
    if "generate.py" in files:
        raise SpecDecError("cannot bundle: a bundled module would overwrite custom_generate/generate.py")
    return files


_PLD_PLUS_WRAPPER = '''"""PLD+ (arXiv:2412.01447): prompt lookup ranked by the target's hidden states or induction heads, lossless, as a
transformers ``custom_generate`` strategy. Exported by `hf-specdec export-custom-generate pld_plus` from
hf_specdec {version}; the other modules in this folder are hf_specdec's, bundled, so it is not needed here."""

from transformers.generation.utils import GenerationMixin

from .pld_plus_generate import pld_plus


def generate(model, *args, **kwargs):
    """Every ``generate`` argument plus PLD+'s ``pld_*`` keywords, as ``custom_generate=hf_specdec.pld_plus`` takes
    them; our loop runs inside transformers' own ``generate`` (input preparation, stopping, output format)."""
    return GenerationMixin.generate(model, *args, custom_generate=pld_plus, **kwargs)
'''

_TREE_LOOKUP_WRAPPER = '''"""Token-tree speculative decoding with the n-gram lookup tree (no drafter), lossless, as a transformers
``custom_generate`` strategy. Exported by `hf-specdec export-custom-generate tree_lookup` from hf_specdec
{version}; the other modules in this folder are hf_specdec's, bundled, so it is not needed here."""

from transformers.generation.utils import GenerationMixin

from .core_ngram_tree import NGramTreeProposer
from .core_tree_decoding import tree_generate


def generate(model, *args, tree_ngram=3, tree_tokens=10, tree_branches=4, tree_nodes=48, tree_random=2, **kwargs):
    """Every ``generate`` argument; the tree: the last ``tree_ngram``-gram's ``tree_branches`` latest earlier
    matches, ``tree_tokens`` tokens each, at most ``tree_nodes`` nodes, plus ``tree_random`` random root siblings."""
    proposer = NGramTreeProposer(tree_ngram, tree_tokens, tree_branches, tree_nodes, tree_random)
    return GenerationMixin.generate(model, *args, custom_generate=tree_generate, proposer=proposer, **kwargs)
'''

EXPORTS = {
    "pld_plus": Export(
        "hf_specdec.pld_plus.generate",
        "hf_specdec.pld_plus",
        "PLD+ (prompt lookup ranked by the target's own hidden states / induction heads)",
        _PLD_PLUS_WRAPPER,
    ),
    "tree_lookup": Export(
        "hf_specdec.core.ngram_tree",
        "hf_specdec.tree_generate + hf_specdec.core.ngram_tree.NGramTreeProposer",
        "token-tree speculative decoding with an n-gram lookup tree (no drafter)",
        _TREE_LOOKUP_WRAPPER,
    ),
}
NOT_EXPORTED = {
    "glide_cape": "GLIDE+CAPE needs a trained GLIDE drafter",
    "edd_pct": "EDD+PCT needs a trained EDD drafter",
    "space": "SPACE needs a SAR-SFT fine-tuned model",
}


def requirements() -> str:
    """``custom_generate/requirements.txt``: torch and transformers at hf_specdec's own lower bounds."""
    import importlib.metadata

    lines = []
    for name in ("torch", "transformers"):
        spec = next((r for r in importlib.metadata.requires(PACKAGE) or [] if re.match(rf"{name}\b", r)), "")
        lower = re.search(r">=\s*([\w.]+)", spec)
        if lower is None:
            raise SpecDecError(
                f"hf_specdec's metadata names no lower bound for {name} ({spec!r}); reinstall it"
            )
        lines.append(f"{name}>={lower.group(1)}")
    return "\n".join(lines) + "\n"


def export_custom_generate(method: str, folder: str | Path) -> Path:
    """Write ``folder/custom_generate/{generate.py, requirements.txt, bundled modules}`` and ``folder/README.md``
    for ``method`` (a key of :data:`EXPORTS`); returns ``folder``."""
    from . import __version__
    from .custom_generate_card import strategy_card

    if method in NOT_EXPORTED:
        raise SpecDecError(
            f"{method} is not exportable as custom_generate: {NOT_EXPORTED[method]}, which loads through "
            f"hf_specdec.modeling (share the drafter as a model repo instead); exportable: {', '.join(EXPORTS)}"
        )
    if method not in EXPORTS:
        raise SpecDecError(f"unknown method {method!r}; exportable: {', '.join(EXPORTS)}")
    spec = EXPORTS[method]
    folder = Path(folder)
    code = folder / "custom_generate"
    if code.exists() and any(code.iterdir()):
        raise SpecDecError(f"{code} is not empty; export into a new folder")
    code.mkdir(parents=True, exist_ok=True)
    for name, text in bundle(spec.module).items():
        (code / name).write_text(text)
    (code / "generate.py").write_text(spec.wrapper.format(version=__version__))
    (code / "requirements.txt").write_text(requirements())
    strategy_card(method, spec.title, spec.loop, sorted(p.name for p in code.glob("*.py"))).save(
        folder / "README.md"
    )
    return folder
