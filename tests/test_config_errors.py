"""Mistakes in config fail before any work, in a line or two that name the key."""

from __future__ import annotations

import pytest

from helpers import TINY, run_module


@pytest.mark.parametrize(
    "override,expect",
    [
        ("attention=bahdnau", ["attention/bahdnau", "bahdanau", "general"]),
        ("trainer.max_step=5", ["max_step"]),
        ("encoder.cell=rnn", ["encoder.cell='rnn'", "gru", "lstm"]),
        ("attention=dot", ["attention=dot needs decoder.hidden_size (64) == 2 * encoder.hidden_size (48)"]),
        ("trainer.scheduler=budget", ["trainer.scheduler=budget", "set trainer.max_minutes or trainer.max_steps"]),
        ("trainer.patience=-1", ["trainer.patience=-1: expected an integer >= 0"]),
    ],
)
def test_config_mistakes_fail_clearly(tmp_path, sample_dir, override, expect):
    proc = run_module(
        "nmt.train",
        [f"data.dir={sample_dir}", *TINY, "encoder.hidden_size=24", override, f"hydra.run.dir={tmp_path}/run"],
        tmp_path / "cache",
        check=False,
    )
    assert proc.returncode != 0
    for e in expect:
        assert e in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_config_mistakes_are_all_found_before_the_run_directory(tmp_path, sample_dir):
    """Values that once failed one at a time, deep inside (after the corpus and sentencepiece), now
    fail together before Hydra makes the run directory."""
    bad = ["attention=dot", "trainer.optimizer=rmsprop", "wandb.mode=loud", "data.num_workers=4"]
    bad += ["trainer.accum_steps=0"]
    proc = run_module(
        "nmt.train",
        [f"data.dir={sample_dir}", *TINY, "encoder.hidden_size=24", *bad, f"hydra.run.dir={tmp_path}/run"],
        tmp_path / "cache",
        check=False,
    )
    assert proc.returncode == 2
    for e in [
        "attention=dot needs",
        "trainer.optimizer='rmsprop'",
        "wandb.mode='loud'",
        "data.num_workers=4",
        "trainer.accum_steps=0",
    ]:
        assert e in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == len(bad)
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


