// ch06_variants mask from the command line: the default tour runs and passes, every
// bad mask option exits 2 with one line on stderr, --map prints and writes the map.
#include <doctest/doctest.h>

#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "chapters/06_variants/masks/model_cases.hpp"
#include "chapters/06_variants/parts.hpp"

namespace {

struct Run {
  int code;
  std::string out, err;
  int err_lines() const {
    int n = 0;
    std::istringstream s(err);
    for (std::string line; std::getline(s, line);) n += !line.empty();
    return n;
  }
};

/// mask_main with `args`, stdout and stderr captured.
Run run_mask(const std::vector<std::string>& args) {
  std::vector<std::string> store = {"ch06_variants mask"};
  store.insert(store.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : store) argv.push_back(s.data());
  std::ostringstream out, err;
  auto* old_out = std::cout.rdbuf(out.rdbuf());
  auto* old_err = std::cerr.rdbuf(err.rdbuf());
  const int code = attn::ch06::mask_main(int(argv.size()), argv.data());
  std::cout.rdbuf(old_out);
  std::cerr.rdbuf(old_err);
  return {code, out.str(), err.str()};
}

}  // namespace

TEST_CASE("mask CLI: bad mask options exit 2 with one line") {
  const std::vector<std::vector<std::string>> bad = {
      {"--mask", "window", "--window", "-1"},
      {"--mask", "window", "--window", "4,-2"},
      {"--mask", "window", "--window", "1,2,3"},
      {"--mask", "window", "--window", "abc"},
      {"--mask", "window", "--window"},
      {"--mask", "document", "--doc-lens", "100,100"},          // N = 333
      {"--mask", "document", "--doc-lens", "333,0"},
      {"--mask", "document", "--n", "10", "--docs", "11"},
      {"--mask", "document", "--nk", "400"},
      {"--mask", "softcap", "--softcap", "0"},
      {"--mask", "softcap", "--softcap", "-3"},
      {"--mask", "softcap", "--softcap", "x"},
      {"--mask", "chunked", "--chunk", "0"},
      {"--mask", "sink", "--sinks", "-1"},
      {"--mask", "prefix", "--prefix", "-5"},
      {"--mask", "strided", "--stride", "0"},
      {"--mask", "fixed", "--block", "0"},
      {"--mask", "fixed", "--block", "16", "--summary", "17"},
      {"--mask", "fixed", "--summary", "-1"},
      {"--mask", "fixed", "--stride", "8"},                     // strided's option
      {"--mask", "longformer", "--window", "-1"},
      {"--mask", "longformer", "--window", "4,4"},              // one value: keys each side
      {"--mask", "longformer", "--globals", "-1"},
      {"--mask", "longformer", "--causal"},
      {"--mask", "bigbird", "--random", "65"},
      {"--mask", "bigbird", "--random", "x"},
      {"--mask", "bigbird", "--summary", "2"},
      {"--mask", "causal", "--globals", "2"},
      {"--mask", "window", "--chunk", "64"},                    // an option of another variant
      {"--mask", "window", "--causal"},
      {"--mask", "sink", "--window", "5,5"},
      {"--mask", "nosuchmask"},
      {"--window", "-1"},                                       // the tour: a bad value is still bad
      {"--softcap", "0"},
      {"--windows", "128,256"},                                 // the sweep belongs to --mask window
      {"--mask", "causal", "--windows", "128"},
      {"--mask", "window", "--windows", "64,-1"},
      {"--mask", "window", "--alone"},                          // --alone belongs to --mask document
      {"--mask", "window", "--gpu-path", "sm70"},
      {"--mask", "causal", "--d", "96"},
      {"--mask", "causal", "--hopper-step", "6"},               // the sm90a steps are 0 to 4, the lab's 5, and final
      {"--mask", "causal", "--hopper-step", "4,finale"},
      {"--mask", "causal", "--hopper-step", "final,"},
      {"--mask", "causal", "--hopper-step", "0,-1"},
      {"--mask", "causal", "--hopper-step"},
      {"--mask", "causal", "--ctas", "-1"},
      {"--mask", "learned-sink", "--window", "-1"},             // a sliding window on the sink or softcap: L >= 0
      {"--mask", "softcap", "--window", "-3"},
      {"--mask", "softcap", "--window", "64,0"},                // one value L
      {"--mask", "alibi", "--window", "64"},                    // only learned-sink and softcap take one
      {"--model", "llama"},                                     // --model: no such case
      {"--model"},
      {"--model", "gpt-oss", "--mask", "softcap"},              // --model with a conflicting option
      {"--model", "gemma2", "--d", "128"},
      {"--model", "gpt-oss", "--dv", "128"},
      {"--model", "mistral", "--heads", "4"},
      {"--model", "gpt-oss", "--kv-heads", "4"},
      {"--model", "gpt-oss", "--window", "64"},
      {"--model", "gemma2", "--softcap", "30"},
      {"--model", "mistral", "--docs", "3"},
      {"--model", "packed-docs", "--doc-lens", "100,233"},
      {"--model", "packed-docs", "--batch", "2"},               // documents pack into one batch
      {"--model", "packed-docs", "--n", "10", "--docs", "11"},
  };
  for (const auto& args : bad) {
    std::string line;
    for (const auto& a : args) line += a + " ";
    CAPTURE(line);
    const Run r = run_mask(args);
    CHECK(r.code == 2);
    CHECK(r.err_lines() == 1);
    CHECK(r.err.find("error") != std::string::npos);
  }
}

