// Chapter 07's decode kernels against the fp64 reference (skipped without a device):
// ragged lengths at every page size, v1 and v2, paged and contiguous, GQA / MHA /
// MQA, shared prefix pages, awkward inputs, and K/V stored by the block manager.
#include <doctest/doctest.h>

#include <cmath>

#include "chapters/07_paged_radix/decode.hpp"
#include "chapters/07_paged_radix/decode_gpu.hpp"
#include "chapters/07_paged_radix/paged_kv_cache.hpp"
#include "common/check.hpp"
#include "common/errors.hpp"
#include "support/hopper.hpp"

using namespace attn;
using namespace attn::ch07;

namespace {

/// Runs every kernel on the batch and checks each against the reference: v1 for a
/// split count of 1, v2-v6, v12 and v14 (or the kernels given) for the others (v4-v10 and v12-v14 paged only, v6-v10 and v13
/// 8-bit only); an 8-bit batch paged only, after its
/// device scales are compared with the host's.
const std::vector<DecodeKernel> kSteps1to6 = {DecodeKernel::v1, DecodeKernel::v2,  DecodeKernel::v3,
                                              DecodeKernel::v4, DecodeKernel::v5,  DecodeKernel::v6,
                                              DecodeKernel::v12, DecodeKernel::v14, DecodeKernel::final_bf16};

void check_kernels(const DecodeBatch& b, const std::vector<int>& splits, Dist dist = Dist::normal,
                   uint64_t seed = 7, bool contiguous = true, const std::vector<DecodeKernel>& kernels = kSteps1to6) {
  CAPTURE(b.describe());
  const std::vector<float> q = make_queries(b, seed, dist);
  const KvScales scales = pool_scales(b, seed, dist);
  const KvContents kv = hashed_contents(b, seed, dist, &scales);
  const DecodeOracle oracle(b, q, kv, true);
  GpuDecoder gpu(b, q, kv);
  if (kv_quantised(b.kv_dtype)) {
    const KvScales dev = gpu.scales();
    REQUIRE(dev.k == scales.k);  // bit for bit: the check below recomputes codes from them
    REQUIRE(dev.v == scales.v);
    contiguous = false;
  }
  for (KvLayout layout : {KvLayout::paged, KvLayout::contiguous}) {
    if (layout == KvLayout::contiguous && !contiguous) continue;
    for (int s : splits)
      for (DecodeKernel k : kernels) {
        if ((k == DecodeKernel::v1) != (s == 1)) continue;
        const bool eight_bit_only = k == DecodeKernel::v6 || k == DecodeKernel::v7 || k == DecodeKernel::v8 ||
                                    k == DecodeKernel::v9 || k == DecodeKernel::v10 || k == DecodeKernel::v13 ||
                                    k == DecodeKernel::final_8bit;
        const bool bf16_only = k == DecodeKernel::v12 || k == DecodeKernel::v14 || k == DecodeKernel::final_bf16;
        const bool pages_only = eight_bit_only || bf16_only || k == DecodeKernel::v4 || k == DecodeKernel::v5;
        if (pages_only && layout == KvLayout::contiguous) continue;
        if (eight_bit_only && !kv_quantised(b.kv_dtype)) continue;
        if (bf16_only && kv_quantised(b.kv_dtype)) continue;  // bf16 pages only
        if (!kernel_reads(b.kv_dtype, k)) continue;  // INT4 pages: v1-v3
        if (kernel_needs_hopper(k) && !testing_support::on_hopper()) continue;  // their own cases skip off Hopper
        if (kernel_in_lab(k) && !TUTORIAL_LAB) continue;  // the lab's steps: built with -DTUTORIAL_LAB=ON only
        CAPTURE(layout_name(layout));
        CAPTURE(kernel_name(k));
        CAPTURE(s);
        const GpuDecodeOutput out = gpu.run(k, s, layout);
        const CheckResult c = oracle.judge(out.o, out.lse);
        CHECK_MESSAGE(c.pass(), c.failures());
      }
  }
}

DecodeBatch with_kv(DecodeBatch b, KvDtype t) {
  b.kv_dtype = t;
  return b;
}

}  // namespace