def test_missing_corpus_says_what_to_run(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "notes.txt").write_text("not a corpus")
    proc = run_module(
        "nmt.train",
        [f"data.dir={tmp_path}/corpus", *TINY, f"hydra.run.dir={tmp_path}/run"],
        tmp_path / "cache",
        check=False,
    )
    assert proc.returncode == 2
    assert "train.tsv: corpus file not found" in proc.stderr and "nmt.data.fetch" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "override,expect",
    [
        ("trainer.max_minutes=-5", "trainer.max_minutes=-5.0: expected minutes >= 0"),
        ("trainer.keep_last=-1", "trainer.keep_last=-1: expected an integer >= 0"),
        ("trainer.lr=0", "trainer.lr=0.0: expected a number > 0"),
        ("trainer.label_smoothing=1", "trainer.label_smoothing=1.0: expected a share in [0, 1)"),
        ("trainer.teacher_forcing=1.5", "trainer.teacher_forcing=1.5: expected a probability in [0, 1]"),
        ("trainer.log_every=0", "trainer.log_every=0: expected an integer >= 1"),
        ("data.max_tokens=0", "data.max_tokens=0: expected an integer >= 1"),
        ("data.valid_max_sentences=-5", "data.valid_max_sentences=-5: expected an integer >= 0"),
        ("data.max_sentences=-1", "data.max_sentences=-1: expected an integer >= 0 (0 = no cap)"),
        ("encoder.hidden_size=0", "encoder.hidden_size=0: expected an integer >= 1"),
        ("decoder.layers=0", "decoder.layers=0: expected an integer >= 1"),
        ("tokenizer.vocab_size=-8000", "tokenizer.vocab_size=-8000: expected an integer >= 1"),
        ("tokenizer.character_coverage=1.5", "tokenizer.character_coverage=1.5: expected a share in (0, 1]"),
        ("attention.dim=-1", "attention.dim=-1: expected an integer >= 0"),
        ("trainer.threads=-1", "trainer.threads=-1: expected an integer >= 0 (0 = torch's default)"),
        ("trainer.betas=[1.5,0.9]", "trainer.betas=[1.5, 0.9]: expected two numbers in [0, 1), e.g. [0.9,0.999]"),
        ("data.columns=[1,1]", "data.columns=[1, 1]: expected two different 0-based column numbers [SOURCE,TARGET]"),
        ("data.columns=[-1,0]", "data.columns=[-1, 0]: expected two different 0-based column numbers"),
        ("data.columns=[2]", "data.columns=[2]: expected two different 0-based column numbers"),
        # below: each once ran into the work and failed there, or not at all (the test's docstring below)
        ("data.max_len=1", "data.max_len=1: expected an integer >= 2 (pairs of max_len pieces or more are left out)"),
        ("trainer.max_bad_steps=-1", "trainer.max_bad_steps=-1: expected an integer >= 1"),
        ("attention=location attention.max_positions=0", "attention.max_positions=0: expected an integer >= 1"),
        ("trainer.warmup_steps=100", "trainer.warmup_steps=100 is for trainer.scheduler=warmup_decay, budget or"),
        (
            "trainer.scheduler=step trainer.decay_every=10 trainer.lr=5e-6",
            "trainer.min_lr=1e-05 > trainer.lr=5e-06: scheduler=step would train at min_lr, above the peak rate",
        ),
        ("trainer.allow_changes=[trainer.lrr]", "trainer.allow_changes: 'trainer.lrr' is not a config key (did you"),
        ("trainer.allow_changes=[lr]", "trainer.allow_changes: 'lr' is not a config key (did you mean trainer.lr?)"),
        ("tokenizer.sample_nbest=64", "tokenizer.sample_nbest=64 is for unigram subword sampling, tokenizer.sample_"),
        ("trainer.tune_length_penalties=[-0.5,1]", "trainer.tune_length_penalties=[-0.5, 1.0]: expected a list of"),
        (
            "attention=scaled_dot decoder.hidden_size=64",
            "attention=scaled_dot needs decoder.hidden_size (64) == 2 * encoder.hidden_size (512)",
        ),
        (
            "attention=local_p attention.score=dot decoder.hidden_size=64",
            "attention=local_p with attention.score=dot needs decoder.hidden_size (64) == 2 * encoder.hidden_size",
        ),
        (
            "attention=local_m attention.score=multihead",
            "attention.score='multihead' cannot score local attention; choose one of bahdanau, concat, dot, general,",
        ),
    ],
)
def test_numeric_keys_out_of_range_are_refused(override, expect):
    """data.max_len=1 kept no pair, and the endless stream re-read the corpus for ever before its first batch;
    max_bad_steps=-1 stopped at step 0 with advice to lower the learning rate; max_positions=0 made every
    location score -inf (NaN weights); warmup_steps under plateau was silently ignored; scheduler=step with
    its floor above the peak trained at the floor; a misspelt allow_changes entry refused the resume it was
    meant to allow with the same advice; a negative length penalty made stop=exact's bound wrong; scaled_dot
    and local attention scored by dot failed at model build, after the corpus and sentencepiece; local attention
    scored by multihead (a softmax per head, no one score) raised NotImplementedError at the first batch.
    Checked in the preflight, one line per key (the subprocess case above shows it reaches the user so)."""
    from nmt.cli import COMMANDS, Stop, preflight

    with pytest.raises(Stop) as e:
        preflight(COMMANDS["train"], override.split())
    assert len(e.value.lines) == 1 and e.value.lines[0].startswith(expect), e.value.lines


def test_tsv_columns_on_a_hub_dataset_are_refused_not_ignored():
    from nmt.cli import COMMANDS, Stop, preflight

    with pytest.raises(Stop) as e:
        preflight(COMMANDS["train"], ["data=opus100_en_es", "data.columns=[1,0]"])
    expect = "data.columns=[1, 0] names TSV columns; a Hub dataset's sides are chosen by data.src_lang and "
    assert e.value.lines == [expect + "data.tgt_lang (en -> es now)"], e.value.lines


