// Chapter 06 (gqa_mla) on the GPU: MLA's absorbed decode kernels (the final mla_final.cu on
// sm_90a, mla_decode.cu's and mla_decode_sm90.cu's forms) and the decompressed form against the
// fp64 MLA reference, at awkward shapes and with RoPE positions.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <doctest/doctest.h>

#include <string>

#include "chapters/06_variants/gqa_mla/gqa_mla_gpu.hpp"
#include "chapters/06_variants/gqa_mla/mla_model.hpp"
#include "common/check.hpp"
#include "common/compare.hpp"
#include "common/errors.hpp"

using namespace attn;
using namespace attn::ch06;

namespace {

MlaShape mla(int b, int h, int nq, int nk, long pos0 = 1000) {
  MlaShape s;
  s.batch = b, s.heads = h, s.nq = nq, s.nk = nk, s.pos0 = pos0;
  return s;
}

struct Oracle {
  CheckedRows<double> ref;
  ErrorStats naive;
  Oracle(const MlaShape& s, const MlaInputs& in) {
    const CheckPlan plan = mla_check_plan(s, false);
    ref = mla_reference(s, in, plan);
    naive = mla_naive_error(s, in, plan, ref);
  }
  bool pass(const std::vector<float>& o, std::size_t n) const {
    const TensorCheck t = judge_tensor("O", o, n, ref, naive, DType::bf16, false);
    if (!t.verdict.pass) MESSAGE(t.verdict.reason << " " << t.mismatches);
    return t.verdict.pass;
  }
};

}  // namespace

TEST_CASE("MLA absorbed decode kernel: decode, MTP, Nk = 1, H off the tile, split-K") {
  const MlaShape cases[] = {mla(2, 16, 1, 300),  mla(1, 3, 1, 1),   mla(3, 5, 2, 67, 100000), mla(1, 20, 3, 129, 0),
                            mla(1, 70, 1, 40),   mla(2, 128, 1, 1000), mla(1, 16, 1, 4097),    mla(4, 128, 2, 333)};
  for (const MlaShape& s : cases) {
    const MlaInputs in = make_mla_inputs(s, Dist::normal, 3);
    const Oracle oracle(s, in);
    for (int splits : {0, 1, 2, 3}) {
      const MlaGpuResult g = mla_absorb_gpu(s, in, splits, false);
      CAPTURE(s.describe());
      CAPTURE(g.what);
      CAPTURE(splits);
      // the default merge: exactly 2 ranges on sm_90 in a cluster, otherwise the combine kernel
      CHECK((g.what.find("cluster") != std::string::npos) == (g.splits == 2 && hopper_ready(nullptr)));
      // no lab form asked for: the final decode on sm_90a, mla_decode.cu's kernels elsewhere
      CHECK((g.what.find("mla_final.cu") != std::string::npos) == hopper_ready(nullptr));
      CHECK(oracle.pass(g.o, s.output().o_elems()));
    }
  }
}

TEST_CASE("MLA absorbed decode kernel: every shape of the 16-row tile (ring4, ring2x2, wide), fused or separate combine") {
  const MlaShape cases[] = {mla(2, 16, 1, 300), mla(1, 3, 1, 1), mla(3, 5, 2, 67, 100000), mla(1, 13, 1, 4097)};
  for (const MlaShape& s : cases) {
    const MlaInputs in = make_mla_inputs(s, Dist::normal, 5);
    const Oracle oracle(s, in);
    for (int v = 0; v < 3; ++v)
      for (int splits : {0, 1, 2, 3, 6})
        for (int combine : {kCombineSeparate, kCombineFused, kCombineCluster}) {
          const MlaGpuResult g = mla_absorb_gpu(s, in, splits, false, v, kTile64Wgmma, combine);
          CAPTURE(s.describe());
          CAPTURE(g.what);
          CAPTURE(splits);
          // asked for, and with up to 4 ranges, the decode kernel merges them itself
          CHECK((g.what.find("fused") != std::string::npos) == (combine == kCombineFused && g.splits <= 4));
          // asked for, with exactly 2 ranges on sm_90, the two blocks of a tile merge as a cluster
          CHECK((g.what.find("cluster") != std::string::npos) ==
                (combine == kCombineCluster && g.splits == 2 && hopper_ready(nullptr)));
          CHECK(oracle.pass(g.o, s.output().o_elems()));
        }
  }
}

