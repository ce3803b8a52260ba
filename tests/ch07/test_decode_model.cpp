// The decode CPU model (v1 and split-K v2) against the fp64 reference: ragged
// lengths at every page size, GQA / MHA / MQA, shared prefix pages, awkward inputs;
// its counted bytes against decode_traffic(); and the v1/v2 heuristic.
#include <doctest/doctest.h>

#include <cmath>

#include "chapters/07_paged_radix/decode.hpp"
#include "chapters/07_paged_radix/decode_model.hpp"
#include "chapters/07_paged_radix/kv_values.hpp"
#include "common/errors.hpp"

using namespace attn;
using namespace attn::ch07;

namespace {

constexpr std::size_t kSram = 96 * 1024;

void check_model(const DecodeBatch& b, int splits, Dist dist = Dist::normal, uint64_t seed = 3) {
  CAPTURE(b.describe());
  CAPTURE(splits);
  const std::vector<float> q = make_queries(b, seed, dist);
  const KvPools pools = fill_pools(b, seed, dist);
  const DecodeOracle oracle(b, q, KvContents{seed, dist, nullptr}, true);
  const DecodeModelResult r = decode_model(b, q, pools, splits, kSram);
  const CheckResult c = oracle.judge(r.o, r.lse);
  CHECK_MESSAGE(c.pass(), c.failures());
  const DecodeTraffic f = decode_traffic(b, splits, true);
  CHECK(r.traffic.bytes_read == f.read());
  CHECK(r.traffic.bytes_written == f.write());
}

}  // namespace

TEST_CASE("decode model: ragged lengths (1, P-1, P, P+1, long) at every page size") {
  for (int P : {1, 8, 16, 32, 64}) {
    const std::vector<int> lens = ragged_lengths(7, 700, P, 1);
    const DecodeBatch b = build_batch(8, 2, 128, P, lens, 0, 17);
    check_model(b, 1);
    check_model(b, 3);
  }
}

TEST_CASE("decode model: GQA, MHA, MQA and groups above 16 heads") {
  const std::vector<int> lens = {300, 1, 65};
  check_model(build_batch(4, 4, 128, 16, lens, 0, 1), 1);    // MHA
  check_model(build_batch(8, 1, 128, 16, lens, 0, 2), 2);    // MQA, G = 8
  check_model(build_batch(32, 2, 128, 16, lens, 0, 3), 1);   // G = 16: one full MMA tile
  check_model(build_batch(40, 2, 64, 16, lens, 0, 4), 2);    // G = 20: two head chunks per KV head
  check_model(build_batch(6, 3, 64, 8, lens, 0, 5), 1);      // d = 64, G = 2
}

TEST_CASE("decode model: sequences that share prefix pages") {
  const DecodeBatch b = build_batch(8, 2, 128, 16, {500, 333, 130, 129, 700}, 128, 9);
  // Every sequence at least 128 long shares the first 8 pages.
  for (int s = 1; s < b.batch(); ++s)
    for (int i = 0; i < 8; ++i) CHECK(b.block_table[std::size_t(s) * b.max_pages + i] == b.block_table[i]);
  check_model(b, 1);
  check_model(b, 4);
}

TEST_CASE("decode model: mean-shifted, outlier and integer inputs") {
  const DecodeBatch b = build_batch(8, 2, 128, 16, {257, 31, 1}, 0, 4);
  check_model(b, 2, Dist::mean_shifted);
  check_model(b, 1, Dist::outliers);
  check_model(b, 2, Dist::integers);
}

TEST_CASE("decode model: more splits than tiles, so some splits are empty") {
  const DecodeBatch b = build_batch(4, 2, 64, 16, {70, 1, 200}, 0, 8);
  check_model(b, 16);
}

TEST_CASE("decode model: every K and V row is read exactly once") {
  const DecodeBatch b = build_batch(8, 2, 128, 16, {1000, 77}, 0, 8);
  for (int splits : {1, 4}) {
    const DecodeTraffic t = decode_traffic(b, splits, true);
    CHECK(t.kv_read == b.kv_bytes());
    CHECK(t.q_read == double(splits) * 2 * b.heads * b.d * 2);
  }
  const DecodeTraffic contiguous = decode_traffic(b, 1, false);
  const DecodeTraffic paged = decode_traffic(b, 1, true);
  CHECK(paged.meta_read > contiguous.meta_read);  // the table entries
  CHECK(paged.meta_read - contiguous.meta_read < 0.01 * paged.kv_read);
}

