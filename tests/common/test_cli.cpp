// The shared command line: good values parse, bad ones are UsageErrors.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common/cli.hpp"

using namespace attn;

namespace {

struct Args {
  std::vector<std::string> words;
  std::vector<char*> ptrs;
  explicit Args(std::vector<std::string> w) : words(std::move(w)) {
    words.insert(words.begin(), "prog");
    for (auto& s : words) ptrs.push_back(s.data());
  }
  int argc() { return int(ptrs.size()); }
  char** argv() { return ptrs.data(); }
};

Options parse(const Cli& cli, std::vector<std::string> w) {
  Args a(std::move(w));
  Options o;
  REQUIRE(cli.parse(a.argc(), a.argv(), &o));
  return o;
}

void bad(const Cli& cli, std::vector<std::string> w, const std::string& says) {
  Args a(std::move(w));
  Options o;
  try {
    cli.parse(a.argc(), a.argv(), &o);
    FAIL("accepted bad input: ", says);
  } catch (const UsageError& e) {
    CHECK(std::string(e.what()).find(says) != std::string::npos);
    CHECK(std::string(e.what()).find('\n') == std::string::npos);  // one line
  }
}

Cli make_cli() {
  Problem d;
  d.nq = d.nk = 256;
  Cli cli("prog", "test");
  cli.defaults(d).head_dims({32, 64, 128});
  return cli;
}

}  // namespace

TEST_CASE("good command lines") {
  const Cli cli = make_cli();
  Options o = parse(cli, {});
  CHECK(o.problem.nq == 256);
  o = parse(cli, {"--n", "1000", "--d", "128", "--heads", "8", "--kv-heads", "2", "--causal", "--json",
                  "--dtype", "fp16", "--seed=7", "--device", "cpu", "--sram-bytes", "65536"});
  CHECK(o.problem.nq == 1000);
  CHECK(o.problem.nk == 1000);
  CHECK(o.problem.d == 128);
  CHECK(o.problem.dv == 128);
  CHECK(o.problem.heads == 8);
  CHECK(o.problem.kv_heads == 2);
  CHECK(o.problem.causal);
  CHECK(o.json);
  CHECK(o.seed == 7);
  CHECK(o.device == DeviceChoice::cpu);
  CHECK(o.sram_bytes == 65536);
  CHECK(o.problem.dtype == DType::f16);
  o = parse(cli, {"--nk", "300", "--n", "100"});
  CHECK(o.problem.nq == 100);
  CHECK(o.problem.nk == 300);  // --nk wins whatever the order
  o = parse(cli, {"--heads", "6"});
  CHECK(o.problem.kv_heads == 6);
}

TEST_CASE("bad values are one-line usage errors") {
  const Cli cli = make_cli();
  bad(cli, {"--n", "0"}, "--n");
  bad(cli, {"--n", "-5"}, "--n");
  bad(cli, {"--n", "abc"}, "integer");
  bad(cli, {"--n", "12x"}, "integer");
  bad(cli, {"--n"}, "needs a value");
  bad(cli, {"--n", "99999999999999999999"}, "integer");
  bad(cli, {"--batch", "0"}, "--batch");
  bad(cli, {"--d", "48"}, "head dim 48");
  bad(cli, {"--heads", "6", "--kv-heads", "4"}, "multiple");
  bad(cli, {"--dtype", "int4"}, "--dtype");
  bad(cli, {"--device", "tpu"}, "--device");
  bad(cli, {"--scale", "-1"}, "--scale");
  bad(cli, {"--scale", "nan"}, "number");
  bad(cli, {"--frobnicate"}, "unknown option");
  bad(cli, {"--causal=yes"}, "takes no value");
}

TEST_CASE("chapter options and --help") {
  Cli cli = make_cli();
  int step = 1;
  bool flag = false;
  std::string mode = "a";
  cli.add_int("--step", &step, "kernel step", 1, 5);
  cli.add_flag("--fast", &flag, "go fast");
  cli.add_choice("--mode", &mode, {"a", "b"}, "mode");
  parse(cli, {"--step", "3", "--fast", "--mode", "b"});
  CHECK(step == 3);
  CHECK(flag);
  CHECK(mode == "b");
  bad(cli, {"--step", "6"}, "--step");
  bad(cli, {"--mode", "c"}, "--mode");
  Args a({"--help"});
  Options o;
  CHECK_FALSE(cli.parse(a.argc(), a.argv(), &o));  // --help: caller exits 0
  CHECK(cli.usage().find("--step") != std::string::npos);
}

TEST_CASE("an integer-list option: K[,K...] in range, distinct, in order, and all clears it") {
  Cli cli = make_cli();
  std::vector<int> steps = {7};
  cli.add_int_list("--step", &steps, "kernel steps", 1, 20);
  parse(cli, {"--step", "11,3,18"});
  CHECK(steps == std::vector<int>{11, 3, 18});
  parse(cli, {"--step", "5"});
  CHECK(steps == std::vector<int>{5});
  parse(cli, {"--step", "all"});
  CHECK(steps.empty());
  for (std::vector<std::string> a : {std::vector<std::string>{"--step", "3,3"}, {"--step", "0"}, {"--step", "21"},
                                     {"--step", "3,"}, {"--step", ",3"}, {"--step", "3,,4"}, {"--step", "x"},
                                     {"--step", ""}, {"--step"}})
    bad(cli, a, "--step");
  CHECK(cli.usage().find("--step K[,K]") != std::string::npos);
}

TEST_CASE("--inject-fault: a declared fault parses, list prints the names, anything else is a usage error") {
  Cli cli = make_cli();
  CHECK(parse(cli, {}).fault == Fault::none);
  bad(cli, {"--inject-fault", "last-batch"}, "no fault 'last-batch' here (none)");  // no faults declared
  cli.faults({Fault::last_key_block, Fault::last_batch});
  CHECK(parse(cli, {"--inject-fault", "last-batch"}).fault == Fault::last_batch);
  CHECK(parse(cli, {"--inject-fault=last-key-block"}).fault == Fault::last_key_block);
  bad(cli, {"--inject-fault", "stale-lse"}, "no fault 'stale-lse' here (last-key-block, last-batch)");
  bad(cli, {"--inject-fault", "none"}, "no fault 'none'");
  bad(cli, {"--inject-fault"}, "needs a value");
  Args a({"--inject-fault", "list"});
  Options o;
  CHECK_FALSE(cli.parse(a.argc(), a.argv(), &o));  // list: printed, the caller exits 0
  for (Fault f : all_faults()) CHECK(std::string(fault_help(f)).size() > 10);
}

TEST_CASE("memory that does not fit is a usage error") {
  CHECK_THROWS_AS(require_host_memory(1e18, "a huge problem"), UsageError);
  CHECK_NOTHROW(require_host_memory(1e3, "a tiny problem"));
}
