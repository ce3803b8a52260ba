#pragma once
/// \file faults.hpp
/// \brief Injected faults: realistic kernel bugs that the acceptance rule must catch.
///
/// `chNN_name --inject-fault NAME` runs the chapter with one bug put into the launch or
/// the output path of every implementation it applies to: the CPU model and the GPU
/// kernels are handed the problem a faulty launch would hand them, and their outputs are
/// left as a faulty kernel would leave them. The checker is not told: the binary must
/// then print FAIL and exit 1, which tests/faults proves for every fault of every chapter.
/// `--inject-fault list` prints the chapter's faults.
///
/// | fault | the bug it stands for |
/// |---|---|
/// | `last-key-block` | the key loop runs one block short (a launch bound off by one): the last, possibly partial, key tile is never read |
/// | `last-batch` | the grid covers batch - 1 sequences; the last batch's outputs stay as the zeroed buffer left them |
/// | `stale-lse` | O is right, but the LSE written is the state before the last key block was merged |
/// | `wrong-kv-head` | two query heads read each other's KV head (a wrong GQA head map) |
/// | `partial-tile-full` | the last partial key tile is treated as full: its element mask is skipped (chapter 06 masks: its masked scores count), or past Nk its missing keys read as zeros (as out-of-bounds TMA fills them) |
/// | `split-dropped` | split-K decode: the merge leaves out one split's partial state |
/// | `page-table-shift` | one block-table entry off by one: a sequence reads its neighbour page in place of one of its own |
/// | `ring-step-skipped` | ring attention: one rank never merges one of the K/V blocks passed to it around the ring (a step's partial left out of its running O and LSE) |
#include <string>
#include <vector>

#include "common/inputs.hpp"
#include "common/problem.hpp"

namespace attn {

enum class Fault {
  none,
  last_key_block,
  last_batch,
  stale_lse,
  wrong_kv_head,
  partial_tile_full,
  split_dropped,
  page_table_shift,
  ring_step_skipped,
};

/// The fault's name on the command line (`last-key-block`, ...) and its one-line description.
const char* fault_name(Fault f);
const char* fault_help(Fault f);
/// Every fault, in the table's order.
const std::vector<Fault>& all_faults();

/// The problem and inputs that a launch with forward fault `f` hands the kernel, for a
/// kernel whose key tile is `key_tile` keys. UsageError when the fault cannot occur at
/// this shape (one key tile only; one batch; a single KV head and batch).
struct FaultyLaunch {
  Problem p;
  AttnInputs in;
};
FaultyLaunch faulty_launch(Fault f, const Problem& p, const AttnInputs& in, int key_tile);

/// Outputs of a launch made by faulty_launch(f, p, ...) as p's output buffers hold them
/// afterwards (`last-batch`: the last batch's O and LSE stay zero). `lse` may be null.
void faulty_outputs(Fault f, const Problem& p, std::vector<float>* o, std::vector<float>* lse);

/// True for the faults run_faulty() applies to a forward pass.
bool forward_fault(Fault f);

/// Runs `run(problem, inputs)` (an implementation's forward pass, returning a result with
/// `o` and `lse` members) with fault `f`: a faulty launch and its outputs, or for
/// `stale-lse` the right O with the LSE of a launch one key block short.
template <class Run>
auto run_faulty(Fault f, const Problem& p, const AttnInputs& in, int key_tile, Run run) -> decltype(run(p, in)) {
  if (!forward_fault(f)) return run(p, in);
  if (f == Fault::stale_lse) {
    auto r = run(p, in);
    const FaultyLaunch l = faulty_launch(Fault::last_key_block, p, in, key_tile);
    r.lse = run(l.p, l.in).lse;
    return r;
  }
  const FaultyLaunch l = faulty_launch(f, p, in, key_tile);
  auto r = run(l.p, l.in);
  faulty_outputs(f, p, &r.o, &r.lse);
  return r;
}

/// The note a report row carries when a fault was injected into it (tests look for it).
std::string fault_note(Fault f);

}  // namespace attn