@pytest.mark.parametrize(
    "command,overrides,expect",
    [
        ("translate", ["threads=-1"], "threads=-1: expected an integer >= 0 (0 = torch's default)"),
        ("evaluate", ["no_repeat_ngram=-1"], "no_repeat_ngram=-1: expected an integer >= 0 (0 = off)"),
        ("serve", ["coverage_penalty=-0.5"], "coverage_penalty=-0.5: expected GNMT beta >= 0 (0 = off)"),
        ("translate", ["max_input_len=0"], "max_input_len=0: expected an integer >= 1"),
        ("evaluate", ["bootstrap_samples=0"], "bootstrap_samples=0: expected an integer >= 1 (sacrebleu uses 1000)"),
        ("translate", ["min_len_ratio=5", "max_len_ratio=1"], "min_len_ratio=5.0 > max_len_ratio=1.0: a long line's"),
        ("evaluate", ["columns=[0,1,2]"], "columns=[0, 1, 2]: expected two different 0-based column numbers"),
        ("translate", ["length_penalty=-0.5"], "length_penalty=-0.5: expected GNMT alpha >= 0"),
        ("evaluate", ["n_best=3", "beam_size=5"], "n_best=3: nmt.evaluate uses one output per line (nmt.translate"),
        ("serve", ["n_best=2"], "n_best=2: nmt.serve uses one output per line"),
    ],
)
def test_search_numbers_out_of_range_are_refused(command, overrides, expect):
    """threads=-1 ended in torch's traceback after the model loaded; the others decoded nonsense without a word
    (min_len_ratio=5 max_len_ratio=1 forced outputs past their own cap)."""
    from nmt.cli import COMMANDS, Stop, preflight

    with pytest.raises(Stop) as e:
        given = ["checkpoint=x.pt"] + ([] if command == "serve" else ["input=x.tsv"])
        preflight(COMMANDS[command], [*given, *overrides])
    assert len(e.value.lines) == 1 and e.value.lines[0].startswith(expect), e.value.lines


def test_the_edges_that_mean_off_are_accepted():
    from nmt.cli import COMMANDS, preflight

    zeros = ["max_steps", "max_minutes", "patience", "keep_last", "clip_grad", "checkpoint_minutes", "label_smoothing"]
    preflight(COMMANDS["train"], [f"trainer.{k}=0" for k in zeros] + ["trainer.teacher_forcing=1"])
    preflight(COMMANDS["train"], ["data.shuffle_buffer=0", "data.valid_max_sentences=0", "attention.dim=0"])
    preflight(COMMANDS["train"], ["data.max_len=2", "trainer.allow_changes=[trainer.lr,encoder.]"])
    preflight(COMMANDS["train"], ["trainer.scheduler=warmup_decay", "trainer.warmup_steps=100", "trainer.lr=5e-6"])
    preflight(COMMANDS["train"], ["trainer.lr=1e-12"])  # plateau: the floor above the rate only means no halving
    preflight(COMMANDS["translate"], ["checkpoint=x.pt", "length_penalty=0", "n_best=3", "beam_size=5"])


def test_average_takes_its_checkpoints_from_a_list_or_a_run_not_both():
    """run_dir=DIR was silently ignored beside checkpoints=[...]."""
    from nmt.cli import COMMANDS, Stop, preflight

    with pytest.raises(Stop) as e:
        preflight(COMMANDS["average"], ["output=x.pt", "checkpoints=[a.pt,b.pt]", "run_dir=runs/x"])
    assert e.value.lines == ["give checkpoints=[A,B,...] or run_dir=DIR (with last=N), not both"], e.value.lines


