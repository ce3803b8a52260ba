#include "common/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <iomanip>
#include <sstream>

#include "common/errors.hpp"

namespace attn {

void ResultRow::set_check(const CheckResult& c) {
  max_abs_err = c.max_abs();
  rel_l2_err = c.rel_l2();
  pass = c.pass();
  if (!c.pass()) note = c.failures();
  double m = 0;
  for (const auto& t : c.tensors) m = std::max(m, t.verdict.margin);
  check_margin = m;
}

void ResultRow::set_traffic(const Traffic& t) {
  hbm_read_bytes = t.bytes_read;
  hbm_write_bytes = t.bytes_written;
  extra_bytes = t.extra_peak;
}

void ResultRow::set_time(double ms) {
  time_ms = ms;
  if (flops) tflops = *flops / (ms * 1e-3) / 1e12;
  if (hbm_read_bytes && hbm_write_bytes) gbps = (*hbm_read_bytes + *hbm_write_bytes) / (ms * 1e-3) / 1e9;
}

void Report::apply_ceilings() {
  for (auto& r : rows) {
    if (r.bound == Bound::compute && r.tflops && ceilings.gemm_tflops)
      r.ceiling_share = *r.tflops / *ceilings.gemm_tflops;
    if (r.bound == Bound::memory && r.gbps && ceilings.read_gbps) r.ceiling_share = *r.gbps / *ceilings.read_gbps;
  }
}

bool Report::all_passed() const {
  for (const auto& r : rows)
    if (r.pass && !*r.pass) return false;
  return true;
}

namespace {

std::string fmt_err(const std::optional<double>& v) {
  if (!v) return "-";
  if (std::isinf(*v)) return "inf";
  char b[32];
  std::snprintf(b, sizeof b, "%.2e", *v);
  return b;
}
std::string fmt_bytes(const std::optional<double>& v) { return v ? format_bytes(*v) : "-"; }
std::string fmt_num(const std::optional<double>& v, int prec = 3) {
  if (!v) return "-";
  char b[32];
  if (*v != 0 && (std::abs(*v) >= 1e5 || std::abs(*v) < 1e-2))
    std::snprintf(b, sizeof b, "%.*e", prec - 1, *v);
  else
    std::snprintf(b, sizeof b, "%.*g", prec, *v);
  return b;
}
std::string fmt_flops(const std::optional<double>& v) {
  if (!v) return "-";
  const char* u[] = {"", "K", "M", "G", "T", "P"};
  double x = *v;
  int k = 0;
  while (x >= 1000 && k < 5) x /= 1000, ++k;
  char b[32];
  std::snprintf(b, sizeof b, "%.3g %s", x, u[k]);
  return b;
}
std::string fmt_share(const std::optional<double>& v) {
  if (!v) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.0f%%", 100.0 * *v);
  return b;
}

void json_num(std::ostream& os, const std::optional<double>& v) {
  if (!v || !std::isfinite(*v)) {
    os << "null";
    return;
  }
  char b[40];
  std::snprintf(b, sizeof b, "%.9g", *v);
  os << b;
}

}  // namespace

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          o += b;
        } else {
          o += c;
        }
    }
  }
  return o;
}

std::string fmt(const char* printf_format, double x) {
  char b[64];
  std::snprintf(b, sizeof b, printf_format, x);
  return b;
}

std::string today() {
  std::time_t t = std::time(nullptr);
  char b[16];
  std::strftime(b, sizeof b, "%Y-%m-%d", std::gmtime(&t));
  return b;
}

