#!/usr/bin/env bash
# Fetch, where the package registry is reachable, the wheels bench/gpu/check.sh installs on the GPU
# machine (Python 3.12 on manylinux x86_64, torch 2.11, onnxruntime and the scientific stack of
# bench/gpu/README.md, but no funasr, deepspeed, hydra, kaldiio or soundfile, and no registry), then
# check that they, the bundled corpus and the rest of the tree that travels fit the device tool's 64 MiB.
#
#   bench/gpu/prepare.sh            # download/build what is missing, then the sizes
#   bench/gpu/prepare.sh --sizes    # the sizes only
#   bench/gpu/prepare.sh --list     # the pinned name==version of every wheel, one a line (no network)
#
# Reads  constraints.txt (every version below but torchaudio's is its pin); the registry;
# writes bench/gpu/wheels/*.whl (ignored by git: the device tool's `carry` takes it there) and
#        bench/gpu/wheels/fallback/*.whl (installed there only where the machine's own does not import).
# Each wheel is skipped when already there. Environment: WHEEL_DIR (bench/gpu/wheels), PYTHON312 (the
# python3.12 that builds the sdists; default pyenv's 3.12.1).
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/../.."
out=${WHEEL_DIR:-bench/gpu/wheels}
limit_mib=64
read -r -a py <<< "${PYTHON312:-env PYENV_VERSION=3.12.1 python3.12}"
die() { echo "prepare.sh: ERROR: $*" >&2; exit 1; }
quiet() {  # command...: without pip's warnings about this machine's extra local indexes (most names lack one)
  "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

# What the stage programs import that the device lacks (the import closure of local.train, local.decode,
# local.compute_fbank and funasr.bin.train_ds, less the device's packages). funasr's own `import funasr`
# tolerates missing modules, so each entry is here for a module the check's path needs:
BINARY=(
  funasr hydra-core omegaconf                                     # the trainer and its config
  pydantic pydantic_core annotated-types typing-inspection hjson  # deepspeed's config classes
  kaldiio librosa soxr audioread decorator pooch platformdirs     # funasr.utils.load_utils imports
  soundfile cffi pycparser                                        # audio reading (libsndfile inside)
  tensorboardX                                                    # funasr's trainer logs TensorBoard
  torch-complex                                                   # funasr's frontends
  RapidFuzz                                                       # SenseVoice's model module imports it
)
# No wheel on the registry for these: built here from the sdist (pure Python).
SOURCE=(
  deepspeed                # no ops prebuilt (DS_BUILD_OPS=0): the device JIT-builds any it needs
  antlr4-python3-runtime   # omegaconf's grammar runtime; 4.9.3 has an sdist only
)
# The device has its own torchaudio (2.11.0+cu130, KINDS.md); this one, built for the same torch and
# CUDA, is installed by check.sh only if that does not import. Not our pin (2.9.1): it must match torch.
FALLBACK=(torchaudio==2.11.0)
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

normal() { local n=${1,,}; echo "${n//[_.]/-}"; }  # a name as pip compares names: case, - _ .
pin() {  # name: name==version as constraints.txt pins it
  local want line name
  want=$(normal "$1")
  while IFS= read -r line; do
    [[ ${line} == *==* ]] || continue
    name=${line%%==*} name=${name,,} name=${name//[_.]/-}
    if [ "${name}" = "${want}" ]; then echo "${line%%[[:space:]#]*}"; return; fi
  done < constraints.txt
  die "$1 has no pin in constraints.txt"
}
have() {  # dir name==version: true when a wheel of that version is in dir (wheel names use _ for - and .)
  local name version
  name=$(echo "${2%%==*}" | tr '.-' '__') version=${2#*==}
  [ -n "$(find "$1" -maxdepth 1 -iname "${name}-${version}-*.whl" -print -quit 2>/dev/null)" ]
}
download() {  # dir name==version
  have "$1" "$2" && { echo "have $2"; return; }
  quiet "${py[@]}" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLATFORMS[@]}" -d "$1" "$2" || die "pip download $2 failed (is the registry reachable?)"
  echo "downloaded $2"
}
build() {  # dir name==version: a wheel from the registry's sdist, built by python3.12
  have "$1" "$2" && { echo "have $2"; return; }
  DS_BUILD_OPS=0 quiet "${py[@]}" -m pip wheel -q --no-deps --no-binary :all: -w "$1" "$2" \
    || die "building a wheel of $2 from its sdist failed"
  echo "built $2"
}
bytes() {  # the total size of the NUL-separated paths on stdin that are files
  python3 -c 'import os, sys
print(sum(os.path.getsize(p) for p in sys.stdin.buffer.read().split(b"\0") if p and os.path.isfile(p)))'
}
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

case ${1:-} in
  --list)
    for name in "${BINARY[@]}" "${SOURCE[@]}"; do pin "${name}"; done
    printf '%s\n' "${FALLBACK[@]}"; exit 0 ;;
  --sizes) ;;
  "")
    "${py[@]}" --version >/dev/null || die "no python3.12 (${py[*]}); set PYTHON312"
    mkdir -p "${out}/fallback"
    for name in "${BINARY[@]}"; do spec=$(pin "${name}"); download "${out}" "${spec}"; done
    for name in "${SOURCE[@]}"; do spec=$(pin "${name}"); build "${out}" "${spec}"; done
    for spec in "${FALLBACK[@]}"; do download "${out}/fallback" "${spec}"; done ;;
  *) echo "usage: $0 [--sizes | --list]" >&2; exit 2 ;;
esac

# What the device tool sends: the tracked and the untracked-but-not-ignored files, plus what `carry` names.
tree=$(git ls-files -z --cached --others --exclude-standard | bytes)
corpus=$(git ls-files -z --cached --others --exclude-standard corpora | bytes)
mkdir -p "${out}"
wheels=$(find "${out}" -name '*.whl' -print0 | bytes)
echo "wheels in ${out}:"
find "${out}" -name '*.whl' -printf '%s %P\n' | sort -k2 | awk '{ printf "  %7.2f MiB  %s\n", $1 / 1048576, $2 }'
total=$((tree + wheels))
echo "wheels $(mib "${wheels}") MiB + working tree $(mib "${tree}") MiB" \
  "(of which corpora/ $(mib "${corpus}") MiB) = $(mib "${total}") MiB of the ${limit_mib} MiB that travel"
[ "${total}" -le $((limit_mib * 1048576)) ] || die "over ${limit_mib} MiB: the device tool would refuse it"
echo "device command: bash bench/gpu/check.sh   (run tool: carry [\"${out}\"], timeout_s 540)"
