// Schedules as data (include/seqpar/schedule.hpp): the request a schedule is made from, head
// parts, the bytes walked from its steps and their printed form. The validator is in
// schedule_validator.cpp.
#include "seqpar/schedule.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <span>
#include <sstream>

#include "parallel/block_plan.hpp"

namespace seqpar {

const char* block_kind_name(BlockKind kind) {
  switch (kind) {
    case BlockKind::kKV: return "KV";
    case BlockKind::kQuery: return "Q";
    case BlockKind::kOutput: return "O";
    case BlockKind::kQueryPack: return "Qpack";
    case BlockKind::kDQ: return "dQ";
    case BlockKind::kDKV: return "dKV";
    case BlockKind::kGradPack: return "dOpack";
  }
  return "?";
}

const char* link_class_name(LinkClass link) { return link == LinkClass::kIntra ? "intra" : "inter"; }

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::kPointToPoint: return "point-to-point";
    case Collective::kAllToAll: return "all-to-all";
    case Collective::kSwap: return "transpose swap";
    case Collective::kRowAllGather: return "row all-gather";
    case Collective::kColumnAllGather: return "column all-gather";
    case Collective::kRowReduceScatter: return "row reduce-scatter";
    case Collective::kColumnReduceScatter: return "column reduce-scatter";
  }
  return "?";
}

std::string block_name(const Block& b) {
  std::string n = std::string(block_kind_name(b.kind)) + "[" + std::to_string(b.shard);
  if (b.span != 1) n += "+" + std::to_string(b.span);
  n += "]";
  if (b.part != kAllHeads) n += "/h" + std::to_string(b.part);
  return n;
}

HeadRange head_part_range(int part, int parts, int64_t heads) {
  const int64_t n = heads / parts;
  return {part * n, (part + 1) * n};
}

HeadRange kv_part_range(int part, int parts, int64_t heads, int64_t kv_heads) {
  const HeadRange q = head_part_range(part, parts, heads);
  const int64_t group = heads / kv_heads;  // query heads per K/V head
  return {q.first / group, (q.last - 1) / group + 1};
}

std::string head_parts_refusal(int parts, int64_t heads, int64_t kv_heads) {
  if (parts < 1) return "head parts must be positive";
  if (heads % parts != 0)
    return std::to_string(heads) + " query heads do not split into " + std::to_string(parts) +
           " equal head parts (the Ulysses degree must divide the heads)";
  if (kv_heads % parts != 0 && parts % kv_heads != 0)
    return std::to_string(kv_heads) + " K/V heads neither split into " + std::to_string(parts) +
           " parts nor divide them (a part's queries would read parts of two K/V heads)";
  return {};
}

std::vector<Block> span_pieces(const Block& block) {
  std::vector<Block> out;
  for (int x = block.shard; x < block.shard + block.span; ++x) out.push_back({block.kind, x, 1, block.part});
  return out;
}

int64_t block_rows(const Block& block, const Layout& layout) {
  int64_t rows = 0;
  for (int x = block.shard; x < block.shard + block.span; ++x) rows += layout.local_len(x);
  return rows;
}

BlockBytes BlockBytes::head_part(int part, int head_parts) const {
  BlockBytes b = *this;
  const int64_t group_heads = heads / head_groups, group_kv_heads = kv_heads / head_groups;
  b.heads = head_part_range(part, head_parts, group_heads).count();
  b.kv_heads = kv_part_range(part, head_parts, group_heads, group_kv_heads).count();
  b.head_groups = 1;
  return b;
}

int64_t BlockBytes::of(const Block& block, const Layout& layout, int head_parts) const {
  if (block.part == kAllHeads) return of(block.kind, block_rows(block, layout));
  return head_groups * head_part(block.part, head_parts).of(block.kind, block_rows(block, layout));
}

ScheduleRequest make_schedule_request(const Layout& layout, const MaskSpec& mask, int64_t heads,
                                      int64_t kv_heads, Topology topology) {
  ScheduleRequest r;
  r.ranks = layout.ranks();
  r.topology = topology;
  r.heads = heads;
  r.kv_heads = kv_heads;
  r.visible.assign(r.ranks, std::vector<bool>(r.ranks, false));
  r.pair_rows.assign(r.ranks, std::vector<ScheduleRequest::PairRows>(r.ranks));
  for (int a = 0; a < r.ranks; ++a) r.shard_rows.push_back(layout.local_len(a));
  // Each shard's arithmetic position runs (zigzag: its two chunks), as row ranges; a shard of
  // more than a few runs counts as one (its pairs' results are not trimmed).
  std::vector<std::vector<std::pair<int64_t, int64_t>>> runs(r.ranks);
  for (int a = 0; a < r.ranks; ++a) {
    std::vector<PositionRunSpan> spans = arithmetic_runs(layout.positions(a));
    if (spans.size() > 8) spans.clear();
    for (const PositionRunSpan& run : spans) runs[a].push_back({run.begin, run.end});
    if (runs[a].empty()) runs[a].push_back({0, int64_t(layout.positions(a).size())});
  }
  // The hull of the runs of `of` that see (or are seen by) the other shard's rows.
  const auto hull = [&](int of, const auto& sees) {
    std::pair<int64_t, int64_t> h{0, 0};
    bool any = false;
    for (const auto& [b, e] : runs[of]) {
      const std::span<const int64_t> run(layout.positions(of).data() + b, size_t(e - b));
      if (!sees(run)) continue;
      h = any ? std::pair{h.first, e} : std::pair{b, e};
      any = true;
    }
    return h;
  };
  for (int a = 0; a < r.ranks; ++a)
    for (int b = 0; b < r.ranks; ++b) {
      const std::vector<int64_t>&qa = layout.positions(a), &kb = layout.positions(b);
      r.visible[a][b] = mask.sees_any(qa, kb);
      if (!r.visible[a][b]) continue;
      const auto q = runs[a].size() == 1 ? std::pair<int64_t, int64_t>{0, int64_t(qa.size())}
                                         : hull(a, [&](std::span<const int64_t> run) { return mask.sees_any(run, kb); });
      const auto k = runs[b].size() == 1 ? std::pair<int64_t, int64_t>{0, int64_t(kb.size())}
                                         : hull(b, [&](std::span<const int64_t> run) { return mask.sees_any(qa, run); });
      r.pair_rows[a][b] = {q.first, q.second, k.first, k.second};
    }
  return r;
}

