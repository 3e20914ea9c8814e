"""``python -m nmt.train``: config → data, tokenizer, model, trainer → a trained checkpoint.

Examples::

    python -m nmt.train                                  # default corpus, Bahdanau attention
    python -m nmt.train attention=general decoder=luong  # swap parts
    python -m nmt.train -m attention=dot,general,concat,bahdanau   # sweep
    python -m nmt.train hydra.run.dir=outputs/run1 trainer.resume=true
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from nmt.config import register_configs, to_plain
from nmt.data import build_specs, build_tokenizer, prepare_corpus
from nmt.data.batching import BatchStream, worker_init
from nmt.data.corpus import load_pairs
from nmt.data.tokenizer import Tokenizer
from nmt.errors import ConfigError, NmtError
from nmt.logger import RunLogger
from nmt.models.build import build_model, count_parameters
from nmt.trainer import Trainer, config_changes, find_checkpoint

log = logging.getLogger("nmt.train")

register_configs()


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={name}: CUDA is not available on this machine; use device=cpu or auto")
    return dev


def seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    torch.manual_seed(seed)


def run(cfg: DictConfig, run_dir: Path) -> dict:
    """Train with a resolved config; returns the last validation record."""
    plain = to_plain(cfg)  # resolves interpolations and fails on missing values before any work
    run_dir.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg.device)
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    seed_everything(cfg.seed)
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
    else:
        tokenizer = build_tokenizer(cfg.tokenizer, specs["train"])
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
    logger = RunLogger(run_dir, plain, cfg.wandb, cfg.trainer.resume)
    trainer = Trainer(model, tokenizer, cfg, plain, run_dir, device, valid, logger)
    if resume_from is not None:
        trainer.load_state(*resume_from)
    p = trainer.progress
    stream = BatchStream(
        specs["train"],
        tokenizer.state_dict(),
        cfg.data.max_len,
        cfg.data.max_tokens,
        cfg.data.bucket_size,
        cfg.data.shuffle_buffer,
        cfg.seed,
        start_epoch=p.epoch,
        skip_batches=p.batch_index + 1,
    )
    workers = cfg.data.num_workers
    loader = torch.utils.data.DataLoader(
        stream,
        batch_size=None,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        prefetch_factor=8 if workers else None,
        # Its own generator: making the iterator would otherwise draw a seed from the global RNG
        # after a resume restored it, and the resumed run's dropout masks would drift.
        generator=torch.Generator().manual_seed(cfg.seed),
        worker_init_fn=worker_init,
    )
    try:
        result = trainer.fit(iter(loader))
    finally:
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


if __name__ == "__main__":
    main()
