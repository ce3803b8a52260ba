#pragma once
/// \file grouped_model.hpp
/// \brief The CPU model of the packed kernels: GQA/MQA with the query heads of one KV
///        head on the M dimension of a tile, and (the same loop, G = Hq, Hkv = 1) MLA's
///        absorbed decode. Written with the kernels' loop structure; every global
///        access is counted.
///
/// **Unpacked** (chapters 04 and 05): one tile = up to Mt rows of *one* query head.
/// Query head h reads KV head h / G, but K/V are loaded once per query head.
///
/// **Packed** (FA3's PackGQA): the G query heads of KV head hk are heads hk G .. hk G + G-1,
/// stored one after another, so for one (batch, hk) they are a single [G Nq][d] matrix.
/// Packed row m of that matrix is query head hk G + m / Nq at position i = m % Nq, and
/// a tile takes Mt consecutive packed rows. G = 4, Nq = 3, Mt = 16:
///
///     packed row m   0  1  2 | 3  4  5 | 6  7  8 | 9 10 11 | 12..15
///     query head     h0 h0 h0| h1 h1 h1| h2 h2 h2| h3 h3 h3|  (padding, not stored)
///     position i     0  1  2 | 0  1  2 | 0  1  2 | 0  1  2 |
///                    \______________ one tile, one K/V stream ______________/
///
/// Unpacked, the same work is 4 tiles of 3 rows, each streaming all of K and V. So
/// per (batch, KV head) the K/V bytes are
///
///     unpacked:  G * ceil(Nq / Mt)   * Nk * (d + dv) * bytes
///     packed:        ceil(G Nq / Mt) * Nk * (d + dv) * bytes
///
/// a factor up to G smaller when Nq < Mt (decode, speculative and chunked decode), and
/// the same once Nq is a multiple of Mt (prefill): there packing no longer matters.
///
/// **Split-K** (decode): the keys of each tile are cut into `splits` ranges; each
/// range writes its (m, l, O) to scratch (fp32) and a second pass merges the ranges
/// of each row with the ⊕ of common/online_softmax.hpp.
///
/// **V inside K** (MLA absorbed): the values are the first dv columns of the keys
/// (the latent c of [c ; k_rope]); the kernel reads them from the K tile it already
/// holds, so V costs no bytes of its own.

#include <cstddef>
#include <vector>

#include "common/inputs.hpp"
#include "common/problem.hpp"
#include "common/traffic.hpp"

namespace attn::ch06 {

struct GroupedOptions {
  bool pack = true;    ///< query heads of a KV head share a tile
  int m_tile = 128;    ///< rows per tile (Br)
  int n_tile = 128;    ///< keys per block (Bc)
  int splits = 1;      ///< key ranges per tile (split-K); 1 = none
  bool v_in_k = false; ///< V is the first dv columns of K (in.v is then ignored)
  std::size_t sram_bytes = 227 * 1024;  ///< shared memory of the kernel: Q, one K and one V block
};

struct GroupedResult {
  std::vector<float> o, lse;  ///< [B][Hq][Nq][dv] (rounded to the dtype), [B][Hq][Nq]
  Traffic traffic;
  double kv_bytes = 0;        ///< the K/V part of traffic.bytes_read
  std::size_t sram_peak = 0;
  int tiles = 0;              ///< thread blocks of the first kernel (tiles x splits)
};

/// Runs the model. Scores in fp32, P rounded to the dtype before P V, O stored in the
/// dtype, LSE in fp32; causal rows see keys j <= i + Nk - Nq (i the row's position).
GroupedResult grouped_forward_model(const Problem& p, const AttnInputs& in, const GroupedOptions& opt);

/// The K/V bytes the model counts, in closed form (the formulas above), for sizes the
/// model is too slow to run. Causal problems skip no blocks in this count.
double grouped_kv_bytes(const Problem& p, const GroupedOptions& opt);

/// Tiles of the first kernel: B * Hkv * ceil(G Nq / Mt) packed, B * Hq * ceil(Nq / Mt) not.
long grouped_tiles(const Problem& p, bool pack, int m_tile);

}  // namespace attn::ch06
