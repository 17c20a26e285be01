#!/usr/bin/env bash
# Builds and runs the whole test suite with ctest (unit tests, PyTorch-reference parity, tokenizer
# goldens, CLI). Usage: scripts/test.sh [--sanitize | --tsan] [--build-only]   (--sanitize: ASan + UBSan build in
# build-asan/; --build-only: configure and build, no test (CI builds the next stage while this one's tests run);
# --tsan: ThreadSanitizer build in build-tsan/ of only the concurrency tests: the thread pool,
# generations on one and on two engines from two threads, set_matmul_precision against a generation on
# another thread (Concurrency.*), and the server's streams, which its connection hub
# writes while the engine thread wakes it)
set -euo pipefail
cd "$(dirname "$0")/.."
# Runs a stage (its name, then the command) and prints its wall time and the CPU time (user + sys) of its
# processes, so that CI's log shows where time goes (the CPU seconds do not depend on the machine's load).
timed() {
  local name="$1" t0=$SECONDS c0
  shift
  c0=$(child_cpu_s)
  "$@"
  echo "test.sh: ${name} took $((SECONDS - t0)) s ($(($(child_cpu_s) - c0)) s of CPU)" >&2
}
# The CPU seconds of this shell's finished children (cutime + cstime of /proc/PID/stat, in clock ticks).
child_cpu_s() {
  awk -v hz="$(getconf CLK_TCK)" '{ printf "%d", ($16 + $17) / hz }' "/proc/$$/stat"
}
# A fresh build directory uses Ninja when it is installed (scripts/setup.sh installs it): it compiles a target's
# files while the libraries it links are still being built, where Make waits for them, and spends less CPU
# on its own bookkeeping. An existing build directory keeps its generator (CMake cannot change it).
generator() {
  if [ ! -f "$1/CMakeCache.txt" ] && command -v ninja >/dev/null; then echo "-GNinja"; fi
}
# The PyTorch reference fixtures do not depend on the build: a sanitizer stage after the Release one starts from
# its copy, which make_fixtures.py finds up to date by its stamp, instead of running PyTorch again (~30-40 s).
reuse_fixtures() {
  if [ -f build/fixtures/.complete ] && [ ! -f "$1/fixtures/.complete" ]; then
    mkdir -p "$1" && cp -a build/fixtures "$1/"
  fi
}
stage="" build_only=0
for arg in "$@"; do
  case "$arg" in
    --sanitize|--tsan) stage="$arg" ;;
    --build-only) build_only=1 ;;
    *) echo "test.sh: unknown option '$arg' (scripts/test.sh [--sanitize | --tsan] [--build-only])" >&2; exit 2 ;;
  esac
done
scripts/setup.sh --no-build
dir=build; flags=(-DCMAKE_BUILD_TYPE=Release); exclude=()
if [ "$stage" = "--tsan" ]; then
  cmake -S . -B build-tsan $(generator build-tsan) -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g1" -DDC_SANITIZE_THREAD=ON \
    -DDC_BUILD_BENCH=OFF >/dev/null
  timed "tsan build" cmake --build build-tsan -j"$(nproc)" --target test_core test_engine test_server
  [ "$build_only" = 1 ] && exit 0
  export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
  # (a pool that lets two callers overwrite each other's job deadlocks: the timeout turns that into a failure)
  timed "tsan ThreadPool tests" timeout 600 build-tsan/tests/test_core --gtest_filter='ThreadPool.*'
  timed "tsan Concurrency tests" timeout 600 build-tsan/tests/test_engine --gtest_filter='Concurrency.*'
  # (the server tests whose timing does not depend on the decoding speed, which ThreadSanitizer divides by ~30)
  reuse_fixtures build-tsan
  [ -e build-tsan/fixtures/.complete ] || (cd build-tsan && ctest -R '^reference_fixtures$' >/dev/null)
  timed "tsan server tests" timeout 600 build-tsan/tests/test_server --gtest_filter='Scheduler.Listener*:Scheduler.Cancel*:Connections.KeepAlive*:Connections.ConnectionIsKeptAliveAfterAStream:Connections.QueuedStreamTimesOutWith503:HttpTest.Stream*:HttpTest.ChatStream*:HttpTest.Disconnects*:HostileHttp.StopEndsOpenStreamsCleanly:HostileHttp.HalfClosedClientGetsItsAnswer'
  exit 0
