// The Python runner that computes a differential-testing task's expected outputs (expected.h), run as
// `python3 -I /tmp/truth.py` inside the sandbox with /tmp/task.json (the task's JSON line). It executes
// prompt + canonical_solution as EvalPlus does, and for every base_input then plus_input: the contract
// (prompt + contract + "return True", when the task has one) on a copy of the arguments, an input whose
// contract fails with AssertionError being left out ("skip"); else the canonical solution on a fresh deep
// copy, timed with time.time() around the call alone (EvalPlus' reference time). An output whose marshal
// form passes 64 KiB (HumanEval/15's plus inputs make 147 MB of strings) is not kept: only the sha256 of
// its marshal form when it holds no float (equal bytes load as equal values, so a candidate's answer of
// the same digest is `==` to it), and the sample's check recomputes it with the canonical solution in its
// trusted parent when the digests differ or there is none. It prints one JSON object: {"expected": base64
// of marshal({"base": [...], "plus": [...]}) (None where skipped or not kept), "base_time": [s...],
// "plus_time": [...], "base_skip": [i...], "plus_skip": [...], "base_recompute": {"i": "sha256 hex" or ""},
// "plus_recompute": {...}}. An output marshal cannot write, or any exception, ends it with a message on
// stderr and exit status 3.
#pragma once

namespace dc::eval {

inline constexpr const char* kTruthRunner = R"PY(import sys, json, marshal, base64, time, copy, hashlib
def _has_float(x):
    todo = [x]
    while todo:
        y = todo.pop()
        if type(y) in (float, complex):
            return True
        if type(y) in (list, tuple, set, frozenset):
            todo.extend(y)
        elif type(y) is dict:
            todo.extend(y.keys())
            todo.extend(y.values())
    return False
def _main():
    with open('/tmp/task.json', 'rb') as f:
        task = json.loads(f.read())
    entry = task['entry_point']
    ns = {}
    exec(compile(task['prompt'] + task['canonical_solution'], 'canonical.py', 'exec'), ns)
    fn = ns[entry]
    contract = None
    if (task.get('contract') or '').strip():
        cns = {}
        exec(compile(task['prompt'] + task['contract'] + '\n    return True\n', 'contract.py', 'exec'), cns)
        contract = cns[entry]
    report, expected = {}, {}
    for col in ('base', 'plus'):
        outs, times, skip, again = [], [], [], {}
        for i, inp in enumerate(task[col + '_input']):
            if contract is not None:
                try:
                    contract(*copy.deepcopy(inp))
                except AssertionError:
                    outs.append(None)
                    times.append(0.0)
                    skip.append(i)
                    continue
            args = copy.deepcopy(inp)
            start = time.time()
            out = fn(*args)
            times.append(time.time() - start)
            try:
                data = marshal.dumps(out)
            except ValueError as e:
                raise ValueError('%s input %d: the output is not plain data marshal can write: %s' % (col, i, e)) from None
            if len(data) > 65536:
                again[str(i)] = '' if _has_float(out) else hashlib.sha256(data).hexdigest()
                out = None
            outs.append(out)
        expected[col] = outs
        report[col + '_time'] = times
        report[col + '_skip'] = skip
        report[col + '_recompute'] = again
    report['expected'] = base64.b64encode(marshal.dumps(expected)).decode('ascii')
    sys.stdout.write(json.dumps(report))
    sys.stdout.flush()
try:
    _main()
except BaseException as e:
    sys.stderr.write('\nDC_TRUTH %s: %s\n' % (type(e).__name__, str(e)[:300]))
    sys.stderr.flush()
    sys.exit(3)
)PY";

}  // namespace dc::eval
