// The 8-bit (and 4-bit) KV cache and swap to host memory: E4M3, INT8 and INT4 codes, the scale of a
// page (grown token by token, copied by copy-on-write, 0 for an all-zero page), swap
// out and in, and a property test of 100,000 random appends, forks, swaps and frees
// per format with every invariant checked after every operation.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "chapters/07_paged_radix/paged_kv_cache.hpp"
#include "common/inputs.hpp"
#include "common/quant8.hpp"

using namespace attn;
using namespace attn::ch07;

TEST_CASE("E4M3: every code decodes and encodes back to itself, with rounding, saturation and subnormals") {
  int finite = 0;
  for (int b = 0; b < 256; ++b) {
    const float x = q8::e4m3_decode(uint8_t(b));
    if (std::isnan(x)) {
      CHECK(((b & 0x7f) == 0x7f));
      continue;
    }
    ++finite;
    if (b == 0x80) continue;  // -0 encodes as -0 (0x80) too, checked by the bit compare below
    CHECK(int(q8::e4m3_encode(x)) == b);
  }
  CHECK(finite == 254);
  CHECK(q8::e4m3_decode(0x7e) == 448.f);
  CHECK(q8::e4m3_decode(0x08) == std::ldexp(1.f, -6));  // smallest normal
  CHECK(q8::e4m3_decode(0x01) == std::ldexp(1.f, -9));  // smallest subnormal
  CHECK(q8::e4m3_encode(1e6f) == 0x7e);                  // saturates
  CHECK(q8::e4m3_encode(-500.f) == 0xfe);
  CHECK(q8::e4m3_encode(1.0625f) == 0x38);  // halfway between 1 and 1.125: to even (1)
  CHECK(q8::e4m3_encode(1.1875f) == 0x3a);  // halfway between 1.125 and 1.25: to even (1.25)
  CHECK(q8::e4m3_decode(q8::e4m3_encode(3.0f * std::ldexp(1.f, -9))) == 3.0f * std::ldexp(1.f, -9));
  CHECK(q8::e4m3_encode(std::ldexp(1.f, -11)) == 0x00);  // a quarter of the smallest subnormal: 0
}

TEST_CASE("INT8: round to nearest even, clamped to [-127, 127], and an all-zero block has scale 0 and inverse 0") {
  CHECK(q8::int8_encode(2.5f) == 2);
  CHECK(q8::int8_encode(3.5f) == 4);
  CHECK(q8::int8_encode(-200.f) == -127);
  CHECK(q8::int8_encode(127.4f) == 127);
  CHECK(q8::block_scale(0.f, 127.f) == 0.f);
  CHECK(q8::inverse_scale(0.f) == 0.f);
  CHECK(q8::block_scale(254.f, 127.f) == 2.f);
}

namespace {

constexpr int kH = 1, kD = 4;

/// Token u's K and V: values on a scale that varies from token to token, so the
/// scales of the pages grow while they fill.
void token_kv(uint32_t u, float* k, float* v) {
  const float mag = float(1 + (u * 2654435761u >> 28) % 7);
  for (int i = 0; i < kH * kD; ++i) {
    const uint64_t h = (uint64_t(u) * 0x9e3779b97f4a7c15ull) ^ (uint64_t(i + 1) * 0xbf58476d1ce4e5b9ull);
    k[i] = mag * (float(int((h >> 20) % 2001) - 1000) / 256.f);
    v[i] = mag * (float(int((h >> 40) % 2001) - 1000) / 256.f);
  }
}

}  // namespace

