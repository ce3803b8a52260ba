#pragma once
/// \file radix_cache.hpp
/// \brief RadixAttention's prefix cache (SGLang, Zheng et al. 2024): a radix tree
///        over token ids whose nodes own pages of the block pool.
///
/// Every finished request leaves its KV cache behind, indexed by its tokens. A new
/// request walks the tree with its prompt; the longest cached prefix is served from
/// the cache and only the rest is computed (prefill saved). Edges are cut at page
/// boundaries: a node's key is a whole number of pages, so a node owns whole pages
/// and a prefix is shared in units of pages. A partial page at the end of a
/// sequence is not cached.
///
///     root
///     ├─ [sys prompt | ... ] pages 0 1 2        lock 2   (two running requests below)
///     │  ├─ [question A ...] pages 3 4          lock 1
///     │  └─ [question B ...] pages 5            lock 0   evictable
///     └─ [other prompt ...]  pages 6 7          lock 0   evictable
///
/// **Locks.** A running request locks the node its match ended at; the lock counts
/// on every node up to the root, and a node with a lock is *protected*: never
/// evicted. `evictable + protected = total` pages at all times.
///
/// **Eviction** frees whole leaves, least recently used first (or least frequently
/// used, see Eviction). When a leaf goes, its parent may become a leaf; it then
/// joins the candidates. Because every access touches the whole path from the root,
/// a parent is never older than its children, so the order of eviction is the
/// order of last use.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "page_pool.hpp"

namespace attn::ch07 {

/// Which unlocked leaf goes first.
enum class Eviction {
  lru,  ///< least recently used (SGLang's default)
  lfu,  ///< least frequently used, ties by least recently used
};

/// The result of a prefix match: the cached pages of the longest page-aligned
/// prefix, and the node it ended at (lock it to keep the pages).
struct PrefixMatch {
  std::vector<int> pages;
  int tokens = 0;  ///< pages.size() * page_size
  int node = 0;    ///< 0 (the root) when nothing matched
};

class RadixCache : public PageOwner {
 public:
  /// Registers itself with `pool` (which must outlive it).
  explicit RadixCache(PagePool& pool, Eviction policy = Eviction::lru);
  /// Releases every cached page.
  ~RadixCache() override;
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  /// The longest cached prefix of `tokens` in whole pages. A match that ends inside
  /// a node splits it at the page boundary, so the returned node covers exactly the
  /// match. Touches every node on the path (recency and frequency).
  PrefixMatch match_prefix(const std::vector<int32_t>& tokens);

  /// Caches the whole pages of a sequence: `pages[i]` holds tokens [i P, (i+1) P).
  /// Pages of the part already cached are left to the caller (who releases them);
  /// pages of the new part gain the tree as an owner. Returns the number of tokens
  /// that were already cached.
  int insert(const std::vector<int32_t>& tokens, const std::vector<int>& pages);

  /// Protects `node` and its ancestors from eviction (one lock per call).
  void lock(int node);
  void unlock(int node);

  /// Frees at least `num_pages` pages if that many are evictable, taking whole
  /// unlocked leaves in eviction order. Returns the pages freed. `evicted`, when
  /// given, receives the page lists of the evicted nodes in order.
  int evict(int num_pages, std::vector<std::vector<int>>* evicted = nullptr);

  int evictable_pages() const { return evictable_; }
  int protected_pages() const { return protected_; }
  int total_pages() const { return evictable_ + protected_; }
  int num_nodes() const;  ///< without the root
  int page_size() const { return pool_.page_size(); }
  Eviction policy() const { return policy_; }

  /// Empty when every invariant holds, else the first violation:
  ///  - the tree is a tree (each node reached once, parent links agree), each key a
  ///    positive whole number of pages, each child filed under its first page;
  ///  - lock counts: a node's count is its own locks plus its children's counts;
  ///  - evictable + protected = total, each recomputed from the nodes;
  ///  - a parent is never less recently (or less often) used than its children;
  ///  - no page is held twice, and the pool's counts match all owners.
  std::string validate() const;

  /// An ASCII drawing of the tree; `name` turns a token id into text (numbers when null).
  std::string draw(const std::function<std::string(int32_t)>& name = nullptr) const;

  void count_references(std::vector<int>& refs) const override;
  const char* owner_name() const override { return "radix tree"; }

 private:
  struct Node {
    bool live = false;
    int parent = -1;
    std::vector<int32_t> key;    ///< this edge's tokens, a whole number of pages
    std::vector<int> pages;      ///< key.size() / P pages
    std::map<std::vector<int32_t>, int> children;  ///< by the first page of the child's key
    int lock_ref = 0;            ///< locks on this node or below it
    int own_locks = 0;           ///< locks on this node itself
    uint64_t last_access = 0;    ///< the operation that last touched it
    uint64_t hits = 0;           ///< how many operations touched it
  };
  /// Eviction order: the smaller key goes first.
  std::pair<uint64_t, uint64_t> eviction_key(const Node& n) const;
  int new_node();
  void free_node(int id);
  /// Splits node `id` after its first `k` pages; returns the new upper node.
  int split(int id, int k);
  void touch(int id);
  /// Pages of `node`'s key that match `tokens` from token `pos` on.
  int common_pages(const Node& node, const std::vector<int32_t>& tokens, std::size_t pos) const;
  std::vector<int32_t> first_page(const std::vector<int32_t>& tokens, std::size_t pos) const;
  void check_node(int id, const char* what) const;

  PagePool& pool_;
  Eviction policy_;
  std::vector<Node> nodes_;   ///< nodes_[0] is the root
  std::vector<int> free_ids_;
  uint64_t clock_ = 0;
  int evictable_ = 0, protected_ = 0;
};

}  // namespace attn::ch07
