#pragma once
/// \file page_pool.hpp
/// \brief The block pool under a paged KV cache: fixed-size pages, a free list and
///        a reference count per page, with the K/V storage laid out for the kernels.
///
/// PagedAttention (Kwon et al., SOSP 2023) stores the KV cache the way an operating
/// system stores a process's memory: in fixed-size *pages* (vLLM calls them blocks)
/// that a per-sequence *block table* maps from logical to physical. This file is the
/// physical side: a pool of `num_pages` pages of `page_size` token slots each.
///
///     page p, KV head hk, slot s, dim c   ->   K[((p * kv_heads + hk) * page_size + s) * d + c]
///
/// so one (page, KV head) is `page_size * d` contiguous elements: the unit the decode
/// kernels read with 16-byte loads. V has the same layout.
///
/// **Ownership.** A page is free (reference count 0, on the free list) or owned by
/// one or more holders: block tables of sequences (PagedKvCache) and prefix caches
/// (RadixCache, HashPrefixCache). Every holder counts as one reference. Holders
/// register themselves as PageOwner so that validate() can check, after any
/// operation, that each page's count equals the references that actually exist:
/// no page is lost (counted but unreferenced), leaked (neither free nor referenced)
/// or double-owned (referenced more often than counted).
///
/// **Errors.** Running out of pages is an expected condition of a serving system,
/// so alloc() reports Status::out_of_pages and changes nothing; the caller evicts,
/// preempts or waits. Breaking the contract (releasing a free page, an index out of
/// range) is a programming error and throws std::logic_error.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.hpp"
#include "kv_quant.hpp"

namespace attn::ch07 {

/// Outcome of an operation on the cache structures.
enum class Status {
  ok,
  out_of_pages,      ///< not enough free pages; nothing was changed
  no_such_sequence,  ///< the sequence id is not (or no longer) in the cache
  bad_position,      ///< a token position outside the sequence
  swapped_out,       ///< the sequence's pages are in host memory: swap it in first
};
const char* status_name(Status s);

/// A holder of page references, counted by PagePool::validate().
class PageOwner {
 public:
  virtual ~PageOwner() = default;
  /// Adds 1 to `refs[page]` for every reference this owner holds.
  virtual void count_references(std::vector<int>& refs) const = 0;
  virtual const char* owner_name() const = 0;
};

class PagePool {
 public:
  /// A pool of `num_pages` pages of `page_size` slots. With `kv_heads * head_dim > 0`
  /// the pool also stores K and V (values rounded to `dtype`); otherwise it only
  /// manages page ids (the simulations and the GPU benchmarks, whose K/V live on the device).
  PagePool(int num_pages, int page_size, int kv_heads = 0, int head_dim = 0, DType dtype = DType::bf16);
  /// A pool that stores K and V as `kv` (kv_quant.hpp): bf16 values, or 8-bit codes
  /// with one scale per (page, KV head) for each of K and V.
  PagePool(int num_pages, int page_size, int kv_heads, int head_dim, KvDtype kv);
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  int num_pages() const { return int(ref_.size()); }
  int page_size() const { return page_size_; }
  int free_pages() const { return int(free_.size()); }
  int used_pages() const { return num_pages() - free_pages(); }
  /// Most pages ever in use at once.
  int peak_used_pages() const { return peak_used_; }
  void reset_peak() { peak_used_ = used_pages(); }

  /// Takes a free page with reference count 1. Out of pages: Status::out_of_pages,
  /// `*page` untouched.
  Status alloc(int* page);
  /// Takes `n` pages, all or nothing.
  Status alloc_n(int n, std::vector<int>* pages);
  /// One more holder of an owned page.
  void retain(int page);
  /// One holder fewer; the page returns to the free list when none is left.
  void release(int page);
  int refcount(int page) const;

  /// Permutes the free list (seeded): pages then come out scattered over the pool,
  /// as they do in a long-running server, so a kernel that ignores the block table fails.
  void shuffle_free_list(uint64_t seed);

  // --- storage (only when constructed with kv_heads and head_dim) -----------------
  bool has_storage() const { return !k_.empty(); }
  int kv_heads() const { return kv_heads_; }
  int head_dim() const { return d_; }
  DType dtype() const { return dtype_; }
  KvDtype kv_dtype() const { return kv_dtype_; }
  bool quantised() const { return kv_quantised(kv_dtype_); }
  /// Element offset of (page, KV head, slot, dim 0) in the K and V tensors.
  std::size_t offset(int page, int hk, int slot) const {
    return ((std::size_t(page) * kv_heads_ + hk) * page_size_ + slot) * std::size_t(d_);
  }
  /// Writes one token: `k` and `v` are [kv_heads][head_dim], rounded to the dtype.
  /// A quantised pool quantises them with the page's scale, first growing the scale
  /// (and quantising the page's other slots again) when a value does not fit under it.
  void write_slot(int page, int slot, const float* k, const float* v);
  /// Reads one token into [kv_heads][head_dim] buffers (dequantised: code * scale).
  void read_slot(int page, int slot, float* k, float* v) const;
  /// Copies every slot of page `src` into page `dst`, with its scales (copy-on-write).
  void copy_page(int dst, int src);
  /// Copies page `src` of this pool into page `dst` of `to`, with its scales: the
  /// swap between device and host pools. The pools must have the same geometry.
  void copy_page_to(PagePool& to, int dst, int src) const;
  /// The whole K and V tensors, [num_pages][kv_heads][page_size][head_dim]: values
  /// (bf16 pool) or codes held as floats (quantised pool).
  const std::vector<float>& k_data() const { return k_; }
  const std::vector<float>& v_data() const { return v_; }
  /// Scales of a quantised pool, [num_pages][kv_heads] (empty for bf16).
  const std::vector<float>& k_scales() const { return k_scale_; }
  const std::vector<float>& v_scales() const { return v_scale_; }

  // --- validation --------------------------------------------------------------------
  void attach(const PageOwner* owner);
  void detach(const PageOwner* owner);
  /// Empty when every invariant holds, else the first violation found:
  ///  - a page is on the free list exactly when its count is 0, and at most once;
  ///  - free + used = total;
  ///  - each page's count equals the references its registered owners hold;
  ///  - quantised storage: every page in use has finite scales >= 0, codes within the
  ///    format's range (valid E4M3 values, or integers in [-127, 127]), and only zero
  ///    codes under a zero scale.
  std::string validate() const;

 private:
  void check_page(int page, const char* what) const;
  /// Quantises one head's row `x` into (page, hk, slot) of `codes`, growing `scale`.
  void quantise_row(std::vector<float>& codes, float& scale, int page, int hk, int slot, const float* x);
  std::string validate_scales(int page) const;
  int page_size_;
  int kv_heads_, d_;
  DType dtype_;
  KvDtype kv_dtype_ = KvDtype::bf16;
  std::vector<float> k_scale_, v_scale_;  ///< [page][kv_head], quantised pools only
  std::vector<int> ref_;   ///< reference count per page
  std::vector<int> free_;  ///< free list, used as a stack (alloc pops the back)
  int peak_used_ = 0;
  std::vector<float> k_, v_;
  std::vector<const PageOwner*> owners_;
};

}  // namespace attn::ch07
