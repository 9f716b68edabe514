#!/usr/bin/env bash
# Validation grids on the GPU in one time-boxed device call: one `splitfuse validate` per GPU, side by side, each
# with the whole card. Packs the runs (raw client records and pass traces, for `validate --from`) and the machine's
# facts (GPUs, software, clock and power sampled each second, each grid's log) under $OUT.
# usage: G0="MODEL PROFILE SCHEDULER SEED LOADS N CELL_S" [G1=... G2=... G3=...] calibration/device_validate.sh
#   e.g. G0="llama-2-7b llama-2-7b-h200-bf16 splitfuse:768 83 0.5,0.75,0.9 400 30"; LOADS "-" runs no open-loop
#   cell (closed loop only: EXTRA="--clients 1,2,4,8,16,32")
# env: MIXES (default "long short"; M0..M3: grid N's own instead), TB (seconds after which no cell begins, 450),
#   TO (a grid's hard limit, 545), EXTRA (more validate options, e.g. "--repeats 2"; E0..E3: grid N's own
#   instead), NEED (a card name the GPUs must match, e.g. H200),
#   COMMIT (recorded in each run's meta.json), V0..V3 (the GPUs grid N sees, default its own: V0=0,1 with
#   EXTRA="--replicas 2 ..." runs a 2-replica fleet), CPUS ("split", the default: each grid on physical cores of
#   its own, its server apart from its clients (sim.cpu_sets), as a server whose clients are elsewhere runs;
#   "shared": each grid on cores of its own, server and clients together; "any": anywhere, as before the
#   forty-eighth round; C0..C3: grid N's own instead). Wheels in .whl/ (packages the machine lacks) are installed
#   first. The CPU time of each Python thread is sampled each second (meta/cpu.csv.gz). BESIDE: a command run
#   beside the grids (e.g. benchmarks.plan_check_gpu run ... --out "$OUT/pc") on the GPUs of VB and the cores of one
#   more measurement, under the same limit TO, logged to meta/beside.log.
set -uo pipefail
usage='usage: G0="MODEL PROFILE SCHEDULER SEED LOADS N CELL_S" [G1..G3=...] calibration/device_validate.sh'
specs=0
for gpu in 0 1 2 3; do
    spec_name=G$gpu
    [ -z "${!spec_name:-}" ] && continue
    read -r -a fields <<<"${!spec_name}"
    [ "${#fields[@]}" -eq 7 ] || { echo "G$gpu has ${#fields[@]} fields, not 7; $usage" >&2; exit 2; }
    specs=$((specs + 1))
done
[ "$specs" -gt 0 ] || { echo "no grid given; $usage" >&2; exit 2; }
out=${OUT:-/tmp/out}
work=$(mktemp -d)
mkdir -p "$out" "$work/meta" "$work/runs"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$work/site" \
        .whl/*.whl || exit 3
    export PYTHONPATH=$work/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 SPLITFUSE_GIT_COMMIT=${COMMIT:-$(git rev-parse --short HEAD)}
nvidia-smi --query-gpu=index,name,uuid,memory.total,clocks.max.sm,power.limit --format=csv | tee "$work/meta/gpus.csv"
if [ -n "${NEED:-}" ] && ! grep -q "$NEED" "$work/meta/gpus.csv"; then echo "no $NEED here"; exit 4; fi
python3 -c "import sys, torch, triton, transformers; print(sys.version.split()[0], torch.__version__, \
triton.__version__, transformers.__version__)" | tee "$work/meta/software.txt"
{ lscpu; lscpu -e; } >"$work/meta/lscpu.txt" 2>&1
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,utilization.gpu --format=csv -lms 1000 \
    > "$work/meta/clocks.csv" &
sampler=$!
python3 -m calibration.cpu_load "$work/meta/cpu.csv.gz" &
cpu_sampler=$!
beside=0
[ -n "${BESIDE:-}" ] && beside=1 && { [ -n "${VB:-}" ] || { echo "BESIDE needs VB, the GPUs it uses" >&2; exit 2; }; }
mapfile -t cpu_sets < <(python3 -m sim.cpu_sets "$((specs + beside))")  # "SERVER CLIENT" per grid, in order
grid=0
pids=()
for gpu in 0 1 2 3; do
    spec_name=G$gpu
    spec=${!spec_name:-}
    [ -z "$spec" ] && continue
    read -r model profile scheduler seed loads requests cell_s <<<"$spec"
    load_options=(--loads "$loads")
    [ "$loads" = "-" ] && load_options=()
    visible_name=V$gpu
    visible=${!visible_name:-$gpu}
    extra_name=E$gpu
    extra=${!extra_name:-${EXTRA:-}}
    mixes_name=M$gpu
    mixes=()
    for mix in ${!mixes_name:-${MIXES:-long short}}; do mixes+=(--mix "$mix"); done
    cpus_name=C$gpu
    read -r server_cpus client_cpus <<<"${cpu_sets[$grid]:-}"
    grid=$((grid + 1))
    case ${!cpus_name:-${CPUS:-split}} in
        split) cpu_options=(--server-cpus "$server_cpus" --client-cpus "$client_cpus") ;;
        shared) cpu_options=(--server-cpus "$server_cpus,$client_cpus" --client-cpus "$server_cpus,$client_cpus") ;;
        any) cpu_options=() ;;
        *) echo "C$gpu/CPUS: split, shared or any, not ${!cpus_name:-${CPUS:-}}" >&2; exit 2 ;;
    esac
    # shellcheck disable=SC2086  # EXTRA holds several options
    CUDA_VISIBLE_DEVICES=$visible timeout "${TO:-545}" python3 -c "from splitfuse.cli import main; main()" validate \
        "$model" --profile "$profile" --scheduler "$scheduler" "${mixes[@]}" "${load_options[@]}" -n "$requests" \
        --cell-seconds "$cell_s" --workload-seed "$seed" --time-budget "${TB:-450}" --out "$work/runs/g$gpu" \
        "${cpu_options[@]}" $extra >"$work/meta/g$gpu.log" 2>&1 &
    pids+=($!)
done
if [ "$beside" = 1 ]; then
    read -r server_cpus client_cpus <<<"${cpu_sets[$grid]}"
    OUT=$out CUDA_VISIBLE_DEVICES=$VB timeout "${TO:-545}" taskset -c "$server_cpus,$client_cpus" bash -c "$BESIDE" \
        >"$work/meta/beside.log" 2>&1 &
    pids+=($!)
fi
for pid in "${pids[@]}"; do wait "$pid"; echo "grid $pid exited $?"; done
kill "$sampler" "$cpu_sampler"
for log in "$work"/meta/*.log; do echo "== $log"; tail -n 15 "$log"; done
# the device returns files of at most 16 MiB: the runs travel as parts (cat runs.txz.part* | xz -d | tar x)
tar cf - -C "$work" runs | xz -T0 -6 | split -b 15M - "$out/runs.txz.part"
tar czf "$out/meta.tgz" -C "$work" meta
ls -l "$out"
