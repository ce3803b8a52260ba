#pragma once
/// \file cli.hpp
/// \brief The command line every chapter binary shares.
///
///     chNN_name [--n N] [--nk N] [--d D] [--dv D] [--batch B] [--heads H] [--kv-heads H]
///               [--causal] [--dtype fp32|fp16|bf16] [--scale S] [--inputs DIST]
///               [--seed S] [--device cpu|cuda|auto] [--bench] [--sram-bytes M]
///               [--check-all] [--inject-fault NAME|list] [--json] [--help]
///
/// Chapters add their own flags with add_int() / add_flag() / add_choice() / add_int_list(). Any bad
/// value (zero, negative, not a number, an unsupported head dim, a size that does
/// not fit in host or device memory) is a UsageError: one line on stderr, exit 2.

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.hpp"
#include "common/faults.hpp"
#include "common/inputs.hpp"
#include "common/problem.hpp"

namespace attn {

enum class DeviceChoice { cpu, cuda, automatic };

struct Options {
  Problem problem;
  uint64_t seed = 1;
  Dist dist = Dist::normal;
  DeviceChoice device = DeviceChoice::automatic;
  bool bench = false;                   ///< also measure the ceilings and the chapter's sweep
  std::size_t sram_bytes = 96 * 1024;   ///< on-chip budget M of the CPU models
  bool json = false;
  bool check_all = false;               ///< fp64-check every row, however large the problem
  Fault fault = Fault::none;            ///< --inject-fault: the bug to put into every implementation it applies to
};

class Cli {
 public:
  Cli(std::string program, std::string summary);

  /// The chapter's default problem (what `./tutorial run` shows).
  Cli& defaults(const Problem& p);
  /// Head dims the chapter's kernels support; any other --d is rejected.
  Cli& head_dims(std::vector<int> dims);
  Cli& dtypes(std::vector<DType> types);
  /// The chapter's default on-chip budget for its CPU models (--sram-bytes).
  Cli& sram_default(std::size_t bytes);
  /// The faults `--inject-fault` accepts here (common/faults.hpp); `--inject-fault list` prints them.
  Cli& faults(std::vector<Fault> f);

  void add_int(const std::string& flag, int* target, const std::string& help, int min_value = 1,
               int max_value = 1 << 30);
  void add_flag(const std::string& flag, bool* target, const std::string& help);
  void add_choice(const std::string& flag, std::string* target, std::vector<std::string> choices,
                  const std::string& help);
  /// `FLAG K[,K...]`: distinct integers in [lo, hi], kept in the order given; `FLAG all`
  /// clears the list (the caller reads an empty list as "all").
  void add_int_list(const std::string& flag, std::vector<int>* target, const std::string& help, int lo, int hi);
  /// The same, where an entry may also be one of `names` (a word standing for its number,
  /// as `--step final` for the final kernel's step number).
  void add_int_list(const std::string& flag, std::vector<int>* target, const std::string& help, int lo, int hi,
                    std::vector<std::pair<std::string, int>> names);

  /// Parses argv. Throws UsageError on bad input; prints usage() and returns
  /// false for --help (the caller exits 0).
  bool parse(int argc, char** argv, Options* out) const;
  std::string usage() const;
  const std::string& program() const { return program_; }

 private:
  struct Extra {
    std::string flag, help, kind;
    int* i = nullptr;
    bool* b = nullptr;
    std::string* s = nullptr;
    std::vector<int>* list = nullptr;
    int lo = 0, hi = 0;
    std::vector<std::pair<std::string, int>> names;  ///< a list's named entries
    std::vector<std::string> choices;
  };
  std::string program_, summary_;
  Problem defaults_;
  std::vector<int> head_dims_;
  std::vector<DType> dtypes_ = {DType::f32, DType::f16, DType::bf16};
  std::size_t sram_default_ = 96 * 1024;
  std::vector<Extra> extras_;
  std::vector<Fault> faults_;
};

/// Strict integer parsing: the whole string, in range, else UsageError naming the flag.
long long parse_integer(const std::string& flag, const std::string& text, long long lo, long long hi);
double parse_number(const std::string& flag, const std::string& text);

/// Runs a chapter's body: --help exits 0, UsageError prints "program: error: ..."
/// and exits 2, and any other exception is reported in one line with exit 2.
int run_chapter(int argc, char** argv, const Cli& cli, const std::function<int(const Options&)>& body);

/// Host memory the machine could give us now (MemAvailable), in bytes.
double host_memory_available();
/// UsageError when `bytes` would not fit in host memory.
void require_host_memory(double bytes, const std::string& what);

}  // namespace attn
