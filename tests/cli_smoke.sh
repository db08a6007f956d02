#!/usr/bin/env bash
# The `shardtensor` command end to end at a tiny size on 2 ranks: generate, train, resume,
# infer, info, --help, and errors that stop every rank with one clear message.
#   tests/cli_smoke.sh <path to shardtensor> <example config>
set -euo pipefail
bin="$1"
config="$2"
work="$(mktemp -d /tmp/shardtensor_cli_XXXXXX)"
trap 'rm -rf "$work"' EXIT
cd "$work"
run() { mpirun -n 2 --oversubscribe --bind-to none "$bin" "$@"; }
expect() {  # expect <pattern> <file>
  grep -q -- "$1" "$2" || { echo "FAIL: '$1' not in $2:"; cat "$2"; exit 1; }
}

run generate heat --dims 2 --size 16 --samples 12 --steps 10 --output data.h5 > gen.log
expect "12 samples of 16x16 cells" gen.log
test -f data.h5 && test -f data.xdmf

small=(--set data.path=data.h5 --set data.validation_samples=4 --set model.depth=1
       --set model.base_channels=4 --set training.batch_size=2 --set training.epochs=2)
run train --config "$config" "${small[@]}" > train.log
expect "epoch 2/2" train.log
expect "validation relative L2 error" train.log
head -1 runs/heat2d/metrics.csv | grep -q "^step,epoch,loss,val_loss,val_rel_l2,lr,grad_norm,samples_per_s$"
test "$(wc -l < runs/heat2d/metrics.csv)" -eq 9  # header + 2 epochs x 4 steps
test -f runs/heat2d/config.yaml

run train --config "$config" "${small[@]}" --set training.epochs=3 --resume latest > resume.log
expect "epoch 3/3" resume.log
test "$(wc -l < runs/heat2d/metrics.csv)" -eq 13

# Background prefetch (on above: the CLI asks for MPI_THREAD_MULTIPLE) reads the same batches.
run train --config "$config" "${small[@]}" --set run_dir=runs/sync --set data.prefetch=false \
  --quiet > sync.log
if ! diff <(head -9 runs/heat2d/metrics.csv | cut -d, -f1-5) <(cut -d, -f1-5 runs/sync/metrics.csv); then
  echo "FAIL: training with and without prefetch differ"; exit 1
fi

# SIGTERM stops training at a step boundary with a checkpoint, and --resume latest continues
# (mid-epoch) with the losses of an uninterrupted run. A constant learning rate, so that the
# epoch count does not change the schedule.
steady=("${small[@]}" --set data.prefetch=false --set schedule.type=constant --quiet)
mpirun -n 2 --oversubscribe --bind-to none "$bin" train --config "$config" "${steady[@]}" \
  --set training.epochs=100000 --set run_dir=runs/signal > signal.log 2>&1 &
trainer=$!
for _ in $(seq 600); do  # until two steps are done (the handler is in place by then)
  [ -f runs/signal/metrics.csv ] && [ "$(wc -l < runs/signal/metrics.csv)" -ge 3 ] && break
  sleep 0.1
done
# SIGTERM to the ranks, as a batch system sends it (Open MPI's mpirun, signalled itself, may
# kill them before their checkpoint is written).
kill -TERM $(cat /proc/"$trainer"/task/*/children)
status=0
wait "$trainer" || status=$?
test "$status" -eq 143 || { echo "FAIL: a run stopped by SIGTERM exited $status, not 143"; cat signal.log; exit 1; }
if grep -q "MPI_ABORT" signal.log; then echo "FAIL: the stop aborted MPI"; cat signal.log; exit 1; fi
expect "stopped by SIGTERM after step" signal.log
expect "continue with --resume latest" signal.log
stopped="$(( $(wc -l < runs/signal/metrics.csv) - 1 ))"
epochs="$(( stopped / 4 + 2 ))"  # past the step it stopped after, by at least one epoch
run train --config "$config" "${steady[@]}" --set training.epochs=$epochs --set run_dir=runs/signal \
  --resume latest > signal_resume.log
run train --config "$config" "${steady[@]}" --set training.epochs=$epochs \
  --set run_dir=runs/straight > straight.log
if ! diff <(cut -d, -f1-5 runs/straight/metrics.csv) <(cut -d, -f1-5 runs/signal/metrics.csv); then
  echo "FAIL: stopping by SIGTERM after step $stopped and resuming changed the losses"; exit 1
fi

run infer --checkpoint runs/heat2d --input data.h5 --output prediction.h5 > infer.log
expect "12 samples" infer.log
expect "relative L2 error vs target" infer.log
test -f prediction.h5 && test -f prediction.xdmf

run info > info.log
expect "HDF5      1" info.log
expect "parallel: yes" info.log
"$bin" train --help > help.log
expect "--config" help.log

# A config error: non-zero exit, the key, the value and the line, printed once.
if run train --config "$config" --set training.epochs=many > bad.log 2>&1; then
  echo "FAIL: a bad config did not fail"; exit 1
fi
expect "training.epochs (line" bad.log
expect "got 'many'" bad.log
test "$(grep -c "shardtensor: error" bad.log)" -eq 1
# A missing data file.
if run train --config "$config" --set data.path=nothing.h5 > missing.log 2>&1; then
  echo "FAIL: a missing file did not fail"; exit 1
fi
expect "nothing.h5" missing.log
echo "cli smoke test passed"
