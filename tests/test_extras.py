"""The optional parts (hf_specdec/extras.py, setup.cfg's extras_require): generation and the drafters need none of
them, and a command or loader that needs a missing one stops with one SpecDecError naming the extra.

A missing package is simulated with ``None`` in ``sys.modules`` (then ``import name`` raises ImportError and
``extras.installed`` says no); the slow test installs the core requirements alone into a fresh venv and runs there.
"""

from __future__ import annotations

import ast
import configparser
import json
import os
import re
import shlex
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import hf_specdec
from hf_specdec.cli import COMMAND_EXTRAS, COMMANDS, build_parser, main
from hf_specdec.cli.train import RECIPES
from hf_specdec.errors import SpecDecError
from hf_specdec.extras import EXTRAS, installed, require_extra

from .conftest import tiny_llama
from .test_layout import _modules, _resolve

ROOT = Path(__file__).resolve().parent.parent
OPTIONAL = sorted({m for modules in EXTRAS.values() for m in modules})


def _block(monkeypatch, *names):
    """Make ``import name`` fail for each of ``names`` until the test ends."""
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)


def _only_missing(monkeypatch, name):
    """Every optional module present (a stub), whatever this environment has, but ``name``: for tests that run
    nothing past the check."""
    for module in OPTIONAL:
        monkeypatch.setitem(sys.modules, module, types.ModuleType(module))
    _block(monkeypatch, name)


def _message(extra: str, missing: str) -> str:
    return rf"needs the {extra} extra \({missing} not installed\): pip install 'hf_specdec\[{extra}\]'"


@pytest.fixture(autouse=True)
def _parser_built():
    """Every command module imported before a package is blocked (the static test below checks that building the
    parser imports none of the optional packages; here a blocked one must only fail the command that needs it)."""
    build_parser()


# ------------------------------------------------------------------------------------------------ the helper
def test_extras_are_setup_cfg_s():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    declared = {
        extra: tuple(
            re.split(r"[<>=!~;\[ ]", line.strip(), maxsplit=1)[0].replace("-", "_") for line in lines
        )
        for extra, value in cfg["options.extras_require"].items()
        if extra != "dev"
        for lines in [[v for v in value.splitlines() if v.strip()]]
    }
    assert declared == EXTRAS
    core = cfg["options"]["install_requires"]
    assert not any(re.match(rf"\s*{m}\b", line) for m in OPTIONAL for line in core.splitlines())


def test_installed_sees_found_blocked_and_missing_modules(monkeypatch):
    name = "no_such_module_hf_specdec"
    assert installed("json") and not installed(name)
    monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    assert installed(name)  # imported already (here a stub) counts
    _block(monkeypatch, name)
    assert not installed(name)


@pytest.mark.parametrize("name", OPTIONAL)
def test_require_extra_names_the_extra_of_a_missing_module(monkeypatch, name):
    _only_missing(monkeypatch, name)
    for extra, modules in EXTRAS.items():
        if name in modules:
            with pytest.raises(SpecDecError, match=_message(extra, name)) as err:
                require_extra(extra)
            assert str(err.value).startswith(f"hf-specdec {extra} needs")
        else:
            require_extra(extra)  # no error: all of this extra is there
    if name != "evaluate":
        require_extra("bench", "evaluate")  # only the modules named are checked
        return
    with pytest.raises(SpecDecError, match=r"^the figure needs the bench extra \(evaluate not installed\)"):
        require_extra("bench", "evaluate", need="the figure")


def test_an_unknown_extra_is_a_bug():
    with pytest.raises(ValueError, match="unknown extra 'nope'"):
        require_extra("nope")


