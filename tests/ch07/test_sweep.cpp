// The decode sweep's report: the JSON that bench/ch07_decode.py reads.
#include <doctest/doctest.h>

#include <algorithm>

#include "chapters/07_paged_radix/sweep.hpp"
#include "support/json_check.hpp"

using namespace attn::ch07;

TEST_CASE("sweep report: valid JSON with every field the bench script reads") {
  SweepReport rep;
  rep.device = "Some \"GPU\"";
  rep.date = "2026-01-01";
  rep.read_gbps = 4000;
  for (const SweepShape& s : sweep_shapes()) {
    SweepResult r;
    r.shape = s;
    r.kv_bytes = double(s.batch) * s.len * s.kv_heads * 128 * 4;
    r.plan_splits = s.batch == 1 ? 32 : 1;
    r.plan_why = "why";
    r.check_plan = "plan";
    r.runs.push_back({"v1", "paged", 1, r.plan_splits == 1, 0.5, 3000, 1e-3, true, ""});
    r.runs.push_back({"v2", "paged", std::max(2, r.plan_splits), r.plan_splits > 1, 0.4, 3500, 1e-3, true, ""});
    rep.results.push_back(r);
  }
  const std::string j = rep.json();
  CHECK(testing_support::is_valid_json(j));
  for (const char* field : {"\"device_name\"", "\"read_gbps\"", "\"configs\"", "\"batch\"", "\"len\"", "\"heads\"",
                            "\"kv_heads\"", "\"page_size\"", "\"kv_bytes\"", "\"results\"", "\"kernel\"", "\"layout\"",
                            "\"splits\"", "\"chosen\"", "\"kv_gbps\"", "\"pass\""})
    CHECK(j.find(field) != std::string::npos);
  CHECK(j.find("\"chain_ms\"") == std::string::npos);  // only where a chain was timed
  SweepRun chained{"v14", "paged", 32, false, 0.04, 3300, 1e-3, true, ""};
  chained.chain = 8;
  chained.chain_ms = 0.035;
  chained.chain_gbps = 3800;
  rep.results[0].runs.push_back(chained);
  const std::string jc = rep.json();
  CHECK(testing_support::is_valid_json(jc));
  for (const char* field : {"\"chain\": 8", "\"chain_ms\"", "\"chain_gbps\": 3800"}) CHECK(jc.find(field) != std::string::npos);
  CHECK(rep.text().find("x8 in a row") != std::string::npos);
  CHECK(rep.all_pass());
  rep.results[0].runs[0].pass = false;
  CHECK_FALSE(rep.all_pass());
  CHECK(rep.text().find("FAIL") != std::string::npos);
}

TEST_CASE("sweep shapes: long contexts at batch 1 and 8, GQA and MHA, every page size") {
  bool b1_64k_gqa = false, b1_64k_mha = false, b8_32k_gqa = false, b8_32k_mha = false;
  std::vector<int> pages;
  for (const SweepShape& s : sweep_shapes()) {
    b1_64k_gqa |= s.batch == 1 && s.len >= 65536 && s.heads == 32 && s.kv_heads == 8;
    b1_64k_mha |= s.batch == 1 && s.len >= 65536 && s.heads == s.kv_heads;
    b8_32k_gqa |= s.batch == 8 && s.len >= 32768 && s.kv_heads == 8;
    b8_32k_mha |= s.batch == 8 && s.len >= 32768 && s.heads == s.kv_heads;
    pages.push_back(s.page_size);
  }
  CHECK((b1_64k_gqa && b1_64k_mha && b8_32k_gqa && b8_32k_mha));
  for (int P : {1, 8, 16, 32, 64}) CHECK(std::find(pages.begin(), pages.end(), P) != pages.end());
}
