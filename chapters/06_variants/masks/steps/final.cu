// Chapter 06, the final masked forward on sm_90a: the main path's v4 with its configuration in
// one table (the chapter's README, "The final kernels").
//
// What changes from v4, every change: the configuration, v4's tile and ring constants, its
// register split, and per mask whether a tile's epilogue is deferred (v2's idea) and whether
// partial tiles are masked from row spans (v4's), is one table, read in one place per
// function; the sparse patterns' partial tiles masked from their rows (below, the lab's v6);
// the namespace (hopper_final). The kernel is v4's: the producer warpgroup and two
// consumer warpgroups taking turns (chapter 05's v8), the next tile's Q in a second buffer
// (v1), documents tiled from their own starts (v3), and the two ideas the table switches.
//
//   configuration (bf16 and fp16; every mask and score modifier; 1 producer and 2 consumer
//   warpgroups, 24 and 240 registers a thread)
//   | d   | query rows a tile | keys a block | K/V stages | Q buffers | epilogue             |
//   |-----|-------------------|--------------|------------|-----------|----------------------|
//   | 64  | 128 (2 x 64)      | 128          | 4          | 2 (v1)    | per mask (below)     |
//   | 128 | 128 (2 x 64)      | 128          | 2          | 2 (v1)    | per mask (below)     |
//   | 256 | 128 (2 x 64)      | 64           | 2          | 1         | in place, every mask |
//
//   d = 64: a K or V block is half d = 128's bytes, so the shared memory of d = 128's two stages
//   holds four (chapter 05's final kernel keeps four at d = 64 too): 32 KB of Q and 128 KB of
//   K/V. d = 256: one Q tile is 64 KB, so a second buffer and two stages of 128 keys (256 KB)
//   cannot fit in 227 KB; one Q buffer and two stages of 64 keys take 192 KB. Its accumulator
//   is 128 fp32 registers a thread, so no tile's state is carried into the next (no deferred
//   epilogue, and none of its code), and 64 keys keep S and P at 32 and 16 registers. Even so
//   ptxas spills 80-136 bytes a thread at d = 256 (-Xptxas -v).
//   The block map is built for each row's tiles (mask_kernels.cuh: tile_keys()).
//
//   per mask (MaskConfig)                           | epilogue            | partial tiles     | the step it is
//   |-----------------------------------------------|---------------------|-------------------|---------------|
//   | window, chunked, sink + window, document,     | deferred (v2)       | row spans (v4)    | v4            |
//   | custom block-sparse (no spans: keep())        |                     |                   |               |
//   | the structured sparse patterns                | deferred (v2)       | sparse rows       | lab's v6      |
//   | causal, prefix-LM, learned sink, softcap      | in place            | row spans (v4)    | lab's v5      |
//   | ALiBi                                         | deferred (v2)       | keep() (v3)       | v3            |
//
//   Sparse rows: strided, fixed, longformer and bigbird (one policy type, StructuredSparse) have
//   no span(), and keep() is out of line, with a division, for each element of a partial tile;
//   at l = 64 nearly every strided or fixed tile is partial. With Policy::kRows, mask() builds
//   each row's SparseRow once per tile (mask_policy.hpp: two intervals, a prefix of global keys
//   and a comb of period l, l a power of two) and tests each element against it in a few
//   integer operations; a row with no such form in the tile asks keep() as before. It was the
//   lab's step 6 (LAB.md, "Masks"); the other policies have no kRows, and their code is as it was.
//
// Why these: a deferred epilogue hides about one key block of latency per tile, which pays
// where tiles are short (a 1K window, a chunk, the sinks) and costs where they are long (the
// causal and dense masks: the carried accumulator and state live across the tile boundary);
// ALiBi's bias and the span test together cost more than keep() on its few partial tiles.
// Measured side by side in one run (LAB.md, "Masks"; H100, d = 128, N = 8K), each mask's row
// takes the fastest of the three forms (v3, v4, v5). v1, without v2's carried state, stays
// ahead by up to 2% on the dense masks. The policy (mask_policy.hpp) is a template parameter,
// each mask its own instantiation of the same code. Each instantiation's machine code is that
// of the step whose form it takes: scripts/same_machine_code.py --pair finds the SASS of the
// other nine policies identical to v3's, v4's or v5's (nvcc -cubin -O3, sm_90a), and that of the
// sparse patterns identical, at d = 64, 128 and 256 (bf16), to the lab step that measured it.
//
// Chapter 05's shared header is included by path: chapters/05_fa3_hopper/fa3_common.cuh.
//
// Its fp16 instantiations are compiled apart, in masks/final_fp16.cu, which includes this file
// with CH06_FINAL_FP16 set: each translation unit instantiates one element type's 30 kernels
// (ten policies, three head dims), and the two compile side by side.
#include <functional>
#include <string>

