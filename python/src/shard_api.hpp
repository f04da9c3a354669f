// The module's functions for attention over local shards (seqpar.torch): rank contexts over a
// Python transport (torch.distributed), NCCL (its id carried by the caller) or thread ranks,
// and the forward / backward on them.
#pragma once

#include <nanobind/nanobind.h>

namespace seqpar::py {

void register_shard_api(nanobind::module_& m);

}  // namespace seqpar::py
