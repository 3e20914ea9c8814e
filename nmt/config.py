"""Typed configuration schema.

Every YAML file under ``configs/`` is validated against these dataclasses, so a
mistyped key (``trainer.max_step=5``) or a wrong type fails before any work starts.
Only the entry points (``nmt.train``, ``nmt.translate``) see these objects; the
``build_*`` factories turn them into plain Python values for the modules.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import inspect
import math
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from nmt.errors import ConfigError


@dataclass
class DataConfig:
    # "tsv": local files ``{dir}/{train,valid,test}``; "hub": a Hugging Face dataset.
    source: str = "tsv"
    dir: str = "data/spa-eng"  # the corpus folder (source=tsv)
    train: str = "train.tsv"
    valid: str = "valid.tsv"
    test: str = "test.tsv"
    # Hub datasets (source=hub): ``load_dataset(hub_path, hub_name, split=..., streaming=True)``.
    hub_path: str | None = None
    hub_name: str | None = None
    train_split: str = "train"
    valid_split: str = "validation"
    test_split: str = "test"
    src_lang: str = "en"
    tgt_lang: str = "es"
    # Fill ``dir`` with the default corpus on first use (tsv only; see nmt.data.fetch).
    fetch: bool = True
    # Malformed corpus lines are counted and reported; strict=true makes them fatal.
    strict: bool = False
    # TSV files: [S, T] reads the source from column S and the target from column T (0-based) of lines with any
    # number of columns: [1,0] trains the other direction, [0,1] reads files with more columns (the manythings.org/
    # Anki exports carry a third, attribution column). Unset: exactly two columns, source<TAB>target.
    columns: list[int] | None = None
    # Pairs with this many pieces or more on either side are left out of training (>= 2).
    max_len: int = 50
    # Token budget per batch: n_sentences * max(padded src len, padded tgt len) <= max_tokens.
    max_tokens: int = 2000
    # And at most this many sentence pairs per batch (0 = no cap): the papers' fixed batch sizes (Bahdanau et al.
    # 2015: 80, Luong et al. 2015: 128) with max_tokens >= max_sentences * max_len, so the budget never binds first.
    max_sentences: int = 0
    # Pairs read ahead, sorted by length and cut into batches (bigger = less padding).
    bucket_size: int = 20000
    # Streaming shuffle buffer (pairs) in front of the bucketing.
    shuffle_buffer: int = 20000
    # DataLoader workers that read + tokenise + batch while the model computes.
    num_workers: int = 1
    # Word dropout (training only): probability that a source piece becomes <unk> in the encoder's input.
    src_word_dropout: float = 0.0
    # ... and that a target piece becomes <unk> in the decoder's input (never in the loss targets).
    tgt_word_dropout: float = 0.0
    # Cap on validation sentences decoded for BLEU during training (0 = all).
    valid_max_sentences: int = 0


@dataclass
class TokenizerConfig:
    model_type: str = "unigram"  # unigram | bpe
    vocab_size: int = 8000
    joint: bool = True  # one vocabulary for both languages (needed for tied src/tgt embeddings)
    sample_size: int = 300000  # sentences per language read from the training stream to train on
    character_coverage: float = 1.0
    # Subword sampling in the training stream (0 = off): unigram smoothing alpha (Kudo 2018), or for
    # model_type=bpe the BPE-dropout rate, < 1 (Provilkov et al. 2020). Longer pieces lists: see data.max_len.
    sample_alpha: float = 0.0
    sample_nbest: int = -1  # unigram sampling: draw from the best N segmentations (-1 = all, or 2 <= N <= 512)
    # Trained models are cached under cache_dir/<key>, key = hash(corpus + these settings).
    # (cache root: $NMT_CACHE, default ~/.cache/nmt).
    cache_dir: str = "${oc.env:NMT_CACHE,'~/.cache/nmt'}/sentencepiece"


@dataclass
class EncoderConfig:
    cell: str = "gru"  # gru | lstm
    emb_size: int = 256
    hidden_size: int = 256  # per direction; keys/values are 2 * hidden_size wide
    layers: int = 1
    dropout: float = 0.2  # between RNN layers and on the outputs (the attention keys)
    emb_dropout: float | None = None  # on the source embeddings (null = the same as dropout)
    layer_norm: bool = False  # layer-normalised GRU/LSTM cells (Ba et al. 2016); computed by the step loops
    layer_norm_gain: float = 1.0  # with layer_norm: the gains' starting value (Ba et al.: 1)


@dataclass
class AttentionConfig:
    name: str = MISSING  # a key of nmt.models.attention.ATTENTIONS
    # Width of the scoring MLP for concat/bahdanau/coverage/multihead (0 = decoder hidden size).
    dim: int = 0
    window: int = 5  # local_m / local_p: half-width D of the window (σ = D/2)
    score: str = "general"  # local_m / local_p: the score used inside the window
    heads: int = 4  # multihead: number of heads (must divide dim)
    max_positions: int = 256  # location: longest source it can weigh


@dataclass
class DecoderConfig:
    order: str = "bahdanau"  # bahdanau (attend, then RNN) | luong (RNN, then attend)
    cell: str = "${encoder.cell}"
    emb_size: int = 256
    hidden_size: int = 512  # the decoder RNN's state size
    layers: int = 1
    dropout: float = 0.2  # between RNN layers and on the readout (bahdanau) / attentional vector (luong)
    emb_dropout: float | None = None  # on the target embeddings (null = the same as dropout)
    layer_norm: bool = False  # layer-normalised GRU/LSTM cells (Ba et al. 2016); computed by the step loops
    layer_norm_gain: float = 1.0  # with layer_norm: the gains' starting value (Ba et al.: 1)
    input_feeding: bool = True  # luong order only: feed the last attentional vector to the RNN
    tie_embeddings: bool = False  # output projection shares the target embedding matrix


@dataclass
class WandbConfig:
    # auto: online when an API key is configured, else offline; or online | offline | disabled.
    mode: str = "auto"
    project: str = "nmt"
    entity: str | None = None
    name: str | None = None
    quiet: bool = True  # wandb's own console output (banners, sparklines, summaries) off; all is still logged


@dataclass
class TrainerConfig:
    max_steps: int = 0  # 0 = no limit
    max_epochs: int = 0  # 0 = no limit
    max_minutes: float = 0.0  # wall-clock budget, 0 = no limit
    optimizer: str = "adam"  # adam | adamw | sgd | adadelta | adagrad (SGD and Adadelta usually want lr=1.0)
    lr: float = 1e-3  # peak learning rate
    betas: tuple[float, float] = (0.9, 0.999)  # adam, adamw
    momentum: float = 0.0  # sgd only
    rho: float = 0.95  # adadelta only: the decay of its running averages (Bahdanau et al. 2015: 0.95)
    weight_decay: float = 0.0
    # constant | warmup_decay (linear warmup, then inverse square root) | plateau (halve when select_by stops
    # improving) | budget (the peak rate, then a linear decay to min_lr over the last decay_fraction of
    # max_minutes/max_steps) | step (times decay_factor at decay_start and every decay_every updates after it)
    scheduler: str = "plateau"
    warmup_steps: int = 0
    decay_fraction: float = 0.3  # scheduler=budget: the share of the budget over which the rate decays
    decay_start: int = 0  # scheduler=step: the update at which the rate is first multiplied by decay_factor
    decay_every: int = 0  # scheduler=step: and again every this many updates after it (>= 1 with step)
    decay_factor: float = 0.5  # scheduler=step: the multiplier, in (0, 1)
    plateau_factor: float = 0.5
    plateau_patience: int = 2
    min_lr: float = 1e-5
    clip_grad: float = 1.0
    # > 0: validate, select and save an exponential moving average of the weights instead of the weights
    # themselves (OpenNMT-py's average_decay, fairseq's --ema), e.g. 0.999; the training weights are kept in
    # the checkpoints for resuming. 0 = off. (nmt.trainer.WeightAverage)
    ema_decay: float = 0.0
    label_smoothing: float = 0.1
    # Probability of feeding the reference token; < 1 = scheduled sampling (forces the step loop).
    teacher_forcing: float = 1.0
    # auto | bf16 | fp16 | none. CUDA: autocast in bf16/fp16. CPU: bf16 applies to the big matrix products
    # only (vocabulary projection, the RNN step loops' GEMMs). auto times a few steps of the model both ways
    # at startup (on a CPU where bf16 is already clearly slower for the vocabulary projection alone, only that;
    # cached per CPU or GPU model in amp_cache) and keeps the faster; bf16 forces.
    amp: str = "auto"
    # Where trainer.amp=auto keeps its per-CPU/GPU measurements, and the CPU step loops their measured
    # kernel choices (tanh formula, packed products), so every run on a machine computes alike (null: measure
    # at every start).
    amp_cache: str | None = "${oc.env:NMT_CACHE,'~/.cache/nmt'}/precision"
    # auto | system. auto: on CPU with glibc, freed memory stays in the process for the next step instead of
    # being unmapped and faulted in again (nmt.allocator; faster, keeps the peak memory); system: malloc as is.
    allocator: str = "auto"
    # Validation interval in steps. 0 (default): measured at the start of the run as about valid_minutes of
    # training and kept for the run (saved in checkpoints, so a resumed run validates at the same steps).
    valid_every: int = 0
    valid_minutes: float = 3.0  # validate about this often (minutes of training) when valid_every=0
    val_beam_size: int = 1
    plot_attention: int = 3  # heatmaps of the first N validation sentences at every validation (0 = off)
    patience: int = 5  # stop after this many validations without a gain in select_by (0 = never)
    # The validation metric that picks best.pt, counts patience and steps the plateau scheduler: bleu | chrf |
    # acc (teacher-forced token accuracy; higher is better) | loss (unsmoothed cross-entropy; lower is better).
    select_by: str = "bleu"
    # last.pt is written at least this often (besides every validation), so a hard kill loses at most this much.
    checkpoint_minutes: float = 5.0
    # On CPU with glibc, a fresh process after this many minutes of training in one (0 = never): at the first
    # validation after them (it writes last.pt), ``python -m nmt.train`` replaces itself (same PID) with its exact
    # resume. A long run's heap fragments and malloc slows its steps; a new process starts at full speed
    # (docs/benchmarks.md, "A fresh process gives a long run its speed back"). Not in -m sweeps or under torchrun.
    restart_minutes: float = 0.0
    log_every: int = 100  # a progress line after this many steps since the last one ...
    log_seconds: float = 30.0  # ... and at least every this many seconds
    resume: bool = False  # continue from last.pt of hydra.run.dir (without it: the newest run of this command)
    # Keys that may differ from the checkpoint's config on resume (besides limits, device, logging).
    allow_changes: list[str] = field(default_factory=list)
    # Also write the metrics (validations, and train loss / lr / tokens per second at every progress line) as
    # TensorBoard event files in RUN_DIR/tensorboard: `tensorboard --logdir outputs`. Needs the tensorboard
    # package (scripts/install.sh installs it; else pip install tensorboard).
    tensorboard: bool = False
    # Start from a checkpoint's weights and sentencepiece pieces with a fresh optimiser, schedule and step count
    # (fine-tuning); model and tokenizer keys as in its run (dropout rates may differ). A resume ignores it.
    init_from: str | None = None
    # step_N.pt checkpoints kept besides last.pt (everything, to resume) and best.pt (weights only, to translate);
    # each is a full copy (~3x the weights with Adam's moments): keep some to average them (nmt.average).
    keep_last: int = 0
    # At the end of a run (a limit or early stopping), average the newest N step_N.pt checkpoints into
    # checkpoints/averaged.pt and validate it beside best.pt (0 = off; needs keep_last >= N).
    average_last: int = 0
    # At the end of a run, decode the validation sentences with every beam size x length penalty below and
    # store the best pair in best.pt (and averaged.pt) as the defaults nmt.translate/evaluate/serve use.
    tune_decoding: bool = True
    tune_beam_sizes: list[int] = field(default_factory=lambda: [1, 3, 5, 8])  # tune_decoding's beam sizes
    tune_length_penalties: list[float] = field(default_factory=lambda: [0.6, 0.8, 1.0, 1.2])  # and length penalties
    # Only for a checkpoint whose validation BLEU reaches this: below it (a run too short to learn much) the
    # grid's differences are noise, 13 decodes cost more than such a run trained, and a tie would store greedy
    # search; the decoding commands then use beam 5, length penalty 1.0. 0 = always.
    tune_min_bleu: float = 1.0
    # At the end of a run, store in best.pt (and averaged.pt) a lexical vocabulary shortlist built from the
    # training pairs: the shortlist_frequent most frequent target pieces + shortlist_per_source per source
    # piece. nmt.translate/evaluate/serve search each batch over it when told shortlist=true.
    # nmt.shortlist; its speed and BLEU change: docs/benchmarks.md.
    shortlist: bool = True
    shortlist_frequent: int = 500
    shortlist_per_source: int = 20
    max_bad_steps: int = 5  # non-finite losses/gradients in a row (skipped updates) before the run stops, >= 1
    threads: int = 0  # torch intra-op threads on CPU (0 = leave torch's default)
    # Batches (of data.max_tokens each) per rank summed into one update; the global batch is
    # world_size * accum_steps batches, and one process with accum_steps=N reproduces N ranks.
    accum_steps: int = 1


@dataclass
class ModelConfig:
    rnn_impl: str = "auto"  # auto | eager | loop | cudnn (how the RNNs are computed; nmt.models.rnn)
    # One matrix for the source embedding, the target embedding and the output layer (implies
    # decoder.tie_embeddings); needs tokenizer.joint=true and encoder.emb_size == decoder.emb_size.
    tie_all_embeddings: bool = False
    # The LSTM forget gates' bias at the start (b_ih + b_hh of the f gate; the other biases stay in
    # ±init_range): 1 keeps the cell's memory open early in training (Gers et al. 2000; Jozefowicz et al.
    # 2015, Joey NMT's lstm_forget_gate). null = no special start. LSTM cells only.
    lstm_forget_bias: float | None = None


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    seed: int = 1234
    name: str = "nmt"  # the run's name (wandb, reports)


@dataclass
class DecodeConfig:
    """Search settings shared by nmt.translate and nmt.evaluate (see nmt.search for the formulas)."""

    checkpoint: str = MISSING  # a trained model: RUN_DIR/checkpoints/best.pt (or last.pt, or nmt.average's output)
    ensemble: list[str] = field(default_factory=list)  # more checkpoints to decode with, averaging p(y)
    # beam width (1 = greedy search); unset: the checkpoint's choice (made on valid when it was trained), else 5.
    beam_size: int | None = None
    n_best: int = 1  # nmt.translate: print this many hypotheses per line (with scores) when > 1
    # GNMT alpha (0 = raw log-probability); unset: the checkpoint's choice on valid, else 1.0.
    length_penalty: float | None = None
    coverage_penalty: float = 0.0  # GNMT beta; 0 = off
    max_len_ratio: float = 2.0  # at most max_len_ratio * source length + 10 pieces
    min_len_ratio: float = 0.0  # no EOS before min_len_ratio * source length pieces
    no_repeat_ngram: int = 0  # forbid repeating any n-gram of this size (0 = off)
    # exact: beam search stops when no open beam can still win | early: when none could win by ending
    # at the next step (faster under a length penalty; may miss a longer best hypothesis; nmt.search).
    # unset: the checkpoint's choice on valid (early only where it lost no BLEU there), else exact.
    stop: str | None = None
    # Sample each next piece from the model instead of searching (back-translation: Edunov et al. 2018), beam_size
    # unset or 1; n_best=N draws N outputs per line. The same line with the same sample_seed draws the same.
    sample: bool = False
    sample_topk: int = 0  # sample from the k most probable pieces (0 = all)
    sample_topp: float = 1.0  # sample from the smallest set of pieces holding this probability (nucleus; 1 = all)
    temperature: float = 1.0  # sharpens (< 1) or flattens (> 1) the distribution sampled from
    sample_seed: int = 0
    max_input_len: int = 256  # source pieces kept per line; longer lines are truncated with a warning
    device: str = "auto"  # auto (CUDA when present) | cpu | cuda | cuda:N
    threads: int = 0  # torch intra-op threads on CPU (0 = leave torch's default)
    # nmt.translate input=FILE and nmt.evaluate on a CPU (Linux): decode in this many one-thread processes, each
    # taking the next search batch (0 = auto: one per CPU thread, see threads, up to 8; 1 = this process only). Same
    # translations, faster (docs/benchmarks.md, run 11). stdin, nmt.serve and CUDA decode in one process.
    workers: int = 0
    # none | int8: the decoder's linear and recurrent products in int8 (CPU only; nmt.models.quant)
    quantize: str = "none"
    # true: search each batch over the checkpoint's lexical shortlist of target pieces, when it stores one
    # (nmt.shortlist: faster, scores normalised over the shortlist, BLEU may change: docs/benchmarks.md);
    # false: over the whole vocabulary.
    shortlist: bool = False
    # Matrix products of decoding (quantize=none): auto = bf16 where a quick measurement on this CPU finds
    # them faster than float32 (AMX / AVX512-BF16 CPUs), else float32; bf16 | none force (nmt.calibrate).
    amp: str = "auto"
    # Where amp=auto keeps its per-CPU choice, and the measured kernel choices (as trainer.amp_cache), so one
    # machine always decodes alike (null: measure every time).
    amp_cache: str | None = "${oc.env:NMT_CACHE,'~/.cache/nmt'}/precision"


@dataclass
class TranslateConfig(DecodeConfig):
    input: str | None = None  # a file; unset: stdin, answered line by line
    output: str | None = None  # a file; unset: stdout
    # Lines read per batch from a file; each batch is sorted by length into searches, so bigger batches pad
    # less and decode faster (64 -> 500 lines: 1.29x on valid.tsv, docs/benchmarks.md); output is written
    # after each batch. stdin is answered line by line.
    batch_size: int = 1000
    attention_plot: str | None = None  # a folder: one heatmap PNG per translated line (00000.png, ...)
    attention_out: str | None = None  # a file: the attention matrices as JSON lines


@dataclass
class EvaluateConfig(DecodeConfig):
    input: str = MISSING  # TSV: source in column 1, reference in column 2
    # [S, R]: the source in column S, the reference in column R (0-based), lines may have more columns, as
    # data.columns in training. Unset: exactly two columns, source<TAB>reference.
    columns: list[int] | None = None
    hypotheses: str | None = None  # also write the translations here, one per TSV line
    json: str | None = None  # also write the scores here
    # A second system to test against (paired bootstrap, sacrebleu): a checkpoint (*.pt, decoded with
    # the same search settings) or a file of its translations, one per TSV line.
    baseline: str | None = None
    bootstrap_samples: int = 1000


@dataclass
class ServeConfig(DecodeConfig):
    host: str = "127.0.0.1"  # loopback: reachable from this machine only
    port: int = 8000  # the TCP port to listen on
    max_chars: int = 500  # longer requests are refused (HTTP 413)
    http_threads: int = 4  # waitress worker threads answering requests (translations still run one at a time)


@dataclass
class AverageConfig:
    output: str = MISSING  # the averaged checkpoint to write (weights only: for translating, not resuming)
    checkpoints: list[str] = field(default_factory=list)  # the files to average (or give run_dir)
    run_dir: str | None = None  # average the newest `last` step_N.pt checkpoints of this run
    last: int = 5  # how many of run_dir's newest step_N.pt checkpoints


JOB_NAME_LIMIT = 150  # characters of a sweep job's folder name


def override(key: str, value: Any) -> str:
    """``key=value`` as Hydra's override grammar reads ``value`` back as that exact text: quoted when the
    plain text would not parse or would change (a sweep job's folder, ``0_attention=dot,seed=1``, holds
    ``=`` and ``,``; ``~``, brackets and quotes need it too). For printed commands, with ``shlex`` on top."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    text, plain = str(value), f"{key}={value}"
    try:
        if OverridesParser.create().parse_override(plain).value() == text:
            return plain
    except Exception:  # noqa: BLE001  (Hydra's grammar refuses it: quote it)
        pass
    return f"{key}={_quoted(text)}"


