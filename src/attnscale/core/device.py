"""Where a run computes, and in which precision: resolved once, recorded, passed down.

``resolve_device("auto")`` is CUDA if there is one, else Apple's MPS, else the
CPU; "cpu", "cuda", "cuda:N" and "mps" ask for one, and a device this machine
lacks is a ConfigError naming it and the fix, before anything runs.

``resolve_precision(dtype, device)`` turns a requested dtype ("auto", "fp32",
"bf16", "fp16") into a ``Precision``: what autocast runs the matmuls in, whether
gradients need a scaler, whether fp32 matmuls may use TF32. Softmax and the loss
stay in fp32 whatever it says (attention.py and model.py cast them). The rules:

- CPU: bf16 autocast where the CPU has bf16 dot-product instructions
  (AVX512-BF16 or AMX); elsewhere bf16 is emulated and slower than fp32, so
  "auto" is fp32. fp16 is refused (no fast fp16 matmuls on CPUs).
- CUDA: "auto" is bf16 on GPUs that compute in it natively (compute capability
  8.0 and up), else fp16 with a gradient scaler (fp16's narrow exponent
  underflows small gradients; the scaler multiplies the loss before backward
  and divides the gradients back). "fp32" keeps fp32 tensors but lets
  matmuls use TF32 tensor cores (10-bit mantissa, fp32 range).
- MPS: "auto" is fp32; bf16 and fp16 autocast on request.

``describe_device(device, dtype)`` is the dict a run record keeps.
"""

from __future__ import annotations

import contextlib
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from attnscale.errors import ConfigError

__all__ = ["DEVICES", "DTYPES", "check_device_spec", "resolve_device", "describe_device", "native_bf16", "Precision",
           "resolve_precision", "autocast", "grad_scaler", "to_device"]

DEVICES = ("auto", "cpu", "cuda", "cuda:N", "mps")
DTYPES = ("auto", "fp32", "bf16", "fp16")
_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


_SPEC = re.compile(r"auto|cpu|mps|cuda(?::(\d+))?")


def check_device_spec(spec: str) -> str:
    """``spec`` if it is well formed ("auto", "cpu", "cuda", "cuda:N", "mps"), whether or not
    this machine has the device (a config may be written here and run elsewhere); else a ConfigError."""
    if not isinstance(spec, str) or _SPEC.fullmatch(spec.strip().lower()) is None:
        raise ConfigError(f"device {spec!r} is not one of {', '.join(DEVICES)}; give e.g. --device cuda:0 or --device cpu")
    return spec


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    """The ``torch.device`` for "auto", "cpu", "cuda", "cuda:N" or "mps"; a ConfigError when
    the spec is malformed or this machine lacks the device."""
    if isinstance(spec, torch.device):
        spec = str(spec)
    text = check_device_spec(spec).strip().lower()
    if text == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("mps") if _mps_available() else torch.device("cpu")
    if text == "cpu":
        return torch.device("cpu")
    if text == "mps":
        if not _mps_available():
            raise ConfigError("device 'mps' is not available here (no Apple GPU, or a torch built without MPS); "
                              "use --device cpu or auto")
        return torch.device("mps")
    match = _SPEC.fullmatch(text)
    if not torch.cuda.is_available():
        why = "this torch is built without CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise ConfigError(f"device {spec!r} is not available ({why}); use --device cpu or auto")
    index = int(match.group(1)) if match.group(1) is not None else torch.cuda.current_device()
    count = torch.cuda.device_count()
    if index >= count:
        raise ConfigError(f"device {spec!r} is not available: this machine has {count} CUDA GPU(s), "
                          f"cuda:0 to cuda:{count - 1}; pick one of those")
    return torch.device("cuda", index)


