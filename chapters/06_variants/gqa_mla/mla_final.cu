// Chapter 06, the final MLA decode on sm_90a: the absorbed decode (the (head, query) rows of a
// sequence packed on the M dimension of a tile, the latent cache streamed once per tile, split-K,
// one merge) in its default forms, with its configuration in one table (the chapter's README, MLA).
//
// What it takes from which form, every kernel: above 16 packed rows, mla_decode_sm90.cu's 64-row
// wgmma + TMA tile in its kReleasePhased form (both warpgroups in one loop, meeting twice a key
// block at __syncthreads()); at 16 or fewer, mla_decode.cu's 16-row mma.sync tile in its default
// shape ("wide"), compiled here for sm_90a; the ranges merged by mla_decode.cu's combine kernel
// (its column parts from the grid, the one-trip form up to 8 ranges, a programmatic dependent
// launch) or, at exactly 2 ranges, by the two blocks of a (tile, sequence) as one cluster
// (distributed shared memory, no partials). The code is shared with those files (mla_tiles.cuh,
// mla_tile64_sm90.cuh), and each kernel here has the machine code of the form it takes:
// scripts/same_machine_code.py --pair finds the SASS of all three identical (nvcc -cubin -O3, sm_90a).
//
//   configuration (Config, kTable), by packed rows H Nq
//   | H Nq  | tile                 | threads      | key block | K ring | blocks / SM | split              | merge     |
//   |-------|----------------------|--------------|-----------|--------|-------------|--------------------|-----------|
//   | <= 16 | 16 rows, mma.sync    | 8 warps      | 64        | 2      | 1           | waves, >= 1 block  | cluster 2 |
//   | > 16  | 64 rows, wgmma + TMA | 2 warpgroups | 64        | 2      | 1           | waves, >= 2 blocks | cluster 2 |
//   split: whole waves of (tile, range, sequence) blocks, at least that many key blocks a range;
//   merge: exactly 2 ranges in a cluster of their two blocks, otherwise the combine kernel (column
//   parts from the grid, the one-trip form up to 8 ranges, a programmatic dependent launch).
//
// Why these (measured on the H200, LAB.md): at 16 rows the decode is memory-bound and needs bytes
// in flight and threads to send them: 8 warps over 64-key blocks reached 93% of the read ceiling,
// two 4-warp blocks per SM 88%, one 4-warp block with a ring of 4 57%. At 128 rows it is
// compute-bound: wgmma reads both operands of S from shared memory once per warpgroup, and
// kReleasePhased is the release of P that racecheck follows, at 1.03-1.04x the time of the
// fastest (bar.arrive). The split rule fills whole waves of (tile, range, sequence) blocks
// (mla_pick_splits()); the 64-row tile keeps 2 key blocks a range, since a range's 128 KB of fp32
// partials are read back by the combine. The cluster merge beat the combine kernel at every
// 2-range row but one.
#include <climits>

#include "common/cuda/check.cuh"
#include "common/errors.hpp"
#include "common/index.hpp"
#include "gqa_mla/mla_final.cuh"
#include "gqa_mla/mla_model.hpp"
#include "gqa_mla/mla_tiles.cuh"
#include "gqa_mla/mla_tile64_sm90.cuh"

namespace attn::ch06::mla {
namespace {

/// The configuration table (see the header): one row per regime of packed rows, every constant
/// of the decode that a row could change. The kernels' shapes are instantiated from it.
struct Config {
  int max_rows;              // the row holds up to this many packed rows H Nq
  int tile_rows;             // packed rows a thread block
  int warps;                 // warps a thread block (the 64-row tile: two warpgroups)
  int keys;                  // keys a block
  int stages;                // the K ring
  int blocks_per_sm;         // resident thread blocks an SM
  int min_blocks_per_range;  // split rule: whole waves (mla_pick_splits()), at least this many key blocks a range
  int cluster_ranges;        // exactly this many ranges: merged in a cluster of their blocks
  int combine_parts;         // otherwise the combine kernel: its column parts (0: from the grid)
  bool pdl;                  // ... launched as a programmatic dependent launch
  const char* kernel;
};
constexpr Config kTable[] = {
    {16, 16, 8, 64, 2, 1, 1, 2, 0, true, "mma.sync"},          // mla_decode.cu's 16-row tile, "wide"
    {INT_MAX, 64, 8, 64, 2, 1, 2, 2, 0, true, "wgmma + TMA"},  // mla_decode_sm90.cu, kReleasePhased
};
/// The table's row for `rows` packed rows: where it is read.
constexpr const Config& config(int rows) { return rows <= kTable[0].max_rows ? kTable[0] : kTable[1]; }

constexpr Config kSmall = kTable[0], kLarge = kTable[1];
using Tile16 = Shape<kSmall.tile_rows / 16, kSmall.warps, kSmall.keys, kSmall.stages, kSmall.blocks_per_sm>;
static_assert(kSmall.blocks_per_sm * Tile16::kBytes <= 227 * 1024, "the 16-row tile's blocks per SM");
static_assert(kLarge.tile_rows == kM && kLarge.warps * 32 == kThreads && kLarge.keys == kBc &&
                  kLarge.stages == kStages && kLarge.blocks_per_sm == 1,
              "the 64-row tile's layout (mla_tile64_sm90.cuh)");
constexpr int kRelease = kReleasePhased;

}  // namespace

FinalPlan final_plan(int batch, int rows, int nk, int splits, int sms) {
  const Config& c = config(rows);
  const int tiles = ceil_div(rows, c.tile_rows), nblocks = ceil_div(nk, c.keys);
  if (splits <= 0) splits = mla_pick_splits(tiles, batch, nblocks, sms * c.blocks_per_sm, c.min_blocks_per_range);
  FinalPlan f;
  f.tile_rows = c.tile_rows;
  f.keys_per_block = c.keys;
  f.blocks_per_split = ceil_div(nblocks, std::min(splits, nblocks));
  f.splits = ceil_div(nblocks, f.blocks_per_split);  // no empty ranges
  f.cluster = f.splits == c.cluster_ranges;
  f.combine_parts = c.combine_parts;
  f.pdl = c.pdl;
  f.kernel = c.kernel;
  return f;
}

int launch_final(const DecodeParams& p, __nv_bfloat16* o_c) {
  if (config(p.rows).tile_rows == kSmall.tile_rows) {
    launch_tile<Tile16>(p);
  } else {
    static const bool configured = [] {
      CUDA_CHECK(cudaFuncSetAttribute(decode_sm90_kernel<kRelease>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      kBytes));
      return true;
    }();
    (void)configured;
    launch_tile64(decode_sm90_kernel<kRelease>, p);
  }
  if (!p.cluster_merge) launch_combine_kernel(p, o_c);
  return config(p.rows).tile_rows == kSmall.tile_rows ? Tile16::kBytes : kBytes;
}

}  // namespace attn::ch06::mla