TEST_CASE("mask CLI: --hopper-step takes the steps by number and the final kernel by name") {
  for (const char* steps : {"final", "1,2,3,4,final", "0"}) {
    CAPTURE(steps);
    const Run r = run_mask({"--device", "cpu", "--no-backward", "--mask", "causal", "--n", "64", "--hopper-step", steps});
    CHECK(r.code == 0);
  }
}

TEST_CASE("mask CLI: the lab's step 5 runs in a lab build and is bad input without the lab") {
  const Run r = run_mask({"--device", "cpu", "--no-backward", "--mask", "causal", "--n", "64", "--hopper-step", "4,5,final"});
  if (TUTORIAL_LAB) {
    CHECK(r.code == 0);
  } else {
    CHECK(r.code == 2);
    CHECK(r.err_lines() == 1);
    CHECK(r.err.find("a lab step") != std::string::npos);
  }
}

TEST_CASE("mask CLI: in the tour each option applies to its own variant") {
  const Run r = run_mask({"--device", "cpu", "--no-backward", "--n", "256", "--window", "100,0", "--chunk", "64",
                          "--softcap", "20", "--doc-lens", "56,200"});
  CHECK(r.code == 0);
  CHECK(r.out.find("window: window (left 100, right 0)") != std::string::npos);
  CHECK(r.out.find("chunks of 64") != std::string::npos);
  CHECK(r.out.find("cap 20") != std::string::npos);
  CHECK(r.out.find("2 documents (56 200)") != std::string::npos);
  CHECK(r.out.find("sink tokens + window 64") != std::string::npos);  // --window is the window variant's
}

TEST_CASE("mask CLI: --windows sweeps the window on one set of inputs, --alone runs each document alone") {
  const Run w = run_mask({"--device", "cpu", "--no-backward", "--mask", "window", "--window", "32,0", "--windows",
                          "0,64,1000", "--n", "200"});
  CHECK(w.code == 0);
  for (const char* row : {"window L=0: model forward", "window L=64: model forward", "window L=1000: model forward"})
    CHECK(w.out.find(row) != std::string::npos);
  CHECK(w.out.find("FAIL") == std::string::npos);
  const Run d = run_mask({"--device", "cpu", "--no-backward", "--mask", "document", "--doc-lens", "1,120,79", "--n",
                          "200", "--causal", "--alone"});
  CHECK(d.code == 0);
  for (const char* row : {"document 0 alone (1)", "document 1 alone (120)", "document 2 alone (79)"})
    CHECK(d.out.find(row) != std::string::npos);
  CHECK(d.out.find("FAIL") == std::string::npos);
}

TEST_CASE("mask CLI: the default run checks every variant on the CPU model and passes") {
  const Run r = run_mask({"--device", "cpu"});
  CHECK(r.code == 0);
  for (const char* name : {"causal", "window", "chunked", "prefix", "document", "sink", "learned-sink", "alibi",
                           "softcap", "custom", "strided", "fixed", "longformer", "bigbird"}) {
    CAPTURE(name);
    CHECK(r.out.find(std::string(name) + ": model forward") != std::string::npos);
    CHECK(r.out.find(std::string(name) + ": model backward") != std::string::npos);
  }
}

TEST_CASE("mask CLI: --map prints keep / skip / partial per tile and writes an SVG") {
  const std::string path = "/tmp/attn_ch06_mask_test.svg";
  std::remove(path.c_str());
  const Run r = run_mask({"--device", "cpu", "--mask", "window", "--window", "200,0", "--n", "1024", "--heads", "1",
                          "--map", "--svg", path});
  CHECK(r.code == 0);
  CHECK(r.out.find("block map") != std::string::npos);
  CHECK(r.out.find('#') != std::string::npos);  // full tiles
  CHECK(r.out.find('+') != std::string::npos);  // partial tiles
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  CHECK(s.str().find("<svg") != std::string::npos);
  CHECK(s.str().find("</svg>") != std::string::npos);
}

