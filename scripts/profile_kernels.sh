#!/usr/bin/env bash
# What limits our own attention kernels (issue 3), measured on the GPU machine in one call:
#   1. registers, shared memory and spills of each kernel (ptxas -v), and where the spills sit
#      in the SASS (cuobjdump: local loads/stores between the tensor-core instructions);
#   2. Nsight Compute on one forward and one backward launch at S = 32K, H = 32, D = 128,
#      causal, bf16: speed of light, occupancy, warp stall reasons, the tensor pipe's share,
#      shared-memory bank conflicts (ncu --clock-control none: the clocks are left alone);
#      then a second pass splitting the conflicts into loads and stores, with the stall reasons;
#   3. a third, source-level pass (SourceCounters): executions and stall samples of every SASS
#      instruction, summarised by scripts/ncu_source_summary.py (opcodes per mma, stall reasons,
#      the instructions that stall most).
# Results go to $OUT (or ./gpu_out): ptxas.txt, spills.txt, ncu_{fwd,bwd}.csv,
# ncu_{fwd,bwd}_shared.csv (the second pass), ncu_{fwd,bwd}_source.csv (the third), and a
# short summary on stdout. Needs the build of scripts/gpu_check.sh (it runs its build stage).
# Env: SEQS (default 32768), MASKS (default causal).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu_out}"
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cuda_bin="$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")"

# 1. Registers and spills, straight from the compiler (no GPU needed for this part), with the
#    flags CMake gives the library's CUDA sources.
rm -f "$out/spills.txt"
for f in flash_forward flash_backward; do
  "$cuda_bin/nvcc" -std=c++20 -O3 --use_fast_math -lineinfo -DSEQPAR_HAVE_CUDA=1 -arch=sm_90a -Xptxas -v \
    -I include -I src -c "src/kernels/cuda/$f.cu" -o "/tmp/$f.o" 2>&1 | tee "/tmp/$f.ptxas" |
    grep -E "Compiling entry|registers|spill|error"
  if [ -x "$cuda_bin/cuobjdump" ]; then
    # Each kernel's local-memory traffic with its SASS address, and where the tensor-core ops
    # and barriers start, to tell a spill in the key-tile loop from one in the prologue.
    "$cuda_bin/cuobjdump" --dump-sass "/tmp/$f.o" | awk -v file="$f" '
      /Function :/ { match($3, /(forward|backward)_kernelI[^E]*/); fn = substr($3, RSTART, RLENGTH); mma = 0 }
      /HMMA/ && !mma { mma = 1; print file, fn, "first HMMA at", $1 }
      /BAR.SYNC/ { print file, fn, "BAR.SYNC at", $1 }
      /[ \t](STL|LDL)[ .]/ { for (i = 2; i <= NF; ++i) if ($i ~ /^(STL|LDL)/) { print file, fn, $i, "at", $1; break } }' >> "$out/spills.txt"
  fi
done > "$out/ptxas.txt"
echo "== ptxas (registers, spills)"
awk '/Compiling entry/ { match($0, /(forward|backward)_kernelI[^E]*/); name = substr($0, RSTART, RLENGTH) }
     /spill stores/ { spill = $5 " B spilled" }
     /Used [0-9]+ registers/ { print "  " name ": " $5 " registers, " spill }' "$out/ptxas.txt"
[ -s "$out/spills.txt" ] && { echo "== local loads/stores per kernel (addresses in spills.txt)"; grep -E " (STL|LDL)" "$out/spills.txt" | cut -d' ' -f1-3 | sort | uniq -c; }

# 2. Nsight Compute on the benchmark's kernels.
logs="$(mktemp -d)"  # build and ncu logs: $OUT keeps eight files (what the device tool returns)
OUT="$logs/build" BUILD_TARGETS=bench_gpu_attention bash scripts/gpu_check.sh build > "$logs/build.txt" 2>&1 ||
  { echo "build failed"; tail -20 "$logs/build.txt"; exit 1; }
