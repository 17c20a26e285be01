// The MPI Comm checked under `mpirun -np N` (ctest dist_mpi_comm_*): every rank builds every rank's input
// from the same seeds, so each can compute the expected results itself. The reduce-scatter must add, bit
// for bit, the contributions summed in rank order (its determinism contract) for sizes that split unevenly
// and span several messages' worth of chunks, over the whole buffer and over a region of it; all-gather, broadcast and the metric sums must be exact.
// Every rank runs on this host: its local rank (the device a rank trains on by default) is its rank.
// The non-blocking reduce-scatter (start / finish) with several buckets in flight must give the same bits;
// the all-gather (one MPI_Allgatherv) every rank's shard, in f32 and bf16, for shards of unequal sizes
// (n % size != 0) and regions that cut them.
// Exit 0 when every check holds; else a line per failure and exit 1.
// `mpi_comm_check --hang`: the timeout path instead — rank 1 never joins the barrier, so rank 0's watchdog
// (a 2 s timeout) must end the job with its message (ctest dist_mpi_timeout matches it).
// `mpi_comm_check --truncated` (2 ranks): an error inside the reduce-scatter — rank 1 sends rank 0 a longer
// part than rank 0's region expects (MPI_ERR_TRUNCATE) while rank 0's own large send to rank 1 is still
// pending. Rank 0 must get the error, with no send left pending: it overwrites its input at once, and rank 1
// must still receive the values from before.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <unistd.h>
#include <vector>

#include "core/splitmix64.h"
#include "dist/comm.h"

namespace {

int failures = 0;
void expect(bool ok, const char* what, int rank) {
  if (!ok) {
    std::fprintf(stderr, "rank %d: FAILED: %s\n", rank, what);
    ++failures;
  }
}

// Values of rank r's input: magnitudes that differ a lot, so a different summation order changes bits.
// (noinline and stored: the sums below must not fuse the value's product into an FMA)
__attribute__((noinline)) float value(int r, int64_t i) {
  const uint64_t h = dc::splitmix64(static_cast<uint64_t>(r) * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i));
  const float scale = (h & 3) == 0 ? 1e6f : (h & 3) == 1 ? 1.0f : 1e-6f;
  return scale * (static_cast<float>(h >> 40) / static_cast<float>(1 << 24) - 0.5f);
}

