// The ch05_fa3_hopper binary as a learner runs it.
#include <doctest/doctest.h>

#include "support/json_check.hpp"
#include "support/run_binary.hpp"

using testing_support::run_binary;

TEST_CASE("ch05_fa3_hopper --json prints one valid JSON object and passes its check") {
  const auto r = run_binary(CH05_BINARY, "--device cpu --n 200 --heads 2 --d 64 --json");
  CHECK(r.exit_code == 0);
  CHECK(testing_support::is_valid_json(r.out));
  CHECK(r.out.find("\"chapter\": \"ch05_fa3_hopper\"") != std::string::npos);
  CHECK(r.out.find("\"pass\": true") != std::string::npos);
}

TEST_CASE("ch05_fa3_hopper text report: the model row and the FP8 accuracy table") {
  const auto r = run_binary(CH05_BINARY, "--device cpu --n 150 --nk 260 --causal --d 64 --kv-heads 2");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("FA3 schedule model") != std::string::npos);
  CHECK(r.out.find("pass") != std::string::npos);
  CHECK(r.out.find("per-block + Hadamard") != std::string::npos);
  CHECK(r.out.find("vs previous chapter") != std::string::npos);
}

TEST_CASE("bad input: one line on stderr and exit code 2") {
  for (const char* args : {"--n 0", "--d 96", "--d 32", "--dtype fp32", "--step 99", "--step v", "--step 11,11", "--step 11,99", "--step 11,", "--batch 0",
                           "--heads 3 --kv-heads 2", "--bogus", "--device quantum", "--n 2000000000 --device cpu",
                           "--launch-only 3 --device cpu", "--launch-only 0", "--launch-only 101"}) {
    CAPTURE(args);
    const auto r = run_binary(CH05_BINARY, args);
    CHECK(r.exit_code == 2);
    CHECK(r.err_lines() == 1);
    CHECK(r.out.empty());
  }
}

TEST_CASE("the final kernels go by name, and the lab's steps need the lab build") {
  // --step final and final-fp8 parse (on the CPU the GPU rows are simply not run).
  const auto r = run_binary(CH05_BINARY, "--device cpu --n 130 --heads 2 --d 64 --no-fp8-table --step 8,final,final-fp8");
  CHECK(r.exit_code == 0);
  CHECK(run_binary(CH05_BINARY, "--device cpu --n 130 --heads 2 --step finalx").exit_code == 2);
#if TUTORIAL_LAB
  CHECK(run_binary(CH05_BINARY, "--device cpu --n 130 --heads 2 --no-fp8-table --lab --step 12,23").exit_code == 0);
  // the backward's lab steps b16 and b17 by number, beside the final backward by name
  CHECK(run_binary(CH05_BINARY, "--device cpu --n 130 --heads 2 --no-fp8-table --step 8 --backward-step 17").exit_code == 0);
  CHECK(run_binary(CH05_BINARY, "--device cpu --n 130 --heads 2 --no-fp8-table --step 8 --backward-steps 16,17,final").exit_code == 0);
  CHECK(run_binary(CH05_BINARY, "--device cpu --n 130 --heads 2 --backward-steps 18").exit_code == 2);
#else
  for (const char* args : {"--lab", "--step 12", "--backward-steps 13", "--backward-step 3", "--backward-step 16",
                           "--backward-steps 17"}) {
    CAPTURE(args);
    const auto bad = run_binary(CH05_BINARY, std::string("--device cpu --n 130 --heads 2 ") + args);
    CHECK(bad.exit_code == 2);
    CHECK(bad.err_lines() == 1);
    CHECK(bad.err.find("TUTORIAL_LAB") != std::string::npos);
  }
#endif
}

TEST_CASE("every supported head dim runs on the CPU") {
  for (const char* d : {"64", "128", "256"}) {
    CAPTURE(d);
    const auto r = run_binary(CH05_BINARY, std::string("--device cpu --n 130 --heads 2 --no-fp8-table --d ") + d);
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("FA3 schedule model") != std::string::npos);
    CHECK(r.out.find("FAIL") == std::string::npos);
  }
}

TEST_CASE("--help exits 0 and lists the chapter's flags") {
  const auto r = run_binary(CH05_BINARY, "--help");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("--step") != std::string::npos);
  CHECK(r.out.find("--no-fp8-table") != std::string::npos);
}