TEST_CASE("exercise ch07.7: a quantised page: scale from the first token, doubled for a larger one, an all-zero page gives zeros") {
  for (KvDtype t : {KvDtype::fp8, KvDtype::int8, KvDtype::int4}) {
    CAPTURE(kv_dtype_name(t));
    PagePool pool(4, 4, kH, kD, t);
    PagedKvCache cache(pool);
    const auto s = cache.create();
    float k[kH * kD], v[kH * kD], rk[kH * kD], rv[kH * kD];
    for (float& x : k) x = 0.f;
    for (float& x : v) x = 0.f;
    REQUIRE(cache.append(s, k, v) == Status::ok);
    const int page = cache.block_table(s)[0];
    CHECK(pool.k_scales()[std::size_t(page) * kH] == 0.f);
    REQUIRE(cache.read(s, 0, rk, rv) == Status::ok);
    for (int i = 0; i < kH * kD; ++i) CHECK((rk[i] == 0.f && rv[i] == 0.f));  // not 0 * inf = NaN
    // A token of amax 1, then one of amax 3: the scale grows to 3 / Q, and token 1 is requantised.
    for (int i = 0; i < kH * kD; ++i) k[i] = v[i] = (i % 2 ? -1.f : 0.5f);
    REQUIRE(cache.append(s, k, v) == Status::ok);
    const float qmax = kv_qmax(t);
    CHECK(pool.k_scales()[std::size_t(page) * kH] == q8::block_scale(1.f, qmax));
    for (int i = 0; i < kH * kD; ++i) k[i] = v[i] = 3.f * (i % 2 ? 1.f : -0.25f);
    REQUIRE(cache.append(s, k, v) == Status::ok);
    // 3 does not fit under 1 / Q: the scale doubles twice, to 4 / Q.
    CHECK(pool.k_scales()[std::size_t(page) * kH] == 4.f * q8::block_scale(1.f, qmax));
    REQUIRE(cache.read(s, 1, rk, rv) == Status::ok);
    for (int i = 0; i < kH * kD; ++i) {
      const float want = i % 2 ? -1.f : 0.5f;
      if (t == KvDtype::fp8) CHECK(rk[i] == want);  // exponent shifts: exact
      else CHECK(std::fabs(rk[i] - want) <= 4.f / qmax);  // under one step of the final grid
    }
    REQUIRE(cache.read(s, 2, rk, rv) == Status::ok);
    CHECK(std::fabs(rk[1] - 3.f) <= (t == KvDtype::fp8 ? 3.f / 16.f : 0.5f * 4.f / qmax + 3.f / 256.f));
    CHECK(cache.validate().empty());
  }
}

TEST_CASE("exercise ch07.6: swap out moves the private pages to the host and back, fork shares scales, copy-on-write copies them") {
  for (KvDtype t : {KvDtype::fp8, KvDtype::int8, KvDtype::int4}) {
    CAPTURE(kv_dtype_name(t));
    PagePool pool(8, 4, kH, kD, t), host(8, 4, kH, kD, t);
    PagedKvCache cache(pool, &host);
    const auto a = cache.create();
    float k[kH * kD], v[kH * kD], ra[kH * kD], rb[kH * kD], x[kH * kD], y[kH * kD];
    for (uint32_t u = 1; u <= 6; ++u) {
      token_kv(u, k, v);
      REQUIRE(cache.append(a, k, v) == Status::ok);
    }
    PagedKvCache::SeqId b;
    REQUIRE(cache.fork(a, &b) == Status::ok);
    token_kv(99, k, v);
    REQUIRE(cache.append(b, k, v) == Status::ok);  // copies a's half-full last page
    const int pa = cache.block_table(a)[1], pb = cache.block_table(b)[1];
    REQUIRE(pa != pb);
    for (int t4 = 4; t4 < 6; ++t4) {
      REQUIRE(cache.read(a, t4, ra, x) == Status::ok);
      REQUIRE(cache.read(b, t4, rb, y) == Status::ok);
      for (int i = 0; i < kH * kD; ++i) CHECK((ra[i] == rb[i] && x[i] == y[i]));  // same codes, same scales
    }
    // Swap b out: its private page 1 goes to the host, page 0 (shared with a) stays.
    int moved = 0;
    REQUIRE(cache.pages_to_swap_out(b) == 1);
    const int dev_free = pool.free_pages();
    REQUIRE(cache.swap_out(b, &moved) == Status::ok);
    CHECK(moved == 1);
    CHECK(cache.swapped(b));
    CHECK(pool.free_pages() == dev_free + 1);
    CHECK(host.used_pages() == 1);
    CHECK(cache.block_table(b)[0] == cache.block_table(a)[0]);  // the shared page stays
    CHECK(cache.append(b, k, v) == Status::swapped_out);
    CHECK(cache.validate().empty());
    REQUIRE(cache.read(b, 6, rb, y) == Status::ok);  // readable from the host copy
    REQUIRE(cache.swap_in(b, &moved) == Status::ok);
    CHECK(moved == 1);
    float z[kH * kD], w[kH * kD];
    REQUIRE(cache.read(b, 6, z, w) == Status::ok);
    for (int i = 0; i < kH * kD; ++i) CHECK((z[i] == rb[i] && w[i] == y[i]));
    CHECK(cache.validate().empty());
    CHECK(host.used_pages() == 0);
  }
}

