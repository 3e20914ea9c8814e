"""The code that only runs on CUDA, checked without a GPU (and on one with ``NMT_TEST_DEVICE=cuda``).

On a CPU-only torch the tests run the model's CUDA branches on *fake* CUDA tensors
(``torch._subclasses.fake_tensor.FakeTensorMode``: real dispatch, shapes/dtypes/devices, no data)
with the real ``AutocastCUDA`` dispatch key switched on, under a ``TorchDispatchMode`` that
records every op. They assert what a GPU run depends on and a CPU run cannot show:

- the encoder takes the packed (cuDNN) branch, every floating-point tensor the model makes is on
  the CUDA device (no silent CPU fallback; fake tensors also refuse any op mixing devices);
- under ``Precision.autocast()`` for bf16 every GEMM (mm/addmm/bmm, the decoder's ``StepLinear``
  products included) runs in bf16 and the summed loss comes out float32;
- a forward pass plus the loss, and each search step, never reads a value back to the host
  (``aten._local_scalar_dense``, which ``.item()``/``bool()``/``float()`` call, is counted);
- the fused Adam update and gradient clipping accept CUDA parameters, with exactly the one host
  read per step that ``Trainer.train_step`` documents (the finiteness check); for fp16 the
  GradScaler's unscale, fused step and scale update run with no host read at all.

With ``NMT_TEST_DEVICE=cuda`` (scripts/gpu_check.sh) the same tests run on real CUDA tensors, and
the training-step and decoding tests run the real thing: ``Trainer.train_step`` with bf16
autocast (finite loss, weights changed), greedy and beam-5 ``beam_search``.

What a CPU-only torch (2.13.0+cpu) cannot check, and why:

- **Backward and everything after it on CUDA tensors.** Building an autograd graph on a fake CUDA
  leaf aborts the process (C++ ``terminate``, not a Python error):
  ``torch::autograd::InputMetadata::InputMetadata`` → ``c10::impl::getDeviceGuardImpl``:
  "PyTorch is not linked with support for cuda devices". So the fake tests run forward passes
  with ``requires_grad=False`` parameters and give the optimiser zero gradients; ``StepLinear``'s
  taped autograd path, gradient dtypes under autocast and a whole ``Trainer.train_step`` are
  checked on the GPU only.
- **``Module.to("cuda")``/``Tensor.to("cuda")``, hence ``Batch.to`` with ``non_blocking`` and
  pinned memory**: "PyTorch is not linked with support for cuda devices" (the copy needs the CUDA
  device guard); ``pin_memory`` needs the CUDA host allocator. Fake parameters are made directly
  on the device instead (``cuda_copy``).
- **``torch.autocast("cuda")`` as written**: it disables itself ("CUDA is not available ...
  Disabling autocast", ``torch.cuda.amp.common.amp_definitely_not_available``); the fake tests
  patch that check (and ``torch.cuda.is_bf16_supported``) so the real dispatch key turns on.
  ``torch.amp.GradScaler("cuda", enabled=True)`` likewise turns itself off without CUDA.
- **The cuDNN kernel itself**: ``nn.GRU``/``nn.LSTM`` only call ``aten::_cudnn_rnn`` when
  ``torch.backends.cudnn.is_acceptable`` (false: no cuDNN in the build); they fall back to the
  native loop whose CUDA cell kernels ``aten::_thnn_fused_gru_cell``/``_thnn_fused_lstm_cell``
  have no fake (Meta) implementation, and ``aten::_pack_padded_sequence`` raises
  ``DynamicOutputShapeException`` (its output size depends on the lengths' values). ``CudaShim``
  gives these three ops their output shapes, so what is checked is the model's side of the packed
  path (devices, shapes, dtypes), not cuDNN's.
- **Whole beam searches**: the search decides from values (``nonzero().tolist()``, ``bool(...)``)
  and fake tensors have none (``DataDependentOutputException``); the fake test runs the model's
  search steps and the beam reordering, the GPU run the whole search.
- **DDP with NCCL**: no NCCL backend in a CPU build; ``gpu_check.sh`` runs torchrun on the GPU.

The forward test runs over every ``model.rnn_impl``: ``auto`` and ``cudnn`` must take the packed
path on CUDA, ``loop`` (the CPU fast path, forced onto a GPU) must not, and all keep their GEMMs
in bf16 under CUDA autocast.
"""

