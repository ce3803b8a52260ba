#include <doctest/doctest.h>

#include <sstream>

#include "common/report.hpp"
#include "support/json_check.hpp"

using namespace attn;

namespace {

Report sample() {
  Report r;
  r.chapter = "chXX";
  r.title = "a \"quoted\" title";
  r.problem.nq = 10;
  r.mode = "CPU models only";
  ResultRow a;
  a.impl = "model";
  a.device = "cpu";
  a.hbm_read_bytes = 100;
  a.hbm_write_bytes = 50;
  a.flops = 1e6;
  a.pass = true;
  ResultRow b;
  b.impl = "kernel";
  b.device = "cuda";
  b.flops = 2e12;
  b.hbm_read_bytes = 1e9;
  b.hbm_write_bytes = 1e9;
  b.bound = Bound::compute;
  b.set_time(4.0);
  b.pass = true;
  r.rows = {a, b};
  r.ceilings.gemm_tflops = 1000.0;
  r.apply_ceilings();
  return r;
}

}  // namespace

TEST_CASE("rates follow from time, flops and bytes, and shares from the ceiling") {
  const Report r = sample();
  CHECK(*r.rows[1].tflops == doctest::Approx(500.0));
  CHECK(*r.rows[1].gbps == doctest::Approx(500.0));
  CHECK(*r.rows[1].ceiling_share == doctest::Approx(0.5));
  CHECK_FALSE(r.rows[0].ceiling_share.has_value());
}

TEST_CASE("--json output is valid JSON with every required field, null when not measured") {
  std::ostringstream s;
  sample().print_json(s);
  const std::string j = s.str();
  CHECK(testing_support::is_valid_json(j));
  for (const char* key : {"\"chapter\"", "\"problem\"", "\"results\"", "\"impl\"", "\"device\"", "\"max_abs_err\"",
                          "\"rel_l2_err\"", "\"hbm_read_bytes\"", "\"hbm_write_bytes\"", "\"flops\"",
                          "\"extra_bytes\"", "\"time_ms\"", "\"tflops\"", "\"gbps\""})
    CHECK_MESSAGE(j.find(key) != std::string::npos, key);
  CHECK(j.find("\"time_ms\": null") != std::string::npos);  // the model row has no time
  CHECK(j.find("\\\"quoted\\\"") != std::string::npos);
  CHECK_FALSE(testing_support::is_valid_json("{\"a\": 1,}"));
  CHECK_FALSE(testing_support::is_valid_json("{\"a\": nan}"));
}

TEST_CASE("a failing row makes the exit code 1 and the text table shows FAIL") {
  Report r = sample();
  std::ostringstream s;
  CHECK(r.emit(s, false) == 0);
  r.rows[0].pass = false;
  std::ostringstream t;
  CHECK(r.emit(t, false) == 1);
  CHECK(t.str().find("FAIL") != std::string::npos);
}

TEST_CASE("a row that was not compared with fp64 prints unchecked and no speed") {
  Report r = sample();
  r.rows[1].pass.reset();
  std::ostringstream t;
  CHECK(r.emit(t, false) == 0);
  const std::string text = t.str();
  CHECK(text.find("unchecked") != std::string::npos);
  CHECK(text.find("500") == std::string::npos);  // neither its TFLOP/s nor its GB/s
  std::ostringstream j;
  r.print_json(j);
  CHECK(j.str().find("\"tflops\": null") != std::string::npos);
  CHECK(j.str().find("\"tflops\": 500") == std::string::npos);
  CHECK(j.str().find("\"time_ms\": 4") == std::string::npos);
  r.rows[1].pass = true;
  std::ostringstream k;
  r.print_json(k);
  CHECK(k.str().find("\"tflops\": 500") != std::string::npos);
}
