#pragma once
/// \file model_cases.hpp
/// \brief Named model cases of `ch06_variants mask --model NAME`: the head dim, the
///        heads and the mask of a published model's attention, each with its source.
///
/// A config's `sliding_window` W counts the keys a query sees, its own included (the
/// reference code keeps j > q - W): the chapter's left bound is L = W - 1.

#include <string>
#include <vector>

#include "common/problem.hpp"
#include "mask_spec.hpp"

namespace attn::ch06 {

/// One model's attention, as its config gives it.
struct ModelCase {
  const char* name;    ///< the --model spelling
  const char* source;  ///< where the numbers come from (the help and the report say it)
  int d, heads, kv_heads;
  MaskKind kind;       ///< learned-sink, softcap, window or document
  int window;          ///< the config's sliding_window W (keys seen, own included); -1: none
  double softcap;      ///< softcap (kind softcap only)
};

/// gpt-oss, gemma2, mistral, packed-docs.
const std::vector<ModelCase>& model_cases();
/// The case named `name`, or nullptr.
const ModelCase* find_model_case(const std::string& name);
/// "gpt-oss, gemma2, mistral, packed-docs" (for the help and the error).
std::string model_case_names();

/// Sets the problem's head dims, heads, KV heads and causal from `m`; N and the batch
/// stay as given.
void apply_model_problem(const ModelCase& m, Problem* p);

/// The number of documents packed-docs draws at N when --docs is not given: one per
/// 1024 tokens, at least 4 (at most N).
int default_model_docs(int n);

/// The mask of `m` on problem `p` (already through apply_model_problem), finalized:
/// a window of W keys is the left bound W - 1, causal; packed-docs draws `docs`
/// document lengths (<= 0: default_model_docs) summing to N, seeded by `seed`.
MaskSpec model_spec(const ModelCase& m, const Problem& p, unsigned seed, int docs = -1);

}  // namespace attn::ch06
