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
  8.0 and up); fp16 with a gradient scaler on Volta and Turing (7.x), whose
  tensor cores compute in fp16 (fp16's narrow exponent underflows small
  gradients; the scaler multiplies the loss before backward and divides the
  gradients back); fp32 on older GPUs (Pascal and before: no tensor cores, and
  most of them run fp16 at a fraction of their fp32 rate). "fp32" keeps fp32
  tensors but lets matmuls use TF32 tensor cores (10-bit mantissa, fp32 range)
  for the whole step, forward and backward (``tf32``).
- MPS: "auto" is fp32; bf16 and fp16 autocast on request, fp16 with a gradient
  scaler (torch 2.8 and newer have one for MPS).

``describe_device(device, dtype)`` is the dict a run record keeps.
``keep_freed_memory()`` keeps a CPU training process's freed tensors in its heap
(glibc), so a step does not page in its activations anew.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from attnscale.errors import ConfigError

__all__ = ["DEVICES", "DTYPES", "check_device_spec", "resolve_device", "describe_device", "native_bf16", "Precision",
           "resolve_precision", "autocast", "tf32", "grad_scaler", "to_device", "keep_freed_memory"]

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


def _current_cuda_index() -> int:
    """The current GPU without starting CUDA here: asking torch.cuda.current_device() creates this
    process's CUDA context, which a sweep's parent (it only checks the device) would then hold idle
    on the GPU for the whole sweep. Before anything started CUDA, the current GPU is 0."""
    return torch.cuda.current_device() if torch.cuda.is_initialized() else 0


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    """The ``torch.device`` for "auto", "cpu", "cuda", "cuda:N" or "mps"; a ConfigError when
    the spec is malformed or this machine lacks the device. Starts no CUDA context (only counts GPUs)."""
    if isinstance(spec, torch.device):
        spec = str(spec)
    text = check_device_spec(spec).strip().lower()
    if text == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", _current_cuda_index())
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
    index = int(match.group(1)) if match.group(1) is not None else _current_cuda_index()
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


# glibc's malloc gives each block above its mmap threshold its own mapping, returned at free, so the
# next step's tensor of that size is fresh pages the kernel zeroes at their first touch. The threshold
# starts at 128 KiB and rises as such blocks are freed, but where it settles depends on the order of
# the first allocations: a d_model-256 step of benchmarks/step_limit.py's shape took 6,100-8,200 page
# faults a step and 72-76 ms at one thread, 0 faults and 62-64 ms with these settings; at d_model 128
# one fresh process in two settled badly (3,400-4,300 faults, 28-31 ms against 23-24). 32 MiB is the
# largest threshold glibc takes on 64-bit; the heap is then never trimmed, so freed memory stays the
# process's (its peak RSS, as with a GPU's caching allocator) until it exits.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
_HEAP_BLOCKS = 32 * 2**20
_NEVER_TRIM = 2**31 - 1


@functools.cache
def keep_freed_memory() -> bool:
    """Blocks up to 32 MiB come from the heap and freed memory stays there (glibc's ``mallopt``), once a
    process: what a CPU training run calls before its first step. True where that holds; False off glibc,
    or where the environment sets glibc's malloc thresholds itself (``MALLOC_MMAP_THRESHOLD_``,
    ``MALLOC_TRIM_THRESHOLD_``, ``GLIBC_TUNABLES``), whose settings then stand."""
    return _set_malloc_thresholds()


def _glibc() -> bool:
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (ValueError, OSError, AttributeError):  # a C library without the name, or no confstr at all
        return False


def _set_malloc_thresholds() -> bool:
    if not _glibc():
        return False
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"} & set(os.environ) or "threshold" in tunables:
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _HEAP_BLOCKS)) and bool(mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM))


def _cuda_capability(device: torch.device) -> tuple[int, int]:
    props = torch.cuda.get_device_properties(device)
    return props.major, props.minor


def _cuda_auto_dtype(device: torch.device) -> str:
    """bf16 from Ampere (8.0: bf16 tensor cores), fp16 on Volta and Turing (7.x: fp16 tensor cores),
    fp32 before (Pascal's P100 has fast fp16 but no tensor cores, its other GPUs run fp16 at 1/64 rate)."""
    major, _ = _cuda_capability(device)
    return "bf16" if major >= 8 else "fp16" if major >= 7 else "fp32"