#include "common/cuda/check.cuh"
#include "common/errors.hpp"
#include "common/cuda/hopper/mbarrier.cuh"
#include "common/cuda/hopper/named_barrier.cuh"
#include "common/cuda/hopper/roles.cuh"
#include "common/cuda/hopper/setmaxnreg.cuh"
#include "common/cuda/hopper/tma.cuh"
#include "common/cuda/hopper/wgmma.cuh"
#include "chapters/05_fa3_hopper/fa3_common.cuh"  // chapter 05's plan, barriers, conversions
#include "masks/mask_kernels.cuh"
#include "masks/mask_policy.hpp"

#ifndef CH06_FINAL_FP16
#define CH06_FINAL_FP16 0  // 1: this file as masks/final_fp16.cu includes it (the fp16 kernels)
#endif

namespace attn::ch06::hopper_final {
namespace {

using namespace attn::hopper;
using namespace attn::ch05;  // SmemPlan, Barriers, RowSoftmax, convert_p, snake_tile (chapter 05)

/// The configuration table (see the header): one row per head dim, every constant of the
/// kernel that a row could change. Br is the block map's query tile (kBr, chapter 05's), Bc
/// its key block (mask_kernels.cuh: tile_keys()); kQBuffers, one or two Q tiles (v1's idea);
/// kDefers, 0 where no mask may defer its epilogue (the per-mask column below is then ignored).
template <int D> struct Config;
template <> struct Config<64> {
  static constexpr int Br = 128, Bc = 128, kStages = 4, kQBuffers = 2, kDefers = 1, kProducerRegs = 24, kConsumerRegs = 240;
};
template <> struct Config<128> {
  static constexpr int Br = 128, Bc = 128, kStages = 2, kQBuffers = 2, kDefers = 1, kProducerRegs = 24, kConsumerRegs = 240;
};
template <> struct Config<256> {
  static constexpr int Br = 128, Bc = 64, kStages = 2, kQBuffers = 1, kDefers = 0, kProducerRegs = 24, kConsumerRegs = 240;
};
/// The table's per-mask columns (the header's second table): kDeferEpilogue, a tile's epilogue
/// (its last P V and the O store) deferred into the next tile's prologue (v2's idea) or run in
/// place at the tile's end; kRowSpans, a partial tile masked from each row's span (v4's) or
/// by keep() per element (v3's). A policy without span() always asks keep().
template <bool Defer, bool Spans>
struct MaskForm {
  static constexpr bool kDeferEpilogue = Defer, kRowSpans = Spans;
};
template <class Policy> struct MaskConfig : MaskForm<true, true> {};  // v4: short tiles
template <> struct MaskConfig<Causal> : MaskForm<false, true> {};     // the lab's v5: long tiles
template <> struct MaskConfig<PrefixLM> : MaskForm<false, true> {};
template <> struct MaskConfig<LearnedSink> : MaskForm<false, true> {};
template <> struct MaskConfig<Softcap> : MaskForm<false, true> {};
template <> struct MaskConfig<Alibi> : MaskForm<true, false> {};      // v3
constexpr int kThreads = 384; // producer + two consumer warpgroups
constexpr int kConsumerWarps = 8;
constexpr int kTurnBarrier = 1;  // named barriers 1 and 2: consumer 0's and 1's turn (0 is __syncthreads)
constexpr int kConsumerThreads = 256;

/// kBufs Q buffers (the plan's Q region of kBufs Br rows): tile t's Q in buffer t % kBufs,
/// two where they fit (v1's idea), one at d = 256. Buffer 0 uses Barriers' full_q / empty_q,
/// buffer 1 a pair laid out the same way after Barriers' own. Addresses are computed when
/// asked (four pointers held in registers made ptxas spill).
template <class Plan, int kBufs>
struct QBuffers {
  static_assert(kBufs == 1 || kBufs == 2, "one or two Q buffers");
  static constexpr int kTileBytes = Plan::kQBytes / kBufs;  ///< one Q tile
  static constexpr int kBytes = Plan::kBytes + 16;      ///< the plan and the two barriers more
  static __device__ __forceinline__ uint64_t* full(unsigned char* smem, int buf) {
    return reinterpret_cast<uint64_t*>(smem + Plan::kBars + buf * 8 * Plan::kNumBars);
  }
  static __device__ __forceinline__ uint64_t* empty(unsigned char* smem, int buf) { return full(smem, buf) + 1; }
  /// The buffer of the tile that is the loaded-th to load its Q, and its barriers' phase.
  static __device__ __forceinline__ int buffer(int loaded) { return loaded & (kBufs - 1); }
  static __device__ __forceinline__ int phase(int loaded) { return (loaded >> (kBufs - 1)) & 1; }
};

/// The shared memory plan of a row: its Q buffers, its K/V ring.
template <class T, int D>
using PlanOf = SmemPlan<T, D, Config<D>::Bc, Config<D>::kStages, Config<D>::Bc, Config<D>::kQBuffers * kBr>;
template <class T, int D>
using QBuffersOf = QBuffers<PlanOf<T, D>, Config<D>::kQBuffers>;

/// The list of tiles of this thread block: entry `round` of the snake over the map's order.
struct TileWalk {
  int cta, ctas, n_tiles, n_qtiles;
  const int* order;
  __device__ __forceinline__ bool next(int round, int* m_block, int* bh) const {
    const int t = snake_tile(cta, round, ctas);
    if (t >= n_tiles) return false;
    *m_block = order[t] % n_qtiles;
    *bh = order[t] / n_qtiles;
    return true;
  }
};

__device__ __forceinline__ TileWalk tile_walk(const FwdParams& p) {
  return {fresh_block_index_x(), fresh_grid_size_x(), p.map.outer * p.batch * p.heads, p.map.outer, p.map.order};
}

/// The key blocks of a tile (the block map's lists, partial first), and its rows [row0, row1):
/// a grid map lists block indices (unit Bc) and its tile m_block has rows from m_block Br;
/// a document map (DevMap::q_row0 set) lists each block's first key (unit 1) and its rows.
struct KeyList {
  const int* part;
  const int* full;
  int n_part, n;
  int unit, row0, row1;
  __device__ __forceinline__ int block(int k) const { return k < n_part ? part[k] : full[k - n_part]; }
};
template <int D>
__device__ __forceinline__ KeyList key_list(const FwdParams& p, int b, int h, int m_block) {
  const int owner = p.map.owner(b, h, m_block), np = p.map.n_part[owner];
  const bool docs = p.map.q_row0 != nullptr;
  return {p.map.part + std::size_t(owner) * p.map.inner, p.map.full + std::size_t(owner) * p.map.inner, np,
          np + p.map.n_full[owner], docs ? 1 : Config<D>::Bc, docs ? p.map.q_row0[owner] : m_block * Br,
          docs ? p.map.q_row1[owner] : p.nq};
}

/// Tensor-map coordinates of head h: standard [B*H][N][d] (outer = the head), or packed
/// [N][H*d] (outer 0, the head a column offset h * d).
struct Coords {
  int col, outer;
};
__device__ __forceinline__ Coords tensor_coords(const DevStrides& st, int b, int h, int heads, int d) {
  return st.row != d ? Coords{h * d, 0} : Coords{0, b * heads + h};  // packed rows hold every head
}

/// fa3_common.cuh's store_o with strided rows (standard or packed layout): O normalised
/// by inv_l, and from lane 0 of each quad the LSE of its two rows ([B][H][N]).
template <class T, int NO>
__device__ __forceinline__ void store_o_ld(const FwdParams& p, int b, int h, const int (&row)[2], int row1, int lane,
                                           const float (&o)[NO], const float (&inv_l)[2], const float (&lse)[2]) {
  constexpr int D = NO * 2;
  T* out = static_cast<T*>(p.o) + p.so.at(b, h);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= row1) continue;  // past the tile's rows (its document's, or Nq)
    T* dst = out + row[r] * p.so.row + 2 * (lane % 4);
#pragma unroll
    for (int c = 0; c < D / 8; ++c)
      *reinterpret_cast<uint32_t*>(dst + 8 * c) = pack2<T>(o[4 * c + 2 * r] * inv_l[r], o[4 * c + 2 * r + 1] * inv_l[r]);
    if (lane % 4 == 0) p.lse[(size_t(b) * p.heads + h) * p.nq + row[r]] = lse[r];
  }
}