def test_a_corpus_folder_needs_train_and_valid_but_not_test(tmp_path):
    """Training reads train.tsv and valid.tsv only; a user's folder without a test split trains (test.tsv is
    for nmt.evaluate). A missing valid.tsv is named."""
    from omegaconf import OmegaConf

    from nmt.config import DataConfig
    from nmt.data import prepare_corpus
    from nmt.errors import NmtError

    data = OmegaConf.structured(DataConfig(dir=str(tmp_path)))
    (tmp_path / "train.tsv").write_text("a\tb\n", encoding="utf-8")
    with pytest.raises(NmtError, match=r"valid\.tsv: corpus file not found .*must hold train\.tsv and valid\.tsv"):
        prepare_corpus(data)
    (tmp_path / "valid.tsv").write_text("a\tb\n", encoding="utf-8")
    prepare_corpus(data)  # no test.tsv: fine


def test_an_unreachable_hub_dataset_is_one_line(tmp_path):
    """data=opus100_en_es without a network (the tests run with HF_HUB_OFFLINE=1): one line naming the dataset
    and the way out, not datasets' ConnectionError traceback; no run folder left behind."""
    proc = run_module(
        "nmt.train", ["data=opus100_en_es", f"hydra.run.dir={tmp_path}/run"], tmp_path / "cache", check=False
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "data.hub_path=Helsinki-NLP/opus-100 (data.hub_name=en-es, split train): Couldn't reach" in proc.stderr
    assert "data.source=tsv data.dir=DIR" in proc.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "command,override,expect",
    [
        # a key of another section: the same leaf there, not the nearest string in this one
        ("train", "trainer.hidden_size=3", "unknown key 'trainer.hidden_size' — did you mean encoder.hidden_size?"),
        # no near miss inside an existing section: where to read that section's keys (not "did you mean trainer?")
        ("train", "trainer.foo=1", "unknown key 'trainer.foo' (python -m nmt.train --cfg job --package trainer "),
        ("train", "foo.bar=1", "unknown key 'foo.bar' (python -m nmt.train --cfg job prints every key"),
        # a command with a handful of keys names them all
        (
            "average",
            "inputs=[a.pt]",
            "unknown key 'inputs' (the keys of nmt.average: output, checkpoints, run_dir, last)",
        ),
        # a whole section given a plain value: Hydra's "str is not a subclass of TrainerConfig" before
        ("train", "trainer=x", "trainer is a section, not a key: set its keys one by one (trainer.max_steps, "),
    ],
)
def test_an_unknown_key_without_a_near_miss_says_where_the_keys_are(command, override, expect):
    from nmt.cli import COMMANDS, Stop, preflight

    with pytest.raises(Stop) as e:
        preflight(COMMANDS[command], ["output=x.pt", override] if command == "average" else [override])
    assert len(e.value.lines) == 1 and e.value.lines[0].startswith(expect), e.value.lines


def test_a_section_may_still_be_set_as_a_whole_dict():
    from nmt.cli import COMMANDS, preflight

    cfg = preflight(COMMANDS["train"], ["trainer={lr: 2e-3, max_steps: 7}"])
    assert cfg.trainer.lr == 2e-3 and cfg.trainer.max_steps == 7


def test_init_from_a_missing_file_is_refused_unless_resuming(tmp_path):
    """A fresh run must find the checkpoint it starts from; a resumed one continues from its own and no longer
    reads it (the file may have been moved since)."""
    from nmt.cli import COMMANDS, Stop, preflight

    with pytest.raises(Stop) as e:
        preflight(COMMANDS["train"], [f"trainer.init_from={tmp_path}/gone.pt"])
    assert e.value.lines == [
        f"trainer.init_from={tmp_path}/gone.pt: no such file (expected a checkpoint: "
        "RUN_DIR/checkpoints/best.pt, averaged.pt or last.pt)"
    ]
    preflight(COMMANDS["train"], [f"trainer.init_from={tmp_path}/gone.pt", "trainer.resume=true"])
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "best.pt").write_bytes(b"")
    with pytest.raises(Stop) as e:  # the run's folder: its checkpoints named
        preflight(COMMANDS["train"], [f"trainer.init_from={tmp_path}/run"])
    assert e.value.lines == [
        f"trainer.init_from={tmp_path}/run: a folder, not a checkpoint file; give one of its checkpoints (best.pt), "
        f"e.g. trainer.init_from={tmp_path}/run/checkpoints/best.pt"
    ]


