"""The unified paradigm (paper 5.2.1) in the grpo stage: the pure pieces (RFT filter, gradient coefficients, the
weighted NLL loss against plain SFT references on tiny tensors), one online-RFT / RFT step's update against the
SFT gradient on the correct samples (tiny model, scripted generator), and each algorithm end to end."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from stages import grpo
from stages.core import paths
from stages.core.errors import PipelineError
from stages.core.generation import Completion, SamplingParams
from stages.core.io import untimed
from stages.core.modeling import load_model, load_tokenizer
from stages.core.prompts import chat_prompt
from stages.params import GrpoParams
from stages.rl.data import load_prompts, step_questions
from stages.rl.loop import begin_iteration, run_step, setup
from stages.rl.losses import LossNormalizer
from stages.rl.paradigm import build_rft_pool, rft_coefficients, run_questions, select_rft_samples, weighted_nll_loss
from stages.rl.rewards import accuracy_reward
from stages.rl.update import as_updater

from .conftest import write_prompts
from .test_grpo_stage import tiny_params

torch.set_num_threads(1)


# ---------------------------------------------------------------------------------------------
# pure functions


def test_rft_coefficients_are_the_correctness_indicator() -> None:
    assert rft_coefficients(torch.tensor([True, False, True])).tolist() == [1.0, 0.0, 1.0]
    assert rft_coefficients(torch.tensor([0, 1])).dtype == torch.float32


def test_select_rft_samples_keeps_correct_distinct_outputs() -> None:
    texts = [["a = 5.", "a  =\n5.", "b = 5.", "wrong", "a = 5."], ["x", "y"], ["z"]]
    correct = [[True, True, True, False, True], [False, False], [True]]
    assert select_rft_samples(texts, correct) == [[0, 2], [], [0]]


def test_run_questions_is_the_union_of_the_steps_questions() -> None:
    from stages.rl.data import step_questions

    got = run_questions(10, 3, 4, seed=1)
    want = sorted({q for s in range(3) for q in step_questions(10, s, 4, 1)})
    assert got == want
    shares = [run_questions(10, 3, 4, seed=1, rank=r, world=2) for r in range(2)]
    assert sorted(set(shares[0]) | set(shares[1])) == want


def _logits_and_logprobs(B: int, T: int, V: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g, requires_grad=True)
    targets = torch.randint(0, V, (B, T), generator=g)
    lp = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logits, targets, lp


@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "token-mean"])
def test_online_rft_gradient_is_the_sft_gradient_on_correct_outputs(aggregation: str) -> None:
    """GC = I(o) with wrong outputs masked: the gradient equals plain SFT (cross-entropy) on the correct rows only,
    for the paper's per-sequence mean and for the token mean (the continued-SFT baseline's loss)."""
    B, T, V = 6, 5, 7
    logits, targets, lp = _logits_and_logprobs(B, T, V)
    lengths = torch.tensor([5, 3, 4, 2, 5, 1])
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    correct = torch.tensor([True, False, True, True, False, False])
    coef = rft_coefficients(correct)
    loss, m = weighted_nll_loss(lp, coef, mask * correct[:, None], aggregation=aggregation)  # type: ignore[arg-type]
    (g,) = torch.autograd.grad(loss, logits)

    # reference: SFT on the correct rows alone, with torch's cross-entropy
    ref_logits = logits.detach().clone().requires_grad_(True)
    rows = correct.nonzero().view(-1).tolist()
    if aggregation == "token-mean":
        n_tok = int(sum(lengths[i] for i in rows))
        ref = sum(torch.nn.functional.cross_entropy(ref_logits[i, : lengths[i]], targets[i, : lengths[i]], reduction="sum")
                  for i in rows) / n_tok
    else:
        ref = sum(torch.nn.functional.cross_entropy(ref_logits[i, : lengths[i]], targets[i, : lengths[i]])
                  for i in rows) / len(rows)
    (g_ref,) = torch.autograd.grad(ref, ref_logits)
    assert torch.allclose(g, g_ref, atol=1e-7)
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), abs=1e-6)
    assert g[~correct].abs().max() == 0  # wrong outputs: coefficient 0, no gradient
    assert m["n_tokens"] == int(sum(lengths[i] for i in rows))


def test_weighted_nll_micro_batches_sum_to_the_batch_loss() -> None:
    B, T, V = 6, 4, 5
    logits, _, lp = _logits_and_logprobs(B, T, V, seed=3)
    mask = torch.ones(B, T)
    mask[1, 2:] = 0
    coef = rft_coefficients(torch.tensor([1, 1, 0, 1, 1, 1]))
    mask = mask * coef[:, None]
    full, _ = weighted_nll_loss(lp, coef, mask, aggregation="seq-mean-token-mean")
    norm = LossNormalizer.from_mask(mask)
    parts = [weighted_nll_loss(lp[s], coef[s], mask[s], aggregation="seq-mean-token-mean", normalizer=norm)[0]
             for s in (slice(0, 2), slice(2, 5), slice(5, 6))]
    assert float(sum(parts).detach()) == pytest.approx(float(full.detach()), abs=1e-6)


def test_params_pair_the_algorithm_with_its_reward_and_refuse_zero3() -> None:
    with pytest.raises(Exception, match="uses the rule reward"):
        tiny_params(algorithm="rft", reward__source="process_rm")
    with pytest.raises(Exception, match="zero_stage 3"):
        tiny_params(deepspeed=dict(enabled=True, zero_stage=3, offload_optimizer=False))
    assert tiny_params(algorithm="grpo", reward__source="process_rm").algorithm == "grpo"


# ---------------------------------------------------------------------------------------------
# one step's update against the SFT gradient (tiny model, scripted outputs)


class ScriptedGenerator:
    """Returns, for each prompt, fixed completion texts built from the row's gold answer."""

    def __init__(self, tok, rows, make_texts) -> None:
        self.tok = tok
        self.by_prompt = {chat_prompt(r["question"], "cot"): r for r in rows}
        self.make_texts = make_texts

    def completion(self, text: str) -> Completion:
        ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        return Completion(text, ids, [0.0] * len(ids), "stop")

    def generate(self, prompts, sp):
        return [[self.completion(t) for t in self.make_texts(self.by_prompt[p])[: sp.n]] for p in prompts]

    def sync_weights(self, model) -> None:
        pass


