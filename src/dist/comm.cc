// shard_range, the single-process Comm and the helpers every backend shares.
#include "dist/comm.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace dc::dist {

Range shard_range(int64_t n, int rank, int size) {
  const int64_t base = n / size, extra = n % size;
  const int64_t begin = rank * base + (rank < extra ? rank : extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

Status Comm::broadcast_string(std::string& s, int root) {
  int64_t len = static_cast<int64_t>(s.size());
  DC_RETURN_IF_ERROR(broadcast(&len, sizeof(len), root));
  s.resize(static_cast<size_t>(len));
  return len == 0 ? Status() : broadcast(s.data(), len, root);
}

Result<std::vector<double>> Comm::sum_doubles(const std::vector<double>& values) {
  const int64_t k = static_cast<int64_t>(values.size());
  std::vector<double> all(static_cast<size_t>(k * size()));
  DC_RETURN_IF_ERROR(all_gather_doubles(values.data(), k, all.data()));
  std::vector<double> sum(values.size(), 0.0);
  for (int r = 0; r < size(); ++r)
    for (int64_t i = 0; i < k; ++i) sum[i] += all[r * k + i];
  return sum;
}

namespace {

class SingleComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "single"; }
  Status barrier() override { return Status(); }
  Status broadcast(void*, int64_t, int) override { return Status(); }
  Status reduce_scatter_add(const float* in, Range region, int64_t, float* shard_sum) override {
    for (int64_t i = 0; i < region.size(); ++i) shard_sum[region.begin + i] += in[i];
    return Status();
  }
  Result<int64_t> reduce_scatter_add_start(const float* in, Range region, int64_t n, float* shard_sum) override {
    DC_RETURN_IF_ERROR(reduce_scatter_add(in, region, n, shard_sum));  // one process: nothing to wait for
    return ++handles_;
  }
  Status finish(int64_t) override { return Status(); }
  Status all_gather_region(void*, Range, int64_t, int) override { return Status(); }
  Status all_gather_doubles(const double* values, int64_t k, double* all) override {
    if (k > 0) std::memcpy(all, values, static_cast<size_t>(k) * sizeof(double));
    return Status();
  }
  [[noreturn]] void abort(int code, const std::string& message) override {
    std::fprintf(stderr, "%s\n", message.c_str());
    std::exit(code);
  }

 private:
  int64_t handles_ = 0;
};

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? -1 : std::atoi(v);
}

}  // namespace

std::unique_ptr<Comm> single_comm() { return std::make_unique<SingleComm>(); }

bool launched_as_ranks() {
  // PMIx (srun --mpi=pmix, prterun) sets PMIX_RANK but no size; under Slurm the size is SLURM_NTASKS.
  return env_int("OMPI_COMM_WORLD_SIZE") > 1 || env_int("PMI_SIZE") > 1 ||
         (env_int("PMIX_RANK") >= 0 && env_int("SLURM_NTASKS") > 1);
}

}  // namespace dc::dist
