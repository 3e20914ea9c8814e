#!/usr/bin/env bash
# The one command to run on a lent GPU machine (NVIDIA H100, Python 3.12 with CUDA torch,
# sentencepiece and sacrebleu, no network): checks the code paths CI can only fake
# (tests/test_cuda_path.py says what and why), then trains model R on the real corpus for a
# few minutes in one process and under torchrun (DDP, NCCL, world size 1) and compares their
# throughput (target: DDP within 5%).
#
# Needs, in the working tree (both git-ignored, so name them in the device tool's carry):
#   .whl/           hydra-core, omegaconf, datasets ... (bash scripts/build_device_wheels.sh)
#   data/spa-eng/   train.tsv, valid.tsv, test.tsv (copied from ../shared/data/spa-eng)
#
# Usage: bash scripts/gpu_check.sh [STAGE ...]
#   STAGE: install env tests presets train decode ddp summary cpu peers amp gaps (default: all but presets, cpu,
#          peers, amp, gaps)
#   amp: model R's training step on the GPU: the default (trainer.amp=auto, measured per GPU since session 21),
#        bf16 autocast forced (trainer.amp=bf16) and float32 (trainer.amp=none): scripts/benchmark.py
#        --models r,r_bf16,r_fp32 (on an H100 bf16 autocast ran 0.68-0.86x float32 for model R, session 21);
#        AMP_WINDOWS (5) windows of 30 steps each
#   gaps: what session 18 left unrun on a GPU, into one log (gaps.log): trainer.amp=fp16 (GradScaler) for
#        0.5 min, then resumed to 0.75 min; an ensemble (the `train` run's best.pt + the fp16 run's) in
#        nmt.evaluate on 300 valid lines; nmt.serve on the GPU answering one request
#   decode: nmt.evaluate of the `train` run's checkpoint on valid.tsv, beam 5, on the GPU (whole command timed)
#   presets: experiment=cpu_best on the GPU for PRESET_MINUTES (1): subword sampling, word dropout, layer-normalised
#        cells (the loop implementation: cuDNN has none), three-way tying, averaging of the last 3 checkpoints and
#        the decoding defaults tuned on 300 valid lines; then nmt.evaluate and nmt.translate with averaged.pt there
#   cpu: the machine's own CPU on 2 pinned cores (taskset), like a 2-core CI machine: GEMM peak,
#        the precision and tanh choices nmt.train makes there, and model R's step in bf16 against float32
#   peers: scripts/benchmark.py --device cpu --compare onmt on 2 pinned cores of the machine's CPU (OpenNMT-py from
#        .peers_dev: bash scripts/build_device_peers.sh, then carry .peers_dev); PEERS_ROUNDS (3),
#        PEERS_WINDOW (35 s), PEERS_DECODE_ROUNDS (1), PEERS_LIMIT (420 s). Each system decodes the model its rounds
#        trained: with 2 rounds of 30 s (session 34, H200 host) the stage took 5.5 minutes, and both models were
#        below 1 BLEU, so only the training rates meant anything (benchmark.py prints a CAUTION below 10 BLEU);
#        a decoding comparison needs minutes of training each (issue 15's command: 4 rounds of 60 s)
# Logs go flat into $OUT (default /tmp/gpu_check), at most 8 files. TRAIN_MINUTES (default 2) sets
# each training run's length; the whole script stays within 9 minutes at the default.
# To try the script without a GPU: NMT_TEST_DEVICE= TRAIN_DEVICE=cpu TRAIN_MINUTES=0.2 \
#   TRAIN_EXTRA="data.valid_max_sentences=20" PYTHON=.venv/bin/python bash scripts/gpu_check.sh tests train ddp summary
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/gpu_check}
PYTHON=${PYTHON:-python3}
MINUTES=${TRAIN_MINUTES:-2}
RUNS=${RUNS:-/tmp/gpu_check_runs}
export NMT_CACHE=${NMT_CACHE:-/tmp/gpu_check_cache} # one tokenizer for both runs
export WANDB_MODE=disabled HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$RUNS"
stages=${*:-install env tests train decode ddp summary}
failed=()

