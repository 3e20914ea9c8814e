"""``trainer.amp=auto`` on CPU: bf16 matrix products only where they are measured faster than float32.

Why measure rather than read a CPU flag: a flag says that bf16 units exist, not that they win for
this model. Model R trained about 1.6x faster with bf16 products on the AMX Xeon of
docs/benchmarks.md and +91% on an AVX512-BF16 EPYC (issue 15); on an AVX2-only EPYC bf16 products
are emulated and a training step took 30x as long; small models gain less than big ones everywhere.

Two stages, both on this model's own weights and shapes:

1. the probe: one time step's vocabulary projection ([B, O] · [O, V], B = the synthetic batch's
   sentences) in float32 and in bf16 (milliseconds). bf16 changes nothing but the products, so
   when they are clearly slower (below ``PROBE_FLOOR``) the step is too, and float32 is chosen
   without timing a step that could take a minute in emulated bf16;
2. otherwise whole forward+backward training steps on a synthetic batch of ``data.max_tokens``:
   a warm-up pair, then pairs alternating float32/bf16 until ``REPEATS`` pairs or ``BUDGET_S``
   seconds, the median of each. bf16 is kept only when at least ``BF16_MARGIN`` faster: float32
   is the more exact, and a near-tie would flip with noise.

On CUDA (``calibrate_cuda``) the same alternating pairs time whole training steps in float32 against
CUDA autocast in bf16, synchronised: on an H100, model R's launch-bound step loop ran 0.68-0.86x as
fast under bf16 autocast as in float32 (session 21, docs/benchmarks.md), so a GPU flag is no better
a guide than a CPU flag.

The result is cached, one small JSON file per key under ``trainer.amp_cache`` ($NMT_CACHE/precision,
beside the sentencepiece cache), keyed by the CPU model, the torch version, the thread count and
the model's shape, so later runs on the same machine measure nothing. The CPU step loops' measured kernel
choices (the tanh formula, packed float32 products: ``cached_kernel_choices``) are kept there too, per
CPU model, torch and thread count, so that every run on one machine computes alike. The timing is a seam:
``Calibration(timer=..., probe=...)`` takes any ``dtype -> seconds`` callables, which is how tests
choose an outcome without training.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from nmt.data.tokenizer import BOS, EOS
from nmt.models.rnn import (
    KERNEL_CHOICES,
    RNN,
    choices_from_speedups,
    measured_speedups,
    packed_linear,
    packed_weight,
    packs_float32,
)
from nmt.models.seq2seq import Seq2Seq, nll_loss
from nmt.rundir import atomic_write

log = logging.getLogger(__name__)

BF16_MARGIN = 1.05  # bf16 products must make steps at least this much faster than float32 to be chosen
PROBE_FLOOR = 0.8  # bf16 products below this share of float32's speed decide float32 without timing steps
WARMUP = 1  # untimed steps of each precision first (allocator growth, oneDNN kernel creation)
REPEATS = 3  # timed steps of each precision at most ...
BUDGET_S = 2.0  # ... or fewer once this many seconds have gone (at least one each)
PROBE_FLOP = 50_000_000  # multiply-adds per probe call at least (about 0.3 ms in float32 on 2 cores)
LENGTH = 16  # pieces per synthetic sentence, both sides: a mid-sized length bucket of Tatoeba pairs

Timer = Callable[[torch.dtype | None], float]  # matrix-product dtype (None = float32) -> seconds of one step


def cpu_name() -> str:
    """The CPU model as /proc/cpuinfo names it (``AMD EPYC 9R14 …``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_has_native_bf16() -> bool:
    """AMX or AVX512-BF16: bf16 matrix products have hardware behind them (elsewhere they are emulated)."""
    cpu = torch.cpu
    return any(getattr(cpu, f, lambda: False)() for f in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"))


@dataclass(frozen=True)
class Calibration:
    """What ``trainer.amp=auto`` measures (on a CPU, or a GPU: ``calibrate_cuda``), and where it keeps the result."""

    max_tokens: int = 2000  # data.max_tokens: the synthetic batch holds about this many target tokens
    cache_dir: str | None = None  # trainer.amp_cache; None = measure every time, keep nothing
    teacher_forcing: float = 1.0  # < 1 runs the decoder's step loop, as training will
    label_smoothing: float = 0.1
    timer: Timer | None = None  # seconds of one step; None: real steps of the model (StepTimer)
    probe: Timer | None = None  # seconds of one product; None: ProductTimer, or no probe when timer is given


@dataclass(frozen=True)
class Measured:
    """The outcome: which precision, how the two compared, and whether it came from the cache."""

    bf16: bool  # train with bf16 matrix products
    ratio: float  # bf16 products' speed / float32's (step time of float32 / step time of bf16)
    cpu: str
    threads: int
    basis: str  # what was timed: "steps" (whole training steps) or "probe" (one product; steps were not timed)
    cache: Path | None  # the cache file read or written
    cached_at: str | None = None  # when the cached measurement was taken; None = measured now
    seconds: float = 0.0  # how long measuring took (0 when read from the cache)
    forces: str = "trainer.amp"  # the key that forces a choice (the decoding commands': amp)
    products: str = "bf16 products"  # what bf16 means where it was measured (on CUDA: "bf16 autocast")

    def reason(self) -> str:
        """Why, for the log: ``measured: bf16 products 0.62x the speed of float32 on CPU …; cached …``.
        ``cpu`` names the device measured (a GPU's name on CUDA, where ``threads`` is 0 and not given)."""
        what = BASES.get(self.basis, self.basis)
        where = f"{self.cpu}, {self.threads} thread{'s' * (self.threads != 1)}" if self.threads else self.cpu
        text = f"measured: {self.products} {self.ratio:.2f}x the speed of float32 ({what}) on {where}"
        if self.cached_at:
            text += f"; cached {self.cached_at} in {self.cache} (delete it to measure again)"
        else:
            took = f"{self.seconds:.1f} s" if self.seconds >= 0.1 else f"{1000 * self.seconds:.0f} ms"  # not "0.0 s"
            text += f"; took {took}" + (f", saved to {self.cache}" if self.cache else "")
        return text + f"; {self.forces}=bf16 or none forces a choice"


# What a measurement timed, for Measured.reason: training's steps or its probe alone, or decoding's probe.
BASES = {
    "steps": "training steps",
    "probe": "the vocabulary projection alone; steps not timed",
    "decode": "the vocabulary projection",
}


def warn_if_emulated(key: str) -> None:
    """Warn that ``KEY=bf16`` forces bf16 products on a CPU without bf16 units (they are emulated there)."""
    if not cpu_has_native_bf16():
        log.warning(
            "%s=bf16: this CPU (%s) has no bf16 matrix units (AMX / AVX512-BF16), so bf16 products are emulated "
            "and usually slower than float32; %s=auto measures which is faster",
            key,
            cpu_name(),
            key,
        )


class StepTimer:
    """Seconds of one forward+backward training step of ``model`` with a given matrix-product dtype.

    The batch is synthetic: B = max_tokens // LENGTH sentences of LENGTH random pieces on each side
    (src/tgt_in/tgt_out [B, LENGTH]), the token budget the data pipeline fills. No optimiser step:
    the gradients are cleared after each step and the weights stay as they were.
    """

    def __init__(self, model: Seq2Seq, cal: Calibration):
        self.model, self.cal = model, cal
        g = torch.Generator().manual_seed(0)
        n = max(1, cal.max_tokens // LENGTH)
        src_vocab, tgt_vocab = model.encoder.embed.num_embeddings, model.decoder.embed.num_embeddings
        self.src = torch.randint(EOS + 1, src_vocab, (n, LENGTH), generator=g)
        self.src[:, -1] = EOS
        self.src_len = torch.full((n,), LENGTH, dtype=torch.long)
        self.tgt_out = torch.randint(EOS + 1, tgt_vocab, (n, LENGTH), generator=g)
        self.tgt_out[:, -1] = EOS
        self.tgt_in = torch.cat([torch.full((n, 1), BOS), self.tgt_out[:, :-1]], dim=1)

    def __call__(self, dtype: torch.dtype | None) -> float:
        self.model.set_matmul_dtype(dtype)
        start = time.perf_counter()
        logits, _ = self.model(self.src, self.src_len, self.tgt_in, self.cal.teacher_forcing)
        nll_loss(logits, self.tgt_out, self.cal.label_smoothing).backward()
        seconds = time.perf_counter() - start
        self.model.zero_grad(set_to_none=True)
        return seconds


class AutocastStepTimer(StepTimer):
    """StepTimer on a CUDA device: float32 against CUDA autocast in bf16 (how ``trainer.amp=bf16`` trains
    there, the loss inside autocast as in ``Trainer.train_step``), synchronised before and after so the
    seconds are the device's, not the launches'. src_len stays on the CPU, as ``Batch.to`` keeps it."""

    def __init__(self, model: Seq2Seq, cal: Calibration, device: torch.device):
        super().__init__(model, cal)
        self.device = device
        self.src, self.tgt_in, self.tgt_out = (t.to(device) for t in (self.src, self.tgt_in, self.tgt_out))

    def __call__(self, dtype: torch.dtype | None) -> float:
        torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype is not None):
            logits, _ = self.model(self.src, self.src_len, self.tgt_in, self.cal.teacher_forcing)
            loss = nll_loss(logits, self.tgt_out, self.cal.label_smoothing)
        loss.backward()
        torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        self.model.zero_grad(set_to_none=True)
        return seconds


class ProductTimer:
    """Seconds of one time step's vocabulary projection, [B, O] · [O, V] with the decoder's own
    output weight (B = max_tokens // LENGTH, or ``rows``), both operands already in the dtype (as
    StepLinear casts a weight once per pass). ``packed``: multiply as a search does, over the weight
    blocked once for oneDNN where ``rnn.packed_weight`` blocks it (bf16 where PyTorch can, float32
    where it measured faster on this CPU), so decoding's choice compares the products it would run;
    otherwise plain ``F.linear``, as a training step multiplies."""

    def __init__(self, model: Seq2Seq, cal: Calibration, rows: int | None = None, packed: bool = False):
        w = model.decoder.out.weight.detach()  # [V, O]
        rows = rows or max(1, cal.max_tokens // LENGTH)
        x = torch.randn(rows, w.size(1), generator=torch.Generator().manual_seed(0))
        self.operands = {None: (x, w), torch.bfloat16: (x.bfloat16(), w.bfloat16())}
        # dtype -> the blocked weight, or None: plain F.linear
        self.packed = {d: packed_weight(wd) if packed else None for d, (_, wd) in self.operands.items()}
        # a small model's product takes microseconds: repeat it to ~PROBE_FLOP so timer noise does not decide
        self.repeats = max(1, PROBE_FLOP // (x.size(0) * w.size(0) * w.size(1)))

    def __call__(self, dtype: torch.dtype | None) -> float:
        x, w = self.operands[dtype]
        blocked = self.packed[dtype]
        product = (
            (lambda: torch.nn.functional.linear(x, w)) if blocked is None else (lambda: packed_linear(x, blocked, None))
        )
        start = time.perf_counter()
        for _ in range(self.repeats):
            product()
        return time.perf_counter() - start


def measure(timer: Timer, repeats: int = REPEATS) -> tuple[float, float]:
    """(float32, bf16) median seconds: a warm-up pair, then alternating pairs (so drift in the
    machine's load falls on both alike) until ``repeats`` pairs or BUDGET_S seconds."""
    for _ in range(WARMUP):
        timer(None)
        timer(torch.bfloat16)
    f32: list[float] = []
    bf16: list[float] = []
    start = time.monotonic()
    while len(f32) < repeats and (not f32 or time.monotonic() - start < BUDGET_S):
        f32.append(timer(None))
        bf16.append(timer(torch.bfloat16))
    return statistics.median(f32), statistics.median(bf16)


def measure_model(model: Seq2Seq, cal: Calibration) -> dict:
    """The probe, then (unless it already rules bf16 out) whole steps; the model's training mode,
    product dtype and the RNG streams are left as they were, so a run that measures draws the same
    dropout masks as one that reads the cache."""
    probe, step = (cal.probe, cal.timer) if cal.timer else (ProductTimer(model, cal), StepTimer(model, cal))
    was_training, dtype = model.training, _product_dtype(model)
    start = time.monotonic()
    with torch.random.fork_rng(devices=[]):
        model.train()
        basis, (f32, bf16) = "probe", measure(probe) if probe else (1.0, 1.0)
        if not probe or f32 / bf16 >= PROBE_FLOOR:
            basis, (f32, bf16) = "steps", measure(step)
    model.train(was_training)
    model.set_matmul_dtype(dtype)
    return {"float32_s": f32, "bf16_s": bf16, "basis": basis, "seconds": time.monotonic() - start}


def model_signature(model: Seq2Seq, cal: Calibration) -> str:
    """A digest of what decides the step's cost: the modules and parameter shapes, the RNNs'
    implementation, the batch budget and whether the decoder runs its step loop."""
    rnns = [m.impl for m in model.modules() if isinstance(m, RNN)]
    shapes = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    text = repr((repr(model), shapes, rnns, cal.max_tokens, cal.teacher_forcing < 1.0))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _check_times(entry: dict) -> None:
    """A precision entry's two times must be positive numbers (ValueError, KeyError or TypeError if not)."""
    f32, bf16 = float(entry["float32_s"]), float(entry["bf16_s"])
    if not (f32 > 0 and bf16 > 0):
        raise ValueError(f"step times {f32}, {bf16} are not positive")


def _read_cache(path: Path, key: dict, check: Callable[[dict], None] = _check_times) -> dict | None:
    """The cached measurement for ``key``, or None (absent; unreadable or not ours: a warning)."""
    if not path.is_file():
        return None
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
        if entry["key"] != key:
            raise ValueError("it was written for another CPU/torch/model")
        check(entry)
        return entry
    except (OSError, ValueError, KeyError, TypeError) as e:  # json.JSONDecodeError is a ValueError
        log.warning("%s: unreadable cache entry (%s); measuring again", path, e)
        return None


def calibrate(model: Seq2Seq, cal: Calibration) -> Measured:
    """Float32 or bf16 products for training ``model`` on this CPU: from the cache, else measured
    (``measure_model``) and saved."""
    threads = torch.get_num_threads()
    key = {"cpu": cpu_name(), "torch": torch.__version__, "threads": threads, "model": model_signature(model, cal)}
    entry, path, cached_at = _cached(cal.cache_dir, key, lambda: measure_model(model, cal))
    return _measured(entry, path, cached_at, "trainer.amp")


CUDA_REPEATS = 8  # timed step pairs on a GPU (a step takes milliseconds there; BUDGET_S still caps them)


def calibrate_cuda(model: Seq2Seq, cal: Calibration, device: torch.device) -> Measured:
    """Float32 or bf16 autocast for training ``model`` on this GPU: from the cache (keyed by the GPU's
    name, torch, CUDA and the model), else whole steps timed (``AutocastStepTimer``, or ``cal.timer``)
    and saved. The CPU and this GPU's random streams are left as they were."""
    gpu = torch.cuda.get_device_name(device)
    key = {"gpu": gpu, "torch": torch.__version__, "cuda": torch.version.cuda, "model": model_signature(model, cal)}

    def run() -> dict:
        step = cal.timer or AutocastStepTimer(model, cal, device)
        was_training, start = model.training, time.monotonic()
        with torch.random.fork_rng(devices=[device] if torch.cuda.is_available() else []):
            model.train()
            f32, bf16 = measure(step, CUDA_REPEATS)
        model.train(was_training)
        return {"float32_s": f32, "bf16_s": bf16, "basis": "steps", "seconds": time.monotonic() - start}

    entry, path, cached_at = _cached(cal.cache_dir, key, run)
    return _measured(entry, path, cached_at, "trainer.amp", products="bf16 autocast")


def _measured(
    entry: dict, path: Path | None, cached_at: str | None, forces: str, products: str = "bf16 products"
) -> Measured:
    """A cache entry (``_cached``) as the decision it makes: bf16 when at least BF16_MARGIN faster."""
    ratio = entry["float32_s"] / entry["bf16_s"]
    seconds = 0.0 if cached_at else entry["seconds"]
    key, basis = entry["key"], entry.get("basis", "steps")
    where, threads = key.get("cpu") or key["gpu"], key.get("threads", 0)
    return Measured(ratio >= BF16_MARGIN, ratio, where, threads, basis, path, cached_at, seconds, forces, products)


def _cached(
    cache_dir: str | None, key: dict, measure_fn: Callable[[], dict], check: Callable[[dict], None] = _check_times
) -> tuple[dict, Path | None, str | None]:
    """The measurement for ``key``: read from ``cache_dir`` (one JSON file per key; ``check`` raises on an
    entry that is not usable), else ``measure_fn()`` saved there (atomically; a read-only cache only warns).
    → (entry, its file or None, when it was measured if it came from the cache, else None)."""
    path = None
    if cache_dir:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        path = Path(cache_dir).expanduser() / f"{digest}.json"
    entry = _read_cache(path, key, check) if path else None
    if entry is not None:
        return entry, path, entry.get("measured_at", "earlier")
    entry = {"key": key, **measure_fn(), "measured_at": _now()}
    if path:
        try:
            atomic_write(path, lambda f: f.write(json.dumps(entry, indent=1).encode()))
        except OSError as e:  # a read-only home must not stop the command; the next run measures again
            log.warning("%s: could not save the measurement (%s)", path, e)
            path = None
    return entry, path, None


def cached_kernel_choices(cache_dir: str | None) -> tuple[dict[str, bool], str | None, dict[str, float]]:
    """The CPU step loops' measured kernel choices (``nmt.models.rnn.kernel_choices``: the tanh formula,
    packed float32 products) for this CPU, from the cache under ``cache_dir`` (``amp_cache``), else measured
    now (about 0.1 s) and saved there. Keyed like the precision by the CPU model, torch and the thread
    count, so every fresh run on one machine computes alike: a measurement taken on a busy machine can tip
    either choice (the tanh measured 0.2x under load where it is 1.4-1.9x otherwise), and two seeded runs
    would then differ. → (choices, where they came from for the log, the speedups behind them), what
    ``pin_kernel_choices`` takes."""
    threads, kernels = torch.get_num_threads(), list(KERNEL_CHOICES)  # a list: as JSON reads the key back
    key = {"cpu": cpu_name(), "torch": torch.__version__, "threads": threads, "kernels": kernels}

    def run() -> dict:
        start = time.monotonic()
        return {"speedups": measured_speedups(), "seconds": time.monotonic() - start}

    def check(entry: dict) -> None:
        if not all(float(entry["speedups"][k]) >= 0 for k in KERNEL_CHOICES):
            raise ValueError(f"speedups {entry['speedups']} are not all numbers >= 0")

    entry, path, cached_at = _cached(cache_dir, key, run, check)
    speedups = {k: float(entry["speedups"][k]) for k in KERNEL_CHOICES}
    if cached_at:
        note = f"cached {cached_at} in {path}, delete it to measure again"
    else:
        note = f"saved to {path}" if path else None
    return choices_from_speedups(speedups), note, speedups


def _product_dtype(model: Seq2Seq) -> torch.dtype | None:
    return next((m.matmul_dtype for m in model.modules() if isinstance(m, RNN)), None)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


DECODE_ROWS = 256  # beams in one search step when choosing decoding's products: ~50 sentences x beam 5


def decode_dtype(
    model: Seq2Seq, amp: str, device: torch.device, cache_dir: str | None = None, probe: Timer | None = None
) -> tuple[torch.dtype | None, str]:
    """``amp`` of translate/evaluate/serve → the dtype of decoding's matrix products (None = float32) and
    why, for the log.

    A beam search step is mostly the vocabulary projection ([beams, O] · [O, V]); the rest (attention,
    gate maths, top-k) is small and stays float32 whatever the choice. So ``auto`` on CPU times that
    projection alone at DECODE_ROWS rows in float32 and bf16, each over the weight blocked as the
    search blocks it (``ProductTimer(packed=...)``; ``measure``: well under a second) and
    takes bf16 when it is at least BF16_MARGIN faster. Like training's choice it is cached per CPU
    model, torch, thread count and projection shape (``cache_dir``: the commands' ``amp_cache``), so
    the same machine always decodes the same way. On CUDA ``auto`` stays float32 (decoding on a GPU has
    never been measured here). ``bf16`` forces bf16 products (warning where they are emulated), ``none``
    float32. ``probe``: a ``dtype -> seconds`` timer for tests (default: ProductTimer).
    """
    if amp == "none":
        return None, "amp=none"
    if amp == "bf16":
        if device.type == "cpu":
            warn_if_emulated("amp")
        return torch.bfloat16, "amp=bf16"
    if amp != "auto":
        raise ValueError(f"amp={amp!r}: expected auto, bf16 or none")
    if device.type != "cpu":
        return None, "amp=auto keeps float32 on CUDA for decoding (never measured on a GPU); amp=bf16 forces"
    threads = torch.get_num_threads()
    shape = [DECODE_ROWS, *reversed(model.decoder.out.weight.shape)]  # rows, O, V
    # The search blocks its weights on the CPU fast path (float32 only where packing measured faster), so the
    # products timed are those: another packing is another cache entry.
    packed = model.decoder.packs_weights()
    key = {"cpu": cpu_name(), "torch": torch.__version__, "threads": threads, "decode_projection": shape}
    key["packed"] = {"bf16": packed, "float32": packed and packs_float32()}

    def run() -> dict:
        start = time.monotonic()
        f32, bf16 = measure(probe or ProductTimer(model, Calibration(), rows=DECODE_ROWS, packed=packed))
        return {"float32_s": f32, "bf16_s": bf16, "basis": "decode", "seconds": time.monotonic() - start}

    measured = _measured(*_cached(cache_dir, key, run), "amp")
    return (torch.bfloat16 if measured.bf16 else None), measured.reason()
