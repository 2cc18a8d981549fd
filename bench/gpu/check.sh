#!/usr/bin/env bash
# The GPU check of issue 18, for a machine with Python 3.12, torch and a CUDA GPU but none of our venv
# and no package registry (bench/gpu/README.md): installs the wheels bench/gpu/prepare.sh fetched, then
# runs the recipe's own stage programs as run.sh's stages 0-2 call them (with run.sh's helpers from
# local/run_lib.sh), on the bundled corpus: data preparation; a real-size SenseVoiceSmall with random
# weights in a hub-format model dir (bench/gpu/random_model_dir.py); features; stage 2 with DeepSpeed
# ZeRO-1 bf16 over nccl, then with DDP (bf16 autocast); decoding of the dev set. Prints per run
# utterances/s, seconds of audio per second, model FLOP utilisation, data-wait fraction and peak GPU
# memory, then the decoding RTF (bench/gpu/report.py). One command, under 8 minutes on one H200.
#
#   bench/gpu/check.sh           # on the GPU machine
#   bench/gpu/check.sh --cpu     # the same pipeline on CPU (gloo, a tiny model, one epoch): CHECK_DEVICE=cpu
#
# Environment: PYTHON (python3), CHECK_DIR (exp/gpu_check), CHECK_SITE (where the wheels go, <dir>/site),
# CHECK_INSTALL (false: use PYTHON's packages as they are, e.g. .venv/bin/python), CHECK_NPROC (GPUs, or
# 1 on CPU), CHECK_EPOCHS, CHECK_BATCH_FRAMES, CHECK_WORKERS (the config's num_workers), CHECK_SPEED
# (speed-perturbation factors of stage 1), PEAK_TFLOPS (989, the H200's dense bf16 peak).
# Reads  corpora/, conf/sensevoice_small.yaml, ds_configs/ds_stage1_bf16.json, bench/gpu/wheels/;
# writes $CHECK_DIR/ (data, dump, model dir, exp_deepspeed, exp_ddp, decode_dev, summary.{txt,json}) and,
# when OUT is set (the device tool's folder that comes back), the summary and the logs there.
set -euo pipefail
umask 022
cd "$(dirname "$(readlink -f "$0")")/../.."
root=${PWD}
device=${CHECK_DEVICE:-cuda}
[ "${1:-}" = --cpu ] && device=cpu
[[ ${device} =~ ^(cuda|cpu)$ ]] || { echo "check.sh: CHECK_DEVICE is cuda or cpu, not '${device}'" >&2; exit 2; }
py=$(command -v "${PYTHON:-python3}") || { echo "check.sh: no ${PYTHON:-python3} on PATH" >&2; exit 1; }
work=${CHECK_DIR:-exp/gpu_check}
mkdir -p "${work}/bin"
work=$(readlink -f "${work}")
site=${CHECK_SITE:-${work}/site}
# run_lib's helpers log through the caller's log()
log() { echo -e "$(date '+%Y-%m-%dT%H:%M:%S') (check.sh) [node0] $*" >&2; }
# shellcheck source=local/run_lib.sh
. ./local/run_lib.sh
# --- environment: path.sh's settings without its venv (path.sh would activate ours, and share its
# DeepSpeed op builds, made for another torch: this run has its own TORCH_EXTENSIONS_DIR unless one is
# given). `python` runs PYTHON for run_lib's helpers (a wrapper, not a link: a link to a venv's python
# starts the base interpreter without the venv's packages); PYTHON's bin dir (ninja for DeepSpeed's JIT
# builds) comes next, as in an activated venv.
printf '#!/bin/sh\nexec %q "$@"\n' "${py}" > "${work}/bin/python"
chmod +x "${work}/bin/python"
py_bin=$(dirname "${py}")
export PATH=${work}/bin:${py_bin}:${PATH}
export PYTHONPATH=${site}:${root}${PYTHONPATH:+:${PYTHONPATH}}
export PYTHONIOENCODING=UTF-8 LC_ALL=${LC_ALL:-C.UTF-8} PYTHONUNBUFFERED=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
export MODELSCOPE_LOG_LEVEL=${MODELSCOPE_LOG_LEVEL:-40} NODE_RANK=0
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-${work}/torch_extensions}

phases=${work}/phases.json
echo "{}" > "${phases}"
phase_start=${SECONDS}
phase() {  # name: the seconds since the last phase() (or the start) go to phases.json under name
  python -c 'import json, sys; d = json.load(open(sys.argv[1])); d[sys.argv[2]] = int(sys.argv[3])
json.dump(d, open(sys.argv[1], "w"))' "${phases}" "$1" "$((SECONDS - phase_start))"
  phase_start=${SECONDS}
}
copy_out() {  # into the device tool's $OUT (at most 8 files come back), whatever the outcome
  [ -n "${OUT:-}" ] && [ -d "${OUT}" ] || return 0
  local f
  for f in summary.txt summary.json phases.json exp_deepspeed/train.log exp_ddp/train.log \
      decode_dev/log/decode.0.log; do
    [ ! -f "${work}/${f}" ] || cp "${work}/${f}" "${OUT}/$(echo "${f}" | tr / _)"
  done
}
trap copy_out EXIT

