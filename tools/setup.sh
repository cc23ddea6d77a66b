#!/usr/bin/env bash
# Installs everything the build and the tests need, from Debian's packages and the Python
# registry. Safe to run again: it only installs what is missing, and takes a second when all is
# present. Nothing is downloaded later, at build or run time.
set -euo pipefail

TORCH_VERSION=2.11.0
APT_PACKAGES=(bazel-bootstrap libopenmpi-dev openmpi-bin libcli11-dev libspdlog-dev libfmt-dev
              catch2 libssl-dev nlohmann-json3-dev libtomlplusplus-dev libpcre2-dev python3)

say() { echo "[setup] $*" >&2; }

as_root() {
  if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
if ((${#missing[@]})); then
  say "installing Debian packages: ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    "${missing[@]}" >&2
fi

torch_version() {
  python3 - <<'PY' 2>/dev/null
import importlib.util, os, re
spec = importlib.util.find_spec("torch")
if spec:
    text = open(os.path.join(spec.submodule_search_locations[0], "version.py")).read()
    print(re.search(r"__version__ = '([^']+)'", text).group(1))
PY
}
if [[ "$(torch_version)" != "${TORCH_VERSION}"* ]]; then
  say "installing torch==${TORCH_VERSION} from the Python registry (LibTorch headers and libraries)"
  python3 -m pip install -q "torch==${TORCH_VERSION}" >&2
fi

CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
for f in include/cuda_runtime.h include/nccl.h lib64/libcudart.so; do
  if [[ ! -e "${CUDA_HOME}/${f}" ]]; then
    say "error: ${CUDA_HOME}/${f} is missing: the CUDA 13.0 toolkit and NCCL are expected under"
    say "${CUDA_HOME} (set CUDA_HOME to another location)."
    exit 1
  fi
done
say "ok: $(bazel --version 2>/dev/null), torch $(torch_version), $(mpirun --version 2>/dev/null | head -n1), CUDA at ${CUDA_HOME}"