def _quoted(text: str) -> str:
    """``text`` inside Hydra's single quotes, where a backslash escapes only a quote or the backslashes before
    one (or the end)."""
    quoted = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    quoted = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, quoted)
    return f"'{quoted}'"


def value_override(key: str, value: Any) -> str:
    """``key=value`` that sets ``key`` back to a config value of any type: ``true``/``false``, ``null``,
    numbers, lists (``[a,'b c']``) and text as Hydra's grammar reads them (``override`` for text)."""
    if isinstance(value, str):
        return override(key, value)

    def literal(v: Any) -> str:
        if isinstance(v, bool) or v is None:
            return {True: "true", False: "false", None: "null"}[v]
        if isinstance(v, (list, tuple)):
            return "[" + ",".join(_quoted(x) if isinstance(x, str) else literal(x) for x in v) + "]"
        return repr(v)

    return f"{key}={literal(value)}"


def shell_quote(arg: str) -> str:
    """``arg`` for a printed shell command: as is when safe, else in single quotes, or in double quotes when
    it holds Hydra's single quotes (``"checkpoint='a=b/best.pt'"`` rather than shlex's ``'"'"'`` chains)."""
    quoted = shlex.quote(arg)
    if quoted == arg or "'" not in arg or re.search(r'[$`\\"!]', arg):
        return quoted
    return f'"{arg}"'


