// The block pool and the paged KV cache: fork, copy-on-write, out-of-memory as a
// status, and a property test of 100,000 random operations per page size.
#include <doctest/doctest.h>

#include <map>
#include <stdexcept>

#include "chapters/07_paged_radix/paged_kv_cache.hpp"
#include "common/inputs.hpp"

using namespace attn;
using namespace attn::ch07;

namespace {

constexpr int kHeads = 2, kDim = 4;

/// The K and V of token `u`: small integers, exact in any dtype, different per head and dim.
void token_kv(uint32_t u, float* k, float* v) {
  for (int h = 0; h < kHeads; ++h)
    for (int c = 0; c < kDim; ++c) {
      k[h * kDim + c] = float((u * 7 + h * 3 + c) % 251);
      v[h * kDim + c] = float((u * 13 + h * 5 + c * 2 + 1) % 241);
    }
}

/// True when every token of `id` holds the values the model expects.
bool contents_match(const PagedKvCache& cache, PagedKvCache::SeqId id, const std::vector<uint32_t>& want) {
  if (cache.length(id) != int(want.size())) return false;
  float k[kHeads * kDim], v[kHeads * kDim], ek[kHeads * kDim], ev[kHeads * kDim];
  for (int t = 0; t < int(want.size()); ++t) {
    if (cache.read(id, t, k, v) != Status::ok) return false;
    token_kv(want[t], ek, ev);
    for (int i = 0; i < kHeads * kDim; ++i)
      if (k[i] != ek[i] || v[i] != ev[i]) return false;
  }
  return true;
}

/// An owner that claims references it does not hold, to prove validate() notices.
struct Liar : PageOwner {
  int page = 0;
  void count_references(std::vector<int>& refs) const override { ++refs[page]; }
  const char* owner_name() const override { return "liar"; }
};

}  // namespace

TEST_CASE("pool: alloc, retain and release move pages on and off the free list") {
  PagePool pool(4, 16);
  CHECK(pool.free_pages() == 4);
  int a = -1, b = -1;
  REQUIRE(pool.alloc(&a) == Status::ok);
  REQUIRE(pool.alloc(&b) == Status::ok);
  CHECK(a != b);
  CHECK(pool.refcount(a) == 1);
  pool.retain(a);
  CHECK(pool.refcount(a) == 2);
  pool.release(a);
  CHECK(pool.free_pages() == 2);
  pool.release(a);
  CHECK(pool.free_pages() == 3);
  CHECK(pool.refcount(a) == 0);
  CHECK_THROWS_AS(pool.release(a), std::logic_error);  // a contract violation, not a status
  CHECK_THROWS_AS(pool.retain(a), std::logic_error);
  CHECK(pool.peak_used_pages() == 2);
}

TEST_CASE("pool: out of pages is a status and changes nothing") {
  PagePool pool(2, 8);
  std::vector<int> got;
  CHECK(pool.alloc_n(3, &got) == Status::out_of_pages);
  CHECK(got.empty());
  CHECK(pool.free_pages() == 2);
  REQUIRE(pool.alloc_n(2, &got) == Status::ok);
  int p = 123;
  CHECK(pool.alloc(&p) == Status::out_of_pages);
  CHECK(p == 123);
}

TEST_CASE("pool: validate() finds lost and double-owned pages") {
  PagePool pool(3, 4);
  PagedKvCache cache(pool);
  const auto s = cache.create();
  REQUIRE(cache.append_tokens(s, 5) == Status::ok);  // two pages
  CHECK(cache.validate().empty());
  int stray = -1;
  REQUIRE(pool.alloc(&stray) == Status::ok);  // in use, referenced by nobody
  CHECK(pool.validate().find("leaked") != std::string::npos);
  pool.release(stray);
  CHECK(pool.validate().empty());
  Liar liar;
  liar.page = cache.block_table(s)[0];
  pool.attach(&liar);
  CHECK(pool.validate().find("double-owned") != std::string::npos);
  pool.detach(&liar);
  CHECK(pool.validate().empty());
}

TEST_CASE("a sequence of len tokens owns ceil(len / P) pages") {
  for (int P : {1, 8, 16, 32, 64}) {
    CAPTURE(P);
    PagePool pool(64, P);
    PagedKvCache cache(pool);
    const auto s = cache.create();
    for (int len = 1; len <= 2 * P + 1; ++len) {
      REQUIRE(cache.append(s) == Status::ok);
      CHECK(int(cache.block_table(s).size()) == (len + P - 1) / P);
    }
    CHECK(cache.validate().empty());
  }
}

TEST_CASE("fork allocates no page, whatever the length") {
  PagePool pool(40, 16);
  PagedKvCache cache(pool);
  const auto a = cache.create();
  REQUIRE(cache.append_tokens(a, 16 * 20 + 3) == Status::ok);  // 21 pages
  const int used = pool.used_pages();
  std::vector<PagedKvCache::SeqId> kids;
  for (int i = 0; i < 10; ++i) {
    PagedKvCache::SeqId c;
    REQUIRE(cache.fork(a, &c) == Status::ok);
    kids.push_back(c);
  }
  CHECK(pool.used_pages() == used);
  CHECK(pool.refcount(cache.block_table(a)[0]) == 11);
  CHECK(cache.block_table(kids[3]) == cache.block_table(a));
  CHECK(cache.validate().empty());
}

