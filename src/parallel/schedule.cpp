// Schedules as data (include/seqpar/schedule.hpp): the request a schedule is made from, the
// bytes walked from its steps, its printed form, and the validator that runs every rank's
// steps together symbolically (no tensors) to prove it matched, deadlock-free and complete.
#include "seqpar/schedule.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

namespace seqpar {

const char* block_kind_name(BlockKind kind) {
  switch (kind) {
    case BlockKind::kKV: return "KV";
    case BlockKind::kQuery: return "Q";
    case BlockKind::kOutput: return "O";
    case BlockKind::kQueryPack: return "Qpack";
    case BlockKind::kDQ: return "dQ";
    case BlockKind::kDKV: return "dKV";
  }
  return "?";
}

const char* link_class_name(LinkClass link) { return link == LinkClass::kIntra ? "intra" : "inter"; }

ScheduleRequest make_schedule_request(const Layout& layout, const MaskSpec& mask, int64_t heads,
                                      int64_t kv_heads, Topology topology) {
  ScheduleRequest r;
  r.ranks = layout.ranks();
  r.topology = topology;
  r.heads = heads;
  r.kv_heads = kv_heads;
  r.visible.assign(r.ranks, std::vector<bool>(r.ranks, false));
  for (int a = 0; a < r.ranks; ++a)
    for (int b = 0; b < r.ranks; ++b) r.visible[a][b] = mask.sees_any(layout.positions(a), layout.positions(b));
  return r;
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
    case BlockKind::kDQ: return q * dtype_size(accumulator);
    case BlockKind::kDKV: return 2 * kv * dtype_size(accumulator);
  }
  return 0;
}

WalkedBytes walk_bytes(const std::vector<Step>& steps, int rank, const Layout& layout,
                       const BlockBytes& bytes, const Topology& topology) {
  WalkedBytes w;
  for (const Step& s : steps)
    for (const Transfer& t : s.sends) {
      const int64_t b = bytes.of(t.block.kind, layout.local_len(t.block.shard));
      const LinkClass link = topology.node_of(t.peer) == topology.node_of(rank) ? LinkClass::kIntra
                                                                                 : LinkClass::kInter;
      w.total += b;
      w.by_link[static_cast<int>(link)] += b;
    }
  return w;
}

int count_computes(const std::vector<Step>& steps) {
  return static_cast<int>(std::count_if(steps.begin(), steps.end(),
                                        [](const Step& s) { return s.kind == StepKind::kCompute; }));
}

std::string describe_steps(const std::vector<Step>& steps, const Topology& topology, int rank) {
  std::ostringstream out;
  const auto block = [](const Block& b) {
    return std::string(block_kind_name(b.kind)) + "[" + std::to_string(b.shard) + "]";
  };
  const auto link = [&](int peer) {
    return topology.ranks_per_node > 0 && topology.node_of(peer) != topology.node_of(rank) ? " (inter)" : "";
  };
  for (const Step& s : steps) {
    out << "  round " << s.round << "  ";
    if (s.kind == StepKind::kCompute) {
      out << "compute Q[" << s.q_shard << "] x KV[" << s.kv_shard << "]";
    } else if (s.kind == StepKind::kWait) {
      out << "wait #" << s.batch;
    } else {
      out << "post #" << s.batch << ":";
      for (const Transfer& t : s.sends) out << " send " << block(t.block) << "->r" << t.peer << link(t.peer);
      for (const Transfer& t : s.recvs)
        out << " recv " << block(t.block) << "<-r" << t.peer << link(t.peer)
            << (t.combine == Combine::kAdd ? " (add)" : t.combine == Combine::kMerge ? " (merge)" : "");
    }
    out << '\n';
  }
  return out.str();
}

namespace {

// The symbolic state of one rank: which blocks it holds, and for results the set of (query
// shard, key shard) pairs summed into them, as q * P + kv.
struct SymbolicRank {
  size_t pc = 0;
  std::map<Block, std::set<int>> blocks;         // present blocks (activations: empty set)
  std::map<Block, bool> used;                    // activations received: read or sent on since
  struct Posted {
    const Step* step;
    std::vector<size_t> send_index, recv_index;  // each transfer's place in its pair's posting order
  };
  std::map<int, Posted> pending;                 // batches posted, not waited
};

struct Message {
  Block block;
  std::set<int> content;
};

class Validator {
 public:
  Validator(const std::vector<RankSchedule>& schedules, const ScheduleRequest& request, Pass pass)
      : P_(request.ranks), req_(request), pass_(pass), ranks_(P_), computed_(P_ * P_, 0) {
    for (int r = 0; r < P_; ++r) steps_.push_back(&schedules[r].pass(pass));
    for (int r = 0; r < P_; ++r) {
      const BlockKind home = pass == Pass::kForward ? BlockKind::kQuery : BlockKind::kQueryPack;
      ranks_[r].blocks[{BlockKind::kKV, r}] = {};
      ranks_[r].blocks[{home, r}] = {};
    }
  }

