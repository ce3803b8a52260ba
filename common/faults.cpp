#include "common/faults.hpp"

#include <algorithm>
#include <utility>

#include "common/errors.hpp"

namespace attn {

namespace {

struct Entry {
  Fault f;
  const char* name;
  const char* help;
};

const Entry kFaults[] = {
    {Fault::none, "none", "no fault"},
    {Fault::last_key_block, "last-key-block", "the key loop runs one block short: the last key tile is never read"},
    {Fault::last_batch, "last-batch", "the grid skips the last batch: its O and LSE stay zero"},
    {Fault::stale_lse, "stale-lse", "the LSE written is the state before the last key block was merged"},
    {Fault::wrong_kv_head, "wrong-kv-head", "two query heads read each other's KV head"},
    {Fault::partial_tile_full, "partial-tile-full",
     "the last partial key tile is treated as full: no element mask there (keys past Nk read as zeros)"},
    {Fault::split_dropped, "split-dropped", "split-K decode: the merge leaves out one split"},
    {Fault::page_table_shift, "page-table-shift", "one block-table entry off by one: a neighbour page is read"},
    {Fault::ring_step_skipped, "ring-step-skipped",
     "ring attention: one rank never merges one of the K/V blocks passed around the ring"},
};

const Entry& entry(Fault f) {
  for (const Entry& e : kFaults)
    if (e.f == f) return e;
  return kFaults[0];
}

/// Copies keys [0, nk2) of every (batch, KV head) of `x` (rows of `width`), padding with zeros past nk.
std::vector<float> resize_keys(const std::vector<float>& x, int bh, int nk, int nk2, int width) {
  std::vector<float> y(std::size_t(bh) * nk2 * width, 0.0f);
  const int keep = std::min(nk, nk2);
  for (int g = 0; g < bh; ++g)
    std::copy_n(x.begin() + std::size_t(g) * nk * width, std::size_t(keep) * width,
                y.begin() + std::size_t(g) * nk2 * width);
  return y;
}

std::vector<float> first_part(const std::vector<float>& x, std::size_t n) {
  return std::vector<float>(x.begin(), x.begin() + std::min(n, x.size()));
}

/// The (batch, head) pairs whose KV heads wrong-kv-head swaps: the first and last query
/// head of batch 0 when they read different KV heads, else the last head of the first
/// and the last batch.
std::pair<std::pair<int, int>, std::pair<int, int>> swapped_heads(const Problem& p) {
  if (p.kv_heads > 1) return {{0, 0}, {0, p.heads - 1}};
  if (p.batch > 1) return {{0, p.heads - 1}, {p.batch - 1, p.heads - 1}};
  throw UsageError("wrong-kv-head needs --kv-heads > 1 or --batch > 1");
}

}  // namespace

const char* fault_name(Fault f) { return entry(f).name; }
const char* fault_help(Fault f) { return entry(f).help; }

const std::vector<Fault>& all_faults() {
  static const std::vector<Fault> v = {Fault::last_key_block, Fault::last_batch,        Fault::stale_lse,
                                       Fault::wrong_kv_head,  Fault::partial_tile_full, Fault::split_dropped,
                                       Fault::page_table_shift, Fault::ring_step_skipped};
  return v;
}

bool forward_fault(Fault f) {
  return f == Fault::last_key_block || f == Fault::last_batch || f == Fault::stale_lse ||
         f == Fault::wrong_kv_head || f == Fault::partial_tile_full;
}

std::string fault_note(Fault f) { return std::string("fault injected: ") + fault_name(f); }

FaultyLaunch faulty_launch(Fault f, const Problem& p, const AttnInputs& in, int key_tile) {
  FaultyLaunch l{p, in};
  const int bkv = p.batch * p.kv_heads;
  switch (f) {
    case Fault::last_key_block:
    case Fault::stale_lse: {
      if (p.nk <= key_tile)
        throw UsageError(std::string(fault_name(f)) + " needs more than one key tile (--nk > " +
                         std::to_string(key_tile) + ")");
      const int last = p.nk % key_tile ? p.nk % key_tile : key_tile;
      l.p.nk = p.nk - last;
      l.in.k = resize_keys(in.k, bkv, p.nk, l.p.nk, p.d);
      l.in.v = resize_keys(in.v, bkv, p.nk, l.p.nk, p.dv);
      break;
    }
    case Fault::partial_tile_full: {
      if (p.nk % key_tile == 0)
        throw UsageError(std::string(fault_name(f)) + " needs --nk not a multiple of the key tile (" +
                         std::to_string(key_tile) + ")");
      l.p.nk = (p.nk / key_tile + 1) * key_tile;
      l.in.k = resize_keys(in.k, bkv, p.nk, l.p.nk, p.d);
      l.in.v = resize_keys(in.v, bkv, p.nk, l.p.nk, p.dv);
      break;
    }
    case Fault::last_batch: {
      if (p.batch < 2) throw UsageError("last-batch needs --batch > 1");
      l.p.batch = p.batch - 1;
      l.in.q = first_part(in.q, l.p.q_elems());
      l.in.k = first_part(in.k, l.p.k_elems());
      l.in.v = first_part(in.v, l.p.v_elems());
      if (!in.dout.empty()) l.in.dout = first_part(in.dout, l.p.o_elems());
      break;
    }
    case Fault::wrong_kv_head: {
      // Two query heads that read different KV heads trade their queries; faulty_outputs()
      // trades their outputs back, so each holds its own query's attention over the other's KV head.
      const auto [a, z] = swapped_heads(p);
      for (std::size_t c = 0; c < std::size_t(p.nq) * p.d; ++c)
        std::swap(l.in.q[p.q_off(a.first, a.second) + c], l.in.q[p.q_off(z.first, z.second) + c]);
      break;
    }
    default:
      break;
  }
  return l;
}

void faulty_outputs(Fault f, const Problem& p, std::vector<float>* o, std::vector<float>* lse) {
  if (f == Fault::wrong_kv_head) {
    const auto [a, z] = swapped_heads(p);
    if (o)
      for (std::size_t c = 0; c < std::size_t(p.nq) * p.dv; ++c)
        std::swap((*o)[p.o_off(a.first, a.second) + c], (*o)[p.o_off(z.first, z.second) + c]);
    if (lse && !lse->empty())
      for (int c = 0; c < p.nq; ++c)
        std::swap((*lse)[p.lse_off(a.first, a.second) + c], (*lse)[p.lse_off(z.first, z.second) + c]);
  }
  if (f != Fault::last_batch) return;
  if (o) o->resize(p.o_elems(), 0.0f);
  if (lse && !lse->empty()) lse->resize(p.lse_elems(), 0.0f);
}

}  // namespace attn
