# Helpers of run.sh's stage bodies, sourced by run.sh before it parses its options:
# only function definitions. Every input is an argument; what they take from run.sh is its log() (which
# stamps the node) and its usage_error(). The options themselves: local/run_options.sh.
# shellcheck shell=bash

# --- markers: the one marker system (funasr_recipe/dist/markers.py), also used by the Python stages.
# A marker's first line is the fingerprint of what produced the work: a rerun with other inputs redoes
# it, and a node waiting on node 0 does not mistake an old run's marker for this one's.
fingerprint() {  # [--contents FILE...] [--files FILE...] [--markers MARKER...] -- PART...: prints it
  python -m local.marker fingerprint "$@"
}
is_done() {  # marker fingerprint: true if the work is finished and current
  python -m local.marker check "$1" "$2"
}
mark_done() {  # marker fingerprint
  python -m local.marker write "$1" "$2"
}
wait_for_node0() {  # marker fingerprint what timeout: block until node 0 has written the marker
  python -m local.marker wait "$1" "$2" --what "$3" --timeout "$4" || exit 1
}
wait_for_nodes() {  # exp_dir fingerprint node_rank nnodes timeout: every node checks in under exp_dir/.nodes
  local nodes=$1/.nodes
  # A node's check-in is only for this run: gone when run.sh exits, so that a later run does not count
  # a node that is no longer there. Expanded now: the variables are local.
  # shellcheck disable=SC2064
  trap "rm -f $(printf %q "${nodes}/node$3")" EXIT
  python -m local.marker check-in "${nodes}" "$2" --node-rank "$3" --nnodes "$4" --timeout "$5" || exit 1
}

warn_world_writable() {  # dir...: warn for each existing one that any user may write to
  local d
  for d in "$@"; do
    if [ ! -d "${d}" ] || [ -z "$(find "${d}" -maxdepth 0 -perm -o+w)" ]; then continue; fi
    log "WARNING: ${d} is writable by every user of this machine: anyone could replace a checkpoint (a pickle" \
      "the trainer loads) or a feature shard. Share it through a group instead: chgrp <team> ${d}; chmod 2775 ${d}"
  done
}

# --- stage 0 (and stage 3's --decode-dir): validation of one Kaldi data dir --------------------------
# The tables of a Kaldi dir that stage 0 reads (spk2utt is made from utt2spk where missing).
KALDI_TABLES=(wav.scp segments text utt2spk utt2lang utt2emo utt2event utt2itn)
set_fingerprint() {  # kaldi_dir|data.jsonl data_dir part...: its tables' (or the manifest's) bytes, the
  # corpus's declared tags, the parts
  local dir=$1 data_dir=$2 declared tables
  shift 2
  declared=$(python -m local.corpus_info --data-dir "${data_dir}" language emotion event itn)
  tables=("${KALDI_TABLES[@]/#/${dir}/}"); [ ! -f "${dir}" ] || tables=("${dir}")
  # .sources.tsv: the audio's sizes and times, so that a replaced recording is validated again.
  fingerprint --contents "${tables[@]}" "${data_dir}/.sources.tsv" -- "$@" "${declared}"
}
validate_set() {  # set_dir data_dir fingerprint prepare_data_option...: data.jsonl of one set, unless current
  local set_dir=$1 data_dir=$2 fp=$3 name declared
  shift 3
  if is_done "${set_dir}/.done" "${fp}"; then log "${set_dir} is validated; skipping"; return 0; fi
  name=$(basename "${set_dir}")
  mapfile -t declared < <(python -m local.corpus_info --data-dir "${data_dir}" language emotion event itn)
  log "validating ${set_dir}: log in ${data_dir}/log/prepare_${name}.log"
  python -m local.prepare_data --set-dir "${set_dir}" --language "${declared[0]}" --emotion "${declared[1]}" \
    --event "${declared[2]}" --itn "${declared[3]}" "$@" 2>&1 | tee "${data_dir}/log/prepare_${name}.log" >&2
  mark_done "${set_dir}/.done" "${fp}"
}
copy_kaldi_dir() {  # src dst: the Kaldi tables of src into dst, rewriting only those that differ
  local f
  mkdir -p "$2"
  for f in "${KALDI_TABLES[@]}" spk2utt; do
    if [ -f "$1/${f}" ]; then cmp -s "$1/${f}" "$2/${f}" || cp "$1/${f}" "$2/${f}"
    else rm -f "$2/${f}"; fi
  done
}

