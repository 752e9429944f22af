#!/usr/bin/env bash
# Installs everything lathe needs to build and test, idempotently.
#   scripts/setup.sh           build + test dependencies (Debian packages)
#   scripts/setup.sh --tools   also the Python libraries that make reference
#                              fixtures and run baselines (PyPI)
# Needs root (or sudo) for apt. Safe to run again: installed packages are skipped.
set -euo pipefail

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git python3
  libopenblas-dev nlohmann-json3-dev libpcre2-dev libcli11-dev libyaml-cpp-dev libicu-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcurl4-openssl-dev libssl-dev
  clang libclang-rt-14-dev
)
# Small Python libraries the tests use to cross-check files and the local
# S3-compatible server the storage tests start (always installed).
# An entry is a module name, or "module=pip-spec" where they differ.
PIP_TEST=(numpy safetensors "moto.server=moto[server]")
# Reference libraries for making fixtures and running baselines (--tools).
PIP_TOOLS=(torch transformers tokenizers jinja2 peft)

want_tools=0
for arg in "$@"; do
  case "$arg" in
    --tools) want_tools=1 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

pip_install_missing() {
  local py_missing=()
  for m in "$@"; do
    python3 -c "import ${m%%=*}" 2>/dev/null || py_missing+=("${m#*=}")
  done
  if [ ${#py_missing[@]} -gt 0 ]; then
    echo "setup: pip installing ${py_missing[*]}"
    python3 -m pip install -q --disable-pip-version-check "${py_missing[@]}"
  fi
}
pip_install_missing "${PIP_TEST[@]}"
if [ "$want_tools" = 1 ]; then
  pip_install_missing "${PIP_TOOLS[@]}"
fi
echo "setup: ok"