TEST_CASE("decode kernels: ragged lengths (1, P-1, P, P+1, long) at every page size") {
  for (int P : {1, 8, 16, 32, 64}) {
    const std::vector<int> lens = ragged_lengths(9, 3000, P, 2);
    check_kernels(build_batch(8, 2, 128, P, lens, 0, 11), {1, 2, 7});
  }
}

TEST_CASE("decode kernels: head dim 64") {
  check_kernels(build_batch(8, 2, 64, 16, ragged_lengths(6, 1500, 16, 3), 0, 12), {1, 3});
}

TEST_CASE("decode kernels: GQA 32/8, MHA, MQA, a full 16-head group and groups above 16") {
  const std::vector<int> lens = {1200, 1, 63, 65, 640};
  check_kernels(build_batch(32, 8, 128, 16, lens, 0, 1), {1, 4});   // G = 4
  check_kernels(build_batch(8, 8, 128, 16, lens, 0, 2), {1, 4});    // MHA
  check_kernels(build_batch(8, 1, 128, 16, lens, 0, 3), {1, 4});    // MQA, G = 8
  check_kernels(build_batch(32, 2, 128, 16, lens, 0, 4), {1, 4});   // G = 16: all MMA rows used
  check_kernels(build_batch(40, 2, 128, 16, lens, 0, 5), {1, 4});   // G = 20: two blocks per KV head
}

TEST_CASE("decode kernels: sequences sharing prefix pages") {
  check_kernels(build_batch(16, 4, 128, 16, {2000, 700, 513, 512, 1500}, 512, 6), {1, 5});
}

TEST_CASE("decode kernels: mean-shifted, outlier and integer inputs") {
  const DecodeBatch b = build_batch(16, 4, 128, 16, {900, 31, 1, 257}, 0, 7);
  check_kernels(b, {1, 3}, Dist::mean_shifted);
  check_kernels(b, {1, 3}, Dist::outliers);
  check_kernels(b, {2}, Dist::integers);
}

TEST_CASE("decode kernels: more splits than tiles leave empty splits, which merge as the identity") {
  check_kernels(build_batch(8, 2, 128, 16, {100, 1, 64, 65}, 0, 8), {16, 64});
}

TEST_CASE("decode kernels: one long sequence with the heuristic's split count") {
  DecodeBatch b = build_batch(32, 8, 128, 16, {40000}, 0, 9);
  const std::vector<float> q = make_queries(b, 9, Dist::normal);
  GpuDecoder gpu(b, q, KvContents{9, Dist::normal, nullptr});
  const SplitPlan plan = choose_splits(b, gpu.sms());
  CHECK(plan.splits > 1);  // one sequence never fills a GPU on its own
  check_kernels(b, {1, plan.splits}, Dist::normal, 9, false);
}

TEST_CASE("decode kernels read exactly what the block manager stored") {
  const int P = 16, Hkv = 2, D = 128, Hq = 8;
  PagePool pool(96, P, Hkv, D, DType::bf16);
  pool.shuffle_free_list(5);
  PagedKvCache cache(pool);
  Rng rng(8);
  std::vector<float> k(Hkv * D), v(Hkv * D);
  auto append = [&](PagedKvCache::SeqId s, int n) {
    for (int t = 0; t < n; ++t) {
      for (auto& x : k) x = float(rng.normal());
      for (auto& x : v) x = float(rng.normal());
      REQUIRE(cache.append(s, k.data(), v.data()) == Status::ok);
    }
  };
  const auto a = cache.create();
  append(a, 301);
  PagedKvCache::SeqId b, c;
  REQUIRE(cache.fork(a, &b) == Status::ok);
  REQUIRE(cache.fork(a, &c) == Status::ok);
  append(b, 250);  // copy-on-write of a's last page
  append(c, 1);
  REQUIRE(cache.validate().empty());
  const DecodeBatch batch = batch_from_cache(cache, {a, b, c}, Hq);
  const KvPools pools = pools_of(pool);
  const std::vector<float> q = make_queries(batch, 3, Dist::normal);
  const KvContents kv{0, Dist::normal, &pools};
  const DecodeOracle oracle(batch, q, kv, true);
  GpuDecoder gpu(batch, q, kv);
  for (int s : {1, 3}) {
    const GpuDecodeOutput out = gpu.run(s, KvLayout::paged);
    const CheckResult r = oracle.judge(out.o, out.lse);
    CHECK_MESSAGE(r.pass(), r.failures());
  }
}

