// The Python runner of one HumanEval check (humaneval.h check_spec), run as `python3 -I /tmp/runner.py
// ENTRY_POINT` inside the sandbox with /tmp/program.py (the candidate program), /tmp/prompt.py (the task's
// prompt: trusted benchmark data) and /tmp/test.py (the task's test: trusted), and a per-run nonce on stdin.
//
// The verdict comes from a process the candidate's code never runs in. The runner makes itself
// non-dumpable (prctl PR_SET_DUMPABLE 0: a same-uid process can then neither ptrace it nor open its
// /proc/<pid>/{mem,fd/*}), opens two pipes and forks:
// - the CHILD points fd 0 at /dev/null and fd 1 at fd 2 (it never holds the runner's stdin or stdout),
//   compiles and executes the program in a fresh namespace (a compile error is reported as "syntax",
//   an exception at import time, or an entry point it does not define, as that exception), then serves
//   calls: it reads marshal-ed (args, kwargs), calls the entry point and answers ("ok", result) or
//   ("exc", type name, message); a result marshal cannot write is ("rejected", why).
// - the PARENT reads the nonce only after the fork (the child's memory never held it), executes the
//   prompt (its helpers, e.g. HumanEval/32's `poly`) and the test in its own namespace and calls
//   check(proxy); the proxy forwards each call to the child and accepts only plain builtin data (None,
//   bool, int, float, complex, str, bytes, tuple, list, dict, set, frozenset: no code, no classes whose
//   __eq__ the candidate chose); a forwarded exception is raised again as the builtin type of that
//   name (AssertionError stays an assertion) or an Exception subclass of that name. A child that ended
//   (ProgramExited), a rejected result (ProgramAnswerRejected) or an argument marshal cannot copy
//   (TestArgumentUnsupported) are BaseException subclasses, which a test's `except Exception` cannot
//   swallow. The parent kills the child, then reports: the nonce on ITS stdout when check() returned, else
//   a "DC_EVAL <kind> <type>: <message>" line on stderr.
#pragma once

