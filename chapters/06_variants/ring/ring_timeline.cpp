// Backend names and the timeline picture (plain C++: the SVG is written from the
// event times the GPU backends measured).
#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>
#include <sstream>

#include "ring/ring_gpu.hpp"

namespace attn::ch06::ring {

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::threads: return "threads";
    case Backend::streams: return "streams";
    case Backend::nccl: return "nccl";
  }
  return "?";
}

bool parse_backend(const std::string& s, Backend* out) {
  if (s == "threads") *out = Backend::threads;
  else if (s == "streams") *out = Backend::streams;
  else if (s == "nccl") *out = Backend::nccl;
  else return false;
  return true;
}

CopyHiding copy_hiding(const std::vector<TimelineEvent>& events) {
  // end of the compute interval of (rank, "fwd"/"bwd", step)
  std::map<std::tuple<int, std::string, int>, double> end;
  std::map<int, int> last_bwd_step;
  for (const TimelineEvent& e : events) {
    if (e.lane != "compute") continue;
    end[{e.rank, e.what, e.step}] = e.t1;
    if (e.what == "bwd") last_bwd_step[e.rank] = std::max(last_bwd_step[e.rank], e.step);
  }
  CopyHiding h;
  for (const TimelineEvent& e : events) {
    if (e.lane != "copy") continue;
    const bool fwd = e.what == "kv";
    const std::string phase = fwd ? "fwd" : "bwd";
    int step = e.step;
    if (e.what == "dkv") step = std::min(e.step + 1, last_bwd_step.count(e.rank) ? last_bwd_step[e.rank] : e.step);
    const auto it = end.find({e.rank, phase, step});
    const double behind = it == end.end() ? e.t0 : it->second;  // no compute to hide behind: all exposed
    const double exposed = std::max(0.0, e.t1 - std::max(e.t0, behind));
    if (fwd) {
      h.fwd_copy_ms += e.t1 - e.t0;
      h.fwd_exposed_ms += exposed;
    } else {
      h.bwd_copy_ms += e.t1 - e.t0;
      h.bwd_exposed_ms += exposed;
    }
  }
  return h;
}

std::string timeline_svg(const std::vector<TimelineEvent>& events, int ranks, const std::string& title) {
  double t_end = 0;
  for (const TimelineEvent& e : events) t_end = std::max(t_end, e.t1);
  if (t_end <= 0) t_end = 1;
  const int left = 120, width = 1000, lane_h = 22, top = 40;
  const int lanes = 2 * ranks;
  const int height = top + lanes * lane_h + 60;
  std::ostringstream s;
  char buf[2048];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
                "font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                left + width + 20, height);
  s << buf;
  s << "<text x=\"10\" y=\"18\" font-size=\"13\">" << title << "</text>\n";
  for (int r = 0; r < ranks; ++r)
    for (int k = 0; k < 2; ++k) {
      const int y = top + (2 * r + k) * lane_h;
      std::snprintf(buf, sizeof buf,
                    "<text x=\"10\" y=\"%d\">rank %d %s</text>\n<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" "
                    "stroke=\"#ddd\"/>\n",
                    y + 15, r, k == 0 ? "compute" : "copy", left, y + lane_h, left + width, y + lane_h);
      s << buf;
    }
  for (const TimelineEvent& e : events) {
    const int k = e.lane == "compute" ? 0 : 1;
    const int y = top + (2 * e.rank + k) * lane_h + 3;
    const double x0 = left + width * e.t0 / t_end, x1 = left + width * e.t1 / t_end;
    const char* color = e.what == "fwd"                ? "#4e79a7"
                        : e.what == "bwd"              ? "#59a14f"
                        : e.what.rfind("kv", 0) == 0   ? "#f28e2b"
                                                       : "#e15759";
    std::snprintf(buf, sizeof buf,
                  "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\" stroke=\"black\" "
                  "stroke-width=\"0.3\"><title>rank %d %s step %d: %.3f-%.3f ms</title></rect>\n",
                  x0, y, std::max(0.5, x1 - x0), lane_h - 6, color, e.rank, e.what.c_str(), e.step, e.t0, e.t1);
    s << buf;
    if (x1 - x0 > 18) {
      std::snprintf(buf, sizeof buf, "<text x=\"%.2f\" y=\"%d\" fill=\"white\">%d</text>\n", x0 + 3, y + 12, e.step);
      s << buf;
    }
  }
  // time axis
  const int ya = top + lanes * lane_h + 15;
  for (int t = 0; t <= 10; ++t) {
    const double x = left + width * t / 10.0;
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"black\"/>\n<text x=\"%.1f\" "
                  "y=\"%d\" text-anchor=\"middle\">%.2f</text>\n",
                  x, ya - 5, x, ya, x, ya + 13, t_end * t / 10.0);
    s << buf;
  }
  std::snprintf(buf, sizeof buf,
                "<text x=\"%d\" y=\"%d\">ms</text>\n"
                "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"10\" fill=\"#4e79a7\"/><text x=\"%d\" y=\"%d\">forward "
                "step</text>\n"
                "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"10\" fill=\"#59a14f\"/><text x=\"%d\" y=\"%d\">backward "
                "step</text>\n"
                "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"10\" fill=\"#f28e2b\"/><text x=\"%d\" y=\"%d\">K/V "
                "copy</text>\n"
                "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"10\" fill=\"#e15759\"/><text x=\"%d\" y=\"%d\">dK/dV "
                "copy</text>\n",
                left + width + 2, ya + 13, left, ya + 22, left + 16, ya + 31, left + 130, ya + 22, left + 146, ya + 31,
                left + 260, ya + 22, left + 276, ya + 31, left + 370, ya + 22, left + 386, ya + 31);
  s << buf << "</svg>\n";
  return s.str();
}

}  // namespace attn::ch06::ring
