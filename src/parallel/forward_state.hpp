// ForwardState's insides (include/seqpar/distributed_attention.hpp): the blocks a forward kept,
// by head group and name, each as its executor stores it.
#pragma once

#include <map>
#include <memory>
#include <utility>

#include "seqpar/distributed_attention.hpp"

namespace seqpar {

struct ForwardState::Impl {
  std::map<std::pair<int, Block>, std::shared_ptr<void>> blocks;  // (head group, block)
  const AttentionPlan* plan = nullptr;                               // the plan that kept them
};

}  // namespace seqpar