// ---------------------------------------------------------------- producer warpgroup (warps 0-3)
// One thread issues every copy: for each tile, Q once the previous tile's Q is released,
// then K_j and V_j into the ring as stages free up.
template <class T, int D>
__device__ __forceinline__ void producer_tile(const CUtensorMap& tm_q, const CUtensorMap& tm_k,
                                              const CUtensorMap& tm_v, const FwdParams& p, unsigned char* smem,
                                              int m_block, int bh, RingState<Config<D>::kStages>& ring, int& loaded) {
  constexpr int Bc = Config<D>::Bc, kStages = Config<D>::kStages;
  using Plan = PlanOf<T, D>;
  const Barriers<kStages> bar(smem + Plan::kBars);
  const int bi = bh / p.heads, h = bh % p.heads, hk = kv_head_of(h, p.heads, p.kv_heads);
  const Coords cq = tensor_coords(p.sq, bi, h, p.heads, D), ck = tensor_coords(p.sk, bi, hk, p.kv_heads, D);
  const KeyList kv = key_list<D>(p, bi, h, m_block);
  if (kv.n == 0) return;  // the tile has no kept block: nothing to load

  using qb = QBuffersOf<T, D>;
  const int buf = qb::buffer(loaded);
  mbarrier_wait(qb::empty(smem, buf), qb::phase(loaded) ^ 1);  // tile t - kQBuffers's Q is no longer read
  mbarrier_arrive_expect_tx(qb::full(smem, buf), QBuffersOf<T, D>::kTileBytes);
  for (int b = 0; b < Plan::kBoxes; ++b)
    tma_load_3d(smem + Plan::kQ + buf * QBuffersOf<T, D>::kTileBytes + b * kBr * Plan::kRowBytes, &tm_q, qb::full(smem, buf),
                cq.col + b * Plan::kBoxCols, kv.row0, cq.outer);
  ++loaded;
  int j_next = kv.block(0);  // the map's next index, read one block ahead of its copies
  for (int n = 0; n < kv.n; ++n, ring.advance()) {
    const int j = j_next;
    if (n + 1 < kv.n) j_next = kv.block(n + 1);
    // K_j and V_j into stage ring.stage once the consumers have released it.
    mbarrier_wait(&bar.empty_k[ring.stage], ring.phase ^ 1);
    mbarrier_arrive_expect_tx(&bar.full_k[ring.stage], Plan::kKBytes);
    for (int b = 0; b < Plan::kBoxes; ++b)
      tma_load_3d(smem + Plan::kK + ring.stage * Plan::kKBytes + b * Bc * Plan::kRowBytes, &tm_k,
                  &bar.full_k[ring.stage], ck.col + b * Plan::kBoxCols, j * kv.unit, ck.outer);
    mbarrier_wait(&bar.empty_v[ring.stage], ring.phase ^ 1);
    mbarrier_arrive_expect_tx(&bar.full_v[ring.stage], Plan::kVBytes);
    for (int b = 0; b < Plan::kBoxes; ++b)
      tma_load_3d(smem + Plan::kV + ring.stage * Plan::kVBytes + b * Bc * Plan::kRowBytes, &tm_v,
                  &bar.full_v[ring.stage], ck.col + b * Plan::kBoxCols, j * kv.unit, ck.outer);
  }
}