want() { [[ " $stages " == *" $1 "* ]]; }
say() { echo "== $* ($(date -u +%H:%M:%S))" | tee -a "$OUT/summary.txt"; }
# stage NAME LOG TIMEOUT_S COMMAND...: runs it with a time limit, output to the terminal and LOG
stage() {
    local name=$1 log=$2 limit=$3
    shift 3
    say "$name"
    timeout "$limit" "$@" 2>&1 | tee -a "$OUT/$log"
    local rc=${PIPESTATUS[0]}
    [[ $rc -eq 0 ]] || { failed+=("$name (exit $rc, see $log)"); say "$name FAILED: exit $rc"; }
}

if want install; then
    say "install .whl/ into /tmp/site"
    if ! ls .whl/*.whl >/dev/null 2>&1; then
        failed+=("install (.whl/ is missing: run scripts/build_device_wheels.sh and carry .whl)")
    else
        $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
            2>&1 | tail -5 | tee -a "$OUT/summary.txt"
    fi
fi
export PYTHONPATH=/tmp/site:$root

if want env; then
    say "environment"
    {
        date -u
        nvidia-smi || echo "nvidia-smi failed"
        $PYTHON -c "import torch, sys; print('python', sys.version.split()[0], '| torch', torch.__version__, \
'| cuda', torch.version.cuda, '| cudnn', torch.backends.cudnn.version(), '| available', torch.cuda.is_available(), \
'| device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, '| bf16', \
torch.cuda.is_available() and torch.cuda.is_bf16_supported(), '| nccl', torch.distributed.is_nccl_available())"
        lscpu | grep 'Model name'
    } 2>&1 | tee "$OUT/env.txt"
fi

if want tests; then
    # The CUDA path on the real GPU, then the quick model tests that need no corpus (on the CPU, as
    # a check of this torch; tests/test_decoder.py is left out: minutes, nothing device-specific).
    stage "tests" pytest.log 120 env NMT_TEST_DEVICE="${NMT_TEST_DEVICE-cuda}" $PYTHON -m pytest -q -p no:cacheprovider \
        tests/test_cuda_path.py tests/test_attention.py tests/test_encoder.py \
        tests/test_loop.py tests/test_loss.py
fi

if { want train || want ddp || want amp; } && [[ ! -f data/spa-eng/train.tsv ]]; then
    failed+=("corpus: data/spa-eng/train.tsv is missing (copy ../shared/data/spa-eng/*.tsv there and carry data/spa-eng)")
fi
# shellcheck disable=SC2206 # TRAIN_EXTRA: extra overrides, split on spaces
train_args=("device=${TRAIN_DEVICE:-cuda}" experiment=model_r wandb.mode=disabled "trainer.max_minutes=$MINUTES" trainer.valid_every=200
    data.dir=data/spa-eng data.fetch=false ${TRAIN_EXTRA:-})
limit=$(awk "BEGIN {print int(60 * $MINUTES + 75)}") # startup (tokenizer on the first run) and the final validation

if want train && [[ -f data/spa-eng/train.tsv ]]; then
    rm -rf "$RUNS/single"
    stage "train: one process" train.log "$limit" $PYTHON -m nmt.train "${train_args[@]}" "hydra.run.dir=$RUNS/single"
    cp "$RUNS/single/metrics.jsonl" "$OUT/metrics_single.jsonl" 2>/dev/null
fi

if want decode; then
    ckpt=$RUNS/single/checkpoints/best.pt
    if [[ -f $ckpt ]]; then
        start=$(date +%s.%N)
        stage "decode: nmt.evaluate valid.tsv, beam 5, on ${TRAIN_DEVICE:-cuda}" decode.log 150 $PYTHON -m nmt.evaluate \
            "checkpoint=$ckpt" input=data/spa-eng/valid.tsv beam_size=5 "device=${TRAIN_DEVICE:-cuda}" \
            "hypotheses=$RUNS/single/valid.hyp"
        end=$(date +%s.%N)
        words=$(wc -w <"$RUNS/single/valid.hyp" 2>/dev/null || echo 0)
        awk -v s="$start" -v e="$end" -v w="$words" 'BEGIN {printf "decode: %d output words in %.1f s (whole command) = %.0f words/s\n", w, e - s, w / (e - s)}' |
            tee -a "$OUT/summary.txt"
    else
        failed+=("decode (no $ckpt: the train stage did not save)")
    fi
fi

if want presets && [[ -f data/spa-eng/train.tsv ]]; then
    dev=${TRAIN_DEVICE:-cuda}
    pmin=${PRESET_MINUTES:-1}
    plimit=$(awk "BEGIN {print int(60 * $pmin + 150)}") # tokenizer, calibration, averaging and the decoding grid
    rm -rf "$RUNS/preset"
    stage "presets: nmt.train experiment=cpu_best on $dev, $pmin min" presets.log "$plimit" $PYTHON -m nmt.train \
        experiment=cpu_best "device=$dev" wandb.mode=disabled "trainer.max_minutes=$pmin" \
        "trainer.valid_minutes=$(awk "BEGIN {print $pmin / 4}")" data.valid_max_sentences=300 data.dir=data/spa-eng \
        data.fetch=false "hydra.run.dir=$RUNS/preset"
    cp "$RUNS/preset/metrics.jsonl" "$OUT/metrics_preset.jsonl" 2>/dev/null
    grep -E "model:|training precision|training stream|validating every|stopping|averaged|decoding with" "$OUT/presets.log" |
        head -12 >>"$OUT/summary.txt"
    ckpt=$RUNS/preset/checkpoints/averaged.pt
    if [[ -f $ckpt ]]; then
        head -n 300 data/spa-eng/valid.tsv >"$RUNS/valid300.tsv"
        stage "presets: nmt.evaluate averaged.pt (its stored decoding defaults), 300 valid lines on $dev" presets.log 120 \
            $PYTHON -m nmt.evaluate "checkpoint=$ckpt" "input=$RUNS/valid300.tsv" "device=$dev"
        tail -2 "$OUT/presets.log" >>"$OUT/summary.txt"
        printf 'I would like a cup of coffee, please.\nWhere is the station?\n' >"$RUNS/two.en"
        stage "presets: nmt.translate averaged.pt on $dev" presets.log 120 \
            $PYTHON -m nmt.translate "checkpoint=$ckpt" "input=$RUNS/two.en" "device=$dev"
        tail -2 "$OUT/presets.log" >>"$OUT/summary.txt"
    else
        failed+=("presets: the cpu_best run wrote no $ckpt")
    fi
fi

if want ddp && [[ -f data/spa-eng/train.tsv ]]; then
    rm -rf "$RUNS/ddp"
    stage "train: torchrun, 1 process (DDP, NCCL)" train_ddp.log "$limit" $PYTHON -m torch.distributed.run --standalone \
        --nproc_per_node 1 -m nmt.train "${train_args[@]}" "hydra.run.dir=$RUNS/ddp"
    cp "$RUNS/ddp/metrics.jsonl" "$OUT/metrics_ddp.jsonl" 2>/dev/null
fi

if want summary; then
    say "throughput (tgt_tokens_per_s per validation window; the first window holds start-up and is left out)"
    $PYTHON - "$OUT/metrics_single.jsonl" "$OUT/metrics_ddp.jsonl" <<'EOF' 2>&1 | tee -a "$OUT/summary.txt"
import json, sys
from pathlib import Path

def rates(path):
    p = Path(path)
    if not p.is_file():
        return None
    recs = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    return [r["tgt_tokens_per_s"] for r in recs if "tgt_tokens_per_s" in r], recs

got = {}
for name, path in zip(("one process", "torchrun/DDP"), sys.argv[1:]):
    r = rates(path)
    if r is None or not r[0]:
        print(f"{name:13s}: no metrics ({path})")
        continue
    xs, recs = r
    steady = xs[1:] or xs
    got[name] = sum(steady) / len(steady)
    last = recs[-1]
    print(f"{name:13s}: {got[name]:,.0f} tgt tokens/s (mean of {len(steady)} windows; all: "
          f"{', '.join(f'{x:,.0f}' for x in xs)}) | step {last['step']} | BLEU {last['bleu']:.2f} | loss {last['loss']:.3f}")
if len(got) == 2:
    a, b = got["one process"], got["torchrun/DDP"]
    ratio = b / a
    verdict = "within 5%" if ratio >= 0.95 else "MORE than 5% slower"
    print(f"DDP (world size 1) / one process = {ratio:.3f}: {verdict}")
EOF
fi

if want amp && [[ -f data/spa-eng/train.tsv ]]; then
    stage "amp: model R on ${TRAIN_DEVICE:-cuda}: trainer.amp=auto (r), bf16 (r_bf16), none (r_fp32)" amp.log 300 \
        $PYTHON scripts/benchmark.py --models r,r_bf16,r_fp32 --device "${TRAIN_DEVICE:-cuda}" --data data/spa-eng \
        --windows "${AMP_WINDOWS:-5}" --decode-sentences 200 --no-efficiency
    grep -E "^\| (model|r|r_bf16|r_fp32) |precision" "$OUT/amp.log" | tee -a "$OUT/summary.txt"
fi

if want gaps && [[ -f data/spa-eng/train.tsv ]]; then
    dev=${TRAIN_DEVICE:-cuda}
    head -n 300 data/spa-eng/valid.tsv >"$RUNS/valid300.tsv"
    fp16_args=("device=$dev" experiment=model_r wandb.mode=disabled trainer.amp=fp16 trainer.valid_every=150
        trainer.tune_decoding=false data.valid_max_sentences=300 data.dir=data/spa-eng data.fetch=false
        "hydra.run.dir=$RUNS/fp16")
    rm -rf "$RUNS/fp16"
    stage "gaps: nmt.train trainer.amp=fp16 (GradScaler) on $dev, 0.5 min" gaps.log 150 \
        $PYTHON -m nmt.train "${fp16_args[@]}" trainer.max_minutes=0.5
    stage "gaps: the fp16 run resumed to 0.75 min" gaps.log 150 \
        $PYTHON -m nmt.train "${fp16_args[@]}" trainer.max_minutes=0.75 trainer.resume=true
    grep -E "precision|amp|resum|BLEU|stopped|finished" "$OUT/gaps.log" | head -20 >>"$OUT/summary.txt"
    if [[ -f $RUNS/single/checkpoints/best.pt && -f $RUNS/fp16/checkpoints/best.pt ]]; then
        stage "gaps: nmt.evaluate, ensemble of two checkpoints, beam 5, 300 valid lines on $dev" gaps.log 120 \
            $PYTHON -m nmt.evaluate "checkpoint=$RUNS/single/checkpoints/best.pt" \
            "ensemble=[$RUNS/fp16/checkpoints/best.pt]" "input=$RUNS/valid300.tsv" beam_size=5 "device=$dev"
        tail -3 "$OUT/gaps.log" >>"$OUT/summary.txt"
    else
        failed+=("gaps: ensemble (the train or fp16 stage saved no best.pt)")
    fi
    ckpt=$RUNS/fp16/checkpoints/best.pt
    if [[ -f $ckpt ]]; then
        say "gaps: nmt.serve on $dev, one request"
        $PYTHON -m nmt.serve "checkpoint=$ckpt" "device=$dev" port=8765 >>"$OUT/gaps.log" 2>&1 &
        server=$!
        $PYTHON - <<'EOF' 2>&1 | tee -a "$OUT/gaps.log" "$OUT/summary.txt"
import json, time, urllib.request
body = json.dumps({"text": "I would like a cup of coffee, please."}).encode()
for _ in range(90):
    try:
        req = urllib.request.Request("http://127.0.0.1:8765/api/translate", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as answer:
            reply = json.loads(answer.read())
            print("nmt.serve answered:", json.dumps({k: reply[k] for k in ("source", "translation", "score")}))
            break
    except OSError:
        time.sleep(1)
else:
    raise SystemExit("nmt.serve did not answer within 90 s")
EOF
        [[ ${PIPESTATUS[0]} -eq 0 ]] || failed+=("gaps: nmt.serve (see gaps.log)")
        kill "$server" 2>/dev/null
        wait "$server" 2>/dev/null
    else
        failed+=("gaps: serve (the fp16 stage saved no best.pt)")
    fi
fi

if want cpu; then
    # Issue 15's other CPU kind: this machine's processor, limited to 2 cores like the development VM.
    pin=(taskset -c 0,1 env OMP_NUM_THREADS=2)
    say "cpu: $(lscpu | grep 'Model name' | sed 's/  */ /g'), 2 pinned cores"
    lscpu | grep -o -E 'amx[a-z0-9_]*|avx512_bf16|avx512f |avx2' | sort -u | tr '\n' ' ' | tee -a "$OUT/summary.txt"
    echo | tee -a "$OUT/summary.txt"
    stage "cpu: GEMM peak" cpu_peak.log 60 "${pin[@]}" $PYTHON scripts/gemm_peak.py
    rm -rf "$RUNS/cpu"
    stage "cpu: nmt.train model R, 0.5 min (its precision and tanh lines)" cpu_train.log 150 "${pin[@]}" \
        $PYTHON -m nmt.train device=cpu experiment=model_r wandb.mode=disabled trainer.max_minutes=0.5 \
        trainer.valid_every=100000 trainer.tune_decoding=false data.valid_max_sentences=50 data.dir=data/spa-eng \
        data.fetch=false "hydra.run.dir=$RUNS/cpu"
    grep -E "precision|products|tanh|tok/s" "$OUT/cpu_train.log" | head -12 | tee -a "$OUT/summary.txt"
    stage "cpu: model R step, bf16 against float32 (interleaved)" cpu_ab.log 180 "${pin[@]}" $PYTHON \
        scripts/benchmark_ab.py --settings fp32+fused,bf16+fused,bf16+fused+plain_tanh --batches 24 --data data/spa-eng
    tail -3 "$OUT/cpu_ab.log" >>"$OUT/summary.txt"
