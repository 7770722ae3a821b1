"""The page in a real browser (Debian's Chromium via Playwright) against a server started here.

Choose a preset, change the GPU and see the fit verdict flip; shared links restore the form; errors
show next to their field; run a plan search; download the report and a config; keyboard and labels.
Expected values are computed by calling the library in the test. Screenshots go to
``$TRAINLEDGER_ARTIFACTS`` (default ``tests/web/artifacts/``).
"""

from __future__ import annotations

import json
import re
from urllib.parse import parse_qs, urlparse

import pytest

from trainledger.estimate import estimate
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.units import GIB

pytest.importorskip("playwright")
from playwright.sync_api import expect  # noqa: E402

VERDICT = re.compile("true|false")


def lib(**kw) -> dict:
    return estimate(build_plan(PlanInputs(**kw))).to_dict()


ART = {}


@pytest.fixture(autouse=True)
def _artifacts(artifacts):
    ART["dir"] = artifacts


def artifacts_dir():
    return ART["dir"]


def shot(page, name: str) -> None:
    page.screenshot(path=str(artifacts_dir() / f"{name}.png"), full_page=False)


def wait_verdict(page, fits: bool | None = None, title: str | None = None) -> None:
    v = page.locator("#verdict")
    expect(v).to_have_attribute("data-fits", VERDICT if fits is None else str(fits).lower())
    if title:
        expect(v).to_contain_text(title)
    expect(page.locator("#results")).to_have_attribute("aria-busy", "false")


def no_csp_violations(page) -> None:
    assert not [p for p in page.problems if "Content Security Policy" in p], page.problems


def test_choose_preset_change_gpu_verdict_flips(page, server_url):
    page.goto(server_url + "/")
    wait_verdict(page)
    page.fill("#f-model", "llama-3.2-1b")
    page.fill("#f-gpus", "1")
    on_h100, on_4090 = (lib(model="llama-3.2-1b", gpu=g)["memory"] for g in ("h100-sxm", "rtx-4090"))
    assert on_h100["fits"] != on_4090["fits"], "the chosen job must fit one GPU and not the other"
    wait_verdict(page, on_h100["fits"], "llama-3.2-1b · full · 1× h100-sxm")
    expect(page.locator("#model-info")).to_contain_text("parameters")
    expect(page.locator("#summary")).to_contain_text(f"{on_h100['device_total_bytes'] / GIB:,.2f} GiB")
    shot(page, "01-preset-h100")
    page.select_option("#f-gpu", "rtx-4090")
    wait_verdict(page, on_4090["fits"], "1× rtx-4090")
    expect(page.locator("#verdict")).to_contain_text("FITS" if on_4090["fits"] else "DOES NOT FIT")
    expect(page.locator("#view-gpus svg")).to_have_count(1)
    q = parse_qs(urlparse(page.url).query)
    assert q["gpu"] == ["rtx-4090"] and q["model"] == ["llama-3.2-1b"]
    shot(page, "02-gpu-rtx4090-verdict-flipped")
    page.locator("#view-gpus").screenshot(path=str(artifacts_dir() / "03-candidate-gpus-chart.png"))
    for sid in ("memory", "seq", "mb", "time", "scaling"):
        expect(page.locator(f"#view-{sid} svg")).to_have_count(1)
    expect(page.locator("#view-sheet")).to_contain_text("trainledger verify memory --model llama-3.2-1b --gpu rtx-4090")
    expect(page.locator("#view-risks")).to_contain_text("Recompute the plan when")
    page.screenshot(path=str(artifacts_dir() / "10-full-page.png"), full_page=True)
    no_csp_violations(page)


def test_shared_link_restores_the_plan(page, server_url):
    url = f"{server_url}/?model=qwen2.5-0.5b&gpu=l40s&gpus=2&seq_len=2048&zero=1&method=full"
    page.goto(url)
    want = lib(model="qwen2.5-0.5b", gpu="l40s", gpus=2, seq_len=2048, zero=1)
    wait_verdict(page, want["memory"]["fits"], "qwen2.5-0.5b · full · 2× l40s")
    expect(page.locator("#f-seq_len")).to_have_value("2048")
    expect(page.locator("#f-zero")).to_have_value("1")
    expect(page.locator("#summary")).to_contain_text(f"{want['memory']['device_total_bytes'] / GIB:,.2f} GiB")
    no_csp_violations(page)


