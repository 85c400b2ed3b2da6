// Opens a web UI as a new user would, in headless Chromium (playwright-core from npm, the
// system's chromium; neither is a test requirement), waits SECONDS, sends MESSAGE if given and
// takes a screenshot. Prints the API requests it saw by method and path, their statuses, the
// chat request's body and the last `timings` of its answer, as JSON (docs/server.md,
// "llama.cpp's web UI"). PROPS_404=openai|llama makes /props answer a 404 of that shape in the
// page, as a server without the route did.
//
//   npm install playwright-core
//   node scripts/webui_drive.js http://127.0.0.1:8080/ out.png 10 "Write a haiku about a lighthouse."
const { chromium } = require('playwright-core');
(async () => {
  const [url, out, secs = '15', message = ''] = process.argv.slice(2);
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: ['--no-sandbox'] });
  const page = await browser.newPage({ viewport: { width: 1100, height: 760 }, serviceWorkers: 'block' });
  const counts = {};
  const statuses = {};
  const bodies = [];
  page.on('request', (r) => {
    const u = new URL(r.url());
    if (r.method() === 'POST' && u.pathname.endsWith('/chat/completions')) bodies.push(r.postData());
    if (u.origin !== new URL(url).origin) return;
    if (/\.(js|css|svg|png|ico|webmanifest|json|woff2?)$/.test(u.pathname) && u.pathname !== '/openapi.json') return;
    const key = r.method() + ' ' + u.pathname;
    counts[key] = (counts[key] || 0) + 1;
  });
  page.on('response', (r) => {
    const u = new URL(r.url());
    const key = r.request().method() + ' ' + u.pathname + ' ' + r.status();
    statuses[key] = (statuses[key] || 0) + 1;
  });
  const logs = [];
  page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') logs.push(m.type() + ': ' + m.text().slice(0, 200)); });
  // PROPS_404=openai|llama: /props answers a 404 of that shape (the server before it had the route)
  const shape = process.env.PROPS_404;
  if (shape) {
    const body = shape === 'openai'
      ? { error: { message: 'no such route', type: 'not_found_error', param: null, code: null } }
      : { error: { code: 404, message: 'no such route: GET /props', type: 'not_found_error' } };
    await page.route(/\/props(\?|$)/, (r) => r.fulfill({ status: 404, contentType: 'application/json', body: JSON.stringify(body) }));
  }
  await page.goto(url, { waitUntil: 'load' });
  await page.waitForTimeout(Number(secs) * 1000);
  const result = { counts_before_send: { ...counts } };
  const box = page.locator('textarea, [contenteditable="true"]').first();
  result.composer_enabled = await box.isEnabled().catch(() => false);
  result.banner = await page.locator('text=Server unavailable').count();
  if (message) {
    let timings = null;
    page.on('response', async (r) => {
      if (r.url().endsWith('/v1/chat/completions') && r.request().method() === 'POST') {
        const text = await r.text().catch(() => '');
        for (const line of text.split('\n')) {
          if (!line.startsWith('data: ') || line.includes('[DONE]')) continue;
          try { const c = JSON.parse(line.slice(6)); if (c.timings) timings = c.timings; } catch (e) {}
        }
      }
    });
    await box.click();
    await page.keyboard.type(message);
    await page.keyboard.press('Enter');
    const t0 = Date.now();
    while (!timings && Date.now() - t0 < 120000) await page.waitForTimeout(250);
    await page.waitForTimeout(2000);
    result.timings = timings;
  }
  result.counts = counts;
  result.chat_bodies = bodies;
  result.statuses = statuses;
  result.console = logs.slice(0, 15);
  await page.screenshot({ path: out });
  console.log(JSON.stringify(result, null, 1));
  await browser.close();
})();