ncu_bin="$(command -v ncu || echo "$cuda_bin/ncu")"
[ -x "$ncu_bin" ] || ncu_bin="$(ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)"
[ -x "$ncu_bin" ] || { echo "no ncu here"; exit 1; }
# summarise CSV [WORD ...]: the metrics of an ncu --csv file whose names contain a WORD (all
# of them without words).
summarise() {
  python3 - "$@" <<'EOF'
import csv, sys
wanted = sys.argv[2:]
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if not rows:
    print("  no ncu rows")
    sys.exit(0)
head = rows[0]
name_i, unit_i, value_i = head.index("Metric Name"), head.index("Metric Unit"), head.index("Metric Value")
for r in rows[1:]:
    if not wanted or any(w in r[name_i] for w in wanted):
        print(f"  {r[name_i]}: {r[value_i]} {r[unit_i]}")
EOF
}
ncu_launch() {  # ncu_launch KERNEL NCU_ARGS...: ncu on one launch of KERNEL after the warm-ups
  local kernel="$1"
  shift
  "$ncu_bin" --clock-control none -k "regex:$kernel" --launch-skip 2 --launch-count 1 "$@" \
    ./build-gpu/bench_gpu_attention --backends cuda --seqs "${SEQS:-32768}" --masks "${MASKS:-causal}"
}
ncu_run() {  # ncu_run KERNEL OUTPUT_STEM NCU_ARGS...: the details page as CSV
  local kernel="$1" stem="$2"
  shift 2
  ncu_launch "$kernel" "$@" --csv --page details > "$out/$stem.csv" 2> "$logs/$stem.err"
  local rc=$?
  echo "== ncu $kernel -> $stem.csv (rc $rc)"
  [ $rc -eq 0 ] || tail -n 15 "$logs/$stem.err"
}
for kernel in forward_kernel backward_kernel; do
  short="${kernel%_kernel}"
  short="${short/forward/fwd}"
  short="${short/backward/bwd}"
  ncu_run "$kernel" "ncu_$short" \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed_op_local_ld.sum,smsp__inst_executed_op_local_st.sum
  summarise "$out/ncu_$short.csv" "Compute (SM) Throughput" "Memory Throughput" Duration "Registers Per Thread" \
    "Achieved Occupancy" "Theoretical Occupancy" "Block Limit Registers" "Block Limit Shared Mem" \
    "Issue Slots Busy" "No Eligible" "Warp Cycles Per Issued Instruction" sm__pipe_tensor_op_hmma \
    bank_conflicts local_ld local_st Stall
  # A second pass for what the first cannot place: bank conflicts by operation (ld: ldmatrix,
  # st: st.shared, ldgsts: cp.async, atom, misc: names ncu gives on sm_90), the instructions,
  # the stall reasons.
  # Its own file, so a metric this ncu lacks costs this pass alone.
  ncu_run "$kernel" "ncu_${short}_shared" \
    --metrics 'l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ldgsts.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_atom.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_misc.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,smsp__inst_executed_op_ldsm.sum,smsp__sass_inst_executed_op_shared_st.sum,smsp__inst_executed_op_global_red.sum,smsp__inst_executed_op_ldgsts.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
  summarise "$out/ncu_${short}_shared.csv"
  # The third pass: per-instruction counters, exported as CSV from the report.
  ncu_launch "$kernel" --section SourceCounters --section WarpStateStats -f -o "$logs/${short}_source" \
    > "$logs/${short}_source.log" 2>&1 &&
    "$ncu_bin" -i "$logs/${short}_source.ncu-rep" --page source --csv --print-source sass \
      > "$out/ncu_${short}_source.csv" 2>> "$logs/${short}_source.log"
  rc=$?
  echo "== ncu $kernel, source level -> ncu_${short}_source.csv (rc $rc)"
  if [ $rc -eq 0 ]; then python3 scripts/ncu_source_summary.py "$out/ncu_${short}_source.csv" --top 5
  else tail -n 15 "$logs/${short}_source.log"; fi
done
