// The sandbox: benign runs first (output, stdin, files, environment, limits in place), then every
// hostile program the issue lists, each bounded by small limits (512 MB address space, 16–32
// processes, 1–4 s), and each checking that the caller and the machine are unchanged afterwards.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstring>
#include <limits>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/pages.h"
#include "mapping_flags.h"
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
  RunSpec spec = python(
      "import resource as r\n"
      "for n in ('RLIMIT_AS','RLIMIT_CPU','RLIMIT_NPROC','RLIMIT_FSIZE','RLIMIT_NOFILE','RLIMIT_CORE'):\n"
      "  print(n, r.getrlimit(getattr(r, n))[0])\n");
  spec.limits.memory_bytes = 0;  // no run budget: the per-process limits exactly as given
  auto r = must_run(spec);
  ASSERT_TRUE(r.ok()) << r.stderr_data;
  EXPECT_EQ(r.stdout_data,
            "RLIMIT_AS 536870912\nRLIMIT_CPU 3\nRLIMIT_NPROC 32\nRLIMIT_FSIZE 67108864\nRLIMIT_NOFILE 64\n"
            "RLIMIT_CORE 0\n");
}

// The run's memory budget: with a cgroup the per-process limits stay; without one they are lowered so
// that processes x address space <= memory_bytes (and python3 still starts).
TEST_F(SandboxTest, MemoryBudgetBoundsProcessesTimesAddressSpace) {
  Limits l = python("").limits;  // 512 MiB per process, 32 processes
  l.memory_bytes = 512ll << 20;
  const Limits e = effective_limits(l);
  if (memory_mode() == MemoryMode::kCgroup) {
    EXPECT_EQ(e.address_space_bytes, l.address_space_bytes);
    EXPECT_EQ(e.max_processes, l.max_processes);
  } else {
    EXPECT_LE(e.address_space_bytes * e.max_processes, l.memory_bytes);
    EXPECT_EQ(e.address_space_bytes, kMinProcessBytes);  // 512 MiB / 32 is below the floor
    EXPECT_EQ(e.max_processes, 8);
  }
  Limits tiny = l;
  tiny.memory_bytes = 16ll << 20;
  tiny.address_space_bytes = 0;
  tiny.max_processes = 0;
  const Limits t = effective_limits(tiny);
  if (memory_mode() == MemoryMode::kRlimit) {
    EXPECT_LE(t.address_space_bytes * t.max_processes, tiny.memory_bytes);
  }
  std::printf("%s\n", describe().c_str());
  EXPECT_NE(describe().find("memory per run"), std::string::npos);
  RunSpec spec = python(
      "import resource as r\n"
      "print(r.getrlimit(r.RLIMIT_AS)[0], r.getrlimit(r.RLIMIT_NPROC)[0])\n");
  spec.limits = l;
  auto r = must_run(spec);
  ASSERT_TRUE(r.ok()) << r.stderr_data;
  EXPECT_EQ(r.stdout_data, std::to_string(e.address_space_bytes) + " " + std::to_string(e.max_processes) + "\n");
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
  // rusage is sampled: under load it read 0.83 s at a 1 s RLIMIT_CPU. On a machine so loaded that the wall
  // clock ran out first, the killed program was never reaped and counts nothing: no CPU check then.
  if (r.limit == LimitHit::kCpuTime) {
    EXPECT_GT(r.cpu_seconds, 0.5);
  }
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

// ---- issue 41: a bounded /tmp, the system-call filter, the run's memory, deep trees ---------------

// Free bytes of the file system holding `dir`.
int64_t free_bytes(const std::string& dir) {
  struct statvfs v;
  if (statvfs(dir.c_str(), &v) != 0) return -1;
  return static_cast<int64_t>(v.f_bavail) * static_cast<int64_t>(v.f_frsize);
}

TEST_F(SandboxTest, TmpFillerHitsItsOwnTmpfsNotTheHostDisk) {
  // 64 MiB files in a loop (up to 512 MiB): before, they went to the host's $TMPDIR.
  RunSpec s = python(
      "import sys\n"
      "chunk = b'x' * (1 << 20); total = 0\n"
      "try:\n"
      "  for i in range(8):\n"
      "    with open('/tmp/fill%d' % i, 'wb') as f:\n"
      "      for j in range(64): f.write(chunk); f.flush(); total += len(chunk)\n"
      "finally:\n"
      "  print(total)\n");
  s.files["given.txt"] = "a file of the spec";
  const int64_t before = free_bytes(tmpdir_);
  auto r = must_run(s);
  const int64_t after = free_bytes(tmpdir_);
  EXPECT_EQ(r.limit, LimitHit::kDisk) << limit_hit_name(r.limit) << "\n" << r.stderr_data;
  EXPECT_NE(r.stderr_data.find("No space left on device"), std::string::npos) << r.stderr_data;
  EXPECT_LE(std::atoll(r.stdout_data.c_str()), s.limits.tmp_bytes) << r.stdout_data;
  // (A wide margin: other processes share the disk. The program tried to write 512 MiB.)
  EXPECT_GE(after, before - (256ll << 20)) << "the host's free space fell by " << (before - after) << " bytes";
}

TEST_F(SandboxTest, FilesOfTheSpecAreInTheTmpfs) {
  RunSpec s = python(
      "import os\n"
      "print(open('/tmp/a.py').read(), sorted(os.listdir('/tmp')))\n"
      "print([l.split()[2] for l in open('/proc/self/mounts') if l.split()[1] == '/tmp'])\n"
      "st = os.statvfs('/tmp'); print(st.f_blocks * st.f_frsize)\n");
  s.files["a.py"] = "print(1)";
  s.files["b.txt"] = std::string(100000, 'b');
  s.limits.tmp_bytes = 4 << 20;
  auto r = must_run(s);
  ASSERT_TRUE(r.ok()) << r.stderr_data;
  EXPECT_EQ(r.stdout_data, "print(1) ['a.py', 'b.txt']\n['tmpfs']\n4194304\n");
  s.files["c.bin"] = std::string(5 << 20, 'c');  // does not fit: refused before the run
  auto too_big = run(s);
  EXPECT_FALSE(too_big.ok());
  EXPECT_NE(too_big.status().message().find("tmp_bytes"), std::string::npos) << too_big.status().message();
}

TEST_F(SandboxTest, NestedUserNamespaceCannotMountATmpfs) {
  // The probe's reproducer: a tmpfs of half the host's RAM that no limit counts.
  RunSpec s;
  s.argv = {"unshare", "-Urm", "sh", "-c", "mount -t tmpfs none /tmp && echo MOUNTED"};
  s.limits.wall_seconds = 4;
  auto r = must_run(s);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.stdout_data.find("MOUNTED"), std::string::npos) << r.stdout_data;
  EXPECT_NE(r.stderr_data.find("Operation not permitted"), std::string::npos) << r.stderr_data;
}

