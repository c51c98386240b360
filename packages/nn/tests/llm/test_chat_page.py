"""The chat page in a real browser: Debian's headless chromium driven by playwright (its Python package, never
`playwright install`), against a server of the tiny random model whose forward passes are paced so that a reply
streams for a few seconds. It sends a prompt, sees the reply stream in, stops a generation (the server stops too),
starts a new chat, checks the markdown renderer against hostile text and the layout at a phone's width, and saves
screenshots to $BROWSER_ARTIFACTS (the `browser` nox session keeps them) or the test's temporary folder.

Marked `browser`: runs only when selected (`pytest -m browser`, `nox -s browser`); needs `apt-get install chromium`
and `pip install playwright`, and skips saying so without them.
"""
from __future__ import annotations
import os
import pathlib
import shutil
import threading
import time
from typing import Any, Iterator
import pytest
from ember.nn.gguf import GGUFFile
from ember.nn.llm.model import Llama
from ember.nn.llm.server import LLMService, make_server
from ember.nn.llm.tokenizer import BPETokenizer

pytestmark = pytest.mark.browser
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]
STEP_S = 0.08  # each forward pass waits this long first: about 12 tokens/s, slow enough to watch and to stop
TIMEOUT_MS = 60_000

@pytest.fixture(autouse=True)
def only_when_selected(request: pytest.FixtureRequest) -> None:
  if "browser" not in (request.config.option.markexpr or ""):
    pytest.skip("browser test: select it with `pytest -m browser` (the `browser` nox session)")

class PacedLock:
  """The model lock, entered only after STEP_S: paces every forward pass (and counts them)."""
  def __init__(self) -> None:
    self.lock, self.forwards = threading.Lock(), 0
  def __enter__(self) -> None:
    time.sleep(STEP_S)
    self.lock.acquire()
    self.forwards += 1
  def __exit__(self, *exc: Any) -> None: self.lock.release()

@pytest.fixture(scope="module")
def page_server(tiny_llama_module) -> Iterator[tuple[str, LLMService, PacedLock]]:
  path, _, _ = tiny_llama_module
  f = GGUFFile(path)
  service = LLMService(Llama.from_gguf(f, max_context=64), BPETokenizer.from_gguf_metadata(f.metadata),
                       f.metadata["tokenizer.chat_template"], "tiny", slots=1)
  service.lock = paced = PacedLock()  # type: ignore[assignment]
  server = make_server(service, port=0)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  try: yield f"http://127.0.0.1:{server.server_address[1]}", service, paced
  finally:
    server.shutdown()
    server.server_close()

@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
  sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (its driver is in the wheel; "
                                 "the browser is Debian's chromium, not `playwright install`)")
  if shutil.which(CHROMIUM) is None: pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium chromium-driver")
  with sync_api.sync_playwright() as playwright:
    browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
    try: yield browser
    finally: browser.close()

@pytest.fixture
def artifacts(tmp_path: pathlib.Path) -> pathlib.Path:
  folder = pathlib.Path(os.environ.get("BROWSER_ARTIFACTS") or tmp_path)
  folder.mkdir(parents=True, exist_ok=True)
  return folder

def open_page(browser: Any, url: str, width: int, height: int) -> tuple[Any, list[str]]:
  """A new page at `url` of the given viewport, and the list its console errors (CSP violations among them) go to."""
  page = browser.new_page(viewport={"width": width, "height": height})
  page.set_default_timeout(TIMEOUT_MS)
  errors: list[str] = []
  page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
  page.on("pageerror", lambda error: errors.append(str(error)))
  page.goto(url + "/")
  page.wait_for_function("() => document.getElementById('model').textContent === 'tiny'")
  return page, errors

def wait_free(service: LLMService) -> None:
  """Until the server has given the request slot back: its generation ended or was abandoned."""
  deadline = time.monotonic() + 60
  while service.slots.qsize() < 1:
    assert time.monotonic() < deadline, "the server still generates 60 s after the page stopped"
    time.sleep(0.02)

def streamed_tokens(page: Any) -> int:
  """The token count the page shows next to tokens/s (0 before the first token)."""
  return int(page.evaluate("() => document.getElementById('speed').textContent.split(' ')[0] || '0'"))

