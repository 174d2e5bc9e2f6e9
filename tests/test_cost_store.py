"""core/cost_store.py: a measured cost is stored once and read back by a later process instead of timed again."""

from __future__ import annotations

import json

import pytest
import torch

from hf_specdec.core import cost_store, verify_cost
from hf_specdec.kernels import apply_kernels

from .conftest import tiny_llama


def test_a_learnt_curve_is_stored_and_is_the_next_process_prior(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_SPECDEC_COST_STORE", str(tmp_path / "costs.json"))
    context = torch.arange(3, 20)
    first = verify_cost.measured_cost(tiny_llama(), context)
    first.save()
    assert not (tmp_path / "costs.json").exists()  # nothing learnt yet: nothing stored
    for t in (0.02, 0.01, 0.01):  # a warm-up, then two samples
        first.observe(1, t)
    first.save()
    assert not (tmp_path / "costs.json").exists()  # t(1) alone: still the prior, nothing stored
    for t in (0.02, 0.013, 0.013):
        first.observe(2, t)
    first.save()
    stored = json.loads((tmp_path / "costs.json").read_text())
    assert len(stored) == 1 and next(iter(stored)).startswith("verify | ")
    again = verify_cost.measured_cost(tiny_llama(), context)  # a new model object: as a new process
    assert again is not first and again.relative == first.relative and again(2) == pytest.approx(1.3)


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
