#pragma once
/// \file parts.hpp
/// \brief The four subcommands of `ch06_variants`, one per part of the chapter.
///
///     ch06_variants mask [opts]   masks and score modifiers (masks/)
///     ch06_variants gqa  [opts]   GQA/MQA with packed query groups (gqa_mla/)
///     ch06_variants mla  [opts]   MLA: decompressed prefill and absorbed decode (gqa_mla/)
///     ch06_variants ring [opts]   ring attention over P ranks (ring/)
///
/// Each takes argv with argv[0] = "ch06_variants <sub>", parses it with the shared
/// Cli (so --json, --device, --bench ... mean what they mean in every chapter) and
/// returns the process exit code (0 ok, 1 a failed check, 2 bad input).

namespace attn::ch06 {

int mask_main(int argc, char** argv);
int gqa_main(int argc, char** argv);
int mla_main(int argc, char** argv);
int ring_main(int argc, char** argv);

/// One subcommand: its name, one line of help, and its entry point.
struct Part {
  const char* name;
  const char* summary;
  int (*main)(int, char**);
};
/// The subcommands in chapter order.
const Part* parts(int* count);

}  // namespace attn::ch06
