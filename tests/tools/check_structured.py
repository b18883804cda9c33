#!/usr/bin/env python3
"""Checks structured outputs against their constraints with independent validators.

Input (a file named on the command line): {"cases": [...corpus cases...], "outputs": [{"case": NAME,
"text": TEXT}, ...]}. JSON cases go to ajv (Node.js, Debian's node-ajv), regex, grammar and structural tag cases
to Python's re.fullmatch (a grammar or structural tag names a regex of the same language in "check",
or a checker in "check_named"), choices to membership. Prints one line per invalid output and exits 1 if there was
any, 2 if a validator could not run.
"""
import json
import os
import re
import subprocess
import sys

AJV = r"""
const Ajv = require('ajv');
const jobs = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const ajv = new Ajv({allErrors: true, format: 'full'});
const bad = [];
for (const job of jobs) {
  const validate = ajv.compile(job.schema);
  job.texts.forEach((text, i) => {
    let value;
    try { value = JSON.parse(text); } catch (e) { bad.push([job.name, i, 'not JSON: ' + e.message]); return; }
    if (!validate(value)) bad.push([job.name, i, ajv.errorsText(validate.errors)]);
  });
}
process.stdout.write(JSON.stringify(bad));
"""

JSON_OBJECT_SCHEMA = {"type": ["object", "array"]}


def arith(s):
    """expr ::= term (("+" | "-") term){0,3}; term ::= num | "(" expr ")"; num ::= [0-9]{1,3}"""
    pos = 0

    def term():
        nonlocal pos
        if pos < len(s) and s[pos] == "(":
            pos += 1
            if not expr() or pos >= len(s) or s[pos] != ")":
                return False
            pos += 1
            return True
        m = re.match(r"[0-9]{1,3}", s[pos:])
        if not m:
            return False
        pos += m.end()
        return pos >= len(s) or not s[pos].isdigit()

    def expr():
        nonlocal pos
        if not term():
            return False
        for _ in range(3):
            if pos < len(s) and s[pos] in "+-":
                pos += 1
                if not term():
                    return False
        return True

    return expr() and pos == len(s)


NAMED = {"arith": arith}


def main():
    data = json.load(open(sys.argv[1], encoding="utf-8"))
    cases = {c["name"]: c for c in data["cases"]}
    bad = []
    jobs = {}
    for out in data["outputs"]:
        case, text = cases[out["case"]], out["text"]
        kind = case["kind"]
        if kind in ("json", "json_object"):
            schema = case.get("schema", JSON_OBJECT_SCHEMA)
            jobs.setdefault(case["name"], {"name": case["name"], "schema": schema, "texts": []})["texts"].append(text)
        elif kind == "regex":
            if not re.fullmatch(case["spec"], text):
                bad.append((case["name"], text, "no match"))
        elif kind == "choice":
            if text not in case["choices"]:
                bad.append((case["name"], text, "not a choice"))
        elif kind in ("grammar", "structural_tag"):
            ok = NAMED[case["check_named"]](text) if "check_named" in case else re.fullmatch(case["check"], text)
            if not ok:
                bad.append((case["name"], text, "not in the language"))
    if jobs:
        env = dict(os.environ, NODE_PATH="/usr/share/nodejs")
        r = subprocess.run(["node", "-e", AJV], input=json.dumps(list(jobs.values())), capture_output=True,
                           text=True, env=env)
        if r.returncode != 0:
            print("ajv failed: " + r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "ajv failed")
            return 2
        for name, i, why in json.loads(r.stdout):
            bad.append((name, jobs[name]["texts"][i], why))
    for name, text, why in bad:
        print(f"{name}: {why}: {text!r}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
