// The two Attention2D schedules over all ranks, for the algorithm table and for the errata
// regression tests, which rebuild them as printed (attention2d_grid.hpp's PrintedErrata).
#pragma once

#include "parallel/algorithms/attention2d_grid.hpp"

namespace seqpar::parallel {

// Without overlap (attention2d.cpp) and overlapped (attention2d_overlap.cpp).
PlanEvents attention2d_pass(const ScheduleRequest& req, Pass pass, const PrintedErrata& printed);
PlanEvents attention2d_overlap_pass(const ScheduleRequest& req, Pass pass, const PrintedErrata& printed);

}  // namespace seqpar::parallel
