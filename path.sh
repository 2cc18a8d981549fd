# Environment of the recipe; sourced by run.sh and by hand before running a local/ program:
#   . ./path.sh && python -m local.prepare_data --help
# shellcheck shell=bash

recipe_root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [ -f "${recipe_root}/.venv/bin/activate" ]; then
  # shellcheck disable=SC1091
  . "${recipe_root}/.venv/bin/activate"
else
  echo "path.sh: ${recipe_root}/.venv is missing; run ./setup.sh first" >&2
fi

export PYTHONPATH=${recipe_root}${PYTHONPATH:+:${PYTHONPATH}}
# NOTE: transcripts and keys are UTF-8 (Mandarin, accents); a C locale must not turn them into errors.
export PYTHONIOENCODING=UTF-8
export LC_ALL=${LC_ALL:-C.UTF-8}
export PYTHONUNBUFFERED=1
# NOTE: every rank is its own process; torch's default of one intra-op thread per core, times
# nproc-per-node processes, oversubscribes the CPU and makes CPU training several times slower.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
# NOTE: the NCCL/torch.distributed variables come from run.sh --comm-profile (local/comm_env.py), which
# keeps any the user set; setting defaults here would look like the user's and block the profile.
# NOTE: the hubs cannot be reached from most clusters' compute nodes; modelscope must not stall on
# telemetry. Downloads happen only where the recipe asks for them.
export MODELSCOPE_LOG_LEVEL=${MODELSCOPE_LOG_LEVEL:-40}
# NOTE: DeepSpeed JIT-builds its CPU communication op into ~/.cache/torch_extensions, shared by every
# venv of the machine; two venvs (another clone's, a CI run's) rebuilt it each time they alternated,
# 1-3.5 minutes of every training start. One folder per venv.
if [ -d "${recipe_root}/.venv" ]; then
  export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$(readlink -f "${recipe_root}/.venv")/torch_extensions}
fi
