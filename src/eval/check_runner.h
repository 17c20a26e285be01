// The Python runner of one check (humaneval.h check_spec / inputs_check_spec; the script starts with
// oracles.h kEvalPlusPython), run as `python3 -I
// /tmp/runner.py ENTRY_POINT MODE CHECK_FUNCTION` inside the sandbox with /tmp/program.py (the candidate
// program) and a per-run nonce on stdin. MODE `test`: /tmp/prompt.py (the task's prompt: trusted benchmark
// data), /tmp/test.py (the task's test: trusted), optionally /tmp/setup.py (MBPP's test_setup_code); MODE
// `inputs` (EvalPlus' differential testing): /tmp/task.json (the task's line: inputs, atol, canonical
// solution) and /tmp/plan.json (expected outputs, time limits, inputs left out; expected.h). Every trusted
// file is read, then removed, before the fork, and the candidate's process drops the runner's copy: a program
// can neither rewrite them (that changes nothing) nor read the tests and the expected outputs.
//
// The verdict comes from a process the candidate's code never runs in. The runner makes itself
// non-dumpable (prctl PR_SET_DUMPABLE 0: a same-uid process can then neither ptrace it nor open its
// /proc/<pid>/{mem,fd/*}), opens two pipes and forks:
// - the CHILD points fd 0 at /dev/null and fd 1 at fd 2 (it never holds the runner's stdin or stdout),
//   compiles and executes the program in a fresh namespace (a compile error is reported as "syntax",
//   an exception at import time, or an entry point it does not define, as that exception), runs the
//   setup there and answers ("ready", the names the setup made), then serves calls: it reads marshal-ed
//   (args, kwargs), replaces an argument ("\0dc_ref", name) by that name's object, calls the entry point
//   and answers ("ok", result) or ("exc", type name, message); a result of a dict / tuple subclass
//   (Counter, namedtuple) is sent as the builtin it compares as, one marshal still cannot write is
//   ("rejected", why).
// - the PARENT reads the nonce only after the fork (the child's memory never held it). In `test` mode it
//   executes the prompt (its helpers, e.g. HumanEval/32's `poly`) and the test in its own namespace, with
//   each name the setup made bound to a reference the proxy sends as ("\0dc_ref", name), and calls
//   CHECK_FUNCTION(proxy). In `inputs` mode it calls the proxy on each input with the input's time limit
//   (select on the answer pipe: CallTimeout), each input rebuilt first by the task's input rule, and
//   compares the answer with the expected one as EvalPlus does, with the task's special oracle
//   (oracles.h; humaneval.h inputs_check_spec), printing "<nonce> base" on its stdout once the base inputs
//   passed. With the not_none oracle the child answers `answer is not None` (a bool answer as itself); with
//   any_answer it answers True for any value returned (which need not be data that can travel).
//   The proxy forwards each call to the child and accepts only plain builtin data (None,
//   bool, int, float, complex, str, bytes, tuple, list, dict, set, frozenset: no code, no classes whose
//   __eq__ the candidate chose); a forwarded exception is raised again as the builtin type of that
//   name (AssertionError stays an assertion) or an Exception subclass of that name. A child that ended
//   (ProgramExited), a rejected result (ProgramAnswerRejected), an argument marshal cannot copy
//   (TestArgumentUnsupported) or an answer past its time (CallTimeout) are BaseException subclasses, which a
//   test's `except Exception` cannot swallow. The parent kills the child, then reports: the nonce on ITS
//   stdout when every check passed, else a "DC_EVAL <kind> <type>: <message>" line on stderr (kinds:
//   syntax, assertion — a wrong answer included —, timeout, limit, exception).
#pragma once