from __future__ import annotations

import collections
import contextlib
import os
from unittest import mock

import pytest
import torch
from omegaconf import OmegaConf
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves

from nmt.config import TrainConfig
from nmt.data.batching import collate
from nmt.models.build import build_model
from nmt.models.seq2seq import nll_loss
from nmt.training import build_optimizer, build_precision

REAL = os.environ.get("NMT_TEST_DEVICE", "") == "cuda"
if REAL and not torch.cuda.is_available():
    raise RuntimeError("NMT_TEST_DEVICE=cuda, but torch.cuda.is_available() is False")
CUDA = torch.device("cuda", 0)
V = 40
aten = torch.ops.aten
GEMMS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default, aten.linear.default}
SYNC = aten._local_scalar_dense.default
# Hand-written Python bindings that take a device guard before dispatching (see CudaShim._hide_device).
GUARDED = ("__getitem__", "__setitem__", "__invert__", "contiguous", "__bool__", "__float__", "__int__", "item")


def tiny_cfg(cell: str = "gru", order: str = "bahdanau", layers: int = 2):
    cfg = OmegaConf.structured(TrainConfig)
    cfg.encoder.update(cell=cell, emb_size=8, hidden_size=6, layers=layers, dropout=0.0)
    cfg.decoder.update(order=order, cell=cell, emb_size=8, hidden_size=12, layers=layers, dropout=0.0)
    cfg.attention.name = "bahdanau"
    return cfg


def build(cell: str = "gru", order: str = "bahdanau", impl: str = "auto"):
    """A tiny model whose RNN implementation is resolved for a CUDA device (``auto`` → ``cudnn``)."""
    cfg = tiny_cfg(cell, order)
    return build_model(cfg.encoder, cfg.attention, cfg.decoder, V, V, rnn_impl=impl, device="cuda")


def batch():
    g = torch.Generator().manual_seed(0)
    src = [torch.randint(4, V, (n,), generator=g).tolist() for n in (5, 3, 7)]
    tgt = [torch.randint(4, V, (n,), generator=g).tolist() for n in (4, 6, 2)]
    return collate(src, tgt)


