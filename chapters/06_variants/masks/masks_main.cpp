// ch06_variants mask: placeholder until part 1 (masks) is written.
#include "common/cli.hpp"
#include "parts.hpp"

namespace attn::ch06 {
int mask_main(int argc, char** argv) {
  Cli cli(argv[0], "masks and score modifiers (not written yet)");
  return run_chapter(argc, argv, cli, [](const Options&) { return 0; });
}
}  // namespace attn::ch06
