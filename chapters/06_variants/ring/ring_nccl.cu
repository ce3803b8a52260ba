// The NCCL backend: one GPU per rank, driven by one host thread per GPU in this
// process (the launcher design of SECTION.md: one process, a thread per GPU, so that
// the inputs, the check against the reference and the timeline live in one place,
// and ncclCommInitAll needs no out-of-band exchange of the unique id).
//
// Each rotation is one group of ncclSend (to rank + 1) and ncclRecv (from rank - 1)
// on the rank's communication stream, ordered after the rank's compute with an
// event, and the compute stream waits for it with another: the same GpuRank code as
// the streams backend, with NcclTransport in place of StreamsTransport.
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "common/cuda/check.cuh"
#include "common/errors.hpp"
#include "ring/ring_gpu_rank.cuh"
#include "ring/ring_nccl.hpp"

#define NCCL_CHECK(call)                                                                             \
  do {                                                                                               \
    const ncclResult_t nccl_rc_ = (call);                                                                  \
    if (nccl_rc_ != ncclSuccess) throw ::attn::CudaError(std::string(#call) + ": " + ncclGetErrorString(nccl_rc_)); \
  } while (0)

namespace attn::ch06::ring {

bool nccl_built() { return true; }

namespace {

class NcclTransport final : public GpuTransport {
 public:
  NcclTransport(ncclComm_t comm, int rank, int ranks) : comm_(comm), r_(rank), P_(ranks) {
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    for (auto& e : done_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  ~NcclTransport() override {
    for (auto& e : done_) cudaEventDestroy(e);
    cudaEventDestroy(ready_);
    cudaStreamDestroy(stream_);
    clear_marks();
  }
  void start(Channel ch, int rank, int step, const void* send, std::size_t send_bytes, void* recv,
             std::size_t recv_bytes, cudaStream_t compute) override {
    if (rank != r_) throw std::logic_error("ring: an NCCL transport serves one rank");
    // After everything the rank's compute has enqueued: send is written, recv is free.
    CUDA_CHECK(cudaEventRecord(ready_, compute));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
    LaneMark m;
    if (timing) {
      m.lane = "copy";
      m.what = ch == kChannelDKV ? "dkv" : std::string(phase) == "bwd" ? "kv-bwd" : "kv";
      m.step = step;
      CUDA_CHECK(cudaEventCreate(&m.t0));
      CUDA_CHECK(cudaEventCreate(&m.t1));
      CUDA_CHECK(cudaEventRecord(m.t0, stream_));
    }
    NCCL_CHECK(ncclGroupStart());
    NCCL_CHECK(ncclSend(send, send_bytes, ncclUint8, (r_ + 1) % P_, comm_, stream_));
    NCCL_CHECK(ncclRecv(recv, recv_bytes, ncclUint8, (r_ + P_ - 1) % P_, comm_, stream_));
    NCCL_CHECK(ncclGroupEnd());
    if (timing) {
      CUDA_CHECK(cudaEventRecord(m.t1, stream_));
      marks.push_back(m);
    }
    CUDA_CHECK(cudaEventRecord(done_[ch], stream_));
  }
  void finish(Channel ch, int, int, cudaStream_t compute) override {
    CUDA_CHECK(cudaStreamWaitEvent(compute, done_[ch], 0));
  }
  void clear_marks() {
    for (LaneMark& m : marks) {
      cudaEventDestroy(m.t0);
      cudaEventDestroy(m.t1);
    }
    marks.clear();
  }
  bool timing = false;
  const char* phase = "fwd";
  std::vector<LaneMark> marks;

 private:
  ncclComm_t comm_;
  int r_, P_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  cudaEvent_t done_[kChannels] = {};
};

/// All P threads meet here between timed repeats.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const int gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen != gen_; });
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, count_ = 0, gen_ = 0;
};

}  // namespace

GpuRingResult ring_nccl(const Problem& p, const AttnInputs& in, const GpuRingOptions& opt) {
  setenv("NCCL_NVLS_ENABLE", "0", 1);  // NVLink multicast stays off on these machines
  const int P = opt.ranks;
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess) ndev = 0;
  if (ndev < P)
    throw UsageError("--backend nccl --ranks " + std::to_string(P) + " needs " + std::to_string(P) +
                     " GPUs; this machine has " + std::to_string(ndev));
  std::vector<ncclComm_t> comms(P);
  std::vector<int> devs(P);
  for (int r = 0; r < P; ++r) devs[r] = r;
  NCCL_CHECK(ncclCommInitAll(comms.data(), P, devs.data()));

  GpuRingResult res;
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  res.device = std::string(prop.name) + " x" + std::to_string(P) + " (NCCL " + std::to_string(NCCL_VERSION_CODE) + ")";
  res.o.assign(p.o_elems(), 0.f);
  res.lse.assign(p.lse_elems(), 0.f);
  if (opt.backward) {
    res.dq.assign(p.q_elems(), 0.f);
    res.dk.assign(p.k_elems(), 0.f);
    res.dv.assign(p.v_elems(), 0.f);
  }
  res.rank_compute_ms.assign(P, 0.0);
  std::mutex mu;
  std::exception_ptr error;
  Barrier barrier(P);
  std::vector<double> fwd_ms, bwd_ms;

  auto rank_main = [&](int r) {
    CUDA_CHECK(cudaSetDevice(r));
    GpuRank g(p, in, opt.layout, P, r, opt.backward);
    if (r == opt.skip.rank) g.skip_merge_at(opt.skip.step);
    NcclTransport t(comms[r], r, P);
    auto forward = [&] {
      g.fwd_init();
      for (int s = 0; s < P; ++s) {
        g.fwd_begin(s, t);
        g.fwd_compute(s);
        g.fwd_end(s, t);
      }
      g.fwd_finalize();
    };
    auto backward = [&] {
      g.bwd_init();
      for (int s = 0; s < P; ++s) {
        g.bwd_begin(s, t);
        g.bwd_compute(s);
        g.bwd_merge(s, t);
        g.bwd_end(s, t);
      }
      g.bwd_home(t);
    };
    g.poison_outputs();
    CUDA_CHECK(cudaDeviceSynchronize());
    forward();
    CUDA_CHECK(cudaDeviceSynchronize());
    {
      std::lock_guard<std::mutex> lock(mu);
      g.download_forward(res.o, res.lse);
    }
    if (opt.backward) {
      backward();
      CUDA_CHECK(cudaDeviceSynchronize());
      std::lock_guard<std::mutex> lock(mu);
      g.download_backward(res.dq, res.dk, res.dv);
    }
    if (!opt.time) return;
    // One marked run: each rank's timeline from its own device's clock, started
    // together at a barrier (clocks of different GPUs are not compared otherwise).
    g.set_marking(true);
    t.timing = true;
    cudaEvent_t t0;
    CUDA_CHECK(cudaEventCreate(&t0));
    barrier.wait();
    CUDA_CHECK(cudaEventRecord(t0, g.compute_stream()));
    forward();
    CUDA_CHECK(cudaDeviceSynchronize());
    if (opt.backward) {
      barrier.wait();
      t.phase = "bwd";
      backward();
      CUDA_CHECK(cudaDeviceSynchronize());
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      std::vector<GpuRank*> one{&g};
      std::vector<std::vector<LaneMark>> copies{t.marks};
      GpuRingResult part;
      collect_timeline(one, &copies, t0, part);
      for (TimelineEvent e : part.timeline) {
        e.rank = r;
        res.timeline.push_back(e);
      }
      res.rank_compute_ms[r] = part.compute_ms;
      res.compute_ms += part.compute_ms;
      res.copy_ms += part.copy_ms;
      res.hidden_copy_ms += part.hidden_copy_ms;
      res.bwd_compute_ms += part.bwd_compute_ms;
      res.bwd_copy_ms += part.bwd_copy_ms;
      res.bwd_hidden_copy_ms += part.bwd_hidden_copy_ms;
    }
    CUDA_CHECK(cudaEventDestroy(t0));
    g.set_marking(false);
    g.clear_marks();
    t.timing = false;
    t.clear_marks();
    auto wall = [&](auto&& fn, std::vector<double>* out) {
      for (int k = 0; k < 23; ++k) {
        CUDA_CHECK(cudaDeviceSynchronize());
        barrier.wait();
        const auto a = std::chrono::steady_clock::now();
        fn();
        CUDA_CHECK(cudaDeviceSynchronize());
        const auto b = std::chrono::steady_clock::now();
        if (r == 0 && k >= 3) out->push_back(std::chrono::duration<double, std::milli>(b - a).count());
      }
    };
    wall(forward, &fwd_ms);
    if (opt.backward) wall(backward, &bwd_ms);
  };

  std::vector<std::thread> threads;
  for (int r = 0; r < P; ++r)
    threads.emplace_back([&, r] {
      try {
        rank_main(r);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
      }
    });
  for (auto& th : threads) th.join();
  for (ncclComm_t c : comms) ncclCommDestroy(c);
  CUDA_CHECK(cudaSetDevice(0));
  if (error) std::rethrow_exception(error);
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  res.fwd_ms = med(fwd_ms);
  res.bwd_ms = med(bwd_ms);
  return res;
}

}  // namespace attn::ch06::ring
