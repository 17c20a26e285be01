// The seccomp filter (seccomp_filter.h). Default: allow; every listed call fails with EPERM (not a
// kill: the program, Python, reports it), clone3 with ENOSYS (its flags live in memory a filter cannot
// read; glibc then falls back to clone, whose flags it can), other architectures' calls (i386 through
// int 0x80, x32) with EPERM: a filter that checks x86_64 numbers only would be bypassed through them.
#include "sandbox/seccomp_filter.h"

#include <seccomp.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

namespace dc::sandbox {
namespace {

// Calls a test program never needs: new namespaces and mounts (a tmpfs of half the host's RAM that no
// limit counts, and the kernel surface of a fresh user namespace), tracing and reading other processes,
// kernel subsystems that are frequent exploit targets (bpf, perf, keyrings, io_uring, userfaultfd), and
// what administers the machine.
constexpr const char* kRefused[] = {
    "unshare", "setns", "mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsmount",
    "fsconfig", "fspick", "mount_setattr", "ptrace", "process_vm_readv", "process_vm_writev", "bpf",
    "perf_event_open", "keyctl", "add_key", "request_key", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "userfaultfd", "init_module", "finit_module", "delete_module", "reboot", "kexec_load",
    "kexec_file_load", "acct", "swapon", "swapoff", "open_by_handle_at", "quotactl", "syslog",
};

// clone's namespace flags (CLONE_NEWTIME is not among them: clone() reads that bit as part of the
// exit signal; it is reachable only through unshare and clone3, both refused).
constexpr uint64_t kCloneNewFlags[] = {CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC,
                                       CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET};

int add_rules(scmp_filter_ctx ctx) {
  const uint32_t eperm = SCMP_ACT_ERRNO(EPERM);
  int rc = 0;
  for (const char* name : kRefused) {
    int nr = seccomp_syscall_resolve_name(name);
    if (nr == __NR_SCMP_ERROR) continue;  // unknown to this libseccomp: the kernel is older still
    if ((rc = seccomp_rule_add(ctx, eperm, nr, 0)) != 0) return rc;
  }
  if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0)) != 0) return rc;
  // clone with any namespace flag (one rule per flag: libseccomp has no "masked not equal").
  for (uint64_t f : kCloneNewFlags)
    if ((rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(clone), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, f, f))) != 0) return rc;
  // personality: only the query (0xffffffff) and PER_LINUX (0) pass. The kernel reads 32 bits; every
  // other 32-bit value has a bit i set whose next bit (cyclically) is clear: one rule per i.
  for (int i = 0; i < 32; ++i) {
    const uint64_t bit = 1ull << i, next = 1ull << ((i + 1) % 32);
    rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(personality), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, bit | next, bit));
    if (rc != 0) return rc;
  }
  // socket / socketpair: AF_UNIX, AF_INET, AF_INET6 only (anything with upper bits set is refused too).
  for (int sys : {SCMP_SYS(socket), SCMP_SYS(socketpair)}) {
    if ((rc = seccomp_rule_add(ctx, eperm, sys, 1, SCMP_A0(SCMP_CMP_GT, AF_INET6))) != 0) return rc;
    for (uint64_t family = 0; family < AF_INET6; ++family) {
      if (family == AF_UNIX || family == AF_INET) continue;
      if ((rc = seccomp_rule_add(ctx, eperm, sys, 1, SCMP_A0(SCMP_CMP_EQ, family))) != 0) return rc;
    }
  }
  return 0;
}

// Builds the filter and exports it through a memfd into `out` (sock_filter instructions).
Status build(std::vector<sock_filter>& out) {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx) return internal_error("sandbox: seccomp_init failed (libseccomp)");
  struct Release {
    scmp_filter_ctx c;
    ~Release() { seccomp_release(c); }
  } release{ctx};
  int rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_ERRNO(EPERM));
  // The caller sets NO_NEW_PRIVS itself; libseccomp must not (it would be set in the caller).
  if (rc == 0) rc = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0);
  // A binary search over the system-call numbers instead of a chain (libseccomp >= 2.5; optional).
  if (rc == 0) (void)seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2);
  if (rc == 0) rc = add_rules(ctx);
  if (rc != 0) return internal_error(std::string("sandbox: building the seccomp filter: ") + std::strerror(-rc));
  int fd = memfd_create("dc-seccomp", MFD_CLOEXEC);
  if (fd < 0) return internal_error(std::string("sandbox: memfd_create: ") + std::strerror(errno));
  rc = seccomp_export_bpf(ctx, fd);
  const off_t size = lseek(fd, 0, SEEK_END);
  if (rc != 0 || size <= 0 || size % sizeof(sock_filter) != 0) {
    close(fd);
    return internal_error("sandbox: exporting the seccomp filter failed (libseccomp)");
  }
  out.resize(static_cast<size_t>(size) / sizeof(sock_filter));
  const ssize_t got = pread(fd, out.data(), static_cast<size_t>(size), 0);
  close(fd);
  if (got != size) return internal_error("sandbox: reading back the seccomp filter failed");
  return Status::ok_status();
}

}  // namespace

Result<sock_fprog> seccomp_program() {
  static std::once_flag once;
  static std::vector<sock_filter>* program = nullptr;  // never freed: runs in flight point into it
  static Status status = Status::ok_status();
  std::call_once(once, [] {
    auto* p = new std::vector<sock_filter>();
    status = build(*p);
    if (status.ok()) program = p;
    else delete p;
  });
  if (!status.ok()) return status;
  if (program->size() > 0xffff) return internal_error("sandbox: the seccomp filter is too long");
  sock_fprog f;
  f.len = static_cast<unsigned short>(program->size());
  f.filter = program->data();
  return f;
}

}  // namespace dc::sandbox
