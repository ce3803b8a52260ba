// The hash-of-block prefix cache (see hash_prefix_cache.hpp).
#include "hash_prefix_cache.hpp"

#include <algorithm>
#include <set>
#include <stdexcept>
#include <tuple>

namespace attn::ch07 {

namespace {
/// SplitMix64's finaliser: a good 64-bit mix of one word.
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

HashPrefixCache::HashPrefixCache(PagePool& pool) : pool_(pool) { pool_.attach(this); }

HashPrefixCache::~HashPrefixCache() {
  for (const auto& [h, b] : blocks_) pool_.release(b.page);
  pool_.detach(this);
}

uint64_t HashPrefixCache::block_hash(uint64_t parent, const int32_t* tokens, int n) {
  // EXERCISE ch07.4: the key of a block must depend on its whole prefix: chain the parent's key in
  //| uint64_t h = kRootHash;  // TODO: your code here (equal keys must mean equal prefixes)
  //| (void)parent;
  uint64_t h = mix(parent + 0x9e3779b97f4a7c15ull);
  // END EXERCISE
  for (int i = 0; i < n; ++i) h = mix(h ^ (uint64_t(uint32_t(tokens[i])) + 0x9e3779b97f4a7c15ull * (i + 1)));
  return h;
}

std::vector<int> HashPrefixCache::match(const std::vector<int32_t>& tokens) {
  ++clock_;
  const int P = pool_.page_size();
  std::vector<int> pages;
  uint64_t parent = kRootHash;
  for (std::size_t pos = 0; pos + P <= tokens.size(); pos += P) {
    const uint64_t h = block_hash(parent, tokens.data() + pos, P);
    const auto it = blocks_.find(h);
    if (it == blocks_.end()) break;
    Block& b = it->second;
    if (b.parent != parent || !std::equal(b.tokens.begin(), b.tokens.end(), tokens.begin() + pos)) {
      ++collisions_;  // same key, different prefix: a miss
      break;
    }
    b.last_used = clock_;
    pool_.retain(b.page);
    pages.push_back(b.page);
    parent = h;
  }
  return pages;
}

int HashPrefixCache::insert(const std::vector<int32_t>& tokens, const std::vector<int>& pages) {
  ++clock_;
  const int P = pool_.page_size();
  const std::size_t full = tokens.size() / P;
  if (pages.size() < full) throw std::logic_error("HashPrefixCache::insert: fewer pages than whole blocks");
  int added = 0;
  uint64_t parent = kRootHash;
  for (std::size_t i = 0; i < full; ++i) {
    const int32_t* t = tokens.data() + i * P;
    const uint64_t h = block_hash(parent, t, P);
    auto it = blocks_.find(h);
    if (it != blocks_.end()) {
      Block& b = it->second;
      if (b.parent != parent || !std::equal(b.tokens.begin(), b.tokens.end(), t)) {
        ++collisions_;
        break;  // cannot cache this block or anything after it under these keys
      }
      b.last_used = clock_;
      b.position = int(i);
    } else {
      Block b;
      b.parent = parent;
      b.tokens.assign(t, t + P);
      b.page = pages[i];
      b.last_used = clock_;
      b.position = int(i);
      pool_.retain(b.page);
      blocks_.emplace(h, std::move(b));
      ++added;
    }
    parent = h;
  }
  return added;
}

int HashPrefixCache::evictable_pages() const {
  int n = 0;
  for (const auto& [h, b] : blocks_) n += pool_.refcount(b.page) == 1;
  return n;
}

int HashPrefixCache::unreachable_pages() const {
  // A block is reachable when every block up its chain is cached; memoised walk up.
  std::unordered_map<uint64_t, bool> reachable;
  std::vector<uint64_t> path;
  int n = 0;
  for (const auto& [h0, b0] : blocks_) {
    uint64_t h = h0;
    bool ok = true;
    path.clear();
    for (;;) {
      if (h == kRootHash) break;
      if (auto r = reachable.find(h); r != reachable.end()) {
        ok = r->second;
        break;
      }
      const auto it = blocks_.find(h);
      if (it == blocks_.end()) {
        ok = false;
        break;
      }
      path.push_back(h);
      h = it->second.parent;
    }
    for (uint64_t x : path) reachable[x] = ok;
    n += !ok;
  }
  return n;
}

int HashPrefixCache::evict(int num_pages) {
  if (num_pages <= 0) return 0;
  // Candidates: blocks only the cache holds, least recently used first, later blocks
  // of a sequence before earlier ones (vLLM frees a sequence's blocks tail first).
  std::vector<std::tuple<uint64_t, int, uint64_t>> order;
  for (const auto& [h, b] : blocks_)
    if (pool_.refcount(b.page) == 1) order.emplace_back(b.last_used, -b.position, h);
  std::sort(order.begin(), order.end());
  int freed = 0;
  for (const auto& [used, neg_pos, h] : order) {
    if (freed >= num_pages) break;
    const auto it = blocks_.find(h);
    pool_.release(it->second.page);
    blocks_.erase(it);
    ++freed;
  }
  return freed;
}

void HashPrefixCache::count_references(std::vector<int>& refs) const {
  for (const auto& [h, b] : blocks_)
    if (b.page >= 0 && b.page < int(refs.size())) ++refs[b.page];
}

std::string HashPrefixCache::validate() const {
  std::set<int> pages;
  for (const auto& [h, b] : blocks_) {
    if (b.page < 0 || b.page >= pool_.num_pages()) return "a cached block maps to page " + std::to_string(b.page);
    if (!pages.insert(b.page).second) return "page " + std::to_string(b.page) + " is cached as two blocks";
    if (pool_.refcount(b.page) < 1) return "cached page " + std::to_string(b.page) + " is free";
    if (int(b.tokens.size()) != pool_.page_size()) return "a cached block does not hold one page of tokens";
    if (block_hash(b.parent, b.tokens.data(), int(b.tokens.size())) != h) return "a cached block is filed under the wrong key";
  }
  return pool_.validate();
}

}  // namespace attn::ch07