def resume_args(run_dir: Any) -> list[str]:
    """The overrides that continue the run in ``run_dir``: the printed resume hints and ``nmt.train``'s restart use
    these same two, so what a user pastes and what a restart runs cannot drift apart."""
    return [override("hydra.run.dir", run_dir), "trainer.resume=true"]


def then_args(overrides: Any, last: list[str]) -> list[str]:
    """``overrides`` (strings or Hydra's saved ones) without those that set a key of ``last`` (``+``/``~`` forms
    too), then ``last`` (each already in Hydra's grammar, see ``override``)."""
    keys = {a.split("=", 1)[0] for a in last}
    return [*(o for o in map(str, overrides) if o.split("=", 1)[0].lstrip("+~") not in keys), *last]


def train_command(overrides: Any, last: list[str], multirun: bool = False) -> str:
    """``python -m nmt.train [-m] OVERRIDES LAST`` (``then_args``) as a line to paste into a shell, every argument
    shell-quoted (``shell_quote``)."""
    head = "python -m nmt.train" + (" -m" if multirun else "")
    return " ".join([head, *map(shell_quote, then_args(overrides, last))])


def job_dirname(override_dirname: str, *first: str) -> str:
    """A sweep job's folder name from its overrides (``configs/config.yaml``): path separators become
    ``_`` so that ``data.dir=a/b`` never nests a job folder, and very long names are cut. ``first``:
    values put in front, joined by ``_``, so that they survive the cut (an experiment names the
    keys that make its jobs unique: ``${nmt_job_name:${hydra.job.override_dirname},${seed}}``)."""
    parts = [*first, override_dirname] if override_dirname else list(first)
    name = "_".join(str(x) for x in parts).replace("/", "_").replace("\\", "_").lstrip(".")
    return name[:JOB_NAME_LIMIT]