// Whether int 0x80 (the i386 system-call ABI) reaches the kernel here, outside any sandbox: a forked child
// calls getpid through it and exits 0 when it returned a pid, or dies of SIGSEGV where the kernel has no IA-32
// emulation. Nothing but a fixed getpid runs.
static bool host_has_ia32_emulation() {
  const pid_t pid = fork();
  if (pid == 0) {
    std::signal(SIGSEGV, SIG_DFL);  // a sanitizer's handler would turn the fault into an exit code
    void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) _exit(2);
    const unsigned char code[] = {0xb8, 0x14, 0x00, 0x00, 0x00, 0xcd, 0x80, 0xc3};  // mov eax, 20; int 0x80; ret
    std::memcpy(page, code, sizeof(code));
    const int got = reinterpret_cast<int (*)()>(page)();
    _exit(got > 0 ? 0 : 1);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return true;  // unknown: expect the filter's EPERM
  return !(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
}

TEST_F(SandboxTest, DangerousSystemCallsFailWithEperm) {
  auto r = must_run(python(R"(import ctypes, errno, os, socket, mmap, sys
libc = ctypes.CDLL(None, use_errno=True)
sc = libc.syscall; sc.restype = ctypes.c_long
def err(rc):
  return 'ok' if rc >= 0 else errno.errorcode.get(ctypes.get_errno(), '?')
print('unshare', err(libc.unshare(0x10000000)))
print('unshare(0)', err(libc.unshare(0)))
print('clone NEWUSER', err(sc(56, 0x10000000 | 17, 0, 0, 0, 0)))
print('clone NEWNET', err(sc(56, 0x40000000 | 17, 0, 0, 0, 0)))
print('clone3', err(sc(435, 0, 0)))
print('setns', err(libc.setns(0, 0)))
print('mount', err(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)))
print('ptrace', err(libc.ptrace(0, 0, 0, 0)))
params = ctypes.create_string_buffer(120)
print('io_uring_setup', err(sc(425, 1, params)))
print('bpf', err(sc(321, 0, 0, 0)))
print('perf_event_open', err(sc(298, 0, 0, -1, -1, 0)))
print('keyctl', err(sc(250, 0, 0, 0, 0, 0)))
print('userfaultfd', err(sc(323, 0)))
print('personality ADDR_NO_RANDOMIZE', err(libc.personality(0x0040000)))
print('personality query', libc.personality(0xffffffff) >= 0)
for fam in ('AF_NETLINK', 'AF_PACKET', 'AF_ALG', 'AF_VSOCK'):
  kind = socket.SOCK_SEQPACKET if fam == 'AF_ALG' else socket.SOCK_RAW
  try: socket.socket(getattr(socket, fam), kind); print(fam, 'ok')
  except OSError as e: print(fam, errno.errorcode[e.errno])
print('socket family 2**32+16', err(sc(41, (1 << 32) + 16, 3, 0)))
print('x32 getpid', err(sc(0x40000000 | 39)))
sys.stdout.flush()
pid = os.fork()  # the i386 probe in a child: a kernel without IA-32 emulation kills it with SIGSEGV
if pid == 0:
  m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
  m.write(b'\xb8\x14\x00\x00\x00\xcd\x80\xc3')  # mov eax, 20 (i386 getpid); int 0x80; ret
  f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
  os._exit(0 if f() == -1 else 1)
st = os.waitpid(pid, 0)[1]
print('i386 getpid', '-1' if os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0 else
      'SIGSEGV' if os.WIFSIGNALED(st) and os.WTERMSIG(st) == 11 else 'status %d' % st)
)"));
  ASSERT_TRUE(r.ok()) << r.stderr_data;
  // The i386 ABI (int 0x80) is EPERM under the filter where the kernel has IA-32 emulation; a kernel without
  // it (e.g. 6.18 guests built without CONFIG_IA32_EMULATION) kills the caller with SIGSEGV even outside the
  // sandbox, so the ABI is unreachable either way: what the host does decides which line is expected.
  const char* i386_expected = host_has_ia32_emulation() ? "i386 getpid -1" : "i386 getpid SIGSEGV";
  for (const char* line :
       {"unshare EPERM", "unshare(0) EPERM", "clone NEWUSER EPERM", "clone NEWNET EPERM", "clone3 ENOSYS",
        "setns EPERM", "mount EPERM", "ptrace EPERM", "io_uring_setup EPERM", "bpf EPERM", "perf_event_open EPERM",
        "keyctl EPERM", "userfaultfd EPERM", "personality ADDR_NO_RANDOMIZE EPERM", "personality query True",
        "AF_NETLINK EPERM", "AF_PACKET EPERM", "AF_ALG EPERM", "AF_VSOCK EPERM", "socket family 2**32+16 EPERM",
        "x32 getpid EPERM", i386_expected})
    EXPECT_NE(r.stdout_data.find(std::string(line) + "\n"), std::string::npos) << line << " in\n" << r.stdout_data;
}

TEST_F(SandboxTest, OrdinaryPythonStillWorksUnderTheFilter) {
  // What test programs and the eval's runner do: threads, subprocess, multiprocessing (fork), pipes,
  // prctl(PR_SET_DUMPABLE, 0), Unix socket pairs, IPv4 / IPv6 loopback.
  auto r = must_run(python(R"(import ctypes, os, socket, subprocess, threading, multiprocessing as mp
libc = ctypes.CDLL(None, use_errno=True)
print('dumpable', libc.prctl(4, 0, 0, 0, 0))
t = threading.Thread(target=lambda: None); t.start(); t.join(); print('thread ok')
print(subprocess.run(['python3', '-c', 'print(6 * 7)'], capture_output=True, text=True).stdout.strip())
r, w = os.pipe()
pid = os.fork()
if pid == 0:
  os.write(w, b'from child'); os._exit(0)
os.waitpid(pid, 0); print(os.read(r, 100).decode())
def sq(x): return x * x
with mp.get_context('fork').Pool(2) as p: print(p.map(sq, [1, 2, 3]))
a, b = socket.socketpair(); a.send(b'pair'); print(b.recv(4).decode())
for fam, host in ((socket.AF_INET, '127.0.0.1'), (socket.AF_INET6, '::1')):
  try:
    s = socket.socket(fam); s.bind((host, 0)); s.listen(); c = socket.create_connection(s.getsockname()[:2])
    print(fam.name, 'ok')
  except OSError as e: print(fam.name, e)
)"));
  ASSERT_TRUE(r.ok()) << r.stderr_data;
  EXPECT_EQ(r.stdout_data,
            "dumpable 0\nthread ok\n42\nfrom child\n[1, 4, 9]\npair\nAF_INET ok\nAF_INET6 ok\n")
      << r.stderr_data;
}

TEST_F(SandboxTest, ForkedMemoryHogStaysWithinTheRunsBudget) {
  // 8 processes each touching 200 MiB against a 512 MiB budget: at most 2 may hold theirs at once.
  // Each child reports once it holds its 200 MiB and then waits on a barrier the parent releases; the
  // parent counts those still alive (a cgroup's OOM killer may kill holders to let others in).
  RunSpec s = python(R"(import os, sys, time, select
r, w = os.pipe(); br, bw = os.pipe()
kids = []
for i in range(8):
  try: pid = os.fork()
  except OSError as e: print('fork failed:', e, file=sys.stderr); break
  if pid == 0:
    os.close(bw)
    try:
      b = bytearray(200 << 20)
      for k in range(0, len(b), 4096): b[k] = 1
      os.write(w, bytes([i]))
    except MemoryError: print('MemoryError', file=sys.stderr, flush=True); os._exit(3)
    os.read(br, 1); os._exit(0)
  kids.append(pid)
os.close(w); os.close(br)
held, codes = set(), {}
def reap():
  for p in kids:
    if p not in codes:
      q, st = os.waitpid(p, os.WNOHANG)
      if q: codes[p] = st
deadline = time.time() + 3
while not all(i in held or kids[i] in codes for i in range(len(kids))) and time.time() < deadline:
  if select.select([r], [], [], 0.05)[0]: held.update(os.read(r, 8))
  reap()
time.sleep(0.2); reap()  # a process the OOM killer just killed is gone by now
print(len([i for i in held if kids[i] not in codes]), flush=True)  # holding 200 MiB right now
os.close(bw)
for p in kids:
  if p not in codes: codes[p] = os.waitpid(p, 0)[1]
sys.exit(0 if len(kids) == 8 and all(c == 0 for c in codes.values()) else 1)
)");
  s.limits.memory_bytes = 512ll << 20;
  s.limits.address_space_bytes = 1ll << 30;
  s.limits.wall_seconds = 8;
  s.limits.cpu_seconds = 6;
  auto r = must_run(s);
  EXPECT_FALSE(r.ok());
  // A cgroup's OOM kill or MemoryError under the lowered RLIMIT_AS: memory; or, without a cgroup, a
  // fork refused at the lowered RLIMIT_NPROC first: processes. Never all 8 x 200 MiB.
  EXPECT_TRUE(r.limit == LimitHit::kMemory || r.limit == LimitHit::kProcesses)
      << limit_hit_name(r.limit) << "\n" << r.stderr_data.substr(0, 2000);
  EXPECT_LE(std::atoi(r.stdout_data.c_str()), 2) << "processes holding 200 MiB at once: " << r.stdout_data;
}

TEST_F(SandboxTest, TreeDeeperThanPathMaxIsCleanedUp) {
  // The probe's finding: 40 levels of 250-character names (10 KB of path) with a file at the bottom.
  // It lives in the run's tmpfs now; TearDown checks that nothing of the run is left under $TMPDIR.
  auto r = must_run(python(R"(import os
for i in range(40):
  n = chr(97 + i % 26) * 250
  os.mkdir(n); os.chdir(n)
open('bottom', 'w').write('x')
print(len(os.getcwd()) > 4096)
os.chmod('.', 0)
)"));
  ASSERT_TRUE(r.ok()) << r.stderr_data;
  EXPECT_EQ(r.stdout_data, "True\n");
}

TEST_F(SandboxTest, UnboundedTimesAreRefused) {
  // inf / 1e30 s overflowed the deadline (every run "timed out" at once); NaN was no limit at all.
  for (double w : {std::numeric_limits<double>::infinity(), 1e30, std::nan(""), -1.0, 0.0}) {
    RunSpec s = python("pass");
    s.limits.wall_seconds = w;
    auto r = run(s);
    ASSERT_FALSE(r.ok()) << w;
    EXPECT_NE(r.status().message().find("wall_seconds"), std::string::npos) << r.status().message();
  }
  for (double c : {std::numeric_limits<double>::infinity(), 1e30, std::nan(""), -1.0}) {
    RunSpec s = python("pass");
    s.limits.cpu_seconds = c;
    auto r = run(s);
    ASSERT_FALSE(r.ok()) << c;
    EXPECT_NE(r.status().message().find("cpu_seconds"), std::string::npos) << r.status().message();
  }
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

// A caller holding large buffers (a trainer's weights, gradients, logits: core/pages.h) while a thread writes
// them: the runs work (the child never touches memory its clone does not carry: its plan, stack and descriptors
// are the caller's ordinary memory), the buffers do not travel into the run (advised MADV_DONTFORK during the
// clone only): its largest process holds far
// less than they do. The control, the same bytes from malloc, shows that a run's max RSS does count what a
// clone copies (the clone of a process copies the page tables of every mapping not advised away).
TEST_F(SandboxTest, CallerLargeBuffersDoNotTravelIntoTheRun) {
  constexpr size_t kBytes = size_t{256} << 20;
  {
    std::vector<uint8_t> heap(kBytes, 1);
    const RunResult r = must_run(python("pass"));
    ASSERT_TRUE(r.ok()) << r.stderr_data;
    EXPECT_GE(r.max_rss_bytes, static_cast<int64_t>(kBytes)) << "a run's max RSS no longer counts the caller's copy";
  }
  PageArray<uint8_t> big = alloc_page_array<uint8_t>(kBytes);
  ASSERT_TRUE(big);
  std::memset(big.get(), 1, kBytes);
  EXPECT_FALSE(test::has_flag(test::mapping_flags(big.get()), "dc")) << "advised outside a clone";
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (uint8_t pass = 2; !stop; ++pass)
      for (size_t off = 0; off < kBytes && !stop; off += 4096) big[off] = pass;
  });
  for (int i = 0; i < 3; ++i) {
    RunSpec s = python("import sys; print(len(sys.argv))");
    s.files["data.txt"] = std::string(size_t{2} << 20, 'x');  // a plan with large strings of its own
    const RunResult r = must_run(s);
    EXPECT_TRUE(r.ok()) << r.stderr_data;
    EXPECT_EQ(r.stdout_data, "1\n");
    EXPECT_LT(r.max_rss_bytes, int64_t{128} << 20) << "the caller's buffers travelled into the run";
  }
  stop = true;
  writer.join();
  EXPECT_EQ(big[4096 + 1], 1);  // the writer's bytes only
  EXPECT_FALSE(test::has_flag(test::mapping_flags(big.get()), "dc")) << "the clone's advice outlived it";
}

}  // namespace
}  // namespace dc::sandbox
