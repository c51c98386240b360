"""VIZ's page in a real browser: Debian's headless chromium driven by playwright (its Python package, never
`playwright install`). A Linear + SGD training step runs with VIZ=1 in a subprocess, which serves the page at exit;
the test clicks a kernel, steps through its rewrites and checks what the page shows (rule names and locations, node
counts, drawn nodes, a node's sources and consumers, the kernel's source) against the server's JSON API, then opens
the profiler timeline. Screenshots go to $BROWSER_ARTIFACTS (the `viz` nox session keeps them) or the test's
temporary folder.

Marked `browser`: runs only when selected (`pytest -m browser`, `nox -s viz`); needs `apt-get install chromium` and
`pip install playwright`, and skips saying so without them.
"""
from __future__ import annotations
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import urllib.request
from typing import Any, Iterator
import pytest

pytestmark = pytest.mark.browser
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]
TIMEOUT_MS = 60_000

# a Linear layer and one SGD step, in core's Tensor alone (the page test must not need ember-nn)
TRAIN_STEP = """
from ember import Tensor
Tensor.manual_seed(0)
x, y = Tensor.randn(16, 8), Tensor.randn(16, 4)
w, b = Tensor.randn(8, 4, requires_grad=True), Tensor.zeros(4, requires_grad=True)
loss = ((x @ w + b - y) ** 2).mean()
loss.backward()
for p in (w, b): p.assign((p - 0.1 * p.grad).detach())
Tensor.realize(loss, w, b)
print(loss.item())
"""

@pytest.fixture(autouse=True)
def only_when_selected(request: pytest.FixtureRequest) -> None:
  if "browser" not in (request.config.option.markexpr or ""):
    pytest.skip("browser test: select it with `pytest -m browser` (the `viz` nox session)")

