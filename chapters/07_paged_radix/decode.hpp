#pragma once
/// \file decode.hpp
/// \brief A batch of decode steps over a paged KV cache, the kernels' geometry, the
///        heuristic that picks v1 or v2, their byte count, and the fp64 check.
///
/// Decoding generates one token per sequence per step: one query row per head
/// against all of the sequence's cached keys,
/// \f[ o_h = \sum_{t < L_b} \mathrm{softmax}_t(\tau\, q_h \cdot k_t)\, v_t, \f]
/// where query head h reads KV head h / G (G = Hq / Hkv). Every key and value is
/// used by only G query rows, so a step does 4 G d FLOPs for every 4 d bytes of K
/// and V it reads: about G FLOP/byte, hundreds of times below a GPU's balance
/// point. Decode is a memory-bandwidth problem, and the measure of a decode kernel
/// is the share of the read ceiling at which it streams the cache.
///
/// The batch's K/V live in a page pool ([page][kv_head][slot][d], page_pool.hpp);
/// sequence b's token t is in page `block_table[b][t / P]`, slot `t % P`.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/check.hpp"
#include "common/index.hpp"
#include "common/inputs.hpp"
#include "common/problem.hpp"
#include "kv_quant.hpp"
#include "paged_kv_cache.hpp"

namespace attn::ch07 {

// ----------------------------------------------------------------------------- geometry

/// The decode kernels' geometry, shared by the CUDA kernels and the CPU model.
///
///     thread block = 4 warps, one (sequence, KV head, group of <= 16 query heads)
///     tile         = 64 keys = one pipeline stage; warp w takes keys 16w .. 16w+15
///     MMA tile     = 16 query rows (the heads of the group, zero-padded) x 8 keys
struct DecodeGeometry {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWarpKeys = 16;               ///< keys per warp per tile
  static constexpr int kBc = kWarps * kWarpKeys;     ///< keys per tile: 64
  static constexpr int kStages = 3;                  ///< tiles in flight (cp.async pipeline)
  static constexpr int kStages8 = 3;                 ///< the same for an 8-bit cache (5 measured slower: NOTES.md)
  static constexpr int kRows = 16;                   ///< query rows per block (the MMA's M)
  static constexpr int kMinSplitKeys = 512;          ///< v2 never cuts a split shorter than this
  static constexpr int kTmaMinPage = 8;              ///< v7 copies pages of at least this many tokens (TMA boxes)
};

/// Shared memory of one decode block: kStages tiles of K and of V, bf16.
constexpr std::size_t decode_smem_bytes(int d) {
  return std::size_t(DecodeGeometry::kStages) * DecodeGeometry::kBc * std::size_t(d) * 2 * 2;
}
/// An 8-bit cache: kStages8 tiles of K and V codes and their scales (one per key), and
/// one slot of 16 f16 rows per warp that the warp converts its keys into: 65.5 KB at
/// d = 128, so three blocks fit an SM where two bf16 ones do (INT4: 42.5 KB).
constexpr std::size_t decode_smem_bytes(int d, KvDtype kv) {
  return !kv_quantised(kv) ? decode_smem_bytes(d)
                           : std::size_t(DecodeGeometry::kStages8) * DecodeGeometry::kBc *
                                     (std::size_t(kv_row_bytes(kv, d)) * 2 + 8) +
                                 std::size_t(DecodeGeometry::kWarps) * DecodeGeometry::kWarpKeys * d * 2;
}
/// Blocks per SM that shared memory allows (228 KB per SM on Hopper, 1 KB reserved per block).
int decode_blocks_per_sm(int d);
int decode_blocks_per_sm(int d, KvDtype kv);
/// Head dims the decode kernels are built for.
bool decode_head_dim_supported(int d);
/// Query heads of one KV group are processed 16 at a time: blocks per (sequence, KV head).
inline int head_chunks(int group) { return ceil_div(group, DecodeGeometry::kRows); }

// ----------------------------------------------------------------------------- the batch

struct DecodeBatch {
  int heads = 8, kv_heads = 2, d = 128, page_size = 16;
  KvDtype kv_dtype = KvDtype::bf16;  ///< how the pool stores K and V
  double scale = 0;              ///< 0 means 1/sqrt(d)
  std::vector<int> lens;         ///< keys per sequence, each >= 1
  int num_pages = 0;             ///< pages in the pool
  int max_pages = 0;             ///< columns of the block table
  std::vector<int32_t> block_table;  ///< [batch][max_pages]; -1 past a sequence's last page

