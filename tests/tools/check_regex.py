#!/usr/bin/env python3
"""Checks strings against regular expressions with Python's re.fullmatch, the reference for
cvllm's regex constraint (vLLM takes Python's re syntax).

stdin: one JSON value, either {"regex": R, "strings": [S, ...]} or an array of those ("jobs").
stdout: one line per string that does not match, "JOB INDEX: STRING".
Exit status: 0 all match, 1 some do not, 2 unusable input or regex.
"""
import json
import re
import sys


def main():
    try:
        data = json.load(sys.stdin)
    except ValueError as e:
        print(f"check_regex: input is not JSON: {e}", file=sys.stderr)
        return 2
    jobs = data if isinstance(data, list) else [data]
    bad = 0
    for j, job in enumerate(jobs):
        try:
            rx = re.compile(job["regex"])
        except (re.error, KeyError, TypeError) as e:
            print(f"check_regex: job {j}: {e}", file=sys.stderr)
            return 2
        for i, s in enumerate(job.get("strings", [])):
            if not rx.fullmatch(s):
                bad += 1
                print(f"{j} {i}: {s!r}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
