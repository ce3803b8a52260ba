#pragma once
/// \file mask_specs.hpp
/// \brief Mask specs shared by chapter 06's CPU and GPU mask tests (a helper, no tests of its own).
#include "chapters/06_variants/masks/mask_spec.hpp"
#include "common/problem.hpp"

namespace testing_support {

/// learned-sink or softcap with a causal sliding window of `window` on top (gpt-oss,
/// Gemma 2); `softcap` is softcap's cap (learned-sink ignores it).
inline attn::ch06::MaskSpec composed_spec(attn::ch06::MaskKind k, const attn::Problem& p, int window,
                                          double softcap) {
  attn::ch06::MaskSpec s;
  s.kind = k;
  s.softcap = softcap;
  s.sliding = window;
  attn::ch06::finalize_spec(s, p);
  return s;
}

}  // namespace testing_support