void Report::print_text(std::ostream& os) const {
  os << "== " << chapter << ": " << title << " ==\n";
  os << "problem : " << problem.describe() << "\n";
  os << "inputs  : " << inputs << "\n";
  os << "mode    : " << mode << "\n";
  if (!check_plan.empty()) os << "checked : " << check_plan << "\n";
  if (ceilings.read_gbps || ceilings.gemm_tflops) {
    os << "ceilings:";
    if (ceilings.read_gbps) os << " read " << fmt_num(ceilings.read_gbps, 4) << " GB/s";
    if (ceilings.gemm_tflops) os << ", " << ceilings.gemm_what << " " << fmt_num(ceilings.gemm_tflops, 4) << " TFLOP/s";
    os << " (measured in this run)\n";
  }
  const std::vector<std::string> head = {"impl", "dev", "max err", "rel L2", "HBM read", "HBM write",
                                         "FLOPs", "extra", "ms", "TFLOP/s", "GB/s", "ceil", "check"};
  std::vector<std::vector<std::string>> cells;
  for (const auto& r : rows) {
    // A row that was not compared with fp64 shows no speed (ResultRow::speed_shown).
    const bool sp = r.speed_shown();
    const std::optional<double> none;
    cells.push_back({r.impl, r.device, fmt_err(r.max_abs_err), fmt_err(r.rel_l2_err), fmt_bytes(r.hbm_read_bytes),
                     fmt_bytes(r.hbm_write_bytes), fmt_flops(r.flops), fmt_bytes(r.extra_bytes),
                     fmt_num(sp ? r.time_ms : none), fmt_num(sp ? r.tflops : none), fmt_num(sp ? r.gbps : none, 4),
                     fmt_share(sp ? r.ceiling_share : none), r.pass ? (*r.pass ? "pass" : "FAIL") : "unchecked"});
  }
  std::vector<std::size_t> w(head.size());
  for (std::size_t c = 0; c < head.size(); ++c) {
    w[c] = head[c].size();
    for (const auto& row : cells) w[c] = std::max(w[c], row[c].size());
  }
  auto line = [&](const std::vector<std::string>& v) {
    for (std::size_t c = 0; c < v.size(); ++c) {
      if (c == 0) os << std::left << std::setw(int(w[c])) << v[c];
      else os << "  " << std::right << std::setw(int(w[c])) << v[c];
    }
    os << "\n";
  };
  line(head);
  std::size_t total = 0;
  for (auto x : w) total += x + 2;
  os << std::string(total - 2, '-') << "\n";
  for (const auto& row : cells) line(row);
  for (const auto& r : rows)
    if (!r.note.empty()) os << "  " << r.impl << ": " << r.note << (r.note.back() == '\n' ? "" : "\n");
  for (const auto& n : notes) os << n << "\n";
  if (!previous.empty()) os << "vs previous chapter: " << previous << "\n";
}

void Report::print_json(std::ostream& os) const {
  const Problem& p = problem;
  os << "{\"chapter\": \"" << json_escape(chapter) << "\", \"title\": \"" << json_escape(title) << "\", ";
  os << "\"problem\": {\"batch\": " << p.batch << ", \"heads\": " << p.heads << ", \"kv_heads\": " << p.kv_heads
     << ", \"nq\": " << p.nq << ", \"nk\": " << p.nk << ", \"d\": " << p.d << ", \"dv\": " << p.dv
     << ", \"scale\": ";
  json_num(os, p.softmax_scale());
  os << ", \"causal\": " << (p.causal ? "true" : "false") << ", \"dtype\": \"" << dtype_name(p.dtype) << "\"}, ";
  os << "\"inputs\": \"" << json_escape(inputs) << "\", \"mode\": \"" << json_escape(mode) << "\", \"device_name\": ";
  if (device.empty()) os << "null"; else os << "\"" << json_escape(device) << "\"";
  os << ", \"check_plan\": \"" << json_escape(check_plan) << "\", \"ceilings\": {\"read_gbps\": ";
  json_num(os, ceilings.read_gbps);
  os << ", \"gemm_tflops\": ";
  json_num(os, ceilings.gemm_tflops);
  os << ", \"gemm_what\": \"" << json_escape(ceilings.gemm_what) << "\"}, \"results\": [";
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const auto& r = rows[k];
    os << (k ? ", " : "") << "{\"impl\": \"" << json_escape(r.impl) << "\", \"device\": \"" << r.device << "\"";
    auto field = [&](const char* name, const std::optional<double>& v) {
      os << ", \"" << name << "\": ";
      json_num(os, v);
    };
    field("max_abs_err", r.max_abs_err);
    field("rel_l2_err", r.rel_l2_err);
    field("hbm_read_bytes", r.hbm_read_bytes);
    field("hbm_write_bytes", r.hbm_write_bytes);
    field("flops", r.flops);
    field("extra_bytes", r.extra_bytes);
    const bool sp = r.speed_shown();
    const std::optional<double> none;
    field("time_ms", sp ? r.time_ms : none);
    if (r.prep_ms) field("prep_ms", sp ? r.prep_ms : none);
    field("tflops", sp ? r.tflops : none);
    field("gbps", sp ? r.gbps : none);
    field("ceiling_share", sp ? r.ceiling_share : none);
    field("check_margin", r.check_margin);
    os << ", \"pass\": " << (r.pass ? (*r.pass ? "true" : "false") : "null");
    if (!r.pass && r.time_ms) os << ", \"ran_unchecked\": true";  // timed, never compared: no speed
    os << ", \"note\": \"" << json_escape(r.note) << "\"}";
  }
  os << "], \"notes\": [";
  for (std::size_t k = 0; k < notes.size(); ++k) os << (k ? ", " : "") << "\"" << json_escape(notes[k]) << "\"";
  os << "], \"previous\": \"" << json_escape(previous) << "\"}\n";
}

int Report::emit(std::ostream& os, bool json) const {
  if (json) print_json(os);
  else print_text(os);
  return all_passed() ? 0 : kExitCheckFailed;
}

}  // namespace attn