def _texts(row) -> list[str]:
    a = row["answer"]
    return [f"So {a}.\nThe answer is \\boxed{{{a}}}.", f"Tom has {a}.\nThe answer is \\boxed{{{a}}}.",
            f"So  {a}.\nThe answer is \\boxed{{{a}}}.", "The answer is \\boxed{0}."]


def _sft_grad(model, tok, pairs: list[tuple[str, list[int]]]) -> dict[str, torch.Tensor]:
    """Gradient of the mean over outputs of each output's mean token NLL (eq. 5's 1/|o|), one sequence at a time."""
    model.zero_grad(set_to_none=True)
    for q, ids in pairs:
        p = tok(chat_prompt(q, "cot"))["input_ids"]
        logits = model(input_ids=torch.tensor([p + ids]), use_cache=False).logits[0, len(p) - 1:-1]
        (torch.nn.functional.cross_entropy(logits, torch.tensor(ids)) / len(pairs)).backward()
    return {n: prm.grad.clone() for n, prm in model.named_parameters()}


def _update(model, step_fn) -> dict[str, torch.Tensor]:
    """-(parameter change) of one SGD(lr=1) step, i.e. the gradient the step applied."""
    before = {n: prm.detach().clone() for n, prm in model.named_parameters()}
    step_fn()
    return {n: before[n] - prm.detach() for n, prm in model.named_parameters()}


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    for k in a:
        assert torch.allclose(a[k], b[k], atol=2e-5, rtol=1e-3), k


def test_online_rft_step_applies_the_sft_gradient_of_the_correct_samples(project) -> None:
    tok, rows = load_tokenizer(paths.SFT_MODEL), load_prompts(paths.RL_PROMPTS)
    p = tiny_params(algorithm="online_rft", optim__max_grad_norm=1e9, questions_per_step=2, rollout__group_size=4, optim__micro_batch_size=3)
    gen = ScriptedGenerator(tok, rows, _texts)
    batch = [rows[i] for i in step_questions(len(rows), 0, 2, p.seed)]
    pairs = [(r["question"], gen.completion(t).token_ids) for r in batch for t in _texts(r)[:3]]  # the 3 correct ones
    ref = _sft_grad(load_model(paths.SFT_MODEL), tok, pairs)
    model = load_model(paths.SFT_MODEL)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    out: dict = {}

    def step() -> None:
        run, models, state = setup(p, model, tok, rows=rows, generator=gen, updater=as_updater(model, opt, p))
        begin_iteration(run, models, state, 1, None)
        out["m"], _, out["r"] = run_step(run, models, state, 0)

    _close(_update(model, step), ref)
    assert out["m"]["accuracy"] == pytest.approx(0.75) and out["m"]["n_train_outputs"] == 6
    assert out["r"].tolist() == [[1.0, 1.0, 1.0, 0.0]] * 2


