// Chapter 05's backward model: correct against the fp64 backward at awkward shapes, its
// traffic counted right, and its causal walk visiting exactly the query blocks that
// see a key block.
#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include "chapters/05_fa3_hopper/backward_model.hpp"
#include "chapters/05_fa3_hopper/backward_tiles.hpp"
#include "common/check.hpp"
#include "common/index.hpp"
#include "support/shapes.hpp"

using namespace attn;
using namespace attn::ch05;

namespace {

using testing_support::shape;

/// One SM's on-chip memory: 228 KB of shared memory and the 256 KB register file.
constexpr std::size_t kSm = (228 + 256) * 1024;

void check_model(const Problem& p, Dist dist = Dist::normal) {
  CAPTURE(p.describe());
  const AttnInputs in = make_inputs(p, dist, 13, true);
  const BackwardOracle oracle(p, in, BackwardPlan::full(p));
  const Fa3BackwardModelResult r = fa3_backward_model(p, in, kSm);
  const CheckResult c = oracle.judge(r.dq, r.dk, r.dv);
  CHECK_MESSAGE(c.pass(), c.failures());
}

/// The first query block with a row that sees a key of [col0, col0 + Bc), by brute force.
int first_block_brute(int col0, int Br, int Bc, const Problem& p) {
  const int tr = ceil_div(p.nq, Br);
  for (int i = 0; i < tr; ++i)
    for (int row = i * Br; row < std::min(p.nq, (i + 1) * Br); ++row)
      for (int key = col0; key < std::min(p.nk, col0 + Bc); ++key)
        if (!p.causal || causal_visible(row, key, p.nq, p.nk)) return i;
  return tr;
}

}  // namespace

TEST_CASE("backward model matches the fp64 backward at awkward shapes") {
  check_model(shape().n(1).d(64));                                      // N = 1
  check_model(shape().heads(2).n(100).d(64).causal());                  // N below one tile
  check_model(shape().batch(2).heads(4, 2).n(130, 67).d(64).causal());  // Nq > Nk: empty rows; GQA
  check_model(shape().heads(2, 1).n(67, 300).d(64).causal());           // Nq < Nk, causal bottom-right
  check_model(shape().heads(3, 1).n(257, 200).d(64), Dist::mean_shifted);  // MQA, not a multiple of the tile
  check_model(shape().n(150).d(128).causal().dtype(DType::f16));
}

TEST_CASE("backward model: the counted traffic equals the formula, causal skipping cuts it") {
  for (const Problem p : {shape().heads(2).n(300).d(64), shape().heads(2).n(300).d(64).causal(),
                          shape().batch(2).heads(4, 2).n(200, 330).d(64).causal(), shape().heads(2, 1).n(70, 260).d(128)}) {
    CAPTURE(p.describe());
    const AttnInputs in = make_inputs(p, Dist::normal, 3, true);
    const Fa3BackwardModelResult r = fa3_backward_model(p, in, kSm);
    const Fa3BackwardTraffic f = fa3_backward_traffic(p);
    CHECK(r.traffic.bytes_read == doctest::Approx(f.read()).epsilon(1e-12));
    CHECK(r.traffic.bytes_written == doctest::Approx(f.write()).epsilon(1e-12));
    CHECK(r.dq_add_bytes == doctest::Approx(f.dq_add).epsilon(1e-12));
  }
  // N = 1024, d = 64: 8 key blocks of 128 and 16 query blocks of 64. Without the mask each
  // key block adds into all 16 dQ tiles (128 adds per head); with it, key block j into
  // blocks 2j .. 15: 16 + 14 + ... + 2 = 72.
  Problem p = shape().n(1024).d(64);
  CHECK(fa3_backward_traffic(p).dq_add == doctest::Approx(128.0 * 2 * 64 * 64 * 4));
  p.causal = true;
  CHECK(fa3_backward_traffic(p).dq_add == doctest::Approx(72.0 * 2 * 64 * 64 * 4));
}

TEST_CASE("every dQ accumulator layout places each element of a tile exactly once") {
  for (int d : {64, 128}) {
    CAPTURE(d);
    const int nqb = 3, tile = kBwdBr * d;
    for (int layout : {0, 1, 2}) {
      CAPTURE(layout);
      std::vector<int> seen(std::size_t(2) * nqb * tile, 0);
      for (int bh = 0; bh < 2; ++bh)
        for (int row = 0; row < nqb * kBwdBr; ++row)
          for (int col = 0; col < d; ++col) {
            const long long at = layout == 2   ? dq_accum_tile_index(bh, row, col, nqb, kBwdBr, d)
                                 : layout == 1 ? dq_accum_fragment_index(bh, row, col, nqb, kBwdBr, d)
                                               : dq_accum_index(bh, row, col, nqb, kBwdBr, d);
            REQUIRE(at >= 0);
            REQUIRE(at < (long long)seen.size());
            // inside its own tile (b7) or tile half (b1-b6): the one contiguous run that one
            // reduce-add covers
            const long long run = layout == 2 ? tile : tile / 2;
            const long long first = layout == 2 ? (bh * nqb + row / kBwdBr) * tile
                                                : ((bh * nqb + row / kBwdBr) * 2 + col / (d / 2)) * (tile / 2);
            CHECK((at >= first && at < first + run));
            ++seen[std::size_t(at)];
          }
      CHECK(std::count(seen.begin(), seen.end(), 1) == (long)seen.size());
    }
  }
  // Fragment order: thread w = 32 warp + 4 g + t writes float2 y at (128 y + w) x 2, the
  // accumulators (4c + 2h, 4c + 2h + 1) of rows 16 warp + g + 8h, columns 8c + 2t.
  CHECK(dq_accum_fragment_index(0, 0, 0, 1, kBwdBr, 128) == 0);
  CHECK(dq_accum_fragment_index(0, 0, 1, 1, kBwdBr, 128) == 1);
  CHECK(dq_accum_fragment_index(0, 0, 2, 1, kBwdBr, 128) == 2);      // t = 1: the next thread
  CHECK(dq_accum_fragment_index(0, 1, 0, 1, kBwdBr, 128) == 8);      // g = 1: thread 4
  CHECK(dq_accum_fragment_index(0, 8, 0, 1, kBwdBr, 128) == 256);    // h = 1: float2 y = 1
  CHECK(dq_accum_fragment_index(0, 16, 0, 1, kBwdBr, 128) == 64);    // warp 1: thread 32
  CHECK(dq_accum_fragment_index(0, 0, 64, 1, kBwdBr, 128) == 64 * 64);  // the second half
}