TEST_CASE("exercise ch07.5: the kernel finds K and V through the block table") {
  // Pages scattered over the pool by the shuffled free list: a kernel that takes the
  // logical page for the physical one reads someone else's keys.
  const DecodeBatch b = build_batch(8, 2, 128, 16, {777, 300, 17}, 0, 21);
  check_kernels(b, {1, 3}, Dist::normal, 21, false);
}

TEST_CASE("decode kernels, bf16, 8-bit and INT4: page sizes 1, 16, 256, L not a multiple of the page, B = 1 and B = 33, GQA and MQA") {
  for (KvDtype t : {KvDtype::bf16, KvDtype::fp8, KvDtype::int8, KvDtype::int4}) {
    CAPTURE(kv_dtype_name(t));
    for (int P : {1, 16, 256}) {
      check_kernels(with_kv(build_batch(32, 8, 128, P, {P * 5 + 3}, 0, 31), t), {1, 3});                // B = 1, GQA 32/8
      check_kernels(with_kv(build_batch(8, 1, 128, P, ragged_lengths(33, 700, P, 4), 0, 32), t), {1, 2}); // B = 33, MQA
    }
    check_kernels(with_kv(build_batch(16, 4, 128, 16, {900, 31, 1, 257}, 0, 7), t), {1, 5}, Dist::outliers);
    check_kernels(with_kv(build_batch(16, 4, 128, 16, {900, 31, 1, 257}, 0, 7), t), {4}, Dist::mean_shifted);
    check_kernels(with_kv(build_batch(8, 2, 128, 16, {100, 1, 64, 65}, 0, 8), t), {16, 64});  // empty splits
  }
}

TEST_CASE("v3, v4 and v5 reset their arrival counters: steps in a row, and after v2, give the right answer") {
  const DecodeBatch b = build_batch(32, 8, 128, 16, {5000, 17, 4097}, 0, 41);
  const std::vector<float> q = make_queries(b, 41, Dist::normal);
  const KvContents kv{41, Dist::normal, nullptr};
  const DecodeOracle oracle(b, q, kv, true);
  GpuDecoder gpu(b, q, kv);
  for (int rep = 0; rep < 3; ++rep)
    for (DecodeKernel k : {DecodeKernel::v3, DecodeKernel::v2, DecodeKernel::v4, DecodeKernel::v5, DecodeKernel::v3}) {
      const GpuDecodeOutput out = gpu.run(k, 9, KvLayout::paged);
      const CheckResult c = oracle.judge(out.o, out.lse);
      CHECK_MESSAGE(c.pass(), c.failures());
    }
  for (DecodeKernel k : {DecodeKernel::v3, DecodeKernel::v4, DecodeKernel::v5}) {
    CAPTURE(kernel_name(k));
    CHECK(gpu.time_ms(k, 9, KvLayout::paged) > 0);  // timing runs many steps back to back
    const GpuDecodeOutput out = gpu.run(k, 9, KvLayout::paged);
    const CheckResult c = oracle.judge(out.o, out.lse);
    CHECK_MESSAGE(c.pass(), c.failures());
  }
}

