"""``onmt_train`` that stops when told and saves its checkpoint (for ``scripts/benchmark.py --compare``).

OpenNMT-py has no way to stop on demand and writes no checkpoint when interrupted. Like
../shared/peers/onmt_timed_train.py (which stops at a wall-clock deadline), this wrapper hands
``Trainer.train`` a training iterator that stops yielding batches once asked: SIGUSR1 sets a flag,
the update in progress finishes, the trainer leaves its loop normally and saves its final
checkpoint (``model_step_N.pt``). Without the signal it is plain ``onmt_train``.

Usage: onmt_train_until_signal.py -config cfg.yaml [other onmt_train args]
(Everything sits under the __main__ guard: OpenNMT's data-loader workers are started with the
"spawn" method, which re-imports this file in each worker.)
"""

import signal


def run():
    asked = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: asked.append(signum))
    import onmt.trainer

    orig_train = onmt.trainer.Trainer.train

    def train_until_signal(self, train_iter, *args, **kwargs):
        def until_signal():
            for item in train_iter:
                if asked:
                    print("[until_signal] SIGUSR1: leaving the training loop to save", flush=True)
                    return
                yield item

        return orig_train(self, until_signal(), *args, **kwargs)

    onmt.trainer.Trainer.train = train_until_signal
    from onmt.bin.train import main

    main()


if __name__ == "__main__":
    run()