# ------------------------------------------------------------------------------------------------ the commands
TRAIN_COMMANDS = [
    ["train", "space", "--output-dir", "{tmp}/space"],
    ["train", "glide", "--output-dir", "{tmp}/glide"],
    ["train", "edd", "--output-dir", "{tmp}/edd"],
    ["calibrate", "--drafter", "{tmp}/drafter"],
    ["corpus", "--out", "{tmp}/corpus"],
    ["features", "--kind", "edd", "--corpus", "{tmp}/corpus", "--out", "{tmp}/features"],
    ["draft-vocab", "--drafter", "{tmp}/drafter"],
]
BENCH_COMMANDS = [
    ["bench", "--methods", "ar", "--tasks", "mt-bench", "--limit", "1", "--out", "{tmp}/bench"],
    ["demo", "--model", "{tmp}/model"],
]


def _fails_early(argv, tmp_path, capsys, extra, missing):
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert main(argv) == 2, argv
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hf-specdec: error: hf-specdec {argv[0]} needs"), err
    assert re.search(_message(extra, missing), err) and len(err.splitlines()) == 1, err
    assert not any(tmp_path.iterdir()), "the command ran before the check"


@pytest.mark.parametrize("argv", TRAIN_COMMANDS, ids=lambda a: " ".join(a[:2]))
@pytest.mark.parametrize("missing", ["peft", "datasets", "accelerate"])
def test_training_commands_name_the_train_extra(argv, missing, tmp_path, capsys, monkeypatch):
    _only_missing(monkeypatch, missing)
    _fails_early(argv, tmp_path, capsys, "train", missing)


@pytest.mark.parametrize("argv", BENCH_COMMANDS, ids=lambda a: a[0])
@pytest.mark.parametrize("missing", ["datasets", "evaluate", "rouge_score", "matplotlib"])
def test_bench_and_demo_name_the_bench_extra(argv, missing, tmp_path, capsys, monkeypatch):
    _only_missing(monkeypatch, missing)
    _fails_early(argv, tmp_path, capsys, "bench", missing)


def test_every_command_with_an_extra_exists(capsys):
    assert set(COMMAND_EXTRAS.values()) <= set(EXTRAS)
    parser = build_parser()
    for command in COMMAND_EXTRAS:
        with pytest.raises(SystemExit) as done:  # its --help; an unknown command exits 2
            parser.parse_args([command, "--help"])
        assert done.value.code == 0, command
    capsys.readouterr()


def test_a_command_without_an_extra_runs_with_all_of_them_missing(tmp_path, capsys, monkeypatch):
    _block(monkeypatch, *OPTIONAL)
    assert main(["export-custom-generate", "pld_plus", str(tmp_path / "pld")]) == 0
    assert (tmp_path / "pld" / "custom_generate" / "generate.py").is_file()


# ------------------------------------------------------------------------------------------------ the loaders
def test_the_loaders_name_their_extra(tmp_path, monkeypatch):
    from hf_specdec.bench.report import plot_speedup
    from hf_specdec.metrics import load_metric
    from hf_specdec.target import gguf_target_path, named_target_path
    from hf_specdec.tasks import load_task

    monkeypatch.setenv("HF_SPECDEC_HOME", str(tmp_path / "home"))
    _block(monkeypatch, *OPTIONAL)
    with pytest.raises(SpecDecError, match="^building a bench task " + _message("bench", "datasets")):
        load_task("mt-bench", None, 1)
    with pytest.raises(
        SpecDecError,
        match="^the shipped rouge_l metric " + _message("bench", "evaluate, datasets, rouge_score"),
    ):
        load_metric("rouge_l")
    with pytest.raises(SpecDecError, match="speedup figure " + _message("bench", "matplotlib")):
        plot_speedup({}, tmp_path / "speedup.png")
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    with pytest.raises(
        SpecDecError, match=r"^converting .*m\.gguf to safetensors " + _message("gguf", "gguf")
    ):
        gguf_target_path(tmp_path / "m.gguf")
    with pytest.raises(SpecDecError, match="^converting gemma-3-270m .*" + _message("gguf", "gguf")):
        named_target_path("gemma-3-270m")  # before its parts are looked for or put together
    assert not (tmp_path / "home").exists()
    with pytest.raises(SpecDecError, match="^loading the SPACE adapter .*" + _message("space", "peft")):
        hf_specdec.load_space_model("fp32")  # before the base model loads


