"""Issue 18's web items in a real browser (Debian's Chromium via Playwright), at 390 and 1920 px.

Pasted config everywhere; whole-number fields; "how to make it fit"; the narrow layout; one
planner search at a time with progress and errors by the button; reload/share keeps a pasted
config; bad link values and empty fields are reported; error texts in the page's words.
Expected figures come from the library in the test.
"""

from __future__ import annotations

import json

import pytest

from trainledger.estimate import estimate
from trainledger.load.hf import load_hf_config
from trainledger.load.plan import PlanInputs, build_plan

pytest.importorskip("playwright")
from playwright.sync_api import expect  # noqa: E402

import re  # noqa: E402

VERDICT = re.compile("true|false")
ART = {}


@pytest.fixture(autouse=True)
def _artifacts(artifacts):
    ART["dir"] = artifacts


def artifacts_dir():
    return ART["dir"]


def wait_verdict(page, fits: bool | None = None, title: str | None = None) -> None:
    v = page.locator("#verdict")
    expect(v).to_have_attribute("data-fits", VERDICT if fits is None else str(fits).lower())
    if title:
        expect(v).to_contain_text(title)
    expect(page.locator("#results")).to_have_attribute("aria-busy", "false")


def no_csp_violations(page) -> None:
    assert not [p for p in page.problems if "Content Security Policy" in p], page.problems

WIDTHS = (390, 1920)


def lib(**kw) -> dict:
    return estimate(build_plan(PlanInputs(**kw))).to_dict()


def paste(page, preset: str) -> None:
    page.click("#paste summary")
    page.fill("#f-config_json", json.dumps(load_hf_config(preset)))


@pytest.mark.parametrize("width", WIDTHS)
def test_layout_fits_the_screen_and_verdict_is_on_the_first_screen(page, server_url, width):
    page.set_viewport_size({"width": width, "height": 844 if width < 500 else 1080})
    page.goto(server_url + "/")
    wait_verdict(page)
    scroll_w = page.evaluate("document.documentElement.scrollWidth")
    assert scroll_w <= width, f"page is {scroll_w} px wide at {width} px"
    top = page.locator("#verdict").bounding_box()["y"]
    assert top < 300, f"the verdict starts {top:.0f} px down"
    page.screenshot(path=str(artifacts_dir() / f"20-first-visit-{width}px.png"), full_page=False)
    no_csp_violations(page)


@pytest.mark.parametrize("width", WIDTHS)
def test_first_visit_that_does_not_fit_shows_how_to_make_it_fit(page, server_url, width):
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(server_url + "/")
    want = lib()["memory"]
    assert not want["fits"] and want["suggestions"]
    wait_verdict(page, False)
    fixes = page.locator("#fixes")
    expect(fixes).to_be_visible()
    expect(fixes).to_contain_text("How to make it fit")
    expect(fixes.locator("li")).to_have_count(len(want["suggestions"]))
    expect(fixes.locator("li").first).to_contain_text(f"{want['suggestions'][0]['device_total_bytes'] / 2**30:.2f} GiB")
    page.fill("#f-gpus", "8")
    page.fill("#f-zero", "3") if page.locator("#f-zero").evaluate("e => e.tagName") == "INPUT" else \
        page.select_option("#f-zero", "3")
    wait_verdict(page, lib(gpus=8, zero=3)["memory"]["fits"])
    expect(fixes).to_be_hidden()


@pytest.mark.parametrize("width", WIDTHS)
def test_whole_number_fields(page, server_url, width):
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{server_url}/?model=qwen2.5-0.5b")
    wait_verdict(page)
    page.fill("#f-seq_len", "1e4")
    want = lib(model="qwen2.5-0.5b", seq_len=10_000)["memory"]
    wait_verdict(page, want["fits"])
    expect(page.locator("#summary")).to_contain_text("seq 10,000")
    page.fill("#f-seq_len", "1.5")
    expect(page.locator("#err-seq_len")).to_contain_text("must be a whole number")
    expect(page.locator("#verdict")).to_have_text("Fix the highlighted input")
    page.fill("#f-seq_len", "")
    expect(page.locator("#err-seq_len")).to_contain_text("is required")