template <class T, int D>
__device__ __forceinline__ void producer(const CUtensorMap& tm_q, const CUtensorMap& tm_k, const CUtensorMap& tm_v,
                                         const FwdParams& p, unsigned char* smem) {
  constexpr int kStages = Config<D>::kStages;
  if (fresh_thread_index() != 0) return;
  const TileWalk walk = tile_walk(p);
  RingState<kStages> ring;  // runs on from tile to tile
  int loaded = 0;           // tiles whose Q this block has loaded: the buffer and its phase
  int m_block, bh;
  for (int round = 0; walk.next(round, &m_block, &bh); ++round)
    producer_tile<T, D>(tm_q, tm_k, tm_v, p, smem, m_block, bh, ring, loaded);
}

// ---------------------------------------------------------------- consumer warpgroups (warps 4-11)
/// What a consumer carries from one tile into the next: the accumulator and P of the tile
/// whose last P V is still owed (`owed`), its softmax state, and the V ring's stage.
template <int D>
struct Carry {
  float o[D / 2];                            // O_i: 64 x d per warpgroup, fp32
  uint32_t pr[Config<D>::Bc / 4];            // P_{j+1} as the 16-bit A operand of P V
  float alpha[2];                            // the rescale that O still owes for block j+1
  RowSoftmax softmax;
  RingState<Config<D>::kStages> ring_v;      // the stage of V_{j+1}, one block behind
  bool owed = false;                         // a tile's last P V and O store are still to do
  int b, h, row[2], row1;                    // that tile
};

