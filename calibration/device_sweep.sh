#!/usr/bin/env bash
# Profile several presets on the GPU in one time-boxed device call, one process per model (so each gets the
# whole card), resuming points files that earlier calls left in calibration/profiles/.
# usage: calibration/device_sweep.sh SECONDS_PER_MODEL MODEL...   (writes points and a log under $OUT)
set -uo pipefail
budget=$1
shift
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee -a "$out/sweep.log"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/sweep.log"
for model in "$@"; do
    points=calibration/profiles/$model.points.jsonl
    start=$SECONDS
    # --max-points is not used: the time budget bounds each model; the shuffled order keeps coverage even
    timeout $((budget + 150)) python3 -c "from calibration.cli import profile; profile()" \
        --model "$model" --dtype "${DTYPE:-bf16}" --device "${DEVICE:-cuda}" --out "calibration/profiles/$model.json" --time-budget "$budget" \
        --no-fit --no-progress --rounds "${ROUNDS:-1}" 2>&1 | grep -v "^\s*$" | tail -25 | tee -a "$out/sweep.log"
    echo "$model: $((SECONDS - start)) s" | tee -a "$out/sweep.log"
    cp "$points" "$out/" 2>/dev/null
done
