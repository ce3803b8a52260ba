#pragma once
/// \file errors.hpp
/// \brief The two ways a chapter binary refuses to run.
///
/// Bad input never crashes, hangs or prints a wrong answer: it is a UsageError,
/// reported as one line on stderr with exit code 2. A result that fails its
/// check is different: the binary prints the report and exits with code 1.

#include <stdexcept>
#include <string>

namespace attn {

/// Exit code of a binary given bad input.
constexpr int kExitUsage = 2;
/// Exit code of a binary whose kernel failed its check against the reference.
constexpr int kExitCheckFailed = 1;

/// Bad input: a value out of range, an unsupported shape, a size that will not fit.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A CPU model tried to keep more on chip than its `--sram-bytes` budget.
struct SramOverflow : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace attn