install_wheels() {  # the wheel set into $site (no index: there is no registry); a fallback wheel only where
  # this machine's own package does not import
  local wheels=(bench/gpu/wheels/*.whl) fallback=() listing w module version
  [ -e "${wheels[0]}" ] || { log "ERROR: no wheels in bench/gpu/wheels: run bench/gpu/prepare.sh where the" \
    "package registry is reachable, then carry bench/gpu/wheels"; exit 1; }
  listing=$(ls -l bench/gpu/wheels bench/gpu/wheels/fallback 2>/dev/null || true)
  if [ -f "${site}/.wheels" ] && [ "$(cat "${site}/.wheels")" = "${listing}" ]; then
    log "the wheels are installed in ${site} already"; return 0
  fi
  for w in bench/gpu/wheels/fallback/*.whl; do
    [ -e "${w}" ] || continue
    module=${w##*/}; module=${module%%-*}
    if version=$(PYTHONPATH='' "${py}" -c "import ${module}; print(${module}.__version__)" 2>/dev/null); then
      log "${module} ${version}: this machine's own"
    else
      log "${module} does not import here: installing ${w##*/}"; fallback+=("${w}")
    fi
  done
  rm -rf "${site}"
  log "installing ${#wheels[@]} wheels (and ${#fallback[@]} fallback) into ${site}"
  "${py}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "${site}" \
    "${wheels[@]}" "${fallback[@]}"
  echo "${listing}" > "${site}/.wheels"
}

# --- the run's sizes: the GPU one as issue 18 asks (GPU batch sizes, a real-size model, a few hundred
# steps); the CPU one as small as still shows every stage work.
if [ "${device}" = cuda ]; then
  # Nine speed-perturbed copies of the 2000 training clips: about 40 steps of 20,000 frames an epoch.
  # Each epoch ends with funasr writing three checkpoints (DeepSpeed's 3.3 GB each): few epochs, long ones.
  size=released epochs=${CHECK_EPOCHS:-2} batch=${CHECK_BATCH_FRAMES:-20000} interval=4
  speed=${CHECK_SPEED:-0.8 0.85 0.9 0.95 1.0 1.05 1.1 1.15 1.2}
  nj=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # GNU nproc obeys OMP_NUM_THREADS, set to 1 above
else
  size=tiny epochs=${CHECK_EPOCHS:-1} batch=${CHECK_BATCH_FRAMES:-6000} interval=2 speed=${CHECK_SPEED:-1.0}
  nj=$(( $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) < 2 ? 1 : 2 ))
  export DS_ACCELERATOR=cpu  # as run.sh does on CPU: gloo through torch.distributed, no CUDA
fi
config=conf/sensevoice_small.yaml tag=sensevoice_small
data=${work}/data dump=${work}/dump model=${work}/model_${size}
# The recipe's hooks stay on; --max-bad-steps 0 because random weights may have a bad step, which this
# measurement skips rather than stops at. One checkpoint kept, one averaged: the disk and the time.
# disable_update: funasr's trainer builds its AutoModel without it, which then asks PyPI for funasr's
# latest version (requests.get, no timeout): with no network that can hang until the connect times out.
overrides=("++train_conf.max_epoch=${epochs}" "++train_conf.log_interval=${interval}"
  "++dataset_conf.batch_size=${batch}" ++train_conf.keep_nbest_models=1 ++train_conf.avg_nbest_model=1
  ++disable_update=true)
[ -z "${CHECK_WORKERS:-}" ] || overrides+=("++dataset_conf.num_workers=${CHECK_WORKERS}")
corpus_field() { python -m local.corpus_info --data-dir "${data}" "$@"; }

stage0() {  # run.sh's stage 0 for the bundled corpus: recipe, validation of each set, overlap report
  local fp=gpu-check-stage0 set
  if is_done "${data}/.done" "${fp}"; then log "${data} is done; skipping"; return 0; fi
  mkdir -p "${data}/log"
  python -m recipes.fsdd.prepare --data-dir "${data}" 2>&1 | tee "${data}/log/recipe.log" >&2
  for set in $(corpus_field sets); do
    validate_set "${data}/${set}" "${data}" "${fp}" --nj "${nj}" --strict false --allow-pipes false \
      --max-duration 60
  done
  python -m local.prepare_data --overlap --data-dir "${data}" --sets "$(corpus_field sets)" --strict false
  mark_done "${data}/.done" "${fp}"
}