TEST_CASE("copy-on-write: the first append after a fork copies the last page only") {
  PagePool pool(16, 4, kHeads, kDim, DType::f32);
  PagedKvCache cache(pool);
  float k[kHeads * kDim], v[kHeads * kDim];
  const auto a = cache.create();
  std::vector<uint32_t> ta;
  for (uint32_t u = 0; u < 10; ++u) {
    token_kv(u, k, v);
    REQUIRE(cache.append(a, k, v) == Status::ok);
    ta.push_back(u);
  }
  PagedKvCache::SeqId b;
  REQUIRE(cache.fork(a, &b) == Status::ok);
  CHECK(cache.pages_for_append(b) == 1);  // the shared, partly filled last page
  const int free_before = pool.free_pages();
  token_kv(100, k, v);
  REQUIRE(cache.append(b, k, v) == Status::ok);
  CHECK(pool.free_pages() == free_before - 1);
  CHECK(cache.cow_copies() == 1);
  const auto& tb = cache.block_table(b);
  CHECK(tb[0] == cache.block_table(a)[0]);  // full pages stay shared
  CHECK(tb[1] == cache.block_table(a)[1]);
  CHECK(tb[2] != cache.block_table(a)[2]);  // the last page is b's own now
  CHECK(pool.refcount(cache.block_table(a)[2]) == 1);
  std::vector<uint32_t> want_b = ta;
  want_b.push_back(100);
  CHECK(contents_match(cache, a, ta));
  CHECK(contents_match(cache, b, want_b));
  CHECK(cache.validate().empty());
}

TEST_CASE("exercise ch07.1: copy-on-write keeps a sequence and its fork apart") {
  for (int P : {4, 16}) {
    CAPTURE(P);
    PagePool pool(32, P, kHeads, kDim, DType::f32);
    PagedKvCache cache(pool);
    float k[kHeads * kDim], v[kHeads * kDim];
    const auto a = cache.create();
    std::vector<uint32_t> ta;
    for (uint32_t u = 0; u < uint32_t(P + 2); ++u) {
      token_kv(u, k, v);
      REQUIRE(cache.append(a, k, v) == Status::ok);
      ta.push_back(u);
    }
    PagedKvCache::SeqId b;
    REQUIRE(cache.fork(a, &b) == Status::ok);
    std::vector<uint32_t> tb = ta;
    // Both append into the slot after the shared prefix: without a copy, one overwrites the other.
    token_kv(500, k, v);
    REQUIRE(cache.append(b, k, v) == Status::ok);
    tb.push_back(500);
    token_kv(600, k, v);
    REQUIRE(cache.append(a, k, v) == Status::ok);
    ta.push_back(600);
    CHECK(contents_match(cache, a, ta));
    CHECK(contents_match(cache, b, tb));
    CHECK(cache.block_table(a).back() != cache.block_table(b).back());
    CHECK(cache.validate().empty());
  }
}

TEST_CASE("write copies a shared page and writes a private one in place") {
  PagePool pool(8, 4, kHeads, kDim, DType::f32);
  PagedKvCache cache(pool);
  float k[kHeads * kDim], v[kHeads * kDim];
  const auto a = cache.create();
  std::vector<uint32_t> ta;
  for (uint32_t u = 0; u < 8; ++u) {
    token_kv(u, k, v);
    REQUIRE(cache.append(a, k, v) == Status::ok);
    ta.push_back(u);
  }
  token_kv(77, k, v);
  const int free0 = pool.free_pages();
  REQUIRE(cache.write(a, 5, k, v) == Status::ok);  // private: in place
  CHECK(pool.free_pages() == free0);
  ta[5] = 77;
  PagedKvCache::SeqId b;
  REQUIRE(cache.fork(a, &b) == Status::ok);
  std::vector<uint32_t> tb = ta;
  token_kv(88, k, v);
  REQUIRE(cache.write(b, 1, k, v) == Status::ok);  // shared: b gets its own copy of page 0
  tb[1] = 88;
  CHECK(pool.free_pages() == free0 - 1);
  CHECK(contents_match(cache, a, ta));
  CHECK(contents_match(cache, b, tb));
  CHECK(cache.write(b, 8, k, v) == Status::bad_position);
  CHECK(cache.write(b, -1, k, v) == Status::bad_position);
  CHECK(cache.validate().empty());
}

TEST_CASE("operations on unknown sequences are statuses") {
  PagePool pool(4, 4);
  PagedKvCache cache(pool);
  PagedKvCache::SeqId c;
  CHECK(cache.append(42) == Status::no_such_sequence);
  CHECK(cache.fork(42, &c) == Status::no_such_sequence);
  CHECK(cache.free(42) == Status::no_such_sequence);
  CHECK(cache.length(42) == -1);
  CHECK(cache.block_table(42).empty());
  const auto s = cache.create();
  REQUIRE(cache.free(s) == Status::ok);
  CHECK(cache.free(s) == Status::no_such_sequence);
}

