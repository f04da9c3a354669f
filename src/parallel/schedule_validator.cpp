// The schedule validator (include/seqpar/schedule.hpp's validate_schedules): runs every rank's
// steps of a pass together symbolically (no tensors) to prove them matched, deadlock-free and
// complete: each visible (query shard, key shard, head part) computed once, every result home.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "seqpar/schedule.hpp"

namespace seqpar {

namespace {

// The symbolic state of one rank: which blocks it holds, and for results the set of (query
// shard, key shard, head part) triples summed into them, as (q * P + kv) * parts + part.
struct SymbolicRank {
  size_t pc = 0;
  std::map<Block, std::set<int>> blocks;         // present blocks (activations: empty set)
  std::map<Block, bool> used;                    // activations received or made: read or sent on since
  struct Posted {
    const Step* step;
    std::vector<size_t> send_index, recv_index;  // each transfer's place in its pair's posting order
  };
  std::map<int, Posted> pending;                 // batches posted, not waited
};

struct Message {
  Block block;
  std::set<int> content;
  int64_t row_begin, row_end;  // Transfer's rows
  std::optional<Block> into_span;
};

Block whole_heads(Block b) {
  b.part = kAllHeads;
  return b;
}

class Validator {
 public:
  Validator(const std::vector<RankSchedule>& schedules, const ScheduleRequest& request, Pass pass)
      : P_(request.ranks), U_(schedules.empty() ? 1 : schedules[0].head_parts), req_(request), pass_(pass),
        ranks_(P_), computed_(size_t(P_) * P_ * U_, 0) {
    for (int r = 0; r < P_; ++r) steps_.push_back(&schedules[r].pass(pass));
    for (int r = 0; r < P_; ++r) {
      const BlockKind home = pass == Pass::kForward ? BlockKind::kQuery : BlockKind::kQueryPack;
      ranks_[r].blocks[{BlockKind::kKV, r}] = {};
      ranks_[r].blocks[{home, r}] = {};
      kept_.push_back(schedules[r].kept);
      if (pass == Pass::kBackward)
        for (const Block& b : kept_[r]) ranks_[r].blocks[b] = {}, ranks_[r].used[b] = false;
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
  static std::string name(const Block& b) { return block_name(b); }
  // A result sent with some of its rows only: every pair summed into it touched no other row
  // (a trimmed block is one shard's, sent home).
  Status check_rows(int r, const Step& s, const Transfer& t, const std::set<int>& content) const {
    if (!t.trimmed()) return Status::Ok();
    if (t.block.span != 1 || t.block.kind == BlockKind::kOutput || req_.pair_rows.empty() || t.row_begin < 0 ||
        t.row_begin > t.row_end || t.row_end > req_.shard_rows[t.block.shard])
      return fail(r, s, "sends rows " + std::to_string(t.row_begin) + "-" + std::to_string(t.row_end) + " of " +
                            name(t.block) + ", which cannot be trimmed so");
    for (int pair : content) {
      const int q = pair / U_ / P_, kv = pair / U_ % P_;
      const ScheduleRequest::PairRows& rows = req_.pair_rows[q][kv];
      const bool dq = t.block.kind == BlockKind::kDQ;
      if ((dq ? rows.q_begin : rows.k_begin) < t.row_begin || (dq ? rows.q_end : rows.k_end) > t.row_end)
        return fail(r, s, "sends rows " + std::to_string(t.row_begin) + "-" + std::to_string(t.row_end) + " of " +
                              name(t.block) + ", but the pair Q[" + std::to_string(q) + "] x KV[" + std::to_string(kv) +
                              "] summed into it touched others");
    }
    return Status::Ok();
  }
  int triple(int q, int kv, int part) const { return (q * P_ + kv) * U_ + part; }
  bool valid_block(const Block& b) const {
    return b.span >= 1 && b.shard >= 0 && b.shard + b.span <= P_ && b.part >= kAllHeads && b.part < U_ &&
           (U_ > 1 || b.part == kAllHeads);
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
  // The block an input is read from: itself, or for a head part the same block with all heads.
  const Block* held_input(int r, const Block& b) const {
    const SymbolicRank& me = ranks_[r];
    if (me.blocks.count(b) && !arriving(r, b)) return &me.blocks.find(b)->first;
    const Block whole = whole_heads(b);
    if (b.part != kAllHeads && me.blocks.count(whole) && !arriving(r, whole)) return &me.blocks.find(whole)->first;
    const Block own_pack{BlockKind::kQueryPack, r};  // a rank's own grad pack is its pack less Q
    if (b.kind == BlockKind::kGradPack && b.shard == r && b.span == 1 && me.blocks.count(own_pack))
      return &me.blocks.find(own_pack)->first;
    return nullptr;
  }
  void mark_used(int r, const Block& b) { ranks_[r].used[b] = true; }

  StatusOr<bool> advance(int r) {
    SymbolicRank& me = ranks_[r];
    const Step& s = (*steps_[r])[me.pc];
    if (s.kind == StepKind::kPost) {
      SP_CHECK_ARG(!me.pending.count(s.batch), "rank " + std::to_string(r) + " posts batch " +
                                                   std::to_string(s.batch) + " twice");
      SymbolicRank::Posted posted{&s, {}, {}};
      for (const Transfer& t : s.sends) {
        if (t.peer == r || t.peer < 0 || t.peer >= P_) return fail(r, s, "sends to itself or to no rank");
        if (!valid_block(t.block)) return fail(r, s, "sends a block that does not exist: " + name(t.block));
        std::set<int> content;
        if (is_result(t.block.kind)) {
          auto it = me.blocks.find(t.block);
          if (it == me.blocks.end() || arriving(r, t.block)) return fail(r, s, "sends " + name(t.block) + " it does not hold");
          content = it->second;
          SP_RETURN_IF_ERROR(check_rows(r, s, t, content));
        } else {
          if (t.trimmed()) return fail(r, s, "sends some rows of " + name(t.block) + ", an input");
          const Block* from = held_input(r, t.block);
          if (!from) return fail(r, s, "sends " + name(t.block) + " it does not hold");
          mark_used(r, *from);
        }
        if (t.into_span && !joins(t.block, *t.into_span))
          return fail(r, s, "sends " + name(t.block) + " into " + name(*t.into_span) + ", a span it is no piece of");
        posted.send_index.push_back(channel_[{r, t.peer}].size());
        channel_[{r, t.peer}].push_back({t.block, content, t.row_begin, t.row_end, t.into_span});
      }
      for (const Transfer& t : s.recvs) {
        if (t.peer == r || t.peer < 0 || t.peer >= P_) return fail(r, s, "receives from itself or from no rank");
        if (!valid_block(t.block)) return fail(r, s, "receives a block that does not exist: " + name(t.block));
        const bool result = is_result(t.block.kind);
        if (result != (t.combine != Combine::kReplace))
          return fail(r, s, name(t.block) + ": results are added or merged, inputs replaced");
        if (t.into_span && (!joins(t.block, *t.into_span) || !concatenated_later(r, *t.into_span)))
          return fail(r, s, "receives " + name(t.block) + " into " + name(*t.into_span) +
                                ", which is no span it concatenates later with it");
        posted.recv_index.push_back(recv_seq_[{t.peer, r}].size());
        recv_seq_[{t.peer, r}].push_back(t.block);
      }
      me.pending[s.batch] = std::move(posted);
    } else if (s.kind == StepKind::kCompute) {
      SP_RETURN_IF_ERROR(compute(r, s));
    } else if (s.kind == StepKind::kConcat) {
      SP_RETURN_IF_ERROR(concat(r, s));
    } else if (s.kind == StepKind::kSplit) {
      SP_RETURN_IF_ERROR(split(r, s));
    } else if (s.kind == StepKind::kPack) {
      SP_RETURN_IF_ERROR(pack(r, s));
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
    const BlockKind query = pass_ == Pass::kForward ? BlockKind::kQuery : BlockKind::kQueryPack;
    const Block q_in = s.q_block(query), kv_in = s.kv_block(BlockKind::kKV);
    if (!valid_block(q_in) || !valid_block(kv_in)) return fail(r, s, "computes a block that does not exist");
    std::vector<int> triples;
    for (int q = s.q_shard; q < s.q_shard + s.q_span; ++q)
      for (int kv = s.kv_shard; kv < s.kv_shard + s.kv_span; ++kv) {
        if (!req_.visible[q][kv]) continue;
        for (int p = 0; p < U_; ++p)
          if (s.part == kAllHeads || s.part == p) triples.push_back(triple(q, kv, p));
      }
    if (triples.empty()) return fail(r, s, "computes a pair the mask leaves empty");
    for (const Block& in : {q_in, kv_in}) {
      const Block* from = held_input(r, in);
      if (!from) return fail(r, s, "reads " + name(in) + " before it arrived");
      mark_used(r, *from);
    }
    std::vector<Block> outs;
    if (pass_ == Pass::kForward) outs = {s.q_block(BlockKind::kOutput)};
    else outs = {s.q_block(BlockKind::kDQ), s.kv_block(BlockKind::kDKV)};
    for (const Block& out : outs) {
      if (in_flight(r, out)) return fail(r, s, "writes " + name(out) + " while it is being sent");
      std::set<int>& content = me.blocks[out];
      for (int t : triples)
        if (!content.insert(t).second) return fail(r, s, "adds a pair twice into " + name(out));
    }
    for (int t : triples) ++computed_[t];
    return Status::Ok();
  }

  // The shard a triple's result row belongs to in a block of this kind.
  int owner(BlockKind kind, int t) const {
    const int pair = t / U_;
    return kind == BlockKind::kDKV ? pair % P_ : pair / P_;
  }

  // Whether input piece b is one of span's pieces (Transfer::into_span).
  bool joins(const Block& b, const Block& span) const {
    const std::vector<Block> pieces = span_pieces(span);
    return valid_block(span) && span.span > 1 && !is_result(b.kind) &&
           std::find(pieces.begin(), pieces.end(), b) != pieces.end();
  }
  // Whether rank r concatenates span after the step it is at.
  bool concatenated_later(int r, const Block& span) const {
    const std::vector<Step>& steps = *steps_[r];
    for (size_t i = ranks_[r].pc + 1; i < steps.size(); ++i)
      if (steps[i].kind == StepKind::kConcat && steps[i].block == span) return true;
    return false;
  }

  Status concat(int r, const Step& s) {
    SymbolicRank& me = ranks_[r];
    if (!valid_block(s.block) || s.block.span < 2) return fail(r, s, "concatenates a block that is not a span");
    std::set<int> content;
    for (const Block& piece : span_pieces(s.block)) {
      if (is_result(piece.kind)) {
        auto it = me.blocks.find(piece);
        if (it == me.blocks.end() || arriving(r, piece) || in_flight(r, piece))
          return fail(r, s, "concatenates " + name(piece) + ", which it does not hold");
        content.insert(it->second.begin(), it->second.end());
        me.blocks.erase(it);
        continue;
      }
      const Block* from = held_input(r, piece);
      if (!from) return fail(r, s, "concatenates " + name(piece) + ", which it does not hold");
      mark_used(r, *from);
      if (*from == piece && !(piece.shard == r && piece.part == kAllHeads)) me.blocks.erase(piece);
    }
    if (me.blocks.count(s.block)) return fail(r, s, "concatenates into " + name(s.block) + ", which it holds");
    me.blocks[s.block] = content;
    me.used[s.block] = false;
    return Status::Ok();
  }

  Status split(int r, const Step& s) {
    SymbolicRank& me = ranks_[r];
    auto it = me.blocks.find(s.block);
    if (!valid_block(s.block) || s.block.span < 2 || !is_result(s.block.kind) || it == me.blocks.end() ||
        in_flight(r, s.block))
      return fail(r, s, "splits " + name(s.block) + ", a result span it does not hold");
    const std::set<int> content = it->second;
    me.blocks.erase(it);
    for (const Block& piece : span_pieces(s.block)) {
      if (me.blocks.count(piece)) return fail(r, s, "splits into " + name(piece) + ", which it holds");
      std::set<int>& mine = me.blocks[piece];
      for (int t : content)
        if (owner(piece.kind, t) == piece.shard) mine.insert(t);
    }
    return Status::Ok();
  }

  Status pack(int r, const Step& s) {
    SymbolicRank& me = ranks_[r];
    if (pass_ != Pass::kBackward || s.block.kind != BlockKind::kQueryPack || !valid_block(s.block))
      return fail(r, s, "packs something other than a query pack in the backward");
    for (BlockKind kind : {BlockKind::kQuery, BlockKind::kGradPack}) {
      Block in = s.block;
      in.kind = kind;
      const Block* from = held_input(r, in);
      if (!from) return fail(r, s, "packs " + name(s.block) + " without " + name(in));
      mark_used(r, *from);
    }
    if (me.blocks.count(s.block)) return fail(r, s, "packs " + name(s.block) + ", which it holds");
    me.blocks[s.block] = {};
    me.used[s.block] = false;
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
      if (ch[index].row_begin != t.row_begin || ch[index].row_end != t.row_end)
        return fail(r, s, "receives other rows of " + name(t.block) + " than r" + std::to_string(t.peer) + " sent");
      if (ch[index].into_span != t.into_span)  // the span decides the pieces it travels in
        return fail(r, s, "receives " + name(t.block) + " into another span than r" + std::to_string(t.peer) + " sent it for");
      got.push_back(&ch[index]);
    }
    for (const Transfer& t : s.sends)
      if (is_result(t.block.kind)) me.blocks.erase(t.block);  // a result leaves with its message
    for (size_t i = 0; i < s.recvs.size(); ++i) {
      const Transfer& t = s.recvs[i];
      if (t.combine == Combine::kReplace) {
        me.blocks[t.block] = {};
        me.used[t.block] = false;
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
      for (int b = 0; b < P_; ++b)
        for (int p = 0; p < U_; ++p) {
          const int n = computed_[triple(a, b, p)];
          if (req_.visible[a][b] && n != 1)
            return SP_STATUS(StatusCode::kInternal, "pair Q[" + std::to_string(a) + "] x KV[" + std::to_string(b) +
                                                        "]" + (U_ > 1 ? " head part " + std::to_string(p) : "") +
                                                        " computed " + std::to_string(n) + " times");
        }
    for (int r = 0; r < P_; ++r) {
      SymbolicRank& me = ranks_[r];
      if (pass_ == Pass::kForward)
        for (const Block& b : kept_[r]) {  // what the forward keeps is there at its end, and used
          if (!me.blocks.count(b))
            return SP_STATUS(StatusCode::kInternal, "rank " + std::to_string(r) + " keeps " + name(b) +
                                                        " for the backward but ends the forward without it");
          me.used[b] = true;
        }
      for (const auto& [block, content] : me.blocks) {
        const bool home = block.shard == r && block.span == 1;
        if (is_result(block.kind) && !home)
          return SP_STATUS(StatusCode::kInternal, "rank " + std::to_string(r) + " ends holding " + name(block) +
                                                      ": a result that never went home");
        const bool initial = home && block.part == kAllHeads;
        if (!is_result(block.kind) && !initial && !me.used.at(block))
          return SP_STATUS(StatusCode::kInternal, "rank " + std::to_string(r) + " received or made " + name(block) +
                                                      " and never used it");
      }
      std::set<int> by_q, by_kv;
      for (int x = 0; x < P_; ++x)
        for (int p = 0; p < U_; ++p) {
          if (req_.visible[r][x]) by_q.insert(triple(r, x, p));
          if (req_.visible[x][r]) by_kv.insert(triple(x, r, p));
        }
      std::vector<std::pair<BlockKind, std::set<int>>> want;
      if (pass_ == Pass::kForward) want = {{BlockKind::kOutput, by_q}};
      else want = {{BlockKind::kDQ, by_q}, {BlockKind::kDKV, by_kv}};
      for (const auto& [kind, triples] : want) {
        std::set<int> have;
        size_t summed = 0;
        for (const auto& [block, content] : me.blocks)
          if (block.kind == kind) have.insert(content.begin(), content.end()), summed += content.size();
        if (have != triples || summed != have.size())
          return SP_STATUS(StatusCode::kInternal, "rank " + std::to_string(r) + " ends with " +
                                                      block_kind_name(kind) + " summing " + std::to_string(summed) +
                                                      " (pair, head part)s, not " + std::to_string(triples.size()));
      }
    }
    return Status::Ok();
  }

  int P_, U_;
  const ScheduleRequest& req_;
  Pass pass_;
  std::vector<const std::vector<Step>*> steps_;
  std::vector<std::vector<Block>> kept_;
  std::vector<SymbolicRank> ranks_;
  std::vector<int> computed_;
  std::map<std::pair<int, int>, std::vector<Message>> channel_;  // (from, to): sends
  std::map<std::pair<int, int>, std::vector<Block>> recv_seq_;   // (from, to): recvs posted
};

}  // namespace

Status validate_schedules(const std::vector<RankSchedule>& schedules, const ScheduleRequest& request,
                          Pass pass) {
  Validator v(schedules, request, pass);
  return v.run();
}

}  // namespace seqpar