stage1() {  # run.sh's stage 1: every process a slice of the shards, then the merge (with the model dir's
  # tokenizer for the target-length check, as for a fine-tune)
  local opts fp
  opts=(--config "${config}" --data-dir "${data}" --dump-dir "${dump}" --sets "$(corpus_field sets)"
    --train-set "$(corpus_field train_set)" --speed-perturb "${speed}" --strict false)
  fp=$(fingerprint --markers "${data}/.done" "${model}/.done" -- "${opts[@]}" "${nj}")
  if is_done "${dump}/.done" "${fp}"; then log "${dump} is done; skipping"; return 0; fi
  mkdir -p "${dump}/log"
  run_node_procs "${nj}" 0 "${dump}/log/fbank" python -m local.compute_fbank work "${opts[@]}" \
    --world-size "${nj}" -- || exit 1
  python -m local.compute_fbank merge "${opts[@]}" --world-size "${nj}" --wait-timeout 600 \
    --tokenizer-dir "${dump}/tokenizer/${tag}" --pretrained-dir "${model}" -- 2>&1 \
    | tee "${dump}/log/merge.log" >&2
  mark_done "${dump}/.done" "${fp}"
}

train() {  # engine: run.sh's stage 2, fine-tuning the model dir, into $work/exp_<engine> (from scratch)
  local engine=$1 exp=${work}/exp_$1 opts extra=() port rc=0
  # DeepSpeed's bf16 is in its JSON; DDP gets funasr's bf16 autocast (fp32 weights), not fp32 steps.
  [ "${engine}" = ddp ] && extra=(++train_conf.use_bf16=true)
  rm -rf "${exp}"; mkdir -p "${exp}/log"
  opts=(--config "${config}" --exp-dir "${exp}" --data-dir "${data}" --dump-dir "${dump}"
    --train-set "$(corpus_field train_set)" --valid-set "$(corpus_field valid_set)" --feats-type fbank
    --train-engine "${engine}" --ds-config ds_configs/ds_stage1_bf16.json --device "${device}" --strict false
    --pretrained-dir "${model}")
  port=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  log "torchrun: 1 node x ${nproc} ${device} process(es), ${engine}; log in ${exp}/train.log"
  train_on_node "${exp}/train.log" "${exp}/.nodes" "gpu-check-${engine}" 0 \
    python -m torch.distributed.run --nnodes 1 --node-rank 0 --master-addr 127.0.0.1 --master-port "${port}" \
    --nproc-per-node "${nproc}" -m local.train "${opts[@]}" --max-bad-steps 0 \
    -- "${overrides[@]}" "${extra[@]}" || rc=$?
  rm -rf "${exp}"/model.pt*  # checkpoints of random weights: gigabytes of disk, of no further use
  return "${rc}"
}

decode() {  # stage 3's decoding of the dev set with the model dir, one process, on the device
  local out=${work}/decode_dev
  rm -rf "${out}"; mkdir -p "${out}/log"
  run_node_procs 1 0 "${out}/log/decode" python -m local.decode work --model-dir "${model}" \
    --data-jsonl "${data}/$(corpus_field valid_set)/data.jsonl" --out "${out}" --world-size 1 \
    --device "${device}" --batch-size 32
}

log "GPU check on ${device}: ${py} ($("${py}" --version 2>&1)); work dir ${work}"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >&2
fi
if [ "${CHECK_INSTALL:-true}" = true ]; then install_wheels; fi
phase install
python -m bench.gpu.imports --site "${site}"
phase imports
if [ "${device}" = cuda ]; then
  nproc=${CHECK_NPROC:-$(python -c 'import torch; print(torch.cuda.device_count())')}
  [ "${nproc}" -gt 0 ] || { log "ERROR: torch sees no CUDA GPU (check.sh --cpu runs on CPU)"; exit 1; }
else
  nproc=${CHECK_NPROC:-1}
fi
apply_comm_profile default ""
stage0
phase stage0
python -m bench.gpu.random_model_dir --data-jsonl "${data}/$(corpus_field train_set)/data.jsonl" \
  --out "${model}" --size "${size}"
phase model_dir
stage1
phase stage1
# Each run on its own: a failed one is reported, and the others still run and are measured.
failed=() runs=() decode_args=()
for engine in deepspeed ddp; do
  if train "${engine}"; then runs+=(--train "${engine}=${work}/exp_${engine}/train.log")
  else log "ERROR: training with ${engine} failed: ${work}/exp_${engine}/train.log"; failed+=("${engine}"); fi
  phase "train_${engine}"
done
if decode; then decode_args=(--decode "${work}/decode_dev"); else failed+=(decode); fi
phase decode
python -m bench.gpu.report --model-dir "${model}" --world-size "${nproc}" --peak-tflops "${PEAK_TFLOPS:-989}" \
  "${runs[@]}" "${decode_args[@]}" --extra "phases_s=${phases}" --json "${work}/summary.json" \
  | tee "${work}/summary.txt"
log "phases (s): $(cat "${phases}"); total ${SECONDS} s"
[ ${#failed[@]} -eq 0 ] || { log "ERROR: failed: ${failed[*]}"; exit 1; }
