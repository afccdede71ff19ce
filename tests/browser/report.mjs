// Drives headless Chromium over report pages written by `isolate report` and checks what is on
// screen, at two window sizes: findings and badges at the top, a timeline that zooms (wheel and
// keys) and pans (drag and keys), axis labels inside the canvas and apart, no raw JSON or
// internal words, load and first paint in time. Run by analyzer/tests/browser.rs:
//
//   node tests/browser/report.mjs --chromium /usr/bin/chromium --manifest pages.json [--shots docs/img]
//
// pages.json: [{ "name", "file", "badge"?, "findings"?: [text…], "clean"?: bool,
//                "trimmed"?: bool, "markers"?: bool, "regions"?: bool, "max_load_ms"?, "shot"?,
//                "shot_zoomed"?, "zoom_at"?, "stacks"?: [text…] }]
// "stacks": a click at the bottom of the plot's middle (the first allocation's band) shows
// these lines of its call stacks below the chart.
// "places": texts (`allocated at train.py:39 in main`) each finding box shows on a line of its
// own, on the first screen, above the timeline.
// "steps": the number of steps the page draws as regions, found from the call stacks (the
// trace has no regions): labelled `step 1`, … above the plot, said in a line and the legend.
// "zoom_to_steps": the first view holds every step and leaves the start-up out: the steps
// take most of its width.
// "sites": the allocation-site table is sorted by bytes (a click on "allocations" sorts it by
// allocations), a row opens its stack, the icicle draws frames and zooms into one on a click.
// "trimmed": the first view leaves a quiet start or end out; "zoom_at": where across the plot
// the wheel zooms (0..1, default 0.6).
// Exit 0 when every check passed; otherwise every failure is printed and it exits 1.

import { chromium } from "playwright-core";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

const args = process.argv.slice(2);
function opt(name) {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : undefined;
}
const exe = opt("--chromium") || "/usr/bin/chromium";
const manifest = JSON.parse(fs.readFileSync(opt("--manifest"), "utf8"));
const shots = opt("--shots");
// With --all-sizes, screenshots of the small window too (report-NAME-800.png).
const allSizes = args.includes("--all-sizes");
const SIZES = [
  { width: 1400, height: 900 },
  { width: 800, height: 600 },
];

const failures = [];
let checks = 0;
function check(ok, what) {
  checks++;
  if (!ok) failures.push(what);
  return ok;
}

const profile = fs.mkdtempSync(path.join(os.tmpdir(), "isolate-report-browser-"));
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: exe,
  headless: true,
  args: [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
  ],
  viewport: SIZES[0],
});

// Lets the page draw what the last input asked for.
async function frames(page) {
  await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
}
async function view(page, i = 0) {
  return page.evaluate((i) => window.isolateReport.charts[i].view(), i);
}
async function labels(page, i = 0) {
  return page.evaluate((i) => {
    const s = window.isolateReport.charts[i].state;
    return { labels: s.labels, width: s.width, height: s.height };
  }, i);
}
// Every label lies inside the canvas, and labels of one axis do not overlap.
async function labelsFit(page, where) {
  const { labels: ls, width, height } = await labels(page);
  for (const l of ls) {
    check(l.x0 >= 0 && l.x1 <= width && l.y0 >= 0 && l.y1 <= height,
      `${where}: label "${l.text}" (${l.axis}) overflows the ${width}x${height} canvas: x ${l.x0.toFixed(1)}..${l.x1.toFixed(1)}, y ${l.y0}..${l.y1}`);
  }
  for (const axis of ["x", "marker", "region"]) {
    const xs = ls.filter((l) => l.axis === axis).sort((a, b) => a.x0 - b.x0);
    for (let k = 1; k < xs.length; k++) {
      const a = xs[k - 1], b = xs[k];
      const overlap = b.x0 < a.x1 && Math.abs(a.y0 - b.y0) < 12;
      check(!overlap, `${where}: ${axis} labels "${a.text}" and "${b.text}" overlap`);
    }
  }
  const x = ls.filter((l) => l.axis === "x");
  check(x.length >= 2, `${where}: only ${x.length} time labels`);
  return ls;
}

