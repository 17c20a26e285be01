// The sandbox: benign runs first (output, stdin, files, environment, limits in place), then every
// hostile program the issue lists, each bounded by small limits (512 MB address space, 16–32
// processes, 1–4 s), and each checking that the caller and the machine are unchanged afterwards.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>

#include "sandbox/pool.h"
#include "sandbox/sandbox.h"
#include "temp_dir.h"

namespace dc::sandbox {
namespace {

class SandboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Every run's temp dir goes under a directory of this test, so we can check it is left empty.
    setenv("TMPDIR", tmpdir_.c_str(), 1);
    Status s = check_available();
    if (!s.ok()) GTEST_SKIP() << "no namespaces here: " << s.message();
  }
  void TearDown() override {
    unsetenv("TMPDIR");
    // The sandbox deleted its temp dirs: ours is empty.
    DIR* d = opendir(tmpdir_.c_str());
    if (d) {
      int entries = 0;
      while (dirent* e = readdir(d)) {
        std::string n = e->d_name;
        if (n != "." && n != "..") ++entries, ADD_FAILURE() << "left behind: " << n;
      }
      closedir(d);
      EXPECT_EQ(entries, 0);
    }
  }

  static RunSpec python(const std::string& code) {
    RunSpec s;
    s.argv = {"python3", "-c", code};
    s.limits.wall_seconds = 4;
    s.limits.cpu_seconds = 3;
    s.limits.address_space_bytes = 512ll << 20;
    s.limits.max_processes = 32;
    s.limits.output_bytes = 64 << 10;
    return s;
  }
  static RunResult must_run(const RunSpec& s) {
    auto r = run(s);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : RunResult{};
  }
  // Processes anywhere on the machine whose command line contains `marker`.
  static int processes_with(const std::string& marker) {
    int n = 0;
    DIR* d = opendir("/proc");
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      std::ifstream f(std::string("/proc/") + e->d_name + "/cmdline", std::ios::binary);
      std::string cmd((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      if (cmd.find(marker) != std::string::npos && std::to_string(getpid()) != e->d_name) ++n;
    }
    closedir(d);
    return n;
  }
  const test::TempDir tmp_{"sandbox_test"};
  const std::string tmpdir_ = tmp_.path();
};

TEST_F(SandboxTest, RunsAProgramAndCapturesItsOutput) {
  auto r = must_run(python("import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"));
  EXPECT_TRUE(r.exited);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.stdout_data, "out\n");
  EXPECT_EQ(r.stderr_data, "err\n");
  EXPECT_EQ(r.limit, LimitHit::kNone);
  EXPECT_FALSE(r.timed_out);
  EXPECT_GT(r.wall_seconds, 0);
  EXPECT_GT(r.cpu_seconds, 0);
  EXPECT_FALSE(r.ok());
}

TEST_F(SandboxTest, StdinFilesArgsAndACleanEnvironment) {
  setenv("DC_SECRET_OF_THE_CALLER", "hunter2", 1);
  RunSpec s = python(
      "import os, sys\n"
      "print(sys.stdin.read().upper())\n"
      "print(open('data.txt').read())\n"
      "print(sys.argv[1:])\n"
      "print(os.getcwd(), os.getuid(), os.getgid(), os.getgroups())\n"
      "print(sorted(k for k in os.environ if k not in ('LC_CTYPE',)))\n");
  s.argv.push_back("a1");
  s.stdin_data = "abc";
  s.files["data.txt"] = "file contents";
  s.env["EXTRA"] = "1";
  auto r = must_run(s);
  unsetenv("DC_SECRET_OF_THE_CALLER");
  ASSERT_TRUE(r.ok()) << r.stderr_data;
  EXPECT_EQ(r.stdout_data,
            "ABC\nfile contents\n['a1']\n/tmp 1000 1000 []\n"
            "['EXTRA', 'HOME', 'LANG', 'PATH', 'PYTHONDONTWRITEBYTECODE', 'TMPDIR']\n");
}

