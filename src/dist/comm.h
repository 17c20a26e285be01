// Comm: the communication of data-parallel training (`mpirun -np N diffucoder train`): rank and size,
// barrier, broadcast, the reduce-scatter / all-gather of ZeRO over one flat buffer split into contiguous
// shards (shard_range; the all-gather in f32 or bf16), and the gathering of per-rank metrics. Backends: one process (size 1,
// no MPI) and MPI (comm_mpi.cc, built when CMake finds MPI: DIFFUCODER_MPI); a GPU backend (NCCL) would
// be a third implementation of the same interface.
//
// Deterministic: the reduce-scatter adds the ranks' contributions in rank order 0, 1, …, N−1 on the
// shard's owner, whatever order the messages arrive in, so a run is bit-reproducible for a given N.
// Overlap: a reduce-scatter may also be started and finished later (reduce_scatter_add_start / finish),
// so that a bucket's messages travel while the caller computes the next one (the backward's layers).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace dc::dist {

// [begin, end) of a flat buffer.
struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
// The shard of `rank` when n values are split over `size` ranks: contiguous, in rank order, the first
// n % size shards one value longer.
Range shard_range(int64_t n, int rank, int size);

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;  // "single", "mpi"
  // This rank's index among the ranks on its host (MPI's shared-memory split of the world, whatever the
  // launcher): 0 in one process. A trainer on a device picks the device of this index by default.
  int local_rank() const { return local_rank_; }

  virtual Status barrier() = 0;
  // `bytes` bytes at data, from rank `root` to every rank.
  virtual Status broadcast(void* data, int64_t bytes, int root) = 0;
  // The reduce-scatter of ZeRO-2's buckets (e.g. one layer's gradients) over a flat buffer [n] split by
  // shard_range: in [region.size()] holds this rank's values of the flat indices region.begin…end; this
  // rank's shard's part of the region, summed over the ranks in rank order (in₀ + in₁ + … + in_{N−1}), is
  // ADDED into shard_sum [shard size] (index 0 at the shard's begin). Every rank calls it with the same
  // region and n.
  // Blocking, in chunks of 4 MiB: no memory beyond a chunk's sum.
  virtual Status reduce_scatter_add(const float* in, Range region, int64_t n, float* shard_sum) = 0;
  // The same reduce-scatter, non-blocking: start sends the other owners' parts of `in` and posts the
  // receives of this rank's part (into receive buffers of its own: (N−1) × this rank's part of the
  // region, 4 bytes per value, kept for reuse) and returns a handle; finish(handle) waits for them and adds
  // the rank-order sum into shard_sum (bit for bit reduce_scatter_add's). Until finish returns, `in` must
  // not change and shard_sum's part of the region must not be read. Several may be in flight; every rank
  // starts them in the same order; each is finished once (any order). An error of start leaves nothing
  // pending; an error of finish ends the handle (its sends completed first, as reduce_scatter_add's do).
  virtual Result<int64_t> reduce_scatter_add_start(const float* in, Range region, int64_t n, float* shard_sum) = 0;
  virtual Status finish(int64_t handle) = 0;
  // The all-gather of ZeRO's updated weights over a flat buffer [n] split by shard_range: data
  // [region.size()] holds the values region.begin…end of values of `value_bytes` bytes (4: f32, 2: bf16);
  // each rank's shard's part of the region is copied to every other rank (in place: one MPI_Allgatherv per
  // 2^30 values of the region). Every rank calls it with the same region, n and value_bytes.
  virtual Status all_gather_region(void* data, Range region, int64_t n, int value_bytes) = 0;
  // data [n] f32: every rank's shard of it copied to every other rank (in place).
  Status all_gather(float* data, int64_t n) { return all_gather_region(data, {0, n}, n, sizeof(float)); }
  // values [k] of each rank → all [size·k] on every rank, rank r's at r·k.
  virtual Status all_gather_doubles(const double* values, int64_t k, double* all) = 0;
  // Ends the whole job with `code` after `message` is printed (every rank stops).
  [[noreturn]] virtual void abort(int code, const std::string& message) = 0;

  // Bytes this rank has sent since it started (for the benchmarks' bytes per step).
  int64_t bytes_sent() const { return bytes_sent_; }

  // Helpers over the primitives: a string from root to all (length, then bytes); the sum over ranks of
  // each of the k values (added in rank order, so every rank gets the same bits).
  Status broadcast_string(std::string& s, int root);
  Result<std::vector<double>> sum_doubles(const std::vector<double>& values);

 protected:
  int64_t bytes_sent_ = 0;
  int local_rank_ = 0;
};

// One process: size 1, every operation a copy or nothing.
std::unique_ptr<Comm> single_comm();

// True when the environment says an MPI launcher started this process as one of several ranks
// (OMPI_COMM_WORLD_SIZE or PMI_SIZE above 1, or PMIX_RANK set with SLURM_NTASKS above 1).
bool launched_as_ranks();

// The communicator of this process: MPI's world when launched as ranks (MPI_Init; errors return
// instead of aborting, a SIGTERM from the launcher prints who stopped, and a collective that waits
// longer than timeout_s seconds ends the job with a message naming the operation), else single_comm().
// Launched as ranks without MPI built in: an error saying data parallelism needs it.
Result<std::unique_ptr<Comm>> world_comm(double timeout_s);

}  // namespace dc::dist
