#include "model_cases.hpp"

#include <algorithm>

#include "common/errors.hpp"

namespace attn::ch06 {

const std::vector<ModelCase>& model_cases() {
  static const std::vector<ModelCase> cases = {
      {"gpt-oss",
       "gpt-oss config: head_dim 64, 64 / 8 heads, sliding_window 128 (its sliding layers), a learned sink per head",
       64, 64, 8, MaskKind::learned_sink, 128, 0.0},
      {"gemma2",
       "Gemma 2 9B config: head_dim 256, 16 / 8 heads, attn_logit_softcapping 50.0, sliding_window 4096 (its local "
       "layers)",
       256, 16, 8, MaskKind::softcap, 4096, 50.0},
      {"mistral", "Mistral 7B v0.1 config: head_dim 128, 32 / 8 heads, sliding_window 4096", 128, 32, 8,
       MaskKind::window, 4096, 0.0},
      {"packed-docs",
       "documents packed into one sequence, causal within each (Llama 3 pre-training); the shape of Llama 3 8B: "
       "head_dim 128, 32 / 8 heads",
       128, 32, 8, MaskKind::document, -1, 0.0},
  };
  return cases;
}

const ModelCase* find_model_case(const std::string& name) {
  for (const ModelCase& m : model_cases())
    if (name == m.name) return &m;
  return nullptr;
}

std::string model_case_names() {
  std::string s;
  for (const ModelCase& m : model_cases()) s += (s.empty() ? "" : ", ") + std::string(m.name);
  return s;
}

void apply_model_problem(const ModelCase& m, Problem* p) {
  p->d = p->dv = m.d;
  p->heads = m.heads;
  p->kv_heads = m.kv_heads;
  p->causal = true;
}

int default_model_docs(int n) { return std::min(n, std::max(4, n / 1024)); }

MaskSpec model_spec(const ModelCase& m, const Problem& p, unsigned seed, int docs) {
  MaskSpec s;
  s.kind = m.kind;
  s.causal = true;
  switch (m.kind) {
    case MaskKind::learned_sink: s.sliding = m.window - 1; break;
    case MaskKind::softcap: s.sliding = m.window - 1, s.softcap = m.softcap; break;
    case MaskKind::window: s.left = m.window - 1, s.right = 0; break;
    case MaskKind::document: {
      const int k = docs > 0 ? docs : default_model_docs(p.nq);
      if (k > p.nq) throw UsageError("--docs must be <= N");
      s.doc_lens = random_doc_lens(p.nq, k, seed);
      break;
    }
    default: break;
  }
  finalize_spec(s, p);
  return s;
}

}  // namespace attn::ch06