class CudaShim(TorchDispatchMode):
    """Records every op (name, output dtype, devices) and counts host reads of device values.

    Under fake tensors it also stands in, with output shapes only, for the three ops of the
    packed RNN path that have no fake implementation (see the module docstring), and runs ops
    on real CPU tensors (``pack_padded_sequence``'s lengths bookkeeping) for real.
    """

    def __init__(self, fake: bool, lengths: list[int] | None = None):
        super().__init__()
        self.fake, self.syncs, self.ops = fake, 0, []
        self.packed, self.hiding = False, False
        if lengths is not None:  # the batch_sizes pack_padded_sequence makes from these lengths
            ls = sorted(lengths, reverse=True)
            with _disable_current_modes():  # a real CPU tensor, as the real op makes
                self.batch_sizes = torch.tensor([sum(n > t for n in ls) for t in range(ls[0])])
            self.n_tokens = sum(ls)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.prim.device.default and self.hiding:
            return torch.device("meta")
        leaves = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        if self.fake and not any(isinstance(a, FakeTensor) for a in leaves) and "cuda" not in str(kwargs.get("device")):
            with _disable_current_modes():  # host bookkeeping on real CPU tensors
                return func(*args, **kwargs)
        if func is SYNC and args[0].device.type != "cpu":  # CPU values (lengths) are read for free
            self.syncs += 1
            if self.fake:
                return True  # the value a healthy step reads: finite
        if func is aten._pack_padded_sequence.default:
            self.packed = True
            if self.fake:
                x, _, batch_first = args
                x = x.transpose(0, 1) if batch_first else x
                return x.new_empty((self.n_tokens, *x.shape[2:])), self.batch_sizes
        if self.fake and func in (aten._thnn_fused_gru_cell.default, aten._thnn_fused_lstm_cell.default):
            gates = args[0]  # [B, G*H]: outputs h (and c) [B, H] and a workspace
            h = args[2]  # hx for a GRU, cx for an LSTM: [B, H]
            if func is aten._thnn_fused_gru_cell.default:
                return h.new_empty(h.shape), gates.new_empty((h.size(0), 5 * h.size(1)))
            return h.new_empty(h.shape), h.new_empty(h.shape), gates.new_empty(gates.shape)
        out = func(*args, **kwargs)
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        floats = {t.device.type for t in outs + leaves if t.is_floating_point()}
        self.ops.append((func, [t.dtype for t in outs], floats))
        return out

    def __enter__(self):
        self._patches = contextlib.ExitStack()
        if self.fake:  # t[...], ~t, t.contiguous() on fake CUDA tensors, see _hide_device
            for name in GUARDED:
                method = getattr(FakeTensor, name)
                self._patches.enter_context(mock.patch.object(FakeTensor, name, self._hide_device(method)))
        return super().__enter__()

    def __exit__(self, *exc):
        self._patches.close()
        return super().__exit__(*exc)

    def _hide_device(self, method):
        """These Python bindings take a CUDA device guard before any op ("PyTorch is not linked with
        support for cuda devices"); while it does, the C++ side is told the tensor is on ``meta``
        (a no-op guard). The ops it then runs see the fake CUDA device as usual."""

        def call(*args):
            self.hiding = True
            try:
                return method(*args)
            finally:
                self.hiding = False

        return call

    def float_devices(self) -> set[str]:
        """Devices of every floating-point tensor an op read or produced."""
        return {d for _, _, devs in self.ops for d in devs}

    def ran(self, func) -> bool:
        return any(f is func for f, _, _ in self.ops)

    def gemm_dtypes(self) -> collections.Counter:
        return collections.Counter(dt for f, dtypes, _ in self.ops if f in GEMMS for dt in dtypes)


def cuda_copy(model: torch.nn.Module, fake: bool) -> torch.nn.Module:
    """The model on the GPU: for real, or with fake CUDA parameters (inside a FakeTensorMode)."""
    if not fake:
        return model.to(CUDA)
    for m in model.modules():
        for name, p in [(n, p) for n, p in m._parameters.items() if p is not None]:
            m._parameters[name] = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=CUDA), False)
        if isinstance(m, torch.nn.RNNBase):
            m._init_flat_weights()
    return model


@contextlib.contextmanager
def on_cuda():
    """(fake?) — real CUDA under NMT_TEST_DEVICE=cuda, else fake CUDA with CUDA autocast enabled."""
    if REAL:
        yield False
        return
    with (
        mock.patch("torch.cuda.amp.common.amp_definitely_not_available", lambda: False),
        mock.patch("torch.cuda.is_bf16_supported", lambda *a, **k: True),
        FakeTensorMode(allow_non_fake_inputs=True),
    ):
        yield True


def ids(t: torch.Tensor, fake: bool) -> torch.Tensor:
    """An id tensor on the device (fake: shape and dtype only; ``Tensor.to("cuda")`` cannot run)."""
    return torch.empty(t.shape, dtype=t.dtype, device=CUDA) if fake else t.to(CUDA)