  Status run() {
    SP_CHECK_ARG(static_cast<int>(steps_.size()) == P_, "one schedule per rank");
    for (;;) {
      bool progressed = false, all_done = true;
      for (int r = 0; r < P_; ++r) {
        while (ranks_[r].pc < steps_[r]->size()) {
          SP_ASSIGN_OR_RETURN(const bool advanced, advance(r));
          if (!advanced) break;
          progressed = true;
        }
        all_done = all_done && ranks_[r].pc == steps_[r]->size();
      }
      if (all_done) break;
      if (!progressed) {
        std::string where;
        for (int r = 0; r < P_; ++r)
          if (ranks_[r].pc < steps_[r]->size())
            where += " r" + std::to_string(r) + "@step" + std::to_string(ranks_[r].pc);
        return SP_STATUS(StatusCode::kInternal, "schedule deadlocks: waiting at" + where);
      }
    }
    return finish();
  }

 private:
  static Status fail(int rank, const Step& s, const std::string& why) {
    return SP_STATUS(StatusCode::kInternal,
                     "rank " + std::to_string(rank) + " round " + std::to_string(s.round) + ": " + why);
  }
  static std::string name(const Block& b) {
    return std::string(block_kind_name(b.kind)) + "[" + std::to_string(b.shard) + "]";
  }
  bool arriving(int r, const Block& b) const {
    for (const auto& [id, posted] : ranks_[r].pending)
      for (const Transfer& t : posted.step->recvs)
        if (t.block == b && t.combine == Combine::kReplace) return true;
    return false;
  }
  bool in_flight(int r, const Block& b) const {
    for (const auto& [id, posted] : ranks_[r].pending)
      for (const Transfer& t : posted.step->sends)
        if (t.block == b) return true;
    return false;
  }

  StatusOr<bool> advance(int r) {
    SymbolicRank& me = ranks_[r];
    const Step& s = (*steps_[r])[me.pc];
    if (s.kind == StepKind::kPost) {
      SP_CHECK_ARG(!me.pending.count(s.batch), "rank " + std::to_string(r) + " posts batch " +
                                                   std::to_string(s.batch) + " twice");
      SymbolicRank::Posted posted{&s, {}, {}};
      for (const Transfer& t : s.sends) {
        if (t.peer == r || t.peer < 0 || t.peer >= P_) return fail(r, s, "sends to itself or to no rank");
        auto it = me.blocks.find(t.block);
        if (it == me.blocks.end() || arriving(r, t.block)) return fail(r, s, "sends " + name(t.block) + " it does not hold");
        me.used[t.block] = true;
        posted.send_index.push_back(channel_[{r, t.peer}].size());
        channel_[{r, t.peer}].push_back({t.block, it->second});
      }
      for (const Transfer& t : s.recvs) {
        if (t.peer == r || t.peer < 0 || t.peer >= P_) return fail(r, s, "receives from itself or from no rank");
        const bool result = is_result(t.block.kind);
        if (result != (t.combine != Combine::kReplace))
          return fail(r, s, name(t.block) + ": results are added or merged, inputs replaced");
        posted.recv_index.push_back(recv_seq_[{t.peer, r}].size());
        recv_seq_[{t.peer, r}].push_back(t.block);
      }
      me.pending[s.batch] = std::move(posted);
    } else if (s.kind == StepKind::kCompute) {
      SP_RETURN_IF_ERROR(compute(r, s));
    } else {
      auto it = me.pending.find(s.batch);
      if (it == me.pending.end()) return fail(r, s, "waits on batch " + std::to_string(s.batch) + " never posted");
      SP_ASSIGN_OR_RETURN(const bool done, complete(r, it->second));
      if (!done) return false;
      me.pending.erase(it);
    }
    ++me.pc;
    return true;
  }

  Status compute(int r, const Step& s) {
    SymbolicRank& me = ranks_[r];
    const int q = s.q_shard, kv = s.kv_shard;
    if (q < 0 || q >= P_ || kv < 0 || kv >= P_) return fail(r, s, "computes a shard that does not exist");
    if (!req_.visible[q][kv]) return fail(r, s, "computes a pair the mask leaves empty");
    const Block q_in{pass_ == Pass::kForward ? BlockKind::kQuery : BlockKind::kQueryPack, q};
    for (const Block& in : {q_in, Block{BlockKind::kKV, kv}}) {
      if (!me.blocks.count(in) || arriving(r, in)) return fail(r, s, "reads " + name(in) + " before it arrived");
      me.used[in] = true;
    }
    std::vector<Block> outs;
    if (pass_ == Pass::kForward) outs = {{BlockKind::kOutput, q}};
    else outs = {{BlockKind::kDQ, q}, {BlockKind::kDKV, kv}};
    for (const Block& out : outs) {
      if (in_flight(r, out)) return fail(r, s, "writes " + name(out) + " while it is being sent");
      std::set<int>& content = me.blocks[out];
      if (!content.insert(q * P_ + kv).second) return fail(r, s, "adds a pair twice into " + name(out));
    }
    ++computed_[q * P_ + kv];
    return Status::Ok();
  }

