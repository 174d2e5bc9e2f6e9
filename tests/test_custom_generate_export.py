"""`hf-specdec export-custom-generate`: the exported folder is what transformers' loader accepts, is self-contained,
and decodes exactly as our own entry point. The exported folder is called in a separate Python (``-I``) where
``hf_specdec`` cannot be imported, offline, with its module cache in a temp folder."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers.dynamic_module_utils import get_imports

import hf_specdec
from hf_specdec.cli import main
from hf_specdec.core.ngram_tree import NGramTreeProposer
from hf_specdec.custom_generate_export import export_custom_generate
from tests.conftest import tiny_llama

RUNNER = r"""
import json, sys
sys.modules["hf_specdec"] = None  # `import hf_specdec` (and any submodule) now raises ImportError
import torch
from transformers import AutoModelForCausalLM
spec = json.loads(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32).eval()
tokens = []
for job in spec["jobs"]:
    ids = torch.tensor([job["prompt"]])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), custom_generate=job["dir"],
                         trust_remote_code=True, **job["kwargs"])
    tokens.append(out[0].tolist())
loaded = sorted(m.__file__ for n, m in list(sys.modules.items())
                if n.startswith("transformers_modules") and getattr(m, "__file__", None))
ours = [n for n, m in sys.modules.items() if n.startswith("hf_specdec") and m is not None]
print(json.dumps({"tokens": tokens, "loaded": loaded, "hf_specdec": ours}))
"""


def run_isolated(tmp_path, model_dir, jobs) -> dict:
    """Run ``jobs`` (``custom_generate=DIR``) in ``python -I`` with hf_specdec blocked; tokens and loaded files."""
    cache = tmp_path / "modules"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    spec = json.dumps({"model": str(model_dir), "jobs": jobs})
    proc = subprocess.run(
        [sys.executable, "-I", "-c", RUNNER, spec], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["hf_specdec"] == []
    assert result["loaded"] and all(f.startswith(str(cache)) for f in result["loaded"]), result["loaded"]
    return result


def _prompt(seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    base = torch.randint(3, 32, (12,))
    return torch.cat([base, base[:6]])[None]


def test_export_is_self_contained(tmp_path):
    folder = export_custom_generate("pld_plus", tmp_path / "pld")
    code = folder / "custom_generate"
    assert (code / "generate.py").is_file() and (folder / "README.md").is_file()
    allowed = {"torch", "transformers", *sys.stdlib_module_names}
    for path in code.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                # the only form transformers resolves (locally and from the Hub): a sibling file, one level
                assert node.level == 1 and "." not in node.module and (code / f"{node.module}.py").is_file()
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            module = node.module if isinstance(node, ast.ImportFrom) and not node.level else ""
            assert not any(n.startswith("hf_specdec") for n in [*names, module or ""]), path.name
        # what the Hub loader checks in every file it downloads: only torch, transformers and the stdlib
        assert set(get_imports(path)) <= allowed, (path.name, set(get_imports(path)) - allowed)
    setup = (Path(__file__).parents[1] / "setup.cfg").read_text()  # the lower bounds we declare
    lower = {n: re.search(rf"^\s*{n}>=([\w.]+)", setup, re.M).group(1) for n in ("torch", "transformers")}
    assert (code / "requirements.txt").read_text().split() == [f"{n}>={v}" for n, v in lower.items()]


def test_cli_refuses_drafter_methods_and_reused_folders(tmp_path, capsys):
    assert main(["export-custom-generate", "glide_cape", str(tmp_path / "g")]) == 2
    assert "needs a trained GLIDE drafter" in capsys.readouterr().err
    assert main(["export-custom-generate", "pld_plus", str(tmp_path / "p")]) == 0
    assert main(["export-custom-generate", "pld_plus", str(tmp_path / "p")]) == 2
    assert "not empty" in capsys.readouterr().err


def test_exported_folders_decode_like_our_entry_points(tmp_path):
    """PLD+ and the n-gram tree, called through `custom_generate=DIR` without hf_specdec: the same tokens as
    `custom_generate=hf_specdec.pld_plus` / `tree_generate` in this process, and as plain greedy decoding."""
    model = tiny_llama()
    model.save_pretrained(tmp_path / "tiny")
    pld = export_custom_generate("pld_plus", tmp_path / "pld")
    tree = export_custom_generate("tree_lookup", tmp_path / "tree")
    prompt = _prompt()
    pld_kwargs = dict(max_new_tokens=20, do_sample=False, pld_min_score=-1, pld_num_tokens=4)
    tree_kwargs = dict(max_new_tokens=20, do_sample=False)
    jobs = [
        {"dir": str(pld), "prompt": prompt[0].tolist(), "kwargs": pld_kwargs},
        {"dir": str(tree), "prompt": prompt[0].tolist(), "kwargs": tree_kwargs},
    ]
    got = run_isolated(tmp_path, tmp_path / "tiny", jobs)["tokens"]
    mask = torch.ones_like(prompt)
    ours_pld = model.generate(prompt, attention_mask=mask, custom_generate=hf_specdec.pld_plus, **pld_kwargs)
    ours_tree = model.generate(
        prompt,
        attention_mask=mask,
        custom_generate=hf_specdec.tree_generate,
        proposer=NGramTreeProposer(),
        **tree_kwargs,
    )
    greedy = model.generate(prompt, attention_mask=mask, max_new_tokens=20, do_sample=False)
    assert got == [ours_pld[0].tolist(), ours_tree[0].tolist()]
    assert got[0] == greedy[0].tolist() == got[1]


@pytest.mark.real
def test_exported_pld_plus_on_the_real_target(tmp_path, real_target):
    from hf_specdec.target import default_target_path

    model, tokenizer = real_target
    text = "Repeat this list exactly: apples, pears, plums, cherries, apples, pears, plums, cherries."
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    kwargs = dict(max_new_tokens=24, do_sample=False)
    folder = export_custom_generate("pld_plus", tmp_path / "pld")
    got = run_isolated(
        tmp_path,
        default_target_path(),
        [{"dir": str(folder), "prompt": prompt[0].tolist(), "kwargs": kwargs}],
    )
    ours = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), custom_generate=hf_specdec.pld_plus, **kwargs
    )
    assert got["tokens"] == [ours[0].tolist()]
