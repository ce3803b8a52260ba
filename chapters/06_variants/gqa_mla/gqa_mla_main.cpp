// ch06_variants gqa / mla: placeholders until part 2 is written.
#include "common/cli.hpp"
#include "parts.hpp"

namespace attn::ch06 {
int gqa_main(int argc, char** argv) {
  Cli cli(argv[0], "GQA/MQA with packed query groups (not written yet)");
  return run_chapter(argc, argv, cli, [](const Options&) { return 0; });
}
int mla_main(int argc, char** argv) {
  Cli cli(argv[0], "MLA (not written yet)");
  return run_chapter(argc, argv, cli, [](const Options&) { return 0; });
}
}  // namespace attn::ch06
