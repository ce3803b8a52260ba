// Block tables, fork and copy-on-write over the page pool (see paged_kv_cache.hpp).
#include "paged_kv_cache.hpp"

#include <algorithm>
#include <stdexcept>

#include "common/index.hpp"

namespace attn::ch07 {

PagedKvCache::PagedKvCache(PagePool& pool, PagePool* host) : pool_(pool), host_(host) {
  if (host_ && (host_->page_size() != pool_.page_size() || host_->kv_heads() != pool_.kv_heads() ||
                host_->head_dim() != pool_.head_dim() || host_->kv_dtype() != pool_.kv_dtype() ||
                host_->has_storage() != pool_.has_storage()))
    throw std::logic_error("PagedKvCache: the host pool must have the device pool's geometry and format");
  pool_.attach(this);
  host_refs_.cache = this;
  if (host_) host_->attach(&host_refs_);
}

PagedKvCache::~PagedKvCache() {
  for (auto& [id, s] : seqs_)
    for (std::size_t i = 0; i < s.pages.size(); ++i) (s.host[i] ? *host_ : pool_).release(s.pages[i]);
  pool_.detach(this);
  if (host_) host_->detach(&host_refs_);
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
  if (s->swapped) return Status::swapped_out;
  if (pool_.has_storage() && (!k || !v))
    throw std::logic_error("PagedKvCache::append: this pool stores K/V, so k and v are required");
  const int P = pool_.page_size();
  const int slot = s->len % P;
  if (slot == 0) {
    // The last page is full (or the sequence is empty): start a new page.
    int page = -1;
    if (pool_.alloc(&page) != Status::ok) return Status::out_of_pages;
    s->pages.push_back(page);
    s->host.push_back(0);
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
  if (s->swapped) return Status::swapped_out;
  if (n <= 0) return n == 0 ? Status::ok : Status::bad_position;
  const int P = pool_.page_size();
  // All or nothing: count the pages first (a copy of a shared last page, then new pages).
  const int room = s->len % P == 0 ? 0 : P - s->len % P;
  const bool copy = room > 0 && pool_.refcount(s->pages.back()) > 1;
  const int fresh = n > room ? ceil_div(n - room, P) : 0;
  if (fresh + (copy ? 1 : 0) > pool_.free_pages()) return Status::out_of_pages;
  if (copy) make_private(*s, int(s->pages.size()) - 1);
  pool_.alloc_n(fresh, &s->pages);
  s->host.resize(s->pages.size(), 0);
  s->len += n;
  return Status::ok;
}

Status PagedKvCache::fork(SeqId parent, SeqId* child) {
  const Seq* p = find(parent);
  if (!p) return Status::no_such_sequence;
  if (p->swapped) return Status::swapped_out;
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
  if (s->swapped) return Status::swapped_out;
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
  if (s->host[pos / P]) {
    host_->read_slot(s->pages[pos / P], pos % P, k, v);
    return Status::ok;
  }
  pool_.read_slot(s->pages[pos / P], pos % P, k, v);
  return Status::ok;
}

Status PagedKvCache::free(SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return Status::no_such_sequence;
  const Seq& s = it->second;
  for (std::size_t i = 0; i < s.pages.size(); ++i) (s.host[i] ? *host_ : pool_).release(s.pages[i]);
  seqs_.erase(it);
  return Status::ok;
}

bool PagedKvCache::swapped(SeqId id) const {
  const Seq* s = find(id);
  return s && s->swapped;
}

int PagedKvCache::pages_to_swap_out(SeqId id) const {
  const Seq* s = find(id);
  if (!s || s->swapped) return 0;
  int n = 0;
  for (int p : s->pages) n += pool_.refcount(p) == 1 ? 1 : 0;
  return n;
}

int PagedKvCache::pages_to_swap_in(SeqId id) const {
  const Seq* s = find(id);
  if (!s || !s->swapped) return 0;
  int n = 0;
  for (char h : s->host) n += h ? 1 : 0;
  return n;
}

Status PagedKvCache::swap_out(SeqId id, int* moved) {
  Seq* s = find(id);
  if (!s) return Status::no_such_sequence;
  if (!host_) throw std::logic_error("PagedKvCache::swap_out: this cache has no host pool");
  if (s->swapped) return Status::swapped_out;
  const int n = pages_to_swap_out(id);
  if (n > host_->free_pages()) return Status::out_of_pages;  // all or nothing
  for (std::size_t i = 0; i < s->pages.size(); ++i) {
    // EXERCISE ch07.6: swap out: each page only this sequence holds moves to a host page; shared pages stay
    //| (void)i;  // TODO: your code here (host_->alloc(), pool_.copy_page_to(), pool_.release(), then the table and s->host)
    if (pool_.refcount(s->pages[i]) != 1) continue;  // shared: stays on the device
    int h = -1;
    host_->alloc(&h);
    pool_.copy_page_to(*host_, h, s->pages[i]);  // device -> host (cudaMemcpyAsync on a server)
    pool_.release(s->pages[i]);
    s->pages[i] = h;
    s->host[i] = 1;
    // END EXERCISE
  }
  s->swapped = true;
  swap_outs_ += n;
  if (moved) *moved = n;
  return Status::ok;
}

Status PagedKvCache::swap_in(SeqId id, int* moved) {
  Seq* s = find(id);
  if (!s) return Status::no_such_sequence;
  if (!s->swapped) return Status::ok;
  const int n = pages_to_swap_in(id);
  if (n > pool_.free_pages()) return Status::out_of_pages;  // all or nothing
  for (std::size_t i = 0; i < s->pages.size(); ++i) {
    if (!s->host[i]) continue;
    int d = -1;
    pool_.alloc(&d);
    host_->copy_page_to(pool_, d, s->pages[i]);  // host -> device
    host_->release(s->pages[i]);
    s->pages[i] = d;
    s->host[i] = 0;
  }
  s->swapped = false;
  swap_ins_ += n;
  if (moved) *moved = n;
  return Status::ok;
}

void PagedKvCache::count_references(std::vector<int>& refs) const {
  for (const auto& [id, s] : seqs_)
    for (std::size_t i = 0; i < s.pages.size(); ++i)
      if (!s.host[i] && s.pages[i] >= 0 && s.pages[i] < int(refs.size())) ++refs[s.pages[i]];
}

void PagedKvCache::HostRefs::count_references(std::vector<int>& refs) const {
  for (const auto& [id, s] : cache->seqs_)
    for (std::size_t i = 0; i < s.pages.size(); ++i)
      if (s.host[i] && s.pages[i] >= 0 && s.pages[i] < int(refs.size())) ++refs[s.pages[i]];
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
    if (s.host.size() != s.pages.size()) return who + " has a block table and host flags of different sizes";
    bool any_host = false;
    for (std::size_t i = 0; i < s.pages.size(); ++i) {
      const int p = s.pages[i];
      if (s.host[i]) {
        any_host = true;
        if (!host_) return who + " has a host page but the cache has no host pool";
        if (p < 0 || p >= host_->num_pages()) return who + " maps to host page " + std::to_string(p) + ", outside the host pool";
        if (host_->refcount(p) != 1) return who + " maps to host page " + std::to_string(p) + " with count " +
                                            std::to_string(host_->refcount(p)) + " (a host page has one owner)";
        continue;
      }
      if (p < 0 || p >= pool_.num_pages()) return who + " maps to page " + std::to_string(p) + ", outside the pool";
      if (pool_.refcount(p) == 0) return who + " maps to free page " + std::to_string(p);
      if (seen_in[p] == id) return who + " maps two logical pages to page " + std::to_string(p);
      seen_in[p] = id;
    }
    if (any_host && !s.swapped) return who + " is running but holds host pages";
  }
  if (host_)
    if (std::string why = host_->validate(); !why.empty()) return "host pool: " + why;
  return pool_.validate();
}

}  // namespace attn::ch07
