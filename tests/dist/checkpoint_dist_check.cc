// Sharded checkpoint saves that fail, under `mpirun -np 2` (ctest dist_checkpoint_failed_write):
// `checkpoint_dist_check MODEL_DIR OUT_DIR` saves the zero weights of MODEL_DIR's shape three times into
// OUT_DIR with save_sharded_train_checkpoint: (1) rank 1 cannot write its moment shard (a file size limit of
// 1 KB on rank 1 only), (2) rank 0's own files fail (its extra writer returns an error), (3) nothing fails.
// The failed saves must end with an error on every rank — the failing rank's naming its file or cause, the
// other's saying another rank failed — and nothing in OUT_DIR (no checkpoint, no temporary directory);
// every rank must still be in step for the next save, which must write the whole checkpoint.
// Exit 0 when every check holds; else a line per failure and exit 1.
#include <sys/resource.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "gguf/model_source.h"
#include "model/params.h"
#include "train/checkpoint.h"

namespace {

namespace fs = std::filesystem;
int failures = 0;
int rank = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "rank %d: FAILED: %s\n", rank, what.c_str());
    ++failures;
  }
}

bool contains(const dc::Status& s, const std::string& text) { return s.message().find(text) != std::string::npos; }

// OUT_DIR's entries (seen by rank 0 once every rank has returned).
std::vector<std::string> entries(dc::dist::Comm& comm, const fs::path& out) {
  std::vector<std::string> names;
  if (!comm.barrier().ok()) return {"(barrier failed)"};
  for (const auto& e : fs::directory_iterator(out)) names.push_back(e.path().filename().string());
  return names;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: checkpoint_dist_check MODEL_DIR OUT_DIR\n");
    return 2;
  }
  const std::string model_dir = argv[1];
  const fs::path out = argv[2];
  auto comm_or = dc::dist::world_comm(60);
  if (!comm_or.ok()) {
    std::fprintf(stderr, "%s\n", comm_or.status().message().c_str());
    return 1;
  }
  dc::dist::Comm& comm = **comm_or;
  rank = comm.rank();
  expect(comm.size() == 2, "launched as 2 ranks");
  auto config = dc::model_source_config(model_dir);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().message().c_str());
    return 1;
  }
  if (rank == 0) fs::remove_all(out), fs::create_directories(out);
  const dc::ModelParams params = dc::ModelParams::zeros(*config);
  const dc::dist::Range shard = dc::dist::shard_range(params.n_values(), rank, comm.size());
  const std::vector<float> m(shard.size(), 0.5f), v(shard.size(), 0.25f);
  dc::train::TrainState state;
  state.step = 1;
  const std::string dir = (out / dc::train::checkpoint_name(1)).string();

  // (1) rank 1's moment shard is refused by the file size limit.
  rlimit saved = {};
  if (rank == 1) {
    std::signal(SIGXFSZ, SIG_IGN);  // the write then fails with EFBIG instead of the signal ending the rank
    getrlimit(RLIMIT_FSIZE, &saved);
    rlimit small = saved;
    small.rlim_cur = 1024;
    setrlimit(RLIMIT_FSIZE, &small);
  }
  dc::Status s = dc::train::save_sharded_train_checkpoint(comm, dir, model_dir, params, m.data(), v.data(), state);
  if (rank == 1) setrlimit(RLIMIT_FSIZE, &saved);
  std::fprintf(stderr, "rank %d, rank 1's write fails: %s\n", rank, s.message().c_str());
  expect(!s.ok(), "(1) the save fails");
  expect(contains(s, rank == 1 ? "optimizer-rank00001-of-00002" : "another rank could not write its part"),
         "(1) the error names the failed file, or says another rank failed");
  if (rank == 0) expect(entries(comm, out).empty(), "(1) nothing left in OUT_DIR");
  else entries(comm, out);

  // (2) rank 0's extra file fails.
  const dc::train::ExtraCheckpointFiles failing = [](const std::string&) {
    return dc::io_error("the extra file cannot be written (injected)");
  };
  s = dc::train::save_sharded_train_checkpoint(comm, dir, model_dir, params, m.data(), v.data(), state, failing);
  std::fprintf(stderr, "rank %d, rank 0's files fail: %s\n", rank, s.message().c_str());
  expect(!s.ok(), "(2) the save fails");
  expect(contains(s, rank == 0 ? "(injected)" : "another rank could not write its part"),
         "(2) the error is rank 0's, or says another rank failed");
  if (rank == 0) expect(entries(comm, out).empty(), "(2) nothing left in OUT_DIR");
  else entries(comm, out);

  // (3) nothing fails: the whole checkpoint.
  s = dc::train::save_sharded_train_checkpoint(comm, dir, model_dir, params, m.data(), v.data(), state);
  expect(s.ok(), "(3) the save succeeds: " + s.message());
  if (rank == 0) {
    expect(entries(comm, out) == std::vector<std::string>{dc::train::checkpoint_name(1)}, "(3) one checkpoint");
    for (const char* f : {"model.safetensors", "trainer_state.json", "config.json",
                          "optimizer-rank00000-of-00002.safetensors", "optimizer-rank00001-of-00002.safetensors"})
      expect(fs::exists(fs::path(dir) / f), std::string("(3) the checkpoint holds ") + f);
  } else {
    entries(comm, out);
  }
  if (failures == 0 && rank == 0) std::printf("checkpoint_dist_check: ok\n");
  return failures == 0 ? 0 : 1;
}