TEST_CASE("8-bit and INT4 kernels read exactly what the block manager stored (scales grown token by token, copy-on-write)") {
  for (KvDtype t : {KvDtype::fp8, KvDtype::int8, KvDtype::int4}) {
    CAPTURE(kv_dtype_name(t));
    const int P = 16, Hkv = 2, D = 128, Hq = 8;
    PagePool pool(96, P, Hkv, D, t);
    pool.shuffle_free_list(5);
    PagedKvCache cache(pool);
    Rng rng(8);
    std::vector<float> k(Hkv * D), v(Hkv * D);
    auto append = [&](PagedKvCache::SeqId s, int n) {
      for (int i = 0; i < n; ++i) {
        const double grow = 1.0 + 0.01 * i;  // later tokens larger: the page scales grow
        for (auto& x : k) x = float(grow * rng.normal());
        for (auto& x : v) x = float(grow * rng.normal());
        REQUIRE(cache.append(s, k.data(), v.data()) == Status::ok);
      }
    };
    const auto a = cache.create();
    append(a, 301);
    PagedKvCache::SeqId b, c;
    REQUIRE(cache.fork(a, &b) == Status::ok);
    REQUIRE(cache.fork(a, &c) == Status::ok);
    append(b, 250);
    append(c, 1);
    REQUIRE(cache.validate().empty());
    const DecodeBatch batch = batch_from_cache(cache, {a, b, c}, Hq);
    REQUIRE(batch.kv_dtype == t);
    const KvPools pools = pools_of(pool);
    const std::vector<float> q = make_queries(batch, 3, Dist::normal);
    const KvContents kv = pooled_contents(batch, &pools);
    const DecodeOracle oracle(batch, q, kv, true);
    GpuDecoder gpu(batch, q, kv);
    for (DecodeKernel kk : {DecodeKernel::v1, DecodeKernel::v2, DecodeKernel::v3, DecodeKernel::v4, DecodeKernel::v5,
                            DecodeKernel::v6}) {
      if (!kernel_reads(t, kk)) continue;  // INT4 pages: v1-v3 (the host's codes packed two per byte)
      const GpuDecodeOutput out = gpu.run(kk, 3, KvLayout::paged);
      const CheckResult r = oracle.judge(out.o, out.lse);
      CHECK_MESSAGE(r.pass(), r.failures());
    }
  }
}

TEST_CASE("INT4 pages (v1-v3): GQA 32/8 and 16/4, ragged lengths around the page, Nk not a multiple of the page or tile") {
  // Lengths 1, P - 1, P + 1, 63, 65 (around the 64-key tile), 1000 (not a multiple of 16 or 64).
  for (int P : {8, 16, 32}) {
    CAPTURE(P);
    const std::vector<int> lens = {1, P - 1, P + 1, 63, 65, 1000};
    check_kernels(with_kv(build_batch(32, 8, 128, P, lens, 0, 51), KvDtype::int4), {1, 2, 7});
    check_kernels(with_kv(build_batch(16, 4, 128, P, lens, 0, 52), KvDtype::int4), {3}, Dist::outliers);
  }
  check_kernels(with_kv(build_batch(20, 1, 128, 16, {333, 4}, 0, 53), KvDtype::int4), {1, 4});  // a group of 20 heads
}

