// A pass cannot be forged (issue 41, sandbox item 4 / probe finding 3): hostile HumanEval/2 solutions
// that steal the runner's nonce (frame walk, /proc), print it and exit, exit or raise SystemExit at
// import time, kill the runner, monkeypatch builtins or the runner's sys.exit, or return an object
// equal to everything or a code object. Each is scored as a failure by `diffucoder eval`; the runner before the fix (the
// nonce in the interpreter that ran the completion, the comparisons on the candidate's objects) counted
// cases 0, 2, 4, 5, 7 and 8 as passes. An honest solution in the same file still passes.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "process.h"
#include "sandbox/sandbox.h"
#include "temp_dir.h"

namespace dc::eval::forgery {
namespace {

const std::string kHumanEval = std::string(DC_SOURCE_DIR) + "/data/humaneval/HumanEval.jsonl.gz";

// Finds the nonce wherever the old runner left it in reach (a local of a calling frame, the runner's
// stdin through /proc, the runner's memory) and writes it to every stdout it can open.
constexpr const char* kForge = R"PY(import sys, os, re
def _steal():
    found = set()
    f = sys._getframe()
    while f is not None:
        for v in list(f.f_locals.values()):
            if isinstance(v, str) and v.startswith('DC_PASS_'):
                found.add(v)
        f = f.f_back
    pids = ['self', str(os.getppid()), '1']
    for pid in pids:
        try:
            with open('/proc/%s/fd/0' % pid) as fh:
                found.update(re.findall(r'DC_PASS_[0-9a-f]{32}', fh.read()))
        except OSError:
            pass
        try:
            with open('/proc/%s/maps' % pid) as maps, open('/proc/%s/mem' % pid, 'rb') as mem:
                for line in maps:
                    a, b = [int(x, 16) for x in line.split()[0].split('-')]
                    if 'rw' in line.split()[1] and b - a < (64 << 20):
                        mem.seek(a)
                        found.update(m.decode() for m in re.findall(rb'DC_PASS_[0-9a-f]{32}', mem.read(b - a)))
        except (OSError, ValueError, OverflowError):
            pass
    return found
def _forge():
    for n in _steal():
        os.write(1, ('\n' + n + '\n').encode())
        for pid in [str(os.getppid()), '1']:
            try:
                with open('/proc/%s/fd/1' % pid, 'w') as fh:
                    fh.write('\n' + n + '\n')
            except OSError:
                pass
)PY";

constexpr const char* kDef = "def truncate_number(number: float) -> float:\n";

TEST(EvalForgery, HostileSolutionsAreFailures) {
  if (!sandbox::check_available().ok()) GTEST_SKIP() << "no namespaces";
  const test::TempDir dir("eval_forgery");
  const std::string forge = kForge;
  const std::vector<std::string> solutions = {
      // 0. the issue's forgery: the nonce from a calling frame, printed, then os._exit(0)
      forge + kDef + "    _forge()\n    os._exit(0)\n",
      // 1. a guessed marker
      forge + kDef + "    print('\\nDC_PASS_' + '0' * 32, flush=True)\n    os._exit(0)\n",
      // 2. os._exit(0) at import time (after stealing the nonce there)
      forge + "_forge()\nos._exit(0)\n" + kDef + "    return number % 1.0\n",
      // 3. sys.exit(0) at import time
      forge + "_forge()\nsys.stdout.flush()\nsys.exit(0)\n" + kDef + "    return number % 1.0\n",
      // 4. kills the process that runs it (the runner, now; the sandbox's init, ignored, before)
      forge + kDef + "    _forge()\n    os.kill(os.getppid(), 9)\n    os._exit(0)\n",
      // 5. monkeypatched builtins: abs() always 0, so a wrong constant passes the abs(...) < 1e-6 asserts
      forge + "import builtins\nbuiltins.abs = lambda x: 0.0\n" + kDef + "    return 0.5\n",
      // 6. SystemExit raised inside the candidate
      forge + kDef + "    _forge()\n    raise SystemExit(0)\n",
      // 7. the runner's sys.exit neutralised, then an exception: the old runner fell through to its pass line
      forge + kDef + "    sys.exit = lambda *a: None\n    raise ValueError('x')\n",
      // 8. an object equal to everything (and abs(x - y) == 0)
      forge + "class _Eq:\n    def __eq__(self, o): return True\n    def __sub__(self, o): return 0.0\n" + kDef +
          "    return _Eq()\n",
      // 9. a result marshal can carry but that is not plain data (a code object), refused by the runner
      std::string(kDef) + "    return (lambda: 0.5).__code__\n",
      // 10. honest
      std::string(kDef) + "    return number % 1.0\n",
  };
  {
    std::ofstream c(dir.file("hostile.jsonl"));
    for (const auto& s : solutions) c << nlohmann::json{{"task_id", "HumanEval/2"}, {"solution", s}}.dump() << "\n";
  }
  auto r = testing::run_binary("eval --benchmark " + kHumanEval + " --completions " + dir.file("hostile.jsonl") +
                               " --out " + dir.file("results.jsonl") + " --timeout 10 --workers 2 --quiet --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::map<int, nlohmann::json> by_sample;
  std::ifstream in(dir.file("results.jsonl"));
  std::string line;
  std::getline(in, line);  // settings
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    by_sample[j["sample"].get<int>()] = j;
  }
  ASSERT_EQ(by_sample.size(), solutions.size());
  for (int s = 0; s + 1 < static_cast<int>(solutions.size()); ++s) {
    EXPECT_FALSE(by_sample[s]["passed"].get<bool>()) << "hostile solution " << s << " passed: " << by_sample[s].dump();
    EXPECT_NE(by_sample[s]["failure"], "none") << by_sample[s].dump();
  }
  EXPECT_TRUE(by_sample[10]["passed"].get<bool>()) << by_sample[10].dump();
  // What each is reported as.
  EXPECT_NE(by_sample[0]["detail"].get<std::string>().find("ProgramExited"), std::string::npos) << by_sample[0].dump();
  EXPECT_NE(by_sample[3]["detail"].get<std::string>().find("SystemExit"), std::string::npos) << by_sample[3].dump();
  EXPECT_EQ(by_sample[5]["failure"], "assertion") << by_sample[5].dump();
  EXPECT_NE(by_sample[6]["detail"].get<std::string>().find("SystemExit"), std::string::npos) << by_sample[6].dump();
  EXPECT_NE(by_sample[7]["detail"].get<std::string>().find("ValueError: x"), std::string::npos) << by_sample[7].dump();
  EXPECT_NE(by_sample[8]["detail"].get<std::string>().find("cannot be returned"), std::string::npos) << by_sample[8].dump();
  EXPECT_NE(by_sample[9]["detail"].get<std::string>().find("ProgramAnswerRejected: the result is not plain data"),
            std::string::npos) << by_sample[9].dump();
  EXPECT_EQ(nlohmann::json::parse(r.out)["passed"], 1) << r.out;
}

}  // namespace
}  // namespace dc::eval::forgery
