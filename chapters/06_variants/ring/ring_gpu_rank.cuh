#pragma once
/// \file ring_gpu_rank.cuh
/// \brief One rank of the GPU ring (its buffers, streams and steps) and the transport
///        interface the streams and NCCL backends implement.
///
/// A rank's step is cut into phases so that one host thread can drive P virtual
/// ranks in lockstep (streams: every rank's phase 1, then every rank's phase 2, ...)
/// while the NCCL backend's thread per GPU runs its own rank's phases in order.
///
///     forward step s:   fwd_begin  start the K/V rotation (kv -> rank + 1, kv' <- rank - 1)
///                       fwd_compute  every pair of the step: chapter 04's kernel, then ⊕ into acc
///                       fwd_end    the compute stream waits for kv'; swap
///     backward step s:  bwd_begin  start the K/V rotation
///                       bwd_compute  every pair: chapter 04's backward; dQ += ; part += dK, dV
///                       bwd_merge  (s > 0) wait for the dK/dV accumulator of this shard; acc += part;
///                                  send it on (after the last step: home)
///                       bwd_end    wait for kv'; swap
///     after the loop:   bwd_home   wait for our own dK/dV
///
/// Every buffer that a transfer writes is double-buffered (cur, next); the transport
/// orders each transfer after the last readers of its destination and after the
/// writer of its source, with events.
#include <cuda_runtime.h>

#include <array>
#include <vector>

#include "common/cuda/buffer.cuh"
#include "common/problem.hpp"
#include "ring_comm.hpp"
#include "ring_cpu.hpp"
#include "ring_gpu.hpp"

namespace attn::ch06::ring {

/// Device-side transfers between ranks (streams: D2D copies; NCCL: send/recv).
class GpuTransport {
 public:
  virtual ~GpuTransport() = default;
  /// Rank `rank` sends `send_bytes` of `send` to rank + 1 and receives exactly
  /// `recv_bytes` from rank - 1 into `recv`. Ordered after everything enqueued so
  /// far on `compute` (the rank's compute stream).
  virtual void start(Channel ch, int rank, int step, const void* send, std::size_t send_bytes, void* recv,
                     std::size_t recv_bytes, cudaStream_t compute) = 0;
  /// Makes `compute` wait until the transfer into `rank` on `ch` has arrived.
  virtual void finish(Channel ch, int rank, int step, cudaStream_t compute) = 0;
};

/// The launchers of the ring's own small kernels (ring_gpu.cu).
void launch_init_acc(float* acc_o, float* acc_lse, std::size_t rows, int dv, cudaStream_t s);
void launch_merge_partial(float* acc_o, float* acc_lse, const void* part_o, const float* part_lse, std::size_t rows,
                          int dv, DType t, cudaStream_t s);
void launch_finalize(const float* acc_o, void* o, std::size_t elems, DType t, cudaStream_t s);
/// acc[z][r][c] += part[z][r][c] for z < slices, r < rows, c < width; slices are
/// acc_rows / part_rows rows apart. `part` is in dtype `t`, or fp32 when part_f32.
void launch_add_rows(float* acc, const void* part, bool part_f32, DType t, int slices, int rows, int width,
                     int acc_rows, int part_rows, cudaStream_t s);

/// A timing event pair on one lane.
struct LaneMark {
  std::string lane, what;
  int step = 0;
  cudaEvent_t t0 = nullptr, t1 = nullptr;
};

class GpuRank {
 public:
  /// Uploads rank `rank`'s shards of the inputs (on the current device).
  GpuRank(const Problem& p, const AttnInputs& in, Layout layout, int ranks, int rank, bool backward);
  ~GpuRank();
  GpuRank(const GpuRank&) = delete;
  GpuRank& operator=(const GpuRank&) = delete;

  void fwd_init();
  void fwd_begin(int s, GpuTransport& t);
  void fwd_compute(int s);
  void fwd_end(int s, GpuTransport& t);
  void fwd_finalize();

  void bwd_init();
  void bwd_begin(int s, GpuTransport& t);
  void bwd_compute(int s);
  void bwd_merge(int s, GpuTransport& t);
  void bwd_end(int s, GpuTransport& t);
  void bwd_home(GpuTransport& t);

