// The GRPO rewards (spec §4.3): every branch of the code_format regex and of the code reward on crafted
// completions, hostile programs scored 0 without harm (in the sandbox, bounded), the weighted nansum, and
// the user-reward protocol against tests/train/user_reward_script.py.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>

#include "sandbox/sandbox.h"
#include "train/rewards.h"

namespace dc::train {
namespace {

namespace fs = std::filesystem;

std::string script_path() { return std::string(DC_SOURCE_DIR) + "/tests/train/user_reward_script.py"; }

std::string fenced(const std::string& code) { return "```python\n" + code + "```\n"; }

TEST(CodeFormat, FullmatchOfTheReferencePattern) {
  EXPECT_TRUE(matches_code_format(fenced("print(1)\n")));
  EXPECT_TRUE(matches_code_format("Here is the code:\n" + fenced("def f(x):\n    return x\n")));
  EXPECT_TRUE(matches_code_format(fenced("")));                        // an empty block still matches
  EXPECT_TRUE(matches_code_format("```python\nx = 1```\n"));           // no newline before the closing fence
  EXPECT_FALSE(matches_code_format("```python\nx = 1\n```"));          // must end with a newline
  EXPECT_FALSE(matches_code_format(fenced("x = 1\n") + "\n"));         // ... right after the fence
  EXPECT_FALSE(matches_code_format(fenced("x = 1\n") + "Done."));      // nothing after the block
  EXPECT_FALSE(matches_code_format(fenced("a\n") + fenced("b\n")));    // exactly one fenced block
  EXPECT_FALSE(matches_code_format("Use ``` fences.\n" + fenced("a\n")));  // no fence before it
  EXPECT_FALSE(matches_code_format("```py\nx = 1\n```\n"));            // the language must be python
  EXPECT_FALSE(matches_code_format("```python x\nx = 1\n```\n"));      // ... followed by a newline
  EXPECT_FALSE(matches_code_format("```python\r\nx = 1\n```\n"));
  EXPECT_FALSE(matches_code_format("x = 1\n"));
  EXPECT_FALSE(matches_code_format(""));
  // Linear in the text: a MiB before the block matches, a MiB without a closing fence does not.
  const std::string big(1 << 20, 'a');
  EXPECT_TRUE(matches_code_format(big + "\n" + fenced("x = 1\n")));
  EXPECT_FALSE(matches_code_format("```python\n" + big));
}

TEST(CodeFormat, ExtractsTheFirstPythonBlockUnstripped) {
  EXPECT_EQ(extract_python_block("intro\n```python\n  x = 1\n```\n```python\ny\n```\n"), "  x = 1\n");
  EXPECT_EQ(extract_python_block("```python\nopen"), "open");
  EXPECT_EQ(extract_python_block("```py\nx\n```\n"), std::nullopt);
}

TEST(RewardInputs, RowsOfAGroupShareTheirExample) {
  GrpoExample a, b;
  a.prompt_text = "A", b.prompt_text = "B";
  RolloutBatch batch;
  batch.n_prompts = 2, batch.group_size = 2, batch.n_rows = 4;
  batch.texts = {"a0", "a1", "b0", "b1"};
  auto in = reward_inputs(batch, {&a, &b});
  ASSERT_TRUE(in.ok()) << in.status().message();
  ASSERT_EQ(in->size(), 4u);
  EXPECT_EQ((*in)[1].example, &a);
  EXPECT_EQ((*in)[2].example, &b);
  EXPECT_EQ((*in)[2].prompt, "B");
  EXPECT_EQ((*in)[3].completion, "b1");
  EXPECT_NE(reward_inputs(batch, {&a}).status().message().find("1 examples for a rollout batch of 2 prompts"),
            std::string::npos);
  EXPECT_FALSE(reward_inputs(batch, {&a, nullptr}).ok());
}

class SandboxedRewards : public ::testing::Test {
 protected:
  void SetUp() override {
    Status s = sandbox::check_available();
    if (!s.ok()) GTEST_SKIP() << "no namespaces here: " << s.message();
    options_.timeout_seconds = 2.0;
    options_.workers = 4;
  }
  // One input per completion, all of `example_`.
  std::vector<RewardInput> inputs(const std::vector<std::string>& completions) {
    std::vector<RewardInput> v;
    for (const std::string& c : completions) v.push_back({&example_, "prompt", c});
    return v;
  }

