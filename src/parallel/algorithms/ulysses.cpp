// DeepSpeed-Ulysses: every rank one Ulysses group member (u = P, no ring): an all-to-all from
// sequence shards to head parts, attention over the whole sequence for 1/P of the heads, an
// all-to-all back. The degree must divide the heads; with GQA and fewer K/V heads than P a
// K/V head goes to every part that reads it (counted in the bytes). ulysses_grid.hpp.
#include "parallel/algorithms/ulysses_grid.hpp"

namespace seqpar::parallel::algorithms {

extern const Algorithm ulysses{
    "ulysses", "all-to-all to head parts, whole-sequence attention per part, all-to-all back",
    [](const ScheduleRequest& req) { return ulysses_refusal(req, req.ranks); },
    [](const ScheduleRequest& req, int rank) { return ulysses_schedule(req, rank, req.ranks, *find_algorithm("ring")); }};

}  // namespace seqpar::parallel::algorithms