import_kaldi_dirs() {  # option prefix dirs data_dir start_dir node_rank timeout check_opt...: every Kaldi dir of
  # the newline-separated list validated like a stage-0 set into data_dir/<prefix>_<name> by node 0 (the
  # other nodes wait for it); a relative dir is relative to start_dir
  local option=$1 prefix=$2 dirs=$3 data_dir=$4 start=$5 node=$6 timeout=$7 dir set fp
  shift 7
  while IFS= read -r dir; do
    [ -n "${dir}" ] || continue
    [[ ${dir} = /* ]] || dir=$(cd "${start}" && realpath -m "${dir}")
    set=${prefix}_$(set_name "${dir}")
    fp=$(set_fingerprint "${dir}" "${data_dir}" "${dir}" "${@:3}")  # not --nj: it changes how fast, not what
    if [ "${node}" -ne 0 ]; then wait_for_node0 "${data_dir}/${set}/.done" "${fp}" "validating ${dir}" "${timeout}"; continue; fi
    if [[ ${dir} = *.jsonl || ${dir} = *.jsonl.gz ]]; then  # FunASR JSONL: written as a Kaldi dir, then validated as any
      python -m local.prepare_data --jsonl-to-kaldi "${dir}" --set-dir "${data_dir}/jsonl_sets/${set}" || exit 1
      dir=${data_dir}/jsonl_sets/${set}
    fi
    if [ ! -f "${dir}/wav.scp" ] || [ ! -f "${dir}/text" ]; then log "ERROR: ${option} ${dir} needs wav.scp and text"; exit 1; fi
    copy_kaldi_dir "${dir}" "${data_dir}/${set}"
    validate_set "${data_dir}/${set}" "${data_dir}" "${fp}" "$@"
  done <<< "${dirs}"
}
set_name() {  # dir: a set's name from its Kaldi dir, or from a .jsonl[.gz] file's name (data.jsonl: its folder's)
  local name
  name=$(basename "${1%.gz}" .jsonl)
  if [ "${name}" = data ] && [[ ${1%.gz} = *.jsonl ]]; then name=$(basename "$(dirname "$1")"); fi
  echo "${name}"
}
set_names() {  # prefix dirs: the names import_kaldi_dirs gives the newline-separated dirs, each followed by a space
  local dir
  while IFS= read -r dir; do [ -z "${dir}" ] || printf '%s ' "$1_$(set_name "${dir}")"; done <<< "$2"
}

# --- processes and launches -------------------------------------------------------------------------
trap_signals() {  # [command]: on INT/TERM/HUP run the command, stop run.sh's other children (a stage's
  # processes), then exit 128+signal. Without a trap, a Ctrl-C that hits a Python child (which exits 1
  # from KeyboardInterrupt instead of dying of the signal) reads to bash as that command failing: an
  # `if is_done` check then just takes the other branch.
  local sig
  for sig in INT TERM HUP; do
    # shellcheck disable=SC2064  # expanded now: the command and the signal
    trap "${1:+$1; }pkill -TERM -P $$ 2>/dev/null || true
      log 'ERROR: stopped by SIG${sig}; a rerun continues from the last finished work'; exit $((128 + $(kill -l "${sig}")))" "${sig}"
  done
}
check_config() {  # config pretrained_dir ds_config dump_dir data_dir override...: local/check_config.py on the
  # overrides, the DeepSpeed JSON (if given) and the am.mvn files training reads: the model dir's, and stage 1's
  # when dump_dir is given (a run that redoes stage 1 rewrites it), or exit 2
  local opts=(--config "$1") files=() f train_set
  [ -z "$2" ] || { opts+=(--pretrained-dir "$2"); files+=("$2/am.mvn"); }
  [ -z "$3" ] || opts+=(--ds-config "$3")
  if [ -n "$4" ] && train_set=$(python -m local.corpus_info --data-dir "$5" train_set 2>/dev/null); then
    files+=("$4/${train_set}"/am.lfr*.mvn)
  fi
  for f in "${files[@]}"; do if [ -f "${f}" ]; then opts+=(--cmvn "${f}"); fi; done
  python -m local.check_config "${opts[@]}" -- "${@:6}" || exit 2
}
dump_is_sound() {  # node_rank fbank_opt...: true if every shard still matches the size and crc32 stage 1 recorded.
  # Node 0 repairs (removes the failing shards' markers, their sets' merged lists and dump/.done) so that the
  # stage recomputes exactly those; the other nodes only look. Exit 1 is that verdict, any other status stops.
  local rc=0 repair=false
  [ "$1" -ne 0 ] || repair=true
  python -m local.compute_fbank verify "${@:2}" --repair "${repair}" || rc=$?
  [ "${rc}" -le 1 ] || exit "${rc}"
  return "${rc}"
}
verify_shards() {  # dump_dir sets: every shard of the sets matches what stage 1 recorded, or exit 1 naming them
  python -m local.compute_fbank verify --dump-dir "$1" --sets "$2" || exit 1
}
skip_done() {  # marker fingerprint output: true (and says so) if the marker holds the fingerprint and output exists.
  # Checked before a stage's program starts: its imports alone take seconds, for a rerun that changes nothing.
  is_done "$1" "$2" && [ -e "$3" ] || return 1
  log "$3 is done for these inputs; skipping (remove $1 to redo)"
}
check_resume() {  # exp_dir node_rank restart world config ds_config dump_marker pretrained train_opts override...:
  # stage 2 may train in exp_dir (fresh, the same settings, or --restart true); checkpoints there from other
  # settings are not continued: exit 2 naming each difference
  python -m local.marker resume "$1" --node-rank "$2" --restart "$3" --world-size "$4" --config "$5" \
    ${6:+--ds-config "$6"} --dump-marker "$7" ${8:+--pretrained-dir "$8"} --train-opts "$9" -- "${@:10}" || exit $?
}
no_space_left() {  # dir...: true (and says so) if the file system of one of them is full: a full disk also
  # stops tee, so the log the error message points to may hold nothing of the error
  local d avail full=1
  for d in "$@"; do
    [ -e "${d}" ] || continue
    avail=$(df -Pk "${d}" | awk 'NR == 2 {print $4}')
    [ "${avail:-1024}" -lt 1024 ] || continue
    log "ERROR: no space left on $(df -P "${d}" | awk 'NR == 2 {print $6}') (${d}: ${avail} KiB free); its logs may stop" \
      "short of the error. Free space there, then rerun: finished work is kept"
    full=0
  done
  return "${full}"
}
run_node_procs() {  # n node_rank log_prefix command...: n processes of this node, RANK = node_rank * n + i
  start_node_procs "$@"
  wait_node_procs "$3"
}
node_pids=()
start_node_procs() {  # n node_rank log_prefix command...: run_node_procs in the background (pids in node_pids)
  local n=$1 node=$2 prefix=$3 i rank
  shift 3
  node_pids=()
  for ((i = 0; i < n; i++)); do
    rank=$((node * n + i))
    # The first process of the node also shows its progress on the terminal.
    if [ "${i}" -eq 0 ]; then RANK=${rank} LOCAL_RANK=${i} "$@" > >(tee "${prefix}.${rank}.log" >&2) 2>&1 &
    else RANK=${rank} LOCAL_RANK=${i} "$@" > "${prefix}.${rank}.log" 2>&1 & fi
    node_pids+=($!)
  done
}
wait_node_procs() {  # log_prefix: wait for start_node_procs' processes; 1 (their errors shown) if one failed
  local pid failed=0
  for pid in "${node_pids[@]}"; do wait "${pid}" || failed=1; done
  if [ ${failed} -ne 0 ]; then
    grep -h ERROR "$1".*.log >&2 || true
    log "ERROR: a process failed; see $1.*.log"; return 1
  fi
}
train_on_node() {  # log nodes_dir fingerprint node_rank command...: the command (torchrun) teed to log, with
  # this node's heartbeat beside it and its outcome written after; returns the command's status.
  local log=$1 nodes=$2 fp=$3 node=$4 pid hb rc=0 ok=false preempted
  shift 4
  python -m local.marker node heartbeat "${nodes}" "${fp}" --node-rank "${node}" --parent $$ &
  hb=$!
  # NOTE: in the background, not the foreground: bash runs a trap only after a foreground command ends,
  # and torchrun's workers live in their own sessions, so a signal to run.sh's process group misses them.
  # On TERM torchrun stops its workers; local/train.py makes them die with torchrun on a kill -9.
  preempted=$(dirname "${nodes}")/preempted.json  # written by the ranks (compat/preemption.py) on SIGTERM
  rm -f "${preempted}"
  "$@" > >(tee -a "${log}" >&2) 2>&1 &
  pid=$!
  # shellcheck disable=SC2064  # expanded now: the variables are local
  trap_signals "log 'stopping training on this node: the ranks save a checkpoint first'; kill -TERM ${pid} 2>/dev/null
    wait ${pid} || true; kill ${hb} 2>/dev/null || true; preempted_exit $(printf %q "${preempted}")"
  wait "${pid}" || rc=$?
  trap_signals
  kill "${hb}" 2>/dev/null || true
  [ "${rc}" -eq 0 ] && ok=true
  python -m local.marker node outcome "${nodes}" "${fp}" --node-rank "${node}" --ok "${ok}"
  return "${rc}"
}
preempted_exit() {  # preempted_json: after a signal, exit 75 (EX_TEMPFAIL: run again) if the ranks saved a
  # checkpoint of their step, saying where; else return (the signal's own exit follows)
  [ -f "$1" ] || return 0
  log "stopped by a signal after saving a checkpoint mid-epoch ($(cat "$1")); the same command continues there"
  exit 75
}
wait_for_peers() {  # nodes_dir fingerprint node_rank nnodes timeout: every node's outcome after torchrun, which
  # reports success after its exit barrier times out on a peer that left: ask the peers (one node: none)
  [ "$4" -gt 1 ] || return 0
  python -m local.marker node wait-peers "$1" "$2" --node-rank "$3" --nnodes "$4" --timeout "$5"
}
# --- stage 0's pseudo-labels and stage 3's decoding: every process of every node, node 0 merges ------
pseudo_labels() {  # dir model out_root nproc node_rank nnodes device batch min_logprob timeout: the audio of
  # dir/wav.scp transcribed by model (SenseVoice's tags kept) -> out_root/<name>/, a Kaldi dir with text
  local dir=$1 model=$2 out nproc=$4 node=$5 world=$(($4 * $6))
  out=$3/$(basename "$1")
  [ -f "${dir}/wav.scp" ] || { log "ERROR: --pseudo-label-dir ${dir}: no wav.scp"; exit 1; }
  mkdir -p "${out}.decode/log"
  log "pseudo-labelling ${dir} with ${model}: ${world} processes; logs in ${out}.decode/log/work.<rank>.log"
  run_node_procs "${nproc}" "${node}" "${out}.decode/log/work" python -m local.pseudo_label work --model-dir "${model}" \
    --wav-scp "${dir}/wav.scp" --out "${out}.decode" --world-size "${world}" --device "$7" --batch-size "$8" || exit 1
  [ "${node}" -eq 0 ] || return 0
  python -m local.pseudo_label merge --wav-scp "${dir}/wav.scp" --out "${out}.decode" --world-size "${world}" \
    --min-logprob "$9" --dest "${out}" \
    --wait-timeout "${10}" 2>&1 | tee "${out}.decode/log/merge.log" >&2
}
average_pid=
average_after=()
average_overrides() {  # override...: the ones stage 3 reads (train_conf.avg_nbest_model), one per line
  local o
  for o in "$@"; do case ${o#"${o%%[!+]*}"} in train_conf.avg_nbest_model=*) echo "${o}" ;; esac; done
}
start_average() {  # exp_dir fingerprint device [average option...] [-- override...]: local/average.py into
  # exp_dir/final in the background (it writes final/.done when it succeeds). The next decode's workers import
  # torch and funasr meanwhile, then wait for the marker (--after): stage 3 alone went from 6.3-7.3 s to 5.0-5.4 s.
  python -m local.average --exp-dir "$1" --final-dir "$1/final" --done-fingerprint "$2" --device "$3" "${@:4}" \
    > >(tee "$1/log/average.log" >&2) 2>&1 &
  average_pid=$!
  average_after=(--after "$1/final/.done" "$2")
}
await_average() {  # [pid...]: wait for start_average's process; if it failed, stop the pids and exit 1
  [ -n "${average_pid}" ] || return 0
  local pid=${average_pid}
  average_pid=; average_after=()
  wait "${pid}" && return 0
  [ $# -eq 0 ] || kill "$@" 2>/dev/null || true
  log "ERROR: averaging the checkpoints failed (above)"; exit 1
}
decode_and_score() {  # model data_jsonl out pretrained tag nproc node_rank nnodes device batch timeout: one set
  # decoded by one model into out/ (work on every process, then merge and score on node 0)
  local model=$1 out=$3 nproc=$6 node=$7 opts
  opts=(--model-dir "${model}" --data-jsonl "$2" --out "${out}" --world-size $(($6 * $8)))
  mkdir -p "${out}/log"
  log "decoding $2 with ${model}: $(($6 * $8)) processes; logs in ${out}/log/decode.<rank>.log"
  start_node_procs "${nproc}" "${node}" "${out}/log/decode" python -m local.decode work "${opts[@]}" --device "$9" \
    --batch-size "${10}" --wait-timeout "${11}" "${average_after[@]}"
  await_average "${node_pids[@]}"
  wait_node_procs "${out}/log/decode" || exit 1
  [ "${node}" -eq 0 ] || return 0  # node 0 merges and scores
  python -m local.decode merge "${opts[@]}" --tag "$5" --pretrained "$4" --set-name "$(basename "$(dirname "$2")")" \
    --wait-timeout "${11}" 2>&1 | tee "${out}/log/merge.log" >&2
  python -m local.score --dir "${out}" 2>&1 | tee "${out}/log/score.log" >&2
}
preflight_node() {  # exp_dir node_rank options preflight_option...: local/preflight.py on this node, or exit 1
  local log_file=$1/log/preflight.node$2.log
  log "preflight of this node against node 0; log in ${log_file}"
  if ! python -m local.preflight --exp-dir "$1" --node-rank "$2" --options "$3" "${@:4}" 2>&1 | tee "${log_file}" >&2; then
    log "ERROR: preflight failed (above: which node differs, and how); fix it, or --preflight false to train anyway"
    exit 1
  fi
}
summarize_outputs() {  # exp_dir result_json: the run's reports that exist, and the headline error rate
  local f
  for f in RESULTS.md curves.png export/parity.json package.tar.gz benchmark.md; do
    if [ -e "$1/${f}" ]; then log "  $1/${f}"; fi
  done
  if [ -f "$2" ]; then log "$(python -m local.results_md --headline "$2")"; fi
}
comm_applied=false
apply_comm_profile() {  # profile socket_ifname: the profile's NCCL/torch.distributed variables (the user's
  # are kept), exported once
  ${comm_applied} && return 0
  local exports
  exports=$(python -m local.comm_env --profile "$1" --socket-ifname "$2") || exit 2
  eval "${exports}"
  comm_applied=true
}
resolve_pretrained() {  # config pretrained_dir hydra_override...: prints the local dir of the config's
  # pretrained model (empty: it trains from scratch)
  local config=$1 dir=$2
  shift 2
  python -m local.resolve_model --config "${config}" ${dir:+--pretrained-dir "${dir}"} -- "$@" \
    || { log "ERROR: no pretrained model for ${config} (see above)"; return 1; }
}
write_replay() {  # exp_dir stage stop_stage n_args arg... hydra_override...: exp_dir/replay.sh resumes
  # from this stage with the same options. Node options are not in it (they are the same on every node
  # but for --node-rank, which each node gives again or takes from NODE_RANK/SLURM_NODEID), so every
  # node writes the same script; options given to it go before the trainer's overrides.
  local exp_dir=$1 stage=$2 stop=$3 n=$4 opts overrides=""
  shift 4
  opts=$(printf ' %q' "${@:1:n}" --stage "${stage}" --stop-stage "${stop}")
  [ $# -gt "${n}" ] && overrides=" --"$(printf ' %q' "${@:n+1}")
  {
    echo "#!/usr/bin/env bash"
    echo "# Written by run.sh when stage ${stage} started on $(date '+%Y-%m-%dT%H:%M:%S'); resumes from there."
    echo "# On a multi-node job each node adds its own --node-rank (or sets NODE_RANK): replay.sh --node-rank 1"
    printf 'cd %q && ./run.sh%s "$@"%s\n' "$(pwd)" "${opts}" "${overrides}"
  } > "${exp_dir}/.replay.sh.$$"
  chmod +x "${exp_dir}/.replay.sh.$$"
  mv "${exp_dir}/.replay.sh.$$" "${exp_dir}/replay.sh"
}
default_replay() {  # config pretrained_dir replay_ratio: prints the training set a model dir of this recipe
  # records, to replay in a fine-tune given --regression-dir: without it bench/bench_adapt.py measured up to
  # +11.5 points on the old speakers, with it at most +1 (README). A hub model records none: a warning.
  local data
  data=$(python -m local.resolve_model --config "$1" --pretrained-dir "$2" --training-data) || return 1
  if [ -n "${data}" ]; then
    log "replaying ${data}, the training set $2 records, at --replay-ratio $3 (--replay-dir none: no replay)"
    echo "${data}"
  else
    log "WARNING: --regression-dir without a replay set: a fine-tune on the new data alone may forget the old (give --replay-dir or --pseudo-label-dir)"
  fi
}
gate_and_results() {  # exp_dir regress_sets max_regression fatal: the regression gate, then RESULTS.md;
  # returns 1 when the gate failed (after RESULTS.md is written, so that it shows why)
  local gate_rc=0
  [ -n "$2" ] || rm -f "$1"/regression.{json,md}  # no stale gate in RESULTS.md
  [ -z "$2" ] || python -m local.regression gate --exp-dir "$1" --sets "$2" --max-regression "$3" --fatal "$4" \
    2>&1 | tee "$1/log/regression.log" >&2 || gate_rc=1
  # (errexit does not apply inside a function called before ||: each failure returns itself)
  python -m local.results_md --exp-dir "$1" --out "$1/RESULTS.md" || return 1
  log "$1/RESULTS.md:"; cat "$1/RESULTS.md" >&2
  [ "${gate_rc}" -eq 0 ] || { log "ERROR: the regression gate failed (above and in $1/regression.json); --regression-fatal false only warns"; return 1; }
}