template <class T, int D, class Policy>
__device__ __forceinline__ void consumer_tile(const FwdParams& p, const Policy& pol, unsigned char* smem, int m_block,
                                              int bh, RingState<Config<D>::kStages>& ring, int& loaded, Carry<D>& c,
                                              bool work, bool last) {
  constexpr int Bc = Config<D>::Bc, kStages = Config<D>::kStages;
  using Plan = PlanOf<T, D>;
  const Barriers<kStages> bar(smem + Plan::kBars);
  // wg: 0 or 1 for warpgroups 1 and 2 (rows 0-63, 64-127); warp: 0-7 counted from warpgroup 1.
  const int tid = fresh_thread_index() - 128, wg = tid / 128, warp = tid / 32, lane = tid % 32;
  const int b = bh / p.heads, h = bh % p.heads;
  const KeyList kv = key_list<D>(p, b, h, m_block);
  using qb = QBuffersOf<T, D>;
  const int buf = qb::buffer(loaded);  // this tile's Q buffer (if it has work)

  // Descriptors. Q: this warpgroup's 64 rows; the k-th K-step is 32 bytes into the rows.
  auto q_desc = [&](int k) {
    const int byte = 32 * k;
    return desc_k_major(smem + Plan::kQ + buf * QBuffersOf<T, D>::kTileBytes + (byte / Plan::kRowBytes) * kBr * Plan::kRowBytes +
                            wg * 64 * Plan::kRowBytes + byte % Plan::kRowBytes,
                        Plan::kRowBytes);
  };
  auto k_desc = [&](int stage, int k) {
    const int byte = 32 * k;
    return desc_k_major(smem + Plan::kK + stage * Plan::kKBytes + (byte / Plan::kRowBytes) * Bc * Plan::kRowBytes +
                            byte % Plan::kRowBytes,
                        Plan::kRowBytes);
  };
  // V as the N-major B of P V: K-step kk is keys 16kk..16kk+15, i.e. 16 rows further down.
  auto v_desc = [&](int stage, int kk) {
    return desc_mn_major(smem + Plan::kV + stage * Plan::kVBytes + kk * 16 * Plan::kRowBytes, Bc * Plan::kRowBytes);
  };

  const int row[2] = {kv.row0 + 16 * warp + lane / 4, kv.row0 + 16 * warp + lane / 4 + 8};
  // The policy on block n of the list: the score modifier everywhere, the element mask on
  // partial blocks only (the ragged last key block is always partial). s[i] is row
  // row[(i >> 1) & 1], key j Bc + 8 (i / 4) + 2 (lane % 4) + (i & 1).
  // The partial test is one branch around the whole loop (as v8's `j >= n_full`): folded
  // into each element, it became 64 predicated compares and selects on every full block.
  auto mask = [&](float(&s)[Bc / 2], int n, int col0) {
    if constexpr (Policy::kScore) {
#pragma unroll
      for (int i = 0; i < Bc / 2; ++i) {
        const int r = row[(i >> 1) & 1], col = col0 + 8 * (i / 4) + 2 * (lane % 4) + (i & 1);
        s[i] = pol.score(s[i] * p.scale, b, h, r, col) * float(kLog2e);
      }
    }
    if (n < kv.n_part) {
      // Rows past Nq (the last tile's padding: zero Q, never stored) ask keep() about row
      // Nq - 1, so that per-row data (documents) is never read past its end. (A test of
      // r >= Nq here made ptxas spill the causal kernel, 36 bytes.)
      const int row_c[2] = {min(row[0], p.nq - 1), min(row[1], p.nq - 1)};
      if constexpr (Policy::kSpans > 0 && MaskConfig<Policy>::kRowSpans) {
        // Row r keeps j iff unsigned(j - lo) < count for one of its intervals: base[r][k] is
        // this thread's first column minus lo, so element i tests base + 8 (i / 4) + (i & 1).
        int base[2][Policy::kSpans], count[2][Policy::kSpans];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const Span sp = pol.span(b, h, row_c[r]);
          const int lo[2] = {sp.lo0, sp.lo1}, hi[2] = {sp.hi0, sp.hi1};
#pragma unroll
          for (int k = 0; k < Policy::kSpans; ++k) {
            const int last = min(hi[k], p.nk - 1);  // the ragged end folded in
            count[r][k] = max(0, last - lo[k] + 1);
            base[r][k] = col0 + 2 * (lane % 4) - lo[k];
          }
        }
#pragma unroll
        for (int i = 0; i < Bc / 2; ++i) {
          const int r = (i >> 1) & 1, off = 8 * (i / 4) + (i & 1);
          bool in = unsigned(base[r][0] + off) < unsigned(count[r][0]);
          if constexpr (Policy::kSpans == 2) in |= unsigned(base[r][1] + off) < unsigned(count[r][1]);
          if (!in) s[i] = neg_inf<float>();
        }
      } else {
        bool rows = false;  // masked from the rows' SparseRow (the sparse patterns)
        if constexpr (Policy::kRows) {
          // Each row inside this tile's keys [col0, last], built once: a few integer
          // operations per element instead of a call to keep_at().
          const int last = min(col0 + Bc, p.nk) - 1;  // the ragged end folded in
          const SparseRow sr[2] = {pol.row(row_c[0], col0, last), pol.row(row_c[1], col0, last)};
          rows = sr[0].exact && sr[1].exact;
          if (rows) {
#pragma unroll
            for (int i = 0; i < Bc / 2; ++i) {
              const int col = col0 + 8 * (i / 4) + 2 * (lane % 4) + (i & 1);
              if (!sr[(i >> 1) & 1].keep(col)) s[i] = neg_inf<float>();
            }
          }
        }
        if (!rows) {
#pragma unroll
          for (int i = 0; i < Bc / 2; ++i) {
            const int r = row_c[(i >> 1) & 1], col = col0 + 8 * (i / 4) + 2 * (lane % 4) + (i & 1);
            if (col >= p.nk || !pol.keep(b, h, r, col)) s[i] = neg_inf<float>();
          }
        }
      }
    }
  };
  const float scale_log2 = Policy::kScore ? 1.f : p.scale_log2;  // score() has applied tau log2(e)

  float(&o)[D / 2] = c.o;  // carried: the owed tile's until its last P V
  RowSoftmax& softmax = c.softmax;
  RowSoftmax start;  // this tile's starting state
  start.init();
  if constexpr (Policy::kSink) {  // the row starts from the sink's state (sink, 1), its 1 in lane t = 0
    start.m[0] = start.m[1] = pol.sink(h) * float(kLog2e) / scale_log2;  // m is in score units
    start.l[0] = start.l[1] = lane % 4 == 0 ? 1.f : 0.f;
  }
  if (!work) {  // no kept block: O = 0, LSE = -inf (or the sink); known without kv's loads
    float zero[D / 2], inv_l[2], lse[2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) zero[i] = 0.f;
    start.finish(scale_log2, inv_l, lse);
    store_o_ld<T>(p, b, h, row, kv.row1, lane, zero, inv_l, lse);
    return;
  }

  // The window bracket: wait for my turn, then (after issuing) hand the turn over.
  auto my_turn = [&] { named_barrier_sync(kTurnBarrier + wg, kConsumerThreads); };
  auto your_turn = [&] { named_barrier_arrive(kTurnBarrier + 1 - wg, kConsumerThreads); };

  mbarrier_wait(qb::full(smem, buf), qb::phase(loaded));
  ++loaded;
  RingState<kStages>& ring_v = c.ring_v;
  float s[Bc / 2];                     // S_j, then P_j in fp32
  uint32_t(&pr)[Bc / 4] = c.pr;
  float(&alpha)[2] = c.alpha;

  // Prologue: the first block of the list, S = Q_i K_j^T and its P. The block's first key
  // (col0) is read from the map before its GEMM is issued, so the load hides behind it.
  // With a tile owed, its last P V goes out in the same turn (O_c += P_c V_c; O_c was
  // rescaled when the tile was deferred: a rescale of the accumulator inside this branch
  // made ptxas serialize every wgmma of the kernel, its warning C7518).
  int n = 0;
  int col0 = kv.block(0) * kv.unit;
  float inv_l[2], lse[2];
  mbarrier_wait(&bar.full_k[ring.stage], ring.phase);
  if (Config<D>::kDefers && c.owed) {  // (a row without deferral has no owed tile, nor its code)
    mbarrier_wait(&bar.full_v[ring_v.stage], ring_v.phase);
    my_turn();
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < D / 16; ++k) WgmmaSS<T, Bc>::mma(s, q_desc(k), k_desc(ring.stage, k), k > 0);
    wgmma_commit();
    fence_operand(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      const uint32_t a[4] = {pr[4 * kk], pr[4 * kk + 1], pr[4 * kk + 2], pr[4 * kk + 3]};
      WgmmaRS<T, D>::mma(o, a, v_desc(ring_v.stage, kk), 1);
    }
    wgmma_commit();
    your_turn();
    wgmma_wait<1>();  // S is ready; the owed P V is still running
    fence_operand(s);
    if (lane == 0) mbarrier_arrive(&bar.empty_k[ring.stage]);
    softmax.finish(scale_log2, inv_l, lse);  // the owed tile's l is complete (it never waits for P V)
    softmax = start;
    mask(s, n, col0);
    softmax.update(s, scale_log2, alpha);
    wgmma_wait<0>();  // the owed tile's O is done
    fence_operand(o);
    if (lane == 0) mbarrier_arrive(&bar.empty_v[ring_v.stage]);
    store_o_ld<T>(p, c.b, c.h, c.row, c.row1, lane, o, inv_l, lse);
    c.owed = false;
  } else {
    my_turn();
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < D / 16; ++k) WgmmaSS<T, Bc>::mma(s, q_desc(k), k_desc(ring.stage, k), k > 0);
    wgmma_commit();
    your_turn();
    wgmma_wait<0>();
    fence_operand(s);
    if (lane == 0) mbarrier_arrive(&bar.empty_k[ring.stage]);
    softmax = start;
    mask(s, n, col0);
    softmax.update(s, scale_log2, alpha);
  }
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  convert_p<T>(s, pr);
  ring_v = ring;
  ring.advance();

  for (++n; n < kv.n; ++n, ring.advance(), ring_v.advance()) {
    col0 = kv.block(n) * kv.unit;
    mbarrier_wait(&bar.full_k[ring.stage], ring.phase);
    mbarrier_wait(&bar.full_v[ring_v.stage], ring_v.phase);
    my_turn();
    // S_ij = Q_i K_j^T
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < D / 16; ++k) WgmmaSS<T, Bc>::mma(s, q_desc(k), k_desc(ring.stage, k), k > 0);
    wgmma_commit();
    // O_i = alpha O_i + P_i,j+1 V_j+1
    rescale(o, alpha);
    fence_operand(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      const uint32_t a[4] = {pr[4 * kk], pr[4 * kk + 1], pr[4 * kk + 2], pr[4 * kk + 3]};
      WgmmaRS<T, D>::mma(o, a, v_desc(ring_v.stage, kk), 1);
    }
    wgmma_commit();
    your_turn();

    wgmma_wait<1>();  // S_ij is ready; P V is still running
    fence_operand(s);
    if (lane == 0) mbarrier_arrive(&bar.empty_k[ring.stage]);
    mask(s, n, col0);
    softmax.update(s, scale_log2, alpha);  // overlaps P V on the tensor cores

    wgmma_wait<0>();  // P_i,j+1 V_j+1 is done: O and pr may be touched again
    fence_operand(o);
    if (lane == 0) mbarrier_arrive(&bar.empty_v[ring_v.stage]);
    convert_p<T>(s, pr);
  }
  if (lane == 0) mbarrier_arrive(qb::empty(smem, buf));  // every Q K^T of this tile is done
  if (!last) {  // the epilogue is owed to the next tile's prologue
    rescale(o, alpha);  // O_c = alpha O_c now; the prologue adds P_c V_c
    c.owed = true;
    c.b = b, c.h = h, c.row[0] = row[0], c.row[1] = row[1], c.row1 = kv.row1;
    return;
  }

  // Epilogue: O_i = alpha O_i + P_i,0 V_0.
  mbarrier_wait(&bar.full_v[ring_v.stage], ring_v.phase);
  rescale(o, alpha);
  fence_operand(o);
  my_turn();
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Bc / 16; ++kk) {
    const uint32_t a[4] = {pr[4 * kk], pr[4 * kk + 1], pr[4 * kk + 2], pr[4 * kk + 3]};
    WgmmaRS<T, D>::mma(o, a, v_desc(ring_v.stage, kk), 1);
  }
  wgmma_commit();
  your_turn();
  wgmma_wait<0>();
  fence_operand(o);
  if (lane == 0) mbarrier_arrive(&bar.empty_v[ring_v.stage]);

  softmax.finish(scale_log2, inv_l, lse);
  store_o_ld<T>(p, b, h, row, kv.row1, lane, o, inv_l, lse);
}