TEST_F(SandboxTest, LimitsAreInPlace) {
  auto r = must_run(python(
      "import resource as r\n"
      "for n in ('RLIMIT_AS','RLIMIT_CPU','RLIMIT_NPROC','RLIMIT_FSIZE','RLIMIT_NOFILE','RLIMIT_CORE'):\n"
      "  print(n, r.getrlimit(getattr(r, n))[0])\n"));
  ASSERT_TRUE(r.ok()) << r.stderr_data;
  EXPECT_EQ(r.stdout_data,
            "RLIMIT_AS 536870912\nRLIMIT_CPU 3\nRLIMIT_NPROC 32\nRLIMIT_FSIZE 67108864\nRLIMIT_NOFILE 64\n"
            "RLIMIT_CORE 0\n");
}

TEST_F(SandboxTest, SeesOnlySystemDirsAndItsOwnProcesses) {
  auto r = must_run(python(
      "import os\n"
      "print(sorted(os.listdir('/')))\n"
      "print([p for p in os.listdir('/proc') if p.isdigit()])\n"
      "print(open('/proc/self/status').read().count('CapEff:\\t0000000000000000'))\n"
      "print(sorted(os.listdir('/sys/class/net')) if os.path.exists('/sys/class/net') else 'no sys')\n"));
  ASSERT_TRUE(r.ok()) << r.stderr_data;
  EXPECT_NE(r.stdout_data.find("'dev', 'etc'"), std::string::npos) << r.stdout_data;
  EXPECT_EQ(r.stdout_data.find("'home'"), std::string::npos) << r.stdout_data;
  EXPECT_EQ(r.stdout_data.find("'work'"), std::string::npos) << r.stdout_data;
  EXPECT_NE(r.stdout_data.find("['1', '2']"), std::string::npos) << r.stdout_data;  // init + itself
  EXPECT_NE(r.stdout_data.find("\n1\n"), std::string::npos) << "capabilities left: " << r.stdout_data;
}

TEST_F(SandboxTest, MissingProgramIsAnOrdinaryResult) {
  RunSpec s;
  s.argv = {"/usr/bin/no-such-program-here"};
  auto r = must_run(s);
  EXPECT_TRUE(r.exited);
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_NE(r.stderr_data.find("cannot execute"), std::string::npos);
}

// ---- hostile programs -----------------------------------------------------------------------------

TEST_F(SandboxTest, NetworkIsLoopbackOnly) {
  // A listener of the caller on the host's loopback: the sandbox cannot reach it.
  int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  ASSERT_GE(ls, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(ls, 4), 0);
  socklen_t len = sizeof(a);
  getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  auto r = must_run(python(
      "import socket\n"
      "for host in ('127.0.0.1', '10.0.0.1', '1.1.1.1'):\n"
      "  try:\n"
      "    socket.create_connection((host, " + std::to_string(port) + "), timeout=1); print(host, 'CONNECTED')\n"
      "  except OSError as e: print(host, type(e).__name__)\n"
      "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); c = socket.create_connection(s.getsockname())\n"
      "print('own loopback ok')\n"));
  EXPECT_TRUE(r.ok()) << r.stderr_data;
  EXPECT_EQ(r.stdout_data.find("CONNECTED"), std::string::npos) << r.stdout_data;
  EXPECT_NE(r.stdout_data.find("127.0.0.1 ConnectionRefusedError"), std::string::npos) << r.stdout_data;
  EXPECT_NE(r.stdout_data.find("1.1.1.1 OSError"), std::string::npos) << r.stdout_data;  // unreachable
  EXPECT_NE(r.stdout_data.find("own loopback ok"), std::string::npos);
  EXPECT_LT(accept(ls, nullptr, nullptr), 0);  // nobody connected to the caller
  close(ls);
}

