// Gathering a sharded result onto rank 0 (rank_gather.hpp).
#include "rank_gather.hpp"

#include <vector>

namespace seqpar::app {

Status gather_on_rank0(Communicator& comm, const Layout& layout, const HostTensor& local,
                       int seq_dim, HostTensor* global) {
  const TensorView& lv = local.view();
  std::vector<int64_t> padded_shape(lv.shape.begin(), lv.shape.begin() + lv.ndim);
  padded_shape[seq_dim] = layout.max_local_len();
  HostTensor padded(lv.dtype, padded_shape);
  TensorView rows = padded.view();
  rows.shape[seq_dim] = lv.shape[seq_dim];
  // Copy the local rows into the padded buffer through a one-rank layout (an identity map).
  SP_ASSIGN_OR_RETURN(const Layout identity,
                      Layout::create(LayoutKind::kContiguous, lv.shape[seq_dim], 1));
  SP_RETURN_IF_ERROR(identity.unshard(lv, seq_dim, 0, rows));
  const int P = comm.size();
  if (comm.rank() != 0) {
    const SendSpec to_root{0, padded.view().data, padded.bytes()};
    return comm.exchange({&to_root, 1}, {});
  }
  // One peer at a time: a GPU communicator stages what it receives in device memory.
  std::vector<HostTensor> blocks(P);
  for (int r = 1; r < P; ++r) {
    blocks[r] = HostTensor(lv.dtype, padded_shape);
    const RecvSpec from{r, blocks[r].view().data, padded.bytes()};
    SP_RETURN_IF_ERROR(comm.exchange({}, {&from, 1}));
  }
  blocks[0] = std::move(padded);
  std::vector<int64_t> global_shape = padded_shape;
  global_shape[seq_dim] = layout.seq_len();
  *global = HostTensor(lv.dtype, global_shape);
  for (int r = 0; r < P; ++r) {
    TensorView block = blocks[r].view();
    block.shape[seq_dim] = layout.local_len(r);
    SP_RETURN_IF_ERROR(layout.unshard(block, seq_dim, r, global->view()));
    blocks[r] = HostTensor();
  }
  return Status::Ok();
}

}  // namespace seqpar::app