@pytest.mark.parametrize("impl", ["auto", "cudnn", "loop"])
@pytest.mark.parametrize("cell,order", [("gru", "bahdanau"), ("lstm", "bahdanau"), ("gru", "luong"), ("lstm", "luong")])
def test_bf16_forward_and_loss_on_cuda(cell, order, impl):
    """The training forward under the step's own autocast: packed encoder (unless ``loop`` is
    forced), bf16 GEMMs, float32 summed loss, everything on the device, and not one host read."""
    model, b = build(cell, order, impl), batch()
    with on_cuda() as fake:
        model = cuda_copy(model, fake)
        precision = build_precision("bf16", CUDA, model)
        src, tgt_in, tgt_out = ids(b.src, fake), ids(b.tgt_in, fake), ids(b.tgt_out, fake)
        shim = CudaShim(fake, b.src_len.tolist())
        with torch.no_grad(), shim, precision.autocast():
            logits, att = model(src, b.src_len, tgt_in)
            loss = nll_loss(logits, tgt_out, 0.1)
    assert precision.autocast_dtype == torch.bfloat16 and not precision.scaler.is_enabled()
    packed = impl != "loop"
    assert shim.packed == packed, f"rnn_impl={impl}: packed (cuDNN) path taken: {shim.packed}"
    assert fake or not packed or shim.ran(aten._cudnn_rnn.default), "nn.GRU/LSTM did not run cuDNN"
    assert logits.shape == (3, b.tgt_in.size(1), V) and att.shape == (3, b.tgt_in.size(1), b.src.size(1))
    assert logits.device == loss.device == CUDA
    assert loss.dtype == torch.float32 and loss.dim() == 0
    assert shim.float_devices() == {"cuda"}, "a floating-point op ran on the CPU"
    gemms = shim.gemm_dtypes()
    assert gemms and set(gemms) == {torch.bfloat16}, f"GEMM output dtypes under bf16 autocast: {dict(gemms)}"
    assert shim.syncs == 0, f"{shim.syncs} host reads in the forward pass"