@pytest.mark.parametrize(
    "overrides,expect",
    [
        (["sample=true", "beam_size=5"], "sample=true draws each output on its own: leave beam_size unset or 1"),
        (["sample=true", "n_best=2", "beam_size=2"], "sample=true draws each output on its own"),
        (["sample_topk=10"], "sample_topk=10: only used with sample=true"),
        (["temperature=0.7", "sample_seed=3"], "temperature=0.7, sample_seed=3: only used with sample=true"),
        (["sample=true", "temperature=0"], "temperature=0.0: expected a number > 0"),
        (["sample=true", "sample_topp=0"], "sample_topp=0.0: expected a probability in (0, 1]"),
        (["sample=true", "sample_topk=-1"], "sample_topk=-1: expected an integer >= 0 (0 = all pieces)"),
    ],
)
def test_sampling_settings_are_checked_before_the_checkpoint_is_read(overrides, expect):
    from nmt.cli import COMMANDS, Stop, preflight

    with pytest.raises(Stop) as e:
        preflight(COMMANDS["translate"], ["checkpoint=x.pt", *overrides])
    assert len(e.value.lines) == 1 and e.value.lines[0].startswith(expect), e.value.lines


def test_tensorboard_without_its_package_is_refused_before_any_work(monkeypatch):
    """The package is optional (pyproject's tensorboard extra); its absence is simulated here."""
    import importlib.util

    from nmt.cli import COMMANDS, Stop, preflight

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(Stop) as e:
        preflight(COMMANDS["train"], ["trainer.tensorboard=true"])
    assert e.value.lines == [
        "trainer.tensorboard=true needs the tensorboard package, which is not installed here "
        "(pip install tensorboard; scripts/install.sh installs it)"
    ]


def test_sampling_takes_n_best_as_the_number_of_draws():
    from nmt.cli import COMMANDS, preflight

    preflight(COMMANDS["translate"], ["checkpoint=x.pt", "sample=true", "n_best=4"])
    preflight(COMMANDS["translate"], ["checkpoint=x.pt", "sample=true", "n_best=4", "beam_size=1"])


VALUES = ["/r/0_attention=dot,seed=1/checkpoints/best.pt", "/a b/x.pt", "it's", "x\\", "a\\'b", "[x]", "~/r"]
VALUES += ["plain/p.pt"]


@pytest.mark.parametrize("value", VALUES)
def test_printed_overrides_read_back_as_the_same_value_through_the_shell_and_hydra(value):
    """A sweep job's folder holds = and , (Hydra's override grammar refuses them unquoted): the commands a run
    prints (translate with, resume) quote the value for Hydra and the whole for the shell."""
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser

    from nmt.config import override, shell_quote

    printed = shell_quote(override("checkpoint", value))
    (arg,) = shlex.split(printed)
    assert OverridesParser.create().parse_override(arg).value() == value, printed
    if value == "plain/p.pt":
        assert printed == "checkpoint=plain/p.pt"  # left alone when nothing needs quoting
    if value.startswith("/r/"):
        assert printed == f"\"checkpoint='{value}'\""  # readable: no '"'"' chains


@pytest.mark.parametrize(
    "value", [True, False, None, 0.001, 1e-05, 3, [1, 2], [], ["x", "y z", "it's"], "true", "3", "a b=c", *VALUES]
)
def test_a_config_value_set_back_by_an_override_reads_back_with_its_type(value):
    """A refused resume prints overrides that set changed keys back to the run's values (``value_override``):
    booleans, null, numbers and lists as Hydra reads them, and text that looks like one (``'true'``) as text."""
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser

    from nmt.config import shell_quote, value_override

    (arg,) = shlex.split(shell_quote(value_override("model.key", value)))
    got = OverridesParser.create().parse_override(arg).value()
    assert got == value and type(got) is type(value), arg