  /// Copies this rank's outputs into the global host tensors.
  void download_forward(std::vector<float>& o, std::vector<float>& lse) const;
  void download_backward(std::vector<float>& dq, std::vector<float>& dk, std::vector<float>& dv) const;
  void poison_outputs();

  cudaStream_t compute_stream() const { return compute_; }
  cudaStream_t copy_stream() const { return copy_; }
  /// Timing marks: when on, every compute phase records a pair of events.
  void set_marking(bool on) { marking_ = on; }
  std::vector<LaneMark>& marks() { return marks_; }
  void clear_marks();
  int rank() const { return r_; }
  /// --inject-fault ring-step-skipped: the forward's partials of step `step` are computed
  /// and never merged into the running O and LSE.
  void skip_merge_at(int step) { skip_step_ = step; }

 private:
  std::size_t kv_bytes(int src) const;  // K/V message of shard src, bytes (dtype)
  std::size_t dkv_bytes(int src) const; // dK/dV accumulator of shard src, bytes (fp32)
  void mark_begin(const char* what, int step);
  void mark_end();

  Problem p_;
  Layout layout_;
  int P_, r_;
  std::vector<ShardGeometry> geo_;
  int esize_;
  std::size_t kv_cap_ = 0;  // elements
  int max_chunk_ = 0;
  cudaStream_t compute_ = nullptr, copy_ = nullptr;
  bool marking_ = false;
  std::vector<LaneMark> marks_;

  DeviceBuffer<unsigned char> q_, kv_own_, kv_[2];
  int cur_ = 0;
  int skip_step_ = -1;
  DeviceBuffer<float> acc_o_, acc_lse_;
  DeviceBuffer<unsigned char> part_o_;
  DeviceBuffer<float> part_lse_;
  DeviceBuffer<unsigned char> o_;  // final O (dtype)
  // backward
  bool backward_;
  DeviceBuffer<unsigned char> dout_, part_dq_, part_dk_, part_dv_;
  DeviceBuffer<float> dq_acc_, dkv_[2], step_part_, scratch_dq_, scratch_delta_;
  int dcur_ = 0;
  DeviceBuffer<unsigned char> dq_out_, dkv_out_;
  void* recv_dkv_ = nullptr;
};

/// Events between the ranks' streams for the streams backend (one GPU).
class StreamsTransport final : public GpuTransport {
 public:
  StreamsTransport(std::vector<GpuRank*> ranks, bool timing);
  ~StreamsTransport() override;
  void start(Channel ch, int rank, int step, const void* send, std::size_t send_bytes, void* recv,
             std::size_t recv_bytes, cudaStream_t compute) override;
  void finish(Channel ch, int rank, int step, cudaStream_t compute) override;
  /// Timing marks of every copy, per receiving rank.
  std::vector<std::vector<LaneMark>>& marks() { return marks_; }
  void clear_marks();
  /// Forgets the rounds of the last run (the events stay valid).
  void reset();
  /// Labels the copies of the timeline: "fwd" (K/V copies are "kv") or "bwd" ("kv-bwd", "dkv").
  const char* phase = "fwd";

 private:
  struct Endpoint {
    bool registered = false;
    const void* send = nullptr;
    std::size_t send_bytes = 0;
    void* recv = nullptr;
    std::size_t recv_bytes = 0;
    int step = 0;
    cudaEvent_t compute_mark = nullptr;  // everything the rank's compute stream had enqueued
  };
  void issue(Channel ch, int to);

  std::vector<GpuRank*> ranks_;
  bool timing_;
  int P_;
  std::vector<std::vector<Endpoint>> ep_;        // [channel][rank]
  // done_[channel][rank][round % 2]: the copy into rank of that round (two rounds live at once)
  std::vector<std::vector<std::array<cudaEvent_t, 2>>> done_;
  std::vector<std::vector<int>> issued_;  // [channel][rank]: the round last copied into rank
  std::vector<std::vector<LaneMark>> marks_;
};

/// Turns the ranks' compute marks (and the transport's copy marks, when given) into
/// the timeline, measured from `t0` (an event on the same device), and sums the
/// hidden copy time.
void collect_timeline(std::vector<GpuRank*>& ranks, std::vector<std::vector<LaneMark>>* copy_marks, cudaEvent_t t0,
                      GpuRingResult& res);

}  // namespace attn::ch06::ring
