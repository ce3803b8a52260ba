// The block pool: free list, reference counts and K/V storage (see page_pool.hpp).
#include "page_pool.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "common/inputs.hpp"

namespace attn::ch07 {

const char* status_name(Status s) {
  switch (s) {
    case Status::ok: return "ok";
    case Status::out_of_pages: return "out of pages";
    case Status::no_such_sequence: return "no such sequence";
    case Status::bad_position: return "bad position";
    case Status::swapped_out: return "swapped out";
  }
  return "?";
}

PagePool::PagePool(int num_pages, int page_size, int kv_heads, int head_dim, DType dtype)
    : page_size_(page_size), kv_heads_(kv_heads), d_(head_dim), dtype_(dtype) {
  if (num_pages < 0 || page_size < 1 || kv_heads < 0 || head_dim < 0)
    throw std::invalid_argument("PagePool: num_pages >= 0, page_size >= 1, kv_heads >= 0, head_dim >= 0");
  ref_.assign(num_pages, 0);
  // Pushed in reverse so that the first allocations are pages 0, 1, 2, ...: easier to read in a demo.
  free_.reserve(num_pages);
  for (int p = num_pages - 1; p >= 0; --p) free_.push_back(p);
  if (kv_heads > 0 && head_dim > 0) {
    const std::size_t n = std::size_t(num_pages) * kv_heads * page_size * head_dim;
    k_.assign(n, 0.f);
    v_.assign(n, 0.f);
  }
}

PagePool::PagePool(int num_pages, int page_size, int kv_heads, int head_dim, KvDtype kv)
    : PagePool(num_pages, page_size, kv_heads, head_dim, DType::bf16) {
  kv_dtype_ = kv;
  if (quantised() && has_storage()) {
    k_scale_.assign(std::size_t(num_pages) * kv_heads, 0.f);
    v_scale_.assign(std::size_t(num_pages) * kv_heads, 0.f);
  }
}

void PagePool::check_page(int page, const char* what) const {
  if (page < 0 || page >= num_pages())
    throw std::logic_error(std::string("PagePool::") + what + ": page " + std::to_string(page) + " out of range");
}

Status PagePool::alloc(int* page) {
  if (free_.empty()) return Status::out_of_pages;
  *page = free_.back();
  free_.pop_back();
  ref_[*page] = 1;
  if (quantised() && has_storage()) {
    // A fresh page: scale 0 and zero codes, so the first token sets the scale alone.
    const std::size_t n = std::size_t(kv_heads_) * page_size_ * d_;
    std::fill_n(k_.begin() + long(offset(*page, 0, 0)), n, 0.f);
    std::fill_n(v_.begin() + long(offset(*page, 0, 0)), n, 0.f);
    std::fill_n(k_scale_.begin() + long(*page) * kv_heads_, kv_heads_, 0.f);
    std::fill_n(v_scale_.begin() + long(*page) * kv_heads_, kv_heads_, 0.f);
  }
  peak_used_ = std::max(peak_used_, used_pages());
  return Status::ok;
}

Status PagePool::alloc_n(int n, std::vector<int>* pages) {
  if (n > free_pages()) return Status::out_of_pages;
  for (int i = 0; i < n; ++i) {
    int p = -1;
    alloc(&p);
    pages->push_back(p);
  }
  return Status::ok;
}

void PagePool::retain(int page) {
  check_page(page, "retain");
  if (ref_[page] == 0) throw std::logic_error("PagePool::retain: page " + std::to_string(page) + " is free");
  ++ref_[page];
}

void PagePool::release(int page) {
  check_page(page, "release");
  if (ref_[page] == 0) throw std::logic_error("PagePool::release: page " + std::to_string(page) + " is already free");
  if (--ref_[page] == 0) free_.push_back(page);
}

int PagePool::refcount(int page) const {
  check_page(page, "refcount");
  return ref_[page];
}

void PagePool::shuffle_free_list(uint64_t seed) {
  Rng rng(seed);
  for (std::size_t i = free_.size(); i > 1; --i) std::swap(free_[i - 1], free_[rng.next_u64() % i]);
}

void PagePool::quantise_row(std::vector<float>& codes, float& scale, int page, int hk, int slot, const float* x) {
  const float qmax = kv_qmax(kv_dtype_);
  float amax = 0.f;
  for (int c = 0; c < d_; ++c) amax = std::max(amax, std::fabs(round_to(DType::bf16, x[c])));
  if (amax > scale * qmax) {
    // The token does not fit under the page's scale. A fresh page takes this token's
    // amax / Q; a written one doubles its scale until the token fits, and its slots are
    // quantised again from their values. Growing by powers of two keeps requantisation
    // from compounding: an E4M3 code only shifts its exponent (exact while it stays
    // normal), and INT8's (and INT4's) rounding errors, half a step of each grid, sum to less than
    // one step of the last.
    // EXERCISE ch07.7: grow the page's scale: a fresh page takes amax / Q, a written one doubles until the token fits
    //| float grown = scale;  // TODO: your code here (q8::block_scale(); then powers of two)
    float grown = scale > 0.f ? scale : q8::block_scale(amax, qmax);
    while (amax > grown * qmax) grown *= 2.f;
    // END EXERCISE
    const float inv = q8::inverse_scale(grown);
    for (int s = 0; s < page_size_; ++s) {
      float* row = codes.data() + offset(page, hk, s);
      for (int c = 0; c < d_; ++c) row[c] = kv_code(kv_dtype_, kv_dequant(row[c], scale) * inv);
    }
    scale = grown;
  }
  const float inv = q8::inverse_scale(scale);
  float* row = codes.data() + offset(page, hk, slot);
  for (int c = 0; c < d_; ++c) row[c] = kv_code(kv_dtype_, round_to(DType::bf16, x[c]) * inv);
}

void PagePool::write_slot(int page, int slot, const float* k, const float* v) {
  check_page(page, "write_slot");
  if (!has_storage()) return;
  if (quantised()) {
    // K/V arrive in bf16 (the projection's output), then go to 8 bits.
    for (int hk = 0; hk < kv_heads_; ++hk) {
      const std::size_t sc = std::size_t(page) * kv_heads_ + hk;
      quantise_row(k_, k_scale_[sc], page, hk, slot, k + std::size_t(hk) * d_);
      quantise_row(v_, v_scale_[sc], page, hk, slot, v + std::size_t(hk) * d_);
    }
    return;
  }
  for (int hk = 0; hk < kv_heads_; ++hk) {
    const std::size_t at = offset(page, hk, slot);
    for (int c = 0; c < d_; ++c) {
      k_[at + c] = round_to(dtype_, k[std::size_t(hk) * d_ + c]);
      v_[at + c] = round_to(dtype_, v[std::size_t(hk) * d_ + c]);
    }
  }
}

void PagePool::read_slot(int page, int slot, float* k, float* v) const {
  check_page(page, "read_slot");
  if (!has_storage()) return;
  for (int hk = 0; hk < kv_heads_; ++hk) {
    const std::size_t at = offset(page, hk, slot);
    if (quantised()) {
      const float ks = k_scale_[std::size_t(page) * kv_heads_ + hk], vs = v_scale_[std::size_t(page) * kv_heads_ + hk];
      for (int c = 0; c < d_; ++c) {
        k[std::size_t(hk) * d_ + c] = kv_dequant(k_[at + c], ks);
        v[std::size_t(hk) * d_ + c] = kv_dequant(v_[at + c], vs);
      }
      continue;
    }
    std::copy_n(k_.data() + at, d_, k + std::size_t(hk) * d_);
    std::copy_n(v_.data() + at, d_, v + std::size_t(hk) * d_);
  }
}

void PagePool::copy_page(int dst, int src) {
  check_page(dst, "copy_page");
  check_page(src, "copy_page");
  if (!has_storage()) return;
  const std::size_t n = std::size_t(kv_heads_) * page_size_ * d_;
  std::copy_n(k_.data() + offset(src, 0, 0), n, k_.data() + offset(dst, 0, 0));
  std::copy_n(v_.data() + offset(src, 0, 0), n, v_.data() + offset(dst, 0, 0));
  if (quantised()) {  // the scales travel with the codes
    std::copy_n(k_scale_.begin() + long(src) * kv_heads_, kv_heads_, k_scale_.begin() + long(dst) * kv_heads_);
    std::copy_n(v_scale_.begin() + long(src) * kv_heads_, kv_heads_, v_scale_.begin() + long(dst) * kv_heads_);
  }
}

void PagePool::copy_page_to(PagePool& to, int dst, int src) const {
  check_page(src, "copy_page_to");
  to.check_page(dst, "copy_page_to");
  if (to.page_size_ != page_size_ || to.kv_heads_ != kv_heads_ || to.d_ != d_ || to.kv_dtype_ != kv_dtype_ ||
      to.has_storage() != has_storage())
    throw std::logic_error("PagePool::copy_page_to: the pools differ in geometry or format");
  if (!has_storage()) return;
  const std::size_t n = std::size_t(kv_heads_) * page_size_ * d_;
  std::copy_n(k_.data() + offset(src, 0, 0), n, to.k_.data() + to.offset(dst, 0, 0));
  std::copy_n(v_.data() + offset(src, 0, 0), n, to.v_.data() + to.offset(dst, 0, 0));
  if (quantised()) {
    std::copy_n(k_scale_.begin() + long(src) * kv_heads_, kv_heads_, to.k_scale_.begin() + long(dst) * kv_heads_);
    std::copy_n(v_scale_.begin() + long(src) * kv_heads_, kv_heads_, to.v_scale_.begin() + long(dst) * kv_heads_);
  }
}

std::string PagePool::validate_scales(int page) const {
  const float qmax = kv_qmax(kv_dtype_);
  for (int hk = 0; hk < kv_heads_; ++hk)
    for (int which = 0; which < 2; ++which) {
      const float s = (which ? v_scale_ : k_scale_)[std::size_t(page) * kv_heads_ + hk];
      const std::vector<float>& codes = which ? v_ : k_;
      const std::string where = std::string(which ? "V" : "K") + " of page " + std::to_string(page) + ", KV head " +
                                std::to_string(hk);
      if (!std::isfinite(s) || s < 0.f) return where + " has scale " + std::to_string(s);
      for (std::size_t i = offset(page, hk, 0), e = i + std::size_t(page_size_) * d_; i < e; ++i) {
        const float c = codes[i];
        if (!(std::fabs(c) <= qmax)) return where + " holds code " + std::to_string(c) + " outside the format";
        if (s == 0.f && c != 0.f) return where + " holds a nonzero code under scale 0";
        if (kv_code(kv_dtype_, c) != c) return where + " holds " + std::to_string(c) + ", not a code of the format";
      }
    }
  return {};
}

void PagePool::attach(const PageOwner* owner) { owners_.push_back(owner); }

void PagePool::detach(const PageOwner* owner) {
  owners_.erase(std::remove(owners_.begin(), owners_.end(), owner), owners_.end());
}

std::string PagePool::validate() const {
  const int n = num_pages();
  std::vector<char> on_free(n, 0);
  for (int p : free_) {
    if (p < 0 || p >= n) return "free list holds page " + std::to_string(p) + ", outside the pool";
    if (on_free[p]) return "page " + std::to_string(p) + " is on the free list twice";
    on_free[p] = 1;
    if (ref_[p] != 0)
      return "page " + std::to_string(p) + " is on the free list with reference count " + std::to_string(ref_[p]);
  }
  std::vector<int> refs(n, 0);
  for (const PageOwner* o : owners_) o->count_references(refs);
  for (int p = 0; p < n; ++p) {
    if (ref_[p] < 0) return "page " + std::to_string(p) + " has a negative reference count";
    if (ref_[p] == 0 && !on_free[p]) return "page " + std::to_string(p) + " has count 0 but is not on the free list (lost)";
    if (refs[p] != ref_[p])
      return "page " + std::to_string(p) + " has reference count " + std::to_string(ref_[p]) + " but " +
             std::to_string(refs[p]) + " references exist" + (refs[p] > ref_[p] ? " (double-owned)" : " (leaked)");
    if (ref_[p] > 0 && quantised() && has_storage())
      if (std::string why = validate_scales(p); !why.empty()) return why;
  }
  return {};
}

}  // namespace attn::ch07
