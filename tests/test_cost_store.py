"""core/cost_store.py: a measured cost is stored once and read back by a later process instead of timed again."""

from __future__ import annotations

import json

import torch

from hf_specdec.core import cost_store, verify_cost
from hf_specdec.kernels import apply_kernels

from .conftest import tiny_llama


def test_a_stored_curve_is_read_back_instead_of_timed(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_SPECDEC_COST_STORE", str(tmp_path / "costs.json"))
    context = torch.arange(3, 20)
    first = verify_cost.measured_cost(tiny_llama(), context, repeats=1)
    stored = json.loads((tmp_path / "costs.json").read_text())
    assert len(stored) == 1 and next(iter(stored)).startswith("verify | ")

    def no_timing(*args, **kwargs):
        raise AssertionError("a stored curve was timed again")

    monkeypatch.setattr(verify_cost, "forward_times", no_timing)
    again = verify_cost.measured_cost(
        tiny_llama(), context, repeats=1
    )  # a new model object: as a new process
    assert again.relative == first.relative


def test_the_key_tells_models_and_kernels_apart(tmp_path, monkeypatch):
    a, b = tiny_llama(seed=0), tiny_llama(seed=1)
    setting = verify_cost.setting_key(a)
    assert cost_store.entry_key("verify", [a], setting) == cost_store.entry_key(
        "verify", [tiny_llama(seed=0)], setting
    )
    assert cost_store.entry_key("verify", [a], setting) != cost_store.entry_key("verify", [b], setting)
    apply_kernels(a, measure=False)
    assert verify_cost.setting_key(a) != setting


def test_off_and_an_unreadable_store(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_SPECDEC_COST_STORE", "off")
    cost_store.store("k", 1.0)
    assert cost_store.lookup("k") is None and cost_store.store_path() is None
    path = tmp_path / "costs.json"
    path.write_text("{not json")
    monkeypatch.setenv("HF_SPECDEC_COST_STORE", str(path))
    assert cost_store.lookup("k") is None
    cost_store.store("k", 2.5)
    assert cost_store.lookup("k") == 2.5
