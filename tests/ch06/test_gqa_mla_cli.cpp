// ch06_variants gqa / mla as a learner runs them (CPU models; CI runs this on every machine).
#include <doctest/doctest.h>

#include <string>

#include "support/json_check.hpp"
#include "support/run_binary.hpp"

using testing_support::run_binary;

TEST_CASE("gqa with no option: the cache table and both models, checked") {
  const auto r = run_binary(CH06_BINARY, "gqa --device cpu");
  CHECK(r.exit_code == 0);
  for (const char* s : {"Llama-3.1-8B", "Llama-3.1-70B", "Mistral-7B", "Qwen2.5-7B", "Gemma-2-9B", "DeepSeek-V3",
                        "model packed", "model unpacked", "K/V bytes per forward"})
    CHECK(r.out.find(s) != std::string::npos);
  CHECK(r.out.find("FAIL") == std::string::npos);
  CHECK(r.out.find("pass") != std::string::npos);
}

TEST_CASE("mla with no option: both forms against the fp64 MLA reference") {
  const auto r = run_binary(CH06_BINARY, "mla --device cpu");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("model absorb") != std::string::npos);
  CHECK(r.out.find("model decompress") != std::string::npos);
  CHECK(r.out.find("1152 B") != std::string::npos);
  CHECK(r.out.find("FAIL") == std::string::npos);
}

TEST_CASE("mla --form, --heads, --nk, --batch, --n and --json") {
  auto r = run_binary(CH06_BINARY, "mla --device cpu --form absorb --heads 5 --nk 77 --batch 3 --n 2 --pos0 4096");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("model absorb") != std::string::npos);
  CHECK(r.out.find("model decompress") == std::string::npos);
  CHECK(r.out.find("FAIL") == std::string::npos);
  r = run_binary(CH06_BINARY, "mla --device cpu --form decompress --heads 2 --nk 1 --json");
  CHECK(r.exit_code == 0);
  CHECK(testing_support::is_valid_json(r.out));
  CHECK(r.out.find("\"pass\": true") != std::string::npos);
  CHECK(r.out.find("\"pass\": false") == std::string::npos);
  r = run_binary(CH06_BINARY, "gqa --device cpu --heads 32 --kv-heads 1 --n 1 --nk 100 --json --no-table");
  CHECK(r.exit_code == 0);
  CHECK(testing_support::is_valid_json(r.out));
  CHECK(r.out.find("\"pass\": false") == std::string::npos);
}

TEST_CASE("bad input: one line on stderr and exit code 2") {
  const char* bad[] = {"mla --form bogus",     "mla --heads 0",        "mla --nk -3",         "mla --batch x",
                       "mla --d 64",           "mla --kv-heads 2",     "mla --n 5 --nk 3",    "mla --splits -1",
                       "mla --dtype fp16",     "gqa --heads 6 --kv-heads 4", "gqa --sweep=1", "gqa --n 0",
                       "mla --pos0 -5",        "gqa --bogus",          "mla --tile64 wmma",   "mla --tile16 x",
                       "mla --sweep-heads -1", "mla --sweep-heads 129", "mla --combine both",
                       "mla --tile64 wgmma-phased", "mla --sweep-splits -1", "mla --sweep-splits 4,x", "mla --combine-parts 5",
                       "mla --tile64 halves",  "mla --combine clusters", "mla --combine auto=1",
                       "mla --sweep-batch -1", "mla --sweep-batch x",
                       "gqa --combine fused",   // the combine options are mla's: gqa has none
                       // the lab's forms (LAB.md) need --lab
                       "mla --tile64 wgmma-arrive", "mla --tile64 mma", "mla --tile16 ring4", "mla --combine separate",
                       "mla --combine-parts 8", "mla --no-pdl", "mla --sweep-splits 4", "gqa --lab"};
  for (const char* args : bad) {
    const auto r = run_binary(CH06_BINARY, std::string(args) + " --device cpu");
    CAPTURE(args);
    CAPTURE(r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err_lines() == 1);
  }
}

TEST_CASE("mla --lab accepts the lab's forms (LAB.md), which the CPU run ignores") {
  const auto r = run_binary(CH06_BINARY,
                            "mla --device cpu --lab --tile64 wgmma-arrive --tile16 ring4 --combine separate "
                            "--combine-parts 8 --no-pdl --heads 3 --nk 40");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("model absorb") != std::string::npos);
  CHECK(r.out.find("FAIL") == std::string::npos);
}