@pytest.fixture(scope="module")
def viz_url() -> Iterator[str]:
  """The training step run with VIZ=1 (VIZ_PORT=0: any free port); its page, served at exit, until the test ends."""
  env = {**os.environ, "VIZ": "1", "VIZ_PORT": "0"}
  proc = subprocess.Popen([sys.executable, "-c", TRAIN_STEP], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  try:
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:
      lines.append(line)
      if (match := re.search(r"VIZ: serving (http://127\.0\.0\.1:\d+)", line)): break
    else: pytest.fail("the VIZ=1 program ended without serving its page:\n" + "".join(lines))
    yield match.group(1)
  finally:
    proc.terminate()
    proc.wait(timeout=60)

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

def api(url: str) -> Any:
  with urllib.request.urlopen(url) as r: return json.load(r)

def wait_step(page: Any, label: str) -> None:
  page.wait_for_function(f"() => document.getElementById('step-label').textContent.startsWith('{label}')")

def open_page(browser: Any, url: str) -> tuple[Any, list[str]]:
  page = browser.new_page(viewport={"width": 1500, "height": 900})
  page.set_default_timeout(TIMEOUT_MS)
  errors: list[str] = []
  page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
  page.on("pageerror", lambda error: errors.append(str(error)))
  page.goto(url + "/")
  page.wait_for_selector("#kernels .kernel")
  return page, errors

def test_kernel_rewrites_step_by_step(browser, viz_url, artifacts):
  trace = api(viz_url + "/api/trace")
  rules = trace["rules"]
  # the kernel with the longest pass: the matmul's or the gradient's index math
  passes = [(p["matches"], k, r) for k, kernel in enumerate(trace["kernels"]) if kernel["kind"] == "kernel"
            for r, p in enumerate(kernel["rewrites"])]
  _, k, r = max(passes)
  kernel = trace["kernels"][k]
  detail = api(viz_url + f"/api/rewrite?kernel={k}&rewrite={r}")
  steps = detail["steps"]
  assert len(steps) >= 3, "the training step's busiest pass has at least two rewrites"
  page, errors = open_page(browser, viz_url)
  assert page.locator("#kernels .kernel").count() == len(trace["kernels"])
  page.click(f"#kernels .kernel[data-index='{k}'] .head")
  page.click(f"#kernels .kernel[data-index='{k}'] .pass[data-index='{r}']")
  wait_step(page, f"step 1 / {len(steps) - 1}")
  assert page.inner_text("#pass-title") == f"{kernel['name']} / {kernel['rewrites'][r]['name']}"
  for i in range(1, len(steps)):
    if i > 1:
      page.click("#next")
      wait_step(page, f"step {i} /")
    rule = rules[steps[i]["rule"]]
    assert page.inner_text("#rule-name") == rule["name"] and page.inner_text("#rule-location") == rule["location"]
    assert page.inner_text("#nodes").startswith(f"{steps[i]['nodes']} nodes (was {steps[i - 1]['nodes']})")
    drawn = page.eval_on_selector_all("#graph .node", "ns => ns.map(n => Number(n.dataset.id))")
    assert len(drawn) == steps[i]["nodes"]  # every node of the step's graph is drawn
    assert page.eval_on_selector_all("#graph .node.replacement", "ns => ns.map(n => Number(n.dataset.id))") == \
      ([steps[i]["replacement"]] if steps[i]["replacement"] in drawn else [])
    following = steps[i + 1]["match"] if i + 1 < len(steps) else None  # what the next rule rewrites, outlined dashed
    assert page.eval_on_selector_all("#graph .node.matched", "ns => ns.map(n => Number(n.dataset.id))") == \
      ([following] if following in drawn else [])
    if i == 1: page.screenshot(path=str(artifacts / "viz-graph.png"))
  assert page.locator("#next").is_disabled()
  page.click("#prev")
  wait_step(page, f"step {len(steps) - 2} /")
  assert page.inner_text("#nodes").startswith(f"{steps[-2]['nodes']} nodes")
  # clicking a node highlights its sources and its consumers (from the node table of the step's graph)
  nodes, sink = detail["nodes"], steps[-2]["sink"]
  drawn = {int(x) for x in page.eval_on_selector_all("#graph .node", "ns => ns.map(n => n.dataset.id)")}
  target = min(i for i in drawn if i != sink and nodes[i]["src"] and any(i in nodes[j]["src"] for j in drawn))
  page.click("#fit")  # the whole graph in view: every node is on screen to click
  page.click(f"#graph .node[data-id='{target}']")
  users = {i for i in drawn if target in nodes[i]["src"]}
  assert {int(x) for x in page.eval_on_selector_all("#graph .node.src", "ns => ns.map(n => n.dataset.id)")} == \
    set(nodes[target]["src"])
  assert {int(x) for x in page.eval_on_selector_all("#graph .node.use", "ns => ns.map(n => n.dataset.id)")} == users
  # the code panels: the rendered source, the linear program, the AST
  page.click("#code-tabs button[data-code='source']")
  assert page.inner_text("#code").strip() == kernel["source"].strip() and kernel["name"] in kernel["source"]
  page.click("#code-tabs button[data-code='program']")
  assert page.inner_text("#code").strip() == kernel["program"].strip()
  page.click("#code-tabs button[data-code='info']")
  assert f"kernel {kernel['name']}" in page.inner_text("#code")
  page.screenshot(path=str(artifacts / "viz-program.png"))
  assert errors == []

def test_rules_table_and_timeline(browser, viz_url, artifacts):
  trace = api(viz_url + "/api/trace")
  page, errors = open_page(browser, viz_url)
  page.click("#tabs button[data-tab='rules']")
  tried = [r for r in trace["rules"] if r["tries"] > 0]
  assert page.locator("#rule-table tbody tr").count() == len(tried)
  top = max(tried, key=lambda r: r["seconds"])
  assert page.inner_text("#rule-table tbody tr:first-child td:first-child") == top["name"]
  page.click("#tabs button[data-tab='timeline']")
  spans = [e for e in trace["timeline"] if e["ph"] == "X"]
  kernel_names = {k["name"] for k in trace["kernels"] if k["kind"] == "kernel"}
  assert kernel_names <= {e["name"] for e in spans if e["cat"] == "kernel"}  # VIZ=1 profiles every kernel
  page.wait_for_selector("#timeline-svg .event")
  assert page.locator("#timeline-svg .event").count() == len(spans)
  page.screenshot(path=str(artifacts / "viz-timeline.png"))
  assert errors == []
