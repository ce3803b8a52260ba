// The vLLM-style hash-of-block prefix cache, and its agreement with the radix tree.
#include <doctest/doctest.h>

#include "chapters/07_paged_radix/hash_prefix_cache.hpp"
#include "chapters/07_paged_radix/radix_cache.hpp"
#include "common/inputs.hpp"

using namespace attn;
using namespace attn::ch07;

namespace {

using Tokens = std::vector<int32_t>;

/// A finished request: hit what is cached, take pages for the rest, register, let go.
int finish(PagePool& pool, HashPrefixCache& cache, const Tokens& t) {
  std::vector<int> pages = cache.match(t);  // retained for us
  const int hit = int(pages.size());
  std::vector<int> fresh;
  const int need = int(t.size()) / pool.page_size() - hit;
  if (pool.free_pages() < need) cache.evict(need - pool.free_pages());
  REQUIRE(pool.alloc_n(need, &fresh) == Status::ok);
  pages.insert(pages.end(), fresh.begin(), fresh.end());
  cache.insert(t, pages);
  for (int p : pages) pool.release(p);
  return hit;
}

}  // namespace

TEST_CASE("hash cache: a lookup walks the block chain until the first miss") {
  PagePool pool(16, 2);
  HashPrefixCache cache(pool);
  CHECK(finish(pool, cache, {1, 2, 3, 4, 5, 6, 7}) == 0);
  CHECK(cache.cached_pages() == 3);
  std::vector<int> hit = cache.match({1, 2, 3, 4, 9, 9});
  CHECK(hit.size() == 2);
  for (int p : hit) pool.release(p);
  hit = cache.match({1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(hit.size() == 3);
  CHECK(cache.evictable_pages() == 0);  // we hold them: not evictable
  for (int p : hit) pool.release(p);
  CHECK(cache.evictable_pages() == 3);
  CHECK(cache.validate().empty());
}

TEST_CASE("exercise ch07.4: a block's key includes its whole prefix") {
  PagePool pool(16, 2);
  HashPrefixCache cache(pool);
  // Same second block, different first block: two different prefixes.
  finish(pool, cache, {1, 1, 5, 5});
  finish(pool, cache, {2, 2, 5, 5});
  CHECK(cache.cached_pages() == 4);
  CHECK(cache.collisions() == 0);
  std::vector<int> hit = cache.match({2, 2, 5, 5});
  CHECK(hit.size() == 2);
  for (int p : hit) pool.release(p);
  CHECK(HashPrefixCache::block_hash(1, Tokens{5, 5}.data(), 2) != HashPrefixCache::block_hash(2, Tokens{5, 5}.data(), 2));
  CHECK(cache.validate().empty());
}

TEST_CASE("hash cache: eviction takes the least recently used block, tail blocks first") {
  PagePool pool(6, 1);
  HashPrefixCache cache(pool);
  finish(pool, cache, {1, 2, 3});  // used at time 2 (match at 1, insert at 2)
  finish(pool, cache, {7, 8, 9});  // newer
  CHECK(cache.cached_pages() == 6);
  CHECK(cache.evict(1) == 1);
  // The oldest sequence loses its last block first: its prefix is still reachable.
  std::vector<int> hit = cache.match({1, 2, 3});
  CHECK(hit.size() == 2);
  for (int p : hit) pool.release(p);
  CHECK(cache.unreachable_pages() == 0);
  CHECK(cache.validate().empty());
}

TEST_CASE("hash cache: evicting a block in the middle of a chain strands the blocks after it") {
  PagePool pool(8, 1);
  HashPrefixCache cache(pool);
  finish(pool, cache, {1, 2, 3, 4});
  // Keep the first and the tail blocks busy so that only block 1 is evictable.
  std::vector<int> held = cache.match({1, 2, 3, 4});
  pool.release(held[1]);
  CHECK(cache.evictable_pages() == 1);
  CHECK(cache.evict(1) == 1);
  CHECK(cache.unreachable_pages() == 2);  // blocks [3] and [4] hang off a missing parent
  for (int i : {0, 2, 3}) pool.release(held[i]);
  std::vector<int> hit = cache.match({1, 2, 3, 4});
  CHECK(hit.size() == 1);  // the chain breaks at the missing block
  for (int p : hit) pool.release(p);
  CHECK(cache.validate().empty());
}

TEST_CASE("radix tree and hash cache serve the same prefixes when nothing is evicted") {
  for (int P : {1, 4}) {
    CAPTURE(P);
    PagePool rpool(20000, P), hpool(20000, P);
    RadixCache tree(rpool);
    HashPrefixCache hash(hpool);
    Rng rng(5 + P);
    std::vector<Tokens> seen;
    for (int op = 0; op < 3000; ++op) {
      Tokens t;
      if (!seen.empty() && rng.uniform() < 0.7) {
        const Tokens& b = seen[rng.next_u64() % seen.size()];
        t.assign(b.begin(), b.begin() + long(rng.next_u64() % (b.size() + 1)));
      }
      for (int i = rng.range(0, 3 * P); i > 0; --i) t.push_back(int32_t(rng.next_u64() % 4));
      seen.push_back(t);
      // Radix: match, pages for the rest, insert.
      const PrefixMatch m = tree.match_prefix(t);
      std::vector<int> rp = m.pages, fresh;
      REQUIRE(rpool.alloc_n(int(t.size()) / P - int(rp.size()), &fresh) == Status::ok);
      rp.insert(rp.end(), fresh.begin(), fresh.end());
      tree.insert(t, rp);
      for (int p : fresh) rpool.release(p);
      // Hash: the same request.
      const int hit = finish(hpool, hash, t);
      REQUIRE(hit * P == m.tokens);
    }
    CHECK(tree.total_pages() == hash.cached_pages());
    CHECK(tree.validate().empty());
    CHECK(hash.validate().empty());
  }
}
