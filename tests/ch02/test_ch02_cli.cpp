// The ch02_online_softmax binary as a learner runs it.
#include <doctest/doctest.h>

#include "support/json_check.hpp"
#include "support/run_binary.hpp"

using testing_support::run_binary;

TEST_CASE("ch02_online_softmax --json prints one valid JSON object and passes its check") {
  const auto r = run_binary(CH02_BINARY, "--device cpu --n 50 --nk 300 --heads 2 --json");
  CHECK(r.exit_code == 0);
  CHECK(testing_support::is_valid_json(r.out));
  CHECK(r.out.find("\"chapter\": \"ch02_online_softmax\"") != std::string::npos);
  CHECK(r.out.find("\"pass\": true") != std::string::npos);
  CHECK(r.out.find("\"pass\": false") == std::string::npos);
}

TEST_CASE("ch02_online_softmax text report: every variant, its bytes and its check") {
  const auto r = run_binary(CH02_BINARY, "--device cpu --n 77 --nk 91 --causal --dv 32");
  CHECK(r.exit_code == 0);
  for (const char* name : {"naive (no max shift)", "safe, 3 passes", "online, 2 passes", "row on chip",
                           "fused with V, 1 pass", "vs previous chapter"})
    CHECK(r.out.find(name) != std::string::npos);
  CHECK(r.out.find("FAIL") == std::string::npos);
}

TEST_CASE("mean-shifted inputs: the naive row reports its overflow and the run still passes") {
  const auto r = run_binary(CH02_BINARY, "--device cpu --n 8 --nk 500 --inputs mean-shifted");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("overflows, as expected") != std::string::npos);
  const auto below = run_binary(CH02_BINARY, "--device cpu --n 8 --nk 500 --inputs mean-shifted --shift 50");
  CHECK(below.exit_code == 0);
  CHECK(below.out.find("overflows") == std::string::npos);
}

TEST_CASE("bad input: one line on stderr and exit code 2") {
  for (const char* args : {"--n 0", "--nk -3", "--n abc", "--d 48", "--dv 16", "--batch 0", "--heads 3 --kv-heads 2",
                           "--dtype bf16", "--bogus", "--device quantum", "--shift 5",
                           "--inputs mean-shifted --shift 5000", "--nk 2000000000 --n 1000 --device cpu",
                           "--sram-bytes 1024 --device cpu"}) {
    CAPTURE(args);
    const auto r = run_binary(CH02_BINARY, args);
    CHECK(r.exit_code == 2);
    CHECK(r.err_lines() == 1);
    CHECK(r.out.empty());
  }
}

TEST_CASE("--help exits 0 and lists the chapter's options") {
  const auto r = run_binary(CH02_BINARY, "--help");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("--shift") != std::string::npos);
  CHECK(r.out.find("--sram-bytes") != std::string::npos);
}