template <class T, int D, class Policy>
__device__ __forceinline__ void consumer(const FwdParams& p, const Policy& pol, unsigned char* smem) {
  constexpr int kStages = Config<D>::kStages;
  const int wg = (fresh_thread_index() - 128) / 128;
  const TileWalk walk = tile_walk(p);
  auto my_turn = [&] { named_barrier_sync(kTurnBarrier + wg, kConsumerThreads); };
  auto your_turn = [&] { named_barrier_arrive(kTurnBarrier + 1 - wg, kConsumerThreads); };
  if (wg == 1) your_turn();  // warpgroup 2 hands the first turn to warpgroup 1
  RingState<kStages> ring;   // the stage of K_j, running on from tile to tile
  int loaded = 0;            // tiles with work so far: the Q buffer and its phase
  Carry<D> c;
  // Has the tile of round r work? The map's order is heaviest first, so the tiles with work
  // are its first n_work entries: arithmetic, no load on the way into a tile.
  auto work = [&](int r) { return snake_tile(walk.cta, r, walk.ctas) < p.map.n_work; };
  // The next tile's entry of the order is read while this tile runs (its first use is a
  // round later), so no load waits on the way into a tile.
  int m_block, bh;
  bool more = walk.next(0, &m_block, &bh);
  for (int round = 0; more; ++round) {
    int m_next = 0, bh_next = 0;
    const bool more_next = walk.next(round + 1, &m_next, &bh_next);
    consumer_tile<T, D>(p, pol, smem, m_block, bh, ring, loaded, c, work(round),
                        work(round) && (!(Config<D>::kDefers && MaskConfig<Policy>::kDeferEpilogue) || !work(round + 1)));
    more = more_next, m_block = m_next, bh = bh_next;
  }
  if (wg == 0) my_turn();  // warpgroup 1 takes back warpgroup 2's last hand-over
}

