// The registry console in a real browser: Debian's chromium, driven by playwright-core, against a
// live registry and a worker that holds the same schedule (scripts/console-check starts both and
// sets the variables below). Each step prints what it proved; any failure exits non-zero.
//
//   REGISTRY_URL, WORKER_URL, OPERATOR_TOKEN, ARTIFACTS (where the screenshots go),
//   REGIONS (the comma-separated regions the script added; the last one is retired),
//   CHROMIUM (default /usr/bin/chromium)
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";

const env = (name, fallback) => {
  const value = process.env[name] ?? fallback;
  if (value === undefined) throw new Error(`${name} is not set (scripts/console-check sets it)`);
  return value;
};
const REGISTRY = env("REGISTRY_URL");
const WORKER = env("WORKER_URL");
const TOKEN = env("OPERATOR_TOKEN");
const ARTIFACTS = env("ARTIFACTS");
const REGIONS = env("REGIONS").split(",");
mkdirSync(ARTIFACTS, { recursive: true });

const step = (text) => console.log(`  ok  ${text}`);

async function json(url, init) {
  const response = await fetch(url, init);
  return { status: response.status, body: await response.json() };
}

/// IDs to decode both ways: the SPEC vectors, edge values, IDs and UUIDs the worker just issued,
/// and random 63-bit values across the whole range (so every layout of the schedule is hit).
async function idsToCompare() {
  const ids = ["97301141913751557", "683244571854022659", "0", "9223372036854775807", "000097301141913751557"];
  const batch = await json(`${WORKER}/v1/ids:batch`, { method: "POST", body: JSON.stringify({ count: 40 }) });
  assert.equal(batch.status, 200, JSON.stringify(batch.body));
  ids.push(...batch.body.ids);
  const uuids = await json(`${WORKER}/v1/uuids`, { method: "POST", body: JSON.stringify({ count: 20 }) });
  assert.equal(uuids.status, 200, JSON.stringify(uuids.body));
  ids.push(...uuids.body.ids, uuids.body.ids[0].toUpperCase());
  let seed = 0x2545f4914f6cdd1dn;
  for (let i = 0; i < 300; i++) {
    seed ^= seed << 13n; seed &= (1n << 64n) - 1n;
    seed ^= seed >> 7n;
    seed ^= seed << 17n; seed &= (1n << 64n) - 1n;
    ids.push((seed >> 1n).toString());
  }
  return ids;
}

