// The INT4 KV cache on the CPU: codes in [-7, 7], two per byte (nibble order, odd
// counts), the scale of a page (amax / 7) and the error bound it gives, the decode model
// over INT4 pools against the fp64 reference of the dequantised values, and the traffic
// model's bytes (half a byte per code, plus the scales).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "chapters/07_paged_radix/decode.hpp"
#include "chapters/07_paged_radix/decode_model.hpp"
#include "chapters/07_paged_radix/kv_accuracy.hpp"
#include "chapters/07_paged_radix/kv_quant.hpp"
#include "chapters/07_paged_radix/kv_values.hpp"
#include "chapters/07_paged_radix/paged_kv_cache.hpp"
#include "common/inputs.hpp"
#include "common/quant8.hpp"

using namespace attn;
using namespace attn::ch07;

TEST_CASE("INT4: round to nearest even, clamped to [-7, 7], and every code's nibble decodes back to it") {
  CHECK(q8::int4_encode(2.5f) == 2);
  CHECK(q8::int4_encode(3.5f) == 4);
  CHECK(q8::int4_encode(-2.5f) == -2);
  CHECK(q8::int4_encode(6.6f) == 7);
  CHECK(q8::int4_encode(100.f) == 7);
  CHECK(q8::int4_encode(-8.f) == -7);  // -8 is never produced: the grid is symmetric
  CHECK(q8::int4_encode(std::nanf("")) == 0);
  CHECK(kv_qmax(KvDtype::int4) == 7.f);
  for (int c = -7; c <= 7; ++c) {
    CAPTURE(c);
    const uint8_t n = q8::int4_nibble(int8_t(c));
    CHECK(n < 16);
    CHECK(int(q8::int4_from_nibble(n)) == c);
    CHECK(int(q8::int4_from_nibble(uint8_t(n | 0xf0u))) == c);  // only the low nibble counts
    CHECK(kv_code(KvDtype::int4, float(c)) == float(c));
  }
  CHECK(kv_code(KvDtype::int4, 7.49f) == 7.f);
  CHECK(kv_code(KvDtype::int4, -7.51f) == -7.f);
}

TEST_CASE("INT4 packing: element 2i in the low nibble of byte i, 2i + 1 in the high one, an odd count padded with 0") {
  const std::vector<float> codes = {1, -2, 7, -7, 0, 3, -1};
  const std::vector<uint8_t> b = kv_pack_codes(KvDtype::int4, codes.data(), codes.size());
  REQUIRE(b.size() == 4);
  CHECK(int(b[0]) == 0xe1);  // -2 = 0xe (high), 1 (low)
  CHECK(int(b[1]) == 0x97);  // -7 = 0x9 (high), 7 (low)
  CHECK(int(b[2]) == 0x30);  // 3 (high), 0 (low)
  CHECK(int(b[3]) == 0x0f);  // -1 = 0xf (low); the high nibble of the odd element's byte is 0
  CHECK(kv_unpack_codes(KvDtype::int4, b.data(), codes.size()) == codes);
  // 8-bit formats: one byte per code, the same round trip.
  for (KvDtype t : {KvDtype::fp8, KvDtype::int8}) {
    const std::vector<float> c8 = {1, -2, 7, -7, 0, 3, -1};
    const std::vector<uint8_t> b8 = kv_pack_codes(t, c8.data(), c8.size());
    CHECK(b8.size() == c8.size());
    CHECK(kv_unpack_codes(t, b8.data(), c8.size()) == c8);
  }
}

