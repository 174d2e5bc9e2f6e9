"""A decoding loop asked for no statistics never waits for the device (``core/timing.py``).

No GPU here, so the device type is faked: ``timing.on_cuda`` (the one check behind ``timing.synchronize`` and
``timing.DeviceTimer``) answers True for every device, ``torch.cuda.synchronize`` is a counter, and
``torch.cuda.Event`` is a host-clock stand-in. The code that would sync a GPU therefore runs and is counted. Each
loop is run once first: the one-time measurements of its ``start`` (PCT's calibration, the cost curves cached on
the models) time with syncs on purpose; the generation after it is the one counted.
"""

from __future__ import annotations

import time

import pytest
import torch
from hf_specdec.modeling import GlideConfig, GlideForCausalLM

import hf_specdec
from hf_specdec.core import timing
from hf_specdec.core.assisted import batch_stats
from hf_specdec.core.host_syncs import HostSyncCounter
from hf_specdec.core.stats import DecodeStats, ForwardMeter
from hf_specdec.core.tree_decoding import tree_generate
from hf_specdec.edd.pct import StepTimer
from hf_specdec.edd.tree_proposer import EddTreeProposer
from hf_specdec.space.decoding import space_generate

from .conftest import tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = torch.tensor([[1, 5, 6, 7, 5, 6, 7, 8, 9]])


class FakeEvent:
    """``torch.cuda.Event(enable_timing=True)`` on the host clock; done once recorded, unless ``FakeEvent.done`` is
    False (a device still busy)."""

    made = 0
    done = True

    def __init__(self, enable_timing: bool = False, **_):
        assert enable_timing
        FakeEvent.made += 1
        self.t: float | None = None

    def record(self, stream=None) -> None:
        self.t = time.perf_counter()

    def query(self) -> bool:
        return self.t is not None and FakeEvent.done

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.query() and end.query(), "elapsed_time on an event the device has not reached"
        return (end.t - self.t) * 1000.0


@pytest.fixture
def syncs(monkeypatch) -> list:
    """Every device is a CUDA device to ``core/timing.py``; returns the list of ``torch.cuda.synchronize`` calls."""
    calls: list = []
    monkeypatch.setattr(timing, "on_cuda", lambda device: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(FakeEvent, "made", 0)
    monkeypatch.setattr(FakeEvent, "done", True)
    return calls


@pytest.fixture(scope="module")
def glide(target_and_edd):
    target, _ = target_and_edd
    return GlideForCausalLM(GlideConfig.for_target(target)).attach_target(target).eval()


def _counted(syncs: list, run) -> int:
    """Syncs of ``run()`` after a first run of it (its one-time set-up measured there)."""
    run()
    syncs.clear()
    run()
    return len(syncs)


def test_device_timer_uses_events_and_never_synchronizes(syncs):
    clock = timing.DeviceTimer("cuda:0")
    start, end = clock.mark(), clock.mark()
    assert isinstance(start, FakeEvent) and clock.elapsed(start, end) >= 0.0
    FakeEvent.done = False
    assert clock.elapsed(clock.mark(), clock.mark()) is None  # not there yet: no wait, no time
    assert syncs == []


def test_step_timer_samples_steps_and_reads_its_marks_lazily(syncs):
    timer = StepTimer(every=4)
    timer.calibrate(0.01, 0.1)
    timer.begin("cuda:0")
    sampled = [timer.next_step() for _ in range(9)]
    assert sampled == [True, False, False, False, True, False, False, False, True]
    FakeEvent.done = False  # the device is still on the step
    timer.draft_span(timer.mark(), timer.mark())
    assert timer.ratio == pytest.approx(0.1) and timer.s_d == 0.01  # pending: read later, not waited for
    FakeEvent.done = True
    assert timer.ratio < 0.1 and timer.s_d != 0.01  # the ratio read folds in what the device has finished
    assert syncs == []
    assert StepTimer(fixed_ratio=0.2).next_step() is False


@pytest.mark.parametrize("cost", [True, False], ids=["cost-sized", "paper-timed"])
def test_pct_tree_loop_without_stats_never_synchronizes(syncs, target_and_edd, cost):
    target, edd = target_and_edd
    proposer = EddTreeProposer(edd, "pct", cost=cost)

    def run(**kw):
        return target.generate(
            PROMPT, max_new_tokens=24, do_sample=False, custom_generate=tree_generate, proposer=proposer, **kw
        )

    assert _counted(syncs, run) == 0
    if not cost:  # the paper's PCT still times s_d / s_t: with device events on its sampled steps
        assert proposer.calibrated and FakeEvent.made > 0
        assert proposer.timer.s_d is not None and proposer.timer.s_t is not None
    syncs.clear()
    run(stats=DecodeStats())
    assert syncs  # statistics asked for: timed regions wait for the device


def test_glide_cape_without_stats_never_synchronizes(syncs, target_and_edd, glide):
    target, _ = target_and_edd

    def run(**kw):
        return target.generate(
            PROMPT,
            max_new_tokens=16,
            do_sample=False,
            custom_generate=hf_specdec.glide_cape,
            drafter=glide,
            **kw,
        )

    assert _counted(syncs, run) == 0
    run(stats=DecodeStats())
    assert syncs


def test_space_without_stats_never_synchronizes(syncs):
    model = tiny_llama()
    model.config.space_k, model.config.space_mask_token_id = 2, 96

    def run(**kw):
        return model.generate(
            PROMPT, max_new_tokens=16, do_sample=False, custom_generate=space_generate, **kw
        )

    assert _counted(syncs, run) == 0
    stats = DecodeStats()
    run(stats=stats)
    assert syncs and stats.verify_time > 0


@pytest.mark.parametrize("kind", ["glide", "edd"])
def test_chains_without_stats_never_synchronize(syncs, target_and_edd, glide, kind):
    target, edd = target_and_edd
    drafter = glide if kind == "glide" else edd

    def run():
        return target.generate(PROMPT, max_new_tokens=16, do_sample=False, assistant_model=drafter)

    reference = run()
    assert _counted(syncs, run) == 0
    with batch_stats():  # statistics asked for
        assert torch.equal(run(), reference) and syncs


def test_greedy_tree_loop_reads_the_host_at_most_twice_per_step(target_and_edd):
    """The loop's own device-to-host reads (the model forwards and the proposer's drafting not counted)."""
    target, edd = target_and_edd
    proposer = EddTreeProposer(edd, "pct")
    reference = target.generate(PROMPT, max_new_tokens=24, do_sample=False)
    target.generate(
        PROMPT, max_new_tokens=2, custom_generate=tree_generate, proposer=proposer
    )  # costs measured
    with HostSyncCounter() as counter, ForwardMeter(target) as meter:
        meter.syncs = counter
        for name in ("start", "propose", "observe"):
            method = getattr(proposer, name)

            def paused(*args, _method=method, **kwargs):
                with counter.paused():
                    return _method(*args, **kwargs)

            setattr(proposer, name, paused)
        out = target.generate(
            PROMPT, max_new_tokens=24, do_sample=False, custom_generate=tree_generate, proposer=proposer
        )
    assert torch.equal(out, reference)
    # + set-up: EOS ids and the stopping criteria, read once
    assert counter.total <= 2 * meter.calls + 3, counter.by_kind
