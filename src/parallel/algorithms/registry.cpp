// The list of algorithms (include/seqpar/algorithm.hpp): one entry per file in this folder.
#include "seqpar/algorithm.hpp"

namespace seqpar {

// Each name N here is defined as `const Algorithm N` in N.cpp beside this file.
#define SEQPAR_ALGORITHMS(X)                                                                   \
  X(ring) X(burst) X(ring_return) X(burst_return) X(distflash) X(double_ring) X(ulysses) X(ulysses_overlap) X(ulysses_ring) \
  X(attention2d) X(attention2d_overlap)

namespace parallel::algorithms {
#define SEQPAR_DECLARE(name) extern const Algorithm name;
SEQPAR_ALGORITHMS(SEQPAR_DECLARE)
}  // namespace parallel::algorithms

const std::vector<const Algorithm*>& all_algorithms() {
#define SEQPAR_ENTRY(name) &parallel::algorithms::name,
  static const std::vector<const Algorithm*> list{SEQPAR_ALGORITHMS(SEQPAR_ENTRY)};
  return list;
}

const Algorithm* find_algorithm(std::string_view name) {
  for (const Algorithm* a : all_algorithms())
    if (name == a->name) return a;
  return nullptr;
}

std::string algorithm_names() {
  std::string names;
  for (const Algorithm* a : all_algorithms()) names += (names.empty() ? "" : "|") + std::string(a->name);
  return names;
}

}  // namespace seqpar
