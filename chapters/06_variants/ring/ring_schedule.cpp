// Ring attention's schedule: layouts, the K/V source of every step, per-pair masks.
#include "ring/ring_schedule.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "common/errors.hpp"

namespace attn::ch06::ring {

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::contiguous: return "contiguous";
    case Layout::striped: return "striped";
    case Layout::zigzag: return "zigzag";
  }
  return "?";
}

bool parse_layout(const std::string& s, Layout* out) {
  if (s == "contiguous") *out = Layout::contiguous;
  else if (s == "striped") *out = Layout::striped;
  else if (s == "zigzag") *out = Layout::zigzag;
  else return false;
  return true;
}

const char* pair_kind_name(PairKind k) {
  switch (k) {
    case PairKind::full: return "full";
    case PairKind::diagonal: return "diagonal";
    case PairKind::skip: return "skip";
  }
  return "?";
}

namespace {

/// Piece `i` of `n` positions cut into `pieces` runs as evenly as possible (the
/// first n % pieces runs one longer).
Chunk even_piece(int n, int pieces, int i) {
  const int base = n / pieces, rem = n % pieces;
  Chunk c;
  c.start = i * base + std::min(i, rem);
  c.count = base + (i < rem ? 1 : 0);
  c.stride = 1;
  return c;
}

/// floor(a / b) for b > 0.
[[maybe_unused]] int floor_div(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }  // (unused in the ch06.9 stub)

}  // namespace

std::vector<Chunk> shard_chunks(Layout layout, int n, int ranks, int rank) {
  switch (layout) {
    case Layout::contiguous: return {even_piece(n, ranks, rank)};
    case Layout::striped: {
      Chunk c;
      c.start = rank;
      c.count = rank < n ? (n - rank + ranks - 1) / ranks : 0;
      c.stride = ranks;
      return {c};
    }
    case Layout::zigzag: {
      // EXERCISE ch06.7: the zigzag shard map: cut n into 2 * ranks even runs; rank r holds runs r and 2P - 1 - r
      //| return {even_piece(n, ranks, rank)};  // TODO: two runs per rank
      const int pieces = 2 * ranks;
      return {even_piece(n, pieces, rank), even_piece(n, pieces, pieces - 1 - rank)};
      // END EXERCISE
    }
  }
  return {};
}

int shard_tokens(Layout layout, int n, int ranks, int rank) {
  int t = 0;
  for (const Chunk& c : shard_chunks(layout, n, ranks, rank)) t += c.count;
  return t;
}

PairMask classify(const Chunk& q, const Chunk& k, bool causal) {
  PairMask m;
  if (q.count == 0 || k.count == 0) {  // an empty run (zigzag with N < 2P): nothing to compute
    m.kind = PairKind::skip;
    return m;
  }
  if (!causal) return m;  // full
  // The chapter's layouts pair chunks of one stride (1, or P for striped).
  // EXERCISE ch06.9: mark the pairs a causal rank skips: full when every query sees every key, skip when none does
  //| m.kind = PairKind::diagonal;  // TODO: offset, then full / diagonal / skip
  //| m.offset = 0;
  //| (void)q; (void)k;
  m.offset = floor_div(q.start - k.start, q.stride);
  if ((q.count - 1) + m.offset < 0)
    m.kind = PairKind::skip;  // even the last query is before the first key
  else if (m.offset >= k.count - 1)
    m.kind = PairKind::full;  // even the first query is after the last key
  else
    m.kind = PairKind::diagonal;
  // END EXERCISE
  return m;
}

long long visible_pairs(const Chunk& q, const Chunk& k, const PairMask& m) {
  switch (m.kind) {
    case PairKind::skip: return 0;
    case PairKind::full: return (long long)q.count * k.count;
    case PairKind::diagonal: {
      long long sum = 0;
      for (int i = 0; i < q.count; ++i) sum += std::clamp(i + m.offset + 1, 0, k.count);
      return sum;
    }
  }
  return 0;
}

StepPlan step_plan(Layout layout, int n, int ranks, int rank, int step, bool causal) {
  StepPlan plan;
  plan.kv_rank = kv_source(rank, step, ranks);
  const std::vector<Chunk> qs = shard_chunks(layout, n, ranks, rank);
  const std::vector<Chunk> ks = shard_chunks(layout, n, ranks, plan.kv_rank);
  for (int a = 0; a < int(qs.size()); ++a)
    for (int b = 0; b < int(ks.size()); ++b) {
      const PairMask m = classify(qs[a], ks[b], causal);
      if (m.kind == PairKind::skip) {
        ++plan.skipped;
        continue;
      }
      plan.pairs.push_back({a, b, m});
      plan.work += visible_pairs(qs[a], ks[b], m);
    }
  return plan;
}

SkippedStep skipped_ring_step(Layout layout, int n, int ranks, bool causal) {
  const int r = ranks - 1;
  for (int s = ranks - 1; s >= 1; --s)
    if (!step_plan(layout, n, ranks, r, s, causal).pairs.empty()) return {r, s};
  throw UsageError("ring-step-skipped needs a rank that receives a K/V block it attends to (--ranks > 1)");
}

std::vector<std::vector<long long>> work_table(Layout layout, int n, int ranks, bool causal) {
  std::vector<std::vector<long long>> w(ranks, std::vector<long long>(ranks));
  for (int r = 0; r < ranks; ++r)
    for (int s = 0; s < ranks; ++s) w[r][s] = step_plan(layout, n, ranks, r, s, causal).work;
  return w;
}

std::string format_work_table(Layout layout, int n, int ranks, bool causal) {
  const auto w = work_table(layout, n, ranks, causal);
  const double block = double(n) / ranks * double(n) / ranks;  // one full shard x shard block
  std::ostringstream os;
  char buf[64];
  os << "work per rank and step, " << layout_name(layout) << (causal ? ", causal" : "") << ", N = " << n
     << ", P = " << ranks << " (1.00 = a full (N/P)^2 block)\n";
  os << "rank ";
  for (int s = 0; s < ranks; ++s) {
    std::snprintf(buf, sizeof buf, " step%-2d", s);
    os << buf;
  }
  os << "  total\n";
  std::vector<long long> step_max(ranks, 0);
  double worst_total = 0;
  for (int r = 0; r < ranks; ++r) {
    std::snprintf(buf, sizeof buf, "%4d ", r);
    os << buf;
    long long total = 0;
    for (int s = 0; s < ranks; ++s) {
      std::snprintf(buf, sizeof buf, " %6.2f", double(w[r][s]) / block);
      os << buf;
      total += w[r][s];
      step_max[s] = std::max(step_max[s], w[r][s]);
    }
    worst_total = std::max(worst_total, double(total));
    std::snprintf(buf, sizeof buf, "  %5.2f\n", double(total) / block);
    os << buf;
  }
  long long path = 0, all = 0;
  for (int s = 0; s < ranks; ++s) path += step_max[s];
  for (const auto& row : w)
    for (long long x : row) all += x;
  std::snprintf(buf, sizeof buf, "%.2f", double(path) / block);
  os << "lockstep critical path (sum over steps of the busiest rank): " << buf;
  std::snprintf(buf, sizeof buf, "%.2f", double(all) / ranks / block);
  os << " blocks; balanced ideal " << buf << "\n";
  return os.str();
}

}  // namespace attn::ch06::ring
