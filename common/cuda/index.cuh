#pragma once
/// \file index.cuh
/// \brief Device-side index arithmetic: `ceil_div`, the GQA head map
///        `kv_head_of`, and the causal visibility rule (`CausalMask`, and the
///        free functions `causal_visible`, `causal_key_end`, `causal_first_query`,
///        `causal_tile` built on it).
///
/// They live in `common/index.hpp`, written once as `constexpr __host__
/// __device__` functions so that host code and CPU models use the very same rule;
/// this header makes them available as `attn::cuda::...` next to the other device
/// primitives. Read `common/index.hpp` for the rule and its picture.

#include "common/index.hpp"

namespace attn::cuda {

using ::attn::ceil_div;
using ::attn::kv_head_of;
using ::attn::causal_diag;
using ::attn::causal_visible;
using ::attn::causal_key_end;
using ::attn::causal_first_query;
using ::attn::causal_tile;
using ::attn::TileMask;
using ::attn::CausalMask;

}  // namespace attn::cuda
