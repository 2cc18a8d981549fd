#!/usr/bin/env bash
# GPU check of stage 2 (under 8 minutes on one H200): the bundled corpus through stages 0-2 with nccl
# and DeepSpeed ZeRO-1 bf16 for a few hundred optimizer steps, then fbank frames/s and peak memory; the
# preflight (GPU report), the memory plan and the CUDA out-of-memory probe run on the way and are shown.
#
#   bench/gpu_smoke.sh [exp dir, default exp/gpu_smoke] [extra run.sh options...]
#
# Reads  the bundled corpus; writes data_gpu/, dump_gpu/ and the exp dir. Prints one summary line.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
exp=${1:-exp/gpu_smoke}; shift || true
command -v nvidia-smi >/dev/null || { echo "gpu_smoke: no nvidia-smi: this check needs a CUDA GPU" >&2; exit 1; }
start=${SECONDS}
./run.sh --stage 0 --stop-stage 2 --config conf/tiny_sensevoice.yaml --data-dir data_gpu --dump-dir dump_gpu \
  --exp-dir "${exp}" "$@" -- ++train_conf.max_epoch=8 ++train_conf.log_interval=10 \
  ++dataset_conf.num_workers=4 ++dataset_conf.batch_size=20000
grep -hE "preflight \| |memory plan|OOM probe" "${exp}/log/preflight.node0.log" "${exp}/train.log" | cut -c1-240 || true
. ./path.sh
python - "${exp}/train.log" dump_gpu/train/data.jsonl "$((SECONDS - start))" <<'PY'
import json, re, sys
log, jsonl, wall = open(sys.argv[1]).read(), sys.argv[2], int(sys.argv[3])
frames = sum(json.loads(line)["source_len"] for line in open(jsonl))
steps = [int(s) for s in re.findall(r"train, rank: 0, .*?total step: (\d+)", log)]
epochs = len(re.findall(r"\[node0 rank0\].*current_val:", log))
times = [float(t) for t in re.findall(r"'total_time': '([\d.]+)'", log)]
peak = max([float(p) for p in re.findall(r"peak: ([\d.]+) GB", log)] or [0.0])
step_s = sum(times) / max(len(times), 1)
print(f"gpu_smoke: {max(steps or [0])} steps on rank 0, {epochs} epochs, {frames * epochs} fbank frames; "
      f"{step_s:.3f} s/step (rank 0 mean), ~{frames * epochs / max(step_s * max(steps or [1]), 1e-9):.0f} "
      f"frames/s per run; peak GPU memory {peak:.2f} GB; wall {wall}s incl. stages 0-1")
PY
