#pragma once
// Runs a chapter binary as a learner would, capturing stdout, stderr and the exit code.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>

namespace testing_support {

struct RunResult {
  int exit_code = -1;
  std::string out, err;
  /// Number of non-empty lines on stderr.
  int err_lines() const {
    int n = 0;
    std::istringstream s(err);
    for (std::string line; std::getline(s, line);)
      if (!line.empty()) ++n;
    return n;
  }
};

inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

/// Runs `binary args` through the shell with stdout and stderr sent to temp files.
inline RunResult run_binary(const std::string& binary, const std::string& args) {
  char out_tmpl[] = "/tmp/attn_test_outXXXXXX", err_tmpl[] = "/tmp/attn_test_errXXXXXX";
  const int fo = mkstemp(out_tmpl), fe = mkstemp(err_tmpl);
  if (fo >= 0) close(fo);
  if (fe >= 0) close(fe);
  const std::string cmd = "'" + binary + "' " + args + " >" + out_tmpl + " 2>" + err_tmpl;
  const int status = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out_tmpl);
  r.err = slurp(err_tmpl);
  std::remove(out_tmpl);
  std::remove(err_tmpl);
  return r;
}

}  // namespace testing_support
