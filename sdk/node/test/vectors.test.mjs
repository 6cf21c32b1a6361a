// Every shared test vector (sdk/vectors) through the Node package: the files the Rust crates
// and the Python package check too. A case added to a file runs here with no code.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import * as idgen from 'idgen-sdk';
import { asVector, vectors } from './support.mjs';

const DECODE = vectors('decode.json');
const INTEGERS = vectors('integers.json');

function expected(testCase) {
  return Object.fromEntries(Object.entries(testCase).filter(([key]) => !['name', 'input', 'integer'].includes(key)));
}

test('the schedule is the one the vectors are written against', () => {
  const theirs = DECODE.schedule.map(({ layout, region_bits, machine_bits, sequence_bits, from_unix_ms }) => ({
    layout, regionBits: region_bits, machineBits: machine_bits, sequenceBits: sequence_bits, fromUnixMs: from_unix_ms,
  }));
  assert.deepEqual(idgen.defaultSchedule(), theirs);
});

for (const testCase of DECODE.cases) {
  test(`as text: ${testCase.name}`, () => {
    if ('error' in testCase) {
      assert.throws(() => idgen.decode(testCase.input, DECODE.regions), (error) => {
        assert.ok(error instanceof idgen.IdgenInvalidInputError && error instanceof RangeError && error instanceof idgen.IdgenError, String(error));
        assert.equal(error.code, testCase.error, error.message);
        return true;
      });
    } else {
      assert.deepEqual(asVector(idgen.decode(testCase.input, DECODE.regions)), expected(testCase));
    }
  });
}

for (const testCase of INTEGERS.cases) {
  test(`as a bigint: ${testCase.name}`, () => {
    const value = BigInt(testCase.integer);
    if ('error' in testCase) {
      assert.throws(() => idgen.decode(value, DECODE.regions), (error) => {
        assert.ok(error instanceof idgen.IdgenInvalidInputError && error instanceof RangeError && error instanceof idgen.IdgenError, String(error));
        assert.equal(error.code, testCase.error, error.message);
        return true;
      });
    } else {
      assert.deepEqual(asVector(idgen.decode(value, DECODE.regions)), expected(testCase));
    }
  });
}

test(`a number is never an ID: ${INTEGERS.number.name}`, () => {
  for (const value of [INTEGERS.number.value, 97301141913751557, 0, Number.MAX_SAFE_INTEGER]) {
    assert.throws(() => idgen.decode(value), (error) => error instanceof TypeError && /not a number/.test(error.message));
  }
  for (const value of [null, undefined, true, {}, [1]]) {
    assert.throws(() => idgen.decode(value), TypeError);
  }
});

test('a bigint past 128 bits is out of range, not a crash', () => {
  assert.throws(() => idgen.decode(2n ** 200n), (error) => error.code === 'out_of_range');
  assert.throws(() => idgen.decode(-(2n ** 127n)), (error) => error.code === 'out_of_range');
});

test('regions may be a Map or an object; a region number that is not one is refused', () => {
  const v2 = DECODE.cases.find((c) => c.region === 'eu-west-1');
  assert.equal(idgen.decode(v2.input, new Map([[2, 'eu-west-1']])).region, 'eu-west-1');
  assert.throws(() => idgen.decode(v2.input, { two: 'eu-west-1' }), (error) => error.code === 'invalid_argument');
});

for (const testCase of vectors('typeid/valid.json')) {
  test(`TypeID valid: ${testCase.name}`, () => {
    const parsed = idgen.parseTypeid(testCase.typeid);
    assert.deepEqual(parsed, { prefix: testCase.prefix, uuid: testCase.uuid });
    assert.equal(idgen.typeidText(parsed.prefix, parsed.uuid), testCase.typeid);
  });
}

for (const testCase of vectors('typeid/invalid.json')) {
  test(`TypeID invalid: ${testCase.name}`, () => {
    assert.throws(() => idgen.parseTypeid(testCase.typeid), (error) => error.code === 'invalid_typeid');
  });
}