TEST_CASE("INT4 pages: v3 steps in a row reset their counters, and the other steps are refused") {
  const DecodeBatch b = with_kv(build_batch(32, 8, 128, 16, {5000, 17, 4097}, 0, 61), KvDtype::int4);
  const std::vector<float> q = make_queries(b, 61, Dist::normal);
  const KvScales scales = pool_scales(b, 61, Dist::normal);
  const KvContents kv = hashed_contents(b, 61, Dist::normal, &scales);
  const DecodeOracle oracle(b, q, kv, true);
  GpuDecoder gpu(b, q, kv);
  REQUIRE(gpu.scales().k == scales.k);
  for (int rep = 0; rep < 3; ++rep)
    for (DecodeKernel k : {DecodeKernel::v3, DecodeKernel::v2, DecodeKernel::v3}) {
      const GpuDecodeOutput out = gpu.run(k, 9, KvLayout::paged);
      const CheckResult c = oracle.judge(out.o, out.lse);
      CHECK_MESSAGE(c.pass(), c.failures());
    }
  for (DecodeKernel k : {DecodeKernel::v4, DecodeKernel::v5, DecodeKernel::v6, DecodeKernel::v9, DecodeKernel::final_8bit})
    CHECK_THROWS_AS(gpu.run(k, 9, KvLayout::paged), UsageError);
  CHECK_THROWS_AS(gpu.run(DecodeKernel::v2, 9, KvLayout::contiguous), UsageError);
}

TEST_CASE("timing gives a positive median") {
  const DecodeBatch b = build_batch(8, 2, 128, 16, {4096, 4096}, 0, 1);
  const std::vector<float> q = make_queries(b, 1, Dist::normal);
  GpuDecoder gpu(b, q, KvContents{1, Dist::normal, nullptr});
  CHECK(gpu.time_ms(1, KvLayout::paged) > 0);
  CHECK(gpu.time_ms(4, KvLayout::contiguous) > 0);
}

TEST_CASE("v6 skips only multiplies by exactly 1: its output is v5's, bit for bit") {
  for (KvDtype t : {KvDtype::fp8, KvDtype::int8}) {
    CAPTURE(kv_dtype_name(t));
    DecodeBatch b = build_batch(32, 8, 128, 16, {4000, 17, 1, 2100}, 0, 51);
    b.kv_dtype = t;
    const std::vector<float> q = make_queries(b, 51, Dist::outliers);
    GpuDecoder gpu(b, q, KvContents{51, Dist::outliers, nullptr});
    const GpuDecodeOutput v5 = gpu.run(DecodeKernel::v5, 3, KvLayout::paged);
    const GpuDecodeOutput v6 = gpu.run(DecodeKernel::v6, 3, KvLayout::paged);
    REQUIRE(v5.o.size() == v6.o.size());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < v5.o.size(); ++i) differ += v5.o[i] != v6.o[i];
    CHECK(differ == 0);
    CHECK(v5.lse == v6.lse);
  }
}