def test_an_override_hydra_cannot_read_is_named_with_its_quoted_form():
    from nmt.cli import COMMANDS, Stop, preflight

    path = "/r/0_attention=dot,seed=1/checkpoints/best.pt"
    with pytest.raises(Stop) as e:
        preflight(COMMANDS["translate"], ["beam_size=2", f"checkpoint={path}"])
    assert e.value.lines == [
        f"checkpoint={path}: Hydra cannot read this override (mismatched input '=' expecting <EOF>); quote the value "
        f"for Hydra (in the shell: \"checkpoint='{path}'\")"
    ]


LIST = "a list in brackets, e.g."


@pytest.mark.parametrize(
    "command,override,expect",
    [
        ("train", "trainer.lr=fast", "trainer.lr=fast: expected a number"),
        ("train", "trainer.tensorboard=maybe", "trainer.tensorboard=maybe: expected true or false"),
        ("train", "encoder.hidden_size=256.5", "encoder.hidden_size=256.5: expected a whole number"),
        ("train", "trainer.betas=0.9", f"trainer.betas=0.9: expected {LIST} trainer.betas=[0.9,0.999]"),
        ("train", "data.columns=1", f"data.columns=1: expected {LIST} data.columns=[...] (or null: unset)"),
        ("translate", "beam_size=wide", "beam_size=wide: expected a whole number (or null: unset)"),
    ],
)
def test_a_value_of_the_wrong_type_says_what_the_key_takes(command, override, expect):
    """Hydra's "Error merging override ...: int is not a ListConfig, list or tuple" becomes what to write."""
    from nmt.cli import COMMANDS, Stop, preflight

    with pytest.raises(Stop) as e:
        preflight(COMMANDS[command], ["checkpoint=x.pt", override] if command == "translate" else [override])
    assert e.value.lines == [expect]


UNREAD = "is not read: it is for"


@pytest.mark.parametrize(
    "overrides,expect",
    [
        (
            "attention=bahdanau attention.heads=8",
            [f"attention.heads=8 {UNREAD} attention=multihead (this run: bahdanau)"],
        ),
        ("attention=multihead attention.heads=8", []),
        (
            "attention.window=3 attention.score=dot",
            [
                f"attention.window=3 {UNREAD} attention=local_m or local_p (this run: bahdanau)",
                f"attention.score=dot {UNREAD} attention=local_m or local_p (this run: bahdanau)",
            ],
        ),
        (
            "attention=general attention.dim=128",
            [
                f"attention.dim=128 {UNREAD} attention=bahdanau or concat or coverage or "
                "local_p or multihead, or local attention with attention.score=bahdanau or concat (this run: general)"
            ],
        ),
        (
            "attention=local_m attention.max_positions=64",
            [
                f"attention.max_positions=64 {UNREAD} attention=location, or local attention with "
                "attention.score=location (this run: local_m)"
            ],
        ),
        ("attention=local_p attention.score=location attention.max_positions=64", []),
        (
            "decoder.input_feeding=false",
            [f"decoder.input_feeding=false {UNREAD} decoder.order=luong (this run: bahdanau)"],
        ),
        ("decoder=luong decoder.input_feeding=false", []),
        (
            "encoder.layer_norm_gain=0.1",
            [f"encoder.layer_norm_gain=0.1 {UNREAD} encoder.layer_norm=true (this run: false)"],
        ),
        ("experiment=cpu_best decoder.layer_norm_gain=1", []),
        (
            "trainer.optimizer=sgd trainer.betas=[0.8,0.9]",
            [f"trainer.betas=[0.8, 0.9] {UNREAD} trainer.optimizer=adam or adamw (this run: sgd)"],
        ),
        ("trainer.rho=0.9", [f"trainer.rho=0.9 {UNREAD} trainer.optimizer=adadelta (this run: adam)"]),
        (
            "trainer.decay_fraction=0.5",
            [f"trainer.decay_fraction=0.5 {UNREAD} trainer.scheduler=budget (this run: plateau)"],
        ),
        ("trainer.scheduler=budget trainer.max_steps=9 trainer.decay_fraction=0.5", []),
        ("trainer.decay_factor=0.1", [f"trainer.decay_factor=0.1 {UNREAD} trainer.scheduler=step (this run: plateau)"]),
        (
            "trainer.scheduler=budget trainer.max_steps=9 trainer.plateau_patience=3",
            [f"trainer.plateau_patience=3 {UNREAD} trainer.scheduler=plateau (this run: budget)"],
        ),
        (
            "attention=bahdanau,multihead attention.heads=2",
            [
                f"in the sweep's job attention=bahdanau: attention.heads=2 {UNREAD} attention=multihead "
                "(this run: bahdanau)"
            ],
        ),
    ],
)
def test_a_key_set_where_nothing_reads_it_is_named_before_the_run(overrides, expect):
    """attention.heads with another attention, decoder.input_feeding in Bahdanau order, Adam's betas under SGD, ...:
    their defaults are always in the config, so a set value was ignored without a word (a sweep over one ran
    identical jobs). Each set on the command line where nothing reads it is now one warning line; a value that is
    read, or the same key in a preset, says nothing; a sweep names the jobs that do not read it."""
    from nmt.cli import COMMANDS, preflight

    lines: list[str] = []
    preflight(COMMANDS["train"], overrides.split(), warn=lines.append)
    assert lines == expect