def register_configs() -> None:
    """Register the schemas so Hydra validates the YAML files against them (and the job-name resolver)."""
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("nmt_job_name", job_dirname, replace=True)
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="translate_schema", node=TranslateConfig)
    cs.store(name="evaluate_schema", node=EvaluateConfig)
    cs.store(name="average_schema", node=AverageConfig)
    cs.store(name="serve_schema", node=ServeConfig)


def to_plain(cfg: Any) -> dict:
    """Resolved, JSON-serialisable copy of a config (what checkpoints and wandb store)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # type: ignore[return-value]


# The allowed values of every choice key, declared once (the modules that act on a key check it again
# as a second line of defence). attention.name/score come from the registry nmt.models.attention.ATTENTIONS.
CHOICES: dict[str, tuple[str, ...]] = {
    "data.source": ("tsv", "hub"),
    "tokenizer.model_type": ("unigram", "bpe"),
    "encoder.cell": ("gru", "lstm"),
    "decoder.cell": ("gru", "lstm"),
    "decoder.order": ("bahdanau", "luong"),
    "trainer.optimizer": ("adam", "adamw", "sgd", "adadelta", "adagrad"),  # nmt.training.OPTIMIZERS
    "trainer.scheduler": ("constant", "warmup_decay", "plateau", "budget", "step"),
    "trainer.select_by": ("bleu", "chrf", "acc", "loss"),  # nmt.trainer.EarlyStopping
    "trainer.amp": ("auto", "bf16", "fp16", "none"),
    "trainer.allocator": ("auto", "system"),  # nmt.allocator.MODES
    "model.rnn_impl": ("auto", "eager", "loop", "cudnn"),  # nmt.models.rnn.IMPLS
    "wandb.mode": ("auto", "online", "offline", "disabled"),
    "quantize": ("none", "int8"),  # nmt.models.quant.MODES
    "amp": ("auto", "bf16", "none"),  # the decoding commands' products (nmt.calibrate.decode_dtype)
    "stop": ("exact", "early"),  # nmt.search.STOP_RULES
}


# The attentions that ship with nmt, as nmt.models.attention registers them (tests/test_cli.py holds the two
# equal): checking a config never imports the registry, which brings torch (~3 s before a one-line answer).
BUILTIN_ATTENTIONS = (
    "bahdanau", "concat", "coverage", "dot", "general", "local_m", "local_p", "location", "multihead", "scaled_dot",
)  # fmt: skip
LOCAL_ATTENTIONS = ("local_m", "local_p")  # attend within a window, scored by attention.score
# What local_m / local_p score with (nmt.models.attention.registry.scores_alone): those that give one score per
# position for every position at once and are not local themselves (not multihead: a softmax per head).
BUILTIN_SCORES = ("bahdanau", "concat", "dot", "general", "location", "scaled_dot")


def selection_gain(metric: str, record: dict) -> float:
    """A validation record's ``trainer.select_by`` metric with higher = better (``loss`` negated; a record
    without it ranks last): the one rule nmt.trainer.EarlyStopping keeps best.pt by and nmt.sweep ranks jobs by."""
    value = record.get(metric)
    if value is None:
        return -math.inf
    return -value if metric == "loss" else value


def metric_digits(metric: str) -> int:
    """Decimals a ``trainer.select_by`` metric is printed with: 4 for the loss (its gains are small), 2 for BLEU,
    chrF and token accuracy (percentages): the log, the sweep summary and nmt.report agree."""
    return 4 if metric == "loss" else 2


def allowed(key: str) -> tuple[str, ...]:
    """The values a choice key takes (``()`` for a free key). Attention names: the built-in ones, and any
    other attention registered by code imported so far (nmt.models.attention.register)."""
    if key in ("attention.name", "attention.score"):
        registry = sys.modules.get("nmt.models.attention.registry")  # imported by whoever registers one
        more = {k: c for k, c in (registry.ATTENTIONS if registry else {}).items() if k not in BUILTIN_ATTENTIONS}
        if key == "attention.name":
            return tuple(sorted({*BUILTIN_ATTENTIONS, *more}))
        return tuple(sorted({*BUILTIN_SCORES, *(k for k, c in more.items() if registry.scores_alone(c))}))
    return CHOICES.get(key, ())


def _choice_problems(cfg: Any) -> list[str]:
    from omegaconf import OmegaConf

    problems = []
    for key in (*CHOICES, "attention.name"):
        section, _, name = key.rpartition(".")
        node = OmegaConf.select(cfg, section)
        if node is None or name not in node or OmegaConf.is_interpolation(node, name) or node[name] is None:
            continue  # not this command's key, an echo of another (decoder.cell = ${encoder.cell}), or unset
        if problem := bad_choice(key, node[name]):
            problems.append(problem)
    return problems


def bad_choice(key: str, value: Any) -> str | None:
    """The one-line complaint about a value outside a choice key's table, or None when it is allowed."""
    if value in allowed(key):
        return None
    return f"{key}={value!r} is unknown; choose one of {', '.join(allowed(key))}"


_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


def device_problem(name: Any) -> str | None:
    """Why ``device=name`` is refused, or None. nmt runs on the CPU and on CUDA only (autocast, DDP/NCCL, cuDNN
    are its GPU path): ``mps`` or ``xpu`` would fail mid-run, so they are refused here, without importing torch."""
    if _DEVICE.fullmatch(str(name)):
        return None
    return f"device={name!r} is not a device nmt runs on; choose auto, cpu, cuda or cuda:N"