def test_error_is_shown_next_to_its_field(page, server_url):
    page.goto(f"{server_url}/?model=llama-3.2-1b&gpus=8")
    wait_verdict(page)
    page.fill("#f-tp", "3")
    expect(page.locator("#err-tp")).to_contain_text("does not divide 8 GPUs")
    expect(page.locator("#f-tp")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#verdict")).to_have_text("Fix the highlighted input")
    expect(page.locator("#results")).to_have_attribute("data-stale", "1")
    page.locator("#err-tp").scroll_into_view_if_needed()
    shot(page, "04-error-next-to-field")
    page.fill("#f-tp", "2")
    wait_verdict(page)
    expect(page.locator("#err-tp")).to_have_text("")
    page.fill("#f-model", "llama-9000")
    expect(page.locator("#err-model")).to_contain_text("unknown model preset")


def test_pasted_config_json(page, server_url):
    from trainledger.load.hf import load_hf_config

    page.goto(f"{server_url}/?gpu=l40s")
    wait_verdict(page)
    page.click("#paste summary")
    page.fill("#f-config_json", json.dumps(load_hf_config("qwen2.5-0.5b")))
    want = lib(model="qwen2.5-0.5b", gpu="l40s")["memory"]
    wait_verdict(page, want["fits"], "pasted config.json")
    expect(page.locator("#summary")).to_contain_text(f"{want['device_total_bytes'] / GIB:,.2f} GiB")
    assert "config_json" not in page.url  # pasted text stays out of the link
    page.fill("#f-config_json", '{"model_type": "nope"}')
    expect(page.locator("#err-config_json")).to_contain_text("not supported")


def test_plan_search(page, server_url):
    from trainledger.planner.search import Job, search

    page.goto(f"{server_url}/?model=llama-3.2-1b&tokens=1000000000")
    wait_verdict(page)
    page.fill("#p-deadline_days", "1")
    page.fill("#p-max_gpus", "16")
    page.check("#plan-gpus input[value='h100-sxm']")
    page.check("#plan-gpus input[value='l40s']")
    page.click("#run-plan")
    want = search(Job(model="llama-3.2-1b", tokens=1e9, deadline_days=1, max_gpus=16, gpus=("h100-sxm", "l40s")))
    expect(page.locator("#plan-status")).to_contain_text(f"{len(want.plans)} plans ranked, {len(want.rejected)}")
    ranked = page.locator("#plan-results table").first
    expect(ranked.locator("tbody tr")).to_have_count(len(want.plans))
    top = want.plans[0]
    expect(ranked.locator("tbody tr").first).to_contain_text(f"{top.plan.cluster.world_size} x {top.plan.cluster.gpu.name}")
    if want.rejected:
        expect(page.locator("#plan-results")).to_contain_text(want.rejected[0].reason)
    assert "plan_gpus=h100-sxm%2Cl40s" in page.url or "plan_gpus=h100-sxm,l40s" in page.url
    page.locator("#planner").screenshot(path=str(artifacts_dir() / "05-planner-results.png"))
    no_csp_violations(page)


def test_download_report_and_export(page, server_url, tmp_path):
    page.goto(f"{server_url}/?model=llama-3.2-1b&gpu=h100-sxm&gpus=8&zero=3&tokens=1000000000")
    wait_verdict(page)
    want = lib(model="llama-3.2-1b", gpu="h100-sxm", gpus=8, zero=3, tokens=1e9)
    with page.expect_download() as info:
        page.click("#dl-html")
    dl = info.value
    assert dl.suggested_filename == "trainledger-report-llama-3.2-1b.html"
    html = (tmp_path / dl.suggested_filename)
    dl.save_as(html)
    text = html.read_text()
    assert f"{want['memory']['device_total_bytes'] / GIB:,.2f} GiB" in text
    assert "Procurement and acceptance sheet" in text and "<script" not in text
    with page.expect_download() as info:
        page.click("#dl-md")
    assert info.value.suggested_filename.endswith(".md")
    page.select_option("#export-format", "accelerate")
    with page.expect_download() as info:
        page.click("#dl-export")
    assert info.value.suggested_filename == "accelerate_config.yaml"
    shot(page, "06-downloads")
    # the downloaded report opens offline in the browser and shows its charts
    report = page.context.new_page()
    report.goto(html.as_uri())
    expect(report.locator("svg.chart")).to_have_count(6)
    report.locator("#sheet").screenshot(path=str(artifacts_dir() / "07-report-acceptance-sheet.png"))
    report.locator("#seq svg").screenshot(path=str(artifacts_dir() / "08-report-seq-sweep.png"))
    report.close()


def test_keyboard_and_labels(page, server_url):
    page.goto(server_url + "/")
    wait_verdict(page)
    ids = page.eval_on_selector_all("#form input, #form select, #form textarea, #plan-form input[type=number]",
                                    "els => els.map(e => e.id)")
    assert ids
    for i in ids:
        expect(page.locator(f"label[for='{i}']")).to_have_count(1)
    page.focus("#f-model")
    page.keyboard.press("Tab")
    expect(page.locator("#paste summary")).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.locator("#f-method")).to_be_focused()
    page.keyboard.press("ArrowDown")  # change the method from the keyboard
    expect(page).to_have_url(re.compile(r"method=(?!full)"))
    expect(page.locator("#verdict")).to_contain_text(page.input_value("#f-method"))
    shot(page, "09-keyboard-focus")