TEST_CASE("mask CLI: --json prints one object with a row per kernel") {
  const Run r = run_mask({"--device", "cpu", "--mask", "softcap", "--softcap", "5", "--causal", "--json"});
  CHECK(r.code == 0);
  CHECK(r.out.find("\"results\"") != std::string::npos);
  CHECK(r.out.find("softcap: model forward") != std::string::npos);
  CHECK(r.out.find("\"pass\": false") == std::string::npos);
}

TEST_CASE("mask CLI: --window L puts a causal sliding window on learned-sink and softcap") {
  const Run r = run_mask({"--device", "cpu", "--mask", "softcap", "--softcap", "5", "--window", "40", "--n", "200"});
  CHECK(r.code == 0);
  CHECK(r.out.find("cap 5, sliding window 40 (causal)") != std::string::npos);
  CHECK(r.out.find("FAIL") == std::string::npos);
  const Run s = run_mask({"--device", "cpu", "--no-backward", "--mask", "learned-sink", "--window", "0", "--n", "150",
                          "--nk", "190"});
  CHECK(s.code == 0);
  CHECK(s.out.find("one sink logit per head, sliding window 0 (causal)") != std::string::npos);
  CHECK(s.out.find("FAIL") == std::string::npos);
  const Run plain = run_mask({"--device", "cpu", "--no-backward", "--mask", "learned-sink", "--n", "100"});
  CHECK(plain.code == 0);
  CHECK(plain.out.find("sliding") == std::string::npos);  // no --window: no window, as before
}

TEST_CASE("mask CLI: --model runs a published model's heads, head dim and mask, rows named after it") {
  struct Case {
    const char* name;
    const char* describe;
    const char* heads;
  };
  for (const Case& c : {Case{"gpt-oss", "learned-sink, one sink logit per head, sliding window 127 (causal)", "Hq=64 Hkv=8"},
                        Case{"gemma2", "softcap, cap 50, sliding window 4095 (causal)", "Hq=16 Hkv=8"},
                        Case{"mistral", "window (left 4095, right 0)", "Hq=32 Hkv=8"},
                        Case{"packed-docs", "document, 4 documents", "Hq=32 Hkv=8"}}) {
    const std::string name = c.name;
    CAPTURE(name);
    const Run r = run_mask({"--device", "cpu", "--model", name, "--n", "160", "--check-mflops", "300"});
    CAPTURE(r.err);
    CHECK(r.code == 0);
    CHECK(r.out.find(std::string(c.name) + ": model forward") != std::string::npos);
    CHECK(r.out.find(std::string(c.name) + ": model backward") != std::string::npos);
    CHECK(r.out.find(c.describe) != std::string::npos);
    CHECK(r.out.find(attn::ch06::find_model_case(name)->source) != std::string::npos);  // the note names the source
    CHECK(r.out.find(c.heads) != std::string::npos);
    CHECK(r.out.find("FAIL") == std::string::npos);
  }
  // The options that agree with the case are fine.
  const Run same = run_mask({"--device", "cpu", "--no-backward", "--model", "gpt-oss", "--mask", "learned-sink", "--d",
                             "64", "--heads", "64", "--kv-heads", "8", "--causal", "--n", "100"});
  CHECK(same.code == 0);
  const Run docs = run_mask({"--device", "cpu", "--no-backward", "--model", "packed-docs", "--docs", "9", "--n", "300"});
  CHECK(docs.code == 0);
  CHECK(docs.out.find("document, 9 documents") != std::string::npos);
}

TEST_CASE("mask CLI: the sparse patterns run on the CPU with their parameters, and pass") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> runs = {
      {{"--mask", "strided", "--stride", "13"}, "strided (Sparse Transformer, merged), stride 13, causal"},
      {{"--mask", "fixed", "--block", "20", "--summary", "3"}, "blocks of 20, 3 summary columns, causal"},
      {{"--mask", "longformer", "--window", "9", "--globals", "3"}, "longformer, window 9 each side, 3 global tokens"},
      {{"--mask", "bigbird", "--block", "16", "--globals", "1", "--random", "2"},
       "bigbird (ITC), blocks of 16, 3-block window, 1 global blocks, 2 random blocks"},
      {{"--mask", "bigbird", "--nk", "260"}, "blocks of 64, 3-block window, 2 global blocks, 3 random blocks"},
  };
  for (const auto& [args, want] : runs) {
    std::vector<std::string> a = {"--device", "cpu", "--n", "150"};
    a.insert(a.end(), args.begin(), args.end());
    const Run r = run_mask(a);
    CAPTURE(r.out);
    CAPTURE(r.err);
    CHECK(r.code == 0);
    CHECK(r.out.find(want) != std::string::npos);
    CHECK(r.out.find("model backward") != std::string::npos);
    CHECK(r.out.find("FAIL") == std::string::npos);
  }
}