def mps_grad_scaler() -> bool:
    """torch 2.8 brought GradScaler's unscale kernel to MPS; before it, GradScaler("mps") fails in float64."""
    major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())
    return (major, minor) >= (2, 8)


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
            dtype = _cuda_auto_dtype(device)
        elif kind == "cpu":
            dtype = "bf16" if native_bf16() else "fp32"
        else:
            dtype = "fp32"
    if dtype == "fp16" and kind == "cpu":
        raise ConfigError("dtype 'fp16' needs a GPU (CPUs have no fast fp16 matmuls); use --dtype bf16 or fp32 on the CPU")
    if dtype == "fp16" and kind == "mps" and not mps_grad_scaler():
        raise ConfigError(f"dtype 'fp16' on MPS needs a gradient scaler, which torch {torch.__version__} lacks there "
                          "(2.8 and newer have one); use --dtype bf16 or fp32")
    if dtype == "fp32":
        return Precision(kind, "fp32", None, tf32=kind == "cuda")
    return Precision(kind, dtype, _TORCH_DTYPES[dtype], scaler=dtype == "fp16")


@contextlib.contextmanager
def autocast(precision: Precision) -> Iterator[None]:
    """Autocast for ``precision``, around a forward pass (the backward follows the casts it made); plain fp32
    runs without one. TF32 is not this: it must hold through the backward too (``tf32``)."""
    if precision.autocast is None:
        yield
        return
    with torch.autocast(precision.device_type, dtype=precision.autocast):
        yield


def _fp32_precision_settings() -> list[Any]:
    """The objects that hold torch's per-backend fp32 precision (torch 2.9 and newer), parents first."""
    b = torch.backends
    found = [b] + [getattr(b, m, None) for m in ("cuda", "cudnn", "mkldnn")]
    found += [getattr(getattr(b, m, None), leaf, None) for m in ("cuda", "cudnn", "mkldnn") for leaf in ("matmul", "conv", "rnn")]
    return [o for o in found if o is not None and hasattr(o, "fp32_precision")]


@contextlib.contextmanager
def tf32(precision: Precision) -> Iterator[None]:
    """TF32 matmuls while open, where ``precision.tf32`` says so; torch's settings exactly as they were after.

    Open it around the whole step: the backward does about two thirds of the matmuls.
    It is switched on through ``torch.set_float32_matmul_precision("high")``, which
    sets torch's legacy flag and its newer per-backend settings (torch 2.9) alike:
    setting only the newer ``torch.backends.cuda.matmul.fp32_precision`` leaves the two
    disagreeing, and whatever reads the legacy one inside (torch.compile, Lightning,
    ``torch.get_float32_matmul_precision()``) raises "mix of the legacy and new APIs"."""
    if not precision.tf32:
        yield
        return
    try:
        level = torch.get_float32_matmul_precision()
    except RuntimeError:  # the caller's settings mix the two APIs already: the legacy level cannot be read
        level = None
    # torch 2.9+ keeps the legacy level apart from the per-backend settings: both are put back,
    # the level first (setting it rewrites the others), then each setting as it was, "none" included
    before = [(o, o.fp32_precision) for o in _fp32_precision_settings()]
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        if level is not None:
            torch.set_float32_matmul_precision(level)
        for obj, value in before:
            obj.fp32_precision = value


def grad_scaler(precision: Precision) -> torch.amp.GradScaler:
    """A GradScaler that scales only where the precision needs one (fp16, on CUDA or MPS); a no-op otherwise."""
    device_type = precision.device_type if precision.scaler else "cpu"
    return torch.amp.GradScaler(device_type, enabled=precision.scaler)


def to_device(device: torch.device, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Move tensors to ``device`` in one go.

    Only a copy to CUDA from pinned host memory is non-blocking: CUDA keeps a pinned
    source alive until the copy ends. Anywhere else (MPS above all) a non-blocking copy
    of a fresh, unpinned CPU tensor can read its memory after Python has freed and
    reused it (PyTorch issues 139550 and 189690): the model would train on wrong token
    ids without an error. So MPS gets plain copies."""
    if device.type == "cpu":
        return tensors
    if device.type == "cuda":
        pinned = tuple(t.pin_memory() if t.device.type == "cpu" else t for t in tensors)
        return tuple(t.to(device, non_blocking=t.is_pinned()) for t in pinned)
    return tuple(t.to(device) for t in tensors)


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
