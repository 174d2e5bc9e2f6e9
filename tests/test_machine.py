"""The machine record of every figure, and --dtype auto (bf16 only where it runs natively)."""

from __future__ import annotations

import torch

from hf_specdec import machine
from hf_specdec.machine import (
    cpu_flags,
    cpu_has_native_bf16,
    cpu_model,
    describe_machine,
    machine_line,
    resolve_auto_dtype,
)

AVX2_ONLY = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma\n"
SAPPHIRE = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"


def test_cpu_check_reads_the_native_bf16_flags():
    assert cpu_model(AVX2_ONLY) == "AMD EPYC" and "avx2" in cpu_flags(AVX2_ONLY)
    assert not cpu_has_native_bf16(cpu_flags(AVX2_ONLY))
    assert cpu_has_native_bf16(cpu_flags(SAPPHIRE))
    assert cpu_has_native_bf16({"avx512_bf16"}) and cpu_has_native_bf16({"amx_bf16"})
    assert cpu_flags("no flags line here") == set()


def test_cpu_model_tells_apart_parts_that_share_a_brand_name():
    zen = "processor\t: 0\ncpu family\t: {}\nmodel\t\t: {}\nmodel name\t: AMD EPYC\nflags\t\t: avx2\n"
    second_cpu = "\nprocessor\t: 1\ncpu family\t: 99\nmodel\t\t: 9\nmodel name\t: other\n"
    assert cpu_model(zen.format(25, 17)) == "AMD EPYC (family 25, model 17)"
    assert cpu_model(zen.format(26, 2) + second_cpu) == "AMD EPYC (family 26, model 2)"
    assert cpu_model(zen.format(25, 17)) != cpu_model(zen.format(26, 2))


def test_dtype_auto_picks_bf16_only_where_native():
    assert resolve_auto_dtype("auto", "cpu", cpu_flags(AVX2_ONLY)) == "fp32"
    assert resolve_auto_dtype("auto", "cpu", cpu_flags(SAPPHIRE)) == "bf16"
    assert resolve_auto_dtype("auto", torch.device("cuda", 0), cpu_flags(AVX2_ONLY)) == "bf16"
    assert resolve_auto_dtype("fp32", "cpu", cpu_flags(SAPPHIRE)) == "fp32"  # an explicit dtype stays
    assert resolve_auto_dtype("bf16", "cpu", cpu_flags(AVX2_ONLY)) == "bf16"


def test_describe_machine_names_cpu_threads_and_bf16():
    info = describe_machine()
    assert info["threads"] == torch.get_num_threads() and info["device"] == "cpu" and info["cpu"]
    assert info["cpu_native_bf16"] == cpu_has_native_bf16()
    line = machine_line(info)
    assert f"{info['threads']} threads" in line and ("native bf16" in line)
    gpu = dict(info, gpu="NVIDIA H100 80GB HBM3", cpu_native_bf16=True, cpu_bf16_flags=["amx_bf16"])
    assert machine_line(gpu).startswith(
        "NVIDIA H100 80GB HBM3 ("
    ) and "native bf16 (amx_bf16)" in machine_line(gpu)


def test_load_dtype_auto_follows_the_cpu(monkeypatch):
    from hf_specdec.target import resolve_dtype

    monkeypatch.setattr(machine, "cpu_flags", lambda cpuinfo=None: cpu_flags(SAPPHIRE))
    assert resolve_dtype("auto") == torch.bfloat16
    monkeypatch.setattr(machine, "cpu_flags", lambda cpuinfo=None: cpu_flags(AVX2_ONLY))
    assert resolve_dtype("auto") == torch.float32 and resolve_dtype("bf16") == torch.bfloat16