TEST_CASE("the postprocess's inverse of every dQ layout: each float4 is four columns of one row") {
  for (int d : {64, 128})
    for (DqLayout l : {DqLayout::rows, DqLayout::fragments, DqLayout::whole_tiles}) {
      CAPTURE(d);
      CAPTURE(int(l));
      CHECK_FALSE(dq_float4_is_column(l));
      for (int r = 0; r < kBwdBr; ++r)
        for (int c = 0; c < d; ++c) {
          const int at = dq_tile_offset(l, r, c, kBwdBr, d);
          REQUIRE(at >= 0);
          REQUIRE(at < kBwdBr * d);
          int row = -1, col = -1;
          dq_tile_position(l, at, kBwdBr, d, &row, &col);
          REQUIRE(row == r);
          REQUIRE(col == c);
        }
      // the postprocess's float4 reads: offset 4v .. 4v + 3 are columns col .. col + 3 of one row
      for (int v = 0; v < kBwdBr * d / 4; ++v) {
        int row0 = 0, col0 = 0;
        dq_tile_position(l, 4 * v, kBwdBr, d, &row0, &col0);
        REQUIRE(col0 % 4 == 0);
        for (int e = 1; e < 4; ++e) {
          int row = 0, col = 0;
          dq_tile_position(l, 4 * v + e, kBwdBr, d, &row, &col);
          REQUIRE(row == row0);
          REQUIRE(col == col0 + e);
        }
      }
    }
}

TEST_CASE("b13's transposed dQ layout (80-row blocks): each element once, the inverse, float4s down a column") {
  constexpr int kBr = 80, kD = 128;
  std::vector<int> seen(kBr * kD, 0);
  for (int r = 0; r < kBr; ++r)
    for (int c = 0; c < kD; ++c) {
      const int at = dq_tile_offset(DqLayout::transposed, r, c, kBr, kD);
      REQUIRE(at >= 0);
      REQUIRE(at < kBr * kD);
      ++seen[at];
      CHECK((at < kBr * kD / 2) == (c < kD / 2));  // each half is one contiguous run
      int row = -1, col = -1;
      dq_tile_position(DqLayout::transposed, at, kBr, kD, &row, &col);
      REQUIRE(row == r);
      REQUIRE(col == c);
    }
  for (int x : seen) REQUIRE(x == 1);
  // the registers' order: thread w = 32 warp + 4 g + t holds columns 16 warp + g + 8h and rows 8c + 2t + e
  CHECK(dq_accum_transposed_index(0, 1, 0, 1, kBr, kD) == 1);     // e = 1
  CHECK(dq_accum_transposed_index(0, 2, 0, 1, kBr, kD) == 2);     // t = 1: the next thread
  CHECK(dq_accum_transposed_index(0, 0, 1, 1, kBr, kD) == 8);     // g = 1: thread 4
  CHECK(dq_accum_transposed_index(0, 0, 8, 1, kBr, kD) == 256);   // h = 1: float2 y = 1
  CHECK(dq_accum_transposed_index(0, 8, 0, 1, kBr, kD) == 512);   // c = 1: float2 y = 2
  CHECK(dq_accum_transposed_index(0, 0, 16, 1, kBr, kD) == 64);   // warp 1: thread 32
  CHECK(dq_accum_transposed_index(1, 80, 64, 3, kBr, kD) == ((1 * 3 + 1) * 2 + 1) * kBr * kD / 2);
  CHECK(dq_float4_is_column(DqLayout::transposed));
  for (int v = 0; v < kBr * kD / 4; ++v) {
    int row0 = 0, col0 = 0;
    dq_tile_position(DqLayout::transposed, 4 * v, kBr, kD, &row0, &col0);
    REQUIRE(row0 % 4 == 0);
    for (int e = 1; e < 4; ++e) {
      int row = 0, col = 0;
      dq_tile_position(DqLayout::transposed, 4 * v + e, kBr, kD, &row, &col);
      REQUIRE(row == row0 + e);
      REQUIRE(col == col0);
    }
  }
}

TEST_CASE("exercise ch05.5: a key block's walk starts at the first query block that sees it") {
  for (const Problem p : {shape().n(1000).d(64).causal(), shape().n(300, 1000).d(64).causal(),
                          shape().n(1000, 300).d(64).causal(), shape().n(129, 130).d(64).causal(),
                          shape().n(700).d(64)}) {
    CAPTURE(p.describe());
    for (int col0 = 0; col0 < p.nk; col0 += kBwdBc) {
      CAPTURE(col0);
      CHECK(first_query_block(col0, kBwdBr, p.nq, p.nk, p.causal) == first_block_brute(col0, kBwdBr, kBwdBc, p));
    }
  }
  // The walk that starts there is still correct (every skipped tile is fully masked).
  check_model(shape().heads(2).n(400, 300).d(64).causal());
}
