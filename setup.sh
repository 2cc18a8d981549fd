#!/usr/bin/env bash
# One idempotent set-up step: system packages (when root), then a Python venv built from
# requirements.txt + constraints.txt, linked as ./.venv.
#
#   ./setup.sh            # minutes the first time on a machine, about a second afterwards
#
# NOTE: torch/torchaudio from PyPI are CUDA builds (~7 GB installed). The venv therefore lives in a
# cache keyed by the hash of the requirement files ($RECIPE_VENV_CACHE, default
# ~/.cache/funasr-recipe/venvs/<python>-<hash>) and every clone of the repo with the same
# requirements (a CI checkout, a second work tree) links to it instead of installing again.
set -euo pipefail

log() {
  local fname=${BASH_SOURCE[1]##*/}
  echo -e "$(date '+%Y-%m-%dT%H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) $*" >&2
}

help_message="Usage: $0 [--python PYTHON] [--force]
  --python PYTHON   interpreter for the venv (default: \$PYTHON, else python3.11, else python3)
  --force           rebuild the cached venv even if it is complete"

python=${PYTHON:-}   # interpreter used to create the venv
force=false          # rebuild even when a complete venv exists
while [ $# -gt 0 ]; do
  case $1 in
    --python) python=$2; shift 2 ;;
    --force) force=true; shift ;;
    -h|--help) echo "${help_message}"; exit 0 ;;
    *) echo "${help_message}" >&2; echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

cd "$(dirname "$(readlink -f "$0")")"

if [ -z "${python}" ]; then
  python=$(command -v python3.11 || command -v python3 || true)
fi
[ -n "${python}" ] || { log "no python3 found; install Python 3.11"; exit 1; }
pyver=$("${python}" -c 'import sys; print("py%d%d" % sys.version_info[:2])')
[ "${pyver}" = py311 ] || log "WARNING: the pins were tested on Python 3.11, this is ${pyver}"

# --- system packages: g++ builds DeepSpeed's JIT ops on first use; libsndfile comes with the
# soundfile wheel, the Debian package is only a fallback for hosts where the wheel lacks it; shellcheck
# lints the shell scripts in the tests (tests/unit/repo/test_style.py); chromium is the browser that the web
# page's test drives through playwright (playwright's own browser download cannot be had offline).
need_apt=()
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
command -v shellcheck >/dev/null 2>&1 || need_apt+=(shellcheck)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
# slurmd, slurmctld and munge: tests/e2e/test_slurm_real.py starts its own Slurm 22.05 (skipped without them)
command -v slurmd >/dev/null 2>&1 || need_apt+=(slurmd slurmctld slurm-client munge)
if ! grep -q libsndfile <<< "$(ldconfig -p 2>/dev/null || true)"; then need_apt+=(libsndfile1); fi  # a here-string: `ldconfig | grep -q` fails under pipefail (SIGPIPE)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing system packages: ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    log "WARNING: missing system packages (${need_apt[*]}); install them (as root: apt-get install ${need_apt[*]})"
  fi
fi

# --- the venv, keyed by the requirement files -----------------------------------------------------
key=$(cat requirements.txt constraints.txt | sha256sum | cut -c1-16)
cache=${RECIPE_VENV_CACHE:-${HOME}/.cache/funasr-recipe/venvs}
venv=${cache}/${pyver}-${key}
mkdir -p "${cache}"

# NOTE: a venv is not relocatable (its scripts carry absolute paths), so it is built in place under
# an exclusive lock: two set-ups racing (two CI jobs) build once, the second waits and reuses it.
exec 9>"${venv}.lock"
flock 9
if ${force} || [ ! -f "${venv}/.complete" ]; then
  log "building ${venv} (first time for these requirements: several minutes, ~8 GB)"
  rm -rf "${venv}"
  "${python}" -m venv "${venv}"
  "${venv}/bin/python" -m pip install -q --upgrade pip
  "${venv}/bin/python" -m pip install -q -r requirements.txt -c constraints.txt
  "${venv}/bin/python" -c "import torch, torchaudio, funasr, deepspeed, soundfile, hydra" \
    || { log "the new venv does not import the core packages"; exit 1; }
  # NOTE: on a CPU host DeepSpeed JIT-builds its shared-memory comm op at the first training and cpu_adam at
  # the first offload run (1-5 minutes with g++): built once here, into the venv's folder that path.sh
  # names, not inside a user's first run or a timed test. A failure only defers the build to first use.
  log "building DeepSpeed's CPU ops into ${venv}/torch_extensions"
  PATH="${venv}/bin:${PATH}" DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR="${venv}/torch_extensions" "${venv}/bin/python" -c \
    "from deepspeed.ops.op_builder.cpu import CPUAdamBuilder, ShareMemCommBuilder
for b in (ShareMemCommBuilder(), CPUAdamBuilder()): b.load()" >/dev/null 2>&1 \
    || log "WARNING: DeepSpeed's CPU ops did not build now; the first training builds them (needs g++)"
  date > "${venv}/.complete"
else
  log "venv ${venv} is complete; reusing it"
fi
flock -u 9

ln -sfn "${venv}" .venv
log "ready: source path.sh (run.sh does) to use .venv"
