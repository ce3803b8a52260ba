// The threads backend of the ring: each rank a thread, messages through mailboxes.
#include "ring/ring_comm.hpp"

#include <cstring>
#include <memory>
#include <stdexcept>

namespace attn::ch06::ring {

/// Rank r's end: start() copies the message into rank r + 1's mailbox at once (the
/// "network" is a memcpy), finish() waits for the message from rank r - 1 and copies
/// it into the buffer start() named.
class ThreadComm final : public RingComm {
 public:
  ThreadComm(ThreadMailboxes* m, int r) : m_(m), r_(r) {}
  int rank() const override { return r_; }
  int size() const override { return m_->size(); }

  void start(Channel ch, const void* send, std::size_t send_bytes, void* recv, std::size_t recv_bytes) override {
    if (pending_[ch].active) throw std::logic_error("ring: start() twice on one channel without finish()");
    m_->post((r_ + 1) % size(), ch, r_, send, send_bytes);
    pending_[ch] = {true, recv, recv_bytes};
  }

  void finish(Channel ch) override {
    Pending& p = pending_[ch];
    if (!p.active) throw std::logic_error("ring: finish() without start()");
    const std::vector<unsigned char> msg = m_->take(r_, ch, (r_ + size() - 1) % size());
    if (msg.size() > p.bytes) throw std::logic_error("ring: message larger than its receive buffer");
    if (!msg.empty()) std::memcpy(p.recv, msg.data(), msg.size());
    p.active = false;
  }

  void allgather(Channel ch, const void* send, void* recv, std::size_t bytes) override {
    for (int to = 0; to < size(); ++to) m_->post(to, ch, r_, send, bytes);
    for (int from = 0; from < size(); ++from) {
      const std::vector<unsigned char> msg = m_->take(r_, ch, from);
      if (msg.size() != bytes) throw std::logic_error("ring: allgather messages of different sizes");
      if (bytes) std::memcpy(static_cast<unsigned char*>(recv) + std::size_t(from) * bytes, msg.data(), bytes);
    }
  }

 private:
  struct Pending {
    bool active = false;
    void* recv = nullptr;
    std::size_t bytes = 0;
  };
  ThreadMailboxes* m_;
  int r_;
  Pending pending_[kChannels];
};

ThreadMailboxes::ThreadMailboxes(int ranks) : ranks_(ranks), boxes_(std::size_t(ranks) * kChannels * ranks) {
  for (int r = 0; r < ranks; ++r) comms_.push_back(std::make_unique<ThreadComm>(this, r));
}

RingComm& ThreadMailboxes::comm(int r) { return *comms_.at(std::size_t(r)); }

std::size_t ThreadMailboxes::bytes_sent() const {
  std::lock_guard<std::mutex> lock(stat_mu_);
  return bytes_sent_;
}

void ThreadMailboxes::post(int to, Channel ch, int from, const void* data, std::size_t bytes) {
  std::vector<unsigned char> msg(bytes);
  if (bytes) std::memcpy(msg.data(), data, bytes);
  Box& b = box(to, ch, from);
  {
    std::lock_guard<std::mutex> lock(b.mu);
    b.messages.push_back(std::move(msg));
  }
  b.cv.notify_all();
  std::lock_guard<std::mutex> lock(stat_mu_);
  bytes_sent_ += bytes;
}

std::vector<unsigned char> ThreadMailboxes::take(int to, Channel ch, int from) {
  Box& b = box(to, ch, from);
  std::unique_lock<std::mutex> lock(b.mu);
  b.cv.wait(lock, [&] { return !b.messages.empty(); });
  std::vector<unsigned char> msg = std::move(b.messages.front());
  b.messages.pop_front();
  return msg;
}

}  // namespace attn::ch06::ring
