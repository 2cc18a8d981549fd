#!/usr/bin/env bash
# Fine-tune FunASR models (SenseVoiceSmall, Paraformer, Conformer-CTC) with DeepSpeed, Kaldi style.
# Run the SAME command on every node; node options come from the flags, the environment
# (NNODES/NODE_RANK/MASTER_ADDR/MASTER_PORT) or Slurm (SLURM_NNODES/SLURM_NODEID).
#
#   ./run.sh                                   # every stage on the bundled digit corpus (CPU ok)
#   ./run.sh --stage 0 --stop-stage 0 --corpus kaldi --corpus-dir /path/to/kaldi/dirs
#   ./run.sh --config conf/sensevoice_small.yaml --nnodes 4 --node-rank $R --master-addr 10.0.0.1 \
#       -- ++dataset_conf.batch_size=8000      # everything after -- goes to the trainer (Hydra)
set -euo pipefail
# Files 0644 and dirs 0755 whatever the caller's umask: at 000 everything in data/ and exp/ would be
# world-writable, and the trainer loads pickled checkpoints from there.
umask 022

log() {
  local fname=${BASH_SOURCE[1]##*/}
  echo -e "$(date '+%Y-%m-%dT%H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) [node${node_rank:-?}] $*" >&2
}
SECONDS=0
run_args=("$@")  # kept for the replay script

start_dir=${PWD}
# NOTE: resolved before the cd below: "$0" may be a path relative to where run.sh was started.
run_sh=$(readlink -f "$0")
cd "$(dirname "${run_sh}")"
# NOTE: GNU nproc obeys OMP_NUM_THREADS, which path.sh sets to 1 for the ranks; count cores without it.
ncpu=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # the CPU cores of this machine

# ---- options (every option is --name value; --name-with-dashes and --name_with_underscores both work)
# -- Stages, model, experiment
stage=0                 # first stage to run (-1 preflight alone, 0 data, 1 features, 2 train, 3 decode, 4 export, 5 package, 6 serve)
stop_stage=5            # last stage to run (6: the HTTP service, which runs until stopped)
config=conf/tiny_sensevoice.yaml  # model + training config (Hydra yaml) in conf/
exp_dir=                # experiment dir (empty: exp/<config name>)
# -- Stage 0: data preparation and validation
corpus=fsdd             # corpus recipe, a folder of recipes/: your data (kaldi jsonl lhotse audiofolder) or a public corpus (fsdd speechocean762 mandarin_syllables aishell1 librispeech)
corpus_dir=             # corpus root in its upstream layout (empty: the recipe's default; fsdd: the bundled copy)
prep_opts=              # extra options for the corpus recipe, e.g. "--dev-speakers theo,lucas"
data_dir=data           # Kaldi data dirs and JSONL (stage 0)
nj=${ncpu}              # CPU processes per node for data preparation and features (the same on every node)
strict=false            # true: stop at the first bad utterance instead of rejecting it
allow_pipes=false       # true: accept Kaldi pipe entries ("cmd |") in wav.scp
max_duration=60         # utterances longer than this many seconds are rejected
# -- Stage 1: features
dump_dir=dump           # features (stage 1)
speed_perturb="0.9 1.0 1.1"  # speed factors for extra training copies (stage 1); "1.0" for none
shard_size=1000         # utterances per feature shard: the unit of work and of resumption (stage 1)
feats_type=fbank        # fbank: train on stage-1 features; raw: funasr decodes audio every epoch
# -- Stage 2: training
train_engine=deepspeed  # deepspeed (ZeRO, --ds-config) or ddp (torch DistributedDataParallel)
ds_config=ds_configs/ds_stage1_bf16.json  # DeepSpeed JSON: ZeRO stage 1/2/3 in bf16 (3 also offloaded to CPU memory), or stage 1 in fp16 (docs/zero_stages.md)
pretrained_dir=         # local copy of the config's pretrained_model (empty: ModelScope cache or download)
local_cache=            # node-local dir (NVMe, /dev/shm): each node copies the shards stage 2 reads there first (empty: reads dump/)
grad_checkpoint=false   # true: recompute the encoder's activations in backward (less memory, slower steps)
oom_probe=true          # true: run the largest batches of epoch 0 once before training, to fail fast on OOM
memory_limit_gib=       # memory per process the OOM probe allows (empty: the GPU's; on CPU host RAM / processes)
max_bad_steps=10        # bad steps in a row (non-finite or exploding loss or gradient; each is skipped) that stop training (0: never)
restart=false           # true: stage 2 starts over, moving the old run to <exp>/superseded/<time>/ (else a run under other settings is refused)
# -- Fine-tuning: replay, frozen layers, adapters, regression gate (stages 0, 2, 3)
replay_dir=             # fine-tune: sets (Kaldi dir or .jsonl[.gz]) of general data mixed into every epoch, e.g. the old languages (repeatable); none: no replay (default with --regression-dir: the training set a model dir of this recipe records)
replay_ratio=auto       # replay utterances per new one, drawn anew each epoch; auto: 3 for the replay run.sh picks itself (bench_adapt), else 1
pseudo_label_dir=       # fine-tune: a Kaldi dir of audio whose transcripts are gone, labelled by the pretrained model as replay
pseudo_min_logprob=-0.3 # pseudo-labels whose mean token log-probability is below this are left out (and counted)
freeze=                 # fine-tune: comma-separated parameter prefixes that keep their weights (funasr's freeze_param), e.g. encoder
adapter=none            # none, or lora: only LoRA adapters train; stage 3 merges them, so decoding and export are unchanged
lora_rank=8             # rank of the LoRA adapters (alpha = 2 x rank)
lora_targets=linear_q_k_v,linear_out,w_1,w_2  # linear layers that get adapters: bare names the encoder's, dotted suffixes or regexes any
regression_dir=         # fine-tune: sets (Kaldi dir or .jsonl[.gz]) that must not get worse (per language; utt2lang if not the corpus's) (repeatable)
max_regression=1.0      # absolute error-rate points a --regression-dir may lose before the gate fails (stage 3)
regression_fatal=true   # true: run.sh exits 1 naming the set when the gate fails; false: it only warns
# -- Stage 3: decoding and scoring
decode_dir=             # extra sets (a Kaldi dir or a FunASR .jsonl[.gz]) to decode and score in stage 3 (repeat the option for several)
decode_batch_size=32    # utterances per decoding batch at most (stage 3)
# -- Cluster: nodes, processes, network
nnodes=${NNODES:-${SLURM_NNODES:-1}}           # number of nodes
node_rank=${NODE_RANK:-${SLURM_NODEID:-0}}     # rank of this node, 0..nnodes-1
master_addr=${MASTER_ADDR:-}                   # address of node 0 (empty: the first node of the Slurm job, else 127.0.0.1)
master_port=${MASTER_PORT:-29500}              # port on node 0 (rendezvous)
nproc_per_node=auto     # processes per node: auto = one per GPU, else one per CPU core (at most 8)
wait_timeout=7200       # seconds a node waits for node 0 to finish a node-0-only stage, or for the other nodes
preflight=true          # true: stage 2 first checks that the nodes agree (code, packages, config, data, shared dirs)
comm_profile=default    # NCCL/torch.distributed variables: default, ethernet, infiniband or debug (yours are kept)
socket_ifname=          # network interface the nodes reach each other on (NCCL_SOCKET_IFNAME), e.g. ib0
# -- Monitoring (stage 2)
metrics_port=0          # Prometheus endpoint on local rank 0 of each node while training (0: off)
# -- Stage 6: HTTP service
serve_host=127.0.0.1    # address the HTTP service listens on (stage 6; 0.0.0.0: every interface)
serve_port=8000         # port of the HTTP service (stage 6)
serve_precision=fp32    # fp32 (model.onnx) or int8 (model_quant.onnx): the model the HTTP service runs (stage 6)
# ---- end of options

. ./local/run_lib.sh  # only functions (no command runs): sourced before path.sh
. ./local/run_options.sh  # the option block's --help, parsing and checks
usage_error() { echo "${help_message}" >&2; echo >&2; echo "ERROR: $*" >&2; exit 2; }
parse_options "${run_sh}" "$0" "$@"  # sets the options, option_names, help_message, hydra_overrides, replay_args

# A relative --corpus-dir means relative to where run.sh was started; everything else is relative to
# the recipe root, where run.sh runs (Kaldi's convention, also for relative paths inside wav.scp).
[ -n "${corpus_dir}" ] && [[ ${corpus_dir} != /* ]] && corpus_dir=$(cd "${start_dir}" && realpath -m "${corpus_dir}")

check_options  # local/run_lib.sh: every option's value, before anything runs
if [ -z "${master_addr}" ] && [ -n "${SLURM_JOB_NODELIST:-}" ] && command -v scontrol >/dev/null; then
  master_addr=$(scontrol show hostnames "${SLURM_JOB_NODELIST}" | head -n1)
fi
master_addr=${master_addr:-127.0.0.1}

export NODE_RANK=${node_rank}  # the Python programs put it in every log line
tag=$(basename "${config}" .yaml)
exp_dir=${exp_dir:-exp/${tag}}
mkdir -p "${exp_dir}/log"

. ./path.sh
# Before any stage: the overrides (unknown keys, types), the DeepSpeed JSON, the am.mvn files; all problems, exit 2
check_config "${config}" "${pretrained_dir}" "$([ "${train_engine}" = deepspeed ] && echo "${ds_config}")" \
  "$([ "${stage}" -ge 2 ] && echo "${dump_dir}")" "${data_dir}" "${hydra_overrides[@]}"

# NOTE: torch's count honours CUDA_VISIBLE_DEVICES; checking for nvidia-smi first spares CPU hosts the torch import.
ngpu=0
command -v nvidia-smi >/dev/null && ngpu=$(python -c 'import torch; print(torch.cuda.device_count())' || echo 0)
device=cpu; [ "${ngpu}" -gt 0 ] && device=cuda
if [ "${nproc_per_node}" = auto ]; then
  if [ "${device}" = cuda ]; then nproc_per_node=${ngpu}; else nproc_per_node=$(( ncpu < 8 ? ncpu : 8 )); fi
fi
[[ ${nproc_per_node} =~ ^[1-9][0-9]*$ ]] || usage_error "--nproc-per-node must be auto or a positive integer"

trap_signals
# A fine-tune with a regression set and no replay source replays the data its model records (default_replay).
if [ -z "${replay_dir}${pseudo_label_dir}" ] && [ -n "${regression_dir}" ] && [ -n "${pretrained_dir}" ]; then
  [ "${replay_ratio}" != auto ] || replay_ratio=3  # bench_adapt: at 1 a fine-tune cost the old speakers up to +3 points
  replay_dir=$(default_replay "${config}" "${pretrained_dir}" "${replay_ratio}") || exit 1
fi
[ "${replay_ratio}" != auto ] || replay_ratio=1
[ "${replay_dir}" != none ] || replay_dir=
# The sets the fine-tune options add (set_names: the names import_dirs gives them in data/ and dump/).
replay_sets=$(set_names replay "${replay_dir}")$([ -z "${pseudo_label_dir}" ] || set_names pseudo "${pseudo_label_dir}")
regress_sets=$(set_names regress "${regression_dir}")
warn_world_writable "${data_dir}" "${dump_dir}" "${exp_dir}" "$(dirname "${exp_dir}")"

log "$0 ${run_args[*]}"
log "node ${node_rank}/${nnodes}, master ${master_addr}:${master_port}, ${nproc_per_node} ${device} processes per node, exp ${exp_dir}"

# The replay script's arguments: every option given but the stages and --node-rank, then the overrides.
replay() { write_replay "${exp_dir}" "$1" "${stop_stage}" "${#replay_args[@]}" "${replay_args[@]}" "${hydra_overrides[@]}"; }
corpus_field() { python -m local.corpus_info --data-dir "${data_dir}" "$@"; }
pretrained_model() { resolve_pretrained "${config}" "${pretrained_dir}" "${hydra_overrides[@]}"; }  # its dir, or empty
stage_begins() {  # n "what: inputs -> outputs" [marker the stage needs]: announce, replay script, check
  log "Stage $1: $2"
  replay "$1"
  if [ $# -ge 3 ] && [ ! -f "$3" ]; then log "ERROR: $3 is missing: run stage $(($1 - 1)) first"; exit 1; fi
}
preflight_ran=false
run_preflight() {  # every node: do they agree with node 0, is exp/ shared, bandwidth -> exp/<tag>/preflight.json
  local n  # the resolved options, not the command lines: NNODES in one node's environment and --nnodes agree
  preflight_node "${exp_dir}" "${node_rank}" "$(for n in ${option_names}; do case ${n} in stage|stop_stage|node_rank|local_cache) ;;
      *) printf '%s=%q ' "${n}" "${!n}" ;; esac; done)-- ${hydra_overrides[*]}" --nnodes "${nnodes}" --master-addr "${master_addr}" \
    --master-port "${master_port}" --nproc-per-node "${nproc_per_node}" --device "${device}" --config "${config}" \
    --ds-config "${ds_config}" --data-dir "${data_dir}" --dump-dir "${dump_dir}" --timeout "${wait_timeout}"
  preflight_ran=true
}

# Stage 0's validation options, for the corpus's sets and the --*-dir options' alike (--nj first: not fingerprinted).
check_opts=(--nj "${nj}" --strict "${strict}" --allow-pipes "${allow_pipes}" --max-duration "${max_duration}")
import_dirs() { import_kaldi_dirs "$@" "${data_dir}" "${start_dir}" "${node_rank}" "${wait_timeout}" "${check_opts[@]}"; }

if [ "${stage}" -le -1 ] && [ "${stop_stage}" -ge -1 ]; then
  stage_begins -1 "preflight: code, packages, config, data, shared dirs, resources, bandwidth -> ${exp_dir}/preflight.json"
  apply_comm_profile "${comm_profile}" "${socket_ifname}"
  run_preflight
fi

if [ "${stage}" -le 0 ] && [ "${stop_stage}" -ge 0 ]; then
  stage_begins 0 "data preparation: ${corpus} (${corpus_dir:-recipe default}) -> ${data_dir}/<set>/{data.jsonl,report.json}"
  recipe_fp=$(fingerprint -- "${corpus}" "${corpus_dir}" "${prep_opts}")
  stage0_fp=$(fingerprint -- "${recipe_fp}" "${check_opts[@]:2}" ${replay_dir:+"${replay_dir}"} \
    ${pseudo_label_dir:+"${pseudo_label_dir}" "${pseudo_min_logprob}"})  # as before for a run without them
  if [ -n "${pseudo_label_dir}" ]; then  # every process of every node transcribes its share
    model=$(pretrained_model) || exit 1
    [ -n "${model}" ] || usage_error "--pseudo-label-dir needs a pretrained model to label with (--pretrained-dir)"
    pseudo_labels "$(cd "${start_dir}" && realpath -m "${pseudo_label_dir}")" "${model}" "${data_dir}/pseudo_labels" \
      "${nproc_per_node}" "${node_rank}" "${nnodes}" "${device}" "${decode_batch_size}" "${pseudo_min_logprob}" "${wait_timeout}"
  fi
  if [ "${node_rank}" -ne 0 ]; then
    wait_for_node0 "${data_dir}/.done" "${stage0_fp}" "stage 0" "${wait_timeout}"
  elif is_done "${data_dir}/.done" "${stage0_fp}" && python -m local.marker sources check "${data_dir}" 2>/dev/null; then
    log "${data_dir} is done; skipping (remove ${data_dir}/.done to redo)"
  else
    rm -f "${data_dir}/.done"  # first: a node waiting on it must not take the last run's for this one's
    # A corpus file edited since the last run (the check says which) makes the recipe read it all again.
    python -m local.marker sources check "${data_dir}" || rm -f "${data_dir}/.recipe.done"
    mkdir -p "${data_dir}/log"
    if ! is_done "${data_dir}/.recipe.done" "${recipe_fp}"; then
      log "recipes/${corpus}: log in ${data_dir}/log/recipe.log"
      # shellcheck disable=SC2086  # prep_opts is a list of options
      python -m "recipes.${corpus}.prepare" ${corpus_dir:+--corpus-dir "${corpus_dir}"} \
        --data-dir "${data_dir}" ${prep_opts} 2>&1 | tee "${data_dir}/log/recipe.log" >&2
      mark_done "${data_dir}/.recipe.done" "${recipe_fp}"
    fi
    python -m local.marker sources write "${data_dir}"
    for set in $(corpus_field sets); do
      validate_set "${data_dir}/${set}" "${data_dir}" \
        "$(set_fingerprint "${data_dir}/${set}" "${data_dir}" "${stage0_fp}")" "${check_opts[@]}"
    done
    import_dirs --replay-dir replay "${replay_dir}"
    [ -z "${pseudo_label_dir}" ] || import_dirs --pseudo-label-dir pseudo "${data_dir}/pseudo_labels/$(basename "${pseudo_label_dir}")"
    python -m local.prepare_data --overlap --data-dir "${data_dir}" --sets "$(corpus_field sets) ${replay_sets}" --strict "${strict}"
    mark_done "${data_dir}/.done" "${stage0_fp}"
  fi
fi

if [ "${stage}" -le 1 ] && [ "${stop_stage}" -ge 1 ]; then
  stage_begins 1 "fbank features, CMVN, tokenizer: ${data_dir}/<set>/data.jsonl -> ${dump_dir}/<set>/" \
    "${data_dir}/.done"
  fbank_opts=(--config "${config}" --data-dir "${data_dir}" --dump-dir "${dump_dir}" --sets "$(corpus_field sets) ${replay_sets}"
    --train-set "$(corpus_field train_set)" --speed-perturb "${speed_perturb}" --shard-size "${shard_size}"
    --strict "${strict}")
  stage1_fp=$(fingerprint --markers "${data_dir}/.done" --contents "${config}" "${data_dir}/.sources.tsv" \
    -- "${fbank_opts[@]}" "${pretrained_dir}" "${hydra_overrides[@]}")
  if is_done "${dump_dir}/.done" "${stage1_fp}" && dump_is_sound "${node_rank}" "${fbank_opts[@]}"; then
    log "${dump_dir} is done; skipping (remove ${dump_dir}/.done to redo; finished shards are kept)"
  else
    # Every process of every node computes its own slice of the shards; then node 0 merges.
    mkdir -p "${dump_dir}/log"
    world=$((nnodes * nj))
    log "computing fbank with ${nj} processes on this node (${world} in all); logs in ${dump_dir}/log/fbank.<rank>.log"
    run_node_procs "${nj}" "${node_rank}" "${dump_dir}/log/fbank" python -m local.compute_fbank work \
      "${fbank_opts[@]}" --world-size "${world}" -- "${hydra_overrides[@]}" || exit 1
    if [ "${node_rank}" -eq 0 ]; then
      # The pretrained model's tokenizer tells which transcripts are too long for their audio (CTC).
      pretrained=$(pretrained_model) || exit 1
      python -m local.compute_fbank merge "${fbank_opts[@]}" --world-size "${world}" --wait-timeout "${wait_timeout}" \
        --tokenizer-dir "${dump_dir}/tokenizer/${tag}" ${pretrained:+--pretrained-dir "${pretrained}"} \
        -- "${hydra_overrides[@]}" 2>&1 | tee "${dump_dir}/log/merge.log" >&2
      mark_done "${dump_dir}/.done" "${stage1_fp}"
    else
      wait_for_node0 "${dump_dir}/.done" "${stage1_fp}" "stage 1" "${wait_timeout}"
    fi
  fi
fi

if [ "${stage}" -le 2 ] && [ "${stop_stage}" -ge 2 ]; then
  stage_begins 2 "training (${config}): ${dump_dir}/ -> ${exp_dir}/" "${dump_dir}/.done"
  [ -f "${ds_config}" ] || usage_error "--ds-config ${ds_config}: no such file (have: $(echo ds_configs/*.json))"
  train_opts=(--config "${config}" --exp-dir "${exp_dir}" --data-dir "${data_dir}" --dump-dir "${dump_dir}"
    --train-set "$(corpus_field train_set)" --valid-set "$(corpus_field valid_set)"
    --feats-type "${feats_type}" --train-engine "${train_engine}" --ds-config "${ds_config}" --device "${device}"
    --strict "${strict}")
  # The fine-tune's safeguards only when asked for: a run without them keeps the fingerprint it had.
  [ -z "${replay_sets}" ] || train_opts+=(--replay-sets "${replay_sets}" --replay-ratio "${replay_ratio}")
  [ -z "${freeze}" ] || train_opts+=(--freeze "${freeze}")
  [ "${adapter}" = none ] || train_opts+=(--adapter "${adapter}" --lora-rank "${lora_rank}" --lora-targets "${lora_targets}")
  # Each node resolves the pretrained model itself (a hub download lands in the node's own cache).
  pretrained=$(pretrained_model) || exit 1
  [ -n "${pretrained}" ] || [ "${adapter}${replay_sets}" = none ] || usage_error "--adapter lora and replay need a pretrained model (--pretrained-dir)"
  [ -n "${pretrained}" ] && { train_opts+=(--pretrained-dir "${pretrained}")
    log "fine-tuning $(python -m local.resolve_model --describe "${pretrained}")"; }
  stage2_fp=$(fingerprint --markers "${dump_dir}/.done" --contents "${config}" "${ds_config}" -- "${train_opts[@]}" \
    "${nnodes}" "${nproc_per_node}" "${hydra_overrides[@]}")
  if is_done "${exp_dir}/.train.done" "${stage2_fp}"; then
    log "${exp_dir} is trained; skipping (remove ${exp_dir}/.train.done to train again)"
  else
    check_resume "${exp_dir}" "${node_rank}" "${restart}" "$((nnodes * nproc_per_node))" "${config}" \
      "$([ "${train_engine}" = deepspeed ] && echo "${ds_config}")" "${dump_dir}/.done" "${pretrained}" \
      "$(printf '%q ' "${train_opts[@]}")" "${hydra_overrides[@]}"
    train_log=${exp_dir}/train.log; [ "${node_rank}" -eq 0 ] || train_log=${exp_dir}/train.node${node_rank}.log
    apply_comm_profile "${comm_profile}" "${socket_ifname}"
    # Before torchrun, which alone would only time out without naming the missing node: all nodes started
    # and exp/ shared. The preflight checks both (and more); without it, the nodes check in at exp/.nodes.
    if [ "${preflight}" = true ]; then
      ${preflight_ran} || run_preflight
    else
      log "WARNING: --preflight false: nodes with other code, config or data go unnoticed"
      [ "${nnodes}" -gt 1 ] && wait_for_nodes "${exp_dir}" "${stage2_fp}" "${node_rank}" "${nnodes}" "${wait_timeout}"
    fi
    # On CPU, DeepSpeed must not look for CUDA (it has no oneCCL here: gloo through torch.distributed).
    [ "${device}" = cpu ] && export DS_ACCELERATOR=cpu
    log "torchrun: ${nnodes} node(s) x ${nproc_per_node} ${device} process(es), ${train_engine}" \
      "$([ "${train_engine}" = deepspeed ] && echo "(${ds_config})"); log in ${train_log}" \
      "(a rerun resumes from ${exp_dir}/model.pt)"
    # Options of the run that do not change its result: not in the fingerprint.
    hook_opts=(--metrics-port "${metrics_port}" --grad-checkpoint "${grad_checkpoint}" --oom-probe "${oom_probe}"
      --max-bad-steps "${max_bad_steps}")
    [ -n "${memory_limit_gib}" ] && hook_opts+=(--memory-limit-gib "${memory_limit_gib}")
    # Training reads only shards that still match the checksums stage 1 recorded (--local-cache's copies too).
    [ "${feats_type}" = raw ] || verify_shards "${dump_dir}" "$(corpus_field train_set) $(corpus_field valid_set) ${replay_sets}"
    [ -z "${local_cache}" ] || hook_opts+=(--dump-dir "$(python -m local.local_cache --cache-dir "${local_cache}" --dump-dir \
      "${dump_dir}" --feats-type "${feats_type}" --sets "$(corpus_field train_set) $(corpus_field valid_set) ${replay_sets}")")
    nodes=${exp_dir}/.nodes
    if ! train_on_node "${train_log}" "${nodes}" "${stage2_fp}" "${node_rank}" \
        torchrun --nnodes "${nnodes}" --node-rank "${node_rank}" --master-addr "${master_addr}" \
        --master-port "${master_port}" --nproc-per-node "${nproc_per_node}" \
        -m local.train "${train_opts[@]}" "${hook_opts[@]}" -- "${hydra_overrides[@]}"; then
      no_space_left "${exp_dir}" "${dump_dir}" "${local_cache:-${exp_dir}}" \
        || log "ERROR: training failed on node ${node_rank}; see ${train_log}."
      python -m local.marker node explain "${nodes}" "${stage2_fp}" --node-rank "${node_rank}" --nnodes "${nnodes}" \
        --log "${train_log}" --master "${master_addr}:${master_port}" || true
      exit 1
    fi
    wait_for_peers "${nodes}" "${stage2_fp}" "${node_rank}" "${nnodes}" "${wait_timeout}" || exit 1  # torchrun's "ok" is not theirs
    if [ "${node_rank}" -eq 0 ]; then
      python -m local.plot_training "${train_log}" --out "${exp_dir}/curves" & plot_pid=$!  # beside the next
      # The checkpoint with the lowest validation loss as a model dir in the hub's format (fp32 weights).
      python -m local.make_model_dir --exp-dir "${exp_dir}" --checkpoint model.pt.best --out "${exp_dir}/best_model"
      wait "${plot_pid}" || log "WARNING: no training curves"
    fi
    mark_done "${exp_dir}/.train.done" "${stage2_fp}"
  fi
fi

if [ "${stage}" -le 3 ] && [ "${stop_stage}" -ge 3 ]; then
  stage_begins 3 "averaging, decoding, scoring: ${exp_dir}/ -> ${exp_dir}/{final/,decode_<set>/,RESULTS.md}" \
    "${exp_dir}/.train.done"
  # Its own options are in its fingerprint: ++train_conf.avg_nbest_model=1 at --stage 3 re-averages.
  average_opts=(--loss-margin 1.0 --check-average true); mapfile -t avg_overrides < <(average_overrides "${hydra_overrides[@]}")
  stage3_fp=$(fingerprint --markers "${exp_dir}/.train.done" -- "${average_opts[@]}" "${avg_overrides[@]}")
  if [ "${node_rank}" -ne 0 ]; then
    wait_for_node0 "${exp_dir}/final/.done" "${stage3_fp}" "averaging" "${wait_timeout}"
  elif is_done "${exp_dir}/final/.done" "${stage3_fp}"; then
    log "${exp_dir}/final is averaged; skipping"
  else
    start_average "${exp_dir}" "${stage3_fp}" "${device}" "${average_opts[@]}" -- "${hydra_overrides[@]}"  # in the background
  fi
  # The recipe's test sets, then every --decode-dir and --regression-dir, validated like a stage-0 set.
  import_dirs --decode-dir extra "${decode_dir}"
  import_dirs --regression-dir regress "${regression_dir}"
  test_sets="$(corpus_field test_sets) $(set_names extra "${decode_dir}")${regress_sets}"
  # The averaged model, and the pretrained one it was fine-tuned from, so that RESULTS shows both.
  models=("final:${exp_dir}/final")
  pretrained=$(pretrained_model) || exit 1
  [ -n "${pretrained}" ] && models+=("pretrained:${pretrained}")
  if [ -n "${regress_sets}" ]; then  # before hours of decoding: a set in a language the model never learnt is a mistake
    [ -n "${pretrained}" ] || usage_error "--regression-dir compares a fine-tune with the model it started from: give --pretrained-dir"
    mapfile -t jsonls < <(for s in ${regress_sets}; do echo "${data_dir}/${s}/data.jsonl"; done)
    [ "${node_rank}" -ne 0 ] || python -m local.regression check --model-dir "${pretrained}" --data-jsonl "${jsonls[@]}" || exit 1
  fi
  world=$((nnodes * nproc_per_node))
  for entry in "${models[@]}"; do
    kind=${entry%%:*}; model=${entry#*:}
    is_pretrained=false; [ "${kind}" = pretrained ] && is_pretrained=true
    for set in ${test_sets}; do
      out=${exp_dir}/decode_${set}; ${is_pretrained} && out+=_pretrained
      decode_fp=$(fingerprint --contents "${data_dir}/${set}/data.jsonl" -- "${stage3_fp}" "${model}" "${world}")
      if is_done "${out}/.done" "${decode_fp}"; then log "${out} is scored; skipping"; continue; fi
      decode_and_score "${model}" "${data_dir}/${set}/data.jsonl" "${out}" "${is_pretrained}" "${tag}" "${nproc_per_node}" \
        "${node_rank}" "${nnodes}" "${device}" "${decode_batch_size}" "${wait_timeout}"
      [ "${node_rank}" -ne 0 ] || mark_done "${out}/.done" "${decode_fp}"
    done
    await_average  # when every set was scored already
  done
  [ "${node_rank}" -ne 0 ] || gate_and_results "${exp_dir}" "${regress_sets}" "${max_regression}" "${regression_fatal}" || exit 1
fi

if [ "${stage}" -le 4 ] && [ "${stop_stage}" -ge 4 ]; then
  stage_begins 4 "ONNX export fp32/int8 and parity: ${exp_dir}/final/ -> ${exp_dir}/export/; log in ${exp_dir}/log/export.log" \
    "${exp_dir}/final/.done"
  valid_jsonl=${data_dir}/$(corpus_field valid_set)/data.jsonl
  stage4_fp=$(fingerprint --markers "${exp_dir}/final/.done" --contents "${valid_jsonl}" -- "${ncpu}")
  if [ "${node_rank}" -eq 0 ] && ! skip_done "${exp_dir}/export/.stage.done" "${stage4_fp}" "${exp_dir}/export/.done"; then
    # Parity is checked on the validation set: the stage fails (exit 1) when ONNX and PyTorch disagree.
    python -m local.export --model-dir "${exp_dir}/final" --out "${exp_dir}/export" --threads "${ncpu}" \
      --data-jsonl "${valid_jsonl}" 2>&1 | tee "${exp_dir}/log/export.log" >&2
    mark_done "${exp_dir}/export/.stage.done" "${stage4_fp}"
  fi
fi

if [ "${stage}" -le 5 ] && [ "${stop_stage}" -ge 5 ]; then
  stage_begins 5 "package and benchmark: ${exp_dir}/export/ -> ${exp_dir}/{package/,package.tar.gz,benchmark.md}; logs in ${exp_dir}/log/" \
    "${exp_dir}/export/.done"
  bench_jsonl=${data_dir}/$(corpus_field test_sets | cut -d' ' -f1)/data.jsonl
  stage5_fp=$(fingerprint --markers "${exp_dir}/export/.done" --contents "${bench_jsonl}" "${exp_dir}/RESULTS.md" -- "${ncpu}")
  if [ "${node_rank}" -eq 0 ] && ! skip_done "${exp_dir}/package/.stage.done" "${stage5_fp}" "${exp_dir}/package.tar.gz"; then
    # The benchmark first: the model card embeds its table.
    python -m local.bench_runtime --exp-dir "${exp_dir}" --data-jsonl "${bench_jsonl}" \
      --threads "${ncpu}" 2>&1 | tee "${exp_dir}/log/benchmark.log" >&2
    python -m local.package --exp-dir "${exp_dir}" --data-jsonl "${bench_jsonl}" 2>&1 | tee "${exp_dir}/log/package.log" >&2
    mark_done "${exp_dir}/package/.stage.done" "${stage5_fp}"
  fi
fi

if [ "${stage}" -le 6 ] && [ "${stop_stage}" -ge 6 ] && [ "${node_rank}" -eq 0 ]; then
  stage_begins 6 "HTTP service and web page: ${exp_dir}/export/ -> http://${serve_host}:${serve_port}/" "${exp_dir}/export/.done"
  # A service (no .done) until Ctrl-C/SIGTERM; in the background, as bash runs a trap only once its foreground command ends
  python -m local.serve --model-dir "${exp_dir}/export" --host "${serve_host}" --port "${serve_port}" \
    --precision "${serve_precision}" & wait $!
fi

if [ "${node_rank}" -eq 0 ] && [ "${stop_stage}" -ge 3 ] && [ -f "${data_dir}/corpus.json" ]; then
  summarize_outputs "${exp_dir}" "${exp_dir}/decode_$(corpus_field valid_set)/result.json"
fi
log "Successfully finished stages ${stage}-${stop_stage} in ${SECONDS}s"
