# Helpers of run.sh's stage bodies (sourced by run.sh after option parsing: they read its variables
# node_rank, nnodes, exp_dir, stop_stage, wait_timeout, config, pretrained_dir, hydra_overrides,
# replay_args). Kept apart so that run.sh holds the options and the stages.

# A marker holds a fingerprint of what produced it: a rerun with other inputs redoes the work,
# and a node waiting on node 0 does not mistake an old run's marker for this one's.
fingerprint() { printf '%s\n' "$@" | sha256sum | cut -c1-16; }
is_done() { [ -f "$1" ] && [ "$(head -n1 "$1")" = "$2" ]; }
mark_done() { printf '%s\n%s\n' "$2" "$(date '+%Y-%m-%dT%H:%M:%S') node${node_rank}" > "$1.tmp" && mv "$1.tmp" "$1"; }
wait_for_node0() {  # marker fingerprint what
  local waited=0
  until is_done "$1" "$2"; do
    if [ ${waited} -ge "${wait_timeout}" ]; then
      log "ERROR: waited ${wait_timeout}s for node 0 to finish $3 (${1} with fingerprint $2)."
      log "Is node 0 running the same command, and is $(dirname "$1") on a filesystem all nodes share?"
      exit 1
    fi
    if [ $((waited % 60)) -eq 0 ]; then
      log "waiting for node 0 to finish $3 (${waited}s of ${wait_timeout}s)"
      [ -f "$1" ] && log "NOTE: $1 is there with fingerprint $(head -n1 "$1"), this node expects $2:" \
        "an earlier run, or node 0 was started with other options"
    fi
    sleep 5; waited=$((waited + 5))
  done
}
write_replay() {  # stage: a script in the exp dir that resumes from this stage with the same arguments
  local q; q=$(printf ' %q' "${replay_args[@]}" --stage "$1" --stop-stage "${stop_stage}")
  [ ${#hydra_overrides[@]} -gt 0 ] && q+=" --"$(printf ' %q' "${hydra_overrides[@]}")
  printf '#!/usr/bin/env bash\n# Written by run.sh when stage %s started on %s; resumes from there.\ncd %q && ./run.sh%s "$@"\n' \
    "$1" "$(date '+%Y-%m-%dT%H:%M:%S')" "$(pwd)" "${q}" > "${exp_dir}/replay.sh"
  chmod +x "${exp_dir}/replay.sh"
}
wait_for_nodes() {  # dir fingerprint: every node checks in under the shared dir; names the ones missing
  local dir=$1/.nodes waited=0 missing n
  mkdir -p "${dir}"
  echo "$2 $(hostname)" > "${dir}/node${node_rank}"
  # shellcheck disable=SC2064  # expand now: ${dir} is local, gone by the time the trap runs
  trap "rm -f $(printf %q "${dir}/node${node_rank}")" EXIT
  while :; do
    missing=""
    for ((n = 0; n < nnodes; n++)); do
      [ "$(cut -d' ' -f1 "${dir}/node${n}" 2>/dev/null)" = "$2" ] || missing+=" ${n}"
    done
    [ -z "${missing}" ] && return 0
    if [ ${waited} -ge "${wait_timeout}" ]; then
      log "ERROR: after ${wait_timeout}s node(s)${missing} of ${nnodes} have not arrived in ${dir}."
      log "Start the same command on them (--node-rank${missing}); if they are running, ${1} is not on a" \
        "filesystem they share with this node."
      exit 1
    fi
    [ $((waited % 60)) -eq 0 ] && log "waiting for node(s)${missing} to start stage 2 (${waited}s of ${wait_timeout}s)"
    sleep 2; waited=$((waited + 2))
  done
}
run_node_procs() {  # n log_prefix command...: n processes of this node, RANK = node_rank * n + i
  local n=$1 prefix=$2 i rank failed=0 pids=()
  shift 2
  for ((i = 0; i < n; i++)); do
    rank=$((node_rank * n + i))
    # The first process of the node also shows its progress on the terminal.
    if [ "${i}" -eq 0 ]; then RANK=${rank} LOCAL_RANK=${i} "$@" > >(tee "${prefix}.${rank}.log" >&2) 2>&1 &
    else RANK=${rank} LOCAL_RANK=${i} "$@" > "${prefix}.${rank}.log" 2>&1 & fi
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "${pid}" || failed=1; done
  if [ ${failed} -ne 0 ]; then
    grep -h ERROR "${prefix}".*.log >&2 || true
    log "ERROR: a process failed; see ${prefix}.*.log"; return 1
  fi
}
resolve_pretrained() {  # prints the local dir of the config's pretrained model (empty: none)
  python -m local.resolve_model --config "${config}" ${pretrained_dir:+--pretrained-dir "${pretrained_dir}"} \
    -- "${hydra_overrides[@]}" || { log "ERROR: no pretrained model for ${config} (see above)"; return 1; }
}