TEST_F(SandboxTest, CannotWriteDeleteOrReadOutsideItsTempDir) {
  // A file of the caller, by absolute path.
  const std::string secret = tmpdir_ + "/../dc-sandbox-secret-" + std::to_string(getpid());
  { std::ofstream(secret) << "secret"; }
  auto r = must_run(python(
      "import os\n"
      "for p in ('/usr/evil', '/etc/evil', '/evil', '/dev/evil', '/proc/evil'):\n"
      "  try: open(p, 'w').write('x'); print('WROTE', p)\n"
      "  except OSError as e: print('no write', p)\n"
      "for p in ('/usr/bin/python3', '/etc/ld.so.cache', '" + secret + "'):\n"
      "  try: os.unlink(p); print('DELETED', p)\n"
      "  except OSError as e: print('no delete', p)\n"
      "for p in ('" + secret + "', '/etc/passwd', '/etc/shadow', '/root/.bashrc', '/work'):\n"
      "  try: open(p).read(); print('READ', p)\n"
      "  except OSError as e: print('no read', p)\n"
      "open('/tmp/mine', 'w').write('ok'); print('own tmp ok')\n"));
  EXPECT_TRUE(r.ok()) << r.stderr_data;
  EXPECT_EQ(r.stdout_data.find("WROTE"), std::string::npos) << r.stdout_data;
  EXPECT_EQ(r.stdout_data.find("DELETED"), std::string::npos) << r.stdout_data;
  EXPECT_EQ(r.stdout_data.find("READ"), std::string::npos) << r.stdout_data;
  EXPECT_NE(r.stdout_data.find("own tmp ok"), std::string::npos);
  std::ifstream f(secret);
  std::string s;
  f >> s;
  EXPECT_EQ(s, "secret");
  EXPECT_EQ(access("/usr/bin/python3", X_OK), 0);
  unlink(secret.c_str());
}

TEST_F(SandboxTest, ForkBombIsContained) {
  RunSpec s = python("import os, sys  # dc-fork-bomb-marker\nwhile True:\n  try: os.fork()\n  except OSError: pass\n");
  s.limits.max_processes = 16;
  s.limits.wall_seconds = 2;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = must_run(s);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(r.timed_out || r.limit == LimitHit::kCpuTime) << limit_hit_name(r.limit);
  EXPECT_LT(took, 6.0);
  EXPECT_EQ(processes_with("dc-fork-bomb-marker"), 0);
}

TEST_F(SandboxTest, EightGigabyteAllocationFails) {
  auto r = must_run(python("x = bytearray(8 << 30)\nprint('ALLOCATED')\n"));
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.stdout_data, "");
  EXPECT_EQ(r.limit, LimitHit::kMemory) << r.stderr_data;
}

TEST_F(SandboxTest, InfiniteLoopHitsTheCpuLimit) {
  RunSpec s = python("while True: pass\n");
  s.limits.cpu_seconds = 1;
  s.limits.wall_seconds = 6;
  auto r = must_run(s);
  EXPECT_FALSE(r.exited);
  EXPECT_TRUE(r.limit == LimitHit::kCpuTime || r.limit == LimitHit::kWallTime) << limit_hit_name(r.limit);
  EXPECT_GT(r.cpu_seconds, 0.5);  // rusage is sampled: under load it read 0.83 s at a 1 s RLIMIT_CPU
}

TEST_F(SandboxTest, SleepingPastTheTimeoutIsKilled) {
  RunSpec s = python("import time\ntime.sleep(100)\n");
  s.limits.wall_seconds = 1;
  auto r = must_run(s);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.limit, LimitHit::kWallTime);
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_LT(r.wall_seconds, 5.0);  // not hung (generous: CI machines are loaded)
}

TEST_F(SandboxTest, GigabyteOnStdoutIsCutAtTheCap) {
  auto r = must_run(python("import sys\nb = b'x' * (1 << 20)\nfor i in range(1024): sys.stdout.buffer.write(b)\n"));
  EXPECT_EQ(r.limit, LimitHit::kOutput);
  EXPECT_TRUE(r.stdout_truncated);
  EXPECT_EQ(r.stdout_data.size(), 64u << 10);
  EXPECT_LT(r.wall_seconds, 5.0);  // not hung (generous: CI machines are loaded)
}

