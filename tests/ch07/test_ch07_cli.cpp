// The ch07_paged_radix binary as a learner runs it.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "support/json_check.hpp"
#include "support/run_binary.hpp"

using testing_support::run_binary;

TEST_CASE("ch07_paged_radix with no argument tours paged, decode and radix") {
  const auto r = run_binary(CH07_BINARY, "--device cpu");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("copy-on-write") != std::string::npos);
  CHECK(r.out.find("model v2") != std::string::npos);
  CHECK(r.out.find("pass") != std::string::npos);
  CHECK(r.out.find("hit rate") != std::string::npos);
  CHECK(r.out.find("root") != std::string::npos);
}

TEST_CASE("decode --json prints one valid JSON object and passes its check") {
  const auto r = run_binary(CH07_BINARY, "decode --device cpu --batch 5 --nk 300 --page-size 8 --json");
  CHECK(r.exit_code == 0);
  CHECK(testing_support::is_valid_json(r.out));
  CHECK(r.out.find("\"chapter\": \"ch07_paged_radix\"") != std::string::npos);
  CHECK(r.out.find("\"pass\": false") == std::string::npos);
  CHECK(r.out.find("\"pass\": true") != std::string::npos);
}

TEST_CASE("decode text report: both models, the heuristic, shared prefix and GQA") {
  const auto r = run_binary(CH07_BINARY,
                            "decode --device cpu --batch 3 --nk 700 --lengths equal --shared-prefix 256 --heads 8 "
                            "--kv-heads 1 --d 64 --splits 3 --inputs mean-shifted");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("model v1") != std::string::npos);
  CHECK(r.out.find("model v2, S=3") != std::string::npos);
  CHECK(r.out.find("heuristic") != std::string::npos);
  CHECK(r.out.find("FAIL") == std::string::npos);
}

TEST_CASE("paged and radix print their tables, and their JSON is valid") {
  auto r = run_binary(CH07_BINARY, "paged --seqs 200");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("contiguous, max length") != std::string::npos);
  CHECK(r.out.find("paged, P = 16") != std::string::npos);
  r = run_binary(CH07_BINARY, "paged --seqs 200 --json");
  CHECK(r.exit_code == 0);
  CHECK(testing_support::is_valid_json(r.out));
  r = run_binary(CH07_BINARY, "radix --requests 40 --workload chat");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("radix") != std::string::npos);
  CHECK(r.out.find("FAIL") == std::string::npos);
  r = run_binary(CH07_BINARY, "radix --requests 30 --json --policy lfu");
  CHECK(r.exit_code == 0);
  CHECK(testing_support::is_valid_json(r.out));
  CHECK(r.out.find("\"valid\": false") == std::string::npos);
  r = run_binary(CH07_BINARY, "radix --draw");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("every invariant holds") != std::string::npos);
}

TEST_CASE("bad input: one line on stderr and exit code 2") {
  for (const char* args :
       {"bogus", "--json", "--bogus", "decode --n 2", "decode --page-size 12", "decode --page-size 0", "decode --d 96",
        "decode --dtype fp16", "decode --heads 6 --kv-heads 4", "decode --batch 0", "decode --causal",
        "decode --splits -1", "decode --lengths wobbly", "decode --device cpu --sweep",
        "decode --device cpu --sram-bytes 65536", "--page-size 12", "paged --seqs 0", "paged --max-len 1",
        "radix --workload nope", "radix --requests 5 --pool-pages 4", "radix --draw --json", "radix --page-size 0",
        "decode --kv-dtype fp4", "decode --kv-dtype fp8 --d 64", "decode --kv-dtype int4 --d 64", "decode --accuracy --sweep",
        "decode --sweep-shapes nope", "decode --since v11", "decode --since v99", "decode --chain -1", "decode --chain 65", "decode --since 7", "swap --pool-pages 0", "swap --copy-gbps -1"}) {
    const std::string a = args;
    CAPTURE(a);
    const auto r = run_binary(CH07_BINARY, a);
    CHECK(r.exit_code == 2);
    CHECK(r.err_lines() == 1);
    CHECK(r.out.empty());
  }
}

TEST_CASE("--help of every subcommand exits 0") {
  for (const char* args : {"paged --help", "decode --help", "radix --help", "swap --help", "--help"}) {
    const std::string a = args;
    CAPTURE(a);
    const auto r = run_binary(CH07_BINARY, a);
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("usage") != std::string::npos);
  }
  CHECK(run_binary(CH07_BINARY, "decode --help").out.find("--page-size") != std::string::npos);
}