template <class T, int D, class Policy>
__global__ void __launch_bounds__(kThreads, 1)
    kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
           const __grid_constant__ CUtensorMap tm_v, const FwdParams p, const Policy pol) {
  constexpr int kStages = Config<D>::kStages;
  using Plan = PlanOf<T, D>;
  extern __shared__ unsigned char smem_raw[];
  if (threadIdx.x == 0) {
    const Barriers<kStages> bar(align_1024(smem_raw) + Plan::kBars);
    for (int b = 0; b < 2; ++b) {
      mbarrier_init(QBuffersOf<T, D>::full(align_1024(smem_raw), b), 1);
      mbarrier_init(QBuffersOf<T, D>::empty(align_1024(smem_raw), b), kConsumerWarps);
    }
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&bar.full_k[s], 1);
      mbarrier_init(&bar.full_v[s], 1);
      mbarrier_init(&bar.empty_k[s], kConsumerWarps);
      mbarrier_init(&bar.empty_v[s], kConsumerWarps);
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  // The role split: every value below is computed inside its role (see fa3_common.cuh).
  if (threadIdx.x < 128) {
    setmaxnreg_dec<Config<D>::kProducerRegs>();
    producer<T, D>(tm_q, tm_k, tm_v, p, fresh_smem(smem_raw));
  } else {
    setmaxnreg_inc<Config<D>::kConsumerRegs>();
    consumer<T, D>(p, pol, fresh_smem(smem_raw));
  }
}