def native_bf16() -> bool:
    """True where the CPU has bf16 dot-product instructions (AVX512-BF16 or AMX).

    Elsewhere bf16 matmuls are emulated and slower than fp32, so "auto" picks fp32."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _cuda_native_bf16(device: torch.device) -> bool:
    return torch.cuda.get_device_properties(device).major >= 8  # Ampere and later compute in bf16


@dataclass(frozen=True)
class Precision:
    """What a run computes in. ``name``: the dtype recorded ("fp32", "bf16", "fp16");
    ``autocast``: the autocast dtype, None for plain fp32; ``scaler``: gradients go
    through a GradScaler (fp16); ``tf32``: fp32 matmuls may use TF32 (CUDA)."""

    device_type: str
    name: str
    autocast: torch.dtype | None
    scaler: bool = False
    tf32: bool = False


def resolve_precision(dtype: str, device: torch.device) -> Precision:
    """The precision ``dtype`` ("auto", "fp32", "bf16", "fp16") means on ``device`` (see the module docstring)."""
    if dtype not in DTYPES:
        raise ConfigError(f"dtype {dtype!r} is unknown; choose one of: {', '.join(DTYPES)}")
    kind = device.type
    if dtype == "auto":
        if kind == "cuda":
            dtype = "bf16" if _cuda_native_bf16(device) else "fp16"
        elif kind == "cpu":
            dtype = "bf16" if native_bf16() else "fp32"
        else:
            dtype = "fp32"
    if dtype == "fp16" and kind == "cpu":
        raise ConfigError("dtype 'fp16' needs a GPU (CPUs have no fast fp16 matmuls); use --dtype bf16 or fp32 on the CPU")
    if dtype == "fp32":
        return Precision(kind, "fp32", None, tf32=kind == "cuda")
    return Precision(kind, dtype, _TORCH_DTYPES[dtype], scaler=dtype == "fp16" and kind == "cuda")


@contextlib.contextmanager
def autocast(precision: Precision) -> Iterator[None]:
    """Autocast for ``precision``; plain fp32 runs without one. TF32 matmuls are
    allowed while it is open where the precision says so, and restored after."""
    with contextlib.ExitStack() as stack:
        if precision.tf32:
            before = torch.backends.cuda.matmul.fp32_precision
            torch.backends.cuda.matmul.fp32_precision = "tf32"
            stack.callback(setattr, torch.backends.cuda.matmul, "fp32_precision", before)
        if precision.autocast is not None:
            stack.enter_context(torch.autocast(precision.device_type, dtype=precision.autocast))
        yield


def grad_scaler(precision: Precision) -> torch.amp.GradScaler:
    """A GradScaler that scales only where the precision needs one (fp16 on CUDA); a no-op otherwise."""
    device_type = precision.device_type if precision.scaler else "cpu"
    return torch.amp.GradScaler(device_type, enabled=precision.scaler)


def to_device(device: torch.device, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Move tensors to ``device`` in one go; from pinned memory the copies to a GPU are non-blocking."""
    if device.type == "cpu":
        return tensors
    if device.type == "cuda":
        tensors = tuple(t.pin_memory() if t.device.type == "cpu" else t for t in tensors)
    return tuple(t.to(device, non_blocking=True) for t in tensors)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _nvidia_driver() -> str | None:
    """The NVIDIA kernel driver's version, read from /proc where Linux has it; torch does not expose it."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9.]+)", text)
    return match.group(1) if match else None


def describe_device(device: torch.device, dtype: str | Precision | torch.dtype) -> dict[str, Any]:
    """Where a run computed, for its record: device type and name (the GPU model), index,
    CUDA runtime and driver versions where there are any, the dtype used and torch's thread count."""
    if isinstance(dtype, Precision):
        dtype = dtype.name
    elif isinstance(dtype, torch.dtype):
        dtype = {v: k for k, v in _TORCH_DTYPES.items()}.get(dtype, str(dtype).removeprefix("torch."))
    out: dict[str, Any] = {"type": device.type, "index": device.index, "name": _cpu_name(),
                           "cuda_runtime": None, "driver": None, "dtype": dtype,
                           "threads": torch.get_num_threads(), "torch": torch.__version__}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out.update(name=props.name, capability=f"{props.major}.{props.minor}",
                   memory_gb=round(props.total_memory / 2**30, 1), cuda_runtime=torch.version.cuda,
                   driver=_nvidia_driver(), cudnn=torch.backends.cudnn.version())
    elif device.type == "mps":
        out.update(name=f"Apple GPU (MPS) on {platform.machine()}", os=platform.mac_ver()[0] or None)
    return out
