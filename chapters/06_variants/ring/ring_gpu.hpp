#pragma once
/// \file ring_gpu.hpp
/// \brief Ring attention on GPUs behind a plain C++ interface (no CUDA types): the
///        streams backend (P virtual ranks on one GPU) and the NCCL backend (one GPU
///        per rank), both with chapter 04's kernels as the per-step compute.
#include <string>
#include <vector>

#include "common/inputs.hpp"
#include "common/problem.hpp"
#include "ring_schedule.hpp"

namespace attn::ch06::ring {

enum class Backend { threads, streams, nccl };
const char* backend_name(Backend b);
bool parse_backend(const std::string& s, Backend* out);

/// True when this binary was built with the NCCL backend (NCCL found at configure time).
bool nccl_built();

/// Empty when the GPU ring runs this problem, else why not (the per-step kernel's
/// limits: chapter 04's final forward and its backward).
std::string ring_gpu_unsupported(const Problem& p, bool backward);

/// One interval on the timeline: rank, lane ("compute" or "copy"), step, what, and
/// its start and end in ms from the start of the ring.
struct TimelineEvent {
  int rank = 0;
  std::string lane;
  int step = 0;
  std::string what;  ///< "fwd", "bwd", "kv", "dkv"
  double t0 = 0, t1 = 0;
};

struct GpuRingOptions {
  Backend backend = Backend::streams;
  Layout layout = Layout::zigzag;
  int ranks = 1;
  bool backward = true;
  bool time = false;  ///< time the forward and backward (median of repeats) and record a timeline
  /// streams: one rank computes at a time (each rank's compute waits for the previous
  /// rank's), so that every rank's per-step time is measured alone; copies still overlap
  bool serial_ranks = false;
  /// --inject-fault ring-step-skipped: rank `skip.rank`'s merge of step `skip.step` is left
  /// out (its partial is computed, never merged); {-1, -1}: none.
  SkippedStep skip;
};

struct GpuRingResult {
  std::vector<float> o, lse, dq, dk, dv;  ///< global layout, checked by the caller
  double fwd_ms = 0, bwd_ms = 0;          ///< median wall time of the whole ring, 0 when not timed
  std::vector<TimelineEvent> timeline;    ///< one timed forward and backward
  std::string device;                     ///< GPU name(s)
  /// From the timeline (copy_hiding): forward K/V copy time and the part of it hidden.
  double copy_ms = 0, hidden_copy_ms = 0, compute_ms = 0;
  /// The same for the backward's copies (K/V and dK/dV), against its compute.
  double bwd_copy_ms = 0, bwd_hidden_copy_ms = 0, bwd_compute_ms = 0;
  std::vector<double> rank_compute_ms;  ///< forward compute per rank (timeline)
};

/// Runs the ring on the GPU(s). Throws UsageError for unsupported problems or when
/// the backend is not built or there are too few GPUs.
GpuRingResult ring_gpu(const Problem& p, const AttnInputs& in, const GpuRingOptions& opt);

/// How much of the copies the compute hid. A copy is *exposed* for the part of it
/// that ends after the compute it hides behind has ended, i.e. for as long as the
/// step that needs it had to wait for it:
///   forward K/V of round s into rank r   -> behind rank r's forward step s
///   backward K/V of round s              -> behind backward step s
///   dK/dV of round s (waited for after step s + 1) -> behind backward step s + 1
///                                            (the last one, home, behind step P - 1)
/// A copy that runs entirely before its step's compute has started is hidden too: it
/// delays nothing.
struct CopyHiding {
  double fwd_copy_ms = 0, fwd_exposed_ms = 0;
  double bwd_copy_ms = 0, bwd_exposed_ms = 0;
};
CopyHiding copy_hiding(const std::vector<TimelineEvent>& events);

/// The timeline as an SVG: one lane per rank and stream, an interval per step.
std::string timeline_svg(const std::vector<TimelineEvent>& events, int ranks, const std::string& title);

/// Time of one launch of chapter 04's kernel on the whole problem on one GPU (the
/// single-device baseline), forward and backward, median ms, and the outputs of a first,
/// untimed launch into poisoned buffers (global layout), checked by the caller like the ring's.
struct SingleGpuTiming {
  double fwd_ms = 0, bwd_ms = 0;
  std::vector<float> o, lse, dq, dk, dv;
};
SingleGpuTiming single_gpu_timing(const Problem& p, const AttnInputs& in, bool backward);

/// Median time of one device-to-device copy of `bytes` (the one-GPU "link"), and the
/// bandwidth it implies (bytes / time).
double d2d_copy_ms(double bytes);

}  // namespace attn::ch06::ring