def test_rft_pool_keeps_correct_deduplicated_samples_and_trains_on_them(project) -> None:
    tok, rows = load_tokenizer(paths.SFT_MODEL), load_prompts(paths.RL_PROMPTS)
    p = tiny_params(algorithm="rft", optim__max_grad_norm=1e9, questions_per_step=2, rollout__group_size=4, steps=3)
    gen = ScriptedGenerator(tok, rows, _texts)
    qidx = run_questions(len(rows), p.steps, p.questions_per_step, p.seed)
    sp = SamplingParams(temperature=1.0, n=4, max_new_tokens=p.rollout.max_new_tokens)
    pool = build_rft_pool(gen, rows, qidx, [chat_prompt(rows[q]["question"], "cot") for q in qidx], sp,
                          lambda row, c: accuracy_reward(completion=c.text, answer=row["answer"]) == 1.0)
    # per question: 4 sampled, 3 correct, 2 kept ("So  N." only differs from "So N." by whitespace; wrong dropped)
    assert pool.summary() == {"questions": len(qidx), "sampled": 4 * len(qidx), "correct": 3 * len(qidx),
                              "kept": 2 * len(qidx), "accuracy": 0.75, "questions_with_samples": len(qidx)}
    for q in qidx:
        a = rows[q]["answer"]
        assert [c.text for c in pool.kept[q]] == [f"So {a}.\nThe answer is \\boxed{{{a}}}.",
                                                  f"Tom has {a}.\nThe answer is \\boxed{{{a}}}."]
    step_q = step_questions(len(rows), 1, 2, p.seed)
    pairs = [(rows[q]["question"], c.token_ids) for q in step_q for c in pool.kept[q]]
    ref = _sft_grad(load_model(paths.SFT_MODEL), tok, pairs)
    model = load_model(paths.SFT_MODEL)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    out: dict = {}

    def step() -> None:
        run, models, state = setup(p, model, tok, rows=rows, generator=gen, updater=as_updater(model, opt, p))
        models.pool = pool
        begin_iteration(run, models, state, 1, None)
        out["m"], _, _ = run_step(run, models, state, 1)

    _close(_update(model, step), ref)
    assert out["m"]["n_train_outputs"] == 4 and out["m"]["accuracy"] == pytest.approx(0.75)


# ---------------------------------------------------------------------------------------------
# every algorithm end to end (tiny random model)


@pytest.mark.parametrize("algorithm", ["sft", "rft", "online_rft", "grpo"])
def test_each_algorithm_runs_and_writes_the_stage_outputs(project, algorithm) -> None:
    """Two steps of each method on the tiny random model, with the held-out curve on. grpo keeps tiny_params' dense
    length reward (so it updates); rft / online_rft use the rule reward whatever grpo.reward says."""
    write_prompts(project / "heldout.jsonl", 3)
    p = tiny_params(algorithm=algorithm, steps=2, baseline=dict(enabled=False, lr=1e-3), checkpoint_every=0,
                    heldout=dict(every=1, problems_file="heldout.jsonl", limit=3, max_new_tokens=8))
    m = grpo.run(p)
    before = load_file(str(paths.SFT_MODEL / "model.safetensors"))
    after = load_file(str(paths.GRPO_MODEL / "model.safetensors"))
    saved = json.loads(paths.details_file("grpo").read_text())
    assert saved["algorithm"] == algorithm and saved["grpo"]["steps"] == 2 and saved == untimed(json.loads(json.dumps(m)))
    assert json.loads((paths.GRPO_MODEL / "pipeline.json").read_text())["algorithm"] == algorithm
    curve = saved["heldout"]["accuracy_at_step"]
    assert list(curve) == ["0", "1", "2"] and all(0.0 <= a <= 1.0 for a in curve.values())
    assert saved["heldout"]["first"] == curve["0"] and saved["heldout"]["last"] == curve["2"]
    csv_rows = (paths.plots_dir("grpo") / "heldout_accuracy.csv").read_text().splitlines()
    assert csv_rows[0] == "step,heldout_accuracy" and len(csv_rows) == 4
    changed = any(not torch.equal(before[k], after[k]) for k in before)
    if algorithm in ("sft", "grpo"):
        assert changed
    if algorithm == "sft":
        assert (paths.plots_dir("grpo") / "sft_loss.csv").is_file()
    else:
        acc = saved["grpo"]["accuracy_first5"]
        assert acc is not None and 0.0 <= acc <= 1.0
    if algorithm == "rft":
        pool = saved["rft_pool"]
        assert pool["sampled"] == pool["questions"] * p.rollout.group_size and pool["kept"] <= pool["correct"]
        assert changed == (pool["kept"] > 0)  # a random model is rarely right: no kept sample, no update
    if algorithm == "online_rft":
        assert saved["grpo"]["kl_first5"] == 0.0  # no reference model, no KL term


def test_grpo_with_exact_step_labels_runs_and_needs_values(project) -> None:
    """reward.source process_rule: two GRPO steps with step-label process rewards; rows without 'values' are refused."""
    p = tiny_params(algorithm="grpo", reward__source="process_rule", steps=2, baseline=dict(enabled=False, lr=1e-3),
                    checkpoint_every=0)
    m = grpo.run(p)
    assert m["grpo"]["steps"] == 2 and (paths.GRPO_MODEL / "model.safetensors").is_file()
    rows = [json.loads(x) for x in paths.RL_PROMPTS.read_text().splitlines()]
    paths.RL_PROMPTS.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "values"}) + "\n" for r in rows))
    with pytest.raises(PipelineError, match="process_rule needs problem rows with a 'values' field"):
        grpo.run(p)


def test_sft_algorithm_needs_gold_solutions(project, tmp_path) -> None:
    f = tmp_path / "nocot.jsonl"
    f.write_text(json.dumps({"question": "1 + 1?", "answer": "2"}) + "\n")
    with pytest.raises(PipelineError, match="algorithm sft"):
        grpo.run(tiny_params(algorithm="sft", prompts_file=str(f), baseline=dict(enabled=False, lr=1e-3)))
    assert isinstance(tiny_params(), GrpoParams)
