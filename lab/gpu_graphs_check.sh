#!/usr/bin/env bash
# CUDA graphs on one GPU, read-only and in dry run (nothing is set): the marker probe, a full-iteration graph
# job with the plugin (all mode) and without it, and a per-layer (local) graph job with the plugin, all on
# Megatron-LM's own pretrain_gpt.py. Logs go to $OUT (default build/gpu_graphs).
#   SCRIPT=upstream/pretrain_gpt.py bash lab/gpu_graphs_check.sh
set -u
OUT=${OUT:-build/gpu_graphs}
SCRIPT=${SCRIPT:-upstream/pretrain_gpt.py}
ITERS=${ITERS:-40}
mkdir -p "$OUT"
# the megatron-core wheel ships the compiled dataset helpers but not the Makefile Megatron's start-up runs
DATASETS=$(python3 -c "import megatron.core.datasets as d, os; print(os.path.dirname(d.__file__))")
[ -f "$DATASETS/Makefile" ] || printf 'default:\n\t@true\n' >"$DATASETS/Makefile"
job() { python3 -c "import sys; sys.path.insert(0, 'lab'); from gpt_job import gpt_args; print(' '.join(gpt_args($1, $2, $ITERS)))"; }
run() {  # tag, then the command
  local tag=$1; shift
  echo "== $tag: $*" | tee "$OUT/$tag.log"
  local start=$SECONDS
  "$@" >>"$OUT/$tag.log" 2>&1
  echo "== $tag: exit $? after $((SECONDS - start)) s" | tee -a "$OUT/$tag.log"
}
nvidia-smi --query-gpu=timestamp,power.draw,utilization.gpu,clocks.sm,clocks_event_reasons.active --format=csv -lms 500 >"$OUT/nvidia-smi.csv" &
SMI=$!
[ "${PROBE:-1}" = 1 ] && run probe python3 lab/graph_marker_probe.py --replays 20
GRAPH="--cuda-graph-impl full_iteration --no-check-for-nan-in-loss-and-grad"
TORCHRUN="python3 -m torch.distributed.run --nproc-per-node 1 --master-port 29531"
PLUGIN="--energy-optimise --energy-dry-run --energy-log-file"
run full-plain $TORCHRUN "$SCRIPT" $(job 4 1) $GRAPH
run full-all $TORCHRUN -m megatron_energy.launch "$SCRIPT" $(job 4 1) $GRAPH $PLUGIN "$OUT/full-all.jsonl" --energy-mode all --energy-dir "$OUT/energy-full-all"
run local-perseus $TORCHRUN -m megatron_energy.launch "$SCRIPT" $(job 8 2) --cuda-graph-impl local $PLUGIN "$OUT/local-perseus.jsonl" --energy-mode perseus --energy-dir "$OUT/energy-local"
kill $SMI
grep -h "\[energy\]" "$OUT"/*.log | grep -i "graph\|model vs measured\|clocks inside\|planned\|not optimising\|error" | head -40