  // Completes a posted batch of rank r if every peer has posted its side.
  StatusOr<bool> complete(int r, const SymbolicRank::Posted& posted) {
    SymbolicRank& me = ranks_[r];
    const Step& s = *posted.step;
    for (size_t i = 0; i < s.sends.size(); ++i)  // a send completes once its receive is posted
      if (recv_seq_[{r, s.sends[i].peer}].size() <= posted.send_index[i]) return false;
    std::vector<const Message*> got;
    for (size_t i = 0; i < s.recvs.size(); ++i) {
      const Transfer& t = s.recvs[i];
      const auto& ch = channel_[{t.peer, r}];
      const size_t index = posted.recv_index[i];
      if (ch.size() <= index) return false;
      if (!(ch[index].block == t.block))
        return fail(r, s, "receives " + name(t.block) + " from r" + std::to_string(t.peer) + ", which sent " +
                              name(ch[index].block));
      got.push_back(&ch[index]);
    }
    for (const Transfer& t : s.sends)
      if (is_result(t.block.kind)) me.blocks.erase(t.block);  // a result leaves with its message
    for (size_t i = 0; i < s.recvs.size(); ++i) {
      const Transfer& t = s.recvs[i];
      if (t.combine == Combine::kReplace) {
        me.blocks[t.block] = {};
        if (t.block.shard != r) me.used[t.block] = false;
        continue;
      }
      std::set<int>& content = me.blocks[t.block];
      for (int pair : got[i]->content)
        if (!content.insert(pair).second)
          return fail(r, s, "receives a pair already summed into " + name(t.block));
    }
    return true;
  }

  Status finish() {
    for (int a = 0; a < P_; ++a)
      for (int b = 0; b < P_; ++b) {
        const int n = computed_[a * P_ + b];
        if (req_.visible[a][b] && n != 1)
          return SP_STATUS(StatusCode::kInternal, "pair Q[" + std::to_string(a) + "] x KV[" + std::to_string(b) +
                                                      "] computed " + std::to_string(n) + " times");
      }
    for (int r = 0; r < P_; ++r) {
      const SymbolicRank& me = ranks_[r];
      for (const auto& [block, content] : me.blocks) {
        if (is_result(block.kind) && block.shard != r)
          return SP_STATUS(StatusCode::kInternal, "rank " + std::to_string(r) + " ends holding " + name(block) +
                                                      ": a result that never went home");
        if (!is_result(block.kind) && block.shard != r && !me.used.at(block))
          return SP_STATUS(StatusCode::kInternal, "rank " + std::to_string(r) + " received " + name(block) +
                                                      " and never used it");
      }
      std::vector<std::pair<Block, std::set<int>>> want;
      std::set<int> by_q, by_kv;
      for (int x = 0; x < P_; ++x) {
        if (req_.visible[r][x]) by_q.insert(r * P_ + x);
        if (req_.visible[x][r]) by_kv.insert(x * P_ + r);
      }
      if (pass_ == Pass::kForward) want = {{{BlockKind::kOutput, r}, by_q}};
      else want = {{{BlockKind::kDQ, r}, by_q}, {{BlockKind::kDKV, r}, by_kv}};
      for (const auto& [block, pairs] : want) {
        const auto it = me.blocks.find(block);
        const std::set<int> have = it == me.blocks.end() ? std::set<int>{} : it->second;
        if (have != pairs)
          return SP_STATUS(StatusCode::kInternal, "rank " + std::to_string(r) + " ends with " + name(block) +
                                                      " summing " + std::to_string(have.size()) + " pairs, not " +
                                                      std::to_string(pairs.size()));
      }
    }
    return Status::Ok();
  }

  int P_;
  const ScheduleRequest& req_;
  Pass pass_;
  std::vector<const std::vector<Step>*> steps_;
  std::vector<SymbolicRank> ranks_;
  std::vector<int> computed_;
  std::map<std::pair<int, int>, std::vector<Message>> channel_;                     // (from, to): sends
  std::map<std::pair<int, int>, std::vector<Block>> recv_seq_;     // (from, to): recvs posted
};

}  // namespace

Status validate_schedules(const std::vector<RankSchedule>& schedules, const ScheduleRequest& request,
                          Pass pass) {
  Validator v(schedules, request, pass);
  return v.run();
}

}  // namespace seqpar