def test_chat_streams_stops_and_starts_over(browser, page_server, artifacts):
  url, service, paced = page_server
  page, errors = open_page(browser, url, 1100, 760)
  bodies: list[Any] = []
  page.on("request", lambda r: bodies.append(r.post_data_json) if r.url.endswith("/chat/completions") else None)
  page.click("#settings summary")
  # a hot, seeded sampler: the random model's greedy reply is blank lines, this one is visible text
  for field, value in (("#temperature", "2"), ("#top-p", "1"), ("#seed", "1"), ("#max-tokens", "")):
    page.fill(field, value)
  page.fill("#prompt", "the tin")
  page.keyboard.press("Enter")
  reply = page.locator(".message.assistant").last
  # the count grows while the request is still open: tokens arrive one by one, not as one finished reply
  page.wait_for_function("() => parseInt(document.getElementById('speed').textContent) >= 3")
  seen = streamed_tokens(page)
  page.wait_for_function(f"() => parseInt(document.getElementById('speed').textContent) > {seen}")
  assert page.locator("#stop").is_visible() and "streaming" in (reply.get_attribute("class") or "")
  assert "tokens/s" in page.locator("#speed").inner_text()
  page.screenshot(path=str(artifacts / "1-streaming.png"))
  forwards_before_stop = paced.forwards
  page.click("#stop")
  page.wait_for_selector(".message.assistant .note:text('stopped')")
  wait_free(service)
  # the stop closed the connection: the server generated at most a few more tokens, not the whole context
  assert paced.forwards - forwards_before_stop <= 3
  assert page.locator("#send").is_visible() and not page.locator("#stop").is_visible()
  page.screenshot(path=str(artifacts / "2-stopped.png"))

  stopped_reply = page.evaluate("() => state.messages[1].content")
  assert stopped_reply and reply.text_content() != ""

  # the next message carries the conversation so far, the stopped reply included, and runs to its end
  page.fill("#max-tokens", "4")
  page.fill("#prompt", "and then?")
  page.keyboard.press("Enter")
  page.wait_for_function("() => document.querySelectorAll('.message.assistant').length === 2 && "
                         "!document.querySelector('.message.assistant:last-child').classList.contains('streaming')")
  assert page.locator(".message.user").count() == 2 and page.locator(".note.error").count() == 0
  assert bodies[-1]["messages"] == [{"role": "user", "content": "the tin"},
                                    {"role": "assistant", "content": stopped_reply},
                                    {"role": "user", "content": "and then?"}]
  assert bodies[-1]["max_tokens"] == 4 and bodies[-1]["temperature"] == 2 and bodies[-1]["seed"] == 1
  assert bodies[-1]["stream"] is True and bodies[-1]["model"] == "tiny"
  assert 1 <= streamed_tokens(page) <= 4
  page.screenshot(path=str(artifacts / "3-second-reply.png"))

  page.click("#new-chat")
  assert page.locator(".message").count() == 0 and page.locator("#empty").is_visible()
  assert page.evaluate("() => state.messages.length") == 0
  page.screenshot(path=str(artifacts / "4-new-chat.png"))
  assert errors == []

MARKDOWN_SAMPLE = """## A heading
Some **bold**, *italic* and `inline <code>` text, a [link](https://example.org/a?b=1&c=2).

- first item
- second item

```python
def f(x):
    return "<b>not bold</b>" if x < 2 else x
```
> a quotation"""

HOSTILE = [
  '<img src=x onerror="window.pwned=1">', "<script>window.pwned=1</script>", "[x](javascript:window.pwned=1)",
  '[x](https://a.b/"onmouseover="window.pwned=1)', "`<img src=x onerror=window.pwned=1>`",
  "```\n</code></pre><img src=x onerror=window.pwned=1>\n```", "**<svg onload=window.pwned=1>**",
  '<a href="javascript:window.pwned=1">x</a>', "\u0000<b>\u0000",
]

def test_markdown_is_rendered_and_html_in_replies_is_text(browser, page_server, artifacts):
  url, *_ = page_server
  page, errors = open_page(browser, url, 1100, 760)
  # everything the renderer makes is one of its own tags, and every attribute is one it sets
  check = """(source) => {
    const box = document.createElement('div');
    box.innerHTML = renderMarkdown(source);
    const tags = new Set(['P', 'BR', 'STRONG', 'EM', 'DEL', 'CODE', 'PRE', 'A', 'UL', 'OL', 'LI', 'H3', 'H4', 'H5',
                          'H6', 'BLOCKQUOTE', 'HR']);
    const bad = [];
    for (const el of box.querySelectorAll('*')) {
      if (!tags.has(el.tagName)) bad.push(el.tagName);
      for (const attr of el.attributes) {
        const safeHref = attr.name === 'href' && /^https?:\\/\\//.test(attr.value);
        const ok = (attr.name === 'class' && el.tagName === 'CODE') ||
          (el.tagName === 'A' && (attr.name === 'rel' || attr.name === 'target' || safeHref));
        if (!ok) bad.push(`${el.tagName} ${attr.name}=${attr.value}`);
      }
    }
    return {bad, text: box.textContent};
  }"""
  for source in HOSTILE:
    result = page.evaluate(check, source)
    assert result["bad"] == [], (source, result)
  assert page.evaluate("() => window.pwned") is None
  rendered = page.evaluate(check, MARKDOWN_SAMPLE)
  assert rendered["bad"] == [] and 'return "<b>not bold</b>" if x < 2 else x' in rendered["text"]
  assert "inline <code>" in rendered["text"]
  structure = page.evaluate("(s) => { const d = document.createElement('div'); d.innerHTML = renderMarkdown(s); "
                            "return [...d.children].map((e) => e.tagName); }", MARKDOWN_SAMPLE)
  assert structure == ["H4", "P", "UL", "PRE", "BLOCKQUOTE"]
  page.evaluate("(s) => { addBubble('user', 'Show me some markdown'); addBubble('assistant', s); }", MARKDOWN_SAMPLE)
  page.screenshot(path=str(artifacts / "5-markdown.png"))
  assert errors == []

def test_phone_width_layout(browser, page_server, artifacts):
  url, *_ = page_server
  page, errors = open_page(browser, url, 390, 844)
  page.click("#settings summary")
  page.evaluate("(s) => { addBubble('user', 'A question typed on a phone'); addBubble('assistant', s); }",
                MARKDOWN_SAMPLE)
  # nothing but code blocks scrolls sideways; the controls stay on screen
  assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
  for selector in ("#prompt", "#send", "#new-chat", "#temperature", "#seed"):
    box = page.locator(selector).bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, selector
  page.screenshot(path=str(artifacts / "6-phone.png"))
  assert errors == []
