# run.sh's options, sourced by run.sh after its option block: only function definitions. The block is the
# one source of truth (ESPnet's convention): every option a variable with a trailing comment, under
# "# -- <heading>" lines; --help, the parser and the docs' reference (funasr_recipe/core/cli_reference.py)
# are made from it. What the functions take from run.sh: its usage_error() and the option variables.
# shellcheck shell=bash

option_block() {  # run_sh: the block's heading lines and assignment lines
  sed -n '/^# ---- options/,/^# ---- end of options/p' "$1" | grep -E '^([a-z_]+=|# -- )'
}
option_names_of() {  # run_sh: the option variables' names, one per line
  option_block "$1" | sed -nE 's/^([a-z_]+)=.*/\1/p'
}
default_source() {  # run_sh raw_default: where a default that names a variable comes from, e.g.
  # "$NNODES, else $SLURM_NNODES, else 1"; empty for a literal. run.sh's own variables (${ncpu}) are
  # described by the comment on their assignment.
  local raw=$2 names fallback
  case ${raw} in
    *\$\{[a-z]*) sed -nE "s/^${raw//[^a-z_]/}=.* # (.*)/\1/p" "$1" | head -n1 ;;
    *\$\{*)
      names=$(grep -oE '\$\{[A-Z_]+' <<< "${raw}" | sed 's/^..//; s/^/$/' | paste -sd, | sed 's/,/, else /g')
      fallback=$(sed -E 's/\$\{[A-Z_]+:-//g; s/\}//g' <<< "${raw}")
      echo "${names}, else ${fallback:-\"\"}" ;;
  esac
}
options_help() {  # run_sh program: the --help text: the block's headings, and each option with its comment
  # and its default as it resolves here (after the variables it names: the environment, this machine)
  local line name rest raw value source
  echo "Usage: $2 [options] [-- hydra overrides for the trainer]
Options (--name value; --name-with-dashes and --name_with_underscores both work):"
  while IFS= read -r line; do
    if [[ ${line} = "# -- "* ]]; then printf 'H\t%s\n' "${line#"# -- "}"; continue; fi
    name=${line%%=*}; rest=${line#*=}
    raw=${rest%% #*}; raw=${raw%"${raw##*[! ]}"}
    value=${!name}
    [[ -n ${value} && ${value} != *' '* ]] || value="\"${value}\""
    source=$(default_source "$1" "${raw}")
    printf 'O\t%s\t%s\t[default: %s]\n' "${name//_/-}" "${rest#* # }" "${value}${source:+ (${source})}"
  done < <(option_block "$1") | awk -F '\t' -v width=100 -v indent=24 '
    $1 == "H" { printf "\n%s:\n", $2; next }
    {  # the comment wrapped at width under its column; the default is one word: never split
      n = split($3, words, " "); words[++n] = $4
      line = sprintf("  --%-" indent - 5 "s ", $2)
      if (length(line) > indent) { print line; line = sprintf("%" indent "s", "") }
      col = length(line); first = 1
      for (i = 1; i <= n; i++) {
        if (!first && col + 1 + length(words[i]) > width) { print line; line = sprintf("%" indent "s", ""); col = indent; first = 1 }
        line = line (first ? "" : " ") words[i]; col = length(line); first = 0
      }
      print line
    }'
  echo "
Everything after -- is handed to the funasr trainer verbatim, e.g. -- ++dataset_conf.batch_size=8000
Exit status: 0 done; 1 a failure, or a bug (a Python traceback: please report it); 2 bad input or usage,
one line that says what to fix. RECIPE_DEBUG=1 in the environment shows the traceback of bad input too.
Example: $2 --stage 0 --stop-stage 0 --corpus kaldi --corpus-dir /data/my_kaldi_dirs"
}

# shellcheck disable=SC2034  # hydra_overrides is run.sh's
parse_options() {  # run_sh program arg...: run.sh's command line into the option variables (globals), and
  # option_names, help_message, hydra_overrides (after --) and replay_args (what replay.sh repeats)
  local name value var o
  option_names=$(option_names_of "$1")
  help_message=$(options_help "$1" "$2")
  shift 2
  hydra_overrides=()
  replay_args=()
  while [ $# -gt 0 ]; do
    case $1 in
      -h|--help) echo "${help_message}"; exit 0 ;;
      --) shift; hydra_overrides=("$@")
        for o in "$@"; do [[ ${o} != --* ]] || usage_error "${o} comes after --: run.sh options go before --, trainer overrides after"; done
        break ;;
      --*=*) name=${1%%=*}; value=${1#*=}; shift ;;
      --*) name=$1; [ $# -ge 2 ] || usage_error "option $1 needs a value"; value=$2; shift 2 ;;
      *) usage_error "unexpected argument '$1' (options are --name value; trainer overrides go after --)" ;;
    esac
    var=${name#--}; var=${var//-/_}
    grep -qx "${var}" <<< "${option_names}" || usage_error "unknown option ${name}"
    # --decode-dir, --replay-dir, --regression-dir may be repeated: the dirs accumulate, newline-separated.
    if [[ ${var} =~ ^(decode|replay|regression)_dir$ ]] && [ -n "${!var}" ]; then value=${!var}$'\n'${value}; fi
    printf -v "${var}" '%s' "${value}"
    case ${var} in stage|stop_stage|node_rank|restart) ;; *) replay_args+=("--${var//_/-}" "${value##*$'\n'}") ;; esac
  done
}