namespace dc::eval {

inline constexpr const char* kCheckRunner = R"PY(import sys, os, marshal, builtins, json, math, select, time, base64, copy, hashlib
_MAX = 1 << 28
_PLAIN = (type(None), bool, int, float, complex, str, bytes)
_SEQ = (tuple, list, set, frozenset)
class ProgramExited(BaseException):
    pass
class ProgramAnswerRejected(BaseException):
    pass
class TestArgumentUnsupported(BaseException):
    pass
class CallTimeout(BaseException):
    pass
class WrongAnswer(AssertionError):
    pass
_REF = '\x00dc_ref'
class _Ref:
    def __init__(self, name):
        self.name = name
def _send(fd, obj):
    data = marshal.dumps(obj)
    data = memoryview(len(data).to_bytes(8, 'little') + data)
    while data:
        data = data[os.write(fd, data):]
def _read(fd, n, deadline=None):
    parts, left = [], n
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise CallTimeout('no answer within the time limit')
        b = os.read(fd, min(left, 1 << 20))
        if not b:
            return None
        parts.append(b)
        left -= len(b)
    return b''.join(parts)
def _recv(fd, deadline=None):
    head = _read(fd, 8, deadline)
    if head is None:
        return None
    n = int.from_bytes(head, 'little')
    if n > _MAX:
        raise MemoryError('an answer of %d bytes from the program' % n)
    data = _read(fd, n, deadline)
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
def _child(req, resp, src, setup, entry, libc, oracle):
    _TRUSTED.clear()  # the tests and expected outputs the parent judges with: not the candidate's to read
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
        before = set(ns)
        if setup:
            exec(compile(setup, 'setup.py', 'exec'), ns)
        made = tuple(sorted(str(k) for k in ns if k not in before))
    except BaseException as e:
        _send(resp, _exc(e))
        os._exit(0)
    _send(resp, ('ready', made))
    while True:
        call = _recv(req)
        if call is None:
            os._exit(0)
        try:
            args = [ns[a[1]] if type(a) is tuple and len(a) == 2 and a[0] == _REF else a for a in call[0]]
            out = fn(*args, **call[1])
            out = ('ok', _dc_not_none(out) if oracle == 'not_none' else True if oracle == 'any_answer' else out)
        except BaseException as e:
            out = _exc(e)
        try:
            _send(resp, out)
        except ValueError as e:
            try:
                _send(resp, ('ok', _dc_loosen(out[1])))
            except (ValueError, IndexError):
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
        self.deadline = None
    def gone(self):
        _, st = os.waitpid(self.pid, 0)
        self.pid = 0
        how = 'signal %d' % os.WTERMSIG(st) if os.WIFSIGNALED(st) else 'exit status %d' % os.WEXITSTATUS(st)
        return ProgramExited("the program's process ended (%s) before it answered" % how)
    def answer(self):
        msg = _recv(self.resp, self.deadline) if self.pid else None
        if msg is None:
            raise self.gone() if self.pid else ProgramExited('the program is gone')
        ok = type(msg) is tuple and len(msg) in (2, 3) and type(msg[0]) is str
        if not ok or (msg[0] not in ('ok', 'ready') and not all(type(m) is str for m in msg)):
            raise ProgramExited('the program sent a malformed answer')
        return msg
    def __call__(self, *args, **kwargs):
        args = tuple((_REF, a.name) if type(a) is _Ref else a for a in args)
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
def _ready(cand):
    msg = cand.answer()
    if msg[0] == 'syntax' and len(msg) == 3:
        return ('syntax', '%s: %s' % (msg[1], msg[2])), ()
    if msg[0] == 'exc' and len(msg) == 3:
        _raise(msg[1], msg[2])
    if msg[0] != 'ready' or len(msg) != 2 or type(msg[1]) is not tuple or not all(type(m) is str for m in msg[1]):
        raise ProgramExited('the program sent a malformed answer')
    return None, msg[1]
def _judge(cand, entry, nonce):
    report, made = _ready(cand)
    if report:
        return report
    ns = {}
    try:
        exec(compile(_TRUSTED['prompt.py'], 'prompt.py', 'exec'), ns)
    except BaseException:
        ns = {}
    for name in made:
        ns[name] = _Ref(name)
    ns[entry] = cand
    exec(compile(_TRUSTED['test.py'], 'test.py', 'exec'), ns)
    ns[sys.argv[3]](cand)
    return None
def _is_floats(x):
    if type(x) is float:
        return True
    return type(x) in (list, tuple) and len(x) > 0 and all(type(i) is float for i in x)
def _close(a, b, atol):
    if type(a) in (list, tuple) or type(b) in (list, tuple):
        return (type(a) in (list, tuple) and type(b) in (list, tuple) and len(a) == len(b)
                and all(_close(x, y, atol) for x, y in zip(a, b)))
    if type(a) not in (bool, int, float) or type(b) not in (bool, int, float):
        return False
    try:
        a, b = float(a), float(b)
    except OverflowError:
        return a == b
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= atol + 1e-07 * abs(b)
def _oracle_match(oracle, out, exp, atol, inp):
    # EvalPlus' `exact_match` of a task with a special oracle (oracles.h); raising is a mismatch.
    try:
        exact = out == exp
        if oracle == 'any_answer':
            return True
        if oracle == 'expected_or_zero':
            return exact or out == 0
        if oracle == 'surface_area':
            return exact or abs(out - _dc_surface_area(*inp)) <= atol
        if oracle == 'digit_distance':
            return exact or out == _dc_digit_distance(*inp)
        if oracle == 'set_equal':
            return set(out) == set(exp)
        if oracle == 'not_none':
            return out == exp if type(out) is bool else exp == (out is not None)
        return exact
    except Exception:
        return False
def _same(out, exp, atol, task, inp, oracle):
    if oracle == 'find_zero':
        return abs(_dc_poly(*inp, out)) <= task['atol'], atol
    exact = _oracle_match(oracle, out, exp, atol, inp)
    if atol == 0 and _is_floats(exp):
        atol = 1e-6
    if not exact and atol != 0:
        ok = type(out) == type(exp) and (type(exp) not in (list, tuple) or len(out) == len(exp))
        return ok and _close(out, exp, atol), atol
    return exact, atol
def _short(x):
    r = repr(x)
    return r if len(r) <= 80 else r[:77] + '...'
def _canonical(task, not_none):
    ns = {}
    exec(compile(task['prompt'] + task['canonical_solution'], 'canonical.py', 'exec'), ns)
    fn = ns[task['entry_point']]
    return (lambda *a: fn(*a) is not None) if not_none else fn
def _judge_inputs(cand, entry, nonce):
    report, _ = _ready(cand)
    if report:
        return report
    task = json.loads(_TRUSTED['task.json'])
    plan = json.loads(_TRUSTED['plan.json'])
    oracle = plan['oracle']
    expected = marshal.loads(base64.b64decode(plan['expected']))
    canonical = None
    for col in ('base', 'plus'):
        atol, skip, limits = task['atol'], set(plan[col + '_skip']), plan[col + '_limits']
        again = plan[col + '_recompute']
        for i, raw in enumerate(task[col + '_input']):
            if i in skip:
                continue
            inp = _dc_restore(plan['input_rule'], raw)
            cand.deadline = time.monotonic() + limits[i]
            try:
                out = cand(*inp)
            except CallTimeout:
                raise CallTimeout('%s input %d: no answer within %.2f s' % (col, i, limits[i])) from None
            cand.deadline = None
            exp = expected[col][i]
            digest = again.get(str(i))
            if digest is not None:
                try:
                    data = marshal.dumps(out)
                except ValueError:
                    data = b''
                if digest and hashlib.sha256(data).hexdigest() == digest:
                    continue
                if canonical is None:
                    canonical = _canonical(task, oracle == 'not_none')
                exp = canonical(*copy.deepcopy(inp))
            same, atol = _same(out, exp, atol, task, inp, oracle)
            if not same:
                raise WrongAnswer('%s input %d: expected %s, got %s' % (col, i, _short(exp), _short(out)))
        if col == 'base':
            sys.stdout.write('\n' + nonce + ' base\n')
            sys.stdout.flush()
    return None
def _file(name):
    with open('/tmp/' + name, 'rb') as f:
        return f.read()
_TRUSTED = {}
def _main():
    entry, mode = sys.argv[1], sys.argv[2]
    src = _file('program.py')
    setup = _file('setup.py') if os.path.exists('/tmp/setup.py') else b''
    for name in (('task.json', 'plan.json') if mode == 'inputs' else ('prompt.py', 'test.py')):
        _TRUSTED[name] = _file(name)
        os.unlink('/tmp/' + name)  # nor on disk: the candidate shares the sandbox's /tmp
    # The not_none oracle compares `answer is not None`: the child sends that, not the answer (a re.Match);
    # any_answer passes any value returned: the child sends True, not the answer (any object at all).
    oracle = json.loads(_TRUSTED['plan.json'])['oracle'] if mode == 'inputs' else ''
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
            _child(req_r, resp_w, src, setup, entry, libc, oracle)
        finally:
            os._exit(0)
    os.close(req_r)
    os.close(resp_w)
    nonce = sys.stdin.readline().strip()
    cand = _Candidate(pid, req_w, resp_r)
    report = None
    try:
        report = (_judge_inputs if mode == 'inputs' else _judge)(cand, entry, nonce)
    except WrongAnswer as e:
        report = ('assertion', 'wrong answer: %s' % (e,))
    except AssertionError as e:
        report = ('assertion', 'AssertionError: %s' % (e,))
    except CallTimeout as e:
        report = ('timeout', 'CallTimeout: %s' % (e,))
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