// The --truncated check (see the top): n = 2^21 values, rank 0's shard [0, 2^20), rank 1's [2^20, 2^21).
int truncated(dc::dist::Comm& comm) {
  const int rank = comm.rank();
  constexpr int64_t n = int64_t{1} << 21, half = n / 2;
  // rank 0's region leaves it 1 value of its shard (so it expects 1 from rank 1) and rank 1's whole shard
  // (one send of 2^20 values, too large to go eagerly); rank 1's region gives rank 0 10 values.
  const dc::dist::Range region = rank == 0 ? dc::dist::Range{half - 1, n} : dc::dist::Range{half - 10, n};
  std::vector<float> in(region.size());
  for (int64_t i = 0; i < region.size(); ++i) in[i] = value(rank, region.begin + i);
  std::vector<float> sum(half, 0.0f);
  const dc::Status s = comm.reduce_scatter_add(in.data(), region, n, sum.data());
  if (rank == 0) {
    std::fill(in.begin(), in.end(), 7.0f);  // the caller's buffer is its own again once the call returns
    expect(!s.ok() && s.message().find("MPI_Recv in reduce-scatter of the gradients failed") != std::string::npos,
           "rank 0 gets the receive's error", rank);
    std::fprintf(stderr, "%s\n", s.message().c_str());
  } else {
    expect(s.ok(), "rank 1's reduce-scatter succeeds", rank);
  }
  expect(comm.barrier().ok(), "barrier after the error", rank);
  if (rank == 1) {
    bool same = true;
    for (int64_t i = 0; i < half && same; ++i) {
      const float want = value(0, half + i) + value(1, half + i);
      same = std::memcmp(&want, &sum[i], sizeof(float)) == 0;
    }
    expect(same, "rank 1 received rank 0's values from before the error", rank);
  }
  if (failures == 0 && rank == 0) std::printf("mpi_comm_check --truncated: ok\n");
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const bool hang = argc > 1 && std::strcmp(argv[1], "--hang") == 0;
  auto comm_or = dc::dist::world_comm(hang ? 2 : 60);
  if (!comm_or.ok()) {
    std::fprintf(stderr, "%s\n", comm_or.status().message().c_str());
    return 1;
  }
  dc::dist::Comm& comm = **comm_or;
  const int rank = comm.rank(), size = comm.size();
  if (hang) {
    if (rank == 1) sleep(30);  // the launcher stops it when rank 0 ends the job
    const dc::Status s = comm.barrier();
    std::fprintf(stderr, "rank %d: the barrier returned (%s) instead of timing out\n", rank, s.message().c_str());
    return 1;
  }
  if (argc > 1 && std::strcmp(argv[1], "--truncated") == 0) return truncated(comm);
  expect(size > 1, "launched as more than one rank", rank);
  expect(std::strcmp(comm.backend(), "mpi") == 0, "the MPI backend", rank);
  expect(comm.local_rank() == rank, "the local rank is the rank (one host)", rank);  // every rank on this host
  for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{1000}, int64_t{3000001}}) {  // the last: several chunks per shard
    std::vector<float> in(n);
    for (int64_t i = 0; i < n; ++i) in[i] = value(rank, i);
    const dc::dist::Range mine = dc::dist::shard_range(n, rank, size);
    // reduce_scatter_add over the whole buffer and over a region (ZeRO-2's bucket): only the region's part
    // of the shard changes, by the rank-order sum added to what was there.
    for (const dc::dist::Range region : {dc::dist::Range{0, n}, dc::dist::Range{n / 3, n - n / 4}}) {
      std::vector<float> acc(mine.size());
      for (int64_t i = 0; i < mine.size(); ++i) acc[i] = region.begin == 0 ? 0.0f : static_cast<float>(i) * 0.25f;
      const std::vector<float> before = acc;
      expect(comm.reduce_scatter_add(in.data() + region.begin, region, n, acc.data()).ok(),
             "reduce_scatter_add returns ok", rank);
      bool same = true;
      for (int64_t i = mine.begin; i < mine.end; ++i) {
        float want = before[i - mine.begin];
        if (i >= region.begin && i < region.end) {
          float sum = value(0, i);
          for (int r = 1; r < size; ++r) sum += value(r, i);
          want += sum;
        }
        if (same && std::memcmp(&want, &acc[i - mine.begin], sizeof(float)) != 0)
          std::fprintf(stderr, "rank %d: n %lld, region [%lld, %lld), value %lld: %.9g, the rank-order sum is %.9g\n",
                       rank, (long long)n, (long long)region.begin, (long long)region.end, (long long)i,
                       acc[i - mine.begin], want), same = false;
      }
      expect(same, "reduce-scatter adds the rank-order sum of the region bit for bit", rank);
    }
    // Non-blocking: three buckets (ZeRO-2's layers) started at once, the next started before the earlier
    // ones finish, finished out of order; each adds the same rank-order sum bit for bit, and a blocking
    // reduce-scatter run while they are in flight does not take their messages.
    {
      std::vector<float> acc(mine.size(), 0.0f), blocking(mine.size(), 0.0f);
      const dc::dist::Range buckets[3] = {{0, n / 3}, {n / 3, 2 * n / 3}, {2 * n / 3, n}};
      int64_t handles[3] = {0, 0, 0};
      bool started = true;
      for (int k = 2; k >= 0; --k) {  // the backward's order: last layer first
        auto h = comm.reduce_scatter_add_start(in.data() + buckets[k].begin, buckets[k], n, acc.data());
        started = started && h.ok();
        handles[k] = h.ok() ? *h : 0;
      }
      expect(started, "reduce_scatter_add_start returns a handle", rank);
      expect(comm.reduce_scatter_add(in.data(), {0, n}, n, blocking.data()).ok(), "a blocking one in between", rank);
      usleep(20000);  // the caller computes; the progress thread moves the messages
      for (int k : {1, 2, 0}) expect(comm.finish(handles[k]).ok(), "finish returns ok", rank);
      expect(!comm.finish(handles[0]).ok(), "a finished handle is not finished twice", rank);
      bool same = true;
      for (int64_t i = mine.begin; i < mine.end && same; ++i) {
        float want = value(0, i);
        for (int r = 1; r < size; ++r) want += value(r, i);
        same = std::memcmp(&want, &acc[i - mine.begin], sizeof(float)) == 0 &&
               std::memcmp(&want, &blocking[i - mine.begin], sizeof(float)) == 0;
        if (!same)
          std::fprintf(stderr, "rank %d: n %lld, value %lld: started %.9g, blocking %.9g, the rank-order sum %.9g\n", rank,
                       (long long)n, (long long)i, acc[i - mine.begin], blocking[i - mine.begin], want);
      }
      expect(same, "started reduce-scatters add the rank-order sum bit for bit", rank);
    }
    // all-gather: each rank fills only its shard; afterwards all hold everything.
    std::vector<float> data(n, -1.0f);
    for (int64_t i = mine.begin; i < mine.end; ++i) data[i] = static_cast<float>(i) * 0.5f;
    expect(comm.all_gather(data.data(), n).ok(), "all_gather returns ok", rank);
    bool gathered = true;
    for (int64_t i = 0; i < n; ++i) gathered = gathered && data[i] == static_cast<float>(i) * 0.5f;
    expect(gathered, "all-gather gives every rank every shard", rank);
    // bf16 all-gather of a region straddling the shards: each rank's part of it, 2-byte values.
    const dc::dist::Range part{n / 3, n - n / 5};
    std::vector<uint16_t> words(static_cast<size_t>(part.size()), 0xffff);
    for (int64_t i = std::max(mine.begin, part.begin); i < std::min(mine.end, part.end); ++i)
      words[i - part.begin] = static_cast<uint16_t>(i * 7);
    expect(comm.all_gather_region(words.data(), part, n, 2).ok(), "all_gather_region (bf16) returns ok", rank);
    bool halves = true;
    for (int64_t i = part.begin; i < part.end; ++i) halves = halves && words[i - part.begin] == uint16_t(i * 7);
    expect(halves, "the bf16 all-gather of a region gives every rank the region's values", rank);
  }
  std::string s = rank == 0 ? "from rank 0" : "";
  expect(comm.broadcast_string(s, 0).ok() && s == "from rank 0", "broadcast_string", rank);
  auto sum = comm.sum_doubles({1.0 + rank, 0.1});
  double want_a = 0, want_b = 0;
  for (int r = 0; r < size; ++r) want_a += 1.0 + r, want_b += 0.1;
  expect(sum.ok() && (*sum)[0] == want_a && (*sum)[1] == want_b, "sum_doubles in rank order", rank);
  expect(comm.barrier().ok(), "barrier", rank);
  expect(comm.bytes_sent() > 0, "bytes_sent counts the payload", rank);
  if (failures == 0 && rank == 0) std::printf("mpi_comm_check: %d ranks ok\n", size);
  return failures == 0 ? 0 : 1;
}
