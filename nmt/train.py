"""``python -m nmt.train``: config → data, tokenizer, model, trainer → a trained checkpoint.

Examples::

    python -m nmt.train                                  # default corpus, Bahdanau attention
    python -m nmt.train attention=general decoder=luong  # swap parts
    python -m nmt.train -m attention=dot,general,concat,bahdanau   # sweep
    python -m nmt.train hydra.run.dir=outputs/run1 trainer.resume=true
    torchrun --standalone --nproc_per_node 4 -m nmt.train hydra.run.dir=outputs/ddp   # data-parallel
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from nmt.config import register_configs, to_plain
from nmt.data import build_specs, build_tokenizer, prepare_corpus
from nmt.data.batching import Batch, BatchStream, worker_context, worker_init
from nmt.data.corpus import CorpusSpec, load_pairs
from nmt.data.tokenizer import Tokenizer
from nmt.distributed import Dist, init_distributed, shutdown
from nmt.errors import ConfigError, NmtError
from nmt.logger import RunLogger
from nmt.models.build import build_model, count_parameters
from nmt.runtime import resolve_device
from nmt.trainer import Trainer, config_changes, find_checkpoint

log = logging.getLogger("nmt.train")

register_configs()


def seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    torch.manual_seed(seed)


def quiet_other_ranks(d: Dist) -> None:
    """Only rank 0 writes the run's log file; the others keep warnings on stderr, tagged."""
    if d.is_main:
        return
    root = logging.getLogger()
    for h in list(root.handlers):
        if isinstance(h, logging.FileHandler):
            root.removeHandler(h)
        else:
            h.setFormatter(logging.Formatter(f"[rank {d.rank}][%(name)s][%(levelname)s] - %(message)s"))
    root.setLevel(logging.WARNING)


def build_loader(
    cfg: DictConfig,
    train: CorpusSpec,
    tokenizer: Tokenizer,
    device: torch.device,
    shards: Sequence[int] = (0,),
    num_shards: int = 1,
    starts: Sequence[tuple[int, int]] | None = None,
) -> Iterator[Batch]:
    """The training batches: this rank's shards of the stream, built in a DataLoader worker."""
    d = cfg.data
    stream = BatchStream(
        train,
        tokenizer.state_dict(),
        d.max_len,
        d.max_tokens,
        d.bucket_size,
        d.shuffle_buffer,
        cfg.seed,
        shards=shards,
        num_shards=num_shards,
        starts=starts,
    )
    loader = torch.utils.data.DataLoader(
        stream,
        batch_size=None,
        num_workers=d.num_workers,
        pin_memory=device.type == "cuda",
        prefetch_factor=8 if d.num_workers else None,
        # Its own generator: making the iterator would otherwise draw a seed from the global RNG
        # after a resume restored it, and the resumed run's dropout masks would drift.
        generator=torch.Generator().manual_seed(cfg.seed),
        worker_init_fn=worker_init,
        # Explicit: inside a joblib (loky) sweep job the default context is loky's, which cannot
        # start a DataLoader worker.
        multiprocessing_context=worker_context() if d.num_workers else None,
    )
    return iter(loader)


def run(cfg: DictConfig, run_dir: Path) -> dict:
    """Train with a resolved config; returns the last validation record."""
    plain = to_plain(cfg)  # resolves interpolations and fails on missing values before any work
    d, device = init_distributed(resolve_device(cfg.device))
    try:
        return _run(cfg, plain, Path(d.broadcast(str(run_dir))), d, device)  # rank 0's run dir for all
    finally:
        shutdown(d)


def _run(cfg: DictConfig, plain: dict, run_dir: Path, d: Dist, device: torch.device) -> dict:
    quiet_other_ranks(d)
    if cfg.data.num_workers > 1:
        raise ConfigError(
            f"data.num_workers={cfg.data.num_workers}: expected 0 or 1 (the batch stream runs in one worker "
            "process per rank, 0 = in the main process; scripts/benchmark.py measures its data wait)"
        )
    if d.active:
        log.info(
            "distributed: world size %d (%s backend), %d data shards, global batch %d x %d tokens",
            d.world_size,
            "nccl" if device.type == "cuda" else "gloo",
            d.world_size * cfg.trainer.accum_steps,
            d.world_size * cfg.trainer.accum_steps,
            cfg.data.max_tokens,
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    seed_everything(cfg.seed + d.rank)  # own dropout masks per rank
    if d.is_main:  # fetch once (the other ranks find the files, on a shared filesystem)
        prepare_corpus(cfg.data)
    d.barrier()
    if not d.is_main:
        prepare_corpus(cfg.data)
    specs = build_specs(cfg.data)
    resume_from = find_checkpoint(run_dir / "checkpoints", device) if cfg.trainer.resume else None
    if cfg.trainer.resume and resume_from is None:
        log.warning("trainer.resume=true but %s has no usable checkpoint: starting at step 0", run_dir / "checkpoints")
    if resume_from is not None:
        changed = config_changes(resume_from[1]["config"], plain, list(cfg.trainer.allow_changes))
        if changed:
            raise ConfigError(
                f"resuming {resume_from[0]} with a different config ({'; '.join(changed)}); "
                "name intended changes in trainer.allow_changes=[KEY,...] or use a new hydra.run.dir"
            )
        tokenizer = Tokenizer.from_state_dict(resume_from[1]["tokenizer"])  # the run's own pieces
    else:  # trained once, on rank 0; every rank gets the same pieces
        state = build_tokenizer(cfg.tokenizer, specs["train"]).state_dict() if d.is_main else None
        tokenizer = Tokenizer.from_state_dict(d.broadcast(state))
    model = build_model(cfg.encoder, cfg.attention, cfg.decoder, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size).to(
        device
    )
    log.info(
        "model: %s encoder, %s attention, %s-order decoder, %s parameters, device %s",
        cfg.encoder.cell,
        cfg.attention.name,
        cfg.decoder.order,
        f"{count_parameters(model):,}",
        device,
    )
    valid = load_pairs(specs["valid"])
    logger = RunLogger(run_dir, plain, cfg.wandb, cfg.trainer.resume) if d.is_main else None
    trainer = Trainer(model, tokenizer, cfg, plain, run_dir, device, valid, logger, d)
    if resume_from is not None:
        trainer.load_state(*resume_from)
    p = trainer.progress
    loader = build_loader(
        cfg, specs["train"], tokenizer, device, trainer.shards, trainer.num_shards, trainer.data_starts()
    )
    try:
        result = trainer.fit(loader)
    finally:
        if logger is not None:
            logger.finish()
    log.info("done: best valid BLEU %.2f; checkpoints in %s", p.best_bleu, trainer.ckpt_dir)
    return result


@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
def main(cfg: DictConfig) -> float:
    try:
        result = run(cfg, Path(HydraConfig.get().runtime.output_dir))
    except NmtError as e:
        log.error("%s", e)
        sys.exit(2)
    return float(result.get("bleu", 0.0))  # the sweep objective, for optimiser plugins


def cli() -> None:
    if int(os.environ.get("RANK", "0")) > 0:
        sys.argv.append("hydra.output_subdir=null")  # rank 0 alone writes the run's .hydra/ config copies
    main()


if __name__ == "__main__":
    cli()