# shellcheck disable=SC2154  # the option variables are run.sh's
check_options() {  # run.sh's option values (its globals): usage_error on the first that is malformed
  local n b have_recipes
  for n in stage stop_stage; do [[ ${!n} =~ ^-?[0-9]+$ ]] || usage_error "--${n//_/-} must be an integer, got '${!n}'"; done
  [ "${stop_stage}" -ge "${stage}" ] || usage_error "--stop-stage ${stop_stage} is below --stage ${stage}: no stage would run"
  [[ ${nj} =~ ^[1-9][0-9]*$ ]] || usage_error "--nj must be a positive integer, got '${nj}'"
  for n in nnodes node_rank master_port metrics_port max_bad_steps serve_port; do
    [[ ${!n} =~ ^[0-9]+$ ]] || usage_error "--${n//_/-} must be a non-negative integer, got '${!n}'"; done
  [[ ${serve_precision} =~ ^(fp32|int8)$ ]] || usage_error "--serve-precision must be fp32 or int8, got '${serve_precision}'"
  [[ ${comm_profile} =~ ^(default|ethernet|infiniband|debug)$ ]] \
    || usage_error "--comm-profile must be default, ethernet, infiniband or debug, got '${comm_profile}'"
  [[ -z ${memory_limit_gib} || ${memory_limit_gib} =~ ^[0-9]+([.][0-9]+)?$ ]] \
    || usage_error "--memory-limit-gib must be a number of GiB, got '${memory_limit_gib}'"
  [ "${node_rank}" -lt "${nnodes}" ] || usage_error "--node-rank ${node_rank} is not below --nnodes ${nnodes}"
  have_recipes=$(cd recipes && for d in */prepare.py; do printf '%s ' "${d%/prepare.py}"; done)
  [ -d "recipes/${corpus}" ] || usage_error "--corpus ${corpus}: no recipes/${corpus}/ (have: ${have_recipes})"
  [[ ${replay_ratio} =~ ^(auto|[0-9]+([.][0-9]+)?)$ ]] || usage_error "--replay-ratio must be auto or a number >= 0, got '${replay_ratio}'"
  [[ ${max_regression} =~ ^[0-9]+([.][0-9]+)?$ ]] || usage_error "--max-regression must be a number >= 0, got '${max_regression}'"
  [[ ${pseudo_min_logprob} =~ ^-?[0-9]+([.][0-9]+)?$ ]] || usage_error "--pseudo-min-logprob must be a number, got '${pseudo_min_logprob}'"
  [[ ${adapter} =~ ^(none|lora)$ ]] || usage_error "--adapter must be none or lora, got '${adapter}'"; [[ ${lora_rank} =~ ^[1-9][0-9]*$ ]] \
    || usage_error "--lora-rank must be a positive integer, got '${lora_rank}'"
  for b in strict allow_pipes preflight grad_checkpoint oom_probe regression_fatal restart; do [[ ${!b} =~ ^(true|false)$ ]] || usage_error "--${b//_/-} must be true or false, got '${!b}'"; done
}