TEST_CASE("MLA absorbed decode kernel: the 64-row tile on wgmma + TMA (every release of P) and on mma.sync") {
  std::string why;
  const bool hopper = hopper_ready(&why);
  if (!hopper) MESSAGE("wgmma tile not run: " << why);
  // rows = H Nq: 17 (one row past the 16-row tile), 60, 64 (exactly one tile), 65, 128, 256;
  // Nk = 1, one key past a block, off the block, one block, long; 1 to 3 new tokens (causal
  // rows at three positions); positions up to 100,000 (RoPE).
  const MlaShape cases[] = {mla(1, 17, 1, 1),       mla(2, 20, 3, 65, 0),   mla(1, 64, 1, 64),
                            mla(3, 65, 1, 333),     mla(1, 128, 1, 4097),   mla(2, 128, 2, 517, 100000),
                            mla(1, 30, 2, 129)};
  for (const MlaShape& s : cases) {
    const MlaInputs in = make_mla_inputs(s, Dist::normal, 7);
    const Oracle oracle(s, in);
    for (int tile64 : {kTile64Wgmma, kTile64WgmmaSync, kTile64WgmmaBlock, kTile64WgmmaLockstep, kTile64WgmmaHalves,
                       kTile64WgmmaArrive, kTile64Mma}) {
      if (tile64 != kTile64Mma && !hopper) continue;
      for (int splits : {0, 1, 3}) {
        const MlaGpuResult g = mla_absorb_gpu(s, in, splits, false, 0, tile64);
        CAPTURE(s.describe());
        CAPTURE(g.what);
        CAPTURE(splits);
        // the kernel asked for is the kernel that ran (the default: the final, mla_final.cu)
        CHECK((g.what.find("mla_final.cu") != std::string::npos) == (tile64 == kTile64Wgmma));
        CHECK((g.what.find("wgmma") != std::string::npos) == (tile64 != kTile64Mma));
        CHECK((g.what.find("bar.sync") != std::string::npos) ==
              (tile64 == kTile64WgmmaSync || tile64 == kTile64WgmmaBlock));
        CHECK((g.what.find("barrier 0") != std::string::npos) == (tile64 == kTile64WgmmaBlock));
        CHECK((g.what.find("lockstep") != std::string::npos) == (tile64 == kTile64WgmmaLockstep));
        CHECK((g.what.find("halves") != std::string::npos) == (tile64 == kTile64WgmmaHalves));
        CHECK((g.what.find("bar.arrive") != std::string::npos) == (tile64 == kTile64WgmmaArrive));
        CHECK(oracle.pass(g.o, s.output().o_elems()));
        if (tile64 == kTile64Wgmma) {  // the same release in the lab's file (a lab form of the merge)
          const MlaGpuResult gl = mla_absorb_gpu(s, in, splits, false, 0, tile64, kCombineSeparate);
          CAPTURE(gl.what);
          CHECK(gl.what.find("mla_final.cu") == std::string::npos);
          CHECK(gl.what.find("wgmma") != std::string::npos);
          CHECK(oracle.pass(gl.o, s.output().o_elems()));
        }
      }
    }
  }
}

TEST_CASE("MLA final decode (mla_final.cu): both tiles, splits 1, 2 and many, Nk = 1 and off the block") {
  std::string why;
  const bool hopper = hopper_ready(&why);
  if (!hopper) MESSAGE("the final decode is sm_90a's; here mla_decode.cu's kernels run: " << why);
  // rows = H Nq <= 16 (the 16-row tile: 16, 3, 5 x 2, 13) and > 16 (the 64-row tile: 17, 20 x 3,
  // 65, 128); Nk = 1, off the key block, one key past a block, 129 blocks (many ranges)
  const MlaShape cases[] = {mla(2, 16, 1, 300), mla(1, 3, 1, 1),      mla(3, 5, 2, 67, 100000), mla(1, 13, 1, 8193),
                            mla(1, 17, 1, 1),   mla(1, 20, 3, 129, 0), mla(3, 65, 1, 333),       mla(1, 128, 1, 8193)};
  for (const MlaShape& s : cases) {
    const MlaInputs in = make_mla_inputs(s, Dist::normal, 11);
    const Oracle oracle(s, in);
    const int rows = s.heads * s.nq, nblocks = (s.nk + 63) / 64;  // 64-key blocks in both rows of the table
    for (int splits : {1, 2, 5, 64, 0}) {
      const MlaGpuResult g = mla_absorb_gpu(s, in, splits, false);
      CAPTURE(s.describe());
      CAPTURE(g.what);
      CAPTURE(splits);
      // the kernel asked for is the kernel that ran: the final on sm_90a, its tile by the rows
      CHECK((g.what.find("mla_final.cu") != std::string::npos) == hopper);
      CHECK(g.head_tile == (rows <= 16 ? 16 : 64));
      CHECK((g.what.find("wgmma") != std::string::npos) == (hopper && rows > 16));
      // the ranges asked for, whole key blocks, none empty; 2 of them merged in a cluster on sm_90
      if (splits > 0) {
        const int bps = (nblocks + std::min(splits, nblocks) - 1) / std::min(splits, nblocks);
        CHECK(g.splits == (nblocks + bps - 1) / bps);
      }
      CHECK((g.what.find("cluster") != std::string::npos) == (g.splits == 2 && hopper));
      CHECK(oracle.pass(g.o, s.output().o_elems()));
    }
  }
}