fi
if [ "$stage" = "--sanitize" ]; then
  # -O1 -g1: the sanitizers need no more, and it halves the compile time of CI
  dir=build-asan; flags=(-DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g1" -DDC_SANITIZE=ON -DDC_BUILD_BENCH=OFF)
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  # Twenty-four long tests run in the Release stage only, to keep CI within its 45 minutes: GRPO's learning tests
  # (`GrpoLearningTest[.]`: an SFT fixture, then GRPO, LoRA GRPO and `grpo --device vulkan` from it as processes,
  # counted as one, the device's DISABLED; ~160 s of CPU in Release), GRPO's 2-ranks-equal-1 numbers (~60 s under
  # ASan; GrpoCliOnTwoRanks and the SFT TrainDist tests drive the same MPI and GRPO code under the
  # sanitizers), SFT's 2-ranks-equal-1 numbers in f32 (~140 s under ASan; the mixed-precision and the
  # two-hosts tests drive the same sharded optimizer under them), a 512-step stream against a stalled
  # reader (~45 s under ASan; the other stream tests drive the hub's buffers under them), `diffucoder
  # grpo` killed and resumed (~65 s under ASan; GrpoTrainerTest.ResumedRunIsBitIdentical drives the same
  # resume in-process, TrainCli's killed run the CLI's checkpoints under them), the two block-cache
  # numbers tests over every reference case (~34 and ~29 s under ASan; BlockParity's one-layer models decode
  # with every cache mode under them) and SFT's learning test (~23 s under ASan; the other Trainer, ApiTrainer
  # and gradient tests drive the same step under them). Also the two whole-benchmark EvalPlus checks (every
  # HumanEval+ canonical solution on its 124k inputs, ~250 s, and every MBPP reference solution, ~150 s, under
  # load): their work is the sandboxed Python's, which ASan does not instrument; the other EvalPlusCli tests
  # (known-wrong programs, the cache, the model mode) drive the same runner and cache under the sanitizers.
  # Likewise HumanEval's 164 canonical solutions through `diffucoder eval` (~46 s under ASan, ~50 s in Release:
  # the sandboxed Python's work); EvalCli's broken solutions, killed run and model mode drive the same eval
  # runner under them.
  # And GRPO on a GGUF file against the same model as a directory (~43 s under ASan; GrpoLossAndBenchTrainReadTheFile
  # and the other ModelSource tests read the file's tensors under them, GrpoTrainerTest's in-process runs the same GRPO
  # step), and the
  # docs' check (~124 s under ASan: it runs the docs' demo blocks; it checks the docs, which no sanitizer changes).
  # And two more MPI runs (~94 s and ~50 s under ASan: gradient accumulation's two reduction orders, LoRA on two
  # ranks; LayersShareTwoSlots, the mixed-precision and two-hosts runs drive the same reductions and shards under
  # them) and the NaN / infinity check of every FLOAT flag (~82 s under ASan: ~300 starts of the CLI; the parse
  # of a flag's value is the same code for each, which the other FiniteFlags and Help tests drive under them).
  # And `grpo --device vulkan` against the CPU as processes (~66 s under ASan; test_train_vulkan's GRPO tests
  # run the same device trainer in-process under them) and the GPU session script's plumbing on lavapipe (~73 s
  # under ASan: a shell script driving bench and the server, whose code the bench and server tests cover).
  # And the GRPO facade's run against the CLI's, then resumed (~82 s under ASan: three GRPO runs; ApiGrpo's field
  # checks, GrpoTrainerTest's in-process run and resume and GrpoCliOnTwoRanks drive the facade, the trainer and the
  # CLI under them), `train --device vulkan` against the CPU as processes (~47 s under ASan; TrainerVulkan's tests
  # run the same device SFT step in-process under them) and the installed library's CMake consumer (~38 s under
  # ASan: a CMake configure and compile of a small program; api_public_header_alone compiles the public headers under them).
  # And the committed cache's two numbers tests (~35 s and ~29 s under ASan: its rule over a decoding, its agreement
  # with dual on a trained tiny model); BlockParity's committed-equals-dual and per-row tests and KvCache's per-row
  # forward drive the same code under them. And the GRPO facade's overlapped rewards against the CLI's sequential ones
  # (~37 s under ASan: two GRPO runs; RewardScorer's tests and
  # GrpoTrainerTest.RewardsAwaitedAfterTheLogProbsEqualRewardsGiven drive the scorer's thread, its chunks and the
  # awaited rewards under them).
  exclude=(-E '^(EvalPlusCli[.](CanonicalSolutionsPassBaseAndPlus|MbppReferenceSolutionsPassTheirTests)$|EvalCli[.]AllCanonicalSolutionsPass$|GrpoLearningTest[.]|TrainDist[.](GrpoOnTwoRanksEqualsOneProcess|TwoRanksEqualOneRankWithHalfTheOptimizerStateEach|GradAccumReducedOncePerStepEqualsPerMicroBatch|LoraOnTwoRanksEqualsOneProcess)$|FiniteFlags[.]EveryFloatFlagRefusesNanAndInfinity$|DeviceCli[.]GrpoOnVulkanEqualsTheCpu$|gpu_session_plumbing$|Connections[.]StalledStreamReaderDoesNotDelayOthers$|GrpoTrainerTest[.]CliKilledRunResumesBitIdentical$|BlockParity[.](RefreshForwardsAreFullPassesBitForBit|PrefixAndDualDriftFromCacheNone)$|Trainer[.]LossFallsWellBelowItsStartOnACodeCorpus$|ModelSource[.]GrpoOnTheFileEqualsGrpoOnTheDirectory$|check_docs(_selftest)?$|ApiGrpo[.](RunEqualsTheCliAndResumes|OverlappedRewardsEqualTheSequentialOnes)$|DeviceCli[.]TrainOnVulkanEqualsTheCpuOrRefusesByName$|install_consumer$|BlockParity[.]CommittedComputesTheMaskedAndNewlyCommittedRowsAndDriftsFromDual$|CommittedCache[.]AgreesWithDualOnATinyTrainedModel$)')
fi
cmake -S . -B "$dir" $(generator "$dir") "${flags[@]}" >/dev/null
timed "build ($dir)" cmake --build "$dir" -j"$(nproc)"
[ "$build_only" = 1 ] && exit 0
[ "$dir" = build ] || reuse_fixtures "$dir"
# One job more than cores: many tests wait (MPI ranks, server deadlines, subprocesses), and their waits overlap.
cd "$dir" && timed "ctest ($dir)" ctest --output-on-failure -j"$(($(nproc) + 1))" "${exclude[@]}"
