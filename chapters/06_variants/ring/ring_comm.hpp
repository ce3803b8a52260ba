#pragma once
/// \file ring_comm.hpp
/// \brief The one thing ring attention asks of a communication library: pass a
///        buffer to the next rank and receive one from the previous rank, started
///        before the step's compute and finished after it, so that the transfer hides
///        behind the compute.
///
///     rank r:   start(ch, send, recv)   ->  [ attend the shard it holds ]  ->  finish(ch)
///                  |  send  --> rank r + 1                                       |
///                  |  recv  <-- rank r - 1              recv has arrived, send is free
///
/// Three implementations share this contract (the ring code above it is the same):
///
///     backend   ranks                        start / finish
///     threads   one CPU thread per rank      a copy into the next rank's mailbox / wait for ours
///     streams   P virtual ranks on one GPU   cudaMemcpyAsync on the rank's copy stream, after
///                                            events for the buffers' last readers / a stream
///                                            wait on the copy's event (ring_gpu.cu)
///     nccl      one GPU per rank             ncclSend + ncclRecv in one group on the rank's
///                                            communication stream / a stream wait (ring_nccl.cu)
///
/// A *channel* is one kind of message that travels the ring (K/V shards, the dK/dV
/// accumulators, or the decode states); messages of one channel arrive in the order
/// they were sent.
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

namespace attn::ch06::ring {

enum Channel : int { kChannelKV = 0, kChannelDKV = 1, kChannelDecode = 2, kChannels = 3 };

/// One rank's end of the ring, on host memory (the threads backend and the CPU model).
class RingComm {
 public:
  virtual ~RingComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Starts sending `send_bytes` of `send` to rank + 1 and receiving from rank - 1 into
  /// `recv` (room for `recv_bytes`). Returns before the transfer is complete.
  virtual void start(Channel ch, const void* send, std::size_t send_bytes, void* recv, std::size_t recv_bytes) = 0;
  /// Returns once the message started on `ch` has arrived in its `recv` and `send` may be reused.
  virtual void finish(Channel ch) = 0;
  /// Every rank's `bytes` of `send`, in rank order, into `recv` (size() * bytes): the
  /// decode all-reduce's exchange.
  virtual void allgather(Channel ch, const void* send, void* recv, std::size_t bytes) = 0;
};

/// The threads backend: P ranks in one process, one mailbox per (rank, channel, sender).
class ThreadMailboxes {
 public:
  explicit ThreadMailboxes(int ranks);
  int size() const { return ranks_; }
  /// The end of the ring that rank `r`'s thread uses.
  RingComm& comm(int r);

  /// Bytes that went through the mailboxes (every rank's sends).
  std::size_t bytes_sent() const;

 private:
  friend class ThreadComm;
  struct Box {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::vector<unsigned char>> messages;
  };
  Box& box(int to, Channel ch, int from) { return boxes_[(std::size_t(to) * kChannels + ch) * ranks_ + from]; }
  void post(int to, Channel ch, int from, const void* data, std::size_t bytes);
  std::vector<unsigned char> take(int to, Channel ch, int from);

  int ranks_;
  std::vector<Box> boxes_;
  std::vector<std::unique_ptr<RingComm>> comms_;
  mutable std::mutex stat_mu_;
  std::size_t bytes_sent_ = 0;
};

}  // namespace attn::ch06::ring