TEST_CASE("decode model: the stages must fit the on-chip budget") {
  const DecodeBatch b = build_batch(4, 2, 128, 16, {100}, 0, 1);
  const std::vector<float> q = make_queries(b, 1, Dist::normal);
  const KvPools pools = fill_pools(b, 1, Dist::normal);
  CHECK_THROWS_AS(decode_model(b, q, pools, 1, 64 * 1024), SramOverflow);
  CHECK(decode_model(b, q, pools, 1, decode_smem_bytes(128)).sram_peak == decode_smem_bytes(128));
}

TEST_CASE("exercise ch07.3: v2 picks its split count") {
  // One long sequence, GQA 32/8 on 132 SMs: 8 blocks without splitting.
  const SplitPlan one = choose_splits(1, 8, 4, 65536, 128, 132);
  CHECK(one.splits > 1);
  CHECK(one.splits * one.base_blocks >= 132);                // every SM busy
  CHECK(one.splits * one.base_blocks <= one.target_blocks);  // in one wave
  CHECK(keys_per_split(65536, one.splits) >= DecodeGeometry::kMinSplitKeys);
  // A batch of 8: 64 blocks, still too few.
  const SplitPlan eight = choose_splits(8, 8, 4, 32768, 128, 132);
  CHECK(eight.splits > 1);
  CHECK(eight.splits * eight.base_blocks <= eight.target_blocks);
  CHECK(eight.splits * eight.base_blocks >= 132);
  // Enough blocks already: v1.
  CHECK(choose_splits(64, 8, 4, 4096, 128, 132).splits == 1);
  CHECK(choose_splits(8, 32, 1, 32768, 128, 132).splits == 1);
  // Too short to be worth splitting.
  CHECK(choose_splits(1, 8, 4, 600, 128, 132).splits == 1);
  // Never a split shorter than the minimum.
  const SplitPlan mid = choose_splits(1, 1, 1, 4096, 128, 132);
  CHECK(mid.splits > 1);
  CHECK(keys_per_split(4096, mid.splits) >= DecodeGeometry::kMinSplitKeys);
}

TEST_CASE("keys_per_split cuts whole tiles and covers the sequence") {
  for (int len : {1, 63, 64, 65, 1000, 65536})
    for (int s : {1, 2, 3, 7, 32}) {
      const int per = keys_per_split(len, s);
      CHECK(per % DecodeGeometry::kBc == 0);
      CHECK(per * s >= len);
    }
}

TEST_CASE("kv_value: host values are bf16 numbers, near normal, and the distributions differ as asked") {
  double sum = 0, sum2 = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const float x = kv_value(5, kStreamV, uint64_t(i), Dist::normal);
    sum += x;
    sum2 += double(x) * x;
  }
  CHECK(std::abs(sum / n) < 0.05);
  CHECK(std::sqrt(sum2 / n) == doctest::Approx(1.155).epsilon(0.05));
  CHECK(kv_value(5, kStreamK, 7, Dist::mean_shifted) == kv_value(5, kStreamK, 7, Dist::normal) + 2.0f);
  CHECK(kv_value(5, kStreamV, 7, Dist::mean_shifted) == kv_value(5, kStreamV, 7, Dist::normal));
  for (int i = 0; i < 100; ++i) {
    const float x = kv_value(1, kStreamK, uint64_t(i), Dist::integers);
    CHECK((x == std::round(x) && x >= -2 && x <= 2));
  }
  const KvContents kv{5, Dist::normal, nullptr};
  for (std::size_t i = 0; i < 100; ++i) CHECK(kv.k(i) == round_to(DType::bf16, kv.k(i)));
}

TEST_CASE("a cache with stored K/V decodes to the reference through batch_from_cache") {
  // K/V written token by token through the block manager, forks, copy-on-write.
  const int P = 8, Hkv = 2, D = 64, Hq = 6;
  PagePool pool(64, P, Hkv, D, DType::bf16);
  pool.shuffle_free_list(4);
  PagedKvCache cache(pool);
  Rng rng(6);
  std::vector<float> k(Hkv * D), v(Hkv * D);
  auto token = [&] {
    for (auto& x : k) x = float(rng.normal());
    for (auto& x : v) x = float(rng.normal());
  };
  const auto a = cache.create();
  for (int t = 0; t < 37; ++t) {
    token();
    REQUIRE(cache.append(a, k.data(), v.data()) == Status::ok);
  }
  PagedKvCache::SeqId b, c;
  REQUIRE(cache.fork(a, &b) == Status::ok);
  REQUIRE(cache.fork(a, &c) == Status::ok);
  for (int t = 0; t < 20; ++t) {
    token();
    REQUIRE(cache.append(b, k.data(), v.data()) == Status::ok);
  }
  token();
  REQUIRE(cache.write(c, 3, k.data(), v.data()) == Status::ok);  // c's first page is its own now
  REQUIRE(cache.validate().empty());
  const DecodeBatch batch = batch_from_cache(cache, {a, b, c}, Hq);
  CHECK(batch.lens == std::vector<int>{37, 57, 37});
  const KvPools pools = pools_of(pool);
  const std::vector<float> q = make_queries(batch, 2, Dist::normal);
  const DecodeOracle oracle(batch, q, KvContents{0, Dist::normal, &pools}, true);
  for (int splits : {1, 2}) {
    const DecodeModelResult r = decode_model(batch, q, pools, splits, kSram);
    const CheckResult res = oracle.judge(r.o, r.lse);
    CHECK_MESSAGE(res.pass(), res.failures());
  }
  // a and c differ only in token 3: their outputs must differ.
  const DecodeModelResult r = decode_model(batch, q, pools, 1, kSram);
  bool differ = false;
  for (int i = 0; i < Hq * D; ++i) differ = differ || r.o[i] != r.o[2 * Hq * D + i];
  CHECK(differ);
}

