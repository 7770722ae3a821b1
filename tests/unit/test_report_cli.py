"""`trainledger report` on the command line: files, formats, plan and verify inputs, errors."""

from __future__ import annotations

import json

from click.testing import CliRunner

from trainledger.cli import main
from trainledger.estimate import estimate
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.units import GIB

FLAGS = ["--model", "llama-3.2-1b", "--gpu", "l40s", "--gpus", "2", "--tokens", "1B"]


def run(args):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def test_html_and_markdown_files(tmp_path):
    inputs = PlanInputs(model="llama-3.2-1b", gpu="l40s", gpus=2, tokens=1e9)
    total = estimate(build_plan(inputs)).to_dict()["memory"]["device_total_bytes"]
    for name in ("r.html", "r.md", "r.txt", "r.json"):
        res = run(["report", *FLAGS, "--compare-gpus", "h100-sxm,l40s", "--out", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
        assert res.output.startswith(f"wrote {tmp_path / name}")
        text = (tmp_path / name).read_text()
        if name.endswith(".json"):
            data = json.loads(text)
            assert data["estimate"]["memory"]["device_total_bytes"] == total
            assert [r["gpu"] for r in data["gpu_compare"]] == ["l40s", "h100-sxm"]
        else:
            assert f"{total / GIB:,.2f} GiB" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "r.json", "r.md", "r.txt"]


def test_plan_file_and_stdout(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("model: llama-3.2-1b\ngpu: h100-sxm\ngpus: 1\nmethod: lora\n")
    res = run(["report", str(plan)])
    assert res.exit_code == 0
    assert res.output.startswith("llama-3.2-1b · lora · 1× h100-sxm")
    assert "Procurement and acceptance sheet" in res.output


def test_from_plan_json_and_verify_json(tmp_path):
    from trainledger.planner.search import Job, search

    res = search(Job(model="llama-3.2-1b", tokens=1e9, gpus=("h100-sxm",), max_gpus=8, top=3)).to_dict()
    pj = tmp_path / "plan.json"
    pj.write_text(json.dumps(res))
    second = res["plans"][1]
    out = tmp_path / "r.html"
    r = run(["report", "--from-plan-json", str(pj), "--pick", "2", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert info["title"].endswith(f"{second['gpus']}× {second['gpu']}")
    assert 'id="plans"' in out.read_text()
    # flags override the picked plan
    r = run(["report", "--from-plan-json", str(pj), "--seq-len", "2048", "--format", "json"])
    assert json.loads(r.output)["inputs"]["seq_len"] == 2048
    pred = estimate(build_plan(PlanInputs(model="llama-3.2-1b", gpu="h100-sxm"))).to_dict()["memory"]
    vj = tmp_path / "verify.json"
    vj.write_text(json.dumps({"measured": {"device": "cuda", "peak_allocated_bytes": pred["peak_allocated_bytes"],
                                           "categories_at_peak": {}, "phase_peaks": {}}, "predicted": pred}))
    r = run(["report", "--model", "llama-3.2-1b", "--verify-json", str(vj), "--format", "md"])
    assert r.exit_code == 0 and "## Measured vs predicted" in r.output


def test_user_errors_are_one_line(tmp_path):
    for args, words in ((["--out", str(tmp_path / "r.pdf")], "cannot tell the report format"),
                        (["--from-plan-json", str(tmp_path / "missing.json")], "no such file"),
                        (["--compare-gpus", ",,"], "give GPU names"),
                        (["--gpu", "h100"], "unknown gpu"),
                        (["--out", str(tmp_path / "nodir" / "r.html")], "does not exist")):
        r = CliRunner().invoke(main, ["report", *args])
        assert r.exit_code != 0
        assert words in r.output, r.output
        assert "Traceback" not in r.output
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    r = CliRunner().invoke(main, ["report", "--verify-json", str(bad)])
    assert r.exit_code != 0 and "expected a JSON object" in r.output
