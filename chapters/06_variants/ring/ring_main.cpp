// ch06_variants ring: placeholder until part 3 (ring attention) is written.
#include "common/cli.hpp"
#include "parts.hpp"

namespace attn::ch06 {
int ring_main(int argc, char** argv) {
  Cli cli(argv[0], "ring attention (not written yet)");
  return run_chapter(argc, argv, cli, [](const Options&) { return 0; });
}
}  // namespace attn::ch06