TEST_CASE("the oracle fails an output with a wrong or missing element") {
  const DecodeBatch b = build_batch(4, 2, 64, 16, {40, 9}, 0, 2);
  const std::vector<float> q = make_queries(b, 1, Dist::normal);
  const KvPools pools = fill_pools(b, 1, Dist::normal);
  const DecodeOracle oracle(b, q, KvContents{1, Dist::normal, nullptr}, true);
  DecodeModelResult r = decode_model(b, q, pools, 1, kSram);
  CHECK(oracle.judge(r.o, r.lse).pass());
  std::vector<float> o = r.o;
  o[5] += 0.25f;
  CHECK_FALSE(oracle.judge(o, r.lse).pass());
  o = r.o;
  o.back() = std::nanf("");
  CHECK_FALSE(oracle.judge(o, r.lse).pass());
  std::vector<float> lse = r.lse;
  lse[3] += 0.01f;
  CHECK_FALSE(oracle.judge(r.o, lse).pass());
}

TEST_CASE("bad decode batches are usage errors") {
  DecodeBatch b = build_batch(4, 2, 64, 16, {40, 9}, 0, 2);
  b.page_size = 12;
  CHECK_THROWS_AS(validate(b), UsageError);
  b = build_batch(4, 2, 64, 16, {40, 9}, 0, 2);
  b.lens[1] = 0;
  CHECK_THROWS_AS(validate(b), UsageError);
  b = build_batch(4, 2, 64, 16, {40, 9}, 0, 2);
  b.block_table[0] = b.num_pages;
  CHECK_THROWS_AS(validate(b), UsageError);
}

TEST_CASE("v10's split plan fills four 8-bit blocks per SM, where shared memory alone says three") {
  // B = 8, L = 32K, GQA 32/8, FP8 on 132 SMs: 64 blocks before splitting.
  const SplitPlan three = choose_splits(8, 8, 4, 32768, 128, 132, KvDtype::fp8);
  const SplitPlan four = choose_splits(8, 8, 4, 32768, 128, 132, KvDtype::fp8, kV10BlocksPerSm);
  CHECK(three.target_blocks == 3 * 132);
  CHECK(four.target_blocks == 4 * 132);
  CHECK(three.splits == 6);  // 384 blocks for 396 slots
  CHECK(four.splits == 8);   // 512 blocks for 528 slots
  CHECK(four.splits * four.base_blocks <= four.target_blocks);
}

TEST_CASE("the final 8-bit kernel's table: four blocks per SM where the splits stay long, three where they would not") {
  CHECK(final_8bit_blocks_per_sm(kFinal8FourBlockKeys) == 4);
  CHECK(final_8bit_blocks_per_sm(kFinal8FourBlockKeys - 64) == 3);
  // B = 8, L = 32K, GQA 32/8, FP8 on 132 SMs: four blocks give 8 splits of 4096 keys.
  DecodeBatch b8 = build_batch(32, 8, 128, 16, std::vector<int>(8, 32768), 0, 1);
  b8.kv_dtype = KvDtype::fp8;
  CHECK(final_8bit_plan(b8, 132).splits == 8);
  // B = 1, L = 64K: four blocks would cut 64 splits of 1024 keys; three give 49 of 1344.
  DecodeBatch b1 = build_batch(32, 8, 128, 16, {65536}, 0, 1);
  b1.kv_dtype = KvDtype::fp8;
  CHECK(final_8bit_plan(b1, 132).splits == choose_splits(b1, 132, 3).splits);
  CHECK(final_8bit_plan(b1, 132).target_blocks == 3 * 132);
}
