// issue_nccl_collective (nccl_collectives.hpp): our dtypes and reductions in NCCL's terms.
#include "comm/nccl_collectives.hpp"

namespace seqpar {
namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kF64: return ncclFloat64;
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kMax ? ncclMax : ncclSum; }

}  // namespace

ncclResult_t issue_nccl_collective(const CollectiveSpec& spec, ncclComm_t comm, cudaStream_t stream) {
  switch (spec.kind) {
    case CollectiveKind::kAllGather:
      return ncclAllGather(spec.send, spec.recv, spec.count, ncclUint8, comm, stream);
    case CollectiveKind::kReduceScatter:
      return ncclReduceScatter(spec.send, spec.recv, spec.count, nccl_type(spec.dtype), nccl_op(spec.op), comm,
                               stream);
    case CollectiveKind::kAllReduce:
      return ncclAllReduce(spec.send, spec.recv, spec.count, nccl_type(spec.dtype), nccl_op(spec.op), comm, stream);
  }
  return ncclInvalidArgument;
}

}  // namespace seqpar
