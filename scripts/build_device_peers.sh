#!/usr/bin/env bash
# Build .peers_dev/ in the repository root: OpenNMT-py 3.5.1 for the GPU device machine's Python 3.12,
# so that `scripts/benchmark.py --compare onmt` can run on that machine's own CPU (another CPU kind
# than the development VM's: an Intel Xeon with AMX in session 18). The device has torch, numpy,
# PyYAML, sacrebleu, sentencepiece, six and tensorboard, but no network.
#
#   .peers_dev/site/          OpenNMT-py's source and ConfigArgParse (pure Python, copied from the local peer
#                             venv that scripts/install_peers.sh made), plus empty stand-ins for spacy and
#                             fasttext: only OpenNMT-py's terminology and clean transforms import them, at
#                             module level, and model R's recipe (scripts/peers/onmt_model_r.yaml) uses neither.
#   .peers_dev/whl/           cp312 wheels of what OpenNMT-py really imports: pyonmttok (its vocabularies),
#                             pyahocorasick and rapidfuzz (imported by the transforms package).
#   .peers_dev/venv-onmt/bin/python   runs the device's python3 with those on PYTHONPATH, so that
#                             NMT_PEERS=.peers_dev makes the benchmark find "venv-onmt" as it does locally.
#   .peers_dev/cache/         nmt's sentencepiece model of model R (NMT_CACHE), if one is in ~/.cache/nmt,
#                             so the device does not train it again.
#
# Usage: bash scripts/build_device_peers.sh, then carry .peers_dev and start the device command with
#   python3 -m pip install -q --no-index --no-deps --target /tmp/onmt_site .peers_dev/whl/*.whl
# (scripts/gpu_check.sh's `peers` stage does that and runs the comparison on 2 pinned cores).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
peer_site=$("${NMT_PEERS:-/tmp/peers}/venv-onmt/bin/python" -c "import onmt, os; print(os.path.dirname(os.path.dirname(onmt.__file__)))")

if exclude=$(git rev-parse --git-path info/exclude 2>/dev/null); then
    mkdir -p "$(dirname "$exclude")"
    touch "$exclude"
    grep -qxF '/.peers_dev/' "$exclude" || echo '/.peers_dev/' >>"$exclude"
fi

rm -rf .peers_dev
mkdir -p .peers_dev/site/spacy .peers_dev/site/fasttext .peers_dev/whl .peers_dev/venv-onmt/bin .peers_dev/cache
cp -r "$peer_site/onmt" "$peer_site/configargparse.py" .peers_dev/site/
find .peers_dev/site -name __pycache__ -prune -exec rm -rf {} +
echo '"""Empty stand-in: only OpenNMT-py'"'"'s terminology transform imports spacy; model R does not use it."""' \
    >.peers_dev/site/spacy/__init__.py
echo '"""Empty stand-in: only OpenNMT-py'"'"'s clean transform imports fasttext; model R does not use it."""' \
    >.peers_dev/site/fasttext/__init__.py
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .peers_dev/whl pyonmttok==1.38.1 pyahocorasick==2.3.1 rapidfuzz==3.14.6
cat >.peers_dev/venv-onmt/bin/python <<'EOF'
#!/bin/sh
# OpenNMT-py on the device machine's python3 (PEER_PYTHON to choose another): its source in ../../site,
# its compiled dependencies installed into /tmp/onmt_site (scripts/build_device_peers.sh).
here=$(cd "$(dirname "$0")/../.." && pwd)
PYTHONPATH="$here/site:/tmp/onmt_site${PYTHONPATH:+:$PYTHONPATH}" exec "${PEER_PYTHON:-python3}" "$@"
EOF
chmod +x .peers_dev/venv-onmt/bin/python
cache=${NMT_CACHE:-$HOME/.cache/nmt}
if [[ -d $cache/sentencepiece ]]; then cp -r "$cache/sentencepiece" .peers_dev/cache/; fi
du -sh .peers_dev
