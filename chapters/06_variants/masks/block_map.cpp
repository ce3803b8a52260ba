#include "block_map.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace attn::ch06 {

double BlockMap::count(TileKind k) const {
  double n = 0;
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h) {
      const std::size_t f = std::size_t(map_of(b, h)) * tq;
      for (int qb = 0; qb < tq; ++qb)
        n += k == TileKind::full ? n_full[f + qb] : k == TileKind::partial ? n_part[f + qb]
                                                   : tk - n_full[f + qb] - n_part[f + qb];
    }
  return n;
}

int BlockMap::tiles_with_work() const {
  int n = 0;
  for (const int t : order) {
    const int bh = t / tq, qb = t % tq;
    const std::size_t f = std::size_t(map_of(bh / heads, bh % heads)) * tq + qb;
    n += n_full[f] + n_part[f] > 0;
  }
  return n;
}

std::string BlockMap::text(int b, int h, int max_cols) const {
  std::ostringstream s;
  const int cols = std::min(tk, max_cols);
  s << "block map of (batch " << b << ", head " << h << "): " << tq << " query blocks of " << Br << " x " << tk
    << " key blocks of " << Bc << "   (# full, + partial, . skip)\n";
  for (int qb = 0; qb < tq; ++qb) {
    s << "  q" << qb << (qb < 10 ? "   " : qb < 100 ? "  " : " ");
    for (int kb = 0; kb < cols; ++kb) {
      const TileKind k = kind(b, h, qb, kb);
      s << (k == TileKind::full ? '#' : k == TileKind::partial ? '+' : '.');
    }
    if (cols < tk) s << " ...";
    s << "\n";
  }
  return s.str();
}

std::string BlockMap::svg(int b, int h, const std::string& title) const {
  const int cell = std::max(4, std::min(24, 640 / std::max(tq, tk)));
  const int left = 40, top = 40, w = left + tk * cell + 20, hgt = top + tq * cell + 60;
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\"" << hgt
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s << "<text x=\"" << left << "\" y=\"18\">" << title << "</text>\n";
  s << "<text x=\"" << left << "\" y=\"34\" fill=\"#555\">keys: " << tk << " blocks of " << Bc
    << " -&gt;   queries: " << tq << " blocks of " << Br << "</text>\n";
  for (int qb = 0; qb < tq; ++qb)
    for (int kb = 0; kb < tk; ++kb) {
      const TileKind k = kind(b, h, qb, kb);
      const char* fill = k == TileKind::full ? "#2b6cb0" : k == TileKind::partial ? "#f6ad55" : "#f2f2f2";
      s << "<rect x=\"" << left + kb * cell << "\" y=\"" << top + qb * cell << "\" width=\"" << cell - 1
        << "\" height=\"" << cell - 1 << "\" fill=\"" << fill << "\"/>\n";
    }
  const int ly = top + tq * cell + 20;
  const char* names[3] = {"full: no mask arithmetic", "partial: keep() per element", "skip: never loaded"};
  const char* fills[3] = {"#2b6cb0", "#f6ad55", "#f2f2f2"};
  for (int k = 0; k < 3; ++k) {
    s << "<rect x=\"" << left + k * 190 << "\" y=\"" << ly << "\" width=\"12\" height=\"12\" fill=\"" << fills[k]
      << "\" stroke=\"#999\"/>\n";
    s << "<text x=\"" << left + k * 190 + 18 << "\" y=\"" << ly + 11 << "\">" << names[k] << "</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

int inject_map_fault(BlockMap& map, Fault f) {
  if (f != Fault::partial_tile_full && f != Fault::last_key_block) return 0;
  // A grid map's lists hold key block indices, a document map's each tile's first key.
  auto first_key = [&](int e) { return map.q_row0.empty() ? e * map.Bc : e; };
  int changed = 0;
  for (std::size_t l = 0; l < map.n_part.size(); ++l) {
    int* part = map.part.data() + l * map.tk;
    int* full = map.full.data() + l * map.tk;
    int& np = map.n_part[l];
    int& nf = map.n_full[l];
    int best = -1;  // position in part (>= 0) or in full (encoded as -2 - k)
    int best_key = -1;
    for (int k = 0; k < np; ++k)
      if (first_key(part[k]) > best_key &&
          (f == Fault::last_key_block || first_key(part[k]) + map.Bc <= map.nk))
        best = k, best_key = first_key(part[k]);
    if (f == Fault::last_key_block)
      for (int k = 0; k < nf; ++k)
        if (first_key(full[k]) > best_key) best = -2 - k, best_key = first_key(full[k]);
    if (best_key < 0) continue;
    if (best >= 0) {
      const int e = part[best];
      std::copy(part + best + 1, part + np, part + best);
      --np;
      if (f == Fault::partial_tile_full) full[nf++] = e;
    } else {
      const int k = -2 - best;
      std::copy(full + k + 1, full + nf, full + k);
      --nf;
    }
    ++changed;
  }
  return changed;
}

BackwardWalks backward_walks(const BlockMap& m) {
  if (m.map_heads != 1) throw std::runtime_error("the sm90a masked backward's walk: one block map for every head");
  BackwardWalks w;
  w.tq = m.tq, w.tk = m.tk, w.maps = m.maps();
  w.list.assign(std::size_t(w.maps) * m.tk * m.tq, 0);
  w.rank.assign(w.list.size(), 0);
  w.count.assign(std::size_t(w.maps) * m.tk, 0);
  for (int mi = 0; mi < w.maps; ++mi) {
    std::vector<int> visitors(m.tq, 0);  // key blocks below kb that visit each query block
    for (int kb = 0; kb < m.tk; ++kb) {
      const std::size_t f = std::size_t(mi) * m.tk + kb;
      const int* part = &m.q_part[f * m.tq];
      const int* full = &m.q_full[f * m.tq];
      const int np = m.q_n_part[f], nf = m.q_n_full[f];
      int a = 0, c = 0, n = 0;
      while (a < np || c < nf) {  // both lists ascend
        const bool take_part = c >= nf || (a < np && part[a] < full[c]);
        const int qb = take_part ? part[a++] : full[c++];
        w.list[f * m.tq + n] = qb << 1 | (take_part ? 1 : 0);
        w.rank[f * m.tq + n] = visitors[qb]++;
        ++n;
      }
      w.count[f] = n;
    }
  }
  return w;
}

}  // namespace attn::ch06
