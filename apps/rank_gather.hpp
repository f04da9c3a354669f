// Gathering a result split over the ranks onto rank 0, the one that checks and dumps (shared by
// `seqpar attn` and `seqpar linear-attn`).
#pragma once

#include "seqpar/comm.hpp"
#include "seqpar/layout.hpp"
#include "seqpar/tensor.hpp"

namespace seqpar::app {

// Gathers every rank's [.., S_r, ..] tensor (sequence along seq_dim) into the global tensor on
// rank 0 (the only one that checks or dumps; a million-token result is tens of GiB). Shards
// are padded to the longest one. Collective; *global is left alone on the other ranks.
[[nodiscard]] Status gather_on_rank0(Communicator& comm, const Layout& layout, const HostTensor& local, int seq_dim,
                                     HostTensor* global);

}  // namespace seqpar::app
