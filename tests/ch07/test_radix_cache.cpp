// RadixAttention's prefix tree: splits at page boundaries, locks, LRU / LFU eviction,
// and a property test of 100,000 random insert / match / lock / evict operations
// against a map of cached page-aligned prefixes.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

#include "chapters/07_paged_radix/radix_cache.hpp"
#include "common/inputs.hpp"

using namespace attn;
using namespace attn::ch07;

namespace {

using Tokens = std::vector<int32_t>;

/// What a finished request does: match, take pages for the rest, insert, let go.
/// Returns the tokens that were already cached.
int cache_sequence(PagePool& pool, RadixCache& tree, const Tokens& t) {
  const PrefixMatch m = tree.match_prefix(t);
  tree.lock(m.node);
  const int P = pool.page_size();
  std::vector<int> pages = m.pages, fresh;
  const int need = int(t.size()) / P - int(pages.size());
  if (pool.free_pages() < need) tree.evict(need - pool.free_pages());
  REQUIRE(pool.alloc_n(need, &fresh) == Status::ok);
  pages.insert(pages.end(), fresh.begin(), fresh.end());
  const int cached = tree.insert(t, pages);
  tree.unlock(m.node);
  for (int p : fresh) pool.release(p);  // the tree holds them now
  return cached;
}

}  // namespace

TEST_CASE("match, insert, match again: the second request finds the first one's pages") {
  PagePool pool(32, 4);
  RadixCache tree(pool);
  const Tokens a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // 2 whole pages and 2 tokens
  CHECK(tree.match_prefix(a).tokens == 0);
  CHECK(cache_sequence(pool, tree, a) == 0);
  CHECK(tree.total_pages() == 2);  // the partial page is not cached
  const PrefixMatch m = tree.match_prefix(a);
  CHECK(m.tokens == 8);
  CHECK(m.pages.size() == 2);
  CHECK(tree.validate().empty());
}

TEST_CASE("a match that ends inside a node splits it at a page boundary") {
  PagePool pool(32, 2);
  RadixCache tree(pool);
  cache_sequence(pool, tree, {1, 1, 2, 2, 3, 3, 4, 4});  // one node of 4 pages
  CHECK(tree.num_nodes() == 1);
  const PrefixMatch m = tree.match_prefix({1, 1, 2, 2, 9, 9});
  CHECK(m.tokens == 4);
  CHECK(tree.num_nodes() == 2);  // [1 1 | 2 2] -> [3 3 | 4 4]
  // A match that differs inside a page does not split inside the page.
  const PrefixMatch m2 = tree.match_prefix({1, 1, 2, 9});
  CHECK(m2.tokens == 2);
  CHECK(tree.num_nodes() == 3);
  CHECK(tree.validate().empty());
  // Both branches coexist after a second insert.
  CHECK(cache_sequence(pool, tree, {1, 1, 2, 2, 5, 5}) == 4);
  CHECK(tree.match_prefix({1, 1, 2, 2, 5, 5, 7}).tokens == 6);
  CHECK(tree.match_prefix({1, 1, 2, 2, 3, 3, 4, 4}).tokens == 8);
  CHECK(tree.validate().empty());
}

TEST_CASE("locks protect the path to the root: evictable + protected = total") {
  PagePool pool(32, 1);
  RadixCache tree(pool);
  cache_sequence(pool, tree, {1, 2, 3});
  cache_sequence(pool, tree, {1, 2, 4, 5});
  CHECK(tree.total_pages() == 5);
  const PrefixMatch m = tree.match_prefix({1, 2, 4, 5});
  tree.lock(m.node);
  CHECK(tree.protected_pages() == 4);  // [1 2] and [4 5]
  CHECK(tree.evictable_pages() == 1);  // [3]
  CHECK(tree.evictable_pages() + tree.protected_pages() == tree.total_pages());
  CHECK(tree.evict(100) == 1);         // only the unlocked leaf can go
  CHECK(tree.match_prefix({1, 2, 4, 5}).tokens == 4);
  tree.unlock(m.node);
  CHECK(tree.protected_pages() == 0);
  CHECK_THROWS_AS(tree.unlock(m.node), std::logic_error);
  CHECK(tree.evict(100) == 4);
  CHECK(tree.total_pages() == 0);
  CHECK(pool.free_pages() == 32);
  CHECK(tree.validate().empty());
}

TEST_CASE("evict takes least recently used leaves first, and parents once they are leaves") {
  PagePool pool(64, 1);
  RadixCache tree(pool);
  cache_sequence(pool, tree, {1, 2, 3});      // shared prefix [1 2], leaf [3]
  cache_sequence(pool, tree, {1, 2, 4});      // leaf [4]
  cache_sequence(pool, tree, {9, 9});         // its own branch
  tree.match_prefix({1, 2, 3});               // [1 2] and [3] are now the most recent
  std::vector<std::vector<int>> gone;
  CHECK(tree.evict(1, &gone) == 1);
  REQUIRE(gone.size() == 1);
  CHECK(tree.match_prefix({1, 2, 4}).tokens == 2);  // [4] went first
  gone.clear();
  CHECK(tree.evict(2, &gone) == 2);                 // then [9 9] (older than [1 2 3] and [1 2])
  CHECK(tree.match_prefix({9, 9}).tokens == 0);
  gone.clear();
  // [3] goes, then [1 2] has become a leaf and goes too.
  CHECK(tree.evict(3, &gone) == 3);
  CHECK(gone.size() == 2);
  CHECK(tree.total_pages() == 0);
  CHECK(tree.validate().empty());
}

