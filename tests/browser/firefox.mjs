// The console in Firefox (the OS's firefox-esr, over WebDriver BiDi): node firefox.mjs BASE_URL FIREFOX
// Signs in, chats, opens what the reply recalled, sweeps, sees the new memory, deletes it (two presses,
// the second from the keyboard), and prints one JSON line: what it saw, every request it made and every
// error the page logged. tests/test_console_firefox.py runs it against the local stack and judges it.
import puppeteer from "puppeteer-core";

const [base, executablePath] = process.argv.slice(2);
const browser = await puppeteer.launch({ browser: "firefox", executablePath, headless: true });
const seen = { requests: [], errors: [] };
try {
  const page = await browser.newPage();
  page.setDefaultTimeout(15000);
  page.on("request", (request) => seen.requests.push(request.url()));
  page.on("console", (message) => { if (message.type() === "error") seen.errors.push(message.text()); });
  page.on("pageerror", (error) => seen.errors.push(String(error)));
  const text = (selector) => page.$eval(selector, (node) => node.textContent);

  await page.goto(`${base}/console/`);
  await page.waitForSelector("#user");
  await page.type("#user", "fiona");
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => document.querySelector("#me").textContent === "fiona");
  await page.waitForSelector("#memory-groups li.memory");
  seen.memoriesBefore = await text("#memory-groups");

  await page.click("#new-session button");
  await page.waitForFunction(() => !document.querySelector("#message").disabled);
  await page.type("#message", "I keep bees by the river");
  await page.keyboard.press("Enter");
  await page.waitForSelector("#messages li.assistant");
  await page.click("#messages li.assistant summary");
  seen.reply = await text("#messages li.assistant p");
  seen.recalled = await text("#messages li.assistant .recalled");

  await page.click("#sweep");
  await page.waitForFunction(() => document.querySelector("#sweep-result").textContent.startsWith("Claimed"));
  seen.sweep = await text("#sweep-result");
  await page.waitForFunction(() => document.querySelector("#memory-groups").textContent.includes("Keeps bees"));
  seen.memoriesAfter = await text("#memory-groups");
  seen.dreaming = await text("#dream-sessions");

  await page.evaluate(() => [...document.querySelectorAll("#memory-groups li.memory")]
    .find((item) => item.textContent.includes("Keeps bees")).setAttribute("data-target", ""));
  const remove = "#memory-groups li.memory[data-target] button.danger";
  await page.click(remove);
  await page.waitForFunction((s) => document.querySelector(s).textContent === "Confirm delete", {}, remove);
  seen.focusedAfterFirstPress = await page.evaluate(() => document.activeElement.textContent);
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => document.querySelector("#status").textContent === "Deleted.");
  await page.waitForFunction(() => !document.querySelector("#memory-groups").textContent.includes("Keeps bees"));
  seen.memoriesDeleted = await text("#memory-groups");
  seen.version = await browser.version();
} catch (error) {
  seen.failure = String(error);
} finally {
  await browser.close();
}
console.log(JSON.stringify(seen));