TEST_CASE("append_tokens is all or nothing, copy-on-write included") {
  PagePool pool(4, 4);
  PagedKvCache cache(pool);
  const auto a = cache.create();
  REQUIRE(cache.append_tokens(a, 6) == Status::ok);  // 2 pages, the second half full
  PagedKvCache::SeqId b;
  REQUIRE(cache.fork(a, &b) == Status::ok);
  // b needs a copy of page 1 (2 free slots) plus ceil((11 - 2) / 4) = 3 new pages: 4 > 2 free.
  CHECK(cache.append_tokens(b, 11) == Status::out_of_pages);
  CHECK(cache.length(b) == 6);
  CHECK(pool.free_pages() == 2);
  CHECK(cache.block_table(b) == cache.block_table(a));
  REQUIRE(cache.append_tokens(b, 6) == Status::ok);  // copy + 1 new page
  CHECK(pool.free_pages() == 0);
  CHECK(cache.validate().empty());
}

namespace {

/// 100,000 random append / fork / write / free operations against a map of token
/// lists. After every operation: validate(), and the contents of what it touched.
void property_test(int P, int ops, uint64_t seed) {
  PagePool pool(std::max(4, 2048 / P), P, kHeads, kDim, DType::f32);
  pool.shuffle_free_list(seed);
  PagedKvCache cache(pool);
  std::map<PagedKvCache::SeqId, std::vector<uint32_t>> model;
  Rng rng(seed);
  uint32_t next_token = 1;
  float k[kHeads * kDim], v[kHeads * kDim];
  long appends = 0, forks = 0, writes = 0, frees = 0, ooms = 0;
  auto random_seq = [&]() {
    auto it = model.begin();
    std::advance(it, long(rng.next_u64() % model.size()));
    return it->first;
  };
  for (int op = 0; op < ops; ++op) {
    const double r = rng.uniform();
    PagedKvCache::SeqId touched = -1, touched2 = -1;
    Status st = Status::ok;
    const int free_before = pool.free_pages();
    std::vector<uint32_t> before;
    if (model.empty() || r < 0.06) {
      touched = cache.create();
      model[touched];
    } else if (r < 0.60) {
      touched = random_seq();
      if (model[touched].size() >= 300) continue;
      before = model[touched];
      token_kv(next_token, k, v);
      st = cache.append(touched, k, v);
      if (st == Status::ok) model[touched].push_back(next_token++), ++appends;
    } else if (r < 0.70) {
      touched = random_seq();
      PagedKvCache::SeqId c;
      st = cache.fork(touched, &c);
      REQUIRE(st == Status::ok);  // a fork never needs a page
      model[c] = model[touched];
      touched2 = c;
      ++forks;
    } else if (r < 0.85) {
      touched = random_seq();
      if (model[touched].empty()) continue;
      before = model[touched];
      const int pos = int(rng.next_u64() % model[touched].size());
      token_kv(next_token, k, v);
      st = cache.write(touched, pos, k, v);
      if (st == Status::ok) model[touched][pos] = next_token++, ++writes;
    } else {
      touched = random_seq();
      REQUIRE(cache.free(touched) == Status::ok);
      model.erase(touched);
      touched = -1;
      ++frees;
    }
    if (st == Status::out_of_pages) {
      // Nothing changed: same free count, same contents. The caller preempts someone.
      ++ooms;
      REQUIRE(pool.free_pages() == free_before);
      REQUIRE(contents_match(cache, touched, before));
      const auto victim = random_seq();
      REQUIRE(cache.free(victim) == Status::ok);
      model.erase(victim);
      if (victim == touched) touched = -1;
    }
    const std::string why = cache.validate();
    if (!why.empty()) FAIL("after operation " << op << ": " << why);
    if (touched >= 0 && !contents_match(cache, touched, model[touched])) FAIL("contents of " << touched << " after op " << op);
    if (touched2 >= 0 && !contents_match(cache, touched2, model[touched2])) FAIL("contents of fork after op " << op);
    if (op % 1000 == 999)
      for (const auto& [id, toks] : model)
        if (!contents_match(cache, id, toks)) FAIL("contents of " << id << " after op " << op);
  }
  MESSAGE("P=" << P << ": " << appends << " appends, " << forks << " forks, " << writes << " writes, " << frees
               << " frees, " << ooms << " out-of-pages, " << cache.cow_copies() << " copies");
  CHECK(appends > ops / 4);
  CHECK(forks > ops / 50);
  CHECK(ooms > 10);  // the pool did run dry, and the statuses were checked
  CHECK(cache.cow_copies() > 100);
}

}  // namespace

TEST_CASE("property: 100000 random operations, page size 1") { property_test(1, 100000, 11); }
TEST_CASE("property: 100000 random operations, page size 8") { property_test(8, 100000, 12); }
TEST_CASE("property: 100000 random operations, page size 16") { property_test(16, 100000, 13); }
TEST_CASE("property: 100000 random operations, page size 32") { property_test(32, 100000, 14); }
TEST_CASE("property: 100000 random operations, page size 64") { property_test(64, 100000, 15); }
