// Chapter 05's CPU model: the FA3 schedule as programs of operations (see fa3_model.hpp).
#include "fa3_model.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <sstream>
#include <stdexcept>

#include "common/errors.hpp"
#include "common/online_softmax.hpp"
#include "fa3_tiles.hpp"

namespace attn::ch05 {

ScheduleConfig schedule_for(Step s, int d, bool causal) {
  ScheduleConfig c;
  const int step = int(s);
  (void)causal;  // every step keys its tiles on d alone (a causal-specific Bc would go here)
  c.Bc = step == 1 ? (d == 64 ? 128 : 64) : (step >= 8 && d == 256) ? 64 : 128;
  c.stages = step >= 8 && d == 64 ? 4 : (step == 9 && d == 128) ? 4 : 2;
  c.pingpong = step >= 4;
  c.intra_overlap = step >= 5;
  c.skip = true;  // every step visits only the key blocks some row of the tile sees (chapter 04 did)
  c.masked_first = step >= 6;
  c.persistent = step >= 7;
  return c;
}

namespace {

// ----------------------------------------------------------------------------- operations

enum class OpKind {
  wait,          // mbarrier try_wait.parity until the phase completed
  arrive,        // mbarrier arrive
  expect_tx,     // mbarrier arrive.expect_tx (bytes)
  tma_q,         // copy engine: Q tile -> smem, complete_tx
  tma_k,         // K_j -> stage
  tma_v,         // V_j -> stage
  issue_s,       // wgmma S = Q K^T of a stage (reads smem when it completes)
  issue_pv,      // wgmma O += P V of a stage (P captured now, smem read when it completes)
  wait_group,    // wgmma.wait_group n
  softmax,       // S -> P, alpha, m, l
  rescale,       // O *= alpha
  named_sync,    // bar.sync id, 256
  named_arrive,  // bar.arrive id, 256
  tile_begin,    // O = 0, m = -inf, l = 0
  epilogue,      // O / l and the LSE to global memory
};

struct Op {
  OpKind kind;
  int bar = -1;         // mbarrier index, or named barrier id
  uint32_t parity = 0;  // wait
  int bytes = 0;        // expect_tx
  int stage = 0;
  int tile = 0;         // index into the block's tile list
  int j = 0;            // key block
  int n = 0;            // wait_group
};

/// The mbarrier indices of a ring of `stages` stages.
struct BarIds {
  int stages;
  int full_q() const { return 0; }
  int empty_q() const { return 1; }
  int full_k(int s) const { return 2 + s; }
  int full_v(int s) const { return 2 + stages + s; }
  int empty_k(int s) const { return 2 + 2 * stages + s; }
  int empty_v(int s) const { return 2 + 3 * stages + s; }
  int count() const { return 2 + 4 * stages; }
};

struct TileInfo {
  int m_block, bh;
  KvRange kv;
};

struct Ring {
  int stages, stage = 0;
  uint32_t phase = 0;
  void advance() {
    if (++stage == stages) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

/// The key blocks of a tile in visiting order: last first from v6 on, else in order.
std::vector<int> block_order(const KvRange& kv, bool last_first) {
  std::vector<int> js;
  for (int i = 0; i < kv.n_max; ++i) js.push_back(last_first ? kv.n_max - 1 - i : i);
  return js;
}

// ----------------------------------------------------------------------------- the programs

std::vector<Op> make_producer(const std::vector<TileInfo>& tiles, const ScheduleConfig& cfg, const BarIds& ids,
                              int q_bytes, int k_bytes, int v_bytes) {
  std::vector<Op> ops;
  Ring ring{cfg.stages};
  int loaded = 0;
  for (int t = 0; t < int(tiles.size()); ++t) {
    if (tiles[t].kv.n_max == 0) continue;  // an empty tile loads nothing
    if (cfg.persistent) ops.push_back({OpKind::wait, ids.empty_q(), uint32_t(loaded & 1) ^ 1u});
    ops.push_back({OpKind::expect_tx, ids.full_q(), 0, q_bytes});
    ops.push_back({OpKind::tma_q, ids.full_q(), 0, 0, 0, t});
    ++loaded;
    for (int j : block_order(tiles[t].kv, cfg.masked_first)) {
      // EXERCISE ch05.1: the parity the producer waits for before refilling a stage
      //| const uint32_t free_parity = 0;  // TODO: which phase of empty[s] says "stage s is free"?
      const uint32_t free_parity = ring.phase ^ 1u;
      // END EXERCISE
      ops.push_back({OpKind::wait, ids.empty_k(ring.stage), free_parity});
      ops.push_back({OpKind::expect_tx, ids.full_k(ring.stage), 0, k_bytes});
      ops.push_back({OpKind::tma_k, ids.full_k(ring.stage), 0, 0, ring.stage, t, j});
      ops.push_back({OpKind::wait, ids.empty_v(ring.stage), free_parity});
      ops.push_back({OpKind::expect_tx, ids.full_v(ring.stage), 0, v_bytes});
      ops.push_back({OpKind::tma_v, ids.full_v(ring.stage), 0, 0, ring.stage, t, j});
      ring.advance();
    }
  }
  return ops;
}

std::vector<Op> make_consumer(int c, const std::vector<TileInfo>& tiles, const ScheduleConfig& cfg,
                              const BarIds& ids) {
  std::vector<Op> ops;
  const int my_turn = 1 + c, your_turn = 2 - c;
  auto window_open = [&] {
    if (cfg.pingpong) ops.push_back({OpKind::named_sync, my_turn});
  };
  auto window_close = [&] {
    if (cfg.pingpong) ops.push_back({OpKind::named_arrive, your_turn});
  };
  if (cfg.pingpong && c == 1) ops.push_back({OpKind::named_arrive, 1});  // consumer 0 goes first
  Ring ring{cfg.stages}, ring_v{cfg.stages};
  int loaded = 0;
  for (int t = 0; t < int(tiles.size()); ++t) {
    ops.push_back({OpKind::tile_begin, -1, 0, 0, 0, t});
    const std::vector<int> js = block_order(tiles[t].kv, cfg.masked_first);
    if (!js.empty()) {
      ops.push_back({OpKind::wait, ids.full_q(), uint32_t(loaded & 1)});
      ++loaded;
      if (cfg.intra_overlap) {
        // Prologue: S and P of the first block.
        ops.push_back({OpKind::wait, ids.full_k(ring.stage), ring.phase});
        window_open();
        ops.push_back({OpKind::issue_s, -1, 0, 0, ring.stage, t, js[0]});
        window_close();
        ops.push_back({OpKind::wait_group, -1, 0, 0, 0, 0, 0, 0});
        ops.push_back({OpKind::arrive, ids.empty_k(ring.stage)});
        ops.push_back({OpKind::softmax, -1, 0, 0, 0, t, js[0]});
        ring_v = ring;
        ring.advance();
        for (std::size_t b = 1; b < js.size(); ++b) {
          ops.push_back({OpKind::wait, ids.full_k(ring.stage), ring.phase});
          ops.push_back({OpKind::wait, ids.full_v(ring_v.stage), ring_v.phase});
          window_open();
          ops.push_back({OpKind::issue_s, -1, 0, 0, ring.stage, t, js[b]});
          ops.push_back({OpKind::rescale});
          ops.push_back({OpKind::issue_pv, -1, 0, 0, ring_v.stage, t, js[b - 1]});
          window_close();
          // EXERCISE ch05.3: wait for S_j but let P_{j-1} V_{j-1} keep running
          //| ops.push_back({OpKind::wait_group, -1, 0, 0, 0, 0, 0, 2});  // TODO: how many groups may stay in flight?
          ops.push_back({OpKind::wait_group, -1, 0, 0, 0, 0, 0, 1});  // S_j done, P V in flight
          // END EXERCISE
          ops.push_back({OpKind::arrive, ids.empty_k(ring.stage)});
          ops.push_back({OpKind::softmax, -1, 0, 0, 0, t, js[b]});
          ops.push_back({OpKind::wait_group, -1, 0, 0, 0, 0, 0, 0});
          ops.push_back({OpKind::arrive, ids.empty_v(ring_v.stage)});
          ring.advance();
          ring_v.advance();
        }
        if (cfg.persistent) ops.push_back({OpKind::arrive, ids.empty_q()});
        ops.push_back({OpKind::wait, ids.full_v(ring_v.stage), ring_v.phase});
        ops.push_back({OpKind::rescale});
        window_open();
        ops.push_back({OpKind::issue_pv, -1, 0, 0, ring_v.stage, t, js.back()});
        window_close();
        ops.push_back({OpKind::wait_group, -1, 0, 0, 0, 0, 0, 0});
        ops.push_back({OpKind::arrive, ids.empty_v(ring_v.stage)});
      } else {
        for (int j : js) {
          ops.push_back({OpKind::wait, ids.full_k(ring.stage), ring.phase});
          window_open();
          ops.push_back({OpKind::issue_s, -1, 0, 0, ring.stage, t, j});
          window_close();
          ops.push_back({OpKind::wait_group, -1, 0, 0, 0, 0, 0, 0});
          ops.push_back({OpKind::arrive, ids.empty_k(ring.stage)});
          ops.push_back({OpKind::softmax, -1, 0, 0, 0, t, j});
          ops.push_back({OpKind::rescale});
          ops.push_back({OpKind::wait, ids.full_v(ring.stage), ring.phase});
          window_open();
          ops.push_back({OpKind::issue_pv, -1, 0, 0, ring.stage, t, j});
          window_close();
          ops.push_back({OpKind::wait_group, -1, 0, 0, 0, 0, 0, 0});
          ops.push_back({OpKind::arrive, ids.empty_v(ring.stage)});
          ring.advance();
        }
        if (cfg.persistent) ops.push_back({OpKind::arrive, ids.empty_q()});
      }
    }
    ops.push_back({OpKind::epilogue, -1, 0, 0, 0, t});
  }
  if (cfg.pingpong && c == 0) ops.push_back({OpKind::named_sync, 1});  // take back the last hand-over
  return ops;
}

// ----------------------------------------------------------------------------- the machine

struct MBar {
  int count = 1, pending = 1;
  long tx = 0;
  long phase = 0;
  void complete_if_done() {
    if (pending == 0 && tx == 0) {
      ++phase;
      pending = count;
    }
  }
  bool phase_done(uint32_t parity) const { return uint32_t(phase & 1) != parity; }
};

struct NamedBar {
  int arrived = 0;
  long generation = 0;
  void arrive() {
    arrived += 128;  // a warpgroup
    if (arrived == 256) {
      arrived = 0;
      ++generation;
    }
  }
};

struct StageTag {
  int bh = -1, j = -1;  // which (head, block) the stage holds
};

struct Pending {
  bool is_s;
  int stage, tile, j;
  std::vector<float> p;  // P captured at issue (the A registers of P V)
};

/// One consumer warpgroup's registers: S, P, O and the softmax state of its 64 rows.
struct ConsumerRegs {
  std::vector<float> s, p, o, m, l, alpha;
  std::deque<Pending> inflight;
};

struct Agent {
  std::string name;
  std::vector<Op> ops;
  std::size_t pc = 0;
  bool in_sync = false;
  long sync_generation = 0;
  bool done() const { return pc >= ops.size(); }
};

class Block {
 public:
  Block(const Problem& p, const ScheduleConfig& cfg, std::vector<TileInfo> tiles, GlobalTensor& gq, GlobalTensor& gk,
        GlobalTensor& gv, GlobalTensor& go, GlobalTensor& glse, OnChip& sram, ScheduleStats& stats, bool record)
      : p_(p), cfg_(cfg), tiles_(std::move(tiles)), ids_{cfg.stages}, gq_(gq), gk_(gk), gv_(gv), go_(go),
        glse_(glse), stats_(stats), record_(record) {
    const int e = dtype_bytes(p.dtype), d = p.d;
    q_tile_ = sram.tile("Q_i (Br x d, smem)", std::size_t(kBr) * d, e);
    for (int s = 0; s < cfg.stages; ++s) {
      k_tiles_.push_back(sram.tile("K_j stage (Bc x d, smem)", std::size_t(cfg.Bc) * d, e));
      v_tiles_.push_back(sram.tile("V_j stage (Bc x d, smem)", std::size_t(cfg.Bc) * p.dv, e));
    }
    k_tags_.resize(cfg.stages);
    v_tags_.resize(cfg.stages);
    bars_.resize(ids_.count());
    for (int s = 0; s < cfg.stages; ++s) bars_[ids_.empty_k(s)].count = bars_[ids_.empty_k(s)].pending = 2;
    for (int s = 0; s < cfg.stages; ++s) bars_[ids_.empty_v(s)].count = bars_[ids_.empty_v(s)].pending = 2;
    bars_[ids_.empty_q()].count = bars_[ids_.empty_q()].pending = 2;
    named_.resize(3);
    agents_.resize(3);
    agents_[0] = {"producer", make_producer(tiles_, cfg, ids_, kBr * d * e, cfg.Bc * d * e, cfg.Bc * p.dv * e)};
    agents_[1] = {"consumer 0", make_consumer(0, tiles_, cfg, ids_)};
    agents_[2] = {"consumer 1", make_consumer(1, tiles_, cfg, ids_)};
    for (auto& r : regs_) {
      r.s.assign(std::size_t(64) * cfg.Bc, 0.f);
      r.p.assign(r.s.size(), 0.f);
      r.o.assign(std::size_t(64) * p.dv, 0.f);
      r.m.assign(64, 0.f);
      r.l.assign(64, 0.f);
      r.alpha.assign(64, 1.f);
    }
  }

  void run(Rng* rng, int trace_ops) {
    std::vector<int> runnable;
    for (;;) {
      runnable.clear();
      bool all_done = true;
      for (int a = 0; a < 3; ++a) {
        if (agents_[a].done()) continue;
        all_done = false;
        if (!blocked(a)) runnable.push_back(a);
      }
      if (all_done) return;
      if (runnable.empty()) throw std::runtime_error("deadlock: " + describe_waits());
      const int a = rng ? runnable[std::size_t(rng->range(0, int(runnable.size()) - 1))] : runnable[next_ % runnable.size()];
      ++next_;
      if (trace_ops > 0 && int(stats_.trace.size()) < trace_ops) stats_.trace.push_back(agents_[a].name + ": " + show(agents_[a].ops[agents_[a].pc]));
      step(a);
      ++stats_.ops;
    }
  }

 private:
  bool blocked(int a) const {
    const Agent& ag = agents_[a];
    const Op& op = ag.ops[ag.pc];
    if (op.kind == OpKind::wait) return !bars_[op.bar].phase_done(op.parity);
    if (op.kind == OpKind::named_sync) return ag.in_sync && named_[op.bar].generation == ag.sync_generation;
    return false;
  }

  std::string show(const Op& op) const {
    std::ostringstream s;
    switch (op.kind) {
      case OpKind::wait: s << "wait " << bar_name(op.bar) << " parity " << op.parity; break;
      case OpKind::arrive: s << "arrive " << bar_name(op.bar); break;
      case OpKind::expect_tx: s << "expect_tx " << bar_name(op.bar) << " " << op.bytes << " B"; break;
      case OpKind::tma_q: s << "TMA Q of tile " << op.tile; break;
      case OpKind::tma_k: s << "TMA K_" << op.j << " -> stage " << op.stage; break;
      case OpKind::tma_v: s << "TMA V_" << op.j << " -> stage " << op.stage; break;
      case OpKind::issue_s: s << "issue S = Q K_" << op.j << "^T (stage " << op.stage << ")"; break;
      case OpKind::issue_pv: s << "issue O += P V_" << op.j << " (stage " << op.stage << ")"; break;
      case OpKind::wait_group: s << "wgmma wait_group " << op.n; break;
      case OpKind::softmax: s << "softmax of block " << op.j; break;
      case OpKind::rescale: s << "O *= alpha"; break;
      case OpKind::named_sync: s << "bar.sync " << op.bar; break;
      case OpKind::named_arrive: s << "bar.arrive " << op.bar; break;
      case OpKind::tile_begin: s << "begin tile " << op.tile; break;
      case OpKind::epilogue: s << "store O, LSE of tile " << op.tile; break;
    }
    return s.str();
  }

  std::string bar_name(int b) const {
    if (b == ids_.full_q()) return "full_q";
    if (b == ids_.empty_q()) return "empty_q";
    const int s = (b - 2) % cfg_.stages;
    const char* kinds[] = {"full_k", "full_v", "empty_k", "empty_v"};
    return std::string(kinds[(b - 2) / cfg_.stages]) + "[" + std::to_string(s) + "]";
  }

  std::string describe_waits() const {
    std::ostringstream s;
    for (const Agent& a : agents_)
      if (!a.done()) s << a.name << " at '" << show(a.ops[a.pc]) << "'; ";
    return s.str();
  }

  void step(int a) {
    Agent& ag = agents_[a];
    const Op& op = ag.ops[ag.pc];
    ConsumerRegs* r = a > 0 ? &regs_[a - 1] : nullptr;
    switch (op.kind) {
      case OpKind::wait: break;  // not blocked: the phase has completed
      case OpKind::arrive:
        --bars_[op.bar].pending;
        bars_[op.bar].complete_if_done();
        break;
      case OpKind::expect_tx:
        bars_[op.bar].tx += op.bytes;
        --bars_[op.bar].pending;
        bars_[op.bar].complete_if_done();
        break;
      case OpKind::tma_q: copy_q(op); break;
      case OpKind::tma_k:
      case OpKind::tma_v: copy_kv(op); break;
      case OpKind::issue_s:
      case OpKind::issue_pv:
        if (a == 1 && stats_.window_order.size() < 64 && record_) stats_.window_order.push_back(0);
        if (a == 2 && stats_.window_order.size() < 64 && record_) stats_.window_order.push_back(1);
        r->inflight.push_back({op.kind == OpKind::issue_s, op.stage, op.tile, op.j,
                               op.kind == OpKind::issue_pv ? r->p : std::vector<float>{}});
        break;
      case OpKind::wait_group:
        while (int(r->inflight.size()) > op.n) {
          complete(a - 1, r->inflight.front());
          r->inflight.pop_front();
        }
        break;
      case OpKind::softmax: softmax(a - 1, op); break;
      case OpKind::rescale:
        for (int row = 0; row < 64; ++row)
          for (int c = 0; c < p_.dv; ++c) r->o[std::size_t(row) * p_.dv + c] *= r->alpha[row];
        break;
      case OpKind::named_sync:
        if (!ag.in_sync) {
          ag.sync_generation = named_[op.bar].generation;
          ag.in_sync = true;
          named_[op.bar].arrive();
        }
        if (named_[op.bar].generation == ag.sync_generation) return;  // arrived, still waiting
        ag.in_sync = false;
        break;
      case OpKind::named_arrive: named_[op.bar].arrive(); break;
      case OpKind::tile_begin:
        std::fill(r->o.begin(), r->o.end(), 0.f);
        std::fill(r->m.begin(), r->m.end(), neg_inf<float>());
        std::fill(r->l.begin(), r->l.end(), 0.f);
        break;
      case OpKind::epilogue: epilogue(a - 1, op.tile); break;
    }
    ++ag.pc;
  }

  void copy_q(const Op& op) {
    const TileInfo& t = tiles_[op.tile];
    const int b = t.bh / p_.heads, h = t.bh % p_.heads, m0 = t.m_block * kBr;
    const int rows = std::min(kBr, p_.nq - m0);
    q_tile_.fill(0.f);  // rows past Nq: the copy engine fills zeros
    gq_.load_block(p_.q_off(b, h) + std::size_t(m0) * p_.d, rows, p_.d, p_.d, q_tile_.data());
    q_tag_ = {t.bh, t.m_block};
    bars_[op.bar].tx -= long(kBr) * p_.d * dtype_bytes(p_.dtype);
    bars_[op.bar].complete_if_done();
  }

  void copy_kv(const Op& op) {
    const TileInfo& t = tiles_[op.tile];
    const int b = t.bh / p_.heads, hk = p_.kv_head_of(t.bh % p_.heads);
    const bool is_k = op.kind == OpKind::tma_k;
    const int width = is_k ? p_.d : p_.dv;
    Tile& dst = is_k ? k_tiles_[op.stage] : v_tiles_[op.stage];
    const int r0 = op.j * cfg_.Bc, rows = std::min(cfg_.Bc, p_.nk - r0);
    dst.fill(0.f);
    (is_k ? gk_ : gv_).load_block((is_k ? p_.k_off(b, hk) : p_.v_off(b, hk)) + std::size_t(r0) * width, rows, width,
                                  width, dst.data());
    (is_k ? k_tags_ : v_tags_)[op.stage] = {b * p_.kv_heads + hk, op.j};
    bars_[op.bar].tx -= long(cfg_.Bc) * width * dtype_bytes(p_.dtype);
    bars_[op.bar].complete_if_done();
    if (is_k) ++stats_.cta_blocks.back();
  }

  /// A wgmma completes: it reads its shared-memory operands now.
  void complete(int c, const Pending& g) {
    ConsumerRegs& r = regs_[c];
    const TileInfo& t = tiles_[g.tile];
    const int bhk = (t.bh / p_.heads) * p_.kv_heads + p_.kv_head_of(t.bh % p_.heads);
    const StageTag want{bhk, g.j};
    if (g.is_s) {
      if (k_tags_[g.stage].bh != want.bh || k_tags_[g.stage].j != want.j || q_tag_.bh != t.bh ||
          q_tag_.j != t.m_block)
        ++stats_.hazards;
      const float* q = q_tile_.data() + std::size_t(64) * c * p_.d;
      const float* k = k_tiles_[g.stage].data();
      for (int row = 0; row < 64; ++row)
        for (int col = 0; col < cfg_.Bc; ++col) {
          float acc = 0.f;
          for (int x = 0; x < p_.d; ++x) acc += q[std::size_t(row) * p_.d + x] * k[std::size_t(col) * p_.d + x];
          r.s[std::size_t(row) * cfg_.Bc + col] = acc;
        }
    } else {
      if (v_tags_[g.stage].bh != want.bh || v_tags_[g.stage].j != want.j) ++stats_.hazards;
      const float* v = v_tiles_[g.stage].data();
      for (int row = 0; row < 64; ++row)
        for (int col = 0; col < cfg_.Bc; ++col) {
          const float pj = g.p[std::size_t(row) * cfg_.Bc + col];
          if (pj == 0.f) continue;
          for (int x = 0; x < p_.dv; ++x) r.o[std::size_t(row) * p_.dv + x] += pj * v[std::size_t(col) * p_.dv + x];
        }
    }
  }

  /// P = 2^(c S - c m_new) with the mask, alpha = 2^(c m - c m_new), l <- alpha l + sum P.
  void softmax(int c, const Op& op) {
    ConsumerRegs& r = regs_[c];
    const TileInfo& t = tiles_[op.tile];
    const float sc = float(p_.softmax_scale() * kLog2e);
    for (int row = 0; row < 64; ++row) {
      const int i = t.m_block * kBr + 64 * c + row;
      float* s = &r.s[std::size_t(row) * cfg_.Bc];
      float mx = r.m[row];
      for (int col = 0; col < cfg_.Bc; ++col) {
        const int key = op.j * cfg_.Bc + col;
        if (key >= p_.nk || (i < p_.nq && !p_.visible(i, key)) || i >= p_.nq) s[col] = neg_inf<float>();
        mx = std::max(mx, s[col]);
      }
      const float shift = finite_max(mx) * sc;
      r.alpha[row] = std::exp2(r.m[row] * sc - shift);
      r.m[row] = mx;
      r.l[row] *= r.alpha[row];
      for (int col = 0; col < cfg_.Bc; ++col) {
        const float pj = std::exp2(s[col] * sc - shift);
        r.l[row] += pj;
        r.p[std::size_t(row) * cfg_.Bc + col] = round_to(p_.dtype, pj);
      }
    }
  }

  void epilogue(int c, int tile) {
    ConsumerRegs& r = regs_[c];
    const TileInfo& t = tiles_[tile];
    const float sc = float(p_.softmax_scale() * kLog2e);
    for (int row = 0; row < 64; ++row) {
      const int i = t.m_block * kBr + 64 * c + row;
      if (i >= p_.nq) continue;
      const float l = r.l[row];
      std::vector<float> out(std::size_t(p_.dv));
      for (int x = 0; x < p_.dv; ++x) out[x] = l > 0.f ? r.o[std::size_t(row) * p_.dv + x] / l : 0.f;
      go_.store(std::size_t(t.bh) * p_.nq * p_.dv + std::size_t(i) * p_.dv, std::size_t(p_.dv), out.data());
      glse_.set(std::size_t(t.bh) * p_.nq + i, l > 0.f ? (r.m[row] * sc + std::log2(l)) * float(kLn2) : neg_inf<float>());
    }
  }

  const Problem& p_;
  const ScheduleConfig& cfg_;
  std::vector<TileInfo> tiles_;
  BarIds ids_;
  GlobalTensor &gq_, &gk_, &gv_, &go_, &glse_;
  ScheduleStats& stats_;
  bool record_;
  Tile q_tile_;
  std::vector<Tile> k_tiles_, v_tiles_;
  StageTag q_tag_;
  std::vector<StageTag> k_tags_, v_tags_;
  std::vector<MBar> bars_;
  std::vector<NamedBar> named_;
  std::vector<Agent> agents_;
  ConsumerRegs regs_[2];
  std::size_t next_ = 0;
};

/// The tiles of each thread block: one tile per block, or the persistent snake.
std::vector<std::vector<TileInfo>> assign_tiles(const Problem& p, const ScheduleConfig& cfg) {
  const int n_qtiles = ceil_div(p.nq, kBr), bh_count = p.batch * p.heads, n_tiles = n_qtiles * bh_count;
  auto info = [&](int t) {
    TileInfo ti;
    tile_coords(t, n_qtiles, bh_count, p.causal && cfg.persistent, &ti.m_block, &ti.bh);
    ti.kv = kv_blocks(ti.m_block, kBr, cfg.Bc, p.nq, p.nk, p.causal, cfg.skip);
    return ti;
  };
  std::vector<std::vector<TileInfo>> blocks;
  if (!cfg.persistent) {
    for (int t = 0; t < n_tiles; ++t) blocks.push_back({info(t)});
    return blocks;
  }
  const int ctas = std::min(cfg.ctas, n_tiles);
  blocks.resize(std::size_t(ctas));
  for (int c = 0; c < ctas; ++c)
    for (int round = 0;; ++round) {
      const int t = snake_tile(c, round, ctas);
      if (t >= n_tiles) break;
      blocks[std::size_t(c)].push_back(info(t));
    }
  return blocks;
}

}  // namespace

Fa3ModelResult fa3_forward_model(const Problem& p, const AttnInputs& in, const ScheduleConfig& cfg,
                                 std::size_t sram_bytes, uint64_t seed, int trace_ops) {
  validate(p);
  if (p.dtype == DType::f32) throw UsageError("chapter 05 takes bf16 or fp16 inputs");
  Fa3ModelResult res;
  Traffic& t = res.traffic;
  GlobalTensor gq(t, "Q", in.q, p.dtype), gk(t, "K", in.k, p.dtype), gv(t, "V", in.v, p.dtype);
  GlobalTensor go(t, "O", p.o_elems(), p.dtype, Role::output), glse(t, "LSE", p.lse_elems(), DType::f32, Role::output);
  OnChip sram(std::max(sram_bytes, kHopperSmemBytes));
  Rng rng(seed);
  bool first = true;
  for (auto& tiles : assign_tiles(p, cfg)) {
    res.stats.cta_blocks.push_back(0);
    Block block(p, cfg, std::move(tiles), gq, gk, gv, go, glse, sram, res.stats, first);
    block.run(seed ? &rng : nullptr, trace_ops);
    first = false;
  }
  t.flops = flops_forward(p);
  res.sram_peak = sram.peak();
  res.o = go.host();
  res.lse = glse.host();
  return res;
}

Fa3TrafficFormula fa3_forward_traffic(const Problem& p, const ScheduleConfig& cfg) {
  Fa3TrafficFormula f;
  const int e = dtype_bytes(p.dtype), n_qtiles = ceil_div(p.nq, kBr);
  for (int m = 0; m < n_qtiles; ++m) {
    const KvRange kv = kv_blocks(m, kBr, cfg.Bc, p.nq, p.nk, p.causal, cfg.skip);
    if (kv.n_max == 0) continue;
    const int rows = std::min(kBr, p.nq - m * kBr);
    f.q_read += double(rows) * p.d * e;
    for (int j = 0; j < kv.n_max; ++j) {
      const int keys = std::min(cfg.Bc, p.nk - j * cfg.Bc);
      f.kv_read += double(keys) * (p.d + p.dv) * e;
    }
  }
  const double heads = double(p.batch) * p.heads;
  f.q_read *= heads;
  f.kv_read *= heads;
  f.o_write = double(p.o_elems()) * e;
  f.lse_write = double(p.lse_elems()) * 4;
  return f;
}

}  // namespace attn::ch05