  GrpoExample example_;
  CodeRewardOptions options_;
};

TEST_F(SandboxedRewards, FormatRewardParsesTheStrippedBlock) {
  auto r = code_format_rewards(inputs({"no block at all",
                                       fenced("def f(x):\n    return x + 1\n"),
                                       fenced("def f(x) return\n"),
                                       fenced("\n  x = 1\n"),  // an unexpected indent, gone once stripped
                                       fenced(std::string("x = 1\0\n", 7))}),
                               options_);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, (std::vector<double>{0.0, 1.0, 0.5, 1.0, 0.5}));
}

TEST_F(SandboxedRewards, CodeRewardIsThePassRateOfWellFormattedCompletions) {
  example_.tests = {"assert f(1) == 2", "assert f(2) == 4"};
  const std::vector<std::string> completions = {
      fenced("def f(x):\n    return 2 * x\n"),            // both pass
      fenced("def f(x):\n    return x + 1\n"),            // the first passes
      fenced("def f(x):\n    raise ValueError(x)\n"),     // exceptions fail
      fenced("import sys\nsys.exit(0)\n"),                // exits 0 before the test: a pass in the reference, not here
      fenced("def f(x):\n    return 2 * x\n"),            // format 0.5 given below: never run
      fenced("def f(x):\n    while x == 2: pass\n    return 2\n"),  // the second test times out: reward 0
  };
  const std::vector<double> format = {1.0, 1.0, 1.0, 1.0, 0.5, 1.0};
  const auto t0 = std::chrono::steady_clock::now();
  auto r = code_rewards(inputs(completions), format, options_);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);  // bounded
  const std::vector<double> want = {1.0, 0.5, 0.0, 0.0, 0.0, 0.0};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ((*r)[i].reward, want[i]) << "completion " << i;
  EXPECT_EQ((*r)[1].passed, 1);
  EXPECT_EQ((*r)[1].total, 2);
  EXPECT_FALSE((*r)[4].ran);
  EXPECT_TRUE((*r)[5].timed_out);
  EXPECT_EQ((*r)[5].passed, 1);  // the first test passed, the timeout still zeroes the reward
}

// Exiting before the test ran is no pass (the reference counts exit code 0 of `code + "\n" + test`): each
// of these got reward 1 from the runner before code_reward_runner.h. Programs that run to their end keep
// the reference's verdict, whatever they print, read or leave behind.
TEST_F(SandboxedRewards, ExitingBeforeTheTestIsNoPass) {
  example_.tests = {"assert f(1) == 2"};
  const std::string steal =  // the nonce from stdin, and wherever else it might be, printed
      "import sys, os, re\n"
      "for p in ['/proc/self/fd/0', '/proc/%d/fd/0' % os.getppid(), '/proc/1/fd/0']:\n"
      "    try:\n"
      "        print('\\n'.join(re.findall('DC_DONE_[0-9a-f]{32}', open(p).read())), flush=True)\n"
      "    except OSError:\n"
      "        pass\n";
  const std::vector<std::string> forging = {
      fenced("import os\nos._exit(0)\n"),
      fenced("exit()\n"),
      fenced("quit(0)\n"),
      fenced("raise SystemExit\n"),
      fenced("import os\nos.kill(os.getppid(), 9)\nos._exit(0)\n"),  // kills the runner (the sandbox's init before)
      fenced(steal + "os._exit(0)\n"),
      fenced(steal + "print('\\nDC_DONE_' + '0' * 32, flush=True)\nsys.exit(0)\n"),
      fenced("import atexit, os\natexit.register(lambda: os._exit(0))\ndef f(x):\n    return 0\n"),  // the test fails
      fenced("if __name__ == '__main__':\n    import sys\n    sys.exit(0)\ndef f(x):\n    return 2 * x\n"),
  };
  const std::vector<std::string> honest = {
      fenced("def f(x):\n    return 2 * x\n"),
      fenced("import sys\nprint('hi', file=sys.stderr)\nprint(input.__name__)\ndef f(x):\n    return 2 * x\n"),
      fenced("import threading\nthreading.Thread(target=lambda: print('late')).start()\ndef f(x):\n    return 2 * x\n"),
      fenced("def f(x):\n    return 2 * x\nif __name__ == '__main__':\n    print(f(3))\n"),  // runs, as with -c
  };
  std::vector<std::string> all = forging;
  all.insert(all.end(), honest.begin(), honest.end());
  auto r = code_rewards(inputs(all), std::vector<double>(all.size(), 1.0), options_);
  ASSERT_TRUE(r.ok()) << r.status().message();
  for (size_t i = 0; i < forging.size(); ++i) EXPECT_EQ((*r)[i].reward, 0.0) << forging[i];
  for (size_t i = forging.size(); i < all.size(); ++i) EXPECT_EQ((*r)[i].reward, 1.0) << all[i];
}

