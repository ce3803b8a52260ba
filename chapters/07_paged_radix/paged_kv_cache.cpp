// Block tables, fork and copy-on-write over the page pool (see paged_kv_cache.hpp).
#include "paged_kv_cache.hpp"

#include <algorithm>
#include <stdexcept>

#include "common/index.hpp"

namespace attn::ch07 {

PagedKvCache::PagedKvCache(PagePool& pool) : pool_(pool) { pool_.attach(this); }

PagedKvCache::~PagedKvCache() {
  for (auto& [id, s] : seqs_)
    for (int p : s.pages) pool_.release(p);
  pool_.detach(this);
}

PagedKvCache::Seq* PagedKvCache::find(SeqId id) {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : &it->second;
}

const PagedKvCache::Seq* PagedKvCache::find(SeqId id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : &it->second;
}

PagedKvCache::SeqId PagedKvCache::create() {
  const SeqId id = next_id_++;
  seqs_.emplace(id, Seq{});
  return id;
}

int PagedKvCache::length(SeqId s) const {
  const Seq* q = find(s);
  return q ? q->len : -1;
}

const std::vector<int>& PagedKvCache::block_table(SeqId s) const {
  static const std::vector<int> none;
  const Seq* q = find(s);
  return q ? q->pages : none;
}

std::vector<PagedKvCache::SeqId> PagedKvCache::sequences() const {
  std::vector<SeqId> ids;
  for (const auto& [id, s] : seqs_) ids.push_back(id);
  return ids;
}

int PagedKvCache::pages_for_append(SeqId id) const {
  const Seq* s = find(id);
  if (!s) return 0;
  const int P = pool_.page_size();
  if (s->len % P == 0) return 1;                          // the last page is full (or there is none)
  return pool_.refcount(s->pages.back()) > 1 ? 1 : 0;     // shared: copy before writing
}

Status PagedKvCache::make_private(Seq& s, int i) {
  const int old = s.pages[i];
  if (pool_.refcount(old) == 1) return Status::ok;
  int fresh = -1;
  if (pool_.alloc(&fresh) != Status::ok) return Status::out_of_pages;
  pool_.copy_page(fresh, old);
  pool_.release(old);  // the other owners keep it
  s.pages[i] = fresh;
  ++cow_copies_;
  return Status::ok;
}

Status PagedKvCache::append(SeqId id, const float* k, const float* v) {
  Seq* s = find(id);
  if (!s) return Status::no_such_sequence;
  if (pool_.has_storage() && (!k || !v))
    throw std::logic_error("PagedKvCache::append: this pool stores K/V, so k and v are required");
  const int P = pool_.page_size();
  const int slot = s->len % P;
  if (slot == 0) {
    // The last page is full (or the sequence is empty): start a new page.
    int page = -1;
    if (pool_.alloc(&page) != Status::ok) return Status::out_of_pages;
    s->pages.push_back(page);
  } else {
    // EXERCISE ch07.1: copy-on-write: the last page may be shared with a fork; make it private before writing
    //| // TODO: your code here (use make_private(); return its status when it fails)
    const Status st = make_private(*s, int(s->pages.size()) - 1);
    if (st != Status::ok) return st;
    // END EXERCISE
  }
  if (pool_.has_storage()) pool_.write_slot(s->pages.back(), slot, k, v);
  ++s->len;
  return Status::ok;
}

Status PagedKvCache::append_tokens(SeqId id, int n) {
  Seq* s = find(id);
  if (!s) return Status::no_such_sequence;
  if (n <= 0) return n == 0 ? Status::ok : Status::bad_position;
  const int P = pool_.page_size();
  // All or nothing: count the pages first (a copy of a shared last page, then new pages).
  const int room = s->len % P == 0 ? 0 : P - s->len % P;
  const bool copy = room > 0 && pool_.refcount(s->pages.back()) > 1;
  const int fresh = n > room ? ceil_div(n - room, P) : 0;
  if (fresh + (copy ? 1 : 0) > pool_.free_pages()) return Status::out_of_pages;
  if (copy) make_private(*s, int(s->pages.size()) - 1);
  pool_.alloc_n(fresh, &s->pages);
  s->len += n;
  return Status::ok;
}

Status PagedKvCache::fork(SeqId parent, SeqId* child) {
  const Seq* p = find(parent);
  if (!p) return Status::no_such_sequence;
  Seq c = *p;  // same table: every page gains one owner, none is allocated
  for (int page : c.pages) pool_.retain(page);
  const SeqId id = next_id_++;
  seqs_.emplace(id, std::move(c));
  *child = id;
  return Status::ok;
}

Status PagedKvCache::write(SeqId id, int pos, const float* k, const float* v) {
  Seq* s = find(id);
  if (!s) return Status::no_such_sequence;
  if (pos < 0 || pos >= s->len) return Status::bad_position;
  const int P = pool_.page_size();
  const Status st = make_private(*s, pos / P);
  if (st != Status::ok) return st;
  pool_.write_slot(s->pages[pos / P], pos % P, k, v);
  return Status::ok;
}

Status PagedKvCache::read(SeqId id, int pos, float* k, float* v) const {
  const Seq* s = find(id);
  if (!s) return Status::no_such_sequence;
  if (pos < 0 || pos >= s->len) return Status::bad_position;
  const int P = pool_.page_size();
  pool_.read_slot(s->pages[pos / P], pos % P, k, v);
  return Status::ok;
}

Status PagedKvCache::free(SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return Status::no_such_sequence;
  for (int p : it->second.pages) pool_.release(p);
  seqs_.erase(it);
  return Status::ok;
}

void PagedKvCache::count_references(std::vector<int>& refs) const {
  for (const auto& [id, s] : seqs_)
    for (int p : s.pages)
      if (p >= 0 && p < int(refs.size())) ++refs[p];
}

std::string PagedKvCache::validate() const {
  const int P = pool_.page_size();
  std::vector<int> seen_in(pool_.num_pages(), -1);  // the last sequence that mapped each page
  for (const auto& [id, s] : seqs_) {
    const std::string who = "sequence " + std::to_string(id);
    if (s.len < 0) return who + " has a negative length";
    if (int(s.pages.size()) != ceil_div(s.len, P))
      return who + " has " + std::to_string(s.pages.size()) + " pages for " + std::to_string(s.len) +
             " tokens (page size " + std::to_string(P) + ")";
    for (int p : s.pages) {
      if (p < 0 || p >= pool_.num_pages()) return who + " maps to page " + std::to_string(p) + ", outside the pool";
      if (pool_.refcount(p) == 0) return who + " maps to free page " + std::to_string(p);
      if (seen_in[p] == id) return who + " maps two logical pages to page " + std::to_string(p);
      seen_in[p] = id;
    }
  }
  return pool_.validate();
}

}  // namespace attn::ch07
