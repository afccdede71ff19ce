// Saves screenshots of report pages written by `isolate report`, as a reader first sees them:
// the first screen (1400x900), the allocation-site view and, when the page draws steps, the
// timeline. Run by tests/browser/screenshot.sh, which writes the page first:
//
//   node tests/browser/screenshot.mjs --chromium /usr/bin/chromium --page report.html \
//        --out docs/img --name report-gpt2
//
// Writes NAME.png (the first screen), NAME-sites.png (the site table and icicle) and
// NAME-timeline.png (the chart, when the trace has steps or regions). Fails (exit 1) when the
// page reports an error or is not drawn.

import { chromium } from "playwright-core";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

const args = process.argv.slice(2);
function opt(name, dflt) {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : dflt;
}
const exe = opt("--chromium", "/usr/bin/chromium");
const file = opt("--page");
const out = opt("--out");
const name = opt("--name", "report");
if (!file || !out) {
  console.error("usage: screenshot.mjs --page PAGE.html --out DIR [--name NAME] [--chromium PATH]");
  process.exit(2);
}
fs.mkdirSync(out, { recursive: true });

const profile = fs.mkdtempSync(path.join(os.tmpdir(), "isolate-report-shot-"));
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: exe,
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"],
  viewport: { width: 1400, height: 900 },
  deviceScaleFactor: 1,
});
let failed = false;
try {
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto("file://" + path.resolve(file));
  await page.waitForFunction(() => document.body.dataset.rendered === "1" || document.body.dataset.error, null, { timeout: 60000 });
  const err = await page.evaluate(() => document.body.dataset.error);
  if (err || errors.length) {
    console.error(`${file}: the page reported an error: ${err || errors.join(" | ")}`);
    failed = true;
  } else {
    const settle = () => page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
    await settle();
    const shots = [];
    const first = path.join(out, `${name}.png`);
    await page.screenshot({ path: first });
    shots.push(first);
    const sites = page.locator(".sites").first();
    if (await sites.count()) {
      const p = path.join(out, `${name}-sites.png`);
      await sites.scrollIntoViewIfNeeded();
      await settle();
      // the table's first 12 rows (the rest hidden for the picture) and the icicle
      await page.evaluate(() => document.querySelectorAll(".sitetable tr.site").forEach((r, i) => { if (i >= 12) r.style.display = "none"; }));
      await page.setViewportSize({ width: 1400, height: 2400 });
      await settle();
      await sites.screenshot({ path: p });
      await page.setViewportSize({ width: 1400, height: 900 });
      await page.evaluate(() => document.querySelectorAll(".sitetable tr.site").forEach((r) => { r.style.display = ""; }));
      shots.push(p);
    }
    const hasSteps = await page.evaluate(() => (window.isolateReport.charts[0] || {}).state && document.querySelector(".steps") !== null);
    if (hasSteps) {
      const p = path.join(out, `${name}-timeline.png`);
      await page.locator(".chart").first().scrollIntoViewIfNeeded();
      await settle();
      await page.locator(".chart").first().screenshot({ path: p });
      shots.push(p);
    }
    for (const s of shots) console.log(`${s}: ${fs.statSync(s).size} bytes`);
  }
} finally {
  await browser.close();
  fs.rmSync(profile, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