TEST_F(SandboxTest, InheritedDescriptorsAreNotThere) {
  // Descriptors of the caller without O_CLOEXEC: a file and a pipe.
  const std::string path = tmpdir_ + "/../dc-sandbox-fd-" + std::to_string(getpid());
  int fd = open(path.c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  auto r = must_run(python(
      "import os\n"
      "print(sorted(int(x) for x in os.listdir('/proc/self/fd')))\n"
      "for fd in (" + std::to_string(fd) + ", " + std::to_string(p[0]) + ", " + std::to_string(p[1]) + ", 3, 4, 5):\n"
      "  try: os.write(fd, b'hijack'); print('WROTE', fd)\n"
      "  except OSError as e: print('EBADF', fd)\n"
      "os.close(0); os.close(2)\n"));
  EXPECT_TRUE(r.ok()) << r.stderr_data;
  EXPECT_EQ(r.stdout_data.substr(0, 13), "[0, 1, 2, 3]\n") << r.stdout_data;  // 3: listdir's own
  EXPECT_EQ(r.stdout_data.find("WROTE"), std::string::npos) << r.stdout_data;
  // The caller's descriptors still work and hold nothing from the sandbox.
  EXPECT_EQ(write(p[1], "ok", 2), 2);
  char buf[8];
  EXPECT_EQ(read(p[0], buf, 8), 2);
  EXPECT_EQ(lseek(fd, 0, SEEK_END), 0);
  close(fd), close(p[0]), close(p[1]);
  unlink(path.c_str());
}

TEST_F(SandboxTest, CannotKillTheCaller) {
  auto r = must_run(python(
      "import os, signal\n"
      "for pid in (os.getppid(), " + std::to_string(getpid()) + ", " + std::to_string(getppid()) + "):\n"
      "  try: os.kill(pid, signal.SIGKILL); print('sent', pid)\n"
      "  except OSError as e: print('no', pid, type(e).__name__)\n"
      "os.kill(-1, signal.SIGKILL)\n"
      "print('survived kill -1')\n"));
  // We are still here; the program's kill(-1) reached only its own namespace.
  EXPECT_TRUE(r.exited || r.signal != 0);
  EXPECT_EQ(kill(getpid(), 0), 0);
}

TEST_F(SandboxTest, BackgroundProcessesDieWithTheRun) {
  auto r = must_run(python(
      "import os, time  # dc-daemon-marker\n"
      "if os.fork() == 0:\n"
      "  os.setsid()\n"
      "  if os.fork() == 0:\n"
      "    time.sleep(60)\n"
      "  os._exit(0)\n"
      "print('parent done')\n"));
  EXPECT_TRUE(r.ok()) << r.stderr_data;
  EXPECT_FALSE(r.timed_out);
  EXPECT_LT(r.wall_seconds, 5.0);  // not hung (generous: CI machines are loaded)
  EXPECT_EQ(processes_with("dc-daemon-marker"), 0);
}

TEST_F(SandboxTest, FileSizeAndOpenFileLimits) {
  RunSpec big = python("open('/tmp/big', 'wb').write(b'x' * (2 << 20))\n");
  big.limits.file_size_bytes = 1 << 20;
  auto r = must_run(big);
  EXPECT_EQ(r.limit, LimitHit::kFileSize) << r.stderr_data;
  RunSpec many = python("fs = [open('/tmp/f%d' % i, 'w') for i in range(100)]\n");
  many.limits.open_files = 16;
  r = must_run(many);
  EXPECT_EQ(r.limit, LimitHit::kOpenFiles) << r.stderr_data;
  RunSpec procs = python("import subprocess\nps = [subprocess.Popen(['sleep', '5']) for i in range(40)]\n");
  procs.limits.max_processes = 8;
  r = must_run(procs);
  EXPECT_EQ(r.limit, LimitHit::kProcesses) << r.stderr_data;
}

TEST_F(SandboxTest, PoolRunsManyAtOnceInOrder) {
  std::vector<RunSpec> specs;
  for (int i = 0; i < 8; ++i) specs.push_back(python("print(" + std::to_string(i) + " * 7)"));
  int calls = 0;
  auto results = run_all(specs, 3, [&](size_t, const Result<RunResult>&) { ++calls; });
  ASSERT_EQ(results.size(), 8u);
  EXPECT_EQ(calls, 8);
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(results[i].ok());
    EXPECT_EQ(results[i]->stdout_data, std::to_string(i * 7) + "\n");
  }
}

}  // namespace
}  // namespace dc::sandbox
