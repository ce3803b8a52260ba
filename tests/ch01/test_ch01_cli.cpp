// The ch01_naive binary as a learner runs it.
#include <doctest/doctest.h>

#include "support/json_check.hpp"
#include "support/run_binary.hpp"

using testing_support::run_binary;

TEST_CASE("ch01_naive --json prints one valid JSON object and passes its check") {
  const auto r = run_binary(CH01_BINARY, "--device cpu --n 100 --heads 2 --json");
  CHECK(r.exit_code == 0);
  CHECK(testing_support::is_valid_json(r.out));
  CHECK(r.out.find("\"chapter\": \"ch01_naive\"") != std::string::npos);
  CHECK(r.out.find("\"pass\": true") != std::string::npos);
}

TEST_CASE("ch01_naive text report") {
  const auto r = run_binary(CH01_BINARY, "--device cpu --n 77 --nk 91 --causal --d 32");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("naive model") != std::string::npos);
  CHECK(r.out.find("pass") != std::string::npos);
  CHECK(r.out.find("vs previous chapter") != std::string::npos);
}

TEST_CASE("bad input: one line on stderr and exit code 2") {
  for (const char* args : {"--n 0", "--n -3", "--n abc", "--d 48", "--d 0", "--batch 0", "--heads 3 --kv-heads 2",
                           "--bogus", "--device quantum", "--n 2000000000 --device cpu",
                           "--n 1024 --sram-bytes 1024 --device cpu", "--dtype fp8"}) {
    CAPTURE(args);
    const auto r = run_binary(CH01_BINARY, args);
    CHECK(r.exit_code == 2);
    CHECK(r.err_lines() == 1);
    CHECK(r.out.empty());
  }
}

TEST_CASE("--help exits 0 and lists the options") {
  const auto r = run_binary(CH01_BINARY, "--help");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("--sram-bytes") != std::string::npos);
}
