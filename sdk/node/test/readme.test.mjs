// The README's quick start, as the installed package carries it, run as a user would: its
// TOML block written to generator.toml, its JavaScript block run in that directory.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { scratch } from './support.mjs';

const project = path.dirname(path.dirname(fileURLToPath(import.meta.url)));

function blocks(text, language) {
  return [...text.matchAll(new RegExp('```' + language + '\\n([\\s\\S]*?)```', 'g'))].map((match) => match[1]);
}

test('the README quick start runs as written', (t) => {
  const readme = readFileSync(path.join(project, 'node_modules', 'idgen-sdk', 'README.md'), 'utf8');
  const [code] = blocks(readme, 'js');
  const [toml] = blocks(readme, 'toml');
  assert.ok(code && toml, 'the README has a js and a toml block');
  assert.equal(code.trim().split('\n').length, 4, 'a four-line quick start: start, take, close');
  const dir = scratch(t);
  writeFileSync(path.join(dir, 'generator.toml'), toml);
  const script = path.join(project, `readme-${process.pid}.mjs`);
  writeFileSync(script, code);
  t.after(() => rmSync(script, { force: true }));
  const output = execFileSync(process.execPath, [script], { cwd: dir, encoding: 'utf8', timeout: 60_000 });
  const [id, at] = output.trim().split(' ');
  assert.match(id, /^[0-9]+$/);
  assert.ok(Math.abs(new Date(at).getTime() - Date.now()) < 60_000, output);
});