TEST_CASE("INT4 packing: random codes of every length 1..65 round-trip, and rows of odd d take (d + 1) / 2 bytes") {
  Rng rng(17);
  for (std::size_t n = 1; n <= 65; ++n) {
    CAPTURE(n);
    std::vector<float> codes(n);
    for (float& c : codes) c = float(int(rng.next_u64() % 15) - 7);
    const std::vector<uint8_t> b = kv_pack_codes(KvDtype::int4, codes.data(), n);
    REQUIRE(b.size() == (n + 1) / 2);
    CHECK(kv_unpack_codes(KvDtype::int4, b.data(), n) == codes);
    for (std::size_t i = 0; i < n; ++i) {  // each code where the kernels look for it
      const int nib = (b[i / 2] >> (4 * (i % 2))) & 0xf;
      CHECK(int(q8::int4_from_nibble(uint8_t(nib))) == int(codes[i]));
    }
    if (n % 2) CHECK((b.back() >> 4) == 0);
  }
  for (int d : {1, 5, 63, 64, 127, 128}) {
    CAPTURE(d);
    CHECK(kv_row_bytes(KvDtype::int4, d) == (d + 1) / 2);
    CHECK(kv_row_bytes(KvDtype::int8, d) == d);
    CHECK(kv_row_bytes(KvDtype::bf16, d) == 2 * d);
  }
}

TEST_CASE("INT4 pages: scale amax / 7 per (page, KV head), every value within half a step, the page's amax exact") {
  // Pools filled as the GPU fills them: whole pages, one scale from the page's amax.
  DecodeBatch b = build_batch(4, 2, 128, 16, {37, 16, 1}, 0, 5);
  b.kv_dtype = KvDtype::int4;
  for (Dist dist : {Dist::normal, Dist::outliers, Dist::mean_shifted}) {
    CAPTURE(dist_name(dist));
    const KvPools p = fill_pools(b, 9, dist);
    REQUIRE(p.k_scale.size() == b.scale_elems());
    const std::size_t per = std::size_t(b.page_size) * b.d;
    for (std::size_t blk = 0; blk < b.scale_elems(); ++blk)
      for (int which = 0; which < 2; ++which) {
        const std::vector<float>& codes = which ? p.v : p.k;
        const float s = (which ? p.v_scale : p.k_scale)[blk];
        float amax = 0.f;
        for (std::size_t i = blk * per; i < (blk + 1) * per; ++i)
          amax = std::max(amax, std::fabs(round_to(DType::bf16, kv_value(9, which ? kStreamV : kStreamK, i, dist))));
        CHECK(s == q8::block_scale(amax, 7.f));
        bool hit_max = false;
        for (std::size_t i = blk * per; i < (blk + 1) * per; ++i) {
          const float x = round_to(DType::bf16, kv_value(9, which ? kStreamV : kStreamK, i, dist));
          const float c = codes[i];
          REQUIRE(c == std::round(c));
          REQUIRE(std::fabs(c) <= 7.f);
          // Half a step, plus the fp32 rounding of x / s and of c * s.
          REQUIRE(std::fabs(kv_dequant(c, s) - x) <= 0.5f * s * (1.f + 1e-5f) + 1e-6f * amax);
          hit_max = hit_max || std::fabs(c) == 7.f;
        }
        CHECK(hit_max);  // the page's largest value lands on the largest code
      }
  }
}

TEST_CASE("INT4 pages written token by token: the scale doubles to fit, errors stay under one step of the final grid") {
  PagePool pool(4, 4, 1, 6, KvDtype::int4);
  PagedKvCache cache(pool);
  const auto s = cache.create();
  const float rows[3][6] = {{0.5f, -1.f, 0.25f, 0.f, 1.f, -0.75f},
                            {2.f, 0.1f, -0.3f, 0.6f, -1.9f, 0.f},
                            {-3.9f, 1.2f, 0.4f, -0.05f, 2.5f, 3.3f}};
  float k[6], v[6];
  for (const auto& r : rows) {
    for (int c = 0; c < 6; ++c) k[c] = v[c] = r[c];
    REQUIRE(cache.append(s, k, v) == Status::ok);
  }
  const float scale = pool.k_scales()[std::size_t(cache.block_table(s)[0])];
  CHECK(scale == 4.f * q8::block_scale(1.f, 7.f));  // 1/7, doubled twice to fit 3.9
  for (int t = 0; t < 3; ++t)
    for (int c = 0; c < 6; ++c) {
      REQUIRE(cache.read(s, t, k, v) == Status::ok);
      CAPTURE(t);
      CAPTURE(c);
      CHECK(std::fabs(k[c] - round_to(DType::bf16, rows[t][c])) <= scale);
    }
  CHECK(cache.validate().empty());
}

