"""The report stage on a small fake run: the page and its summary, missing inputs as "not run", a corrupt input
as a one-line error, the dvc.yaml deps equal to what it reads, and the params checks."""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from stages import report
from stages.core.errors import PipelineError
from stages.params import load_params, parse_params, resolve
from stages.report.inputs import input_files
from stages.schema.report import ReportParams
from tests.report.fake_run import write_fake_run

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def params() -> ReportParams:
    return load_params(ROOT / "params.yaml").report


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _images(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)]


def _section(html: str, sid: str) -> str:
    start = html.index(f'<section id="{sid}">')
    return html[start: html.index("</section>", start)]


def test_full_run_page_summary_and_metrics(project: Path, params: ReportParams) -> None:
    write_fake_run(project)
    metrics = report.run(params)
    html = (project / "data/report/index.html").read_text()
    assert metrics["stages_not_run"] == [] and metrics["missing_inputs"] == []
    # one figure each: corpus rounds, pretrain and sft loss, GRPO curves, accuracy bars, pass@k / maj@k, Figure 5
    # (exact labels, learned RMs), Figure 6
    pngs = _images(html)
    assert len(pngs) == metrics["figures"] == 9
    assert all(p.startswith(b"\x89PNG\r\n\x1a\n") and len(p) > 2000 for p in pngs)
    # self-contained: no script, no stylesheet or image from elsewhere, only a data: favicon
    assert "<script" not in html and "url(" not in html
    assert all(u.startswith("data:") for u in re.findall(r'src="([^"]*)"', html))
    assert re.findall(r'<link [^>]*href="([^"]*)"', html) == ["data:,"]
    # the headline first, with the fake accuracies; the paper's numbers beside ours
    assert html.index('id="headline"') < html.index('id="paper"') < html.index('id="data"')
    head = _section(html, "headline")
    assert "0.550 ± 0.022" in head and "0.806" in head and "0.700 ± 0.040 (k=8)" in head
    assert "0.460 ± 0.045 (k=8)" in head and "headline mode strict" in head
    acc = _section(html, "paper")  # the paper's accuracies beside ours under the reference's rules (report mode)
    assert "deepseekmath rules" in acc and "88.2" in acc and "56.2†" in acc and "39.8†" in acc and "Table 5" in acc
    assert "maj@8 +0.110 [" in acc and "pass@8 +0.080 [" in acc  # Figure 7's claim against grpo - sft, with CIs
    assert "+16.4 points (95% CI" in acc and "beyond noise" in acc  # RL over SFT with its interval
    # every comparison with its paired-bootstrap interval, and the seeds
    unc = _section(html, "uncertainty")
    for step in ("pretrain → sft", "sft → grpo", "sft → sft_continued", "sft_continued → grpo", "base → pretrain"):
        assert step in unc
    assert unc.count("<tr>") == 1 + 10 and "avg@8" in unc and "maj@8" in unc and "Seeds: evaluation sampling seed 0" in unc
    assert "2,000 resamples" in unc
    assert metrics["comparisons"] == 10 and 0 < metrics["comparisons_beyond_noise"] < 10
    # the verifier-sensitivity table: per model, benchmark and run; the samples of each kind
    ver = _section(html, "verifiers")
    assert ver.count("<tr>") >= 1 + 10 + 4 and "right only by deepseekmath + math_verify" in ver
    assert "generated-40" in ver and "math-verify 0.9.0" in ver
    assert "grpo_ps &gt; online_rft &gt; grpo_os &gt; rft" in acc  # Figure 5 from the comparison result
    assert "process_rm: 0.047 → 0.051 → 0.060" in acc  # Figure 6 mean over seeds
    assert "0.649" in _section(html, "reward_model") and "0.324" in _section(html, "reward_model")
    md = (project / "data/report/summary.md").read_text()
    assert "| grpo | DeepSeekMath-RL 7B | zero-shot | generated | 0.550 ± 0.022 | 0.792 | 0.806 | 0.700 ± 0.040 (k=8) |" in md
    assert "## Model comparisons" in md and "## Verifier sensitivity" in md
    assert json.loads((project / "data/metrics/report.json").read_text())["html_bytes"] == len(html.encode())
    lines = report.console_lines(params)
    assert any(re.match(r"grpo\s+generated\s+0\.550\s+0\.792\s+0\.806\s+0\.700\s+0\.460$", x) for x in lines), lines
    assert lines[-1].startswith("report: data/report/index.html (open file://")


