#!/usr/bin/env bash
# Brings cuDNN's FP8 attention (the nvidia-cudnn-frontend wheel, Python graph API, `sdpa_fp8`) to
# the GPU machine, which has no network, as a peer of chapter 05's FP8 kernels
# (bench/peer_cudnn_fp8.py, `./tutorial bench --peers cudnn-fp8`). The wheel (about 12 MB, cp312,
# manylinux x86_64) carries the frontend only: it drives the cuDNN that PyTorch already ships
# (nvidia-cudnn-cu*; peer_cudnn_fp8.load() points the frontend at the libcudnn PyTorch loaded).
# Its declared dependencies (nvidia-cutlass-dsl, apache-tvm-ffi) serve the frontend's own CuTe DSL
# kernels for sm100 and newer; `import cudnn` and the cuDNN backend's sdpa_fp8 need neither, so
# they are not installed (--no-deps).
#
#   bench/cudnn_fp8_wheel.sh .peer/d          # here: downloads the wheel into .peer/d (git-ignored)
#                                             # (CUDNN_FE_WHEEL=/path/to/wheel.whl: copy that one instead)
#   device call, carry [".peer/d"]:
#       bash .peer/d/install.sh && export PYTHONPATH=$(cat /tmp/peer-cudnn/pythonpath)${PYTHONPATH:+:$PYTHONPATH}
#       python3 bench/peer_cudnn_fp8.py --selftest
#   with FA4 too (../shared/tools/peer_wheels.sh): PYTHONPATH=$(cat /tmp/peer/pythonpath):$(cat /tmp/peer-cudnn/pythonpath)
set -euo pipefail
OUT=${1:?usage: cudnn_fp8_wheel.sh OUTDIR}
VERSION=1.32.0
mkdir -p "$OUT"
rm -f "$OUT"/nvidia_cudnn_frontend-*.whl
if [ -n "${CUDNN_FE_WHEEL:-}" ]; then
  cp "$CUDNN_FE_WHEEL" "$OUT/"
else
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$OUT" "nvidia-cudnn-frontend==$VERSION"
fi
ls "$OUT"/nvidia_cudnn_frontend-"$VERSION"-cp312-*.whl > /dev/null
cat > "$OUT/install.sh" <<'SH'
# Installs the carried nvidia-cudnn-frontend wheel into /tmp/peer-cudnn/site (no index, no dependencies)
# and writes the PYTHONPATH that finds it to /tmp/peer-cudnn/pythonpath.
set -e
D=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
W=$(ls "$D"/nvidia_cudnn_frontend-*.whl)
SITE=/tmp/peer-cudnn/site
mkdir -p "$SITE"
python3 -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if v == (3, 12) else "the wheel is cp312; this python is %d.%d" % v)'
if ! python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$W"; then
  # no pip: a wheel is a zip archive, and this one has nothing to install beyond its files
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$W" "$SITE"
fi
echo "$SITE" > /tmp/peer-cudnn/pythonpath
echo "cudnn frontend: $(basename "$W") in $SITE"
SH
du -sh "$OUT"
