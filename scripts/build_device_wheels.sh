#!/usr/bin/env bash
# Build .whl/ in the repository root: x86_64 / CPython 3.12 wheels of the packages the GPU
# device machine lacks. Its Python 3.12 has torch, sentencepiece, sacrebleu, numpy and pyarrow,
# but not hydra-core, omegaconf, antlr4, datasets (and their dependencies), and it has no
# network, so these travel with the working tree (`carry: [".whl"]`, 64 MiB limit in all).
#
# Pins are the versions installed in the development venv (`pip show NAME`); the list is the
# Requires-Dist closure of hydra-core and datasets (markers for Linux / Python 3.12, no extras),
# minus what the device has. wandb is left out: it pulls pydantic-core, protobuf and
# opentelemetry (compiled, tens of MiB); code must import it lazily and run without it.
#
# Usage: bash scripts/build_device_wheels.sh        (PYTHON=... to choose the pip to use)
# Then start a device command with the install line printed at the end.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi

# Keep the wheels out of git even where .gitignore lacks the entry.
if exclude=$(git rev-parse --git-path info/exclude 2>/dev/null); then
    mkdir -p "$(dirname "$exclude")"
    touch "$exclude"
    grep -qxF '/.whl/' "$exclude" || echo '/.whl/' >>"$exclude"
fi

wheels=(
    # hydra
    hydra-core==1.3.8
    omegaconf==2.3.1
    PyYAML==6.0.3
    packaging==26.3
    # datasets
    datasets==5.2.0
    dill==0.4.1
    multiprocess==0.70.19
    xxhash==4.1.0
    fsspec==2026.9.0
    filelock==4.2.11
    tqdm==4.70.1
    pandas==3.1.1
    python-dateutil==4.0.0
    tzdata==2026.6
    # huggingface-hub (imported by datasets)
    huggingface-hub==2.4.0
    hf-xet==1.8.0
    click==8.5.1
    httpx2==2.16.2
    httpcore2==2.16.2
    h11==0.16.0
    truststore==0.10.5
    anyio==4.16.0
    idna==3.20
    typing-extensions==4.16.0
    # nmt.serve (jinja2 and markupsafe are on the device, click is above)
    flask==3.1.3
    werkzeug==3.1.9
    waitress==3.0.2
    itsdangerous==2.2.0
    blinker==1.9.0
)
# Bundled although torch brings them too (filelock, fsspec, typing-extensions): these pins are
# new enough for datasets, and /tmp/site comes first on PYTHONPATH.
device_has="torch numpy pyarrow sentencepiece sacrebleu jinja2 markupsafe"

rm -rf .whl
mkdir .whl
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${wheels[@]}"
# No wheel on PyPI for antlr4 4.9.3 (the version omegaconf 2.3 needs): build the pure-Python one.
"$PYTHON" -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3

# Check the closure: every Requires-Dist of a bundled wheel is bundled or on the device.
"$PYTHON" - "$device_has" <<'EOF'
import pathlib, re, sys, zipfile
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement

env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
have = {norm(n) for n in sys.argv[1].split()}
requires = {}
for wheel in sorted(pathlib.Path(".whl").glob("*.whl")):
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA")))
    text = meta.decode("utf-8").split("\n\n", 1)[0]
    name = norm(re.search(r"^Name: (.+)$", text, re.M).group(1).strip())
    requires[name] = [Requirement(r) for r in re.findall(r"^Requires-Dist: (.+)$", text, re.M)]
missing = sorted({(norm(r.name), who) for who, reqs in requires.items() for r in reqs
                  if (r.marker is None or r.marker.evaluate(env)) and norm(r.name) not in requires
                  and norm(r.name) not in have})
for dep, who in missing:
    print(f"warning: {dep} (needed by {who}) is neither bundled nor on the device", file=sys.stderr)
print(f"{len(requires)} wheels; dependency closure {'incomplete' if missing else 'complete'}")
EOF

bytes=$(du -cb .whl/*.whl | tail -n 1 | cut -f1)
mib=$(( (bytes + 1048575) / 1048576 ))
echo "total size of .whl/: ${mib} MiB (${bytes} bytes)"
if (( bytes > 60 * 1048576 )); then
    echo "error: .whl/ exceeds 60 MiB; it would not fit the device transfer" >&2
    exit 1
fi
echo "start a device command with:"
echo "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site"
