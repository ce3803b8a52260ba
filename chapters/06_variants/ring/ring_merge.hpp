#pragma once
/// \file ring_merge.hpp
/// \brief Merging two partial attention results in their LSE form, for the CPU model
///        and the GPU merge kernel alike (`__host__ __device__`).
///
/// A kernel that attends a query row to one block of keys returns the normalised
/// output O and LSE = m + log l of that block. That pair *is* the online-softmax
/// state of chapter 02, written another way: (m, l, O~) with m = LSE, l = 1 and the
/// unnormalised output O~ = O (because e^m l = e^LSE, and O~ / l = O). So two partials
/// merge with chapter 02's ⊕ itself (common/online_softmax.hpp), and the result,
/// normalised again, is the LSE form of the union:
///
///     (O_a, LSE_a) ⊕ (O_b, LSE_b) = ( w_a O_a + w_b O_b ) / (w_a + w_b),
///                                     LSE = max + log(w_a + w_b)
///     w_a = e^(LSE_a - max),  w_b = e^(LSE_b - max),  max = max(LSE_a, LSE_b)
///
/// An empty partial (a row that saw no key of the block) has LSE = -inf: its state
/// is the identity (-inf, 0), its weight is 0, and it changes nothing.
#include "common/online_softmax.hpp"

namespace attn::ch06::ring {

/// The online-softmax state of a partial whose LSE is `lse`: (lse, 1), or the
/// identity (-inf, 0) for an empty partial.
template <class T>
ATTN_HD SoftmaxState<T, BaseE> state_of_lse(T lse) {
  return {lse, lse == neg_inf<T>() ? T(0) : T(1)};
}

/// Merges the partial (o_part, lse_part) into the accumulator (o_acc, lse_acc) over
/// `cols` output columns; returns the merged LSE (o_acc is updated in place).
/// On the GPU every lane of a warp calls it for its own columns of one row, with
/// the row's two LSEs: they all compute the same weights and the same LSE.
template <class T>
ATTN_HD T merge_lse(T* o_acc, T lse_acc, const T* o_part, T lse_part, int cols) {
  // EXERCISE ch06.8: merge two partials in LSE form with chapter 02's merge_into, then normalise
  //| (void)o_acc; (void)o_part; (void)lse_part; (void)cols;
  //| return lse_acc;  // TODO: the accumulator ignores the new partial
  SoftmaxState<T, BaseE> a = state_of_lse(lse_acc);
  merge_into(a, o_acc, state_of_lse(lse_part), o_part, cols);  // O~ = w_a O_a + w_b O_b, l = w_a + w_b
  if (a.l > T(0))
    for (int k = 0; k < cols; ++k) o_acc[k] /= a.l;  // back to the LSE form: O = O~ / l
  return a.lse();
  // END EXERCISE
}

}  // namespace attn::ch06::ring