@pytest.mark.parametrize("cell,order", [("gru", "bahdanau"), ("lstm", "luong")])
def test_search_steps_on_cuda(cell, order):
    """start + step + the beam reordering (topk, gather, index_select) stay on the device, in the
    shapes search expects, with no host read inside a step; on a GPU, whole greedy/beam-5 searches."""
    from nmt.search import SearchOptions, beam_search

    model, b, K = build(cell, order).eval(), batch(), 5
    with on_cuda() as fake:
        model = cuda_copy(model, fake)
        src = ids(b.src, fake)
        shim = CudaShim(fake, b.src_len.tolist())
        with torch.no_grad(), shim:
            state = model.start(src, b.src_len).index_select(torch.arange(3, device=CUDA).repeat_interleave(K))
            y = torch.full((3 * K,), 1, dtype=torch.long, device=CUDA)
            for _ in range(3):
                logits, state, w = model.step(y, state)
                cand = torch.log_softmax(logits.float(), -1).view(3, K * V)
                top, idx = cand.topk(2 * K, dim=1)
                keep = top.topk(K, dim=1).indices
                beams = (torch.arange(3, device=CUDA).unsqueeze(1) * K + (idx // V).gather(1, keep)).view(-1)
                y = (idx % V).gather(1, keep).view(-1)
                state = state.index_select(beams)
        if not fake:
            hyps = {k: beam_search(model, src, b.src_len, SearchOptions(beam_size=k)) for k in (1, 5)}
    assert logits.shape == (3 * K, V) and w.shape == (3 * K, b.src.size(1))
    assert logits.device == w.device == y.device == CUDA
    assert shim.float_devices() == {"cuda"} and shim.syncs == 0
    if not fake:
        for k, nbest in hyps.items():
            assert len(nbest) == 3 and all(len(n) == 1 and n[0].tokens is not None for n in nbest), k
            assert all(isinstance(t, int) and 0 <= t < V for n in nbest for t in n[0].tokens)


def test_training_update_on_cuda(tmp_path):
    """Fake: the update half of ``Trainer.train_step`` (clipping + fused Adam) on CUDA parameters
    with one host read. GPU: ``Trainer.train_step`` itself with bf16 autocast, twice."""
    model, b = build(), batch()
    t = OmegaConf.structured(TrainConfig).trainer
    with on_cuda() as fake:
        model = cuda_copy(model, fake)
        precision = build_precision("bf16", CUDA, model)
        if fake:
            give_grads(model)
            opt = build_optimizer(model, t)
            shim = CudaShim(fake)
            with shim:
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                ok = bool(torch.isfinite(norm))
                opt.step()
            assert ok and shim.syncs == 1
            assert shim.ran(aten._fused_adam_.default)
            assert shim.float_devices() == {"cuda"}
            assert all(s["exp_avg"].device == CUDA for s in opt.state.values()) and len(opt.state) == len(
                list(model.parameters())
            )
            return
        losses, before = real_train_steps(model, precision, t, b)
    assert all(torch.isfinite(torch.tensor(losses)))
    changed = [not torch.equal(p0, p.detach().cpu()) for p0, p in zip(before, model.parameters())]
    assert all(changed), "some weights did not change"


def give_grads(model: torch.nn.Module) -> None:
    """Gradients without a backward pass (which cannot run on fake CUDA tensors)."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)


def test_fp16_update_on_cuda():
    """fp16: GradScaler's unscale, the fused Adam step it hands the inf check to, and the scale
    update all run on the device without one host read (the fused kernel skips an inf step itself)."""
    model, t = build(), OmegaConf.structured(TrainConfig).trainer
    with on_cuda() as fake:
        model = cuda_copy(model, fake)
        patch = mock.patch("torch.cuda.is_available", lambda: True) if fake else contextlib.nullcontext()
        with patch:  # GradScaler("cuda") turns itself off where CUDA is unavailable
            precision = build_precision("fp16", CUDA, model)
        give_grads(model)
        opt, scaler = build_optimizer(model, t), precision.scaler
        loss = torch.zeros((), device=CUDA)
        shim = CudaShim(fake)
        with shim:
            scaled = scaler.scale(loss)
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
    assert scaler.is_enabled() and scaled.device == CUDA
    for op in ("_amp_foreach_non_finite_check_and_unscale_", "_fused_adam_", "_amp_update_scale_"):
        assert shim.ran(getattr(aten, op).default), op
    assert shim.float_devices() == {"cuda"} and shim.syncs == 0


def real_train_steps(model, precision, t, b):
    """Two ``Trainer.train_step`` calls on the GPU; → (losses, weights before)."""
    from nmt.distributed import Dist
    from nmt.trainer import EarlyStopping, Schedule, Trainer

    opt = build_optimizer(model, t)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    trainer = Trainer(model, opt, sched, precision, None, EarlyStopping(), None, None, Schedule(), {}, Dist())
    before = [p.detach().cpu().clone() for p in model.parameters()]
    losses = []
    for _ in range(2):
        loss = trainer.train_step([b.to(CUDA)])
        assert loss is not None and loss.device == CUDA
        losses.append(float(loss))
    return losses, before


def test_precision_choices_on_cuda():
    """fp16 on CUDA: autocast fp16 and an enabled GradScaler; none: neither."""
    model = build()
    patch = contextlib.nullcontext() if REAL else mock.patch("torch.cuda.is_available", lambda: True)
    with patch:  # GradScaler("cuda") turns itself off where CUDA is unavailable
        fp16 = build_precision("fp16", CUDA, model)
        none = build_precision("none", CUDA, model)
    assert fp16.autocast_dtype == torch.float16 and fp16.scaler.is_enabled()
    assert none.autocast_dtype is None and not none.scaler.is_enabled()
    assert isinstance(none.autocast(), contextlib.nullcontext)


@pytest.mark.skipif(not REAL, reason="GPU only (NMT_TEST_DEVICE=cuda, scripts/gpu_check.sh): real CUDA generators")
def test_rng_state_resumes_from_a_checkpoint_loaded_onto_the_gpu(tmp_path):
    """Resuming on a GPU loads the checkpoint with ``map_location=cuda``, which moves the saved generator
    states onto the GPU; ``set_rng_state`` must still restore both the CPU and the CUDA streams (it raised
    "RNG state must be a torch.ByteTensor" until session 21 ran a resume on an H100)."""
    from nmt.trainer import rng_state, set_rng_state

    torch.manual_seed(3)
    path = tmp_path / "state.pt"
    torch.save({"rng": [rng_state()]}, path)
    expected = torch.rand(4), torch.rand(4, device=CUDA).cpu()
    loaded = torch.load(path, map_location=CUDA, weights_only=False)["rng"][0]  # as nmt.checkpoint.load does
    assert loaded["torch"].device == CUDA  # what map_location does to the saved states
    set_rng_state(loaded)
    assert torch.equal(torch.rand(4), expected[0])
    assert torch.equal(torch.rand(4, device=CUDA).cpu(), expected[1])


@pytest.mark.parametrize("speed", [0.7, 1.3])
def test_auto_precision_on_cuda_is_measured_and_cached(tmp_path, speed):
    """``trainer.amp=auto`` on CUDA times float32 against bf16 autocast (``calibrate_cuda``) and keeps
    bf16 autocast only where it is faster by BF16_MARGIN; the next run reads the choice from the cache
    (keyed by the GPU's name). ``speed``: bf16 autocast's speed over float32's, from a fake clock."""
    from nmt.calibrate import Calibration

    model = build()
    hardware = (
        contextlib.nullcontext()
        if REAL
        else mock.patch.multiple(
            "torch.cuda", is_bf16_supported=lambda *a, **k: True, get_device_name=lambda *a, **k: "Fake GPU"
        )
    )

    def unused(dtype):
        raise AssertionError("measured again instead of reading the cache")

    with hardware:
        clock = Calibration(cache_dir=str(tmp_path), timer=lambda dtype: 1.0 if dtype is None else 1.0 / speed)
        first = build_precision("auto", CUDA, model, clock)
        again = build_precision("auto", CUDA, model, Calibration(cache_dir=str(tmp_path), timer=unused))
    expected = torch.bfloat16 if speed > 1 else None
    assert first.autocast_dtype == expected and again.autocast_dtype == expected
    assert first.description.startswith("bf16 autocast (" if expected else "float32 (")
    assert f"measured: bf16 autocast {speed:.2f}x the speed of float32 (training steps) on " in first.description
    assert "cached" in again.description and "cached" not in first.description
    assert not first.scaler.is_enabled()


@pytest.mark.skipif(not REAL, reason="GPU only (NMT_TEST_DEVICE=cuda, scripts/gpu_check.sh): real training steps")
def test_auto_precision_times_real_steps_on_the_gpu():
    """The real timer: whole forward+backward steps of the model on the GPU, float32 and bf16 autocast,
    leaving the weights, the gradients and the random streams as they were."""
    from nmt.calibrate import Calibration

    model = build().to(CUDA)
    before = [p.detach().clone() for p in model.parameters()]
    torch.manual_seed(5)
    expected = torch.rand(3, device=CUDA)
    torch.manual_seed(5)
    precision = build_precision("auto", CUDA, model, Calibration(max_tokens=200))
    assert "measured: bf16 autocast " in precision.description and "(training steps)" in precision.description
    assert torch.equal(torch.rand(3, device=CUDA), expected)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())


def test_a_cuda_device_index_beyond_the_machines_is_refused_in_one_line(monkeypatch):
    """device=cuda:2 on a 2-GPU machine: one line naming the devices there are, not a CUDA error mid-run.
    (The device count is patched: this test needs no GPU.)"""
    from nmt.errors import ConfigError
    from nmt.runtime import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda", 1) and resolve_device("cuda").index is None
    with pytest.raises(ConfigError, match=r"^device=cuda:2: this machine has 2 CUDA device\(s\), cuda:0 to cuda:1$"):
        resolve_device("cuda:2")
