// ch04_fa2 as a learner runs it: on the CPU at every head dim and dtype the chapter
// accepts (the CPU model's default on-chip budget must hold the tiles of each), bad
// input as one line on stderr and exit code 2.
#include <doctest/doctest.h>

#include <string>

#include "support/json_check.hpp"
#include "support/run_binary.hpp"

using testing_support::run_binary;

TEST_CASE("ch04_fa2 runs on the CPU at every supported head dim and dtype") {
  for (const char* d : {"64", "128", "256"})
    for (const char* dtype : {"bf16", "fp16"})
      for (const char* causal : {"", " --causal"}) {
        const std::string args = std::string("--device cpu --n 70 --nk 150 --heads 2 --d ") + d + " --dtype " + dtype +
                                 causal + " --json";
        CAPTURE(args);
        const auto r = run_binary(CH04_BINARY, args);
        CHECK(r.exit_code == 0);
        CHECK(r.err.empty());
        CHECK(testing_support::is_valid_json(r.out));
        CHECK(r.out.find("\"pass\": true") != std::string::npos);
        CHECK(r.out.find("\"pass\": false") == std::string::npos);
      }
}

TEST_CASE("ch04_fa2 text report: both models and chapter 03 next to them") {
  const auto r = run_binary(CH04_BINARY, "--device cpu --n 77 --nk 91 --causal --d 64 --heads 4 --kv-heads 2");
  CHECK(r.exit_code == 0);
  for (const char* s : {"FA2 model, forward", "FA2 model, backward", "FA1 (chapter 03)", "pass"}) {
    CAPTURE(s);
    CHECK(r.out.find(s) != std::string::npos);
  }
  CHECK(r.out.find("FAIL") == std::string::npos);
}

TEST_CASE("ch04_fa2 --lab and the lab's steps: refused in a build without the lab, run in one with it") {
  for (const char* args : {"--lab --device cpu --n 64 --no-backward", "--step 7 --device cpu --n 64", "--step 6,9 --device cpu --n 64"}) {
    CAPTURE(args);
    const auto r = run_binary(CH04_BINARY, args);
#if TUTORIAL_LAB
    CHECK(r.exit_code == 0);
#else
    CHECK(r.exit_code == 2);
    CHECK(r.err_lines() == 1);
    CHECK(r.err.find("TUTORIAL_LAB=ON") != std::string::npos);
#endif
  }
}

TEST_CASE("ch04_fa2 --step final names the final kernel") {
  const auto r = run_binary(CH04_BINARY, "--step 6,final --device cpu --n 64 --no-backward --json");
  CHECK(r.exit_code == 0);
  CHECK(testing_support::is_valid_json(r.out));
}

TEST_CASE("ch04_fa2 bad input: one line on stderr and exit code 2") {
  for (const char* args : {"--d 32 --device cpu", "--d 96 --device cpu", "--dtype fp32 --device cpu", "--step 10",
                           "--step -1", "--step 3,3", "--step 0,3", "--step 2,10", "--step 3,", "--step finale", "--n 0", "--heads 3 --kv-heads 2", "--n 512 --sram-bytes 1024 --device cpu"}) {
    CAPTURE(args);
    const auto r = run_binary(CH04_BINARY, args);
    CHECK(r.exit_code == 2);
    CHECK(r.err_lines() == 1);
    CHECK(r.out.empty());
  }
}
