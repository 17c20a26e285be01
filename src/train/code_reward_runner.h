// The Python runner of one code-reward test case (rewards.h code_rewards), run as `python3 -I
// /tmp/runner.py` inside the sandbox with /tmp/program.py = the reference's program, `code + "\n" + test`,
// and a per-run nonce on stdin.
//
// It keeps the reference's semantics (`python3 -c program`: __name__ == "__main__", tracebacks on
// stderr, the exit status of the program) for every program that runs to its end, and detects a
// program that exits before its test's statements ran, which the reference counts as a pass. The runner
// makes itself non-dumpable (a same-uid process cannot ptrace it or open its /proc/<pid>/{mem,fd/*}),
// opens a pipe and forks. The CHILD points fd 0 at /dev/null (the runner's stdin, the nonce, stays out of
// its reach), executes the program and, only when it returned (every statement of the test ran without an
// exception), writes one byte to the pipe, then ends as Python does (non-daemon threads joined, atexit
// handlers run). The PARENT reads the nonce only after the fork, waits for the child and prints the nonce
// when the child wrote its byte and exited 0; it exits with the child's status (1 when it was killed).
//
// What this does not stop: the test runs in the program's own interpreter, so a program written against
// this runner (one that writes the byte to the pipe itself, or skips the test's lines with a trace
// function) still passes. It does stop what a policy finds without knowing the runner: sys.exit(0),
// exit(), quit(), raise SystemExit, os._exit(0), killing itself, before the test ran.
#pragma once

namespace dc::train {

inline constexpr const char* kCodeRewardRunner = R"PY(import sys, os
def _child(done, libc):
    fd = os.open('/dev/null', os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    libc.prctl(4, 1, 0, 0, 0)
    sys.argv[:] = ['-c']
    sys.path.insert(0, '')
    with open('/tmp/program.py', 'rb') as f:
        src = f.read()
    import builtins
    g = {'__name__': '__main__', '__builtins__': builtins}
    try:
        exec(compile(src, '<string>', 'exec'), g)
    finally:
        del src
    os.write(done, b'D')
def _main():
    import ctypes
    libc = ctypes.CDLL(None)
    if libc.prctl(4, 0, 0, 0, 0) != 0:
        sys.stderr.write('runner: prctl(PR_SET_DUMPABLE, 0) failed\n')
        os._exit(125)
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _child(w, libc)
        return
    os.close(w)
    nonce = sys.stdin.readline().strip()
    while True:
        try:
            _, st = os.waitpid(pid, 0)
            break
        except InterruptedError:
            pass
    os.set_blocking(r, False)
    try:
        done = os.read(r, 1) == b'D'
    except BlockingIOError:
        done = False
    code = os.WEXITSTATUS(st) if os.WIFEXITED(st) else 1
    if done and code == 0:
        sys.stdout.write('\n' + nonce + '\n')
        sys.stdout.flush()
    os._exit(code if code != 0 or done else 3)
_main()
)PY";

}  // namespace dc::train