TEST_CASE("swap is all or nothing: a full host pool, then a full device pool") {
  PagePool pool(4, 2, 0, 0), host(1, 2, 0, 0);
  PagedKvCache cache(pool, &host);
  const auto a = cache.create(), b = cache.create();
  REQUIRE(cache.append_tokens(a, 4) == Status::ok);  // 2 pages
  CHECK(cache.swap_out(a) == Status::out_of_pages);  // the host has 1
  CHECK(!cache.swapped(a));
  CHECK(cache.validate().empty());
  REQUIRE(cache.append_tokens(b, 2) == Status::ok);
  REQUIRE(cache.swap_out(b) == Status::ok);
  REQUIRE(cache.append_tokens(a, 4) == Status::ok);  // the device pool is now full
  CHECK(cache.swap_in(b) == Status::out_of_pages);
  CHECK(cache.swapped(b));
  CHECK(cache.validate().empty());
  REQUIRE(cache.free(a) == Status::ok);
  CHECK(cache.swap_in(b) == Status::ok);
  CHECK(cache.free(b) == Status::ok);
  CHECK(cache.validate().empty());
  CHECK(pool.used_pages() == 0);
  CHECK(host.used_pages() == 0);
}

namespace {

/// Reads every token of `id`: K and V flattened, in token order.
std::vector<float> snapshot(const PagedKvCache& cache, PagedKvCache::SeqId id) {
  std::vector<float> out;
  float k[kH * kD], v[kH * kD];
  for (int t = 0; t < cache.length(id); ++t) {
    REQUIRE(cache.read(id, t, k, v) == Status::ok);
    out.insert(out.end(), k, k + kH * kD);
    out.insert(out.end(), v, v + kH * kD);
  }
  return out;
}

/// True when every stored value of `id` is within `tol` of the largest magnitude of
/// its token's head (the page's scale covers the largest token) of the value appended.
bool close_to_model(const PagedKvCache& cache, PagedKvCache::SeqId id, const std::vector<uint32_t>& toks, KvDtype t) {
  if (cache.length(id) != int(toks.size())) return false;
  const std::vector<float> got = snapshot(cache, id);
  float k[kH * kD], v[kH * kD];
  for (std::size_t i = 0; i < toks.size(); ++i) {
    token_kv(toks[i], k, v);
    for (int h = 0; h < kH; ++h)
      for (int which = 0; which < 2; ++which) {
        const float* x = which ? v : k;
        // The page's amax is at most 7 x 1000 / 256; its grid step is amax / Q (INT8) or
        // 2^-4 of the value (E4M3); a few regrowths each add at most half a step.
        const float amax_page = 7.f * 1000.f / 256.f;
        for (int c = 0; c < kD; ++c) {
          const float want = round_to(DType::bf16, x[h * kD + c]);
          const float stored = got[i * 2 * kH * kD + std::size_t(which) * kH * kD + h * kD + c];
          // INT8 (INT4): under one step of a grid at most twice amax / 127 (/ 7); E4M3: half an
          // ulp (2^-4 relative), plus a subnormal step (2^-9 of the scale), plus bf16's 2^-9.
          const float tol = t != KvDtype::fp8 ? 2.f * 2.f * amax_page / kv_qmax(t) + std::fabs(want) / 256.f
                                              : 0.07f * std::fabs(want) + 2.f * amax_page / 448.f / 256.f;
          if (!(std::fabs(stored - want) <= tol)) return false;
        }
      }
  }
  return true;
}

/// 100,000 random operations: append, fork, swap out, swap in, free (and create).
/// After every one: validate() (tables, refcounts on device and host, ownership,
/// scales and codes), the touched sequence against the model within the format's
/// error, and bit-exact contents through a fork, a swap out and a swap in.
void swap_property_test(KvDtype t, int P, int ops, uint64_t seed) {
  PagePool pool(40, P, kH, kD, t), host(24, P, kH, kD, t);
  pool.shuffle_free_list(seed);
  host.shuffle_free_list(seed + 1);
  PagedKvCache cache(pool, &host);
  std::map<PagedKvCache::SeqId, std::vector<uint32_t>> model;
  Rng rng(seed);
  uint32_t next_token = 1;
  float k[kH * kD], v[kH * kD];
  long appends = 0, forks = 0, outs = 0, ins = 0, frees = 0, full = 0;
  auto random_seq = [&]() {
    auto it = model.begin();
    std::advance(it, long(rng.next_u64() % model.size()));
    return it->first;
  };
  for (int op = 0; op < ops; ++op) {
    const double r = rng.uniform();
    PagedKvCache::SeqId touched = -1;
    Status st = Status::ok;
    if (model.empty() || r < 0.05) {
      touched = cache.create();
      model[touched];
    } else if (r < 0.55) {
      touched = random_seq();
      if (model[touched].size() >= 12 * std::size_t(P) + 5) continue;
      token_kv(next_token, k, v);
      st = cache.append(touched, k, v);
      if (st == Status::ok) model[touched].push_back(next_token++), ++appends;
      else if (st == Status::swapped_out) REQUIRE(cache.swapped(touched));
    } else if (r < 0.63) {
      touched = random_seq();
      const std::vector<float> before = snapshot(cache, touched);
      PagedKvCache::SeqId c;
      st = cache.fork(touched, &c);
      if (st == Status::ok) {
        model[c] = model[touched];
        if (snapshot(cache, c) != before) FAIL("a fork does not read what its parent holds, op " << op);
        ++forks;
      } else {
        REQUIRE(st == Status::swapped_out);
      }
    } else if (r < 0.76) {
      touched = random_seq();
      const std::vector<float> before = snapshot(cache, touched);
      const int dev_free = pool.free_pages(), host_free = host.free_pages(), n = cache.pages_to_swap_out(touched);
      st = cache.swap_out(touched);
      if (st == Status::ok) {
        ++outs;
        REQUIRE(pool.free_pages() == dev_free + n);
        REQUIRE(host.free_pages() == host_free - n);
      } else if (st == Status::out_of_pages) {
        ++full;
        REQUIRE(pool.free_pages() == dev_free);  // nothing moved
        REQUIRE(!cache.swapped(touched));
      }
      if (snapshot(cache, touched) != before) FAIL("swap_out changed the contents, op " << op);
    } else if (r < 0.90) {
      touched = random_seq();
      const std::vector<float> before = snapshot(cache, touched);
      const bool was = cache.swapped(touched);
      st = cache.swap_in(touched);
      if (st == Status::ok && was) ++ins;
      if (st == Status::out_of_pages) {
        ++full;
        REQUIRE(cache.swapped(touched));
      }
      if (snapshot(cache, touched) != before) FAIL("swap_in changed the contents, op " << op);
    } else {
      touched = random_seq();
      REQUIRE(cache.free(touched) == Status::ok);
      model.erase(touched);
      touched = -1;
      ++frees;
    }
    if (st == Status::out_of_pages && touched >= 0 && !cache.swapped(touched)) {
      // The device pool is full: the scheduler swaps someone out, or frees them when
      // the host is full too.
      const auto victim = random_seq();
      if (cache.swap_out(victim) != Status::ok) {
        REQUIRE(cache.free(victim) == Status::ok);
        model.erase(victim);
        if (victim == touched) touched = -1;
      }
    }
    const std::string why = cache.validate();
    if (!why.empty()) FAIL("after operation " << op << ": " << why);
    if (touched >= 0 && !close_to_model(cache, touched, model[touched], t))
      FAIL("contents of " << touched << " after op " << op);
  }
  for (const auto& [id, toks] : model)
    if (!close_to_model(cache, id, toks, t)) FAIL("contents of " << id << " at the end");
  MESSAGE(std::string(kv_dtype_name(t)) << " P=" << P << ": " << appends << " appends, " << forks << " forks, " << outs
                           << " swap-outs, " << ins << " swap-ins, " << frees << " frees, " << full << " out of pages, "
                           << cache.cow_copies() << " copies, " << cache.swapped_out_pages() << " pages out");
  CHECK(appends > ops / 5);
  CHECK(outs > ops / 50);
  CHECK(ins > ops / 50);
  CHECK(full > 10);
  CHECK(cache.cow_copies() > 100);
}

}  // namespace

TEST_CASE("property: 100000 random appends, forks, swaps and frees, INT8 pages of 4") {
  swap_property_test(KvDtype::int8, 4, 100000, 21);
}
TEST_CASE("property: 100000 random appends, forks, swaps and frees, FP8 pages of 16") {
  swap_property_test(KvDtype::fp8, 16, 100000, 22);
}
TEST_CASE("property: 100000 random appends, forks, swaps and frees, INT4 pages of 8") {
  swap_property_test(KvDtype::int4, 8, 100000, 23);
}