fi

if want peers; then
    if [[ ! -x .peers_dev/venv-onmt/bin/python ]]; then
        failed+=("peers (.peers_dev is missing: run scripts/build_device_peers.sh and carry .peers_dev)")
    else
        say "peers: OpenNMT-py's compiled dependencies into /tmp/onmt_site"
        $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/onmt_site \
            .peers_dev/whl/*.whl 2>&1 | tail -3 | tee -a "$OUT/summary.txt"
        stage "peers: model R against OpenNMT-py, 2 pinned cores of $(lscpu | grep 'Model name' | sed 's/.*: *//')" \
            peers.log "${PEERS_LIMIT:-420}" taskset -c 0,1 env OMP_NUM_THREADS=2 NMT_PEERS="$root/.peers_dev" \
            NMT_CACHE="$root/.peers_dev/cache" $PYTHON scripts/benchmark.py --device cpu --models r --compare onmt \
            --rounds "${PEERS_ROUNDS:-3}" --window-seconds "${PEERS_WINDOW:-35}" --windows 1 --window-steps 20 \
            --warmup 10 --decode-rounds "${PEERS_DECODE_ROUNDS:-1}" --no-efficiency --data data/spa-eng \
            --json "$OUT/peers.json"
        grep -E "^round|^\|" "$OUT/peers.log" >>"$OUT/summary.txt"
    fi
fi

if ((${#failed[@]})); then
    say "FAILED: ${failed[*]}"
    exit 1
fi
say "all stages passed: $stages"