def test_generation_needs_none_of_the_extras(monkeypatch):
    """PLD+, GLIDE + CAPE, SPACE and the GLIDE chain (``assistant_model=``) give the tokens of plain greedy
    ``generate`` with every optional package blocked (the slow test loads a drafter through the Auto class)."""
    from hf_specdec.modeling import GlideConfig, GlideForCausalLM

    from hf_specdec.core.verify_cost import CostCurve

    target = tiny_llama()
    drafter = GlideForCausalLM(GlideConfig.for_target(target)).attach_target(target).eval()
    prompt = torch.randint(3, 96, (1, 8), generator=torch.Generator().manual_seed(0))
    prompt = torch.cat([prompt, prompt[:, :5]], dim=1)
    kw = dict(max_new_tokens=16, do_sample=False)
    ref = target.generate(prompt, **kw)
    target.config.space_k, target.config.space_mask_token_id = 2, 96
    _block(monkeypatch, *OPTIONAL)
    calls = {
        "pld_plus": dict(
            custom_generate=hf_specdec.pld_plus, pld_min_score=-1, pld_cost=CostCurve.linear(0.02)
        ),
        "glide_cape": dict(custom_generate=hf_specdec.glide_cape, drafter=drafter, cape_cost=False),
        "space": dict(custom_generate=hf_specdec.space, space_cost=False),
        "glide chain": dict(assistant_model=drafter),
    }
    for name, extra in calls.items():
        assert torch.equal(target.generate(prompt, **kw, **extra), ref), name


# ------------------------------------------------------------------------------------------------ static
def _module_level_imports(name: str, path: Path, modules: dict[str, Path]) -> tuple[set[str], set[str]]:
    """What importing module ``name`` imports (outside functions and ``if TYPE_CHECKING:``): (modules of the
    package, with their parent packages; top-level names of everything else)."""
    ours, theirs = set(), set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    stack = list(ast.parse(path.read_text(), str(path)).body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            sources = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            source = (f"{base}.{node.module}" if node.module else base) if node.level else node.module or ""
            sources = [f"{source}.{alias.name}" for alias in node.names] + [source]
        else:
            stack.extend(ast.iter_child_nodes(node))
            continue
        for source in sources:
            if not source.startswith("hf_specdec"):
                theirs.add(source.split(".")[0])
            elif (resolved := _resolve(source, modules)) is not None:
                parts = resolved.split(".")
                ours |= {p for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if p in modules}
    ours.discard(name)
    return ours, theirs


def test_import_and_the_cli_parser_import_no_optional_package():
    """``import hf_specdec`` (the methods, ``hf_specdec.modeling`` and its Auto-class registration) and building
    the ``hf-specdec`` parser (every command module) import none of the extras' packages at module level: they are
    imported inside the functions that need them, after the check."""
    modules = _modules()
    imports = {name: _module_level_imports(name, path, modules) for name, path in modules.items()}
    assert "datasets" in imports["hf_specdec.trainers.data.chat"][1]  # the walker sees a module-level import
    roots = ["hf_specdec", "hf_specdec.cli", "hf_specdec.cli.__main__", *COMMANDS, *RECIPES.values()]
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(imports[name][0])
    assert {"hf_specdec.modeling", "hf_specdec.space.decoding", "hf_specdec.tasks"} <= seen
    assert "hf_specdec.trainers.data.chat" not in seen
    bad = {name: sorted(imports[name][1] & set(OPTIONAL)) for name in sorted(seen)}
    assert not {k: v for k, v in bad.items() if v}, "module-level imports of optional packages"


# ------------------------------------------------------------------------------------------------ a real install
CORE_ONLY_SCRIPT = """
import importlib.util, json, sys
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

folder = sys.argv[1]
torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
)
LlamaForCausalLM(config).save_pretrained(folder + "/target")
model = AutoModelForCausalLM.from_pretrained(folder + "/target").eval()

import hf_specdec
from hf_specdec.modeling import GlideConfig, GlideForCausalLM

prompt = torch.tensor([[1, 5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 11, 12, 5, 6, 7]])
kw = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=24, do_sample=False)
plain = model.generate(prompt, **kw)
pld = model.generate(prompt, custom_generate=hf_specdec.pld_plus, **kw)
assert torch.equal(pld, plain), (pld, plain)
GlideForCausalLM(GlideConfig.for_target(model)).attach_target(model).save_pretrained(folder + "/glide")
glide = AutoModelForCausalLM.from_pretrained(folder + "/glide", target=model).eval()  # the Auto-class registration
assert isinstance(glide, GlideForCausalLM), type(glide)
assert torch.equal(model.generate(prompt, custom_generate=hf_specdec.glide_cape, drafter=glide, **kw), plain)
print(json.dumps({m: importlib.util.find_spec(m) is not None for m in sys.argv[2:]}))
"""
# what pip prints when it cannot reach the index (or a download breaks off): the test is skipped, not failed
NO_NETWORK = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution|Name or service "
    r"not known|Network is unreachable|ConnectTimeout|Read timed out|ProxyError|Could not fetch URL|ConnectionError|"
    r"from versions: none|IncompleteRead|Connection broken"
)