def test_missing_inputs_show_not_run(project: Path, params: ReportParams) -> None:
    write_fake_run(project, skip=("grpo", "evaluate_grpo", "evaluate_sft_continued", "reward_model", "sft",
                                  "paradigm", "paradigm_rm", "iterative"))
    metrics = report.run(params)
    assert metrics["stages_not_run"] == ["sft", "reward_model", "grpo", "evaluate@sft_continued", "evaluate@grpo"]
    assert "data/details/grpo.json" in metrics["missing_inputs"] and "data/plots/grpo" in metrics["missing_inputs"]
    html = (project / "data/report/index.html").read_text()
    for sid in ("grpo", "reward_model", "sft"):
        assert "not run" in _section(html, sid)
    assert "not run" in _section(html, "comparisons")
    assert '<td class="na">not run</td>' in _section(html, "headline")  # grpo's row
    assert metrics["figures"] == 4  # corpus, pretrain, the accuracy bars and sft's pass@k (grpo's is absent)
    lines = report.console_lines(params)
    assert any(re.match(r"grpo\s+not run$", x) for x in lines), lines


def test_nothing_run_yet(project: Path, params: ReportParams) -> None:
    metrics = report.run(params)
    assert metrics["figures"] == 0 and len(metrics["stages_not_run"]) == 7 + len(params.models)
    html = (project / "data/report/index.html").read_text()
    assert html.count('<span class="badge na">not run</span>') == 11  # 7 stages, evaluate, comparisons, uncertainty, verifiers
    assert report.console_lines(params)[1].split() == ["model", "benchmark", "CoT", "PoT", "TIR", "pass@k", "maj@k"]


def test_committed_benchmark_results_are_read(project: Path, params: ReportParams) -> None:
    """The real result files' format (not only the fake's): Figure 5 and 6 sections filled in."""
    write_fake_run(project, skip=("paradigm", "paradigm_rm", "iterative"))
    for name in ("paradigm.json", "paradigm_rm.json", "iterative_rl.json"):
        (project / "benchmarks/results").mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "benchmarks/results" / name, project / "benchmarks/results" / name)
    report.run(params)
    html = (project / "data/report/index.html").read_text()
    committed = json.loads((ROOT / "benchmarks/results/paradigm.json").read_text())
    order = " &gt; ".join(committed["comparison"]["exact"]["measured_order"])
    assert order in _section(html, "paper") and order in _section(html, "comparisons")
    rm = json.loads((ROOT / "benchmarks/results/paradigm_rm.json").read_text())  # the learned-RM row reads this file
    rm_order = " &gt; ".join(rm["comparison"]["reward_model"]["measured_order"])
    assert rm_order in _section(html, "paper") and "paradigm_rm.json" in _section(html, "paper")
    assert len(_images(_section(html, "comparisons"))) == 3


