// The decode sweep's shapes and report (see sweep.hpp).
#include "sweep.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "common/report.hpp"

namespace attn::ch07 {

namespace {
std::string num(double x) {
  if (!std::isfinite(x)) return "null";
  char b[40];
  std::snprintf(b, sizeof b, "%.9g", x);
  return b;
}
}  // namespace

std::vector<SweepShape> sweep_shapes(const std::string& set) {
  std::vector<SweepShape> s;
  if (set == "all") {
    s = {{1, 32768, 32, 8, 16},  {1, 65536, 32, 8, 16},  {1, 65536, 32, 32, 16}, {8, 32768, 32, 8, 16},
         {8, 32768, 32, 32, 16}, {8, 131072, 32, 8, 16}, {64, 4096, 32, 8, 16}};
    for (int P : {1, 8, 32, 64}) s.push_back({1, 65536, 32, 8, P});
  } else if (set == "b1") {
    for (int L : {32768, 65536, 131072}) s.push_back({1, L, 32, 8, 16});
  } else if (set == "quant") {
    for (KvDtype t : {KvDtype::bf16, KvDtype::fp8, KvDtype::int8, KvDtype::int4}) {
      s.push_back({8, 32768, 32, 8, 16, t});
      s.push_back({1, 65536, 32, 8, 16, t});
    }
  }
  return s;
}

bool sweep_set_known(const std::string& set) { return set == "all" || set == "b1" || set == "quant"; }

bool SweepReport::all_pass() const {
  for (const auto& r : results)
    for (const auto& x : r.runs)
      if (!x.pass) return false;
  return true;
}

std::string SweepReport::json() const {
  std::ostringstream j;
  j << "{\"chapter\": \"ch07_paged_radix\", \"subcommand\": \"decode-sweep\", \"device_name\": \""
    << json_escape(device) << "\", \"date\": \"" << json_escape(date) << "\", \"read_gbps\": " << num(read_gbps)
    << ", \"d\": " << d << ", \"configs\": [";
  for (std::size_t i = 0; i < results.size(); ++i) {
    const SweepResult& r = results[i];
    j << (i ? ", " : "") << "{\"batch\": " << r.shape.batch << ", \"len\": " << r.shape.len
      << ", \"heads\": " << r.shape.heads << ", \"kv_heads\": " << r.shape.kv_heads << ", \"d\": " << r.d
      << ", \"page_size\": " << r.shape.page_size << ", \"kv_dtype\": \"" << kv_dtype_name(r.shape.kv)
      << "\", \"kv_bytes\": " << num(r.kv_bytes) << ", \"tokens\": " << r.tokens
      << ", \"plan_splits\": " << r.plan_splits << ", \"plan_why\": \"" << json_escape(r.plan_why)
      << "\", \"check_plan\": \"" << json_escape(r.check_plan) << "\", \"results\": [";
    for (std::size_t k = 0; k < r.runs.size(); ++k) {
      const SweepRun& x = r.runs[k];
      j << (k ? ", " : "") << "{\"kernel\": \"" << json_escape(x.kernel) << "\", \"layout\": \""
        << json_escape(x.layout) << "\", \"splits\": " << x.splits << ", \"chosen\": " << (x.chosen ? "true" : "false")
        << ", \"time_ms\": " << num(x.time_ms) << ", \"kv_gbps\": " << num(x.kv_gbps)
        << ", \"ceiling_share\": " << num(read_gbps > 0 ? x.kv_gbps / read_gbps : NAN)
        << ", \"tokens_per_s\": " << num(x.tokens_per_s)
        << ", \"max_abs_err\": " << num(x.max_abs_err) << ", \"pass\": " << (x.pass ? "true" : "false");
      if (x.chain > 0)
        j << ", \"chain\": " << x.chain << ", \"chain_ms\": " << num(x.chain_ms) << ", \"chain_gbps\": " << num(x.chain_gbps);
      j << "}";
    }
    j << "]}";
  }
  j << "]}\n";
  return j.str();
}

std::string SweepReport::text() const {
  std::ostringstream t;
  char line[512];
  t << "== ch07_paged_radix decode --sweep: KV bytes read per second (d = " << d << ") ==\n"
    << "device  : " << device << ", " << date << "\n"
    << "ceiling : read " << num(std::round(read_gbps)) << " GB/s (measured in this run)\n\n";
  std::snprintf(line, sizeof line, "%-3s %-7s %-6s %-3s %-4s  %-24s %9s %10s %8s %12s %6s\n", "B", "L", "Hq/Hkv", "P",
                "KV", "kernel", "ms", "KV GB/s", "ceiling", "Mtok/s", "check");
  t << line;
  for (const SweepResult& r : results)
    for (const SweepRun& x : r.runs) {
      const std::string k = x.kernel + (x.splits > 1 ? " S=" + std::to_string(x.splits) : "") + " " + x.layout +
                            (x.chosen ? " *" : "");
      std::snprintf(line, sizeof line, "%-3d %-7d %2d/%-3d %-3d %-4s  %-24s %9.4f %10.0f %7.0f%% %12.1f %6s\n",
                    r.shape.batch, r.shape.len, r.shape.heads, r.shape.kv_heads, r.shape.page_size,
                    kv_dtype_name(r.shape.kv), k.c_str(), x.time_ms, x.kv_gbps,
                    read_gbps > 0 ? 100.0 * x.kv_gbps / read_gbps : 0.0, x.tokens_per_s / 1e6, x.pass ? "pass" : "FAIL");
      t << line;
      if (x.chain > 0) {
        std::snprintf(line, sizeof line, "%-3s %-7s %-6s %-3s %-4s  %-24s %9.4f %10.0f %7.0f%%\n", "", "", "", "", "",
                      ("  x" + std::to_string(x.chain) + " in a row").c_str(), x.chain_ms, x.chain_gbps,
                      read_gbps > 0 ? 100.0 * x.chain_gbps / read_gbps : 0.0);
        t << line;
      }
      if (!x.pass) t << "    " << x.failures;
    }
  t << "\n* = the kernel choose_splits() picks for the shape (v2; v3 is v2 with the merge fused). KV GB/s = bytes of\n"
       "every cached K and V row (and 8-bit scales) / time; Mtok/s = cached tokens read per second;\n"
       "the ceiling is a read-only streaming kernel measured in the same run.\n";
  for (const SweepResult& r : results)
    if (r.shape.page_size == 16)
      t << "B=" << r.shape.batch << " L=" << r.shape.len << " " << r.shape.heads << "/" << r.shape.kv_heads << ": "
        << r.plan_why << "\n";
  return t.str();
}

}  // namespace attn::ch07