TEST_CASE("exercise ch07.2: LFU evicts the least frequently used leaf") {
  PagePool pool(64, 1);
  RadixCache tree(pool, Eviction::lfu);
  cache_sequence(pool, tree, {1, 1});
  cache_sequence(pool, tree, {2, 2});
  for (int i = 0; i < 5; ++i) tree.match_prefix({1, 1});  // popular, but long ago
  cache_sequence(pool, tree, {3, 3});                      // recent, used once
  tree.match_prefix({2, 2});                               // used twice, most recently
  CHECK(tree.evict(1) == 2);
  CHECK(tree.match_prefix({1, 1}).tokens == 2);  // LRU would have evicted this one
  CHECK(tree.match_prefix({3, 3}).tokens == 0);  // the least frequently used went first
  CHECK(tree.match_prefix({2, 2}).tokens == 2);
  CHECK(tree.validate().empty());
}

TEST_CASE("tokens that do not fill a page are never cached") {
  PagePool pool(8, 16);
  RadixCache tree(pool);
  CHECK(cache_sequence(pool, tree, Tokens(15, 7)) == 0);
  CHECK(tree.total_pages() == 0);
  CHECK(tree.num_nodes() == 0);
  CHECK(tree.match_prefix(Tokens(40, 7)).tokens == 0);
  CHECK(tree.validate().empty());
}

TEST_CASE("draw() shows the tree with locks") {
  PagePool pool(8, 2);
  RadixCache tree(pool);
  cache_sequence(pool, tree, {1, 2, 3, 4});
  cache_sequence(pool, tree, {1, 2, 5, 6});
  const std::string d = tree.draw();
  CHECK(d.find("root") == 0);
  CHECK(d.find("[1 2]") != std::string::npos);
  CHECK(d.find("[3 4]") != std::string::npos);
  CHECK(d.find("(evictable)") != std::string::npos);
}