@pytest.mark.parametrize(("rel", "text", "expect"), [
    ("data/details/sft.json", '{"steps": 3,', r"^data/details/sft\.json: not valid JSON \(.*\); re-run"),
    ("data/details/evaluate_grpo.json", "[1, 2]", r"^data/details/evaluate_grpo\.json: expected a JSON object"),
    ("data/plots/sft/train.tsv", "step\tloss\n5\t0.9\n10\tabc\n", r"^data/plots/sft/train\.tsv:3: loss = 'abc' is not"),
    ("data/plots/grpo/kl.csv", "step,kl\n1,0.1,7\n", r"^data/plots/grpo/kl\.csv:2: 3 cells, the header has 2"),
    ("benchmarks/results/paradigm.json", "\xff", r"^benchmarks/results/paradigm\.json: not valid JSON"),
])
def test_corrupt_input_is_one_line_error_and_keeps_the_old_report(project: Path, params: ReportParams, rel: str,
                                                                  text: str, expect: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from stages.report import figures

    monkeypatch.setattr(figures, "_uri", lambda fig: "data:image/png;base64,")  # no rasterising: not checked here
    write_fake_run(project)
    report.run(params)
    before = (project / "data/report/index.html").read_bytes()
    (project / rel).write_text(text, encoding="latin-1" if text == "\xff" else "utf-8")
    with pytest.raises(PipelineError) as e:
        report.run(params)
    assert re.match(expect, str(e.value)) and "\n" not in str(e.value), str(e.value)
    assert (project / "data/report/index.html").read_bytes() == before
    assert not list((project / "data").glob(".report.*"))  # no half-written page left


def test_dvc_yaml_deps_are_exactly_what_it_reads(params: ReportParams) -> None:
    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["report"]
    data_deps = [d for d in stage["deps"] if not d.endswith(".py")]
    assert data_deps == [str(p) for p in input_files(params)]
    assert stage["outs"] == ["data/report", "data/details/report.json", "data/params/report.yaml"] and stage["params"] == ["report"]
    assert list(yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"])[-1] == "report"  # the last stage


def test_report_models_must_be_evaluated_models() -> None:
    raw = resolve(ROOT / "params.yaml")
    raw["report"]["models"] = ["sft", "grpo", "ppo"]
    with pytest.raises(PipelineError, match=r"^params: report\.models: \['ppo'\] not in evaluate\.models"):
        parse_params(raw)
    raw["report"]["models"] = ["sft", "sft"]
    with pytest.raises(PipelineError, match=r"report\.models: models listed twice: \['sft'\]"):
        parse_params(raw)


def _mutate(node: object, value: object, depth: int) -> object:
    """``node`` with every value at ``depth`` (0: the top-level values) replaced by ``value``, deeper values kept."""
    if isinstance(node, dict):
        return {k: value if depth == 0 else _mutate(v, value, depth - 1) for k, v in node.items()}
    if isinstance(node, list):
        return [value if depth == 0 else _mutate(v, value, depth - 1) for v in node]
    return node


@pytest.mark.parametrize("value", [None, 7, -1.5, "x", [], [3], {}, True])
def test_unexpected_shapes_in_valid_json_never_raise(project: Path, params: ReportParams, value: object,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A metrics file of the right kind (a JSON object) with values of other types or shapes than the stages write:
    the page still builds (those values show as dashes or "not run"), at every depth of every input file. The
    figures are built but not rasterised (the slow part, which sees only the numbers that were checked)."""
    from stages.report import figures, page
    from stages.report.inputs import load

    monkeypatch.setattr(figures, "_uri", lambda fig: "data:image/png;base64,")

    write_fake_run(project)
    files = sorted((project / "data/details").glob("*.json")) + sorted((project / "benchmarks/results").glob("*.json"))
    originals = {f: json.loads(f.read_text()) for f in files}
    for depth in range(4):
        for f, obj in originals.items():
            f.write_text(json.dumps(_mutate(obj, value, depth)))
        inputs = load(params)
        html = page.html_page(params.title, inputs, True)
        page.markdown_summary(params.title, inputs, "x")
        page.headline_lines(inputs, None)
        assert html.startswith("<!DOCTYPE html>")


def test_paradigm_panels_put_every_learned_rm_method_on_the_right() -> None:
    from stages.report.figures import paradigm_panels

    got = paradigm_panels(["rft", "online_rft", "grpo_os", "grpo_os_rm", "grpo_ps_rm", "grpo_ps_rm_iter2"])
    assert got == [("rule reward / exact step labels", ["rft", "online_rft", "grpo_os"]),
                   ("learned reward models", ["rft", "online_rft", "grpo_os_rm", "grpo_ps_rm", "grpo_ps_rm_iter2"])]
    assert paradigm_panels(["rft", "grpo_ps"]) == [("rule reward / exact step labels", ["rft", "grpo_ps"])]


def test_the_page_reads_no_clock(project: Path, params: ReportParams, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page is a DVC output: the same inputs give the same bytes whenever it is built (issue 29). A build time on
    it made the default's report differ between an idle and a busy run that ended in other minutes."""
    from datetime import datetime, timezone

    from stages.report import figures, page
    from stages.report.inputs import load

    class NoClock(datetime):
        @classmethod
        def now(cls, tz: object = None) -> datetime:
            raise AssertionError("the report read the clock")

    monkeypatch.setattr(figures, "_uri", lambda fig: "data:image/png;base64,")
    monkeypatch.setattr(page, "datetime", NoClock)
    write_fake_run(project)
    inputs = load(params)
    html = page.html_page(params.title, inputs, True)
    assert "Generated by the report stage" in html
    assert page.html_page(params.title, inputs, True) == html
    at = datetime(2026, 12, 4, 23, 30, tzinfo=timezone.utc)
    assert "Generated 2026-12-04 23:30 UTC by" in page.html_page(params.title, inputs, True, generated_at=at)


def test_grpo_plot_shows_the_rm_monitor(monkeypatch: pytest.MonkeyPatch) -> None:
    """An RM-rewarded run's plot: the RM reward before the guards beside the reward and the rule accuracy, and a
    dotted line on every panel at the step where the divergence guard fired."""
    from matplotlib.axes import Axes

    from stages.report import figures

    labels: list[object] = []
    marks: list[float] = []
    plot, vline = Axes.plot, Axes.axvline
    monkeypatch.setattr(Axes, "plot", lambda self, *a, **kw: labels.append(kw.get("label")) or plot(self, *a, **kw))
    monkeypatch.setattr(Axes, "axvline", lambda self, x, **kw: marks.append(x) or vline(self, x, **kw))
    steps = range(6)
    curves = {name: [{"step": s, name: v} for s, v in zip(steps, vals, strict=True)] for name, vals in (
        ("reward_mean", [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]), ("rm_raw_mean", [0.3, 0.4, 0.5, 0.6, 0.7, 0.8]),
        ("accuracy", [0.4, 0.5, 0.4, 0.3, 0.2, 0.1]), ("kl", [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]),
        ("rm_divergence", [0, 0, 0, 0, 1, 0]))}
    assert figures.grpo_curves(curves).startswith("data:image/png;base64,")
    assert {"reward (mean)", "accuracy", "RM reward before the guards"} <= set(labels)
    assert marks == [4.0, 4.0, 4.0]
    labels.clear()
    figures.grpo_curves({k: v for k, v in curves.items() if not k.startswith("rm_")})  # a rule run: as before
    assert "RM reward before the guards" not in labels
