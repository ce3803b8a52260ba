// The ch03_fa1 binary as a learner runs it.
#include <doctest/doctest.h>

#include <string>

#include "support/json_check.hpp"
#include "support/run_binary.hpp"

using testing_support::run_binary;

namespace {

/// The first number after "key": in a JSON text (the first result row's field).
double first_number(const std::string& json, const std::string& key) {
  const std::size_t at = json.find("\"" + key + "\": ");
  REQUIRE(at != std::string::npos);
  return std::stod(json.substr(at + key.size() + 4));
}

}  // namespace

TEST_CASE("ch03_fa1 --json prints one valid JSON object and passes its checks") {
  const auto r = run_binary(CH03_BINARY, "--device cpu --n 100 --heads 2 --json");
  CHECK(r.exit_code == 0);
  CHECK(testing_support::is_valid_json(r.out));
  CHECK(r.out.find("\"chapter\": \"ch03_fa1\"") != std::string::npos);
  CHECK(r.out.find("\"pass\": true") != std::string::npos);
  CHECK(r.out.find("\"pass\": false") == std::string::npos);
}

TEST_CASE("ch03_fa1 text report: both models, chapter 01 next to them, Theorem 2") {
  const auto r = run_binary(CH03_BINARY, "--device cpu --n 77 --nk 91 --causal --d 32 --heads 4 --kv-heads 2");
  CHECK(r.exit_code == 0);
  for (const char* s : {"FA1 forward model", "FA1 backward model", "ch01 naive forward", "ch01 naive backward",
                        "Theorem 2", "extra HBM", "vs previous chapter", "chapter 01 moves", "pass"}) {
    CAPTURE(s);
    CHECK(r.out.find(s) != std::string::npos);
  }
  CHECK(r.out.find("FAIL") == std::string::npos);
}

TEST_CASE("--bc halves and doubles the counted traffic as predicted, --br changes nothing") {
  const std::string base = "--device cpu --n 512 --heads 1 --d 32 --json --br 16";
  const double b32 = first_number(run_binary(CH03_BINARY, base + " --bc 32").out, "hbm_read_bytes");
  const double b16 = first_number(run_binary(CH03_BINARY, base + " --bc 16").out, "hbm_read_bytes");
  const double r8 = first_number(run_binary(CH03_BINARY, "--device cpu --n 512 --heads 1 --d 32 --json --br 8 --bc 32").out,
                                 "hbm_read_bytes");
  CHECK(b16 / b32 > 1.9);
  CHECK(b16 / b32 < 2.05);
  CHECK(r8 == b32);
}

TEST_CASE("bad input: one line on stderr and exit code 2") {
  for (const char* args : {"--n 0", "--n -3", "--n abc", "--d 48", "--d 16", "--d 0", "--batch 0",
                           "--heads 3 --kv-heads 2", "--bogus", "--device quantum", "--n 2000000000 --device cpu",
                           "--dtype fp8", "--br -1", "--bc x", "--device cpu --n 64 --sram-bytes 256",
                           "--device cpu --n 64 --br 100000"}) {
    CAPTURE(args);
    const auto r = run_binary(CH03_BINARY, args);
    CHECK(r.exit_code == 2);
    CHECK(r.err_lines() == 1);
    CHECK(r.out.empty());
  }
}

TEST_CASE("--help exits 0 and lists the chapter's options") {
  const auto r = run_binary(CH03_BINARY, "--help");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("--sram-bytes") != std::string::npos);
  CHECK(r.out.find("--br") != std::string::npos);
  CHECK(r.out.find("--bc") != std::string::npos);
}