TEST_CASE("v7-v10, v13 (8-bit pages by TMA): page sizes 8, 16, 64, 256, ragged lengths, B = 1 and B = 33, GQA and MQA") {
  testing_support::require_hopper("v7-v10, v13 and v14");
  // Its own test case, last: a TMA or mbarrier fault shows here without taking the others with it.
  // v9, v10 and v13 (8 heads per block, from v7) also at G = 1, 4, 8, 16 and 32: one, two and four blocks per KV head.
  const std::vector<DecodeKernel> v7 = {DecodeKernel::v7, DecodeKernel::v8, DecodeKernel::v9, DecodeKernel::v10,
                                        DecodeKernel::v13, DecodeKernel::final_8bit};
  for (KvDtype t : {KvDtype::fp8, KvDtype::int8}) {
    CAPTURE(kv_dtype_name(t));
    for (int P : {8, 16, 64, 256}) {
      CAPTURE(P);
      check_kernels(with_kv(build_batch(32, 8, 128, P, {P * 5 + 3}, 0, 31), t), {2, 3}, Dist::normal, 7, false, v7);
      check_kernels(with_kv(build_batch(8, 1, 128, P, ragged_lengths(33, 700, P, 4), 0, 32), t), {2}, Dist::normal, 7,
                    false, v7);
    }
    check_kernels(with_kv(build_batch(16, 4, 128, 16, {900, 31, 1, 257}, 0, 7), t), {5}, Dist::outliers, 7, false, v7);
    check_kernels(with_kv(build_batch(8, 2, 128, 16, {100, 1, 64, 65}, 0, 8), t), {16, 64}, Dist::normal, 7, false, v7);
    const std::vector<DecodeKernel> v9 = {DecodeKernel::v9, DecodeKernel::v10, DecodeKernel::v13, DecodeKernel::final_8bit};
    for (int G : {1, 8, 16, 32}) {
      CAPTURE(G);
      check_kernels(with_kv(build_batch(G * 2, 2, 128, 16, {1500, 17, 8}, 0, 9), t), {3}, Dist::outliers, 7, false, v9);
    }
  }
  // Steps in a row (the mbarrier phases start again at every launch), and v7's and v8's
  // output is v6's bit for bit (v8 changes who waits for whom, not what a warp computes).
  DecodeBatch b = build_batch(32, 8, 128, 16, {5000, 17, 4097}, 0, 41);
  b.kv_dtype = KvDtype::fp8;
  const std::vector<float> q = make_queries(b, 41, Dist::normal);
  GpuDecoder gpu(b, q, KvContents{41, Dist::normal, nullptr});
  const GpuDecodeOutput v6 = gpu.run(DecodeKernel::v6, 9, KvLayout::paged);
  for (DecodeKernel k : {DecodeKernel::v7, DecodeKernel::v8}) {
    if (kernel_in_lab(k) && !TUTORIAL_LAB) continue;
    CAPTURE(kernel_name(k));
    for (int rep = 0; rep < 3; ++rep) {
      const GpuDecodeOutput out = gpu.run(k, 9, KvLayout::paged);
      CHECK(out.o == v6.o);
      CHECK(out.lse == v6.lse);
    }
    CHECK(gpu.time_ms(k, 9, KvLayout::paged) > 0);
    const GpuDecodeOutput again = gpu.run(k, 9, KvLayout::paged);  // after many timed steps
    CHECK(again.o == v6.o);
  }
  // v10 is v9 under a tighter register budget: the same arithmetic, so the same bits; also
  // after timed steps (the arrival counters and mbarrier phases start afresh).
  const GpuDecodeOutput v9 = gpu.run(DecodeKernel::v9, 9, KvLayout::paged);
  CHECK(gpu.time_ms(DecodeKernel::v9, 9, KvLayout::paged) > 0);
#if TUTORIAL_LAB
  CHECK(gpu.time_ms(DecodeKernel::v10, 9, KvLayout::paged) > 0);
#endif
  for (DecodeKernel k : {DecodeKernel::v9, DecodeKernel::v10}) {
    if (kernel_in_lab(k) && !TUTORIAL_LAB) continue;
    CAPTURE(kernel_name(k));
    const GpuDecodeOutput out = gpu.run(k, 9, KvLayout::paged);
    CHECK(out.o == v9.o);
    CHECK(out.lse == v9.lse);
  }
  // The final 8-bit kernel is v9's arithmetic with three or four blocks per SM: v9's bits on
  // both sides of its table (9 splits of 576 keys: three blocks; 2 of 2560: four).
  for (int s : {9, 2}) {
    CAPTURE(s);
    const GpuDecodeOutput ref = gpu.run(DecodeKernel::v9, s, KvLayout::paged);
    const GpuDecodeOutput fin = gpu.run(DecodeKernel::final_8bit, s, KvLayout::paged);
    CHECK(fin.o == ref.o);
    CHECK(fin.lse == ref.lse);
  }
  // Pages below kTmaMinPage tokens are refused, not read wrong.
  DecodeBatch small = build_batch(8, 2, 128, 4, {100}, 0, 3);
  small.kv_dtype = KvDtype::int8;
  GpuDecoder g4(small, make_queries(small, 3, Dist::normal), KvContents{3, Dist::normal, nullptr});
  CHECK_THROWS_AS(g4.run(DecodeKernel::v7, 2, KvLayout::paged), UsageError);
  CHECK_THROWS_AS(g4.run(DecodeKernel::v8, 2, KvLayout::paged), UsageError);
  CHECK_THROWS_AS(g4.run(DecodeKernel::v9, 2, KvLayout::paged), UsageError);
  CHECK_THROWS_AS(g4.run(DecodeKernel::v10, 2, KvLayout::paged), UsageError);
  CHECK_THROWS_AS(g4.run(DecodeKernel::v13, 2, KvLayout::paged), UsageError);
  CHECK_THROWS_AS(g4.run(DecodeKernel::final_8bit, 2, KvLayout::paged), UsageError);
}

