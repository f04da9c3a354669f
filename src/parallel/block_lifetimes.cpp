// How long the executors keep each block of a schedule (include/seqpar/schedule.hpp): where a
// received input is last used, how each result is made (so how it is held), and the most block bytes a rank
// holds at once, which the planner divides into head groups to bound the GPU executor's
// workspace.
#include <algorithm>

#include "seqpar/schedule.hpp"

namespace seqpar {

std::map<Block, size_t> last_input_uses(const std::vector<Step>& steps, Pass pass, int rank,
                                        const std::vector<Block>& kept) {
  std::map<int, size_t> wait_of;
  for (size_t i = 0; i < steps.size(); ++i)
    if (steps[i].kind == StepKind::kWait) wait_of[steps[i].batch] = i;
  const BlockKind query = pass == Pass::kForward ? BlockKind::kQuery : BlockKind::kQueryPack;
  std::map<Block, size_t> last;
  const auto use = [&](const Block& b, size_t at) {
    const bool initial = b.shard == rank && b.span == 1 && b.part == kAllHeads;
    const bool keep = std::find(kept.begin(), kept.end(), b) != kept.end();
    if (!initial && !keep && !is_result(b.kind)) last[b] = std::max(last[b], at);
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    if (s.kind == StepKind::kCompute) {
      use(s.q_block(query), i);
      use(s.kv_block(BlockKind::kKV), i);
    } else if (s.kind == StepKind::kConcat && !is_result(s.block.kind)) {
      for (const Block& piece : span_pieces(s.block)) use(piece, i);
    } else if (s.kind == StepKind::kPack) {
      for (BlockKind kind : {BlockKind::kQuery, BlockKind::kGradPack}) {
        Block in = s.block;
        in.kind = kind;
        use(in, i);
      }
    } else if (s.kind == StepKind::kPost) {
      for (const Transfer& t : s.sends) use(t.block, wait_of[s.batch]);
      for (const Transfer& t : s.recvs) use(t.block, wait_of[s.batch]);  // held at least until it arrives
    }
  }
  return last;
}

std::map<Block, ResultUse> result_uses(const std::vector<Step>& steps, Pass pass) {
  const bool forward = pass == Pass::kForward;
  std::map<Block, ResultUse> uses;
  for (const Step& s : steps) {
    if (s.kind == StepKind::kCompute) {
      ++uses[s.q_block(forward ? BlockKind::kOutput : BlockKind::kDQ)].parts;
      if (!forward) ++uses[s.kv_block(BlockKind::kDKV)].parts;
    } else if ((s.kind == StepKind::kConcat || s.kind == StepKind::kSplit) && is_result(s.block.kind)) {
      uses[s.block].regrouped = true;
      for (const Block& piece : span_pieces(s.block)) uses[piece].regrouped = true;
    } else if (s.kind == StepKind::kPost) {
      for (const Transfer& t : s.recvs)
        if (is_result(t.block.kind)) ++uses[t.block].parts;
      for (const Transfer& t : s.sends)
        if (is_result(t.block.kind) && !goes_home(t.block, t.peer)) uses[t.block].travels_on = true;
    }
  }
  return uses;
}

bool holds_rounded(const Block& b, const ResultUse& use, int rank, int head_parts) {
  const bool joined = b.shard == rank && b.span == 1 && b.part == kAllHeads && head_parts > 1;
  return use.parts <= 2 && !use.travels_on && !use.regrouped && !joined;
}

int64_t peak_block_bytes(const std::vector<Step>& steps, Pass pass, int rank, const Layout& layout,
                         const BlockBytes& bytes, int head_parts) {
  const int64_t rows = layout.max_local_len();
  std::map<Block, ResultUse> uses;
  if (bytes.results_rounded) uses = result_uses(steps, pass);
  const auto rounded = [&](const Block& b) {
    const auto it = uses.find(b);
    return it != uses.end() && holds_rounded(b, it->second, rank, head_parts);
  };
  // `bytes` is one head group's; `to`: the rank a transfer goes to (goes_home), or -1: as held;
  // `trimmed_rows`: the rows of a transfer of some rows only (the executor receives just those).
  const auto size = [&](const Block& b, int to = -1, int64_t trimmed_rows = -1) -> int64_t {
    BlockBytes wire = bytes.on_wire(b, to);
    if (to < 0 && rounded(b)) {
      if (is_own_result(b, rank)) return 0;  // the caller's tensors
      wire.accumulator = bytes.input;
    }
    return (b.part == kAllHeads ? wire : wire.head_part(b.part, head_parts))
        .of(b.kind, trimmed_rows >= 0 ? trimmed_rows : rows * b.span);
  };
  // Whether a result received whole can be the block as the rank holds it (the executor's
  // adoptable): it travels in the form it is held in, and is not the caller's tensors.
  const auto adoptable = [&](const Block& b) {
    const bool rounds_home = bytes.accumulator != bytes.input && goes_home(b, rank);
    return rounds_home == rounded(b) && !(rounded(b) && is_own_result(b, rank));
  };
  const std::map<Block, size_t> last = last_input_uses(steps, pass, rank);
  std::map<Block, int64_t> held;  // and the bytes each takes
  // Per batch: the bytes of the rounded copies of results sent home (gone at the wait), the
  // results sent, and the result parts arriving to be combined, each a buffer of its own from
  // the post to the wait: a compute in between makes the result beside it (it cannot write into
  // a buffer being received into), so both are held at once.
  std::map<int, int64_t> in_flight;
  std::map<int, std::vector<Block>> leaving;
  std::map<int, std::vector<std::pair<Transfer, int64_t>>> arriving;
  int64_t live = 0, peak = 0;
  const auto hold = [&](const Block& b, int to = -1) {
    if (held.emplace(b, size(b, to)).second) live += held[b], peak = std::max(peak, live);
  };
  const auto drop = [&](const Block& b) {
    auto it = held.find(b);
    if (it != held.end()) live -= it->second, held.erase(it);
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    if (s.kind == StepKind::kCompute) {
      hold(s.q_block(pass == Pass::kForward ? BlockKind::kOutput : BlockKind::kDQ));
      if (pass == Pass::kBackward) hold(s.kv_block(BlockKind::kDKV));
    } else if (s.kind == StepKind::kConcat) {
      // The rank's own input piece of a head part is cut out of its whole-heads block first.
      if (!is_result(s.block.kind))
        for (const Block& b : span_pieces(s.block))
          if (b.shard == rank && b.part != kAllHeads) hold(b);
      hold(s.block);
      for (const Block& b : span_pieces(s.block)) drop(b);
    } else if (s.kind == StepKind::kSplit) {  // the pieces are made before the span result goes
      for (const Block& b : span_pieces(s.block)) hold(b);
      drop(s.block);
    } else if (s.kind == StepKind::kPack) {
      hold(s.block);
    } else if (s.kind == StepKind::kPost) {
      for (const Transfer& t : s.recvs)  // spans received straight into are made first
        if (t.into_span) hold(*t.into_span);
      for (const Transfer& t : s.sends)  // a head part of the rank's own input is cut out to be sent
        if (!is_result(t.block.kind) && t.block.part != kAllHeads && t.block.shard == rank) hold(t.block);
      const auto in_flight_too = [&](int64_t bytes_of) {
        live += bytes_of, in_flight[s.batch] += bytes_of, peak = std::max(peak, live);
      };
      for (const Transfer& t : s.recvs) {
        if (t.into_span) continue;
        if (!is_result(t.block.kind) || (t.combine == Combine::kReplace && adoptable(t.block))) {
          hold(t.block, rank);  // the block as it arrives
          continue;
        }
        // A part to combine at the wait (of its rows alone where trimmed).
        const int64_t part = size(t.block, rank, t.trimmed() ? t.row_end - t.row_begin : -1);
        live += part, peak = std::max(peak, live);
        arriving[s.batch].emplace_back(t, part);
      }
      for (const Transfer& t : s.sends) {
        if (!is_result(t.block.kind)) continue;
        leaving[s.batch].push_back(t.block);
        if (goes_home(t.block, t.peer) && bytes.accumulator != bytes.input && !rounded(t.block))
          in_flight_too(size(t.block, t.peer));  // its rounded copy
      }
    } else {
      live -= in_flight[s.batch];
      for (const Block& b : leaving[s.batch]) drop(b);
      // Each part arrived: the result where none is held and it came whole in the held form;
      // else the result (made now where no compute made it) takes it in, and it goes.
      for (const auto& [t, part] : arriving[s.batch]) {
        if (t.combine == Combine::kReplace) drop(t.block);
        if (!held.count(t.block) && adoptable(t.block) && !t.trimmed()) {
          held[t.block] = part;
          continue;
        }
        hold(t.block);
        live -= part;
      }
      in_flight.erase(s.batch), leaving.erase(s.batch), arriving.erase(s.batch);
    }
    for (const auto& [b, at] : last)
      if (at == i) drop(b);
  }
  return peak;
}

}  // namespace seqpar