let pageNo = 0;
for (const p of manifest) {
  for (const size of SIZES) {
    const where = `${p.name} @${size.width}x${size.height}`;
    const page = await browser.newPage({ viewport: size });
    await page.setViewportSize(size);
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
    const requests = [];
    page.on("request", (r) => { if (!r.url().startsWith("file:") && !r.url().startsWith("data:")) requests.push(r.url()); });
    const t0 = Date.now();
    await page.goto("file://" + path.resolve(p.file));
    await page.waitForFunction(() => document.body.dataset.rendered === "1" || document.body.dataset.error, null, { timeout: 60000 });
    const loadMs = Date.now() - t0;
    const paintMs = await page.evaluate(() => window.isolateReport.firstPaintMs);
    check(!(await page.evaluate(() => document.body.dataset.error)), `${where}: the page reported an error: ${await page.evaluate(() => document.body.dataset.error)}`);
    check(errors.length === 0, `${where}: errors in the console: ${errors.join(" | ")}`);
    check(requests.length === 0, `${where}: the page fetched ${requests.join(", ")}`);
    if (p.max_load_ms) check(loadMs <= p.max_load_ms, `${where}: load and first paint took ${loadMs} ms (limit ${p.max_load_ms} ms)`);
    console.log(`${where}: loaded and drawn in ${loadMs} ms (script ${paintMs.toFixed(0)} ms)`);

    // What is at the top: the badge, then the findings, before the timeline.
    const top = await page.evaluate(() => {
      const sec = document.querySelector("section");
      const box = (e) => (e ? e.getBoundingClientRect().toJSON() : null);
      const vis = (e) => !!e && e.getBoundingClientRect().height > 0 && getComputedStyle(e).visibility !== "hidden";
      const badge = sec.querySelector(".badge"), f = sec.querySelector(".finding"), clean = sec.querySelector(".clean");
      return {
        badge: badge && vis(badge) ? badge.textContent : null, badgeBox: box(badge),
        findings: [...sec.querySelectorAll(".finding")].map((e) => e.textContent),
        findingBox: box(f), clean: clean && vis(clean) ? clean.textContent : null,
        chartBox: box(sec.querySelector(".chart")),
        text: document.body.innerText,
      };
    });
    if (p.badge) {
      check(top.badge && top.badge.includes(p.badge), `${where}: badge "${p.badge}" not shown (got ${JSON.stringify(top.badge)})`);
      check(top.badgeBox && top.badgeBox.bottom <= size.height, `${where}: the badge is not on the first screen`);
    } else {
      check(!top.badge, `${where}: unexpected badge ${JSON.stringify(top.badge)}`);
    }
    for (const f of p.findings || []) {
      check(top.findings.some((t) => t.includes(f)), `${where}: finding "${f}" not shown (got ${JSON.stringify(top.findings)})`);
    }
    if (p.findings && p.findings.length) {
      check(top.findingBox && top.findingBox.top < size.height, `${where}: the first finding is not on the first screen`);
      check(top.findingBox.top < top.chartBox.top, `${where}: the findings are not above the timeline`);
    }
    if (p.clean) check(top.clean !== null, `${where}: the all-clear is not shown`);
    // Where in the code, first thing in each finding box, on the first screen.
    for (const want of p.places || []) {
      const at = await page.evaluate((want) => {
        const e = [...document.querySelectorAll(".finding .place")].find((x) => x.textContent === want);
        return e ? e.getBoundingClientRect().toJSON() : null;
      }, want);
      check(at !== null, `${where}: no finding box names ${JSON.stringify(want)} on a line of its own`);
      if (at) {
        check(at.bottom <= size.height, `${where}: ${JSON.stringify(want)} is below the first screen (${at.bottom} > ${size.height})`);
        check(at.bottom <= top.chartBox.top, `${where}: ${JSON.stringify(want)} is not above the timeline`);
      }
    }
    // No raw JSON, no internal words.
    check(!/\{"|":\s*[\[{"0-9]/.test(top.text), `${where}: raw JSON on the page`);
    for (const w of ["columns of", "bucket", "marker(s)", "seq ", "poison_violation", "stale_launch", "invalid_free", "true_alias", "null", "undefined", "NaN"]) {
      check(!top.text.includes(w), `${where}: internal word "${w}" on the page`);
    }

    // The timeline: labels fit; the view starts where memory activity does.
    await page.locator("canvas.main").first().scrollIntoViewIfNeeded();
    await labelsFit(page, `${where}, first view`);
    const v0 = await view(page);
    // The first draw belongs to the page's load (timed above; the browser's first page is cold:
    // 495 ms, a 124 ms first draw, in one run under load). The limit below is for the redraws
    // that follow the pointer.
    const firstDraw = await page.evaluate(() => {
      const s = window.isolateReport.charts[0].state;
      const d = s.maxDrawMs || 0;
      s.maxDrawMs = 0;
      return d;
    });
    if (p.trimmed) {
      check(v0.from_ns > 0 || v0.to_ns < v0.span_ns, `${where}: the first view is the whole run (${JSON.stringify(v0)})`);
      check(top.text.includes("Left out of view") && top.text.includes("Show the whole run"), `${where}: no word of what is left out, or no way to see it`);
    } else {
      check(v0.from_ns === 0 && v0.to_ns === v0.span_ns, `${where}: the first view is not the whole run: ${JSON.stringify(v0)}`);
    }
    if (p.markers) {
      const m = await labels(page);
      check(m.labels.some((l) => l.axis === "marker"), `${where}: no marker is labelled`);
    }
    if (p.regions) {
      const m = await labels(page);
      check(m.labels.some((l) => l.axis === "region"), `${where}: no region is labelled`);
    }
    if (p.steps) {
      const st = await page.evaluate(() => {
        const d = JSON.parse(document.getElementById("isolate-data").textContent).traces[0];
        const line = document.querySelector(".chart .steps");
        return { n: d.timeline.regions.length, regions: d.timeline.regions, line: line ? line.textContent : null,
          legend: document.querySelector(".legend").textContent };
      });
      check(st.n === p.steps, `${where}: ${st.n} steps drawn, not ${p.steps}`);
      check(st.line && st.line.includes(`the ${p.steps} iterations of the loop at`) && st.line.includes("found from the call stacks"), `${where}: no line says where the steps come from: ${JSON.stringify(st.line)}`);
      check(st.legend.includes("steps (from the call stacks)"), `${where}: the legend does not name the steps`);
      const m = await labels(page);
      check(m.labels.some((l) => l.axis === "region" && l.text === "step 1"), `${where}: step 1 is not labelled above the plot`);
      check(st.regions.every((r, k) => r.label === `step ${k + 1}` && r.to_ns >= r.from_ns && (k === 0 || r.from_ns > st.regions[k - 1].from_ns)), `${where}: the steps are not step 1, step 2, … in order: ${JSON.stringify(st.regions.map((r) => r.label))}`);
      if (p.zoom_to_steps) {
        const first = st.regions[0].from_ns, last = st.regions[st.regions.length - 1].to_ns;
        check(v0.from_ns <= first && v0.to_ns >= last, `${where}: the first view ${JSON.stringify(v0)} does not hold every step (${first}..${last})`);
        check((last - first) >= 0.8 * (v0.to_ns - v0.from_ns), `${where}: the steps take less than 80% of the first view (${first}..${last} in ${JSON.stringify(v0)}): the activity is squeezed`);
        check(v0.from_ns >= 0.9 * first, `${where}: the first view starts at ${v0.from_ns}, before 90% of the start-up (${first})`);
      }
    }
    if (p.sites) {
      const rows = () => page.evaluate(() => [...document.querySelectorAll(".sitetable tr.site")].map((r) => ({ bytes: +r.dataset.bytes, allocations: +r.dataset.allocations, place: r.firstChild.textContent })));
      const r0 = await rows();
      check(r0.length >= 2, `${where}: the site table has ${r0.length} rows`);
      check(r0.every((r, k) => k === 0 || r0[k - 1].bytes >= r.bytes), `${where}: the site table is not sorted by bytes: ${JSON.stringify(r0.map((r) => r.bytes))}`);
      for (const want of p.sites.first || []) check(r0[0].place === want, `${where}: the largest site is ${JSON.stringify(r0[0].place)}, not ${JSON.stringify(want)}`);
      await page.locator(".sitetable th", { hasText: "allocations" }).first().click();
      const r1 = await rows();
      check(r1.every((r, k) => k === 0 || r1[k - 1].allocations >= r.allocations), `${where}: a click on "allocations" did not sort by allocations: ${JSON.stringify(r1.map((r) => r.allocations))}`);
      check(r1.length === r0.length, `${where}: sorting lost rows`);
      await page.locator(".sitetable th", { hasText: "bytes allocated" }).first().click();
      await page.locator(".sitetable tr.site").first().click();
      const panel = await page.evaluate(() => { const e = document.querySelector(".sitestack"); return e.style.display === "block" ? e.textContent : ""; });
      check(panel.startsWith(r0[0].place) && panel.split("\n").length >= 2, `${where}: a click on the first site does not show its stack: ${JSON.stringify(panel)}`);
      const ice = await page.evaluate(() => [...document.querySelectorAll(".icicle .fr")].map((f) => f.textContent));
      check(ice.length >= 3 && ice[0].startsWith("all device memory"), `${where}: the icicle draws ${ice.length} frames: ${JSON.stringify(ice.slice(0, 4))}`);
      for (const want of p.sites.frames || []) check(ice.some((t) => t.startsWith(want)), `${where}: the icicle has no frame ${JSON.stringify(want)}: ${JSON.stringify(ice)}`);
      await page.locator(".icicle .fr").nth(1).click();
      const zoomed = await page.evaluate(() => document.querySelector(".sitebar .muted").textContent);
      check(zoomed.includes("zoomed into"), `${where}: a click on a frame did not zoom into it: ${JSON.stringify(zoomed)}`);
    }
    if (shots && p.shot && (size.width === SIZES[0].width || allSizes)) {
      await page.evaluate(() => window.scrollTo(0, 0));
      await frames(page);
      const suffix = size.width === SIZES[0].width ? "" : `-${size.width}`;
      await page.screenshot({ path: path.join(shots, `report-${p.shot}${suffix}.png`) });
    }

    // Zoom with the wheel, at the middle of the plot.
    await page.locator(".chart").first().scrollIntoViewIfNeeded();
    await frames(page);
    const cbox = await page.locator("canvas.main").first().boundingBox();
    const xs = await labels(page);
    const xLabels0 = xs.labels.filter((l) => l.axis === "x").map((l) => l.text).join(",");
    await page.mouse.move(cbox.x + cbox.width * (p.zoom_at || 0.6), cbox.y + cbox.height * 0.5);
    await page.mouse.wheel(0, -400);
    await frames(page);
    let v1 = await view(page);
    check(v1.to_ns - v1.from_ns < 0.7 * (v0.to_ns - v0.from_ns), `${where}: the wheel did not zoom in: ${JSON.stringify(v0)} -> ${JSON.stringify(v1)}`);
    check(v1.from_ns >= v0.from_ns && v1.to_ns <= v0.to_ns, `${where}: zooming in left the view`);
    const after = await labelsFit(page, `${where}, after the wheel`);
    check(after.filter((l) => l.axis === "x").map((l) => l.text).join(",") !== xLabels0, `${where}: the time labels did not change with the zoom`);
    if (shots && size.width === SIZES[0].width && p.shot_zoomed) {
      await page.mouse.wheel(0, -500);
      await frames(page);
      await labelsFit(page, `${where}, zoomed further`);
      await page.mouse.move(cbox.x + cbox.width * (p.zoom_at || 0.6) + 3, cbox.y + cbox.height * 0.75);
      await frames(page);
      await page.locator(".chart").first().screenshot({ path: path.join(shots, `report-${p.shot_zoomed}.png`) });
      v1 = await view(page);
    }
    // Hover shows what is under the pointer.
    await page.mouse.move(cbox.x + cbox.width * 0.5, cbox.y + cbox.height * 0.8);
    await frames(page);
    const tipText = await page.evaluate(() => { const t = document.querySelector(".tip"); return t.style.display === "block" ? t.textContent : ""; });
    check(tipText.includes("device memory in use"), `${where}: hovering shows no tooltip (${JSON.stringify(tipText)})`);

    // A click on an allocation's band shows where it was allocated and freed.
    if (p.stacks) {
      await page.mouse.click(cbox.x + cbox.width * 0.5, cbox.y + cbox.height - 30);
      await frames(page);
      const panel = await page.evaluate(() => document.querySelector(".stackpanel").textContent);
      for (const want of p.stacks) check(panel.includes(want), `${where}: clicking the band does not show ${JSON.stringify(want)}: ${JSON.stringify(panel)}`);
    } else if (!p.clean) {
      const panel = await page.evaluate(() => document.querySelector(".stackpanel").textContent);
      check(panel.length > 0 && !panel.includes("undefined"), `${where}: the call-stack line is empty or broken: ${JSON.stringify(panel)}`);
    }

    // Pan by dragging.
    await page.mouse.move(cbox.x + cbox.width * 0.5, cbox.y + cbox.height * 0.5);
    await page.mouse.down();
    await page.mouse.move(cbox.x + cbox.width * 0.7, cbox.y + cbox.height * 0.5, { steps: 4 });
    await page.mouse.up();
    await frames(page);
    const v2 = await view(page);
    check(v2.from_ns < v1.from_ns && Math.abs((v2.to_ns - v2.from_ns) - (v1.to_ns - v1.from_ns)) < 1e-6 * v1.span_ns + 1,
      `${where}: dragging right did not move the view earlier: ${JSON.stringify(v1)} -> ${JSON.stringify(v2)}`);

    // Keys: + zooms in, → pans later, - zooms out, 0 resets.
    await page.locator(".chart").first().focus();
    await page.keyboard.press("+");
    await frames(page);
    const v3 = await view(page);
    check(v3.to_ns - v3.from_ns < v2.to_ns - v2.from_ns, `${where}: + did not zoom in`);
    await page.keyboard.press("ArrowRight");
    await frames(page);
    const v4 = await view(page);
    check(v4.from_ns > v3.from_ns || v4.to_ns >= v4.span_ns, `${where}: → did not pan`);
    await page.keyboard.press("-");
    await frames(page);
    const v5 = await view(page);
    check(v5.to_ns - v5.from_ns > v4.to_ns - v4.from_ns, `${where}: - did not zoom out`);
    await labelsFit(page, `${where}, after the keys`);
    // Labels stay inside wherever the ticks fall: a few small pans, each checked.
    for (let k = 0; k < 6; k++) {
      await page.mouse.wheel(37 + 11 * k, 0);
      await frames(page);
      await labelsFit(page, `${where}, panned ${k + 1} times`);
    }
    await page.keyboard.press("0");
    await frames(page);
    const v6 = await view(page);
    check(v6.from_ns === v0.from_ns && v6.to_ns === v0.to_ns, `${where}: 0 did not reset the view: ${JSON.stringify(v6)}`);
    if (p.trimmed) {
      await page.getByText("Show the whole run").first().click();
      await frames(page);
      const v7 = await view(page);
      check(v7.from_ns === 0 && v7.to_ns === v7.span_ns, `${where}: "Show the whole run" did not show it: ${JSON.stringify(v7)}`);
      await labelsFit(page, `${where}, the whole run`);
    }
    // Every redraw (first view, zooms, pans) was quick enough to follow the pointer.
    const maxDraw = await page.evaluate(() => window.isolateReport.charts[0].state.maxDrawMs);
    check(maxDraw < 100, `${where}: a redraw took ${maxDraw.toFixed(1)} ms (limit 100 ms)`);
    console.log(`${where}: first draw ${firstDraw.toFixed(1)} ms, slowest redraw ${maxDraw.toFixed(1)} ms`);
    await page.close();
    pageNo++;
  }
}
await browser.close();
fs.rmSync(profile, { recursive: true, force: true });

if (failures.length) {
  console.log(`\n${failures.length} of ${checks} checks failed:`);
  for (const f of failures) console.log("  - " + f);
  process.exit(1);
}
console.log(`all ${checks} checks passed on ${pageNo} page loads`);
