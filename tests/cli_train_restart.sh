#!/usr/bin/env bash
# seqpar train's checkpoints for restarts, on CPU ranks: a run saving every 2 steps keeps the last
# 2 (--keep); with the newest checkpoint truncated and a junk file beside it, --resume auto skips
# both with a message, resumes from the one before, and ends with weights equal bit for bit to a
# straight run, its own save setting the later junk step aside; an empty folder starts from step 0;
# a NaN loss (SEQPAR_FAULT_NAN_STEP) stops the run naming the last good checkpoint, which resumes
# to the straight run's weights past a torn .tmp; SIGTERM saves and exits with 143, and
# --resume auto continues from that step; a save that cannot be written (a full disk, made by a
# file-size limit) stops the run with exit 1, leaves no .tmp and the previous checkpoint, from
# which --resume auto finishes like the straight run. Usage: cli_train_restart.sh path/to/seqpar
set -uo pipefail
bin="$1"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
args=(train --ranks 2 --seq 64 --batch 4 --warmup 2 --threads-per-rank 1)

"$bin" "${args[@]}" --steps 6 --export "$dir/straight" > /dev/null 2>&1 || fail "the straight run"
"$bin" "${args[@]}" --steps 6 --checkpoint-dir "$dir/ck" --save-every 2 --keep 2 > /dev/null 2>&1 || fail "the saving run"
kept="$(cd "$dir/ck" && ls)"
[ "$kept" = "$(printf 'step-00000004.ckpt\nstep-00000006.ckpt')" ] || fail "kept: $kept"

# The newest torn, a junk file newer still: auto takes step 4 and finishes like the straight run.
size=$(stat -c %s "$dir/ck/step-00000006.ckpt")
truncate -s $((size / 2)) "$dir/ck/step-00000006.ckpt"
echo "not a checkpoint" > "$dir/ck/step-00000008.ckpt"
"$bin" "${args[@]}" --steps 6 --checkpoint-dir "$dir/ck" --resume auto --export "$dir/resumed" > /dev/null 2> "$dir/resume.err" ||
  { cat "$dir/resume.err"; fail "the resumed run"; }
grep -q "skipping .*step-00000008.ckpt: .*not a seqpar checkpoint" "$dir/resume.err" || { cat "$dir/resume.err"; fail "junk not skipped"; }
grep -q "skipping .*step-00000006.ckpt: .*truncated" "$dir/resume.err" || { cat "$dir/resume.err"; fail "torn not skipped"; }
grep -q "resumed from .*step-00000004.ckpt at step 4" "$dir/resume.err" || { cat "$dir/resume.err"; fail "not resumed at 4"; }
cmp -s "$dir/straight/model.safetensors" "$dir/resumed/model.safetensors" || fail "the resumed run's weights differ"
# Its save at step 6 replaced the torn file and set the junk later step aside.
[ -f "$dir/ck/step-00000008.ckpt.stale" ] && [ ! -e "$dir/ck/step-00000008.ckpt" ] || fail "the later junk step was not set aside"

"$bin" "${args[@]}" --checkpoint-dir "$dir/empty" --resume auto --steps 1 > /dev/null 2> "$dir/empty.err" || fail "empty folder"
grep -q "no whole checkpoint in .*starting from step 0" "$dir/empty.err" || { cat "$dir/empty.err"; fail "empty folder message"; }

# SIGTERM after the first step line: saved, exit 143, and auto resumes from that step.
"$bin" "${args[@]}" --steps 100000 --checkpoint-dir "$dir/term" > "$dir/term.out" 2> "$dir/term.err" &
pid=$!
for _ in $(seq 1 300); do grep -q "^step" "$dir/term.out" && break; sleep 0.1; done
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 143 ] || { cat "$dir/term.err"; fail "exit status $rc after SIGTERM, not 143"; }
grep -q "SIGTERM: stopped after step" "$dir/term.err" || { cat "$dir/term.err"; fail "no SIGTERM message"; }
saved="$(ls "$dir/term")"
[ -n "$saved" ] || fail "nothing saved on SIGTERM"
step=$((10#$(echo "$saved" | tail -n 1 | sed 's/step-0*\([0-9]*\)\.ckpt/\1/')))
"$bin" "${args[@]}" --steps $((step + 1)) --checkpoint-dir "$dir/term" --resume auto > /dev/null 2> "$dir/again.err" ||
  fail "resuming after SIGTERM"
grep -q "at step $step" "$dir/again.err" || { cat "$dir/again.err"; fail "not resumed at step $step"; }
# A NaN at step 5 stops the run with exit 1 before the update, naming the last good checkpoint
# (step 4); a torn .tmp of a save killed midway is ignored; --resume auto continues from step 4.
SEQPAR_FAULT_NAN_STEP=4 "$bin" "${args[@]}" --steps 6 --checkpoint-dir "$dir/nan" --save-every 2 > /dev/null \
  2> "$dir/nan.err"
rc=$?
[ $rc -eq 1 ] || { cat "$dir/nan.err"; fail "exit status $rc after a NaN loss, not 1"; }
grep -q "the loss is not finite at step 4" "$dir/nan.err" || { cat "$dir/nan.err"; fail "no NaN message"; }
grep -q "the last good checkpoint is .*step-00000004.ckpt" "$dir/nan.err" || { cat "$dir/nan.err"; fail "no checkpoint named"; }
head -c 1000 "$dir/nan/step-00000004.ckpt" > "$dir/nan/step-00000006.ckpt.tmp"
"$bin" "${args[@]}" --steps 6 --checkpoint-dir "$dir/nan" --resume auto --export "$dir/after_nan" > /dev/null \
  2> "$dir/after_nan.err" || { cat "$dir/after_nan.err"; fail "resuming after the NaN"; }
grep -q "resumed from .*step-00000004.ckpt at step 4" "$dir/after_nan.err" || { cat "$dir/after_nan.err"; fail "not resumed at 4"; }
cmp -s "$dir/straight/model.safetensors" "$dir/after_nan/model.safetensors" || fail "the run resumed after a NaN differs"
# A full disk: a file-size limit (SIGXFSZ ignored, so writes fail with EFBIG) below a
# checkpoint's size fails the save at step 4; exit 1, the step-2 file untouched, no .tmp left.
"$bin" "${args[@]}" --steps 2 --checkpoint-dir "$dir/full" --save-every 2 > /dev/null 2>&1 || fail "the run before the full disk"
(trap '' XFSZ; ulimit -f 400; "$bin" "${args[@]}" --steps 6 --checkpoint-dir "$dir/full" --save-every 2 --resume auto \
  > /dev/null 2> "$dir/full.err")
rc=$?
[ $rc -eq 1 ] || { cat "$dir/full.err"; fail "exit status $rc on a full disk, not 1"; }
grep -q "writing the checkpoint .*step-00000004.ckpt.tmp failed (disk full?)" "$dir/full.err" ||
  { cat "$dir/full.err"; fail "no full-disk message"; }
[ "$(cd "$dir/full" && ls)" = "step-00000002.ckpt" ] || fail "after the full disk: $(ls "$dir/full")"
"$bin" "${args[@]}" --steps 6 --checkpoint-dir "$dir/full" --resume auto --export "$dir/after_full" > /dev/null \
  2> "$dir/after_full.err" || { cat "$dir/after_full.err"; fail "resuming after the full disk"; }
cmp -s "$dir/straight/model.safetensors" "$dir/after_full/model.safetensors" || fail "the run resumed after a full disk differs"
echo PASS
