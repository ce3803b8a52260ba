#pragma once
/// \file paged_kv_cache.hpp
/// \brief Per-sequence block tables over a PagePool: append, fork with shared pages,
///        copy-on-write on the first write to a shared page, and free.
///
/// A sequence of `len` tokens owns `ceil(len / P)` pages, listed in its block table:
/// token t lives in page `table[t / P]`, slot `t % P`. Only the last page can be
/// partly filled, so at most P - 1 slots per sequence are wasted (internal
/// fragmentation), where a contiguous allocator reserves the maximum length.
///
///     block table of A: [ 7 | 2 | 9 ]       logical page 0 -> physical page 7, ...
///     tokens 0..P-1 in page 7, P..2P-1 in page 2, the rest in page 9 (partly filled)
///
/// **Fork** (parallel sampling, beam search) copies the table and adds one reference
/// to each page: no page is allocated, whatever the length. **Copy-on-write**: a
/// write into a page that more than one table references first copies the page to
/// a fresh one that only the writer owns (vLLM, §4.4). Appending to a forked
/// sequence therefore copies at most its last, partly filled page.
///
/// Every operation is all-or-nothing: when the pool cannot supply the pages it
/// needs, it returns Status::out_of_pages and the cache is exactly as before.
///
/// **Swap.** Given a second pool in host memory (pinned on a real server), a sequence
/// can be preempted without losing its KV: swap_out() copies each page that only this
/// sequence holds into a host page and releases the device page; pages it shares (with
/// a fork or a prefix cache) stay on the device with the sequence's reference, since
/// releasing them would free nothing. swap_in() takes device pages for the host ones
/// and copies them back. A swapped-out sequence can only be swapped in or freed; its
/// scales (8-bit pools) travel with its pages.
///
///     swap_out(a):  table [ 7 | 2 | 9 ]  ->  [ 7 | h0 | h1 ]   (7 shared: stays; 2, 9 private: to host)
///     swap_in(a):   table [ 7 | h0 | h1 ] ->  [ 7 | 4 | 11 ]   (fresh device pages, same contents)

#include <map>
#include <string>
#include <vector>

#include "page_pool.hpp"

namespace attn::ch07 {

class PagedKvCache : public PageOwner {
 public:
  using SeqId = int;

  /// Registers itself with `pool` (and `host`) as a page owner (the pools must outlive
  /// the cache). `host` is the pool that swap_out() moves pages to; it must have the
  /// geometry and format of `pool`.
  explicit PagedKvCache(PagePool& pool, PagePool* host = nullptr);
  /// Releases every page the cache still holds.
  ~PagedKvCache() override;
  PagedKvCache(const PagedKvCache&) = delete;
  PagedKvCache& operator=(const PagedKvCache&) = delete;

  /// A new empty sequence (it owns no page until its first append).
  SeqId create();
  /// Appends one token. `k` and `v` are [kv_heads][head_dim]; they may be null when
  /// the pool has no storage. Needs a page when the last one is full, or a copy when
  /// the last one is shared.
  Status append(SeqId s, const float* k = nullptr, const float* v = nullptr);
  /// Appends `n` tokens without values (their slots keep whatever the pages hold):
  /// for pools without storage, whose K/V live elsewhere.
  Status append_tokens(SeqId s, int n);
  /// A new sequence sharing every page of `parent`; allocates nothing.
  Status fork(SeqId parent, SeqId* child);
  /// Overwrites token `pos`, copying its page first when it is shared.
  Status write(SeqId s, int pos, const float* k, const float* v);
  /// Reads token `pos` into [kv_heads][head_dim] buffers.
  Status read(SeqId s, int pos, float* k, float* v) const;
  /// Releases the sequence's pages (a shared page stays with its other owners).
  Status free(SeqId s);
  /// Moves the pages only `s` holds to the host pool (all or nothing: out_of_pages
  /// when the host pool is short), `*moved` of them. Shared pages stay on the device.
  Status swap_out(SeqId s, int* moved = nullptr);
  /// Brings a swapped-out sequence back: fresh device pages for its host pages (all
  /// or nothing: out_of_pages when the device pool is short), `*moved` of them.
  Status swap_in(SeqId s, int* moved = nullptr);
  bool swapped(SeqId s) const;
  /// Pages swap_out(s) would move (those only s holds), or swap_in(s) needs.
  int pages_to_swap_out(SeqId s) const;
  int pages_to_swap_in(SeqId s) const;
  /// Pages moved so far in each direction.
  long swapped_out_pages() const { return swap_outs_; }
  long swapped_in_pages() const { return swap_ins_; }
  PagePool* host_pool() { return host_; }

  bool exists(SeqId s) const { return seqs_.count(s) != 0; }
  /// Tokens in the sequence, or -1 when it does not exist.
  int length(SeqId s) const;
  /// The sequence's block table (empty for an unknown sequence).
  const std::vector<int>& block_table(SeqId s) const;
  std::vector<SeqId> sequences() const;
  int num_sequences() const { return int(seqs_.size()); }
  /// Pages one more append to `s` would take: 1 when the last page is full or shared, else 0.
  int pages_for_append(SeqId s) const;
  /// Pages copied so far by copy-on-write.
  long cow_copies() const { return cow_copies_; }
  PagePool& pool() { return pool_; }
  const PagePool& pool() const { return pool_; }

  /// Empty when every invariant holds, else the first violation:
  ///  - each table has exactly ceil(len / P) entries, each a page in use (on the
  ///    device, or in the host pool for a swapped-out sequence; a running sequence has
  ///    no host page);
  ///  - no page appears twice in one table;
  ///  - the pool's own invariants, with reference counts equal to the references
  ///    of all its owners (this cache and any other registered one).
  std::string validate() const;

  void count_references(std::vector<int>& refs) const override;
  const char* owner_name() const override { return "block tables"; }

 private:
  struct Seq {
    int len = 0;
    std::vector<int> pages;  ///< the block table
    std::vector<char> host;  ///< per entry: 1 when the page is in the host pool (swapped out)
    bool swapped = false;
  };
  /// The cache's references into the host pool, counted by that pool's validate().
  struct HostRefs : PageOwner {
    const PagedKvCache* cache = nullptr;
    void count_references(std::vector<int>& refs) const override;
    const char* owner_name() const override { return "swapped-out block tables"; }
  };
  /// Makes logical page `i` of `s` private (copy-on-write). Out of pages: unchanged.
  Status make_private(Seq& s, int i);
  Seq* find(SeqId id);
  const Seq* find(SeqId id) const;

  PagePool& pool_;
  PagePool* host_ = nullptr;
  HostRefs host_refs_;
  std::map<SeqId, Seq> seqs_;
  SeqId next_id_ = 0;
  long cow_copies_ = 0, swap_outs_ = 0, swap_ins_ = 0;
};

}  // namespace attn::ch07
