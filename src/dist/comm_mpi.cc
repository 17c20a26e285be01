// The MPI backend of Comm (DC_HAVE_MPI, CMake's DIFFUCODER_MPI): MPI_COMM_WORLD with MPI_ERRORS_RETURN,
// every call checked; a watchdog thread that ends the job when one collective waits past the timeout;
// a progress thread that, while non-blocking reduce-scatters are in flight, tests their requests every
// kProgressUs (Open MPI moves a large message only inside MPI calls), so that they travel while the
// caller computes (MPI_THREAD_SERIALIZED: every MPI call under mpi_mu_);
// SIGTERM and SIGPIPE handlers that say why this rank stopped (the launcher stopped it; a send to a rank
// that has died broke its connection). Without MPI, world_comm() says what data parallelism needs.
#include "dist/comm.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#if DC_HAVE_MPI
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#endif

namespace dc::dist {

#if DC_HAVE_MPI
namespace {

constexpr int64_t kMaxCount = int64_t{1} << 26;     // values per message (MPI counts are int)
constexpr int64_t kReduceChunk = int64_t{1} << 20;  // values per reduce-scatter message: 4 MiB of sum buffer
constexpr int64_t kGatherWindow = int64_t{1} << 30;  // values per MPI_Allgatherv (its counts and displacements are int)
constexpr int kTag = 7316;        // the blocking reduce-scatter's messages
constexpr int kStartedTag = 7317;  // the non-blocking one's (never matched against the blocking one's)
constexpr int kProgressUs = 300;  // the progress thread's period while reduce-scatters are in flight

// Written by the signal handlers (async-signal-safe: write + _exit only), then exit 128 + the signal.
char g_term_message[256];  // SIGTERM: the launcher stops the ranks when one has ended or failed
char g_pipe_message[256];  // SIGPIPE: a send to a rank that has died (TCP), or a closed pipe
void on_signal(int signal) {
  const char* message = signal == SIGPIPE ? g_pipe_message : g_term_message;
  const ssize_t ignored = ::write(2, message, std::strlen(message));
  (void)ignored;
  ::_exit(128 + signal);
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class MpiComm final : public Comm {
 public:
  MpiComm(int rank, int size, double timeout_s, bool progress_thread)
      : rank_(rank), size_(size), timeout_ms_(int64_t(timeout_s * 1000)) {
    std::snprintf(g_term_message, sizeof(g_term_message),
                  "rank %d: stopped by the MPI launcher (another rank ended or failed: see its message); "
                  "continue from the last checkpoint with --resume\n", rank_);
    std::snprintf(g_pipe_message, sizeof(g_pipe_message),
                  "rank %d: its connection to another rank broke (that rank ended or failed: see its message; or a "
                  "pipe this rank writes to was closed); continue from the last checkpoint with --resume\n", rank_);
    struct sigaction sa = {};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, nullptr);
    // (a SIGPIPE already ignored, by the MPI library or the user, stays ignored: the write then fails with
    // EPIPE, which MPI reports as an error of the operation)
    struct sigaction pipe_before = {};
    if (sigaction(SIGPIPE, nullptr, &pipe_before) != 0 || pipe_before.sa_handler != SIG_IGN) sigaction(SIGPIPE, &sa, nullptr);
    if (timeout_ms_ > 0) watchdog_ = std::thread([this] { watch(); });
    if (progress_thread) progress_ = std::thread([this] { progress(); });
  }
  ~MpiComm() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    {
      std::lock_guard<std::mutex> lock(mpi_mu_);
      stop_progress_ = true;
    }
    progress_cv_.notify_all();
    if (progress_.joinable()) progress_.join();
    for (auto& op : pending_) complete_sends(*op);  // never finished (an error path): no send left reading
    MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }
  void set_local_rank(int local_rank) { local_rank_ = local_rank; }

  Status barrier() override {
    Busy busy(this, "barrier");
    std::lock_guard<std::mutex> lock(mpi_mu_);
    return check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
  }

