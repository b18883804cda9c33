#!/usr/bin/env node
// validate_json.js — checks JSON texts against JSON schemas with ajv, the validator vLLM users
// reach for, independent of cvllm's own converter. Debian's node-ajv is ajv 6 (draft-07) and lives
// outside node's default path: run as NODE_PATH=/usr/share/nodejs node validate_json.js.
//
// stdin: one JSON value, either {"schema": S, "instances": [TEXT, ...]} or an array of those
// ("jobs"). Each instance is the JSON text exactly as generated; it is parsed here, so text that is
// not JSON counts as invalid. Formats are checked in ajv's "full" mode.
// stdout: one line per invalid instance, "JOB INDEX: REASON".
// exit status: 0 every instance valid, 1 some instance invalid, 2 unusable input or schema.
'use strict';
const Ajv = require('ajv');

let input;
try {
  input = JSON.parse(require('fs').readFileSync(0, 'utf8'));
} catch (e) {
  process.stderr.write('validate_json: input is not JSON: ' + e.message + '\n');
  process.exit(2);
}
const jobs = Array.isArray(input) ? input : [input];
const ajv = new Ajv({allErrors: true, format: 'full'});
let bad = 0;
jobs.forEach((job, j) => {
  let validate;
  try {
    validate = ajv.compile(job.schema);
  } catch (e) {
    process.stderr.write(`validate_json: job ${j}: schema refused: ${e.message}\n`);
    process.exit(2);
  }
  (job.instances || []).forEach((text, i) => {
    let value;
    try {
      value = JSON.parse(text);
    } catch (e) {
      bad++;
      process.stdout.write(`${j} ${i}: not JSON (${e.message}): ${JSON.stringify(text)}\n`);
      return;
    }
    if (!validate(value)) {
      bad++;
      process.stdout.write(`${j} ${i}: ${ajv.errorsText(validate.errors)}: ${JSON.stringify(text)}\n`);
    }
  });
});
process.exit(bad ? 1 : 0);