const browser = await chromium.launch({
  executablePath: env("CHROMIUM", "/usr/bin/chromium"),
  args: ["--no-sandbox", "--disable-gpu"],
});
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  const requests = [];
  page.on("request", (request) => requests.push({ method: request.method(), url: request.url() }));
  const pageErrors = [];
  page.on("pageerror", (error) => pageErrors.push(error.message));
  page.on("console", (message) => {
    // The browser logs every 4xx as "Failed to load resource"; the refused write is meant to be one.
    if (message.type() === "error" && !message.text().startsWith("Failed to load resource")) pageErrors.push(message.text());
  });

  await page.goto(`${REGISTRY}/console`);
  await page.waitForFunction(() => window.idgenConsole?.ready());
  for (const name of REGIONS) {
    await page.locator(`#region-table tr[data-region="${name}"]`).waitFor();
  }
  const retired = REGIONS[REGIONS.length - 1];
  assert.match(await page.locator(`tr[data-region="${retired}"]`).innerText(), /retired/);
  step(`the page loads and lists the regions the test added (${REGIONS.join(", ")}; ${retired} retired)`);

  const cells = page.locator(".capacity-row .cells").first().locator(".cell");
  assert.equal(await cells.count(), 8, "v2's 3 region bits are 8 cells");
  assert.equal(await page.locator(".capacity-row .cell.used").count(), REGIONS.length - 1);
  assert.equal(await page.locator(".capacity-row .cell.retired").count(), 1);
  step("v2's region numbers are drawn as 8 cells: used, retired and free");

  const layouts = (await json(`${REGISTRY}/v1/layouts`)).body;
  for (const layout of layouts.layouts) {
    await page.locator(`.layout[data-layout="${layout.name}"] .bar`).waitFor();
  }
  const timelineText = await page.locator("#timeline-label").textContent();
  assert.match(timelineText, /2095-09-07/);
  // The horizon is kept a lead ahead of now, so each read moves it on by the time between them.
  const drawnHorizon = Date.parse(timelineText.match(/horizon (\S+)\.$/)[1]);
  const apiHorizon = Date.parse(layouts.horizon);
  assert.ok(drawnHorizon <= apiHorizon && apiHorizon - drawnHorizon < 60_000, timelineText);
  step("the schedule is drawn: a timeline to 2095-09-07 with each layout, the horizon and now, and a 64-bit bar per layout");

  // The SPEC test vectors, typed in and decoded on the page.
  const decodeOnPage = async (text) => {
    await page.fill("#decode-input", text);
    await page.press("#decode-input", "Enter");
    await page.locator("#decode-result").waitFor({ state: "visible" });
    const field = async (name) => (await page.locator(`dd[data-field="${name}"]`).textContent()).trim();
    return { layout: await field("Layout"), created: await field("Created (UTC)"), machine: await field("Machine"), sequence: await field("Sequence"), region: await page.locator('dd[data-field="Region"]').count() ? await field("Region") : null };
  };
  assert.deepEqual(await decodeOnPage("97301141913751557"),
    { layout: "v1", created: "2026-09-26T12:00:00.000Z", machine: "37", sequence: "5", region: null });
  const region2 = (await json(`${REGISTRY}/v1/regions`)).body.regions.find((r) => r.number === 2);
  assert.deepEqual(await decodeOnPage("683244571854022659"),
    { layout: "v2", created: "2031-03-01T09:30:00.000Z", machine: "170", sequence: "3", region: `${region2.name} (number 2)` });
  assert.equal(await page.locator("#decode-bits .field").count(), 5, "sign, timestamp, region, machine, sequence");
  await page.fill("#decode-input", "not-an-id");
  await page.press("#decode-input", "Enter");
  assert.match(await page.locator("#decode-error").textContent(), /neither|UUID/);
  step("the SPEC test vectors decode on the page to the right fields; bad text gets an error");

  // Many IDs: the page's decode and the worker's GET /v1/ids/{id}/decode agree on every one.
  const ids = await idsToCompare();
  for (const id of ids) {
    const api = await json(`${WORKER}/v1/ids/${id}/decode`);
    assert.equal(api.status, 200, `${id}: ${JSON.stringify(api.body)}`);
    const local = await page.evaluate((text) => window.idgenConsole.decode(text), id);
    assert.deepEqual(local, api.body, `decode of ${id}`);
  }
  const bads = ["9223372036854775808", "12a", " 123", "123\n", "0190d5a5-5b2c-4a3c-8d4e-1234567890ab", "0190d5a5-5b2c-7a3c-0d4e-1234567890ab"];
  for (const bad of bads) {
    const api = await json(`${WORKER}/v1/ids/${encodeURIComponent(bad)}/decode`);
    assert.equal(api.status, 400, bad);
    const refused = await page.evaluate((text) => {
      try { window.idgenConsole.decode(text); return false; } catch { return true; }
    }, bad);
    assert.ok(refused, `the page decoded ${bad}, which the API refuses`);
  }
  step(`${ids.length} IDs and UUIDs decode on the page exactly as GET /v1/ids/{id}/decode answers, and ${bads.length} bad ones are refused by both`);

  // Keyboard only: Tab from the top reaches the decode field and Enter decodes.
  await page.reload();
  await page.waitForFunction(() => window.idgenConsole?.ready());
  let reached = false;
  for (let i = 0; i < 10 && !reached; i++) {
    await page.keyboard.press("Tab");
    reached = await page.evaluate(() => document.activeElement?.id === "decode-input");
  }
  assert.ok(reached, "Tab does not reach the decode field");
  await page.keyboard.type("97301141913751557");
  await page.keyboard.press("Enter");
  await page.locator("#decode-result").waitFor({ state: "visible" });
  step("keyboard only: Tab reaches the decode field, Enter decodes");

  await page.screenshot({ path: join(ARTIFACTS, "console-1280x800.png"), fullPage: true });

  // A write without the token: the dialog states the consequence, the API refuses, nothing changes.
  const before = (await json(`${REGISTRY}/v1/regions`)).body;
  const fresh = "console-written";
  await page.fill("#add-region-name", fresh);
  await page.click("#add-region-form button[type=submit]");
  await page.locator("#confirm").waitFor({ state: "visible" });
  assert.match(await page.locator("#confirm-text").textContent(), /never reused/);
  await page.click("#confirm-button");
  await page.locator("#write-error").filter({ hasText: "operator" }).waitFor();
  assert.match(await page.locator("#write-error").textContent(), /writes need an operator.*401 unauthorized/);
  assert.deepEqual((await json(`${REGISTRY}/v1/regions`)).body, before, "a refused write changed the registry");
  step("a write without the operator token shows the API's 401 message and changes nothing");

  // Cancelled: nothing is sent.
  const writesBefore = requests.filter((r) => r.method !== "GET").length;
  await page.click("#add-region-form button[type=submit]");
  await page.locator("#confirm").waitFor({ state: "visible" });
  await page.keyboard.press("Escape");
  await page.locator("#write-result").filter({ hasText: "Cancelled" }).waitFor();
  assert.equal(requests.filter((r) => r.method !== "GET").length, writesBefore, "a cancelled write sent a request");
  step("a cancelled confirmation sends nothing");

  // With the token: the region is added, and the registry's API shows it.
  await page.fill("#token", TOKEN);
  await page.click("#add-region-form button[type=submit]");
  await page.locator("#confirm").waitFor({ state: "visible" });
  await page.click("#confirm-button");
  await page.locator("#write-result").filter({ hasText: `Added ${fresh}` }).waitFor();
  const after = (await json(`${REGISTRY}/v1/regions`)).body;
  const added = after.regions.find((r) => r.name === fresh);
  assert.ok(added, "the registry does not list the region the page added");
  await page.locator(`#region-table tr[data-region="${fresh}"]`).waitFor();
  step(`with the token the page adds ${fresh} (number ${added.number}), and GET /v1/regions lists it`);

  // The other two writes, with the token: a layout scheduled, and the new region retired.
  await page.fill("#layout-name", "v3");
  await page.fill("#layout-from", "2040-01-01T00:00:00Z");
  await page.click("#add-layout-form button[type=submit]");
  await page.locator("#confirm").waitFor({ state: "visible" });
  assert.match(await page.locator("#confirm-text").textContent(), /cannot be moved or removed/);
  await page.click("#confirm-button");
  await page.locator("#write-result").filter({ hasText: "Scheduled v3" }).waitFor();
  const v3 = (await json(`${REGISTRY}/v1/layouts`)).body.layouts.find((l) => l.name === "v3");
  assert.deepEqual([v3.region_bits, v3.machine_bits, v3.sequence_bits, v3.from], [4, 8, 10, "2040-01-01T00:00:00.000Z"]);
  await page.locator('.layout[data-layout="v3"]').waitFor();
  // Retiring: the name is typed again, and a typo is the API's 400; then a grace ahead (the
  // table shows when, and it can be cancelled), then at once.
  const retireWith = async (confirm, now) => {
    await page.selectOption("#retire-region-name", fresh);
    await page.fill("#retire-region-confirm", confirm);
    if (now) await page.check("#retire-region-now");
    await page.click("#retire-region-form button[type=submit]");
    await page.locator("#confirm").waitFor({ state: "visible" });
    assert.match(await page.locator("#confirm-text").textContent(), new RegExp(`region number ${added.number} is never handed out again`));
    await page.click("#confirm-button");
  };
  const freshNow = async () => (await json(`${REGISTRY}/v1/regions`)).body.regions.find((r) => r.name === fresh && r.number === added.number);
  await retireWith(`${fresh}x`, false);
  await page.locator("#write-error").filter({ hasText: "400 confirm_mismatch" }).waitFor();
  assert.equal((await freshNow()).retires_at, undefined, "a retirement with a typo was scheduled");
  await retireWith(fresh, false);
  await page.locator("#write-result").filter({ hasText: `${fresh} retires at` }).waitFor();
  const retiring = await freshNow();
  assert.equal(retiring.status, "active");
  assert.ok(Date.parse(retiring.retires_at) > Date.now() + 3_600_000, `retires at ${retiring.retires_at}, not a grace from now`);
  await page.locator(`#region-table tr[data-region="${fresh}"] .retires`).filter({ hasText: `retires at ${retiring.retires_at}` }).waitFor();
  await page.selectOption("#cancel-retire-name", fresh);
  await page.fill("#cancel-retire-confirm", fresh);
  await page.click("#cancel-retire-form button[type=submit]");
  await page.locator("#confirm").waitFor({ state: "visible" });
  assert.match(await page.locator("#confirm-text").textContent(), new RegExp(`was to retire at ${retiring.retires_at}`));
  await page.click("#confirm-button");
  await page.locator("#write-result").filter({ hasText: `Cancelled the retirement of ${fresh}` }).waitFor();
  assert.equal((await freshNow()).retires_at, undefined);
  assert.equal(await page.locator(`#region-table tr[data-region="${fresh}"] .retires`).count(), 0);
  await retireWith(fresh, true);
  await page.locator("#write-result").filter({ hasText: `Retired ${fresh}` }).waitFor();
  assert.equal((await freshNow()).status, "retired");
  // A write the registry refuses for its own reasons: the message is the API's.
  await page.fill("#layout-name", "v4");
  await page.fill("#layout-from", "2030-01-01T00:00:00Z");
  await page.click("#add-layout-form button[type=submit]");
  await page.click("#confirm-button");
  await page.locator("#write-error").filter({ hasText: "409 schedule_conflict" }).waitFor();
  step("with the token the page schedules v3, refuses a retirement whose typed name differs (the API's 400), schedules the new region's retirement a grace ahead (shown as \"retires at\"), cancels it and retires it at once (the API shows each); a refused layout shows the API's 409");

  await page.screenshot({ path: join(ARTIFACTS, "console-after-write.png"), fullPage: true });

  // A narrow window: nothing wider than the viewport but the tables' own scroll areas.
  await page.setViewportSize({ width: 390, height: 800 });
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `the page is ${overflow}px wider than a 390px window`);
  await page.screenshot({ path: join(ARTIFACTS, "console-390.png"), fullPage: true });
  step("at 390px wide the page fits the window");

  // Every request the page made went to this registry, for something it already serves.
  const allowed = [/^\/console(\/console\.(js|css))?$/, /^\/v1\/regions$/, /^\/v1\/layouts$/, /^\/v1\/regions\/[^/]+:(retire|cancel-retire)$/];
  for (const { method, url } of requests) {
    const parsed = new URL(url);
    if (parsed.protocol === "data:") continue;
    assert.equal(parsed.origin, new URL(REGISTRY).origin, `${method} ${url} left the registry`);
    assert.ok(allowed.some((re) => re.test(parsed.pathname)), `${method} ${url} is not an endpoint the registry serves`);
  }
  assert.deepEqual(pageErrors, [], "the page logged errors");
  step(`the page's ${requests.length} requests all went to the registry's own endpoints, with no script errors`);
  console.log(`screenshots in ${ARTIFACTS}`);
} finally {
  await browser.close();
}
