#include "common/faults.hpp"

#include <algorithm>

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
    {Fault::wrong_kv_head, "wrong-kv-head", "the last query head reads the next KV head"},
    {Fault::partial_tile_full, "partial-tile-full",
     "the last partial key tile is treated as full: its missing keys read as zeros"},
    {Fault::split_dropped, "split-dropped", "split-K decode: the merge leaves out one split"},
    {Fault::page_table_shift, "page-table-shift", "one block-table entry off by one: a neighbour page is read"},
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

}  // namespace

const char* fault_name(Fault f) { return entry(f).name; }
const char* fault_help(Fault f) { return entry(f).help; }

const std::vector<Fault>& all_faults() {
  static const std::vector<Fault> v = {Fault::last_key_block, Fault::last_batch,        Fault::stale_lse,
                                       Fault::wrong_kv_head,  Fault::partial_tile_full, Fault::split_dropped,
                                       Fault::page_table_shift};
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
      if (p.kv_heads < 2 && p.batch < 2) throw UsageError("wrong-kv-head needs --kv-heads > 1 or --batch > 1");
      // Each query head gets its own copy of the KV head it reads (MHA), the last one the wrong one.
      l.p.kv_heads = p.heads;
      l.in.k.assign(l.p.k_elems(), 0.0f);
      l.in.v.assign(l.p.v_elems(), 0.0f);
      for (int b = 0; b < p.batch; ++b)
        for (int h = 0; h < p.heads; ++h) {
          int sb = b, sh = p.kv_head_of(h);
          if (h == p.heads - 1) {
            if (p.kv_heads > 1) sh = (sh + 1) % p.kv_heads;
            else sb = (b + 1) % p.batch;
          }
          std::copy_n(in.k.begin() + p.k_off(sb, sh), std::size_t(p.nk) * p.d, l.in.k.begin() + l.p.k_off(b, h));
          std::copy_n(in.v.begin() + p.v_off(sb, sh), std::size_t(p.nk) * p.dv, l.in.v.begin() + l.p.v_off(b, h));
        }
      break;
    }
    default:
      break;
  }
  return l;
}

void faulty_outputs(Fault f, const Problem& p, std::vector<float>* o, std::vector<float>* lse) {
  if (f != Fault::last_batch) return;
  if (o) o->resize(p.o_elems(), 0.0f);
  if (lse && !lse->empty()) lse->resize(p.lse_elems(), 0.0f);
}

}  // namespace attn