template <class T, int D, class Policy>
std::function<void()> prepare_policy(const FwdParams& p, const Policy& pol, cudaStream_t st) {
  constexpr int Bc = Config<D>::Bc;
  using Plan = PlanOf<T, D>;
  const CUtensorMapDataType ty = tma_type<T>();
  // Standard [B*H][N][d], or packed [N][H*d] (one row of every head per token).
  const bool packed = p.sq.row != D;
  auto map = [&](const void* base, int n, int heads, int box_rows) {
    return packed ? make_tensor_map_3d(base, ty, 2, uint64_t(heads) * D, n, 1, Plan::kBoxCols, box_rows)
                  : make_tensor_map_3d(base, ty, 2, D, n, uint64_t(p.batch) * heads, Plan::kBoxCols, box_rows);
  };
  const CUtensorMap tq = map(p.q, p.nq, p.heads, kBr), tk = map(p.k, p.nk, p.kv_heads, Bc),
                    tv = map(p.v, p.nk, p.kv_heads, Bc);
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(kernel<T, D, Policy>, cudaFuncAttributeMaxDynamicSharedMemorySize, QBuffersOf<T, D>::kBytes));
    return true;
  }();
  (void)configured;
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  if (p.ctas > 0) sms = p.ctas;  // fewer blocks (tests): each walks more tiles
  const long tiles = long(p.map.outer) * p.batch * p.heads;
  const int grid = int(tiles < sms ? tiles : sms);  // one block per SM, each walking its tiles
  // The tensor maps are encoded here, once; the launch alone is what a timed repeat runs.
  return [=] {
    kernel<T, D, Policy><<<grid, kThreads, QBuffersOf<T, D>::kBytes, st>>>(tq, tk, tv, p, pol);
    CUDA_CHECK_LAUNCH("hopper_final kernel");
  };
}

/// Every policy at the three head dims, in element type T (visit_policy: one instantiation
/// per policy, mask_policy.hpp).
template <class T>
std::function<void()> prepare_element(const FwdParams& p, const MaskSpec& spec, const Problem& prob,
                                      const PolicyData& d, cudaStream_t st) {
  return visit_policy(spec, prob, d, [&](const auto& pol) {
    return p.d == 64    ? prepare_policy<T, 64>(p, pol, st)
           : p.d == 128 ? prepare_policy<T, 128>(p, pol, st)
                        : prepare_policy<T, 256>(p, pol, st);
  });
}

}  // namespace

#if !CH06_FINAL_FP16
bool available() { return true; }

std::function<void()> prepare(const FwdParams& p, const MaskSpec& spec, const Problem& prob, const PolicyData& d,
                              cudaStream_t st) {
  if ((p.d != 64 && p.d != 128 && p.d != 256) || prob.dv != p.d) return {};
  static_assert(Config<64>::Bc == tile_keys(64) && Config<128>::Bc == tile_keys(128) &&
                    Config<256>::Bc == tile_keys(256) && Config<64>::Br == Br && Config<128>::Br == Br &&
                    Config<256>::Br == Br && kBr == Br,
                "the block map is built for these tiles (mask_kernels.cuh: tile_keys)");
  if (prob.dtype == DType::f16) return prepare_fp16(p, spec, prob, d, st);  // masks/final_fp16.cu
  if (prob.dtype != DType::bf16) return {};
  return prepare_element<__nv_bfloat16>(p, spec, prob, d, st);
}

bool launch(const FwdParams& p, const MaskSpec& spec, const Problem& prob, const PolicyData& d, cudaStream_t st) {
  const std::function<void()> run = prepare(p, spec, prob, d, st);
  if (run) run();
  return bool(run);
}
#else
// The fp16 instantiations (masks/final_fp16.cu includes this file with CH06_FINAL_FP16 set).
std::function<void()> prepare_fp16(const FwdParams& p, const MaskSpec& spec, const Problem& prob, const PolicyData& d,
                                   cudaStream_t st) {
  return prepare_element<__half>(p, spec, prob, d, st);
}
#endif

}  // namespace attn::ch06::hopper_final