TEST_CASE("decode over an 8-bit or INT4 cache: the models pass, the bytes are about half (a quarter) of bf16's") {
  double bytes[4] = {0, 0, 0, 0};
  const char* kinds[4] = {"bf16", "fp8", "int8", "int4"};
  for (int i = 0; i < 4; ++i) {
    CAPTURE(kinds[i]);
    const auto r = run_binary(CH07_BINARY, std::string("decode --device cpu --batch 4 --nk 600 --kv-dtype ") + kinds[i]);
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("FAIL") == std::string::npos);
    const std::size_t at = r.out.find("KV bytes per step: ");
    REQUIRE(at != std::string::npos);
    bytes[i] = std::stod(r.out.substr(at + 19));
  }
  CHECK(bytes[1] < 0.52 * bytes[0]);
  CHECK(bytes[1] > 0.49 * bytes[0]);
  CHECK(bytes[2] == bytes[1]);
  CHECK(bytes[3] < 0.26 * bytes[0]);  // half a byte per value, plus the same scales as the 8-bit pools
  CHECK(bytes[3] > 0.25 * bytes[0]);
}

TEST_CASE("decode --accuracy: bf16 is the most accurate, and the rotation helps INT8 on outlier channels") {
  const auto r = run_binary(CH07_BINARY, "decode --accuracy --json");
  CHECK(r.exit_code == 0);
  CHECK(testing_support::is_valid_json(r.out));
  CHECK(r.out.find("\"outlier channels\"") != std::string::npos);
  CHECK(r.out.find("int8 per page + Hadamard") != std::string::npos);
  CHECK(r.out.find("int4 per page") != std::string::npos);
  CHECK(r.out.find("int4 per token, 32 channels") != std::string::npos);
}

namespace {
// The "inputs" and "name" strings and the "ref_max", "rel_l2" and "max_abs" numbers of an
// accuracy table's JSON, in their order (the recorded file wraps the binary's JSON in its own).
std::vector<std::pair<std::string, std::string>> accuracy_fields(const std::string& json) {
  std::vector<std::pair<std::string, std::string>> f;
  std::size_t at = 0;
  while ((at = json.find('"', at)) != std::string::npos) {
    const std::size_t end = json.find('"', at + 1);
    if (end == std::string::npos) break;
    const std::string key = json.substr(at + 1, end - at - 1);
    at = end + 1;
    if (json.compare(at, 2, ": ") != 0) continue;  // a value, not a key
    std::size_t v = at + 2;
    if (key == "inputs" || key == "name") {
      const std::size_t close = json.find('"', v + 1);
      f.emplace_back(key, json.substr(v + 1, close - v - 1));
      at = close + 1;
    } else if (key == "ref_max" || key == "rel_l2" || key == "max_abs") {
      const std::size_t stop = json.find_first_of(",}]\n", v);
      f.emplace_back(key, json.substr(v, stop - v));
    }
  }
  return f;
}
}  // namespace

TEST_CASE("the recorded accuracy run (bench/recorded/cpu/ch07_kv_accuracy.json) is what the binary prints now") {
  const std::string rec = testing_support::slurp(CH07_ACCURACY_RECORD);
  const std::string tag = "\"command\": \"ch07_paged_radix ";
  const std::size_t at = rec.find(tag);
  REQUIRE(at != std::string::npos);
  const std::size_t from = at + tag.size();
  const std::string args = rec.substr(from, rec.find('"', from) - from);
  REQUIRE(args.find("--accuracy") != std::string::npos);
  const auto r = run_binary(CH07_BINARY, args);
  REQUIRE(r.exit_code == 0);
  const auto want = accuracy_fields(rec), got = accuracy_fields(r.out);
  REQUIRE(want.size() > 30);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    CAPTURE(want[i].first);
    CAPTURE(want[i].second);
    CAPTURE(got[i].second);
    REQUIRE(got[i].first == want[i].first);
    if (want[i].first == "inputs" || want[i].first == "name") {
      CHECK(got[i].second == want[i].second);
    } else {  // six significant digits; another compiler may round an fp64 sum in another order
      const double a = std::strtod(want[i].second.c_str(), nullptr), b = std::strtod(got[i].second.c_str(), nullptr);
      CHECK(std::abs(a - b) <= 2e-5 * std::abs(a));
    }
  }
}

TEST_CASE("swap: counts on any machine, every run sound, and times with given rates") {
  auto r = run_binary(CH07_BINARY, "swap --requests 60");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("FAIL") == std::string::npos);
  CHECK(r.out.find("counts only") != std::string::npos);
  r = run_binary(CH07_BINARY, "swap --requests 60 --copy-gbps 20 --prefill-tflops 500 --json");
  CHECK(r.exit_code == 0);
  CHECK(testing_support::is_valid_json(r.out));
  CHECK(r.out.find("\"swap_s\"") != std::string::npos);
  CHECK(r.out.find("\"valid\": false") == std::string::npos);
}
