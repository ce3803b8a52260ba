// ch06_variants: the variants of FlashAttention that production models run.
//
//   ch06_variants                 a short tour: every part at its default size
//   ch06_variants mask [opts]     masks and score modifiers (causal, window, ALiBi, softcap, ...)
//   ch06_variants gqa  [opts]     GQA/MQA with packed query groups
//   ch06_variants mla  [opts]     MLA: decompressed prefill and absorbed decode
//   ch06_variants ring [opts]     ring attention over P ranks
//   ch06_variants <sub> --help    the options of one part
#include <cstdio>
#include <cstring>
#include <string>

#include "parts.hpp"

namespace {

void usage(std::FILE* out) {
  int n = 0;
  const attn::ch06::Part* parts = attn::ch06::parts(&n);
  std::fprintf(out, "usage: ch06_variants [mask|gqa|mla|ring] [options]   (no subcommand: a tour of all four)\n");
  for (int i = 0; i < n; ++i) std::fprintf(out, "  %-5s %s\n", parts[i].name, parts[i].summary);
  std::fprintf(out, "  ch06_variants <sub> --help lists the options of one part\n");
}

}  // namespace

int main(int argc, char** argv) {
  int n = 0;
  const attn::ch06::Part* parts = attn::ch06::parts(&n);
  if (argc >= 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    usage(stdout);
    return 0;
  }
  if (argc >= 2 && argv[1][0] != '-') {
    for (int i = 0; i < n; ++i) {
      if (std::strcmp(argv[1], parts[i].name) != 0) continue;
      std::string prog = std::string("ch06_variants ") + parts[i].name;
      argv[1] = prog.data();
      return parts[i].main(argc - 1, argv + 1);
    }
    std::fprintf(stderr, "ch06_variants: error: unknown subcommand '%s' (mask, gqa, mla or ring)\n", argv[1]);
    return 2;
  }
  // --inject-fault: each part has its own faults. `list` prints every part's; a fault goes
  // to one part, named by its subcommand.
  for (int a = 1; a + 1 < argc; ++a) {
    if (std::strcmp(argv[a], "--inject-fault") != 0) continue;
    if (std::strcmp(argv[a + 1], "list") != 0) {
      std::fprintf(stderr, "ch06_variants: error: --inject-fault %s needs a subcommand (mask, gqa, mla or ring)\n",
                   argv[a + 1]);
      return 2;
    }
    int status = 0;
    for (int i = 0; i < n; ++i) {
      std::string prog = std::string("ch06_variants ") + parts[i].name;
      char flag[] = "--inject-fault", list[] = "list";
      char* sub_argv[] = {prog.data(), flag, list, nullptr};
      std::printf("%s:\n", parts[i].name);
      std::fflush(stdout);
      if (const int rc = parts[i].main(3, sub_argv)) status = rc;
    }
    return status;
  }
  // The tour: each part at its default size, with the options given (--device cpu, --json ...).
  int status = 0;
  for (int i = 0; i < n; ++i) {
    std::string prog = std::string("ch06_variants ") + parts[i].name;
    argv[0] = prog.data();
    std::printf("%s== ch06_variants %s: %s\n", i ? "\n" : "", parts[i].name, parts[i].summary);
    std::fflush(stdout);
    const int rc = parts[i].main(argc, argv);
    if (rc == 2) return 2;
    if (rc != 0) status = rc;
  }
  return status;
}