def _device_problems(cfg: Any) -> list[str]:
    problem = device_problem(cfg.device) if "device" in cfg else None
    return [problem] if problem else []


# The numeric trainer keys and the values that mean something: (keys, test, what the message says is expected).
# A negative limit or patience was accepted before and did nonsense (trainer.patience=-1 stopped a run at its
# first validation: "no BLEU gain in -1 validations").
_TRAINER_RANGES: tuple[tuple[tuple[str, ...], Callable[[float], bool], str], ...] = (
    (("max_steps", "max_epochs"), lambda v: v >= 0, "an integer >= 0 (0 = no limit)"),
    (("max_minutes",), lambda v: v >= 0, "minutes >= 0 (0 = no limit)"),
    (
        ("warmup_steps", "plateau_patience", "keep_last", "valid_every", "plot_attention"),
        lambda v: v >= 0,
        "an integer >= 0",
    ),
    (("patience",), lambda v: v >= 0, "an integer >= 0 (0 = never stop early)"),
    (("max_bad_steps",), lambda v: v >= 1, "an integer >= 1 (non-finite steps in a row before the run stops)"),
    (("threads",), lambda v: v >= 0, "an integer >= 0 (0 = torch's default)"),
    (("average_last",), lambda v: v >= 0, "an integer >= 0 (0 = off)"),
    (("accum_steps", "log_every", "val_beam_size"), lambda v: v >= 1, "an integer >= 1"),
    (("weight_decay", "min_lr", "log_seconds"), lambda v: v >= 0, "a number >= 0"),
    (("tune_min_bleu",), lambda v: 0 <= v <= 100, "a BLEU score in [0, 100] (0 = always tune)"),
    (("clip_grad",), lambda v: v >= 0, "a gradient norm >= 0 (0 = no clipping)"),
    (("ema_decay",), lambda v: 0 <= v < 1, "a decay in [0, 1) (0 = off; e.g. 0.999)"),
    (("checkpoint_minutes",), lambda v: v >= 0, "minutes >= 0 (0 = only at validations and the end)"),
    (("restart_minutes",), lambda v: v >= 0, "minutes >= 0 (0 = never)"),
    (("lr", "valid_minutes"), lambda v: v > 0, "a number > 0"),
    (("plateau_factor",), lambda v: 0 < v <= 1, "a factor in (0, 1]"),
    (("label_smoothing",), lambda v: 0 <= v < 1, "a share in [0, 1)"),
    (("teacher_forcing",), lambda v: 0 <= v <= 1, "a probability in [0, 1]"),
)

# The other sections' numeric keys, where a value out of range would otherwise surface only after the
# corpus and sentencepiece (a zero-width RNN, an empty batch budget) or not at all (a negative cap).
# A key whose value is None (emb_dropout: the same as dropout) is not checked.
_PROBABILITY = (lambda v: 0 <= v < 1, "a probability in [0, 1)")
_RNN_RANGES = (
    (("emb_size", "hidden_size", "layers"), lambda v: v >= 1, "an integer >= 1"),
    (("dropout", "emb_dropout"), *_PROBABILITY),
    (("layer_norm_gain",), lambda v: v > 0, "a number > 0"),
)
_SECTION_RANGES: dict[str, tuple[tuple[tuple[str, ...], Callable[[float], bool], str], ...]] = {
    "data": (
        (("max_tokens", "bucket_size"), lambda v: v >= 1, "an integer >= 1"),
        (("max_len",), lambda v: v >= 2, "an integer >= 2 (pairs of max_len pieces or more are left out)"),
        (("shuffle_buffer",), lambda v: v >= 0, "an integer >= 0 (0 or 1 = no shuffling)"),
        (("valid_max_sentences",), lambda v: v >= 0, "an integer >= 0 (0 = all)"),
        (("max_sentences",), lambda v: v >= 0, "an integer >= 0 (0 = no cap)"),
        (("src_word_dropout", "tgt_word_dropout"), *_PROBABILITY),
    ),
    "tokenizer": (
        (("vocab_size", "sample_size"), lambda v: v >= 1, "an integer >= 1"),
        (("character_coverage",), lambda v: 0 < v <= 1, "a share in (0, 1]"),
    ),
    "encoder": _RNN_RANGES,
    "decoder": _RNN_RANGES,
    "attention": (
        (("dim",), lambda v: v >= 0, "an integer >= 0 (0 = the decoder's hidden size)"),
        (("max_positions",), lambda v: v >= 1, "an integer >= 1 (the longest source it can weigh)"),
    ),
}


def _range_problems(cfg: Any, tables: dict[str, tuple] | None = None) -> list[str]:
    """Every numeric key outside the values that mean something: ``tables`` maps a section ("" = the top
    level) to its ranges; by default the training config's (_TRAINER_RANGES, _SECTION_RANGES)."""
    tables = tables if tables is not None else {"trainer": _TRAINER_RANGES, **_SECTION_RANGES}
    return [
        f"{section + '.' if section else ''}{k}={node[k]}: expected {expected}"
        for section, table in tables.items()
        for node in [cfg[section] if section else cfg]
        for keys, ok, expected in table
        for k in keys
        if node[k] is not None and not ok(node[k])
    ]


def columns_problem(key: str, columns: Any) -> list[str]:
    """``data.columns`` / evaluate's ``columns``: unset, or two different column numbers >= 0."""
    if columns is None or (len(columns) == 2 and min(columns) >= 0 and columns[0] != columns[1]):
        return []
    return [f"{key}={list(columns)}: expected two different 0-based column numbers [SOURCE,TARGET], e.g. [1,0]"]


def _allow_changes_problems(allowed: Any) -> list[str]:
    """Each entry is a config key (or a section, ``encoder.``): a misspelt one matched nothing, and the resume
    it was meant to allow was refused again with the same advice."""
    keys = schema_keys(TrainConfig)
    problems = []
    for k in allowed:
        if k in keys or (str(k).endswith(".") and any(x.startswith(k) for x in keys)):
            continue
        close = did_you_mean(str(k).rstrip("."), keys)
        problems.append(
            f"trainer.allow_changes: {k!r} is not a config key"
            + (f" (did you mean {close}?)" if close else " (a dotted key such as trainer.lr, or a section: encoder.)")
        )
    return problems


def _optimizer_problems(t: Any) -> list[str]:
    """An optimizer key set for an optimizer that ignores it would do nothing, silently."""
    problems = []
    if not 0 <= t.momentum < 1:
        problems.append(f"trainer.momentum={t.momentum}: expected a number in [0, 1)")
    elif t.momentum and t.optimizer != "sgd":
        problems.append(f"trainer.momentum={t.momentum} is for trainer.optimizer=sgd (this run: {t.optimizer})")
    if not 0 < t.rho < 1:
        problems.append(f"trainer.rho={t.rho}: expected a number in (0, 1)")
    return problems