  Status broadcast(void* data, int64_t bytes, int root) override {
    Busy busy(this, "broadcast");
    std::lock_guard<std::mutex> lock(mpi_mu_);
    char* p = static_cast<char*>(data);
    for (int64_t b = 0; b < bytes; b += kMaxCount) {
      const int count = static_cast<int>(std::min(kMaxCount, bytes - b));
      DC_RETURN_IF_ERROR(check(MPI_Bcast(p + b, count, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast"));
      if (rank_ == root) bytes_sent_ += int64_t{count} * (size_ - 1);
    }
    return Status();
  }

  // Every rank sends the owners' parts of region (non-blocking, in chunks); each owner takes its part
  // chunk by chunk, receiving the chunk from each rank in rank order and adding it in that order into a
  // chunk-sized sum, then adds the sum into shard_sum. No send is left pending when it returns, an error
  // included (abandon).
  Status reduce_scatter_add(const float* in, Range region, int64_t n, float* shard_sum) override {
    Busy busy(this, "reduce-scatter of the gradients");
    std::lock_guard<std::mutex> lock(mpi_mu_);
    const auto part_of = [&](int owner) { return part(region, n, owner); };
    std::vector<MPI_Request> sends;
    for (int owner = 0; owner < size_; ++owner) {
      if (owner == rank_) continue;
      const Range r = part_of(owner);
      for (int64_t b = r.begin; b < r.end; b += kReduceChunk) {
        const int count = static_cast<int>(std::min(kReduceChunk, r.end - b));
        MPI_Request request = MPI_REQUEST_NULL;
        const Status sent = check(
            MPI_Isend(in + (b - region.begin), count, MPI_FLOAT, owner, kTag, MPI_COMM_WORLD, &request), "MPI_Isend");
        if (!sent.ok()) return abandon(sends, sent);
        sends.push_back(request);
        bytes_sent_ += int64_t{count} * static_cast<int64_t>(sizeof(float));
      }
    }
    const Range mine = part_of(rank_);
    const int64_t shard_begin = shard_range(n, rank_, size_).begin;
    const size_t chunk = static_cast<size_t>(std::min(kReduceChunk, mine.size()));
    std::vector<float> sum(chunk), part(chunk);
    for (int64_t b = mine.begin; b < mine.end; b += kReduceChunk) {
      const int count = static_cast<int>(std::min(kReduceChunk, mine.end - b));
      for (int source = 0; source < size_; ++source) {
        const float* src = in + (b - region.begin);
        if (source != rank_) {
          const Status received = check(
              MPI_Recv(part.data(), count, MPI_FLOAT, source, kTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
          if (!received.ok()) return abandon(sends, received);
          src = part.data();
        }
        if (source == 0) {
          std::memcpy(sum.data(), src, static_cast<size_t>(count) * sizeof(float));
        } else {
          for (int i = 0; i < count; ++i) sum[i] += src[i];
        }
      }
      float* dst = shard_sum + (b - shard_begin);
      for (int i = 0; i < count; ++i) dst[i] += sum[i];
    }
    return check(MPI_Waitall(static_cast<int>(sends.size()), sends.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  }

  // Posts this rank's receives (per peer, in chunks of kMaxCount, into one receive buffer: peer p's part
  // at p's index among the other ranks) and its sends, as reduce_scatter_add's messages but non-blocking;
  // the progress thread then tests them. Messages of one pair match in posting order (one tag), so ops
  // started in the same order on every rank pair up.
  Result<int64_t> reduce_scatter_add_start(const float* in, Range region, int64_t n, float* shard_sum) override {
    std::lock_guard<std::mutex> lock(mpi_mu_);
    auto op = std::make_unique<PendingReduce>();
    op->handle = ++handles_, op->in = in, op->region = region, op->n = n, op->shard_sum = shard_sum;
    op->mine = part(region, n, rank_);
    const int64_t m = op->mine.size();
    op->recv = take_buffer(m * (size_ - 1));
    for (int source = 0, slot = 0; source < size_; ++source) {
      if (source == rank_) continue;
      float* dst = op->recv.data() + (slot++) * m;
      for (int64_t b = 0; b < m; b += kMaxCount) {
        const int count = static_cast<int>(std::min(kMaxCount, m - b));
        op->requests.push_back(MPI_REQUEST_NULL);
        const Status posted = check(MPI_Irecv(dst + b, count, MPI_FLOAT, source, kStartedTag, MPI_COMM_WORLD,
                                              &op->requests.back()), "MPI_Irecv");
        if (!posted.ok()) return drop(std::move(op), posted);
      }
    }
    for (int owner = 0; owner < size_; ++owner) {
      if (owner == rank_) continue;
      const Range r = part(region, n, owner);
      for (int64_t b = r.begin; b < r.end; b += kMaxCount) {
        const int count = static_cast<int>(std::min(kMaxCount, r.end - b));
        op->requests.push_back(MPI_REQUEST_NULL);
        const Status sent = check(MPI_Isend(in + (b - region.begin), count, MPI_FLOAT, owner, kStartedTag,
                                            MPI_COMM_WORLD, &op->requests.back()), "MPI_Isend");
        if (!sent.ok()) return drop(std::move(op), sent);
        bytes_sent_ += int64_t{count} * static_cast<int64_t>(sizeof(float));
      }
    }
    const int64_t handle = op->handle;
    if (!progress_.joinable()) test_pending();  // no progress thread: the earlier ones move here
    pending_.push_back(std::move(op));
    progress_cv_.notify_one();
    return handle;
  }

  // Waits for the handle's messages, then adds, value by value, in₀ + in₁ + … + in_{N−1} into shard_sum
  // (reduce_scatter_add's arithmetic: the same bits).
  Status finish(int64_t handle) override {
    Busy busy(this, "reduce-scatter of the gradients");
    std::unique_ptr<PendingReduce> op;
    {
      std::lock_guard<std::mutex> lock(mpi_mu_);
      auto it = std::find_if(pending_.begin(), pending_.end(), [&](const auto& p) { return p->handle == handle; });
      if (it == pending_.end()) return internal_error("reduce-scatter: no pending operation " + std::to_string(handle));
      op = std::move(*it);
      pending_.erase(it);
      const Status waited = check(MPI_Waitall(static_cast<int>(op->requests.size()), op->requests.data(),
                                              MPI_STATUSES_IGNORE), "MPI_Waitall");
      if (!waited.ok()) return drop(std::move(op), waited);
    }
    const int64_t m = op->mine.size();
    if (m == 0) return Status();  // (its receive buffer, empty, is not kept)
    const float* own = op->in + (op->mine.begin - op->region.begin);
    float* dst = op->shard_sum + (op->mine.begin - shard_range(op->n, rank_, size_).begin);
    constexpr int64_t kBlock = 4096;  // values summed at a time (each loop below vectorises)
    float sum[kBlock];
    for (int64_t b = 0; b < m; b += kBlock) {
      const int64_t count = std::min(kBlock, m - b);
      for (int source = 0, slot = 0; source < size_; ++source) {
        const float* src = source == rank_ ? own + b : op->recv.data() + (slot++) * m + b;
        if (source == 0) {
          std::memcpy(sum, src, static_cast<size_t>(count) * sizeof(float));
        } else {
          for (int64_t i = 0; i < count; ++i) sum[i] += src[i];
        }
      }
      for (int64_t i = 0; i < count; ++i) dst[b + i] += sum[i];
    }
    std::lock_guard<std::mutex> lock(mpi_mu_);
    give_buffer(std::move(op->recv));
    return Status();
  }

  // One MPI_Allgatherv in place per kGatherWindow values of the region: rank r contributes its shard's
  // part of the window (counts and displacements in values of value_bytes bytes, from the window's start).
  Status all_gather_region(void* data, Range region, int64_t n, int value_bytes) override {
    if (value_bytes != 2 && value_bytes != 4)
      return internal_error("all-gather: values of " + std::to_string(value_bytes) + " bytes (expected 2 or 4)");
    Busy busy(this, "all-gather of the weights");
    std::lock_guard<std::mutex> lock(mpi_mu_);
    const MPI_Datatype type = value_bytes == 4 ? MPI_FLOAT : MPI_UINT16_T;
    char* bytes = static_cast<char*>(data);
    std::vector<int> counts(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
    for (int64_t b = region.begin; b < region.end; b += kGatherWindow) {
      const Range window{b, std::min(region.end, b + kGatherWindow)};
      for (int owner = 0; owner < size_; ++owner) {
        const Range r = part(window, n, owner);
        counts[owner] = static_cast<int>(r.size());
        displs[owner] = static_cast<int>(r.begin - window.begin);
      }
      DC_RETURN_IF_ERROR(check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, bytes + (b - region.begin) * value_bytes,
                                              counts.data(), displs.data(), type, MPI_COMM_WORLD), "MPI_Allgatherv"));
      bytes_sent_ += int64_t{counts[rank_]} * value_bytes * (size_ - 1);
    }
    return Status();
  }

  Status all_gather_doubles(const double* values, int64_t k, double* all) override {
    Busy busy(this, "all-gather of the metrics");
    std::lock_guard<std::mutex> lock(mpi_mu_);
    bytes_sent_ += k * static_cast<int64_t>(sizeof(double)) * (size_ - 1);
    return check(MPI_Allgather(values, static_cast<int>(k), MPI_DOUBLE, all, static_cast<int>(k), MPI_DOUBLE,
                               MPI_COMM_WORLD), "MPI_Allgather");
  }

  [[noreturn]] void abort(int code, const std::string& message) override {
    std::fprintf(stderr, "rank %d: %s\n", rank_, message.c_str());
    std::fflush(stderr);
    std::unique_lock<std::mutex> lock(mpi_mu_, std::defer_lock);  // the progress thread's MPI call ends first
    for (int i = 0; i < 1000 && !lock.try_lock(); ++i) ::usleep(1000);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  // Marks this rank as waiting in one collective, for the watchdog.
  struct Busy {
    Busy(MpiComm* c, const char* op) : c(c) {
      c->op_.store(op);
      c->busy_since_ms_.store(now_ms());
    }
    ~Busy() { c->busy_since_ms_.store(0); }
    MpiComm* c;
  };

  // After `failed` in a reduce-scatter: completes the sends still pending, so that none reads the caller's
  // buffer after the return (a live peer receives them; a dead one makes the wait fail, and the watchdog
  // bounds it), and returns `failed`. No MPI_Cancel: whether an MPI cancels a send is its choice (Open MPI's
  // ob1 does not), and a peer must not depend on it.
  static Status abandon(std::vector<MPI_Request>& sends, Status failed) {
    MPI_Waitall(static_cast<int>(sends.size()), sends.data(), MPI_STATUSES_IGNORE);
    sends.clear();
    return failed;
  }

  Status check(int rc, const char* call) const {
    if (rc == MPI_SUCCESS) return Status();
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    return io_error("rank " + std::to_string(rank_) + ": " + call + " in " + op_.load() + " failed: " +
                    std::string(text, static_cast<size_t>(len)) +
                    " (another rank has probably died); continue from the last checkpoint with --resume");
  }

  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(200), [this] { return stop_; })) {
      const int64_t since = busy_since_ms_.load();
      if (since == 0 || now_ms() - since < timeout_ms_) continue;
      std::fprintf(stderr,
                   "rank %d: no answer from the other ranks for %.0f s in the %s (a rank died or hangs); ending the "
                   "job (raise --dist-timeout for slow steps); continue from the last checkpoint with --resume\n",
                   rank_, timeout_ms_ / 1000.0, op_.load());
      std::fflush(stderr);
      std::_Exit(124);  // the launcher then stops the other ranks
    }
  }

  // A started reduce-scatter (reduce_scatter_add_start).
  struct PendingReduce {
    int64_t handle = 0;
    const float* in = nullptr;
    Range region, mine;  // mine: this rank's part of the region
    int64_t n = 0;
    float* shard_sum = nullptr;
    std::vector<float> recv;               // [(size − 1) · mine.size()] the other ranks' parts, in rank order
    std::vector<MPI_Request> requests;     // the receives, then the sends
  };

  // owner's shard ∩ region (empty at the region's edge when they do not meet).
  Range part(Range region, int64_t n, int owner) const {
    const Range r = shard_range(n, owner, size_);
    const int64_t begin = std::min(std::max(r.begin, region.begin), region.end);
    return Range{begin, std::max(begin, std::min(r.end, region.end))};
  }

  // (mpi_mu_ held) A receive buffer of at least `values` floats, reused from earlier operations.
  std::vector<float> take_buffer(int64_t values) {
    for (auto it = buffers_.begin(); it != buffers_.end(); ++it)
      if (static_cast<int64_t>(it->capacity()) >= values) {
        std::vector<float> b = std::move(*it);
        buffers_.erase(it);
        b.resize(static_cast<size_t>(values));
        return b;
      }
    return std::vector<float>(static_cast<size_t>(values));
  }
  void give_buffer(std::vector<float> b) { buffers_.push_back(std::move(b)); }

  // (mpi_mu_ held) Completes what an operation still has in flight, so that no send reads its input and no
  // receive writes its buffer after this; the watchdog bounds the wait (a dead peer).
  static void complete_sends(PendingReduce& op) {
    MPI_Waitall(static_cast<int>(op.requests.size()), op.requests.data(), MPI_STATUSES_IGNORE);
  }
  // (mpi_mu_ held) Ends a failed operation: completes it, frees its buffer, returns `failed`.
  Status drop(std::unique_ptr<PendingReduce> op, Status failed) {
    complete_sends(*op);
    give_buffer(std::move(op->recv));
    return failed;
  }

  // (mpi_mu_ held) MPI_Testall on each pending operation: completed requests become MPI_REQUEST_NULL; an
  // error is left for finish's MPI_Waitall to report.
  void test_pending() {
    for (auto& op : pending_) {
      int done = 0;
      if (MPI_Testall(static_cast<int>(op->requests.size()), op->requests.data(), &done, MPI_STATUSES_IGNORE) !=
          MPI_SUCCESS)
        return;
    }
  }

  // While operations are pending: test_pending every kProgressUs, else sleeps until one starts.
  void progress() {
    std::unique_lock<std::mutex> lock(mpi_mu_);
    while (!stop_progress_) {
      if (pending_.empty()) {
        progress_cv_.wait(lock, [this] { return stop_progress_ || !pending_.empty(); });
        continue;
      }
      test_pending();
      progress_cv_.wait_for(lock, std::chrono::microseconds(kProgressUs), [this] { return stop_progress_; });
    }
  }

  int rank_, size_;
  int64_t timeout_ms_;
  // Every MPI call holds mpi_mu_ (the progress thread calls MPI too); pending_ and buffers_ are under it.
  std::mutex mpi_mu_;
  std::condition_variable progress_cv_;
  bool stop_progress_ = false;
  std::deque<std::unique_ptr<PendingReduce>> pending_;
  std::vector<std::vector<float>> buffers_;  // receive buffers of finished operations, for the next ones
  int64_t handles_ = 0;
  std::thread progress_;
  std::atomic<int64_t> busy_since_ms_{0};
  std::atomic<const char*> op_{"start"};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace

Result<std::unique_ptr<Comm>> world_comm(double timeout_s) {
  if (!launched_as_ranks()) return single_comm();
  int provided = 0;
  // SERIALIZED: the progress thread calls MPI too (never at the same time as another thread: mpi_mu_).
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
    return io_error("MPI_Init failed: data-parallel training cannot start");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int local_rank = 0;  // among the ranks that share this host's memory
  MPI_Comm host = MPI_COMM_NULL;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host) != MPI_SUCCESS ||
      MPI_Comm_rank(host, &local_rank) != MPI_SUCCESS)
    return io_error("MPI_Comm_split_type failed: this rank's index on its host is unknown");
  MPI_Comm_free(&host);
  // Below SERIALIZED, no progress thread: started reduce-scatters move only inside start and finish.
  auto comm = std::make_unique<MpiComm>(rank, size, timeout_s, provided >= MPI_THREAD_SERIALIZED);
  comm->set_local_rank(local_rank);
  return std::unique_ptr<Comm>(std::move(comm));
}

#else

Result<std::unique_ptr<Comm>> world_comm(double) {
  if (!launched_as_ranks()) return single_comm();
  return unimplemented("this diffucoder was built without MPI (CMake -DDIFFUCODER_MPI=ON needs Debian's "
                       "libopenmpi-dev): data-parallel training over ranks needs it; run without mpirun for one "
                       "process");
}

#endif

}  // namespace dc::dist
