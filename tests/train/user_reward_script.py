#!/usr/bin/python3
"""A user reward program for the protocol tests (train/user_reward.h): reads one JSON line per completion
on stdin and writes one score per line. argv[1] picks the behaviour, good or broken."""
import json
import os
import sys
import time

mode = sys.argv[1]  # (argv[2]: a file, for slow_pid)
items = [json.loads(line) for line in sys.stdin]
for item in items:  # the protocol: prompt, completion, the example's fields
    assert set(item) == {"prompt", "completion", "example"}, item
if mode == "length":  # a score from the completion and one from the example's own field
    scores = [len(it["completion"]) + it["example"].get("bonus", 0) for it in items]
elif mode == "nan":
    scores = ["nan"] + [1.5] * (len(items) - 1)
elif mode == "crash":
    sys.stderr.write("reward script: something broke\n")
    sys.exit(3)
elif mode == "short":
    scores = [1] * (len(items) - 1)
elif mode == "word":
    scores = ["good"] * len(items)
elif mode == "inf":
    scores = ["inf"] * len(items)
elif mode == "fail_on_bad":  # the length, or a crash on a batch with a completion "bad"
    if any(it["completion"] == "bad" for it in items):
        sys.exit("reward script: a bad completion")
    scores = [len(it["completion"]) for it in items]
elif mode == "slow_pid":  # the length, after appending its pid to the file argv[2] and a second's sleep
    with open(sys.argv[2], "a") as f:
        f.write("%d\n" % os.getpid())
    time.sleep(1)
    scores = [len(it["completion"]) for it in items]
elif mode == "sleep":
    time.sleep(60)
    scores = []
else:
    sys.exit("unknown mode " + mode)
print("\n".join(str(s) for s in scores))
