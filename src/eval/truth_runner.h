// The Python runner that computes a differential-testing task's expected outputs (expected.h), run as
// `python3 -I /tmp/truth.py` inside the sandbox with /tmp/task.json (the task's JSON line) and /tmp/rules.json
// ({"inputs": oracles.h input_rule, "oracle": special_oracle, "mbpp": whether an MBPP task}); the script starts
// with oracles.h kEvalPlusPython. It executes prompt + canonical_solution as EvalPlus does, and for every
// base_input then plus_input, rebuilt by the task's input rule (an input that does not fit it ends the run:
// "MalformedInput"): the contract (HumanEval+: prompt + contract + "return True"; MBPP+, whose prompt is a
// docstring: the canonical solution's lines up to its `def ENTRY_POINT(` line, the contract, "return True"),
// when the task has one, on a copy of the arguments, an input whose contract fails with AssertionError being
// left out ("skip"); else the canonical solution on a fresh deep copy, timed with time.time() around the call
// alone (EvalPlus' reference time). With the not_none oracle the output kept is `output is not None`
// (EvalPlus' trusted_exec). An output marshal cannot write is kept as the builtin it compares as when it is a
// dict / tuple subclass (Counter, namedtuple). An output whose marshal form passes 64 KiB (HumanEval/15's plus
// inputs make 147 MB of strings) is not kept: only the sha256 of
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
class MalformedInput(Exception):
    pass
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
def _contract_source(task, mbpp):
    contract = task['contract']
    if not mbpp:
        return task['prompt'] + contract + '\n    return True\n'
    lines = task['canonical_solution'].split('\n')
    entry = task['entry_point']
    at = [i for i, l in enumerate(lines) if l.startswith('def %s(' % entry) or l.startswith('def %s (' % entry)]
    if not at:
        raise MalformedInput('the canonical solution has no line "def %s(", after which the contract goes' % entry)
    body = [l for l in contract.split('\n') if l.strip()]
    indent = body[0][:len(body[0]) - len(body[0].lstrip())] if body else '    '
    return '\n'.join(lines[:at[0] + 1]) + '\n' + contract + '\n' + indent + 'return True\n'
def _plain_output(out, col, i):
    for x in (out, _dc_loosen(out)):
        try:
            return marshal.dumps(x), x
        except ValueError as e:
            err = e
    raise ValueError('%s input %d: the output is not plain data marshal can write: %s' % (col, i, err))
def _main():
    with open('/tmp/task.json', 'rb') as f:
        task = json.loads(f.read())
    with open('/tmp/rules.json', 'rb') as f:
        rules = json.loads(f.read())
    entry = task['entry_point']
    ns = {}
    exec(compile(task['prompt'] + task['canonical_solution'], 'canonical.py', 'exec'), ns)
    fn = ns[entry]
    contract = None
    if (task.get('contract') or '').strip():
        cns = {}
        exec(compile(_contract_source(task, rules['mbpp']), 'contract.py', 'exec'), cns)
        contract = cns[entry]
    not_none = rules['oracle'] == 'not_none'
    report, expected = {}, {}
    for col in ('base', 'plus'):
        outs, times, skip, again = [], [], [], {}
        for i, raw in enumerate(task[col + '_input']):
            try:
                inp = _dc_restore(rules['inputs'], raw)
            except ValueError as e:
                raise MalformedInput('"%s_input"[%d]: %s' % (col, i, e)) from None
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
            if not_none:
                out = out is not None
            data, out = _plain_output(out, col, i)
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