def _train_problems(cfg: Any) -> list[str]:
    """Combinations that today fail only after the corpus, sentencepiece and the model are built."""
    problems = []
    a, enc, dec = cfg.attention, cfg.encoder, cfg.decoder
    problems += _range_problems(cfg)
    problems += _finishing_problems(cfg.trainer)
    problems += _schedule_problems(cfg.trainer)
    if len(cfg.trainer.betas) != 2 or not all(0 <= b < 1 for b in cfg.trainer.betas):  # else Adam's ValueError
        problems.append(f"trainer.betas={list(cfg.trainer.betas)}: expected two numbers in [0, 1), e.g. [0.9,0.999]")
    problems += _optimizer_problems(cfg.trainer)
    problems += _allow_changes_problems(cfg.trainer.allow_changes)
    problems += columns_problem("data.columns", cfg.data.columns)
    if cfg.data.num_workers not in (0, 1):
        problems.append(f"data.num_workers={cfg.data.num_workers}: expected 0 or 1 (0 = in the main process)")
    if cfg.trainer.tensorboard and importlib.util.find_spec("tensorboard") is None:  # found, not imported
        problems.append(
            "trainer.tensorboard=true needs the tensorboard package, which is not installed here "
            "(pip install tensorboard; scripts/install.sh installs it)"
        )
    # (not on resume: a run that has its own checkpoint no longer reads it, and may outlive the file)
    init = cfg.trainer.init_from and Path(cfg.trainer.init_from).expanduser()
    if init and init.is_dir() and not cfg.trainer.resume:
        from nmt.rundir import no_checkpoint

        problems.append(f"trainer.init_from={no_checkpoint(init, 'trainer.init_from')}")
    elif init and not cfg.trainer.resume and not init.is_file():
        problems.append(
            f"trainer.init_from={cfg.trainer.init_from}: no such file (expected a checkpoint: "
            "RUN_DIR/checkpoints/best.pt, averaged.pt or last.pt)"
        )
    if cfg.data.source == "hub" and not cfg.data.hub_path:
        problems.append("data.source=hub needs data.hub_path (e.g. Helsinki-NLP/opus-100)")
    if cfg.data.source == "hub" and cfg.data.columns:
        problems.append(
            f"data.columns={list(cfg.data.columns)} names TSV columns; a Hub dataset's sides are chosen by "
            f"data.src_lang and data.tgt_lang ({cfg.data.src_lang} -> {cfg.data.tgt_lang} now)"
        )
    problems += _model_problems(cfg)
    problems += _sampling_problems(cfg.tokenizer)
    score = a.score if a.name in LOCAL_ATTENTIONS else a.name
    if score in ("dot", "scaled_dot") and dec.hidden_size != 2 * enc.hidden_size:
        from nmt.models.attention.scores import dot_size_problem

        label = a.name if score == a.name else f"{a.name} with attention.score={score}"
        problems.append(dot_size_problem(label, dec.hidden_size, 2 * enc.hidden_size))
    if a.name in LOCAL_ATTENTIONS:
        if a.window < 1:
            problems.append(f"attention.window must be >= 1, got {a.window}")
        if a.score not in allowed("attention.score"):
            problems.append(
                f"attention.score={a.score!r} cannot score local attention; choose one of "
                f"{', '.join(allowed('attention.score'))}"
            )
    if a.name == "multihead" and (a.heads < 1 or (a.dim or dec.hidden_size) % a.heads):
        width = a.dim or dec.hidden_size
        problems.append(f"attention.heads={a.heads} must divide the scoring width attention.dim={width}")
    return problems


# Keys that only some settings read: key -> (the key that decides, the values under which it is read). Their
# defaults are always there, so a value is only worth a word when the user set it (unread_settings). (Keys
# whose default means "off", such as trainer.momentum or trainer.decay_every, are refused instead when set where
# nothing reads them: _optimizer_problems, _schedule_problems.)
READ_ONLY_UNDER: dict[str, tuple[str, tuple[Any, ...]]] = {
    "attention.heads": ("attention.name", ("multihead",)),
    "attention.window": ("attention.name", LOCAL_ATTENTIONS),
    "attention.score": ("attention.name", LOCAL_ATTENTIONS),
    "attention.max_positions": ("attention.name", ("location",)),  # and local attention scored so: below
    "attention.dim": ("attention.name", ("bahdanau", "concat", "coverage", "local_p", "multihead")),
    "decoder.input_feeding": ("decoder.order", ("luong",)),
    "encoder.layer_norm_gain": ("encoder.layer_norm", (True,)),
    "decoder.layer_norm_gain": ("decoder.layer_norm", (True,)),
    "trainer.betas": ("trainer.optimizer", ("adam", "adamw")),  # nmt.training.OPTIMIZERS
    "trainer.rho": ("trainer.optimizer", ("adadelta",)),
    "trainer.decay_fraction": ("trainer.scheduler", ("budget",)),  # nmt.training.build_scheduler
    "trainer.decay_factor": ("trainer.scheduler", ("step",)),
    "trainer.plateau_factor": ("trainer.scheduler", ("plateau",)),
    "trainer.plateau_patience": ("trainer.scheduler", ("plateau",)),
}

# ... and the attention keys local_m / local_p hand their inner score (attention.score): key -> the scores that read it.
READ_BY_LOCAL_SCORE: dict[str, tuple[str, ...]] = {
    "attention.max_positions": ("location",),
    "attention.dim": ("bahdanau", "concat"),
}


def _shown(value: Any) -> Any:
    """A value as the command line writes it (true, not True; [0.8, 0.9], not a ListConfig)."""
    from omegaconf import OmegaConf

    if OmegaConf.is_list(value):
        return list(value)
    return str(value).lower() if isinstance(value, bool) else value


def unread_settings(cfg: Any, keys: Sequence[str]) -> list[str]:
    """One line for each of ``keys`` (those the user set: command-line overrides) that this config does not
    read, e.g. ``attention.heads=8 is not read: it is for attention=multihead (this run: bahdanau)``. A
    warning, not an error: a sweep may set it for the jobs that do read it."""
    from omegaconf import OmegaConf

    lines = []
    for key in keys:
        if key not in READ_ONLY_UNDER or (value := OmegaConf.select(cfg, key, default=None)) is None:
            continue
        decider, values = READ_ONLY_UNDER[key]
        now = OmegaConf.select(cfg, decider, default=None)
        scores = READ_BY_LOCAL_SCORE.get(key, ())
        if now is None or now in values or (now in LOCAL_ATTENTIONS and cfg.attention.score in scores):
            continue
        label = "attention" if decider == "attention.name" else decider  # as the command line chooses it
        reader = f"{label}={' or '.join(str(_shown(v)) for v in values)}"
        if scores:
            reader += f", or local attention with attention.score={' or '.join(scores)}"
        lines.append(f"{key}={_shown(value)} is not read: it is for {reader} (this run: {_shown(now)})")
    return lines


