// RadixAttention's prefix tree over the page pool (see radix_cache.hpp).
#include "radix_cache.hpp"

#include <algorithm>
#include <queue>
#include <set>
#include <sstream>
#include <stdexcept>

namespace attn::ch07 {

RadixCache::RadixCache(PagePool& pool, Eviction policy) : pool_(pool), policy_(policy) {
  nodes_.emplace_back();
  nodes_[0].live = true;  // the root: empty key, no pages, never evicted
  pool_.attach(this);
}

RadixCache::~RadixCache() {
  for (const Node& n : nodes_)
    if (n.live)
      for (int p : n.pages) pool_.release(p);
  pool_.detach(this);
}

int RadixCache::num_nodes() const {
  return int(std::count_if(nodes_.begin(), nodes_.end(), [](const Node& n) { return n.live; })) - 1;
}

int RadixCache::new_node() {
  int id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    id = int(nodes_.size());
    nodes_.emplace_back();
  }
  nodes_[id] = Node{};
  nodes_[id].live = true;
  return id;
}

void RadixCache::free_node(int id) {
  nodes_[id] = Node{};
  free_ids_.push_back(id);
}

void RadixCache::check_node(int id, const char* what) const {
  if (id < 0 || id >= int(nodes_.size()) || !nodes_[id].live)
    throw std::logic_error(std::string("RadixCache::") + what + ": node " + std::to_string(id) + " does not exist");
}

std::vector<int32_t> RadixCache::first_page(const std::vector<int32_t>& tokens, std::size_t pos) const {
  return std::vector<int32_t>(tokens.begin() + pos, tokens.begin() + pos + pool_.page_size());
}

int RadixCache::common_pages(const Node& node, const std::vector<int32_t>& tokens, std::size_t pos) const {
  const std::size_t P = pool_.page_size();
  const std::size_t most = std::min(node.pages.size(), (tokens.size() - pos) / P);
  std::size_t k = 0;
  while (k < most && std::equal(node.key.begin() + k * P, node.key.begin() + (k + 1) * P, tokens.begin() + pos + k * P))
    ++k;
  return int(k);
}

void RadixCache::touch(int id) {
  nodes_[id].last_access = clock_;
  ++nodes_[id].hits;
}

int RadixCache::split(int id, int k) {
  const std::size_t P = pool_.page_size();
  const int mid = new_node();  // may move nodes_: take references after it
  Node& child = nodes_[id];
  Node& upper = nodes_[mid];
  upper.parent = child.parent;
  upper.key.assign(child.key.begin(), child.key.begin() + k * P);
  upper.pages.assign(child.pages.begin(), child.pages.begin() + k);
  upper.lock_ref = child.lock_ref;  // every lock below the child is below the new node too
  upper.last_access = child.last_access;
  upper.hits = child.hits;
  child.key.erase(child.key.begin(), child.key.begin() + k * P);
  child.pages.erase(child.pages.begin(), child.pages.begin() + k);
  child.parent = mid;
  upper.children[first_page(child.key, 0)] = id;
  nodes_[upper.parent].children[first_page(upper.key, 0)] = mid;  // same first page as before
  return mid;
}

PrefixMatch RadixCache::match_prefix(const std::vector<int32_t>& tokens) {
  ++clock_;
  const std::size_t P = pool_.page_size();
  PrefixMatch m;
  int node = 0;
  std::size_t pos = 0;
  while (pos + P <= tokens.size()) {
    const auto it = nodes_[node].children.find(first_page(tokens, pos));
    if (it == nodes_[node].children.end()) break;
    int child = it->second;
    const int k = common_pages(nodes_[child], tokens, pos);  // >= 1: the first page matched
    const bool partial = k < int(nodes_[child].pages.size());
    if (partial) child = split(child, k);
    touch(child);
    m.pages.insert(m.pages.end(), nodes_[child].pages.begin(), nodes_[child].pages.end());
    pos += k * P;
    node = child;
    if (partial) break;
  }
  m.node = node;
  m.tokens = int(pos);
  return m;
}