#if TUTORIAL_LAB  // v10 and v13 are the lab's
TEST_CASE("v13 (a stage refilled once its codes are in registers): v10's bits in every one of many steps") {
  testing_support::require_hopper("v7-v10, v13 and v14");
  // v13 computes what v10 computes, in the same order: any difference is a stage overwritten
  // while a warp still read it (v13's first form, without the proxy fence, failed exactly
  // this way, and only sometimes). So many steps, each compared bit for bit, at a shape with
  // long splits (many refills) and at one that fills every SM with four blocks.
  for (KvDtype t : {KvDtype::fp8, KvDtype::int8}) {
    CAPTURE(kv_dtype_name(t));
    struct Shape {
      int heads, kv_heads, batch, len, splits;
    };
    for (const Shape s : {Shape{32, 8, 3, 5000, 9}, Shape{32, 8, 8, 8192, 8}, Shape{8, 1, 33, 2000, 4}}) {
      CAPTURE(s.batch);
      CAPTURE(s.len);
      DecodeBatch b = build_batch(s.heads, s.kv_heads, 128, 16, std::vector<int>(s.batch, s.len), 0, 51);
      b.kv_dtype = t;
      const std::vector<float> q = make_queries(b, 51, Dist::outliers);
      GpuDecoder gpu(b, q, KvContents{51, Dist::outliers, nullptr});
      const GpuDecodeOutput v10 = gpu.run(DecodeKernel::v10, s.splits, KvLayout::paged);
      int differ = 0;
      for (int rep = 0; rep < 12; ++rep) {
        const GpuDecodeOutput out = gpu.run(DecodeKernel::v13, s.splits, KvLayout::paged);
        differ += out.o != v10.o || out.lse != v10.lse;
      }
      CHECK(differ == 0);
      CHECK(gpu.time_ms(DecodeKernel::v13, s.splits, KvLayout::paged) > 0);
      const GpuDecodeOutput again = gpu.run(DecodeKernel::v13, s.splits, KvLayout::paged);  // after timed steps
      CHECK(again.o == v10.o);
      CHECK(again.lse == v10.lse);
    }
  }
}

#endif
TEST_CASE("v12 (the merge in one round trip): equal to v5 within rounding, and its fallback for many splits") {
  // One long sequence with many splits (the one-trip path), and a group of 16 heads with
  // more splits than the stages hold (v5's path inside v12).
  for (int splits : {33, 96}) {
    CAPTURE(splits);
    const DecodeBatch b = build_batch(splits == 33 ? 32 : 64, splits == 33 ? 8 : 4, 128, 16, {splits * 64 + 5}, 0, 61);
    const std::vector<float> q = make_queries(b, 61, Dist::outliers);
    const KvContents kv = hashed_contents(b, 61, Dist::outliers);
    GpuDecoder gpu(b, q, kv);
    const DecodeOracle oracle(b, q, kv, true);
    const GpuDecodeOutput v5 = gpu.run(DecodeKernel::v5, splits, KvLayout::paged);
    const GpuDecodeOutput v12 = gpu.run(DecodeKernel::v12, splits, KvLayout::paged);
    const CheckResult c = oracle.judge(v12.o, v12.lse);
    CHECK_MESSAGE(c.pass(), c.failures());
    // The same states folded in the same order: the same bits as v5; the final bf16 kernel is v12.
    CHECK(v12.o == v5.o);
    CHECK(v12.lse == v5.lse);
    const GpuDecodeOutput fin = gpu.run(DecodeKernel::final_bf16, splits, KvLayout::paged);
    CHECK(fin.o == v12.o);
    CHECK(fin.lse == v12.lse);
  }
  DecodeBatch e = build_batch(8, 2, 128, 16, {100}, 0, 3);
  e.kv_dtype = KvDtype::fp8;
  GpuDecoder g8(e, make_queries(e, 3, Dist::normal), KvContents{3, Dist::normal, nullptr});
  CHECK_THROWS_AS(g8.run(DecodeKernel::v12, 2, KvLayout::paged), UsageError);
  CHECK_THROWS_AS(g8.run(DecodeKernel::v14, 2, KvLayout::paged), UsageError);
  CHECK_THROWS_AS(g8.run(DecodeKernel::final_bf16, 2, KvLayout::paged), UsageError);
}