def _schedule_problems(t: Any) -> list[str]:
    """trainer.scheduler=budget decays over the run's budget, so it needs one; scheduler=step needs its
    interval, and a floor below its peak; a scheduler's keys do nothing under another one."""
    problems = []
    if t.scheduler == "step" and t.min_lr > t.lr > 0:  # step_decay's floor, min_lr / lr > 1: above the peak rate
        problems.append(
            f"trainer.min_lr={t.min_lr} > trainer.lr={t.lr}: scheduler=step would train at min_lr, above the peak "
            "rate, throughout; lower trainer.min_lr"
        )
    if t.warmup_steps and t.scheduler in ("plateau", "constant"):
        problems.append(
            f"trainer.warmup_steps={t.warmup_steps} is for trainer.scheduler=warmup_decay, budget or step "
            f"(this run: {t.scheduler})"
        )
    if t.scheduler == "step":
        if t.decay_every < 1:
            problems.append(
                f"trainer.scheduler=step multiplies the rate by trainer.decay_factor every trainer.decay_every "
                f"updates from trainer.decay_start on: set trainer.decay_every >= 1 (got {t.decay_every})"
            )
        if t.decay_start < 0:
            problems.append(f"trainer.decay_start={t.decay_start}: expected an update number >= 0")
        if not 0 < t.decay_factor < 1:
            problems.append(f"trainer.decay_factor={t.decay_factor}: expected a multiplier in (0, 1), e.g. 0.5")
        return problems
    if t.decay_every or t.decay_start:
        key = "decay_every" if t.decay_every else "decay_start"
        problems.append(f"trainer.{key}={getattr(t, key)} is for trainer.scheduler=step (this run: {t.scheduler})")
    if t.scheduler != "budget":
        return problems
    if not t.max_minutes and not t.max_steps:
        problems.append(
            "trainer.scheduler=budget decays the learning rate towards the end of the run's budget: "
            "set trainer.max_minutes or trainer.max_steps"
        )
    if not 0.0 < t.decay_fraction <= 1.0:
        problems.append(f"trainer.decay_fraction={t.decay_fraction}: expected a share of the budget in (0, 1]")
    return problems


def _finishing_problems(t: Any) -> list[str]:
    """trainer.average_last and the decoding grid: checked here, so a run never trains for an hour to
    fail at its end."""
    problems = []
    if t.average_last > t.keep_last >= 0:  # negative values are _range_problems'
        problems.append(
            f"trainer.average_last={t.average_last} averages the newest step_N.pt checkpoints: needs "
            f"trainer.keep_last >= {t.average_last} (got {t.keep_last})"
        )
    if t.tune_decoding:
        if not t.tune_beam_sizes or any(k < 1 for k in t.tune_beam_sizes):
            problems.append(f"trainer.tune_beam_sizes={list(t.tune_beam_sizes)}: expected a list of integers >= 1")
        if not t.tune_length_penalties or any(a < 0 for a in t.tune_length_penalties):
            problems.append(
                f"trainer.tune_length_penalties={list(t.tune_length_penalties)}: expected a list of GNMT alphas >= 0"
            )
    if t.shortlist:
        if t.shortlist_frequent < 0:
            problems.append(f"trainer.shortlist_frequent={t.shortlist_frequent}: expected an integer >= 0")
        if t.shortlist_per_source < 1:
            problems.append(
                f"trainer.shortlist_per_source={t.shortlist_per_source}: expected an integer >= 1 "
                "(trainer.shortlist=false stores no shortlist)"
            )
    return problems


def _model_problems(cfg: Any) -> list[str]:
    """Layer norm against the RNN implementation, and three-way tying against the vocabulary and sizes
    (the messages are the model builders' own, imported only when needed: they bring torch)."""
    problems = []
    if cfg.model.rnn_impl == "cudnn" and (cfg.encoder.layer_norm or cfg.decoder.layer_norm):
        from nmt.models.rnn import CUDNN_LAYER_NORM

        problems.append(CUDNN_LAYER_NORM)
    if cfg.model.tie_all_embeddings:
        from nmt.models.build import tie_all_problem

        if not cfg.tokenizer.joint:
            problems.append(
                "model.tie_all_embeddings=true needs tokenizer.joint=true: one vocabulary for source and target"
            )
        if problem := tie_all_problem(cfg.encoder.emb_size, cfg.decoder.emb_size):
            problems.append(problem)
    if cfg.model.lstm_forget_bias is not None and "lstm" not in (cfg.encoder.cell, cfg.decoder.cell):
        problems.append(
            f"model.lstm_forget_bias={cfg.model.lstm_forget_bias} is for LSTM cells, but encoder.cell and "
            f"decoder.cell are {cfg.encoder.cell!r} (set encoder.cell=lstm, or drop the key)"
        )
    return problems


def _sampling_problems(tok: Any) -> list[str]:
    """Subword sampling settings (nmt.data.batching.Sampling); the word dropout rates are in _SECTION_RANGES."""
    problems = []
    if tok.sample_alpha < 0:
        problems.append(f"tokenizer.sample_alpha={tok.sample_alpha}: expected >= 0 (0 = no subword sampling)")
    elif tok.model_type == "bpe" and tok.sample_alpha >= 1:
        problems.append(
            f"tokenizer.sample_alpha={tok.sample_alpha}: with tokenizer.model_type=bpe it is the BPE-dropout "
            "probability, expected in [0, 1)"
        )
    if tok.sample_nbest != -1 and not 2 <= tok.sample_nbest <= 512:
        problems.append(
            f"tokenizer.sample_nbest={tok.sample_nbest}: expected -1 (all segmentations) or 2 to 512 "
            "(the most sentencepiece's n-best search lists)"
        )
    elif tok.sample_nbest != -1 and (tok.model_type != "unigram" or tok.sample_alpha <= 0):
        problems.append(  # BPE-dropout has no n-best list, and without sampling nothing is drawn from one
            f"tokenizer.sample_nbest={tok.sample_nbest} is for unigram subword sampling, tokenizer.sample_alpha > 0 "
            f"(this run: model_type={tok.model_type}, sample_alpha={tok.sample_alpha})"
        )
    return problems


def _decode_problems(cfg: Any) -> list[str]:
    problems = []
    if cfg.get("workers", 0) < 0:
        problems.append(
            f"workers={cfg.workers}: expected an integer >= 0 (0 = one process per CPU thread, 1 = this process)"
        )
    if cfg.beam_size is not None and cfg.beam_size < 1:
        problems.append(f"beam_size={cfg.beam_size}: expected an integer >= 1 (1 = greedy)")
    if cfg.n_best < 1 or (cfg.beam_size is not None and cfg.n_best > max(cfg.beam_size, 1) and not cfg.sample):
        problems.append(f"n_best={cfg.n_best} needs 1 <= n_best <= beam_size (got beam_size={cfg.beam_size})")
    if cfg.get("batch_size", 1) < 1:
        problems.append(f"batch_size={cfg.batch_size}: expected an integer >= 1")
    problems += _sampling_decode_problems(cfg)
    problems += _range_problems(cfg, {"": _DECODE_RANGES})  # the search's numbers: nonsense otherwise, or a traceback
    if cfg.min_len_ratio > cfg.max_len_ratio:
        problems.append(
            f"min_len_ratio={cfg.min_len_ratio} > max_len_ratio={cfg.max_len_ratio}: a long line's shortest "
            "allowed output would be longer than its longest"
        )
    return problems


def _sampling_decode_problems(cfg: Any) -> list[str]:
    """sample=true draws one output per line; its keys mean nothing without it."""
    if not cfg.sample:
        given = [f"{k}={cfg[k]}" for k, off in _SAMPLE_OFF.items() if cfg[k] != off]
        return [f"{', '.join(given)}: only used with sample=true (sampling instead of beam search)"] if given else []
    problems = []
    if cfg.beam_size not in (None, 1):
        problems.append(
            f"sample=true draws each output on its own: leave beam_size unset or 1 (got beam_size={cfg.beam_size}; "
            "n_best=N draws N outputs per line)"
        )
    return problems  # their ranges: _DECODE_RANGES


