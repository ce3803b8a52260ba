#pragma once
/// \file hash_prefix_cache.hpp
/// \brief A prefix cache in the style of vLLM's automatic prefix caching: every
///        whole block is identified by a hash of its tokens *and of its prefix*.
///
/// Block i of a sequence gets the key
/// \f[ h_i = H(h_{i-1}, \text{tokens}[iP, (i+1)P)),\qquad h_{-1} = \text{seed}, \f]
/// so equal keys mean equal prefixes, and a lookup walks the blocks of a prompt
/// until the first key that is not cached. There is no tree: the chain of hashes
/// is the tree, implicitly. What the hash cannot see is structure: evicting a
/// block in the middle of a cached chain leaves its descendants cached but
/// unreachable (unreachable_pages() counts them). Like vLLM, eviction takes the
/// least recently used block first and, among the blocks of one sequence, the
/// later ones first, which keeps chains intact most of the time.
///
/// The cache holds one reference to each cached page; a running request that hit
/// a block holds another, so a block is evictable exactly when its count is 1.
/// Keys are checked against the stored tokens, so a hash collision is a miss,
/// never a wrong answer.

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "page_pool.hpp"

namespace attn::ch07 {

class HashPrefixCache : public PageOwner {
 public:
  explicit HashPrefixCache(PagePool& pool);
  ~HashPrefixCache() override;
  HashPrefixCache(const HashPrefixCache&) = delete;
  HashPrefixCache& operator=(const HashPrefixCache&) = delete;

  /// The key of a block: its parent's key and its `n` tokens.
  static uint64_t block_hash(uint64_t parent, const int32_t* tokens, int n);
  /// The parent key of the first block of every sequence.
  static constexpr uint64_t kRootHash = 0x243f6a8885a308d3ull;

  /// The pages of the longest run of cached blocks at the start of `tokens`. Each
  /// returned page gains one reference, which the caller releases when done.
  std::vector<int> match(const std::vector<int32_t>& tokens);
  /// Caches the whole blocks of a finished sequence (`pages[i]` holds block i).
  /// A block already cached keeps its page. Returns the blocks newly cached.
  int insert(const std::vector<int32_t>& tokens, const std::vector<int>& pages);
  /// Frees at least `num_pages` pages if that many are evictable. Returns the pages freed.
  int evict(int num_pages);

  int cached_pages() const { return int(blocks_.size()); }
  /// Cached blocks only the cache holds (count 1).
  int evictable_pages() const;
  /// Cached blocks whose parent block is no longer cached: no lookup can reach them.
  int unreachable_pages() const;
  int collisions() const { return collisions_; }

  /// Empty when every invariant holds: each cached block's page is in use and held
  /// by no other block, the page index agrees with the blocks, and the pool's counts
  /// match all owners.
  std::string validate() const;

  void count_references(std::vector<int>& refs) const override;
  const char* owner_name() const override { return "hash prefix cache"; }

 private:
  struct Block {
    uint64_t parent = 0;
    std::vector<int32_t> tokens;
    int page = -1;
    uint64_t last_used = 0;
    int position = 0;  ///< block index in its sequence (later blocks are evicted first)
  };
  PagePool& pool_;
  std::unordered_map<uint64_t, Block> blocks_;
  uint64_t clock_ = 0;
  int collisions_ = 0;
};

}  // namespace attn::ch07
