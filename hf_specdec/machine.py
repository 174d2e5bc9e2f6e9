"""The machine a figure was measured on, and the dtype that pays on it.

What verification costs depends on the hardware (README, "What limits them here"): on a CPU without native bf16
(AVX2 only) a bf16 forward over 16 tokens costs ~6 one-token forwards, because bf16 is emulated; with AVX512-BF16
or AMX it costs ~1.4; on a GPU verifying a few dozen tokens costs about one forward. So every bench figure
records :func:`describe_machine` (results.json and the report), and ``--dtype auto`` (bench, demo, the Python API
through :func:`resolve_auto_dtype`) picks bf16 only where it runs natively (a CUDA device, or a CPU with
AVX512-BF16 / AMX-BF16), fp32 elsewhere.
"""

from __future__ import annotations

import platform
from pathlib import Path

import torch

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def _cpuinfo_fields(cpuinfo: str | None = None) -> dict[str, str]:
    """The first processor's ``key: value`` fields of ``/proc/cpuinfo`` (or of ``cpuinfo``); empty where there is no
    such file, e.g. macOS."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text(errors="replace") if path.is_file() else ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags (``/proc/cpuinfo``'s ``flags`` line; empty where there is none, e.g. macOS)."""
    return set(_cpuinfo_fields(cpuinfo).get("flags", "").split())


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name, with its family and model numbers where ``/proc/cpuinfo`` gives them.

    A virtual machine often names only the brand (``AMD EPYC``), which is the same string for a Zen 4 and a Zen 5
    part whose forwards cost differently; ``AMD EPYC (family 26, model 2)`` tells them apart.
    """
    fields = _cpuinfo_fields(cpuinfo)
    name = fields.get("model name") or platform.processor() or platform.machine()
    if fields.get("cpu family") and fields.get("model"):
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


def cpu_has_native_bf16(flags: set[str] | None = None) -> bool:
    """True where the CPU computes bf16 in hardware (AVX512-BF16 or AMX-BF16)."""
    flags = cpu_flags() if flags is None else flags
    return any(f in flags for f in NATIVE_BF16_FLAGS)


def describe_machine(device: torch.device | str | None = None) -> dict:
    """CPU model, its native-bf16 support, torch's thread count and, for a CUDA ``device``, the GPU."""
    flags = cpu_flags()
    info = {
        "cpu": cpu_model(),
        "cpu_native_bf16": cpu_has_native_bf16(flags),
        "cpu_bf16_flags": sorted(f for f in NATIVE_BF16_FLAGS if f in flags),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    device = torch.device(device) if device is not None else torch.device("cpu")
    info["device"] = str(device)
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def machine_line(info: dict) -> str:
    """One line for reports: ``AMD EPYC (family 25, model 1), 2 threads, no native bf16`` (plus the GPU where there is one)."""
    bf16 = (
        "native bf16 (" + ", ".join(info["cpu_bf16_flags"]) + ")"
        if info["cpu_native_bf16"]
        else "no native bf16"
    )
    line = f"{info['cpu']}, {info['threads']} threads, {bf16}"
    return f"{info['gpu']} ({line})" if info.get("gpu") else line


def resolve_auto_dtype(
    dtype: str, device: torch.device | str | None = None, flags: set[str] | None = None
) -> str:
    """``"auto"`` -> ``"bf16"`` on a CUDA device or a CPU with native bf16, else ``"fp32"``; any other name as is."""
    if dtype != "auto":
        return dtype
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        return "bf16"
    return "bf16" if cpu_has_native_bf16(flags) else "fp32"