def _makefile_pip_install() -> list[str]:
    """The Makefile's ``PIP_INSTALL`` options (``-m pip install -q ...``), so torch installs as ``make`` installs it."""
    line = re.search(r"^PIP_INSTALL = (.+)$", (ROOT / "Makefile").read_text(), re.M)
    return shlex.split(line.group(1))


def _pip(python: Path, *args: str, env: dict) -> None:
    cmd = [str(python), *_makefile_pip_install(), *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode:
        output = done.stdout + done.stderr
        if NO_NETWORK.search(output):
            pytest.skip(
                f"no network to the package index ({shlex.join(cmd)}): {output.strip().splitlines()[-1]}"
            )
        pytest.fail(f"{shlex.join(cmd)} failed:\n{output[-4000:]}")


@pytest.mark.slow
def test_a_core_only_install_generates_and_names_the_extras(tmp_path):
    """A fresh venv with the core requirements alone (torch first, the same CPU build as here, as the Makefile
    installs it; then ``pip install -e .``, which takes the newest transformers it admits): PLD+ and GLIDE + CAPE decode a
    reloaded tiny Llama token for token as plain greedy ``generate``, no optional package is there, and ``bench``
    and ``train`` stop at once naming their extra."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", HF_SPECDEC_COST_STORE="off", OMP_NUM_THREADS="1", PIP_NO_INPUT="1")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env, timeout=600)
    python = venv / "bin" / "python"
    _pip(python, f"torch=={torch.__version__.split('+')[0]}", env=env)
    _pip(python, "-e", str(ROOT), env=env)

    script = tmp_path / "core_only.py"
    script.write_text(CORE_ONLY_SCRIPT)
    done = subprocess.run(
        [str(python), str(script), str(tmp_path), *OPTIONAL],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert not any(found.values()), f"installed with the core requirements: {found}"

    cli = str(venv / "bin" / "hf-specdec")
    for argv, extra in (
        (
            ["bench", "--methods", "ar", "--tasks", "mt-bench", "--limit", "1", "--out", str(tmp_path / "b")],
            "bench",
        ),
        (["train", "space", "--output-dir", str(tmp_path / "s")], "train"),
    ):
        run = subprocess.run([cli, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 2, (argv, run.stdout[-2000:], run.stderr[-4000:])
        assert f"needs the {extra} extra" in run.stderr and f"pip install 'hf_specdec[{extra}]'" in run.stderr
        assert "Traceback" not in run.stderr, run.stderr[-4000:]