int64_t transfer_bytes(const Transfer& t, int to_rank, const Layout& layout, const BlockBytes& bytes, int head_parts) {
  const BlockBytes wire = bytes.on_wire(t.block, to_rank);
  if (!t.trimmed()) return wire.of(t.block, layout, head_parts);
  const int64_t rows = t.row_end - t.row_begin;
  if (t.block.part == kAllHeads) return wire.of(t.block.kind, rows);
  return wire.head_groups * wire.head_part(t.block.part, head_parts).of(t.block.kind, rows);
}

int64_t BlockBytes::of(BlockKind kind, int64_t rows) const {
  const int64_t q = batch * rows * heads * head_dim, kv = batch * rows * kv_heads * head_dim,
                row_stats = batch * heads * rows;
  switch (kind) {
    case BlockKind::kKV: return 2 * kv * dtype_size(input);
    case BlockKind::kQuery: return q * dtype_size(input);
    case BlockKind::kOutput: return q * dtype_size(accumulator) + row_stats * dtype_size(stats);
    case BlockKind::kQueryPack:
      return pack_has_delta ? 2 * q * dtype_size(input) + 2 * row_stats * dtype_size(stats)
                            : 3 * q * dtype_size(input) + row_stats * dtype_size(stats);
    case BlockKind::kGradPack:
      return pack_has_delta ? q * dtype_size(input) + 2 * row_stats * dtype_size(stats)
                            : 2 * q * dtype_size(input) + row_stats * dtype_size(stats);
    case BlockKind::kDQ: return q * dtype_size(accumulator);
    case BlockKind::kDKV: return 2 * kv * dtype_size(accumulator);
  }
  return 0;
}

WalkedBytes walk_bytes(const std::vector<Step>& steps, int rank, const Layout& layout,
                       const BlockBytes& bytes, const Topology& topology, int head_parts) {
  WalkedBytes w;
  for (const Step& s : steps)
    for (const Transfer& t : s.sends) {
      const int64_t b = transfer_bytes(t, t.peer, layout, bytes, head_parts);
      const LinkClass link = topology.node_of(t.peer) == topology.node_of(rank) ? LinkClass::kIntra
                                                                                 : LinkClass::kInter;
      w.total += b;
      w.by_link[static_cast<int>(link)] += b;
      w.by_collective[static_cast<int>(s.collective)] += b;
    }
  return w;
}

double compute_work(const std::vector<Step>& steps, const ScheduleRequest& request, int head_parts) {
  double work = 0;
  for (const Step& s : steps) {
    if (s.kind != StepKind::kCompute) continue;
    int pairs = 0;
    for (int q = s.q_shard; q < s.q_shard + s.q_span; ++q)
      for (int kv = s.kv_shard; kv < s.kv_shard + s.kv_span; ++kv) pairs += request.visible[q][kv] ? 1 : 0;
    work += s.part == kAllHeads ? pairs : double(pairs) / head_parts;
  }
  return work;
}

std::string describe_steps(const std::vector<Step>& steps, const Topology& topology, int rank) {
  std::ostringstream out;
  const auto block = [](const Block& b) { return block_name(b); };
  const auto rows = [](const Transfer& t) {
    return t.trimmed() ? " rows " + std::to_string(t.row_begin) + "-" + std::to_string(t.row_end) : std::string();
  };
  const auto link = [&](int peer) {
    return topology.ranks_per_node > 0 && topology.node_of(peer) != topology.node_of(rank) ? " (inter)" : "";
  };
  for (const Step& s : steps) {
    out << "  round " << s.round << "  ";
    if (s.kind == StepKind::kCompute) {
      out << "compute " << block(s.q_block(BlockKind::kQuery)) << " x " << block(s.kv_block(BlockKind::kKV));
    } else if (s.kind == StepKind::kWait) {
      out << "wait #" << s.batch;
    } else if (s.kind == StepKind::kConcat || s.kind == StepKind::kSplit || s.kind == StepKind::kPack) {
      out << (s.kind == StepKind::kConcat ? "concat " : s.kind == StepKind::kSplit ? "split " : "pack ")
          << block(s.block);
    } else {
      out << "post #" << s.batch;
      if (s.collective != Collective::kPointToPoint) out << " (" << collective_name(s.collective) << ")";
      out << ":";
      for (const Transfer& t : s.sends) out << " send " << block(t.block) << rows(t) << "->r" << t.peer << link(t.peer);
      for (const Transfer& t : s.recvs)
        out << " recv " << block(t.block) << rows(t) << "<-r" << t.peer << link(t.peer)
            << (t.combine == Combine::kAdd ? " (add)" : t.combine == Combine::kMerge ? " (merge)" : "")
            << (t.into_span ? " (into " + block(*t.into_span) + ")" : "");
    }
    out << '\n';
  }
  return out.str();
}

}  // namespace seqpar