TEST_F(SandboxedRewards, HostileCodeScoresZeroWithoutHarm) {
  const std::string probe = "/tmp/dc_rewards_probe_" + std::to_string(::getpid());
  // A listener on the host's loopback: the sandbox has its own network namespace and cannot reach it.
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));

  example_.tests = {"assert ok"};
  const std::vector<std::string> hostile = {
      fenced("import os\nwhile True:\n    os.fork()\n"),                      // fork bomb
      fenced("while True:\n    pass\n"),                                        // endless loop
      fenced("x = bytearray(1 << 40)\nok = True\n"),                           // huge allocation
      fenced("open('" + probe + "', 'w').write('x')\nok = False\n"),           // into its own /tmp
      fenced("import socket\ns = socket.create_connection(('127.0.0.1', " + port + "), timeout=1)\nok = True\n"),
      fenced("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)\nok = True\n"),
      fenced("open('/usr/dc_probe', 'w')\nok = True\n"),                       // the system is read-only
  };
  auto r = code_rewards(inputs(hostile), std::vector<double>(hostile.size(), 1.0), options_);
  ASSERT_TRUE(r.ok()) << r.status().message();
  for (size_t i = 0; i < hostile.size(); ++i) EXPECT_EQ((*r)[i].reward, 0.0) << hostile[i];
  EXPECT_FALSE(fs::exists(probe));  // its /tmp was private and is gone
  EXPECT_FALSE(fs::exists("/usr/dc_probe"));
  EXPECT_LT(::accept(listener, nullptr, nullptr), 0);  // nothing connected to the host
  ::close(listener);
  // The machine still runs programs afterwards (no leftover processes hold the limits).
  example_.tests = {"assert f() == 3"};
  auto after = code_rewards(inputs({fenced("def f():\n    return 3\n")}), {1.0}, options_);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ((*after)[0].reward, 1.0);
}

TEST_F(SandboxedRewards, WeightedNansumOfTheRewards) {
  example_.tests = {"assert f(1) == 1"};
  example_.fields = {{"bonus", 100}};
  RewardOptions o;
  o.code = options_;
  auto b = score_completions(inputs({fenced("def f(x):\n    return x\n"),  // format 1, code 1
                                     fenced("def f(x) return x\n"),       // format 0.5 (syntax error), code 0
                                     "def f(x):\n    return x\n"}),        // no block: 0
                             o);
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b->total, (std::vector<double>{2.5, 0.25, 0.0}));
  EXPECT_EQ(b->code_format, (std::vector<double>{1.0, 0.5, 0.0}));
  EXPECT_DOUBLE_EQ(b->format_rate(), 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(b->pass_rate(), 1.0 / 3.0);
  EXPECT_TRUE(b->user.empty());

  // A user reward instead, with a NaN that counts as 0 in the total (the reference's nansum).
  o.code_weight = 0, o.format_weight = 0, o.user_weight = 2.0;
  const std::string script = script_path();
  o.user.argv = {"/usr/bin/python3", script, "nan"};
  auto u = score_completions(inputs({"a", "bb"}), o);
  ASSERT_TRUE(u.ok()) << u.status().message();
  EXPECT_TRUE(std::isnan(u->user[0]));
  EXPECT_EQ(u->total, (std::vector<double>{0.0, 3.0}));
  EXPECT_TRUE(u->code_format.empty() && u->code.empty());

  // The code reward needs tests.
  example_.tests.clear();
  o.code_weight = 2.0;
  EXPECT_NE(score_completions(inputs({"x"}), o).status().message().find("has no tests"), std::string::npos);
}

class UserReward : public ::testing::Test {
 protected:
  Result<std::vector<double>> run(const std::string& mode, double timeout = 60) {
    UserRewardOptions o;
    o.argv = {"/usr/bin/python3", script_path(), mode};
    o.timeout_seconds = timeout;
    return run_user_reward(items_, o);
  }
  std::string error_of(const std::string& mode, double timeout = 60) {
    auto r = run(mode, timeout);
    return r.ok() ? "" : r.status().message();
  }
  nlohmann::json example_ = {{"bonus", 10}};
  std::vector<UserRewardItem> items_ = {{"p", "abc", &example_}, {"p", "\xff invalid utf-8", nullptr}, {"p", "", &example_}};
};

TEST_F(UserReward, ScoresOneLinePerCompletionInOrder) {
  auto r = run("length");
  ASSERT_TRUE(r.ok()) << r.status().message();
  // len("abc") + 10; the invalid byte reaches the program as U+FFFD (15 characters), no example: bonus 0; "" + 10
  EXPECT_EQ(*r, (std::vector<double>{13, 15, 10}));
}

TEST_F(UserReward, ErrorsSayWhatWentWrong) {
  auto has = [&](const std::string& mode, const std::string& want, double timeout = 60) {
    const std::string e = error_of(mode, timeout);
    EXPECT_NE(e.find(want), std::string::npos) << "mode " << mode << ": " << e;
  };
  has("crash", "exited with code 3");
  has("crash", "something broke");  // the end of its stderr
  has("short", "wrote 2 scores for 3 completions");
  has("word", "output line 1 is not a number (\"good\")");
  has("inf", "is not a number");
  const auto t0 = std::chrono::steady_clock::now();
  has("sleep", "did not finish within", 1.0);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);  // killed, not waited for
  UserRewardOptions o;
  o.argv = {"/nonexistent/reward"};
  auto missing = run_user_reward(items_, o);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("reward program /nonexistent/reward: cannot be started"), std::string::npos);
  o.argv.clear();
  EXPECT_FALSE(run_user_reward(items_, o).ok());
}

}  // namespace
}  // namespace dc::train
