// The MPI Comm checked under `mpirun -np N` (ctest dist_mpi_comm_*): every rank builds every rank's input
// from the same seeds, so each can compute the expected results itself. The reduce-scatter must equal, bit
// for bit, the contributions added in rank order (its determinism contract) for sizes that split unevenly
// and span several messages' worth of chunks; all-gather, broadcast and the metric sums must be exact.
// Exit 0 when every check holds; else a line per failure and exit 1.
// `mpi_comm_check --hang`: the timeout path instead — rank 1 never joins the barrier, so rank 0's watchdog
// (a 2 s timeout) must end the job with its message (ctest dist_mpi_timeout matches it).
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
  expect(size > 1, "launched as more than one rank", rank);
  expect(std::strcmp(comm.backend(), "mpi") == 0, "the MPI backend", rank);
  for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{1000}, int64_t{3000001}}) {  // the last: several chunks per shard
    std::vector<float> in(n);
    for (int64_t i = 0; i < n; ++i) in[i] = value(rank, i);
    const dc::dist::Range mine = dc::dist::shard_range(n, rank, size);
    std::vector<float> out(mine.size());
    expect(comm.reduce_scatter_sum(in.data(), n, out.data()).ok(), "reduce_scatter_sum returns ok", rank);
    bool same = true;
    for (int64_t i = mine.begin; i < mine.end; ++i) {
      std::vector<float> parts(size);
      for (int r = 0; r < size; ++r) parts[r] = value(r, i);
      float want = parts[0];
      for (int r = 1; r < size; ++r) want += parts[r];
      if (same && std::memcmp(&want, &out[i - mine.begin], sizeof(float)) != 0)
        std::fprintf(stderr, "rank %d: n %lld, value %lld: %.9g, the rank-order sum is %.9g\n", rank, (long long)n,
                     (long long)i, out[i - mine.begin], want), same = false;
    }
    expect(same, "reduce-scatter equals the rank-order sum bit for bit", rank);
    std::vector<float> in_place = in;  // out = the input's own shard
    expect(comm.reduce_scatter_sum(in_place.data(), n, in_place.data() + mine.begin).ok(), "in place: ok", rank);
    expect(mine.size() == 0 ||  // (an empty shard: rank 1 of n = 1)
               std::memcmp(in_place.data() + mine.begin, out.data(), mine.size() * sizeof(float)) == 0,
           "in place: the same sums", rank);
    // all-gather: each rank fills only its shard; afterwards all hold everything.
    std::vector<float> data(n, -1.0f);
    for (int64_t i = mine.begin; i < mine.end; ++i) data[i] = static_cast<float>(i) * 0.5f;
    expect(comm.all_gather(data.data(), n).ok(), "all_gather returns ok", rank);
    bool gathered = true;
    for (int64_t i = 0; i < n; ++i) gathered = gathered && data[i] == static_cast<float>(i) * 0.5f;
    expect(gathered, "all-gather gives every rank every shard", rank);
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