def test_the_keys_only_some_settings_read_match_what_reads_them():
    """nmt.config.READ_ONLY_UNDER (checked without torch) against the optimizers' own keys in nmt.training."""
    from nmt.config import READ_ONLY_UNDER, TrainConfig, schema_keys
    from nmt.training import OPTIMIZERS

    keys = schema_keys(TrainConfig)
    assert all(k in keys and decider in keys for k, (decider, _) in READ_ONLY_UNDER.items())
    for key in ("trainer.betas", "trainer.rho"):
        readers = {name for name, (_, extra) in OPTIMIZERS.items() if key.split(".")[1] in extra}
        assert set(READ_ONLY_UNDER[key][1]) == readers, key


def test_the_attention_keys_are_called_read_exactly_where_they_shape_the_model():
    """For every attention, and local attention with every score it takes: a key that unread_settings calls unread
    leaves the built module as it was, and a key it calls read changes its parameters' shapes."""
    from omegaconf import OmegaConf

    from nmt.config import allowed, unread_settings
    from nmt.models.attention import build_attention

    base, other = {"dim": 12, "heads": 4, "max_positions": 16}, {"dim": 24, "heads": 2, "max_positions": 32}
    combos = [(n, "general") for n in allowed("attention.name") if not n.startswith("local_")]
    combos += [(n, s) for n in ("local_m", "local_p") for s in allowed("attention.score")]

    def shapes(name: str, score: str, **change) -> dict:
        options = {**base, **change}
        module = build_attention(name, 8, 8, options.pop("dim"), score=score, window=2, **options)
        return {k: tuple(v.shape) for k, v in module.state_dict().items()}

    for name, score in combos:
        for key, value in other.items():
            cfg = OmegaConf.create({"attention": {"name": name, "score": score, **base, key: value}})
            read = not unread_settings(cfg, [f"attention.{key}"])
            assert (shapes(name, score, **{key: value}) != shapes(name, score)) == read, (name, score, key)


def warnings_in(log: str) -> list[str]:
    """A log's lines that name an unread key, from the logger's name on (without the time that log lines start with)."""
    return [x[x.index("[nmt.") :] for x in log.splitlines() if UNREAD in x]


def test_the_warning_reaches_the_user_and_the_run_goes_on(tmp_path, sample_dir):
    """The line is in the console once and in the run's train.log, where it explains the run later."""
    proc = run_module(
        "nmt.train",
        [f"data.dir={sample_dir}", *TINY, "trainer.max_steps=2", "attention.heads=2", f"hydra.run.dir={tmp_path}/run"],
        tmp_path / "cache",
    )
    line = f"[nmt.train][WARNING] - attention.heads=2 {UNREAD} attention=multihead (this run: bahdanau)"
    assert warnings_in(proc.stderr) == [line], proc.stderr[:2000]  # once, in the run's log
    assert warnings_in((tmp_path / "run" / "train.log").read_text()) == [line]
    assert (tmp_path / "run" / "checkpoints" / "last.pt").is_file()
