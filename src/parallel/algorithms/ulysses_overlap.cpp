// DeepSpeed-Ulysses with its all-to-alls under the attention: the heads in two halves, each
// rank computing one head part of each (2P parts). Both halves' all-to-alls to head parts go out
// at once; the second half's arrives while the first half's attention runs, and the first half's
// results travel home under the second half's attention. Bytes are Ulysses'; what is hidden is
// the time of about half of them. ulysses_grid.hpp.
#include "parallel/algorithms/ulysses_grid.hpp"

namespace seqpar::parallel::algorithms {

extern const Algorithm ulysses_overlap{
    "ulysses-overlap", "Ulysses with the heads in two halves, each half's all-to-alls under the other's attention",
    [](const ScheduleRequest& req) { return ulysses_overlap_refusal(req); },
    [](const ScheduleRequest& req, int rank) { return ulysses_overlap_schedule(req, rank); }};

}  // namespace seqpar::parallel::algorithms
