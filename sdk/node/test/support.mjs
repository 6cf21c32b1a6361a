// Shared set-up for the Node package's tests. scripts/test-sdk copies this folder into a fresh
// project where the packed package is installed, so `import ... from 'idgen-sdk'` is the package as
// its users get it; the repository's paths come in the environment.

import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';

function required(name, what) {
  const value = process.env[name];
  if (!value) throw new Error(`${name} (${what}) is not set: scripts/test-sdk sets it`);
  return value;
}

/** A file of sdk/vectors, parsed. */
export function vectors(name) {
  return JSON.parse(readFileSync(path.join(required('IDGEN_VECTORS', 'sdk/vectors'), name), 'utf8'));
}

/** The `idgen` binary. */
export function idgenBin() {
  return required('IDGEN_BIN', 'the idgen binary');
}

/** A directory removed when the test ends. */
export function scratch(t) {
  const dir = mkdtempSync(path.join(tmpdir(), 'idgen-node-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/**
 * A development generator's configuration on a SQLite lease file in `dir` (shared by every
 * process given the same directory); with `listen`, a worker's.
 */
export function developmentConfig(dir, { clockCheck = false, name = 'generator.toml', listen } = {}) {
  const file = path.join(dir, name);
  writeFileSync(
    file,
    'development = true\n' +
      (listen ? `listen = "${listen}"\n` : '') +
      '[lease]\nstore = "sqlite"\n' +
      `sqlite_path = "${path.join(dir, 'leases.db')}"\n` +
      'create_tables = true\n[clock]\n' +
      `require_sync = ${clockCheck}\n`,
  );
  return file;
}

/** What the kernel says of its clock (adjtimex; TIME_ERROR, 5, is unsynchronized), asked of Python's ctypes. */
export function kernelClockSynchronized() {
  const state = execFileSync('python3', [
    '-c',
    'import ctypes,ctypes.util\n' +
      'class T(ctypes.Structure): _fields_=[("modes",ctypes.c_uint),("pad",ctypes.c_byte*204)]\n' +
      'print(ctypes.CDLL(ctypes.util.find_library("c")).adjtimex(ctypes.byref(T())))',
  ]);
  return Number(String(state).trim()) !== 5;
}

/** A decode answer as the vector files write one. */
export function asVector(decoded) {
  const out = {
    id: decoded.id,
    layout: decoded.layout,
    created_at: decoded.createdAt.toISOString(),
    created_at_unix_ms: decoded.createdAtUnixMs,
  };
  for (const [ours, theirs] of [['regionNumber', 'region_number'], ['region', 'region'], ['machine', 'machine'], ['sequence', 'sequence']]) {
    if (decoded[ours] !== undefined) out[theirs] = decoded[ours];
  }
  return out;
}

export function increasing(ids) {
  return ids.every((id, i) => i === 0 || BigInt(ids[i - 1]) < BigInt(id));
}