int RadixCache::insert(const std::vector<int32_t>& tokens, const std::vector<int>& pages) {
  ++clock_;
  const std::size_t P = pool_.page_size();
  const std::size_t full = tokens.size() / P;  // whole pages only
  if (pages.size() < full)
    throw std::logic_error("RadixCache::insert: " + std::to_string(pages.size()) + " pages for " +
                           std::to_string(full) + " whole pages of tokens");
  int node = 0;
  std::size_t pos = 0;
  while (pos < full * P) {
    const auto it = nodes_[node].children.find(first_page(tokens, pos));
    if (it == nodes_[node].children.end()) {
      // A new leaf for the rest: the tree becomes one more owner of these pages.
      const int leaf = new_node();
      Node& n = nodes_[leaf];
      n.parent = node;
      n.key.assign(tokens.begin() + pos, tokens.begin() + full * P);
      n.pages.assign(pages.begin() + pos / P, pages.begin() + full);
      for (int p : n.pages) pool_.retain(p);
      evictable_ += int(n.pages.size());
      nodes_[node].children[first_page(tokens, pos)] = leaf;
      touch(leaf);
      return int(pos);
    }
    int child = it->second;
    const int k = common_pages(nodes_[child], tokens, pos);
    if (k < int(nodes_[child].pages.size())) child = split(child, k);
    touch(child);
    pos += k * P;
    node = child;
  }
  return int(pos);
}

void RadixCache::lock(int id) {
  check_node(id, "lock");
  if (id == 0) return;  // nothing matched: nothing to protect
  ++nodes_[id].own_locks;
  for (int x = id; x != 0; x = nodes_[x].parent) {
    Node& n = nodes_[x];
    if (n.lock_ref++ == 0) {
      evictable_ -= int(n.pages.size());
      protected_ += int(n.pages.size());
    }
  }
}

void RadixCache::unlock(int id) {
  check_node(id, "unlock");
  if (id == 0) return;
  if (nodes_[id].own_locks == 0) throw std::logic_error("RadixCache::unlock: node " + std::to_string(id) + " is not locked");
  --nodes_[id].own_locks;
  for (int x = id; x != 0; x = nodes_[x].parent) {
    Node& n = nodes_[x];
    if (--n.lock_ref == 0) {
      protected_ -= int(n.pages.size());
      evictable_ += int(n.pages.size());
    }
  }
}

std::pair<uint64_t, uint64_t> RadixCache::eviction_key(const Node& n) const {
  if (policy_ == Eviction::lru) return {n.last_access, 0};
  // EXERCISE ch07.2: LFU: evict the least frequently used leaf first, the least recently used among equals
  //| return {n.last_access, 0};  // TODO: your code here (n.hits counts the operations that touched n)
  return {n.hits, n.last_access};
  // END EXERCISE
}

int RadixCache::evict(int num_pages, std::vector<std::vector<int>>* evicted) {
  if (num_pages <= 0) return 0;
  using Item = std::pair<std::pair<uint64_t, uint64_t>, int>;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> leaves;
  for (int id = 1; id < int(nodes_.size()); ++id) {
    const Node& n = nodes_[id];
    if (n.live && n.children.empty() && n.lock_ref == 0) leaves.push({eviction_key(n), id});
  }
  int freed = 0;
  while (freed < num_pages && !leaves.empty()) {
    const int id = leaves.top().second;
    leaves.pop();
    Node& n = nodes_[id];
    for (int p : n.pages) pool_.release(p);
    freed += int(n.pages.size());
    evictable_ -= int(n.pages.size());
    if (evicted) evicted->push_back(n.pages);
    const int parent = n.parent;
    nodes_[parent].children.erase(first_page(n.key, 0));
    free_node(id);
    // The parent may have just become a leaf: it is a candidate now.
    const Node& up = nodes_[parent];
    if (parent != 0 && up.children.empty() && up.lock_ref == 0) leaves.push({eviction_key(up), parent});
  }
  return freed;
}

void RadixCache::count_references(std::vector<int>& refs) const {
  for (const Node& n : nodes_)
    if (n.live)
      for (int p : n.pages)
        if (p >= 0 && p < int(refs.size())) ++refs[p];
}