_SAMPLE_OFF = {"sample_topk": 0, "sample_topp": 1.0, "temperature": 1.0, "sample_seed": 0}


_DECODE_RANGES: tuple[tuple[tuple[str, ...], Callable[[float], bool], str], ...] = (
    (("threads",), lambda v: v >= 0, "an integer >= 0 (0 = torch's default)"),
    (("max_input_len",), lambda v: v >= 1, "an integer >= 1"),
    (("no_repeat_ngram",), lambda v: v >= 0, "an integer >= 0 (0 = off)"),
    (("coverage_penalty",), lambda v: v >= 0, "GNMT beta >= 0 (0 = off)"),
    (("length_penalty",), lambda v: v >= 0, "GNMT alpha >= 0 (0 = the raw log-probability)"),
    (("max_len_ratio", "min_len_ratio"), lambda v: v >= 0, "a number >= 0"),
    (("sample_topk",), lambda v: v >= 0, "an integer >= 0 (0 = all pieces)"),
    (("sample_topp",), lambda v: 0 < v <= 1, "a probability in (0, 1] (1 = all pieces)"),
    (("temperature",), lambda v: v > 0, "a number > 0 (1 = the model's distribution)"),
)


def _average_problems(cfg: Any) -> list[str]:
    problems = []
    if not cfg.checkpoints and not cfg.run_dir:
        problems.append("nothing to average: give checkpoints=[A,B,...] or run_dir=DIR")
    elif cfg.checkpoints and cfg.run_dir:
        problems.append("give checkpoints=[A,B,...] or run_dir=DIR (with last=N), not both")
    if cfg.run_dir and cfg.last < 1:
        problems.append(f"last={cfg.last}: expected an integer >= 1")
    return problems


# bootstrap_samples=0 printed "p = 1.0000 (not significant)" from no resamples at all.
_EVALUATE_RANGES = ((("bootstrap_samples",), lambda v: v >= 1, "an integer >= 1 (sacrebleu uses 1000)"),)
_SERVE_RANGES = (
    # The socket layer would take a port modulo 65536: port=80000 served on 14464.
    (("port",), lambda v: 0 <= v <= 65535, "a TCP port, 0 to 65535 (0 = a free one)"),
    (("http_threads",), lambda v: v >= 1, "an integer >= 1 (the server's worker threads)"),
    (("max_chars",), lambda v: v >= 1, "an integer >= 1 (the longest request text)"),
)


def _one_best_problem(cfg: Any, command: str) -> list[str]:
    """n_best=N asks for lists only nmt.translate prints; here it would widen the beam and change the score."""
    if cfg.n_best == 1:
        return []
    return [f"n_best={cfg.n_best}: nmt.{command} uses one output per line (nmt.translate prints n-best lists)"]


def _evaluate_problems(cfg: Any) -> list[str]:
    problems = _decode_problems(cfg) + _range_problems(cfg, {"": _EVALUATE_RANGES})
    return problems + _one_best_problem(cfg, "evaluate") + columns_problem("columns", cfg.columns)


def _serve_problems(cfg: Any) -> list[str]:
    return _decode_problems(cfg) + _range_problems(cfg, {"": _SERVE_RANGES}) + _one_best_problem(cfg, "serve")


_COMMAND_PROBLEMS = {
    "train": _train_problems,
    "translate": _decode_problems,
    "evaluate": _evaluate_problems,
    "serve": _serve_problems,
    "average": _average_problems,
}


def validate(cfg: Any, command: str) -> None:
    """Check a composed config in full, in one pass, before any work: every choice key against its allowed
    values, the device, and the command's cheap structural rules. Raises one ConfigError, one line per
    bad key (each naming the key and what it must be)."""
    problems = _choice_problems(cfg) + _device_problems(cfg) + _COMMAND_PROBLEMS[command](cfg)
    if problems:
        raise ConfigError("\n".join(problems))


def schema_keys(schema: type, prefix: str = "") -> list[str]:
    """Every dotted key of a schema, sections included (``trainer``, ``trainer.max_steps``, ...)."""
    keys = []
    for f in dataclasses.fields(schema):
        keys.append(prefix + f.name)
        if dataclasses.is_dataclass(f.default_factory):
            keys += schema_keys(f.default_factory, f"{prefix}{f.name}.")  # type: ignore[arg-type]
    return keys


def expected_value(schema: type, key: str) -> str | None:
    """What a value of ``key`` must look like on a command line, from the schema's type and default:
    ``a list in brackets, e.g. trainer.betas=[0.9,0.999]``, ``true or false``, ``a whole number`` ..."""
    import types
    import typing

    cls, (*sections, name) = schema, key.split(".")
    try:
        for section in sections:
            cls = {f.name: f for f in dataclasses.fields(cls)}[section].default_factory
        hint = typing.get_type_hints(cls)[name]
        default = next(f for f in dataclasses.fields(cls) if f.name == name)
    except (KeyError, TypeError, StopIteration):
        return None
    value = default.default_factory() if default.default_factory is not dataclasses.MISSING else default.default
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union else ()
    nullable = type(None) in args
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    origin = typing.get_origin(base) or base
    if origin in (list, tuple):
        shown = "[" + ",".join(str(x) for x in value) + "]" if value else "[...]"
        kind = f"a list in brackets, e.g. {key}={shown}"
    else:
        kind = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}.get(origin)
    if kind is None:
        return None
    return kind + (" (or null: unset)" if nullable else "")


def did_you_mean(word: str, candidates: list[str]) -> str | None:
    """The closest candidate (a full dotted key when ``word`` is only its last part), or None."""
    by_leaf = [c for c in candidates if c.rpartition(".")[2] == word]
    close = by_leaf or difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return close[0] if close else None


@cache
def _comments(schema: type) -> dict[str, str]:
    """The comments written above a field and at the end of its line, in this file, joined."""
    out: dict[str, str] = {}
    above: list[str] = []
    for line in inspect.getsource(schema).splitlines()[1:]:
        text = line.strip()
        if text.startswith("#"):
            above.append(text.lstrip("# "))
        elif ":" in text and text.split(":")[0].isidentifier() and not text.startswith(('"""', "def ")):
            code, _, end = text.partition("  # ")
            out[code.split(":")[0]] = " ".join([*above, end]).strip()
            above = []
        else:
            above = []
    return out


def field_help(schema: type, prefix: str = "") -> dict[str, str]:
    """Each dotted key's meaning, read from the schema's own comments (those above a field and at the
    end of its line), so ``--help`` says what this file says without a second copy to keep in step."""
    docs: dict[str, str] = {}
    for cls in reversed([c for c in schema.__mro__ if dataclasses.is_dataclass(c)]):
        docs.update({prefix + k: v for k, v in _comments(cls).items()})
    for f in dataclasses.fields(schema):
        if dataclasses.is_dataclass(f.default_factory):
            docs.update(field_help(f.default_factory, f"{prefix}{f.name}."))  # type: ignore[arg-type]
    return docs