namespace {

/// The model: every cached page-aligned prefix, with its page, last use and locks.
struct Entry {
  int page;
  uint64_t used;
  int locks;
};
using Model = std::map<Tokens, Entry>;

Tokens prefix(const Tokens& t, std::size_t n) { return Tokens(t.begin(), t.begin() + n); }

/// Longest cached prefix in the model, in pages; checks the tree's pages against it.
void check_match(const Model& model, const Tokens& t, const PrefixMatch& m, int P) {
  std::size_t k = 0;
  while ((k + 1) * P <= t.size() && model.count(prefix(t, (k + 1) * P))) ++k;
  REQUIRE(m.tokens == int(k) * P);
  REQUIRE(m.pages.size() == k);
  for (std::size_t i = 0; i < k; ++i) REQUIRE(m.pages[i] == model.at(prefix(t, (i + 1) * P)).page);
}

void touch(Model& model, const Tokens& t, std::size_t pages, uint64_t now, int P) {
  for (std::size_t i = 1; i <= pages; ++i) model.at(prefix(t, i * P)).used = now;
}

void radix_property_test(int P, int ops, uint64_t seed) {
  PagePool pool(96, P);
  pool.shuffle_free_list(seed);
  RadixCache tree(pool);
  Model model;
  Rng rng(seed);
  uint64_t now = 0;  // mirrors the tree's clock: one tick per match_prefix and insert
  std::vector<Tokens> recent;
  struct Held {
    int node;
    Tokens t;
    std::size_t pages;
  };
  std::vector<Held> held;
  long inserts = 0, matches = 0, evictions = 0, evicted_pages = 0, splits_seen = 0;
  auto random_tokens = [&]() {
    Tokens t;
    if (!recent.empty() && rng.uniform() < 0.7) {  // share a prefix with a recent sequence
      const Tokens& base = recent[rng.next_u64() % recent.size()];
      t = prefix(base, std::size_t(rng.next_u64() % (base.size() + 1)));
    }
    const int extra = rng.range(0, 4 * P);
    for (int i = 0; i < extra; ++i) t.push_back(int32_t(rng.next_u64() % 3));
    if (t.size() > std::size_t(10 * P)) t.resize(10 * P);
    recent.push_back(t);
    if (recent.size() > 40) recent.erase(recent.begin());
    return t;
  };
  for (int op = 0; op < ops; ++op) {
    const double r = rng.uniform();
    if (r < 0.40) {
      // A request finishes: match (locked), pages for the rest, insert, unlock.
      const Tokens t = random_tokens();
      const int nodes_before = tree.num_nodes();
      const PrefixMatch m = tree.match_prefix(t);
      ++now;
      check_match(model, t, m, P);
      touch(model, t, m.pages.size(), now, P);
      splits_seen += tree.num_nodes() > nodes_before;
      tree.lock(m.node);
      for (std::size_t i = 1; i <= m.pages.size(); ++i) ++model.at(prefix(t, i * P)).locks;
      const int need = int(t.size()) / P - int(m.pages.size());
      std::vector<int> fresh;
      if (pool.free_pages() < need) {
        const int evictable = tree.evictable_pages();
        const int want = need - pool.free_pages();
        const int got = tree.evict(want);
        REQUIRE(got >= std::min(want, evictable));
        // The model forgets every entry whose page the tree gave back.
        for (auto it = model.begin(); it != model.end();)
          it = pool.refcount(it->second.page) == 0 ? model.erase(it) : std::next(it);
      }
      if (pool.alloc_n(need, &fresh) == Status::ok) {
        std::vector<int> pages = m.pages;
        pages.insert(pages.end(), fresh.begin(), fresh.end());
        const int cached = tree.insert(t, pages);
        ++now;
        REQUIRE(cached == m.tokens);  // the locked prefix survived the eviction
        touch(model, t, m.pages.size(), now, P);
        for (std::size_t i = m.pages.size(); i < fresh.size() + m.pages.size(); ++i)
          model[prefix(t, (i + 1) * P)] = Entry{pages[i], now, 0};
        for (int p : fresh) pool.release(p);
        ++inserts;
      }
      tree.unlock(m.node);
      for (std::size_t i = 1; i <= m.pages.size(); ++i) --model.at(prefix(t, i * P)).locks;
    } else if (r < 0.60) {
      // A request starts running: its matched path stays locked.
      const Tokens t = random_tokens();
      const PrefixMatch m = tree.match_prefix(t);
      ++now;
      check_match(model, t, m, P);
      touch(model, t, m.pages.size(), now, P);
      ++matches;
      if (held.size() < 6) {
        tree.lock(m.node);
        for (std::size_t i = 1; i <= m.pages.size(); ++i) ++model.at(prefix(t, i * P)).locks;
        held.push_back({m.node, t, m.pages.size()});
      }
    } else if (r < 0.75) {
      if (held.empty()) continue;
      const std::size_t i = rng.next_u64() % held.size();
      tree.unlock(held[i].node);
      for (std::size_t k = 1; k <= held[i].pages; ++k) --model.at(prefix(held[i].t, k * P)).locks;
      held.erase(held.begin() + long(i));
    } else {
      // Evict: whole unlocked leaves in LRU order, no more than needed.
      int evictable = 0, locked = 0;
      for (const auto& [t, e] : model) (e.locks ? locked : evictable)++;
      REQUIRE(tree.evictable_pages() == evictable);
      REQUIRE(tree.protected_pages() == locked);
      const int n = rng.range(1, 12);
      std::vector<std::vector<int>> gone;
      const int freed = tree.evict(n, &gone);
      ++evictions;
      evicted_pages += freed;
      REQUIRE(freed >= std::min(n, evictable));
      REQUIRE(freed <= evictable);
      int before_last = 0;
      for (std::size_t g = 0; g + 1 < gone.size(); ++g) before_last += int(gone[g].size());
      REQUIRE(before_last < n);  // it stopped as soon as it had enough
      std::set<int> freed_pages;
      for (const auto& g : gone) freed_pages.insert(g.begin(), g.end());
      uint64_t newest_evicted = 0;
      for (auto it = model.begin(); it != model.end();) {
        if (freed_pages.count(it->second.page)) {
          REQUIRE(it->second.locks == 0);
          newest_evicted = std::max(newest_evicted, it->second.used);
          it = model.erase(it);
        } else {
          ++it;
        }
      }
      // LRU: nothing evicted was used more recently than a surviving unlocked leaf.
      for (const auto& [t, e] : model) {
        REQUIRE(t.size() % P == 0);
        if (t.size() > std::size_t(P)) REQUIRE(model.count(prefix(t, t.size() - P)));  // still prefix-closed
        bool leaf = true;
        auto next = model.upper_bound(t);
        if (next != model.end() && next->first.size() > t.size() && prefix(next->first, t.size()) == t) leaf = false;
        if (leaf && e.locks == 0) REQUIRE(e.used >= newest_evicted);
      }
    }
    REQUIRE(tree.total_pages() == int(model.size()));
    const std::string why = tree.validate();
    if (!why.empty()) FAIL("after operation " << op << ": " << why);
  }
  MESSAGE("P=" << P << ": " << inserts << " inserts, " << matches << " held matches, " << evictions << " evictions ("
               << evicted_pages << " pages), " << splits_seen << " splits by match");
  CHECK(inserts > ops / 5);
  CHECK(evicted_pages > 1000);
  CHECK(splits_seen > 100);
}

}  // namespace

TEST_CASE("property: 100000 random radix operations, page size 1") { radix_property_test(1, 100000, 21); }
TEST_CASE("property: 100000 random radix operations, page size 4") { radix_property_test(4, 100000, 22); }