TEST_CASE("decode model over INT4 pools: the 2x naive rule against the fp64 reference of the dequantised K and V") {
  for (int P : {1, 16, 64}) {
    DecodeBatch b = build_batch(8, 2, 128, P, ragged_lengths(5, 300, P, 3), 0, 3);
    b.kv_dtype = KvDtype::int4;
    CAPTURE(b.describe());
    const std::vector<float> q = make_queries(b, 3, Dist::normal);
    const KvScales scales = pool_scales(b, 3, Dist::normal);
    const DecodeOracle oracle(b, q, hashed_contents(b, 3, Dist::normal, &scales), true);
    const KvPools pools = fill_pools(b, 3, Dist::normal);
    for (int splits : {1, 3}) {
      const DecodeModelResult r = decode_model(b, q, pools, splits, 96 * 1024);
      const CheckResult c = oracle.judge(r.o, r.lse);
      CHECK_MESSAGE(c.pass(), c.failures());
      const DecodeTraffic f = decode_traffic(b, splits, true);
      CHECK(r.traffic.bytes_read == f.read());
      CHECK(r.traffic.bytes_written == f.write());
    }
    // Wrong scales must fail: sequence 0's K scales 1.5x too large (a page's scale read
    // from the wrong place, or amax / 4.67 instead of amax / 7).
    KvPools wrong = pools;
    for (int i = 0; i < (b.lens[0] + P - 1) / P; ++i)
      for (int hk = 0; hk < b.kv_heads; ++hk)
        wrong.k_scale[std::size_t(b.block_table[std::size_t(i)]) * b.kv_heads + hk] *= 1.5f;
    const DecodeModelResult bad = decode_model(b, q, wrong, 1, 96 * 1024);
    CHECK_FALSE(oracle.judge(bad.o, bad.lse).pass());
  }
}

TEST_CASE("INT4 traffic: half a byte per cached value, and the K and V scale of every (page, KV head)") {
  DecodeBatch b = build_batch(8, 2, 128, 16, {100, 17, 1}, 0, 1);
  const double tokens = double(b.total_tokens()), pages = double(b.used_pages());
  b.kv_dtype = KvDtype::int4;
  CHECK(b.kv_bytes() == tokens * b.kv_heads * b.d * 0.5 * 2 + pages * b.kv_heads * 2 * 4);
  const DecodeTraffic f4 = decode_traffic(b, 1, true);
  b.kv_dtype = KvDtype::int8;
  const DecodeTraffic f8 = decode_traffic(b, 1, true);
  CHECK(f4.kv_read * 2 == f8.kv_read);
  CHECK(f4.meta_read == f8.meta_read);  // the same scales and table entries
  CHECK(decode_smem_bytes(128, KvDtype::int4) < decode_smem_bytes(128, KvDtype::int8));
}

TEST_CASE("the accuracy table has INT4 rows: per page coarser than INT8, finer per 32 channels") {
  const AccuracyTable t = kv_accuracy_table(1);
  for (const char* in : {"normal", "outliers", "outlier channels"}) {
    CAPTURE(in);
    const double i4 = t.rel_l2(in, "int4 per page"), i8 = t.rel_l2(in, "int8 per page");
    const double g32 = t.rel_l2(in, "int4 per 32 channels"), h = t.rel_l2(in, "int4 per page + Hadamard");
    REQUIRE(std::isfinite(i4));
    REQUIRE(std::isfinite(g32));
    REQUIRE(std::isfinite(h));
    CHECK(i4 > i8);    // 15 levels against 255
    CHECK(g32 < i4);   // a scale per 32 channels follows the values more closely
  }
}