TEST_CASE("v14 (the launch overlapped with the kernel before): v12's bits alone and in chains of steps") {
  testing_support::require_hopper("v7-v10, v13 and v14");
  // v14 computes what v12 computes; launched back to back, each step may start before the one
  // ahead ends, so a step that read Q, wrote O or the split states, or took an arrival ticket
  // before its wait would show here: the chain's last step, the steps after a timed chain, and
  // every split shape (one-trip merge, v5's fallback, empty splits, a split holding the newest
  // token's tile alone) must give v12's bits.
  struct Shape {
    int heads, kv_heads, len, splits;
  };
  for (const Shape s : {Shape{32, 8, 33 * 64 + 5, 33}, Shape{64, 4, 96 * 64 + 5, 96}, Shape{32, 8, 32768, 32},
                        Shape{8, 2, 300, 9}, Shape{8, 1, 130, 2}}) {
    CAPTURE(s.len);
    CAPTURE(s.splits);
    const DecodeBatch b = build_batch(s.heads, s.kv_heads, 128, 16, {s.len}, 0, 62);
    const std::vector<float> q = make_queries(b, 62, Dist::outliers);
    const KvContents kv = hashed_contents(b, 62, Dist::outliers);
    GpuDecoder gpu(b, q, kv);
    const DecodeOracle oracle(b, q, kv, true);
    const GpuDecodeOutput v12 = gpu.run(DecodeKernel::v12, s.splits, KvLayout::paged);
    const GpuDecodeOutput v14 = gpu.run(DecodeKernel::v14, s.splits, KvLayout::paged);
    const CheckResult c = oracle.judge(v14.o, v14.lse);
    CHECK_MESSAGE(c.pass(), c.failures());
    CHECK(v14.o == v12.o);
    CHECK(v14.lse == v12.lse);
    for (int steps : {2, 8}) {
      CAPTURE(steps);
      const GpuDecodeOutput chain = gpu.run_chain(DecodeKernel::v14, s.splits, KvLayout::paged, steps);
      CHECK(chain.o == v12.o);
      CHECK(chain.lse == v12.lse);
    }
    CHECK(gpu.time_chain_ms(DecodeKernel::v14, s.splits, KvLayout::paged, 8) > 0);
    const GpuDecodeOutput after = gpu.run(DecodeKernel::v14, s.splits, KvLayout::paged);  // counters reset by the chains
    CHECK(after.o == v12.o);
    CHECK(after.lse == v12.lse);
    const GpuDecodeOutput v12_after = gpu.run_chain(DecodeKernel::v12, s.splits, KvLayout::paged, 3);
    CHECK(v12_after.o == v12.o);
  }
  const DecodeBatch small = build_batch(8, 2, 128, 16, {100}, 0, 3);
  GpuDecoder g(small, make_queries(small, 3, Dist::normal), KvContents{3, Dist::normal, nullptr});
  CHECK_THROWS_AS(g.run_chain(DecodeKernel::v14, 2, KvLayout::paged, 0), UsageError);
}