namespace dc::eval {

inline constexpr const char* kCheckRunner = R"PY(import sys, os, marshal, builtins
_MAX = 1 << 28
_PLAIN = (type(None), bool, int, float, complex, str, bytes)
_SEQ = (tuple, list, set, frozenset)
class ProgramExited(BaseException):
    pass
class ProgramAnswerRejected(BaseException):
    pass
class TestArgumentUnsupported(BaseException):
    pass
def _send(fd, obj):
    data = marshal.dumps(obj)
    data = memoryview(len(data).to_bytes(8, 'little') + data)
    while data:
        data = data[os.write(fd, data):]
def _read(fd, n):
    parts, left = [], n
    while left:
        b = os.read(fd, min(left, 1 << 20))
        if not b:
            return None
        parts.append(b)
        left -= len(b)
    return b''.join(parts)
def _recv(fd):
    head = _read(fd, 8)
    if head is None:
        return None
    n = int.from_bytes(head, 'little')
    if n > _MAX:
        raise MemoryError('an answer of %d bytes from the program' % n)
    data = _read(fd, n)
    return None if data is None else marshal.loads(data)
def _plain(x):
    todo = [x]
    while todo:
        y = todo.pop()
        t = type(y)
        if t in _PLAIN:
            continue
        if t in _SEQ:
            todo.extend(y)
        elif t is dict:
            todo.extend(y.keys())
            todo.extend(y.values())
        else:
            return False
    return True
def _child(req, resp, src, entry, libc):
    fd = os.open('/dev/null', os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    os.dup2(2, 1)
    libc.prctl(4, 1, 0, 0, 0)
    try:
        code = compile(src, 'program.py', 'exec')
    except BaseException as e:
        _send(resp, ('syntax', type(e).__name__, str(e)[:300]))
        os._exit(0)
    ns = {}
    try:
        exec(code, ns)
        if entry not in ns:
            raise NameError("name '%s' is not defined" % entry)
        fn = ns[entry]
    except BaseException as e:
        _send(resp, _exc(e))
        os._exit(0)
    _send(resp, ('ready',))
    while True:
        call = _recv(req)
        if call is None:
            os._exit(0)
        try:
            out = ('ok', fn(*call[0], **call[1]))
        except BaseException as e:
            out = _exc(e)
        try:
            _send(resp, out)
        except ValueError as e:
            _send(resp, ('rejected', 'the result cannot be returned: %s' % (e,)))
def _exc(e):
    try:
        return ('exc', str(type(e).__name__), str(e)[:300])
    except BaseException:
        return ('exc', 'Exception', '(unprintable)')
def _raise(name, msg):
    t = getattr(builtins, name, None)
    if isinstance(t, type) and issubclass(t, BaseException):
        try:
            e = t(msg)
        except BaseException:
            e = None
        if e is not None:
            raise e
    try:
        t = type(name, (Exception,), {})
    except BaseException:
        t = Exception
    raise t(msg)
class _Candidate:
    def __init__(self, pid, req, resp):
        self.pid, self.req, self.resp = pid, req, resp
    def gone(self):
        _, st = os.waitpid(self.pid, 0)
        self.pid = 0
        how = 'signal %d' % os.WTERMSIG(st) if os.WIFSIGNALED(st) else 'exit status %d' % os.WEXITSTATUS(st)
        return ProgramExited("the program's process ended (%s) before it answered" % how)
    def answer(self):
        msg = _recv(self.resp) if self.pid else None
        if msg is None:
            raise self.gone() if self.pid else ProgramExited('the program is gone')
        ok = type(msg) is tuple and len(msg) in (1, 2, 3) and type(msg[0]) is str
        if not ok or (msg[0] != 'ok' and not all(type(m) is str for m in msg)):
            raise ProgramExited('the program sent a malformed answer')
        return msg
    def __call__(self, *args, **kwargs):
        try:
            _send(self.req, (args, kwargs))
        except BrokenPipeError:
            raise (self.gone() if self.pid else ProgramExited('the program is gone')) from None
        except ValueError as e:
            raise TestArgumentUnsupported('the test passes an argument marshal cannot copy: %s' % (e,)) from None
        msg = self.answer()
        if msg[0] == 'ok' and len(msg) == 2 and _plain(msg[1]):
            return msg[1]
        if msg[0] == 'exc' and len(msg) == 3:
            _raise(msg[1], msg[2])
        if msg[0] == 'rejected' and len(msg) == 2:
            raise ProgramAnswerRejected(msg[1])
        if msg[0] == 'ok':
            raise ProgramAnswerRejected('the result is not plain data (None, bool, int, float, complex, '
                                        'str, bytes, tuple, list, dict, set)')
        raise ProgramExited('the program sent a malformed answer')
def _judge(cand, prompt, test, entry):
    msg = cand.answer()
    if msg[0] == 'syntax' and len(msg) == 3:
        return ('syntax', '%s: %s' % (msg[1], msg[2]))
    if msg[0] == 'exc' and len(msg) == 3:
        _raise(msg[1], msg[2])
    if msg != ('ready',):
        raise ProgramExited('the program sent a malformed answer')
    ns = {}
    try:
        exec(compile(prompt, 'prompt.py', 'exec'), ns)
    except BaseException:
        ns = {}
    ns[entry] = cand
    exec(compile(test, 'test.py', 'exec'), ns)
    ns['check'](cand)
    return None
def _main():
    entry = sys.argv[1]
    with open('/tmp/program.py', 'rb') as f:
        src = f.read()
    with open('/tmp/prompt.py', 'rb') as f:
        prompt = f.read()
    with open('/tmp/test.py', 'rb') as f:
        test = f.read()
    import ctypes
    libc = ctypes.CDLL(None)
    if libc.prctl(4, 0, 0, 0, 0) != 0:
        sys.stderr.write('\nDC_EVAL exception OSError: prctl(PR_SET_DUMPABLE, 0) failed\n')
        sys.exit(6)
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(req_w)
            os.close(resp_r)
            _child(req_r, resp_w, src, entry, libc)
        finally:
            os._exit(0)
    os.close(req_r)
    os.close(resp_w)
    nonce = sys.stdin.readline().strip()
    cand = _Candidate(pid, req_w, resp_r)
    report = None
    try:
        report = _judge(cand, prompt, test, entry)
    except AssertionError as e:
        report = ('assertion', 'AssertionError: %s' % (e,))
    except MemoryError as e:
        report = ('limit', 'MemoryError: %s' % (e,))
    except BaseException as e:
        report = ('exception', '%s: %s' % (type(e).__name__, str(e)[:200]))
    if cand.pid:
        try:
            os.kill(cand.pid, 9)
            os.waitpid(cand.pid, 0)
        except OSError:
            pass
    if report is not None:
        sys.stderr.write('\nDC_EVAL %s %s\n' % report)
        sys.stderr.flush()
        os._exit(2)
    sys.stdout.write('\n' + nonce + '\n')
    sys.stdout.flush()
    os._exit(0)
_main()
)PY";

}  // namespace dc::eval