  int batch() const { return int(lens.size()); }
  int group() const { return heads / kv_heads; }
  int max_len() const;
  long total_tokens() const;
  double softmax_scale() const;
  /// Elements of the K (or V) pool.
  std::size_t pool_elems() const { return std::size_t(num_pages) * kv_heads * page_size * std::size_t(d); }
  /// Pool element of (sequence b, KV head hk, token t, dim 0): through the block table.
  std::size_t kv_index(int b, int hk, int t) const;
  /// Scales in the pool ([num_pages][kv_heads], for K and for V alike).
  std::size_t scale_elems() const { return std::size_t(num_pages) * kv_heads; }
  /// Pages the sequences use (sum of ceil(L / P)).
  long used_pages() const;
  /// KV bytes a step must read: every cached key and value once in the pool's format,
  /// and for an 8-bit pool the K and V scale of every (page, KV head) the sequences use.
  double kv_bytes() const {
    return double(total_tokens()) * kv_heads * d * kv_elem_bytes(kv_dtype) * 2.0 +
           (kv_quantised(kv_dtype) ? double(used_pages()) * kv_heads * 2 * 4.0 : 0.0);
  }
  /// "B=8 Hq=32 Hkv=8 d=128 P=16 L=32768 (equal)".
  std::string describe() const;
};

/// Throws UsageError naming the first invalid field.
void validate(const DecodeBatch& b);

/// Lengths for a ragged batch that always holds the awkward cases: the longest
/// sequence, 1, P - 1, P, P + 1, then random lengths in [1, max_len].
std::vector<int> ragged_lengths(int batch, int max_len, int page_size, uint64_t seed);

/// Builds the block tables with the block manager: sequences share their first
/// `shared_prefix / P` whole pages (one sequence forked into all, as parallel sampling
/// does), and the free list is shuffled so the pages are scattered over the pool.
DecodeBatch build_batch(int heads, int kv_heads, int d, int page_size, const std::vector<int>& lens,
                        int shared_prefix, uint64_t seed);

/// The tables of sequences already in a PagedKvCache (whose pool holds their K/V).
DecodeBatch batch_from_cache(const PagedKvCache& cache, const std::vector<PagedKvCache::SeqId>& seqs, int heads);

// ----------------------------------------------------------------------------- contents

/// Host copies of the K and V pools, [num_pages][kv_heads][P][d]: bf16 values, or for
/// an 8-bit pool the codes (as floats) and the scales, [num_pages][kv_heads].
struct KvPools {
  std::vector<float> k, v;
  KvDtype dtype = KvDtype::bf16;
  std::vector<float> k_scale, v_scale;
};

/// The K and V scales of every (page, KV head), [num_pages][kv_heads].
struct KvScales {
  std::vector<float> k, v;
};

/// Where the pool's values come from: kv_value() of the seed (the GPU fills its pool
/// itself), or host pools (a PagedKvCache's storage). An 8-bit pool filled from
/// kv_value() needs the scales of its pages (`scales`, from pool_scales() or from the
/// device) to recompute a code; `page_elems` = P * d maps an element to its page.
struct KvContents {
  uint64_t seed = 1;
  Dist dist = Dist::normal;
  const KvPools* pools = nullptr;
  KvDtype dtype = KvDtype::bf16;
  const KvScales* scales = nullptr;
  std::size_t page_elems = 0;
  /// The value a kernel sees: bf16, or code * scale.
  float k(std::size_t i) const;
  float v(std::size_t i) const;
};
/// The contents of a batch's pool filled from kv_value() (scales: for an 8-bit pool).
KvContents hashed_contents(const DecodeBatch& b, uint64_t seed, Dist dist, const KvScales* scales = nullptr);

/// The contents of host pools (a PagedKvCache's storage: pools_of()).
KvContents pooled_contents(const DecodeBatch& b, const KvPools* pools);
/// Host copies of a pool's storage (values, or codes and scales).
KvPools pools_of(const PagePool& pool);

/// The scales of every (page, KV head) of a pool filled from kv_value(): amax of the
/// page's P * d bf16 values over the format's largest code (the whole page is written
/// at once, as by a prefill). The GPU computes the same numbers (a test compares).
KvScales pool_scales(const DecodeBatch& b, uint64_t seed, Dist dist);

/// The pools filled from kv_value(), for the CPU model (quantised as b.kv_dtype says).
KvPools fill_pools(const DecodeBatch& b, uint64_t seed, Dist dist);
/// Q for the batch, [batch][heads][d], bf16 values: fill() with the usual stream 1.
std::vector<float> make_queries(const DecodeBatch& b, uint64_t seed, Dist dist);

// ----------------------------------------------------------------------------- v1 or v2

struct SplitPlan {
  int splits = 1;        ///< 1: v1 (one block per sequence and head group); > 1: v2
  int base_blocks = 0;   ///< blocks without splitting: batch * kv_heads * head chunks
  int target_blocks = 0; ///< blocks the GPU runs at once: SMs * blocks per SM
  std::string why;
};

/// Picks the split count: enough blocks to fill every SM, but never splits shorter
/// than DecodeGeometry::kMinSplitKeys keys. `sms` is the GPU's SM count (132 on H200).
/// `kv` sets the shared memory of a block, hence how many an SM holds, unless
/// `blocks_per_sm` says it (v10 runs four 8-bit blocks per SM where shared memory alone
/// would say three: its registers were the limit).
SplitPlan choose_splits(int batch, int kv_heads, int group, int max_len, int d, int sms,
                        KvDtype kv = KvDtype::bf16, int blocks_per_sm = 0);
inline SplitPlan choose_splits(const DecodeBatch& b, int sms, int blocks_per_sm = 0) {
  return choose_splits(b.batch(), b.kv_heads, b.group(), b.max_len(), b.d, sms, b.kv_dtype, blocks_per_sm);
}
/// Blocks per SM of v10's 8-bit kernel (steps/lab/v10_four_blocks.cu: __launch_bounds__(128, 4)).
constexpr int kV10BlocksPerSm = 4;
/// The final 8-bit kernel's configuration table (steps/final_8bit.cu): four blocks per SM (at
/// most 128 registers) when each split keeps at least 2048 keys, else three (v9's 140).
constexpr int kFinal8FourBlockKeys = 2048;
inline int final_8bit_blocks_per_sm(int split_keys) { return split_keys >= kFinal8FourBlockKeys ? 4 : 3; }
/// The final 8-bit kernel's split plan: for four blocks per SM when that plan's splits are long
/// enough, else for three (the same table, asked from the host).
SplitPlan final_8bit_plan(const DecodeBatch& b, int sms);

/// Keys of each split of a `len`-key sequence cut into `splits`: whole tiles.
int keys_per_split(int len, int splits);

/// Bytes the decode kernels read and write, counted from their loops (the CPU model
/// counts the same; a test holds them equal).
struct DecodeTraffic {
  double kv_read = 0;                          ///< K and V rows, each read once
  double q_read = 0;
  double meta_read = 0;                        ///< lengths, and block-table entries (and 8-bit scales) once per page per tile
  double o_write = 0;                          ///< O (bf16) and LSE (fp32)
  double partial_write = 0, partial_read = 0;  ///< v2: (m, l, O) of every split, fp32
  double read() const { return kv_read + q_read + meta_read + partial_read; }
  double write() const { return o_write + partial_write; }
};
DecodeTraffic decode_traffic(const DecodeBatch& b, int splits, bool paged);

// ----------------------------------------------------------------------------- checking

/// The fp64 check of a decode step. Sequence b is the attention problem
/// {batch 1, Nq = 1, Nk = L_b}; its reference inputs are its K/V gathered through the
/// block table into contiguous tensors, judged by ForwardOracle (the 2x naive rule).
/// Small batches are checked completely; large ones on sampled sequences (the first,
/// the last, and the longest) and KV heads (the first and the last), with every
/// output element still checked for NaN.
class DecodeOracle {
 public:
  DecodeOracle(const DecodeBatch& b, const std::vector<float>& q, const KvContents& kv, bool check_all = false,
               double budget_flops = 4e9);
  /// Judges O ([batch][heads][d]) and LSE ([batch][heads]).
  CheckResult judge(const std::vector<float>& o, const std::vector<float>& lse) const;
  std::string describe() const { return describe_; }

 private:
  struct Part {
    int b;
    std::vector<int> kv_heads;  ///< the KV heads this part checks
    Problem p;                  ///< the compact problem over those heads
    std::unique_ptr<ForwardOracle> oracle;
  };
  DecodeBatch batch_;
  std::vector<Part> parts_;
  std::string describe_;
};

}  // namespace attn::ch07
