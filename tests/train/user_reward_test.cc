// The user reward program's life (train/user_reward.h, issue 41 finding 8): it is read until it EXITS,
// not until its stdout closes, so a program that leaves a child holding stdout returns at once with its
// scores; its process group is killed when it exits, times out or fails; it dies with the process that
// started it (PR_SET_PDEATHSIG), and the "not a number" error shows the end of its stderr. The programs are
// small Python scripts written here (a reward program is the user's trusted code, run outside the sandbox).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "temp_dir.h"
#include "train/user_reward.h"

namespace dc::train {
namespace {

// The scripts: argv[1] the mode, argv[2] a file that receives the pids of the processes left behind.
constexpr const char* kScript = R"(import os, sys, time
mode, pid_file = sys.argv[1], sys.argv[2]
if mode == "index":  # one line out per line in, as they come: both pipes full at once
    for i, _ in enumerate(sys.stdin):
        print(i)
    sys.exit(0)
n = sum(1 for _ in sys.stdin)
def leave_child():  # a child that inherits stdout and stderr and sleeps
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    with open(pid_file, "a") as f:
        f.write("%d\n" % pid)
if mode == "linger":  # the scores, then exit 0, a child still holding stdout
    print("\n".join("2.5" for _ in range(n)), flush=True)
    leave_child()
    sys.exit(0)
if mode == "abc":  # not a number, with something to say on stderr
    sys.stderr.write("my reward model could not load its weights\n")
    print("abc")
    sys.exit(0)
if mode == "hang":  # a child, then this process hangs too
    leave_child()
    with open(pid_file, "a") as f:
        f.write("%d\n" % os.getpid())
    time.sleep(60)
)";

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<pid_t> read_pids(const std::string& path) {
  std::vector<pid_t> pids;
  std::ifstream in(path);
  for (long pid; in >> pid;) pids.push_back(static_cast<pid_t>(pid));
  return pids;
}

// True when `pid` is gone or a zombie (killed, not yet reaped by whoever inherited it) within `seconds`.
bool ends_within(pid_t pid, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  do {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return true;
    const size_t paren = line.rfind(')');
    if (paren == std::string::npos || paren + 2 >= line.size()) return true;
    const char state = line[paren + 2];
    if (state == 'Z' || state == 'X') return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (seconds_since(t0) < seconds);
  return false;
}

class UserRewardLife : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(dir_.file("reward.py")) << kScript;
  }
  void TearDown() override {  // whatever a failed test left behind
    for (pid_t pid : read_pids(pid_file())) ::kill(pid, SIGKILL);
  }
  UserRewardOptions options(const std::string& mode, double timeout) const {
    UserRewardOptions o;
    o.argv = {"/usr/bin/python3", dir_.file("reward.py"), mode, pid_file()};
    o.timeout_seconds = timeout;
    return o;
  }
  std::string pid_file() const { return dir_.file("pids"); }
  test::TempDir dir_{"user_reward"};
  std::vector<UserRewardItem> items_ = {{"p", "a", nullptr}, {"p", "b", nullptr}};
};

// The old reader waited for stdout's end: the sleeping child kept it open past the 30 s timeout.
TEST_F(UserRewardLife, ReturnsWhenTheProgramExitsAndKillsWhatItLeft) {
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run_user_reward(items_, options("linger", 30));
  const double took = seconds_since(t0);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, (std::vector<double>{2.5, 2.5}));
  EXPECT_LT(took, 20.0) << "waited for the child holding stdout";
  const std::vector<pid_t> left = read_pids(pid_file());
  ASSERT_EQ(left.size(), 1u);
  EXPECT_TRUE(ends_within(left[0], 10)) << "the child the program left (pid " << left[0] << ") still runs";
}

// Megabytes each way (more than the pipes and the socket hold): fed and read at once, nothing lost.
TEST_F(UserRewardLife, LargeInputAndOutputFlowTogether) {
  std::vector<UserRewardItem> items(20000, UserRewardItem{"p", std::string(200, 'x'), nullptr});
  auto r = run_user_reward(items, options("index", 60));
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->size(), items.size());
  for (size_t i = 0; i < r->size(); ++i) ASSERT_EQ((*r)[i], static_cast<double>(i)) << i;
}

TEST_F(UserRewardLife, NotANumberShowsItsStderr) {
  auto r = run_user_reward(items_, options("abc", 30));
  ASSERT_FALSE(r.ok());
  const std::string& e = r.status().message();
  EXPECT_NE(e.find("output line 1 is not a number (\"abc\")"), std::string::npos) << e;
  EXPECT_NE(e.find("my reward model could not load its weights"), std::string::npos) << e;
}

TEST_F(UserRewardLife, ATimeoutKillsItsWholeProcessGroup) {
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run_user_reward(items_, options("hang", 1.0));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("did not finish within"), std::string::npos) << r.status().message();
  EXPECT_LT(seconds_since(t0), 20.0);
  const std::vector<pid_t> left = read_pids(pid_file());
  ASSERT_EQ(left.size(), 2u) << "the child and the program";
  for (pid_t pid : left) EXPECT_TRUE(ends_within(pid, 10)) << "pid " << pid << " still runs";
}

// A process that runs a reward program and is killed (as `kill -9` of grpo): the program dies with it.
TEST_F(UserRewardLife, DiesWithTheProcessThatStartedIt) {
  const pid_t runner = ::fork();
  ASSERT_GE(runner, 0);
  if (runner == 0) {
    (void)run_user_reward(items_, options("hang", 120));
    ::_exit(0);
  }
  std::vector<pid_t> left;
  const auto t0 = std::chrono::steady_clock::now();
  while ((left = read_pids(pid_file())).size() < 2 && seconds_since(t0) < 60)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ::kill(runner, SIGKILL);
  int status = 0;
  ::waitpid(runner, &status, 0);
  ASSERT_EQ(left.size(), 2u) << "the program did not start";
  // left[1] is the program (its child, left[0], is outside what a killed runner can reach: README)
  EXPECT_TRUE(ends_within(left[1], 10)) << "the reward program (pid " << left[1] << ") outlived its runner";
}

}  // namespace
}  // namespace dc::train
