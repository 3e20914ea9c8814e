#!/usr/bin/env bash
# Install the peer toolkits that `scripts/benchmark.py --compare joey,onmt` trains side by side with nmt,
# each into its own virtualenv under $NMT_PEERS (default /tmp/peers):
#   venv-joey  Joey NMT 2.3.0
#   venv-onmt  OpenNMT-py 3.5.1
# CPU torch 2.13.0 is installed first in each venv and pinned as a constraint afterwards, so pip never
# swaps in another (multi-gigabyte) torch build. OpenNMT-py 3.5.1 declares torch<2.3, so it goes in
# with --no-deps plus the rest of its declared requirements; Joey imports importlib_metadata without
# declaring it. Usage: bash scripts/install_peers.sh [joey] [onmt]   (default: both)
set -euo pipefail
P=${NMT_PEERS:-/tmp/peers}
TORCH=${NMT_TORCH_SPEC:-torch==2.13.0}
mkdir -p "$P"
echo "$TORCH" > "$P/constraints.txt"
which=("$@"); [ ${#which[@]} -eq 0 ] && which=(joey onmt)

for peer in "${which[@]}"; do
  V="$P/venv-$peer"
  if [ -x "$V/bin/python" ] && "$V/bin/python" -c "import ${peer/joey/joeynmt}" 2>/dev/null; then
    echo "$peer: already installed in $V"; continue
  fi
  rm -rf "$V"; python3 -m venv "$V"
  "$V/bin/pip" install -q --upgrade pip
  "$V/bin/pip" install -q "$TORCH"
  case "$peer" in
    joey) "$V/bin/pip" install -q -c "$P/constraints.txt" joeynmt==2.3.0 importlib_metadata ;;
    onmt) "$V/bin/pip" install -q --no-deps OpenNMT-py==3.5.1
          "$V/bin/pip" install -q -c "$P/constraints.txt" configargparse 'ctranslate2>=4,<5' 'tensorboard>=2.3' \
            flask waitress 'pyonmttok>=1.37,<2' pyyaml sacrebleu rapidfuzz pyahocorasick fasttext-wheel spacy six \
            sentencepiece ;;
    *) echo "unknown peer '$peer' (expected joey or onmt)" >&2; exit 2 ;;
  esac
  "$V/bin/pip" freeze > "$P/freeze-$peer.txt"
  echo "$peer: installed in $V ($(grep -iE '^(joeynmt|OpenNMT-py|torch)==' "$P/freeze-$peer.txt" | tr '\n' ' '))"
done
