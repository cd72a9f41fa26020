"""Where and in what precision the learner's updates run: the `device` and `precision`
settings."""

import torch


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The dtype updates autocast to (None: plain float32), from the `precision` setting."""
    if precision not in ("float32", "bfloat16", "auto"):
        raise ValueError(f"precision must be float32, bfloat16 or auto, got {precision!r}")
    if precision == "auto":
        precision = "bfloat16" if native_bfloat16(device) else "float32"
    return torch.bfloat16 if precision == "bfloat16" else None


def native_bfloat16(device: torch.device) -> bool:
    """Whether `device` computes bfloat16 in hardware (emulated, it is slower than float32)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    supported = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    return device.type == "cpu" and supported()