std::string RadixCache::validate() const {
  const std::size_t P = pool_.page_size();
  std::vector<char> seen(nodes_.size(), 0);
  std::set<int> pages;
  int evictable = 0, protected_pages = 0;
  std::vector<int> stack = {0};
  seen[0] = 1;
  if (!nodes_[0].key.empty() || !nodes_[0].pages.empty()) return "the root holds tokens or pages";
  while (!stack.empty()) {
    const int id = stack.back();
    stack.pop_back();
    const Node& n = nodes_[id];
    const std::string who = "node " + std::to_string(id);
    int below = 0;
    for (const auto& [first, c] : n.children) {
      if (c <= 0 || c >= int(nodes_.size()) || !nodes_[c].live) return who + " has a dead child " + std::to_string(c);
      if (seen[c]) return "node " + std::to_string(c) + " is reached twice (not a tree)";
      seen[c] = 1;
      const Node& ch = nodes_[c];
      if (ch.parent != id) return "node " + std::to_string(c) + " does not point back to its parent " + std::to_string(id);
      if (ch.key.size() < P || ch.key.size() != ch.pages.size() * P)
        return "node " + std::to_string(c) + " has " + std::to_string(ch.key.size()) + " tokens for " +
               std::to_string(ch.pages.size()) + " pages";
      if (!std::equal(first.begin(), first.end(), ch.key.begin()) || first.size() != P)
        return "node " + std::to_string(c) + " is filed under a key that is not its first page";
      if (id != 0 && (ch.last_access > n.last_access || ch.hits > n.hits))
        return "node " + std::to_string(c) + " was used more recently or more often than its parent";
      below += ch.lock_ref;
      stack.push_back(c);
    }
    if (id == 0) continue;
    if (n.own_locks < 0 || n.lock_ref != n.own_locks + below)
      return who + " has lock count " + std::to_string(n.lock_ref) + ", expected " + std::to_string(n.own_locks + below);
    (n.lock_ref > 0 ? protected_pages : evictable) += int(n.pages.size());
    for (int p : n.pages) {
      if (p < 0 || p >= pool_.num_pages()) return who + " holds page " + std::to_string(p) + ", outside the pool";
      if (!pages.insert(p).second) return "page " + std::to_string(p) + " is held by two nodes";
    }
  }
  for (std::size_t id = 1; id < nodes_.size(); ++id)
    if (nodes_[id].live && !seen[id]) return "node " + std::to_string(id) + " is not reachable from the root";
  if (evictable != evictable_ || protected_pages != protected_)
    return "evictable/protected counters say " + std::to_string(evictable_) + "/" + std::to_string(protected_) +
           ", the nodes say " + std::to_string(evictable) + "/" + std::to_string(protected_pages);
  return pool_.validate();
}

std::string RadixCache::draw(const std::function<std::string(int32_t)>& name) const {
  const std::size_t P = pool_.page_size();
  auto tok = [&](int32_t t) { return name ? name(t) : std::to_string(t); };
  std::ostringstream s;
  s << "root\n";
  std::function<void(int, const std::string&)> rec = [&](int id, const std::string& indent) {
    const Node& n = nodes_[id];
    std::size_t k = 0;
    for (const auto& [first, c] : n.children) {
      const bool last = ++k == n.children.size();
      const Node& ch = nodes_[c];
      s << indent << (last ? "└─ " : "├─ ") << "[";
      const std::size_t shown = std::min<std::size_t>(ch.pages.size(), 6);
      for (std::size_t i = 0; i < shown * P; ++i) s << (i == 0 ? "" : i % P == 0 ? " | " : " ") << tok(ch.key[i]);
      if (shown < ch.pages.size()) s << " | ... " << ch.pages.size() - shown << " more pages";
      s << "]  pages";
      for (std::size_t i = 0; i < std::min<std::size_t>(ch.pages.size(), 8); ++i) s << " " << ch.pages[i];
      if (ch.pages.size() > 8) s << " ...";
      s << "  lock " << ch.lock_ref << (ch.lock_ref ? "" : " (evictable)") << "  used@" << ch.last_access << "\n";
      rec(c, indent + (last ? "   " : "│  "));
    }
  };
  rec(0, "");
  return s.str();
}

}  // namespace attn::ch07