def test_pasted_config_drives_planner_export_and_commands(page, server_url, tmp_path):
    page.goto(f"{server_url}/?gpu=l40s&tokens=100000000")
    wait_verdict(page)
    paste(page, "qwen2.5-0.5b")
    want = lib(model="qwen2.5-0.5b", gpu="l40s", tokens=1e8)["memory"]
    wait_verdict(page, want["fits"], "pasted config.json")
    expect(page.locator("#view-sheet")).to_contain_text("trainledger verify memory --model config.json")
    expect(page.locator("#view-sheet")).not_to_contain_text("llama-3.1-8b")
    page.select_option("#export-format", "torchrun")
    with page.expect_download() as dl:
        page.click("#dl-export")
    text = open(dl.value.path(), encoding="utf-8").read()
    assert "pasted config.json" in text and "llama-3.1-8b" not in text
    page.fill("#p-max_gpus", "2")
    page.check("#plan-gpus input[value='l40s']")
    with page.expect_response("**/api/plan") as resp:
        page.click("#run-plan")
    body = resp.value.json()
    assert body["result"]["job"]["model"] == "config.json"
    assert body["result"]["plans"], "the pasted 0.5B model fits l40s"
    no_csp_violations(page)


def test_reload_and_shared_link_keep_a_pasted_config(page, server_url, browser_context):
    page.goto(f"{server_url}/?gpu=l40s")
    wait_verdict(page)
    paste(page, "qwen2.5-0.5b")
    wait_verdict(page, title="pasted config.json")
    assert "#config=" in page.url and "config_json" not in page.url.split("#")[0]
    url = page.url
    page.reload()
    wait_verdict(page, title="pasted config.json")
    assert json.loads(page.input_value("#f-config_json")) == load_hf_config("qwen2.5-0.5b")
    other = browser_context.new_page()
    other.goto(url)
    wait_verdict(other, title="pasted config.json")
    other.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_bad_link_values_are_reported_not_replaced_silently(page, server_url, width):
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{server_url}/?model=qwen2.5-0.5b&seq_len=abc&precision=fp64&colour=red")
    expect(page.locator("#verdict")).to_have_text("Fix the highlighted input")  # no default stands in
    expect(page.locator("#err-seq_len")).to_contain_text("is not a number")
    expect(page.locator("#err-precision")).to_contain_text('"fp64" is not one of the choices')
    expect(page.locator("#global-error")).to_contain_text('unknown setting "colour"')
    page.screenshot(path=str(artifacts_dir() / f"21-bad-link-{width}px.png"))


def test_error_texts_use_the_page_words(page, server_url):
    page.goto(f"{server_url}/?model=qwen2.5-0.5b&gpus=12")  # 12 GPUs: nodes of 8 do not divide them
    body = page.locator("body")
    expect(page.locator("#verdict")).to_have_text("Fix the highlighted input")
    expect(body).to_contain_text('"GPUs per node"')
    expect(body).not_to_contain_text("--gpus-per-node")
    page.fill("#f-model", "bad name!")
    expect(body).to_contain_text("not allowed")
    expect(body).not_to_contain_text("should match pattern")


@pytest.mark.parametrize("width", WIDTHS)
def test_planner_runs_one_search_at_a_time_and_reports_by_the_button(page, server_url, width):
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{server_url}/?model=qwen2.5-0.5b")
    wait_verdict(page)
    status = page.locator("#plan-status")
    page.click("#run-plan")  # rank by time without a token budget: no search, say why
    expect(status).to_contain_text("needs a token budget")
    page.fill("#f-tokens", "100000000")
    page.route("**/api/plan", lambda route: None)  # a search that never answers
    page.click("#run-plan")
    expect(page.locator("#run-plan")).to_have_text("Cancel search")
    expect(status).to_contain_text("searching")
    page.click("#run-plan")
    expect(status).to_have_text("search cancelled")
    expect(page.locator("#run-plan")).to_have_text("Run planner")
    page.unroute("**/api/plan")
    page.route("**/api/plan", lambda route: route.fulfill(
        status=503, content_type="application/json",
        body=json.dumps({"error": "the request took too long", "field": None})))
    page.click("#run-plan")
    expect(status).to_contain_text("search failed: the request took too long")
    assert status.bounding_box()["y"] - page.locator("#run-plan").bounding_box()["y"] < 200
    expect(page.locator("#plan-results table")).to_have_count(0)