TEST_CASE("MLA cluster merge: the 2 key ranges of a tile merged in a cluster of two blocks, every 64-row kernel") {
  std::string why;
  if (!hopper_ready(&why)) {
    std::cout << "SKIPPED: cluster merge not run: " << why << std::endl;
    std::exit(77);  // ctest's skip code: a case that cannot run is skipped, never passed
  }
  // H Nq = 20 x 3 (one 64-row tile, causal rows), 65 (two tiles, one row in the second), 128;
  // Nk off the key block; a range of one key block (Nk = 65)
  const MlaShape cases[] = {mla(1, 20, 3, 200, 0), mla(3, 65, 1, 333), mla(2, 128, 1, 700, 100000), mla(1, 64, 1, 65)};
  for (const MlaShape& s : cases) {
    const MlaInputs in = make_mla_inputs(s, Dist::normal, 9);
    const Oracle oracle(s, in);
    for (int tile64 : {kTile64Wgmma, kTile64WgmmaSync, kTile64WgmmaHalves, kTile64WgmmaArrive, kTile64Mma}) {
      const MlaGpuResult g = mla_absorb_gpu(s, in, 2, false, 0, tile64, kCombineCluster);
      CAPTURE(s.describe());
      CAPTURE(g.what);
      CHECK(g.splits == 2);
      CHECK(g.what.find("cluster") != std::string::npos);
      CHECK(oracle.pass(g.o, s.output().o_elems()));
    }
  }
}

TEST_CASE("MLA combine: the columns in 4, 8 and 16 parts, one range to many, a dependent launch or not") {
  // one sequence of 16 rows (the 16-row tile) and 20 x 3 rows (the 64-row tile), split 1 to 65 ways
  for (const MlaShape& s : {mla(1, 16, 1, 4097), mla(1, 20, 3, 333, 0)}) {
    const MlaInputs in = make_mla_inputs(s, Dist::normal, 8);
    const Oracle oracle(s, in);
    for (int splits : {1, 3, 5, 65})
      for (int parts : {0, 4, 8, 16}) {
        const bool pdl = parts != 8;  // the combine as a dependent launch, and (8 parts) launched after the decode
        const MlaGpuResult g = mla_absorb_gpu(s, in, splits, false, 0, kTile64Wgmma, kCombineSeparate, parts, pdl);
        CHECK((g.what.find("dependent launch") != std::string::npos) == pdl);
        CAPTURE(s.describe());
        CAPTURE(g.what);
        CAPTURE(splits);
        if (parts != 0) CHECK(g.what.find("combine in " + std::to_string(parts) + " parts") != std::string::npos);
        // up to 8 ranges in 4 parts: the few-ranges form (one round trip)
        if (parts == 4) CHECK((g.what.find("one trip") != std::string::npos) == (g.splits <= 8));
        CHECK(oracle.pass(g.o, s.output().o_elems()));
        // the general form on the same ranges
        if (parts == 4 && g.splits <= 8) {
          const MlaGpuResult gg = mla_absorb_gpu(s, in, splits, false, 0, kTile64Wgmma, kCombineGeneral, parts, pdl);
          CHECK(gg.what.find("one trip") == std::string::npos);
          CHECK(oracle.pass(gg.o, s.output().o_elems()));
        }
      }
  }
  // only 4, 8 or 16
  const MlaShape s = mla(1, 4, 1, 10);
  CHECK_THROWS_AS(mla_absorb_gpu(s, make_mla_inputs(s, Dist::normal, 1), 0, false, 0, kTile64Wgmma, kCombineSeparate, 5),
                  UsageError);
}

TEST_CASE("MLA absorbed decode kernel: mean-shifted and outlier inputs") {
  for (Dist d : {Dist::mean_shifted, Dist::outliers}) {
    for (const MlaShape& s : {mla(2, 16, 1, 517), mla(1, 128, 1, 517)}) {  // both tiles
      const MlaInputs in = make_mla_inputs(s, d, 4);
      const Oracle oracle(s, in);
      CAPTURE(s.describe());
      CHECK(oracle.pass(mla_absorb_gpu(s, in, 0, false).o, s.output().o_elems()));
      // the 64-row tile with the key block in halves (its own softmax: the maxima meet in shared memory)
      CHECK(oracle.pass(mla_absorb_gpu(s, in, 0, false, 0, kTile64WgmmaHalves).o, s.output().o_elems()));
      // and with P released by bar.arrive (the former default)
      CHECK(oracle.pass(mla_absorb_gpu(s, in, 0, false, 0, kTile64WgmmaArrive).o, s.output().o_elems()));
    }
  }
}

TEST_CASE("MLA decompressed form on the GPU: K/V GEMMs and the packed forward with d = 192") {
  std::string why;
  if (!hopper_ready(&why)) {
    std::cout << "SKIPPED: " << why << std::endl;
    std::exit(77);  // ctest's skip code: a case that cannot run is skipped, never passed
  }
  for (const MlaShape& s : {mla(2, 16, 1, 300), mla(1, 5, 3, 67, 100000), mla(1, 4, 200, 333), mla(1, 2, 1, 1)}) {
    const MlaInputs in = make_mla_inputs(s, Dist::normal, 6);
    const Oracle oracle(s, in);
    CAPTURE(s.describe());
    CHECK(oracle.pass(mla_decompress_gpu(s, in, false).o, s.output().o_elems()));
  }
}
